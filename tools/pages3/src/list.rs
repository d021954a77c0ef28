//! ListObjects and ListObjectsV2: pages of keys in key order, walked from the directories of
//! the logical namespace.

use futures_util::StreamExt;
use pagestore_client::{ufs::ObjectInfo, Error as ClientError};
use pagestore_protocol::{frame::DirEntry, writeback::is_wb_tag};
use s3s::{
    dto::{
        CommonPrefix, EncodingType, ListObjectVersionsInput, ListObjectVersionsOutput,
        ListObjectsInput, ListObjectsOutput, ListObjectsV2Input, ListObjectsV2Output, Object,
        ObjectStorageClass, ObjectVersion, ObjectVersionStorageClass,
    },
    S3Request, S3Response, S3Result,
};

use super::{
    checks,
    errors::{client_error, invalid, no_such_bucket},
    keys::{check_segments, decode_token, encode_token, url_encode},
    valid_bucket, Gateway, MAX_KEYS,
};

/// One item of a listing, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Object(ListedObject),
    Prefix(String),
}

/// An object of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ListedObject {
    key: String,
    size: u64,
    mtime_ns: i64,
    /// The store's version tag, as a stat gives it (the ETag comes from it).
    version: String,
}

impl Item {
    /// The object `key`, listed as the file entry `e`.
    fn object(key: String, e: DirEntry) -> Item {
        Item::Object(ListedObject {
            key,
            size: e.size,
            mtime_ns: e.mtime_ns,
            version: e.version_tag,
        })
    }

    fn key(&self) -> &str {
        match self {
            Item::Object(o) => &o.key,
            Item::Prefix(key) => key,
        }
    }
}

/// Listing arguments common to ListObjects and ListObjectsV2.
struct ListArgs<'a> {
    bucket: &'a str,
    prefix: &'a str,
    /// The delimiter, if any (`/` lists one directory; any other groups a walk's keys).
    delimiter: Option<&'a str>,
    after: Option<&'a str>,
    max: usize,
}

/// A listing page.
struct Page {
    items: Vec<Item>,
    truncated: bool,
}

/// The entries of a directory, each with its sort key (`name`, or `name/` for a directory: the
/// order of its keys among its siblings') and the entry itself.
pub(super) fn sorted_level(
    dir_key: &str,
    entries: Vec<DirEntry>,
    partial: &str,
) -> Vec<(String, DirEntry)> {
    let mut v: Vec<(String, DirEntry)> = entries
        .into_iter()
        .filter(|e| !e.name.is_empty() && !e.name.contains('/') && e.name.starts_with(partial))
        .map(|e| {
            let mut k = String::with_capacity(dir_key.len() + e.name.len() + 1);
            k.push_str(dir_key);
            k.push_str(&e.name);
            if e.is_dir {
                k.push('/');
            }
            (k, e)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.dedup_by(|b, a| a.0 == b.0);
    v
}

/// Whether a directory whose keys all start with `prefix` may hold keys after `after`.
pub(super) fn subtree_after(prefix: &str, after: Option<&str>) -> bool {
    match after {
        None => true,
        Some(a) => prefix > a || (a.starts_with(prefix) && a != prefix),
    }
}

impl Gateway {
    /// The entries of a logical directory; `None` if it is not one.
    async fn entries(&self, dir: &str) -> S3Result<Option<Vec<DirEntry>>> {
        match self.client.list(dir).await {
            Ok(v) => Ok(Some(v)),
            Err(ClientError::NotFound(_) | ClientError::NotDir(_) | ClientError::IsDir(_)) => {
                Ok(None)
            }
            Err(e) => Err(client_error(e)),
        }
    }

    /// Whether `bucket` holds any key (an object, or a directory marker put here).
    pub(super) async fn holds_keys(&self, bucket: &str) -> S3Result<bool> {
        if !self.markers.children(&format!("/{bucket}")).is_empty() {
            return Ok(true);
        }
        let page = self
            .list_page(&ListArgs {
                bucket,
                prefix: "",
                delimiter: None,
                after: None,
                max: 1,
            })
            .await?;
        Ok(!page.items.is_empty())
    }

    /// One page of keys (and, with the delimiter, common prefixes) after `after`, in order.
    async fn list_page(&self, a: &ListArgs<'_>) -> S3Result<Page> {
        if !valid_bucket(a.bucket) {
            return Err(no_such_bucket(a.bucket));
        }
        check_segments(a.prefix)?;
        let (dir_key, partial) = match a.prefix.rfind('/') {
            Some(i) => (&a.prefix[..=i], &a.prefix[i + 1..]),
            None => ("", a.prefix),
        };
        let dir_rel = dir_key.trim_end_matches('/');
        // No key has an empty segment, so such a prefix matches nothing.
        // Nor a segment longer than a file name.
        let impossible = !dir_key.is_empty()
            && (dir_rel.is_empty()
                || dir_rel
                    .split('/')
                    .any(|s| s.is_empty() || s.len() > checks::MAX_SEGMENT_LEN)
                || dir_key.ends_with("//"));
        // The directory listed: the bucket, or the prefix's directory in it.
        let parent = if impossible || dir_rel.is_empty() {
            format!("/{}", a.bucket)
        } else {
            format!("/{}/{dir_rel}", a.bucket)
        };
        let mut top = if impossible {
            None
        } else {
            self.entries(&parent).await?
        };
        // Directories made by a marker put here (`Markers`) are listed while they are
        // remembered, empty or not.
        let made = if impossible {
            Vec::new()
        } else {
            self.markers.children(&parent)
        };
        if !made.is_empty() {
            top.get_or_insert_with(Vec::new)
                .extend(made.into_iter().map(|name| DirEntry {
                    name,
                    is_dir: true,
                    size: 0,
                    version_tag: String::new(),
                    mtime_ns: 0,
                }));
        }
        let mut page = Page {
            items: Vec::new(),
            truncated: false,
        };
        let Some(top) = top else {
            self.require_bucket(a.bucket).await?;
            return Ok(page);
        };
        let level = sorted_level(dir_key, top, partial);
        if a.max == 0 {
            return Ok(page);
        }
        if a.delimiter == Some("/") {
            for (key, e) in level {
                let wanted = if e.is_dir {
                    subtree_after(&key, a.after)
                } else {
                    a.after.is_none_or(|after| key.as_str() > after)
                };
                if !wanted {
                    continue;
                }
                if page.items.len() == a.max {
                    page.truncated = true;
                    break;
                }
                page.items.push(if e.is_dir {
                    Item::Prefix(key)
                } else {
                    Item::object(key, e)
                });
            }
            return Ok(page);
        }
        // Depth first, in key order: a directory's keys all sort between its siblings' as its
        // sort key `name/` does.
        let mut stack = vec![level.into_iter()];
        while let Some(level) = stack.last_mut() {
            let Some((key, e)) = level.next() else {
                stack.pop();
                continue;
            };
            if e.is_dir {
                if !subtree_after(&key, a.after) {
                    continue;
                }
                let dir = format!("/{}/{}", a.bucket, key.trim_end_matches('/'));
                // A directory that went away since its parent was listed has no keys.
                if let Some(entries) = self.entries(&dir).await? {
                    stack.push(sorted_level(&key, entries, "").into_iter());
                }
            } else if a.after.is_none_or(|after| key.as_str() > after) {
                // With a delimiter other than `/`, a key with the delimiter after the prefix
                // is rolled up into its common prefix (the key up to and including the first
                // delimiter there), listed once, where its first key would be; a common prefix
                // not after `after` was listed on an earlier page.
                let item = match a.delimiter.and_then(|d| common_prefix(&key, a.prefix, d)) {
                    Some(cp) => {
                        let seen = matches!(page.items.last(), Some(Item::Prefix(p)) if *p == cp);
                        if seen || a.after.is_some_and(|after| cp.as_str() <= after) {
                            continue;
                        }
                        Item::Prefix(cp)
                    }
                    None => Item::object(key, e),
                };
                if page.items.len() == a.max {
                    page.truncated = true;
                    break;
                }
                page.items.push(item);
            }
        }
        Ok(page)
    }

    /// A listed object, with the ETag HeadObject gives it (and its owner, if asked).
    fn object_entry(&self, bucket: &str, item: ListedObject, enc: bool, owner: bool) -> Object {
        let ListedObject {
            key,
            size,
            mtime_ns,
            version,
        } = item;
        // A store whose listing gives no ETag leaves it out here too: one made up would not
        // be the ETag HeadObject answers.
        let e_tag = (!version.is_empty())
            .then(|| self.tags_at(&format!("/{bucket}/{key}"), &version).reported);
        Object {
            key: Some(if enc { url_encode(&key) } else { key }),
            e_tag,
            size: Some(size.try_into().unwrap_or(i64::MAX)),
            last_modified: Some(super::modified(mtime_ns)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            owner: owner.then(super::acl::owner),
            ..Object::default()
        }
    }

    /// Reads back the records (`record.rs`) of the listed objects this gateway does not know,
    /// where they are at hand, so that a listing gives each object the ETag HeadObject gives it
    /// (after a restart, or for another gateway's writes): a `file://` mount keeps an object's
    /// record in an extended attribute of its file, the cluster's records keep those of files
    /// written through a write-back mount. On a cloud store it would cost a request per
    /// object, and the ETag listed is the store's own (for an object written in one piece, its
    /// MD5, as recorded).
    async fn recall_listed(&self, bucket: &str, page: &Page) {
        /// Records read at once.
        const AT_ONCE: usize = 16;
        let table = self.client.ufs_table();
        let unknown: Vec<ObjectInfo> = page
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Object(o) => ObjectInfo::listed(
                    format!("/{bucket}/{}", o.key),
                    &DirEntry {
                        name: String::new(),
                        is_dir: false,
                        size: o.size,
                        version_tag: o.version.clone(),
                        mtime_ns: o.mtime_ns,
                    },
                ),
                Item::Prefix(_) => None,
            })
            .filter(|info| {
                is_wb_tag(&info.version) || table.is_some_and(|t| t.is_local(&info.path))
            })
            .filter(|info| !self.aliases.knows(&info.path, &info.version))
            .collect();
        let mut reads = futures_util::stream::iter(unknown)
            .map(|info| async move { self.recall(&info).await })
            .buffer_unordered(AT_ONCE);
        while reads.next().await.is_some() {}
    }

    async fn split_page(
        &self,
        bucket: &str,
        page: Page,
        enc: bool,
        owner: bool,
    ) -> (Vec<Object>, Vec<CommonPrefix>) {
        self.recall_listed(bucket, &page).await;
        let mut objects = Vec::new();
        let mut prefixes = Vec::new();
        for item in page.items {
            match item {
                Item::Object(o) => objects.push(self.object_entry(bucket, o, enc, owner)),
                Item::Prefix(p) => prefixes.push(CommonPrefix {
                    prefix: Some(if enc { url_encode(&p) } else { p }),
                }),
            }
        }
        (objects, prefixes)
    }
}

/// The `max-keys` of a listing.
fn max_keys(v: Option<i32>) -> S3Result<usize> {
    match v {
        None => Ok(MAX_KEYS),
        Some(n) if n < 0 => Err(invalid(format!("max-keys {n} is negative"))),
        Some(n) => Ok((n as usize).min(MAX_KEYS)),
    }
}

/// The delimiter of a listing (an empty one is none).
fn delimiter(d: Option<&str>) -> Option<&str> {
    d.filter(|d| !d.is_empty())
}

/// The common prefix `key` is rolled up into by `delimiter` in a listing of `prefix`: `key` up
/// to and including the first `delimiter` after `prefix`, if there is one.
fn common_prefix(key: &str, prefix: &str, delimiter: &str) -> Option<String> {
    let rest = key.get(prefix.len()..)?;
    rest.find(delimiter)
        .map(|i| key[..prefix.len() + i + delimiter.len()].to_string())
}

fn is_url(e: Option<&EncodingType>) -> bool {
    e.is_some_and(|e| e.as_str() == EncodingType::URL)
}

/// ListObjectsV2: a page after the continuation token (or `start-after`).
pub(super) async fn list_objects_v2(
    gw: &Gateway,
    req: S3Request<ListObjectsV2Input>,
) -> S3Result<S3Response<ListObjectsV2Output>> {
    let input = req.input;
    let max = max_keys(input.max_keys)?;
    let prefix = input.prefix.clone().unwrap_or_default();
    // An empty token is no token (as S3 takes it), and is answered as given.
    let continuation_token = input.continuation_token;
    let token = match continuation_token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => Some(decode_token(t)?),
        None => None,
    };
    // A continuation token wins over start-after (it is later in the same listing).
    let after = token
        .as_deref()
        .or(input.start_after.as_deref().filter(|s| !s.is_empty()));
    let page = gw
        .list_page(&ListArgs {
            bucket: &input.bucket,
            prefix: &prefix,
            delimiter: delimiter(input.delimiter.as_deref()),
            after,
            max,
        })
        .await?;
    let enc = is_url(input.encoding_type.as_ref());
    // The token names the last key the walk reached, even if that object went away since.
    let next = page
        .truncated
        .then(|| page.items.last().map(|i| encode_token(i.key())))
        .flatten();
    let truncated = page.truncated;
    let count = page.items.len();
    let owner = input.fetch_owner == Some(true);
    let (contents, prefixes) = gw.split_page(&input.bucket, page, enc, owner).await;
    let code = |s: String| if enc { url_encode(&s) } else { s };
    Ok(S3Response::new(ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(code(prefix)),
        delimiter: input.delimiter.filter(|d| !d.is_empty()).map(code),
        start_after: input.start_after.map(code),
        max_keys: Some(max as i32),
        key_count: Some(count as i32),
        is_truncated: Some(truncated),
        continuation_token,
        next_continuation_token: next,
        contents: Some(contents),
        common_prefixes: Some(prefixes),
        encoding_type: input.encoding_type,
        ..ListObjectsV2Output::default()
    }))
}

/// A page of a listing paged by markers (ListObjects v1, ListObjectVersions): the objects
/// (with owners) and common prefixes after `marker`, and, when it is truncated, the next marker
/// (the last key or common prefix, encoded as asked).
struct MarkerPage {
    max: usize,
    enc: bool,
    truncated: bool,
    next: Option<String>,
    contents: Vec<Object>,
    prefixes: Vec<CommonPrefix>,
}

async fn marker_page(
    gw: &Gateway,
    bucket: &str,
    prefix: &str,
    delimiter_asked: Option<&str>,
    marker: Option<&str>,
    max_keys_asked: Option<i32>,
    encoding: Option<&EncodingType>,
) -> S3Result<MarkerPage> {
    let max = max_keys(max_keys_asked)?;
    let page = gw
        .list_page(&ListArgs {
            bucket,
            prefix,
            delimiter: delimiter(delimiter_asked),
            after: marker.filter(|m| !m.is_empty()),
            max,
        })
        .await?;
    let enc = is_url(encoding);
    let truncated = page.truncated;
    let next = truncated
        .then(|| page.items.last().map(|i| i.key().to_string()))
        .flatten()
        .map(|k| if enc { url_encode(&k) } else { k });
    let (contents, prefixes) = gw.split_page(bucket, page, enc, true).await;
    Ok(MarkerPage {
        max,
        enc,
        truncated,
        next,
        contents,
        prefixes,
    })
}

/// ListObjects (version 1): a page after the marker; each object with its owner, as S3 lists
/// them.
pub(super) async fn list_objects(
    gw: &Gateway,
    req: S3Request<ListObjectsInput>,
) -> S3Result<S3Response<ListObjectsOutput>> {
    let input = req.input;
    let prefix = input.prefix.clone().unwrap_or_default();
    let p = marker_page(
        gw,
        &input.bucket,
        &prefix,
        input.delimiter.as_deref(),
        input.marker.as_deref(),
        input.max_keys,
        input.encoding_type.as_ref(),
    )
    .await?;
    let code = |s: String| if p.enc { url_encode(&s) } else { s };
    Ok(S3Response::new(ListObjectsOutput {
        name: Some(input.bucket),
        // Version 1 answers the Prefix as given, even with encoding-type=url (as S3 does).
        prefix: Some(prefix),
        delimiter: input.delimiter.filter(|d| !d.is_empty()).map(code),
        marker: Some(code(input.marker.unwrap_or_default())),
        max_keys: Some(p.max as i32),
        is_truncated: Some(p.truncated),
        next_marker: p.next,
        contents: Some(p.contents),
        common_prefixes: Some(p.prefixes),
        encoding_type: input.encoding_type,
        ..ListObjectsOutput::default()
    }))
}

/// ListObjectVersions: buckets here are never versioned, so every object has one version, S3's
/// `null`, the latest: the listing is ListObjects' with each object as that version (clients
/// that empty a bucket by its versions, and tools that list versions, work as on an unversioned
/// S3 bucket). A `version-id-marker` can only be `null`, so the key marker alone says where to
/// go on.
pub(super) async fn list_object_versions(
    gw: &Gateway,
    req: S3Request<ListObjectVersionsInput>,
) -> S3Result<S3Response<ListObjectVersionsOutput>> {
    let input = req.input;
    let prefix = input.prefix.clone().unwrap_or_default();
    let p = marker_page(
        gw,
        &input.bucket,
        &prefix,
        input.delimiter.as_deref(),
        input.key_marker.as_deref(),
        input.max_keys,
        input.encoding_type.as_ref(),
    )
    .await?;
    let code = |s: String| if p.enc { url_encode(&s) } else { s };
    let versions = p
        .contents
        .into_iter()
        .map(|o| ObjectVersion {
            e_tag: o.e_tag,
            is_latest: Some(true),
            key: o.key,
            last_modified: o.last_modified,
            owner: o.owner,
            size: o.size,
            storage_class: Some(ObjectVersionStorageClass::from_static(
                ObjectVersionStorageClass::STANDARD,
            )),
            version_id: Some("null".into()),
            ..ObjectVersion::default()
        })
        .collect();
    Ok(S3Response::new(ListObjectVersionsOutput {
        name: Some(input.bucket),
        prefix: Some(code(prefix)),
        delimiter: input.delimiter.filter(|d| !d.is_empty()).map(code),
        key_marker: Some(code(input.key_marker.unwrap_or_default())),
        version_id_marker: Some(input.version_id_marker.unwrap_or_default()),
        max_keys: Some(p.max as i32),
        is_truncated: Some(p.truncated),
        next_version_id_marker: p.next.as_ref().map(|_| "null".to_string()),
        next_key_marker: p.next,
        versions: Some(versions),
        common_prefixes: Some(p.prefixes),
        encoding_type: input.encoding_type,
        ..ListObjectVersionsOutput::default()
    }))
}
