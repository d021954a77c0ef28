//! Object attributes: Content-Type, Cache-Control, Content-Disposition, Content-Encoding,
//! Content-Language and user metadata (`x-amz-meta-*`), kept by the store where it can
//! (object_store attributes; `file://` mounts in a user extended attribute of the file) and
//! served on HeadObject and GetObject.

use std::{collections::HashMap, sync::Mutex};

use object_store::{Attribute, Attributes};
use pagestore_client::ufs::{self, ObjectInfo};
use pagestore_protocol::frame::FileState;
use s3s::{
    dto::{Timestamp, TimestampFormat},
    S3Error, S3ErrorCode, S3Result,
};

use super::{record::Record, Gateway};

/// S3's limit on user metadata (keys and values together).
const MAX_METADATA: usize = 2048;

/// Versions whose attributes the gateway remembers (a HEAD of a cloud store each otherwise).
const MAX_CACHED: usize = 10_000;

/// The attributes a write asks to keep.
#[derive(Default)]
pub(super) struct Asked<'a> {
    pub(super) content_type: Option<&'a str>,
    pub(super) cache_control: Option<&'a str>,
    pub(super) content_disposition: Option<&'a str>,
    pub(super) content_encoding: Option<&'a str>,
    pub(super) content_language: Option<&'a str>,
    pub(super) metadata: Option<&'a HashMap<String, String>>,
    pub(super) expires: Option<&'a Timestamp>,
}

/// The user metadata name `Expires` is kept under (the stores' attribute sets have no place
/// for it); never shown as metadata, and refused as a client's.
const EXPIRES_KEY: &str = "pages3expires";

/// Bytes of an HTTP date (`Wed, 21 Oct 2037 07:28:00 GMT`).
const HTTP_DATE_LEN: usize = 29;

/// Whether a user metadata name is one the gateway keeps its own things under.
pub(super) fn is_reserved(name: &str) -> bool {
    super::record::is_reserved(name) || name.eq_ignore_ascii_case(EXPIRES_KEY)
}

impl Asked<'_> {
    /// As store attributes; user metadata over S3's 2 KB is 400 MetadataTooLarge. The
    /// `aws-chunked` content coding is the request's framing, not the object's: not kept.
    pub(super) fn attributes(&self) -> S3Result<Attributes> {
        let mut a = Attributes::new();
        let mut put = |k: Attribute, v: Option<&str>| {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                a.insert(k, v.to_string().into());
            }
        };
        put(Attribute::ContentType, self.content_type);
        put(Attribute::CacheControl, self.cache_control);
        put(Attribute::ContentDisposition, self.content_disposition);
        let encoding = self.content_encoding.map(|e| {
            e.split(',')
                .map(str::trim)
                .filter(|c| !c.eq_ignore_ascii_case("aws-chunked"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        put(Attribute::ContentEncoding, encoding.as_deref());
        put(Attribute::ContentLanguage, self.content_language);
        if let Some(m) = self.metadata {
            let size: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
            // Expires is kept as metadata too (its name and an HTTP date,
            // `Wed, 21 Oct 2037 07:28:00 GMT`).
            let expires = self
                .expires
                .map_or(0, |_| EXPIRES_KEY.len() + HTTP_DATE_LEN);
            if size + expires > MAX_METADATA {
                let with = if expires > 0 { " (with Expires)" } else { "" };
                return Err(S3Error::with_message(
                    S3ErrorCode::MetadataTooLarge,
                    format!(
                        "the user metadata{with} has {} bytes; at most {MAX_METADATA} are kept",
                        size + expires
                    ),
                ));
            }
            if let Some(k) = m.keys().find(|k| is_reserved(k)) {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidArgument,
                    format!("x-amz-meta-{k}: this metadata name is the gateway's own"),
                ));
            }
            for (k, v) in m {
                a.insert(
                    Attribute::Metadata(k.to_ascii_lowercase().into()),
                    v.clone().into(),
                );
            }
        }
        if let Some(t) = self.expires {
            let mut date = Vec::new();
            if t.format(TimestampFormat::HttpDate, &mut date).is_ok() {
                a.insert(
                    Attribute::Metadata(EXPIRES_KEY.into()),
                    String::from_utf8_lossy(&date).into_owned().into(),
                );
            }
        }
        Ok(a)
    }
}

/// Attributes as a response's headers take them.
#[derive(Default)]
pub(super) struct Served {
    pub(super) content_type: Option<String>,
    pub(super) cache_control: Option<String>,
    pub(super) content_disposition: Option<String>,
    pub(super) content_encoding: Option<String>,
    pub(super) content_language: Option<String>,
    pub(super) metadata: Option<HashMap<String, String>>,
    pub(super) expires: Option<Timestamp>,
}

impl Served {
    fn of(a: &Attributes) -> Served {
        let get = |k: &Attribute| a.get(k).map(|v| v.to_string());
        let metadata: HashMap<String, String> = a
            .iter()
            .filter_map(|(k, v)| match k {
                Attribute::Metadata(name) if !is_reserved(name) => {
                    Some((name.to_string(), v.to_string()))
                }
                _ => None,
            })
            .collect();
        Served {
            content_type: get(&Attribute::ContentType),
            cache_control: get(&Attribute::CacheControl),
            content_disposition: get(&Attribute::ContentDisposition),
            content_encoding: get(&Attribute::ContentEncoding),
            content_language: get(&Attribute::ContentLanguage),
            metadata: (!metadata.is_empty()).then_some(metadata),
            expires: a
                .get(&Attribute::Metadata(EXPIRES_KEY.into()))
                .and_then(|v| Timestamp::parse(TimestampFormat::HttpDate, v).ok()),
        }
    }

    /// The Content-Type to answer: the stored one, else S3's default for binary data.
    pub(super) fn content_type(&self) -> String {
        self.content_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".into())
    }
}

/// Attributes of object versions, by logical path.
#[derive(Default)]
pub(super) struct AttrCache(Mutex<HashMap<String, (String, Attributes)>>);

impl AttrCache {
    fn get(&self, path: &str, version: &str) -> Option<Attributes> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(path)
            .filter(|(v, _)| v == version)
            .map(|(_, a)| a.clone())
    }

    /// The record kept with version `version` of `path` ([`record`]), if its attributes are
    /// cached: `Some(None)` when they hold none. Nothing is copied.
    ///
    /// [`record`]: super::record
    pub(super) fn record(&self, path: &str, version: &str) -> Option<Option<Record>> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(path)
            .filter(|(v, _)| v == version)
            .map(|(_, a)| super::record::of(a))
    }

    fn set(&self, path: &str, version: &str, a: Attributes) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_CACHED && !m.contains_key(path) {
            m.clear();
        }
        m.insert(path.to_string(), (version.to_string(), a));
    }
}

impl Gateway {
    /// The attributes kept with the object `info` (none where the gateway has no mount table
    /// or the store keeps none, or the lookup fails: a read is not refused for them). A file
    /// written through the cluster has them from the cluster's records (before its flush the
    /// store holds an older object there, or none; a gateway without store credentials can
    /// read no other); an object of the store, or a flushed file the records no longer name,
    /// from the store.
    pub(super) async fn attributes_of(&self, info: &ObjectInfo) -> Attributes {
        // A directory marker (see `Markers`) has none: the store has no such object.
        if info.path.ends_with('/') {
            return Attributes::new();
        }
        if let Some(a) = self.attr_cache.get(&info.path, &info.version) {
            return a;
        }
        let mut found = Err("an object of the store".to_string());
        if info.state != FileState::Stored {
            found = self
                .client
                .attributes(&info.path, &info.version)
                .await
                .map(|a| ufs::store_attributes(&a))
                .map_err(|e| e.to_string());
        }
        if found.is_err() && matches!(info.state, FileState::Stored | FileState::Clean) {
            let Some(table) = self.client.ufs_table() else {
                return Attributes::new();
            };
            found = table
                .object_attributes(&info.path)
                .await
                .map_err(|e| e.to_string());
        }
        match found {
            Ok(a) => {
                self.attr_cache.set(&info.path, &info.version, a.clone());
                a
            }
            Err(e) => {
                tracing::debug!(path = %info.path, error = %e, "object attributes not read");
                Attributes::new()
            }
        }
    }

    /// [`Gateway::attributes_of`] as a response's headers take them.
    pub(super) async fn served_attributes(&self, info: &ObjectInfo) -> Served {
        Served::of(&self.attributes_of(info).await)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_cached_versions_record_is_found_where_it_is_cached() {
        let cache = AttrCache::default();
        let r = Record {
            size: 3,
            etag: "acbd18db4cc2f85cedef654fccc4a4d8".into(),
            ..Record::default()
        };
        let mut with = Attributes::new();
        with.insert(Attribute::ContentType, "text/plain".into());
        cache.set(
            "/b/k",
            "v1",
            super::super::record::with_record(with.clone(), &r),
        );
        assert_eq!(cache.record("/b/k", "v1"), Some(Some(r)));
        assert_eq!(
            cache.record("/b/k", "v2"),
            None,
            "another version: not cached"
        );
        cache.set("/b/k", "v2", with);
        assert_eq!(
            cache.record("/b/k", "v2"),
            Some(None),
            "cached, without a record"
        );
        assert_eq!(cache.record("/b/other", "v1"), None);
    }

    #[test]
    fn asked_attributes_drop_the_chunked_coding_and_limit_metadata() {
        let mut meta = HashMap::new();
        meta.insert("Mtime".to_string(), "1700000000".to_string());
        let a = Asked {
            content_type: Some("text/csv"),
            content_encoding: Some("aws-chunked, gzip"),
            metadata: Some(&meta),
            ..Asked::default()
        }
        .attributes()
        .unwrap();
        let s = Served::of(&a);
        assert_eq!(s.content_type.as_deref(), Some("text/csv"));
        assert_eq!(s.content_encoding.as_deref(), Some("gzip"));
        assert_eq!(s.metadata.unwrap()["mtime"], "1700000000");
        let only_chunked = Asked {
            content_encoding: Some("aws-chunked"),
            ..Asked::default()
        }
        .attributes()
        .unwrap();
        assert!(only_chunked.is_empty());
        // Expires is kept under the gateway's own name, served as Expires, not as metadata;
        // a client's metadata of either of the gateway's names is refused.
        let when =
            Timestamp::parse(TimestampFormat::HttpDate, "Wed, 21 Oct 2037 07:28:00 GMT").unwrap();
        let a = Asked {
            metadata: Some(&meta),
            expires: Some(&when),
            ..Asked::default()
        }
        .attributes()
        .unwrap();
        let kept = a.get(&Attribute::Metadata(EXPIRES_KEY.into())).unwrap();
        assert_eq!(kept.len(), HTTP_DATE_LEN);
        let s = Served::of(&a);
        assert_eq!(s.expires, Some(when));
        assert_eq!(s.metadata.unwrap().keys().collect::<Vec<_>>(), ["mtime"]);
        for name in ["pages3expires", "Pages3Object"] {
            let mut forged = HashMap::new();
            forged.insert(name.to_string(), "1".to_string());
            let e = Asked {
                metadata: Some(&forged),
                ..Asked::default()
            }
            .attributes()
            .unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{name}");
        }
        meta.insert("big".into(), "x".repeat(2100));
        let e = Asked {
            metadata: Some(&meta),
            ..Asked::default()
        }
        .attributes()
        .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::MetadataTooLarge);
    }
}

/// GetObjectAttributes' answer gives the `ETag` unquoted (S3 does, unlike every other answer
/// and listing); s3s writes every ETag quoted, so the quotes are taken out of its XML here.
/// Other bodies (an error, a stream) are left as they are.
pub(super) fn unquote_etag(body: &mut s3s::Body) {
    let Some(xml) = body.bytes() else { return };
    if let Some(fixed) = without_etag_quotes(&xml) {
        *body = s3s::Body::from(fixed);
    }
}

fn without_etag_quotes(xml: &[u8]) -> Option<Vec<u8>> {
    const OPEN: &[u8] = b"<ETag>\"";
    const CLOSE: &[u8] = b"\"</ETag>";
    let start = xml.windows(OPEN.len()).position(|w| w == OPEN)?;
    let value = start + OPEN.len();
    let end = value + xml[value..].windows(CLOSE.len()).position(|w| w == CLOSE)?;
    let mut out = Vec::with_capacity(xml.len());
    out.extend_from_slice(&xml[..start]);
    out.extend_from_slice(b"<ETag>");
    out.extend_from_slice(&xml[value..end]);
    out.extend_from_slice(b"</ETag>");
    out.extend_from_slice(&xml[end + CLOSE.len()..]);
    Some(out)
}

#[cfg(test)]
mod etag_tests {
    use super::without_etag_quotes;

    #[test]
    fn the_attributes_etag_loses_its_quotes_and_nothing_else_changes() {
        let xml = b"<?xml version=\"1.0\"?><GetObjectAttributesOutput><ETag>\"acbd-2\"</ETag>\
                    <ObjectSize>3</ObjectSize></GetObjectAttributesOutput>";
        assert_eq!(
            without_etag_quotes(xml).as_deref(),
            Some(
                &b"<?xml version=\"1.0\"?><GetObjectAttributesOutput><ETag>acbd-2</ETag>\
                   <ObjectSize>3</ObjectSize></GetObjectAttributesOutput>"[..]
            )
        );
        for none in [
            &b"<GetObjectAttributesOutput><ObjectSize>3</ObjectSize></GetObjectAttributesOutput>"[..],
            b"<ETag>unquoted</ETag>",
            b"<ETag>\"cut",
            b"",
        ] {
            assert_eq!(without_etag_quotes(none), None);
        }
    }
}
