//! The under storage (UFS): a mount table mapping logical path prefixes to object stores, and
//! version-pinned reads from them.
//!
//! Every object has a *version tag* (its etag, or its modification time and size where a store
//! has no etag) that becomes part of its 128-bit file id, so a changed object gets new page keys
//! and never hits stale pages. Reads name the version they expect; a store that holds another
//! version answers [`UfsError::Changed`] instead of mixing versions.

use std::{fmt, ops::Range, path::PathBuf, sync::Arc};

use crate::localfs::LocalStore;
use bytes::Bytes;
use object_store::{path::Path as StorePath, GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use pagestore_protocol::writeback::WritePolicy;
use pagestore_protocol::{
    frame::{Attr, DirEntry, ErrorCode, FileId, FileRef, FileState, MountEntry, PathKind},
    source::{Source, SourceError, SourceFuture},
};

/// The prefix of a user metadata attribute's name in an [`Attr`].
const META_PREFIX: &str = "x-amz-meta-";

/// Object attributes as the wire and the write-back records carry them ([`Attr`]: lowercase
/// header names, user metadata as `x-amz-meta-KEY`), from the store's form.
pub fn wire_attrs(a: &object_store::Attributes) -> Vec<Attr> {
    use object_store::Attribute as A;
    let mut out: Vec<Attr> = a
        .iter()
        .filter_map(|(k, v)| {
            let name = match k {
                A::ContentType => "content-type".to_string(),
                A::CacheControl => "cache-control".to_string(),
                A::ContentDisposition => "content-disposition".to_string(),
                A::ContentEncoding => "content-encoding".to_string(),
                A::ContentLanguage => "content-language".to_string(),
                A::Metadata(k) => format!("{META_PREFIX}{}", k.to_ascii_lowercase()),
                _ => return None,
            };
            Some(Attr {
                name,
                value: v.as_ref().to_string(),
            })
        })
        .collect();
    out.sort_by(|x, y| x.name.cmp(&y.name));
    out
}

/// [`wire_attrs`] the other way: the store's form of wire attributes (names it does not
/// know are left out).
pub fn store_attributes(attrs: &[Attr]) -> object_store::Attributes {
    use object_store::Attribute as A;
    let mut out = object_store::Attributes::new();
    for a in attrs {
        let key = match a.name.as_str() {
            "content-type" => A::ContentType,
            "cache-control" => A::CacheControl,
            "content-disposition" => A::ContentDisposition,
            "content-encoding" => A::ContentEncoding,
            "content-language" => A::ContentLanguage,
            n => match n.strip_prefix(META_PREFIX) {
                Some(k) if !k.is_empty() => A::Metadata(k.to_string().into()),
                _ => continue,
            },
        };
        out.insert(key, a.value.clone().into());
    }
    out
}

/// Errors of the under storage.
#[derive(Debug)]
pub enum UfsError {
    /// A mount is misconfigured; the message names the mount and the setting.
    Config(String),
    /// No mount covers the path, or the object does not exist.
    NotFound(String),
    /// The path is not acceptable (`..`, empty segments, not absolute).
    BadPath(String),
    /// The object changed since its version was looked up.
    Changed {
        /// The logical path.
        path: String,
        /// The version the caller expected.
        expected: String,
    },
    /// The store failed at the path (or mount URL) given; the store's error is the source.
    /// The message shows that error's text through [`scrub`]; the source itself is unedited
    /// (its text may quote an endpoint URL with credentials): print chains through [`scrub`].
    Store(String, object_store::Error),
}

impl fmt::Display for UfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UfsError::Config(m) => write!(f, "mount configuration: {}", scrub(m)),
            UfsError::NotFound(p) => write!(f, "{p}: not found"),
            UfsError::BadPath(m) => write!(f, "bad path: {m}"),
            UfsError::Changed { path, expected } => write!(
                f,
                "{path}: the object changed (expected version {expected}); stat it again"
            ),
            UfsError::Store(p, e) => write!(f, "{p}: {}", scrub(&e.to_string())),
        }
    }
}

impl std::error::Error for UfsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UfsError::Store(_, e) => Some(e),
            _ => None,
        }
    }
}

/// What the table knows about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Logical path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Version tag (etag without quotes, or `mtime-size`).
    pub version: String,
    /// The file id of this path at this version (page keys are `(file_id, page)`).
    pub file_id: u128,
    /// Modification time in the store, nanoseconds since the Unix epoch (negative before it;
    /// 0 where unknown, e.g. an `ObjectInfo` rebuilt from a wire `FileRef`).
    pub mtime_ns: i64,
    /// Where the bytes are: an object of the store, or a file written through the cluster
    /// (flushed or not yet).
    pub state: FileState,
    /// The store's version of the object holding these bytes ("" while the store holds none:
    /// a write-back file not flushed yet). Equal to `version` for objects of the store.
    pub store_tag: String,
}

impl ObjectInfo {
    /// What a listing entry `e` says of the file at `path`: the same as a stat of it at the
    /// time of the listing, so that a reader of what it listed needs no stat per file. `None`
    /// for a directory, and for a file whose listing gave no version (a stat says it).
    pub fn listed(path: String, e: &DirEntry) -> Option<ObjectInfo> {
        if e.is_dir || e.version_tag.is_empty() {
            return None;
        }
        // A listing does not say where a file written through the cluster is: its store
        // version is unknown ("" until a stat says).
        let written = pagestore_protocol::writeback::is_wb_tag(&e.version_tag);
        Some(ObjectInfo {
            file_id: file_id(&path, &e.version_tag),
            path,
            size: e.size,
            version: e.version_tag.clone(),
            mtime_ns: e.mtime_ns,
            state: if written {
                FileState::Dirty
            } else {
                FileState::Stored
            },
            store_tag: if written {
                String::new()
            } else {
                e.version_tag.clone()
            },
        })
    }

    /// The modification time in the store.
    pub fn modified(&self) -> std::time::SystemTime {
        system_time(self.mtime_ns)
    }

    /// The store version a read of this object must find: the store's tag of a file written
    /// through the cluster and flushed, else the version (for a file not flushed yet that is
    /// its write-back version, which no store object has: reading it from the store fails as
    /// changed, never with other bytes).
    pub fn store_version(&self) -> &str {
        if self.store_tag.is_empty() {
            &self.version
        } else {
            &self.store_tag
        }
    }

    /// An object of the store at `version` (what a stat of it answers).
    pub fn stored(path: String, size: u64, version: String, mtime_ns: i64) -> ObjectInfo {
        ObjectInfo {
            file_id: file_id(&path, &version),
            path,
            size,
            store_tag: version.clone(),
            version,
            mtime_ns,
            state: FileState::Stored,
        }
    }
}

/// `ns` nanoseconds after the Unix epoch (before it when negative), as a `SystemTime`.
pub fn system_time(ns: i64) -> std::time::SystemTime {
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    let d = std::time::Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        epoch + d
    } else {
        epoch.checked_sub(d).unwrap_or(epoch)
    }
}

/// `t` in nanoseconds since the Unix epoch (negative before it), clamped to what an `i64`
/// holds: the inverse of [`system_time`].
pub fn unix_ns_of(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// A store's modification time in nanoseconds since the Unix epoch, clamped to what an `i64`
/// holds (years 1677 to 2262).
pub fn mtime_ns(t: &chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(if t.timestamp() < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A file (object), with its size.
    File(String, u64),
    /// A directory (common prefix).
    Dir(String),
}

struct Mount {
    /// Logical prefix without a trailing slash ("" for the root mount).
    prefix: String,
    url: String,
    store: Arc<dyn ObjectStore>,
    /// The store itself for `file://` mounts (file modes for `pagefs`).
    local: Option<Arc<LocalStore>>,
    /// For `s3://`, `gs://` and `az://` mounts: the bucket, listed a page at a time for the heads of
    /// listings.
    paged: Option<Paged>,
    emulate: Emulation,
    /// How the mount takes writes (the URL's `write` parameter).
    write: WritePolicy,
}

/// A bucket that lists a page at a time ([`MountTable::list_head`]).
struct Paged {
    store: Arc<dyn object_store::list::PaginatedListStore>,
    /// The mount's key prefix in the bucket ("" for the whole bucket), without slashes around it.
    prefix: String,
}

impl Paged {
    /// The head of the listing of the directory `dir` (relative to the mount): one store
    /// request for at most `max` keys and common prefixes. The store answers in key order,
    /// listings are in name order, and the two differ where a name continues with a byte below
    /// `/` (`a-b` is before `a/`, the key of directory `a`): what the request returned is cut
    /// before the first name a directory the store has yet to list could have. `None` when
    /// that leaves nothing (the whole listing is made instead).
    async fn head(
        &self,
        dir: &StorePath,
        max: usize,
    ) -> Option<object_store::Result<(Vec<DirEntry>, bool)>> {
        let prefix = [self.prefix.as_str(), dir.as_ref()]
            .iter()
            .filter(|p| !p.is_empty())
            .fold(String::new(), |acc, p| acc + p + "/");
        let opts = object_store::list::PaginatedListOptions {
            delimiter: Some(std::borrow::Cow::Borrowed("/")),
            max_keys: Some(max),
            ..Default::default()
        };
        let page = match self
            .store
            .list_paginated((!prefix.is_empty()).then_some(prefix.as_str()), opts)
            .await
        {
            Ok(page) => page,
            Err(e) => return Some(Err(e)),
        };
        let more = page.page_token.is_some();
        // The last key the store returned, relative to the directory (a common prefix's key
        // ends with its `/`).
        let relative = |key: &str| key.strip_prefix(prefix.as_str()).map(str::to_string);
        let last = page
            .result
            .objects
            .iter()
            .filter_map(|o| relative(o.location.as_ref()))
            .chain(
                page.result
                    .common_prefixes
                    .iter()
                    .filter_map(|p| relative(&format!("{}/", p.as_ref()))),
            )
            .max();
        let mut entries = sorted_entries(store_entries(
            page.result.common_prefixes,
            page.result.objects,
        ));
        if more {
            let cut = last.as_deref().map(name_cut)?;
            entries.retain(|e| e.name.as_str() < cut);
            if entries.is_empty() {
                return None;
            }
        }
        Some(Ok((entries, more)))
    }
}

/// Where a head of a listing must end when the store's keys went up to `last` (relative to
/// the directory): before the shortest start of `last` that is followed by a byte below `/`, or
/// before `last` itself. Every key the store has yet to list is greater than `last`, but a
/// directory `d` that it has yet to list (key `d/`) sorts before `last` by name when `last`
/// starts with `d` followed by such a byte (`d-x`, `d.x`); names of files it has yet to list
/// are greater than `last`, and so is every other directory's name.
fn name_cut(last: &str) -> &str {
    let b = last.as_bytes();
    let end = (1..b.len()).find(|&k| b[k] < b'/').unwrap_or(b.len());
    // `end` is 1.. or the length: a byte below `/` is ASCII, so it is a character boundary.
    &last[..end]
}

/// The mount table: logical prefix -> object store.
pub struct MountTable {
    /// Longest prefix first.
    mounts: Vec<Mount>,
    /// Prefixes of mounts this table could not open (a client without the store's
    /// credentials): their paths are unavailable here, not missing.
    unavailable: Vec<(String, String)>,
}

/// Splits `/LOGICAL=URL` (the command-line form).
pub fn parse_mount(spec: &str) -> Result<(String, String), UfsError> {
    let (logical, url) = spec.split_once('=').ok_or_else(|| {
        UfsError::Config(format!(
            "{spec:?}: expected /LOGICAL=URL, e.g. /data=file:///srv/data"
        ))
    })?;
    if !logical.starts_with('/') {
        return Err(UfsError::Config(format!(
            "{spec:?}: the logical prefix must start with /"
        )));
    }
    Ok((logical.trim_end_matches('/').to_string(), url.to_string()))
}

fn store_for(url: &str) -> Result<Arc<dyn ObjectStore>, UfsError> {
    let u = url::Url::parse(url).map_err(|e| UfsError::Config(format!("{}: {e}", redact(url))))?;
    let q: std::collections::HashMap<String, String> = u.query_pairs().into_owned().collect();
    base_store_for(url, &u, &q)
}

/// Benchmark knobs of a mount URL (`emulate_latency_ms`, `emulate_mbps`): make a nearby store
/// behave like a distant one. Every request waits the latency; reads and writes also wait their
/// size at the given bandwidth (per request: a single put, each part of a multipart write; the
/// start and the completion of a multipart write are requests of their own).
#[derive(Clone, Copy, Debug, Default)]
struct Emulation {
    latency: std::time::Duration,
    bytes_per_sec: Option<f64>,
}

impl Emulation {
    fn parse(url: &str) -> Result<Emulation, UfsError> {
        let u =
            url::Url::parse(url).map_err(|e| UfsError::Config(format!("{}: {e}", redact(url))))?;
        let mut e = Emulation::default();
        for (k, v) in u.query_pairs() {
            let num = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| {
                        UfsError::Config(format!(
                            "{}: {k}={v} is not a positive number",
                            redact(url)
                        ))
                    })
            };
            match k.as_ref() {
                "emulate_latency_ms" => {
                    e.latency = std::time::Duration::from_secs_f64(num()? / 1e3)
                }
                "emulate_mbps" => e.bytes_per_sec = Some(num()? * 1e6),
                _ => {}
            }
        }
        Ok(e)
    }

    async fn wait(&self, bytes: u64) {
        let transfer = self.bytes_per_sec.map_or(0.0, |bw| bytes as f64 / bw);
        let d = self.latency + std::time::Duration::from_secs_f64(transfer);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// `upload` with every part, the completion and an abort delayed as requests are.
    fn upload(
        self,
        upload: Box<dyn object_store::MultipartUpload>,
    ) -> Box<dyn object_store::MultipartUpload> {
        if self.latency.is_zero() && self.bytes_per_sec.is_none() {
            return upload;
        }
        Box::new(EmulatedUpload {
            inner: upload,
            emulate: self,
        })
    }
}

/// A multipart write to an emulated distant store ([`Emulation`]).
#[derive(Debug)]
struct EmulatedUpload {
    inner: Box<dyn object_store::MultipartUpload>,
    emulate: Emulation,
}

#[async_trait::async_trait]
impl object_store::MultipartUpload for EmulatedUpload {
    fn put_part(&mut self, data: object_store::PutPayload) -> object_store::UploadPart {
        let (emulate, len) = (self.emulate, data.content_length() as u64);
        let part = self.inner.put_part(data);
        Box::pin(async move {
            emulate.wait(len).await;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<object_store::PutResult> {
        self.emulate.wait(0).await;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.emulate.wait(0).await;
        self.inner.abort().await
    }
}

/// How long a cloud store may keep retrying a failed request (connection refused, 5xx) before
/// the failure is answered. Clients wait 3 s for a node by default and take a node that does
/// not answer in time for dead; a node whose store is down must say so before that.
pub const STORE_RETRY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

fn retry_config() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: std::time::Duration::from_millis(50),
            max_backoff: std::time::Duration::from_millis(400),
            base: 2.0,
        },
        max_retries: 5,
        retry_timeout: STORE_RETRY_TIMEOUT,
    }
}

fn client_options() -> object_store::ClientOptions {
    object_store::ClientOptions::new().with_connect_timeout(std::time::Duration::from_secs(1))
}

fn base_store_for(url: &str, u: &url::Url, q: &Query) -> Result<Arc<dyn ObjectStore>, UfsError> {
    // Messages name the URL without its secrets.
    let shown = redact(url);
    let url = shown.as_str();
    match u.scheme() {
        "file" => {
            let (fs, _) = open_local(url, u)?;
            Ok(Arc::new(fs))
        }
        "s3" => s3_store(url, u, q),
        "gs" => gcs_store(url, u, q),
        "az" | "abfs" => azure_store(url, u, q),
        other => Err(UfsError::Config(format!("{url}: unknown scheme {other:?}"))),
    }
}

/// Query parameters of a mount URL.
type Query = std::collections::HashMap<String, String>;

/// `s3://bucket/prefix?region=..&endpoint=..`: keys from the URL or `AWS_*`, or anonymous.
fn s3_store(url: &str, u: &url::Url, q: &Query) -> Result<Arc<dyn ObjectStore>, UfsError> {
    let (s3, prefix) = s3_bucket(url, u, q)?;
    Ok(with_prefix(s3, &prefix))
}

/// `store` with the mount's key `prefix` applied.
fn with_prefix<S: ObjectStore>(store: S, prefix: &str) -> Arc<dyn ObjectStore> {
    Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
}

/// A mount's store (its key prefix applied) and its bucket, listed a page at a time.
type PagedMount = (Arc<dyn ObjectStore>, Paged);

/// For the mounts of stores that list a page at a time (`s3://`, `gs://`, `az://`): the store
/// with the mount's key prefix applied, and the bucket itself for the heads of listings. `None`
/// for the other schemes.
fn paged_mount(url: &str, u: &url::Url) -> Result<Option<PagedMount>, UfsError> {
    fn both<S>(bucket: S, prefix: String) -> PagedMount
    where
        S: ObjectStore + object_store::list::PaginatedListStore + Clone,
    {
        let store = with_prefix(bucket.clone(), &prefix);
        let paged = Paged {
            store: Arc::new(bucket),
            prefix,
        };
        (store, paged)
    }
    let q: Query = u.query_pairs().into_owned().collect();
    let shown = redact(url);
    Ok(match u.scheme() {
        "s3" => {
            let (bucket, prefix) = s3_bucket(&shown, u, &q)?;
            Some(both(bucket, prefix))
        }
        "gs" => {
            let (bucket, prefix) = gcs_bucket(&shown, u, &q)?;
            Some(both(bucket, prefix))
        }
        "az" | "abfs" => {
            let (container, prefix) = azure_container(&shown, u, &q)?;
            Some(both(container, prefix))
        }
        _ => None,
    })
}

/// The bucket of an `s3://` URL and the mount's key prefix in it (no slashes around it).
fn s3_bucket(
    url: &str,
    u: &url::Url,
    q: &Query,
) -> Result<(object_store::aws::AmazonS3, String), UfsError> {
    let bucket = u
        .host_str()
        .ok_or_else(|| UfsError::Config(format!("{url}: no bucket")))?;
    let mut b = object_store::aws::AmazonS3Builder::new()
        .with_client_options(client_options())
        .with_retry(retry_config())
        .with_bucket_name(bucket);
    b = b.with_region(q.get("region").map_or("us-east-1", String::as_str));
    if let Some(e) = q.get("endpoint") {
        b = b
            .with_endpoint(e)
            .with_allow_http(e.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    let anonymous = q.get("anonymous").is_some_and(|v| v == "true");
    let key = q
        .get("access_key_id")
        .cloned()
        .or_else(|| std::env::var("AWS_ACCESS_KEY_ID").ok());
    let secret = q
        .get("secret_access_key")
        .cloned()
        .or_else(|| std::env::var("AWS_SECRET_ACCESS_KEY").ok());
    match (key, secret, anonymous) {
        (Some(k), Some(s), _) => b = b.with_access_key_id(k).with_secret_access_key(s),
        (_, _, true) => b = b.with_skip_signature(true),
        _ => {
            // Never fall back silently to a cloud metadata endpoint.
            return Err(UfsError::Config(format!(
                "{url}: no credentials: set access_key_id and secret_access_key (or \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or anonymous=true for a \
                 public bucket"
            )));
        }
    }
    let s3 = b.build().map_err(|e| UfsError::Store(url.into(), e))?;
    Ok((s3, u.path().trim_matches('/').to_string()))
}

/// `gs://bucket/prefix`: a service account key (file or JSON), or anonymous.
fn gcs_store(url: &str, u: &url::Url, q: &Query) -> Result<Arc<dyn ObjectStore>, UfsError> {
    let (gcs, prefix) = gcs_bucket(url, u, q)?;
    Ok(with_prefix(gcs, &prefix))
}

/// The bucket of a `gs://` URL and the mount's key prefix in it (no slashes around it).
fn gcs_bucket(
    url: &str,
    u: &url::Url,
    q: &Query,
) -> Result<(object_store::gcp::GoogleCloudStorage, String), UfsError> {
    let bucket = u
        .host_str()
        .ok_or_else(|| UfsError::Config(format!("{url}: no bucket")))?;
    let mut b = object_store::gcp::GoogleCloudStorageBuilder::new()
        .with_client_options(client_options())
        .with_retry(retry_config())
        .with_bucket_name(bucket);
    if let Some(e) = q.get("endpoint") {
        b = b
            .with_config(object_store::gcp::GoogleConfigKey::BaseUrl, e)
            .with_client_options(client_options().with_allow_http(e.starts_with("http://")));
    }
    let anonymous = q.get("anonymous").is_some_and(|v| v == "true");
    let key_file = q
        .get("service_account_path")
        .cloned()
        .or_else(|| std::env::var("GOOGLE_SERVICE_ACCOUNT").ok())
        .or_else(|| std::env::var("GOOGLE_APPLICATION_CREDENTIALS").ok());
    b = match (key_file, q.get("service_account_key"), anonymous) {
        (_, Some(json), _) => b.with_service_account_key(json),
        (Some(path), None, _) => b.with_service_account_path(path),
        (None, None, true) => b.with_skip_signature(true),
        (None, None, false) => {
            return Err(UfsError::Config(format!(
                "{url}: no credentials: set service_account_path (or \
                 GOOGLE_APPLICATION_CREDENTIALS) to a service account key file, or \
                 anonymous=true for a public bucket"
            )))
        }
    };
    let gcs = b.build().map_err(|e| UfsError::Store(url.into(), e))?;
    Ok((gcs, u.path().trim_matches('/').to_string()))
}

/// `az://container/prefix?account=..`: an account key, a SAS token, or anonymous.
fn azure_store(url: &str, u: &url::Url, q: &Query) -> Result<Arc<dyn ObjectStore>, UfsError> {
    let (az, prefix) = azure_container(url, u, q)?;
    Ok(with_prefix(az, &prefix))
}

/// The container of an `az://` URL and the mount's key prefix in it (no slashes around it).
fn azure_container(
    url: &str,
    u: &url::Url,
    q: &Query,
) -> Result<(object_store::azure::MicrosoftAzure, String), UfsError> {
    let container = u
        .host_str()
        .ok_or_else(|| UfsError::Config(format!("{url}: no container")))?;
    let account = q
        .get("account")
        .cloned()
        .or_else(|| std::env::var("AZURE_STORAGE_ACCOUNT_NAME").ok())
        .ok_or_else(|| {
            UfsError::Config(format!(
                "{url}: no storage account: set account= (or AZURE_STORAGE_ACCOUNT_NAME)"
            ))
        })?;
    let mut b = object_store::azure::MicrosoftAzureBuilder::new()
        .with_client_options(client_options())
        .with_retry(retry_config())
        .with_account(account)
        .with_container_name(container);
    if let Some(e) = q.get("endpoint") {
        b = b
            .with_endpoint(e.clone())
            .with_allow_http(e.starts_with("http://"));
    }
    let anonymous = q.get("anonymous").is_some_and(|v| v == "true");
    let key = q
        .get("access_key")
        .cloned()
        .or_else(|| std::env::var("AZURE_STORAGE_ACCOUNT_KEY").ok());
    b = match (key, q.get("sas"), anonymous) {
        (Some(k), _, _) => b.with_access_key(k),
        (None, Some(sas), _) => {
            b.with_config(object_store::azure::AzureConfigKey::SasKey, sas.as_str())
        }
        (None, None, true) => b.with_skip_signature(true),
        (None, None, false) => {
            return Err(UfsError::Config(format!(
                "{url}: no credentials: set access_key (or AZURE_STORAGE_ACCOUNT_KEY), \
                 sas, or anonymous=true for a public container"
            )))
        }
    };
    let az = b.build().map_err(|e| UfsError::Store(url.into(), e))?;
    Ok((az, u.path().trim_matches('/').to_string()))
}

/// Opens the directory of a `file://` URL as a [`LocalStore`]; also returns the directory's
/// real path (symlinks resolved, taken from the opened descriptor itself).
fn open_local(url: &str, u: &url::Url) -> Result<(LocalStore, PathBuf), UfsError> {
    let dir = u
        .to_file_path()
        .map_err(|_| UfsError::Config(format!("{}: not a local path", redact(url))))?;
    if !dir.is_dir() {
        return Err(UfsError::Config(format!(
            "{}: {} is not a directory",
            redact(url),
            dir.display()
        )));
    }
    let fs = LocalStore::new(&dir)
        .map_err(|e| UfsError::Config(format!("{}: cannot open it: {e}", redact(url))))?;
    let real = fs
        .real_path()
        .or_else(|_| dir.canonicalize())
        .map_err(|e| UfsError::Config(format!("{}: {e}", redact(url))))?;
    Ok((fs, real))
}

/// The local directory a `file://` URL names (`None` for other URLs).
pub fn local_dir(url: &str) -> Option<PathBuf> {
    let u = url::Url::parse(url).ok()?;
    (u.scheme() == "file").then(|| u.to_file_path().ok())?
}

/// The local directories a node may serve `file://` mounts from (`pagestored
/// --allow-file-root`). A `file://` mount whose directory (symlinks resolved) is not one of them
/// or beneath one is refused, wherever the mount comes from (flags, config, etcd).
#[derive(Clone, Debug, Default)]
pub struct FileRoots {
    roots: Vec<PathBuf>,
}

impl FileRoots {
    /// The allow-list of `dirs` (each resolved to its real path now; a missing one is an
    /// error naming it).
    pub fn new<P: AsRef<std::path::Path>>(dirs: &[P]) -> Result<FileRoots, UfsError> {
        let mut roots = Vec::new();
        for d in dirs {
            let d = d.as_ref();
            let real = d
                .canonicalize()
                .map_err(|e| UfsError::Config(format!("--allow-file-root {}: {e}", d.display())))?;
            if !real.is_dir() {
                return Err(UfsError::Config(format!(
                    "--allow-file-root {}: not a directory",
                    d.display()
                )));
            }
            roots.push(real);
        }
        Ok(FileRoots { roots })
    }

    /// The allowed roots (real paths).
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn allows(&self, real: &std::path::Path) -> bool {
        self.roots.iter().any(|r| real.starts_with(r))
    }
}

/// Checks that `path` is an acceptable logical path to read: absolute, without `.` or `..`
/// segments, NUL bytes or empty segments but a trailing `/`
/// ([`pagestore_protocol::writeback::check_read_path`]).
pub fn check_path(path: &str) -> Result<(), UfsError> {
    pagestore_protocol::writeback::check_read_path(path).map_err(UfsError::BadPath)
}

/// Checks a path that a write names (a file created, replaced or deleted, a directory made or
/// removed, a rename's source and destination): one spelling only, names of at most 255 bytes
/// ([`pagestore_protocol::writeback::check_change_path`]). Stores spell `/a//b` and `/a/b/`
/// as `a/b`, so a write of either would reach another path's object.
pub fn check_written_path(path: &str) -> Result<(), UfsError> {
    pagestore_protocol::writeback::check_change_path(path).map_err(UfsError::BadPath)
}

/// The file id of `path` at `version` (see [`pagestore_protocol::ring::file_id`]).
pub use pagestore_protocol::ring::file_id;

/// The error of an operation the store behind `path` cannot do.
fn not_implemented(path: &str, operation: &str) -> UfsError {
    UfsError::Store(
        path.to_string(),
        object_store::Error::NotImplemented {
            operation: operation.to_string(),
            implementer: "this mount's store".to_string(),
        },
    )
}

/// The parts of one multipart write that are in flight, each a task of its own, at most
/// `limit` at once.
///
/// A part's future does nothing until it is polled (object_store's clients send the request
/// from inside it), so parts kept in a list and awaited oldest first upload one at a time,
/// and none moves while the writer reads its next part. Here every part runs on its own
/// while the caller prepares the next one. Dropping the set (on an error) aborts the parts
/// still running; the caller then aborts the upload.
pub struct PartUploads {
    running: tokio::task::JoinSet<object_store::Result<()>>,
    limit: usize,
}

impl PartUploads {
    /// An empty set that runs at most `limit` parts at once (at least 1).
    pub fn new(limit: usize) -> PartUploads {
        PartUploads {
            running: tokio::task::JoinSet::new(),
            limit: limit.max(1),
        }
    }

    /// Parts running now.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// Whether no part is running.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Starts `part` once fewer than `limit` parts are running. Must be called inside a tokio
    /// runtime.
    ///
    /// # Errors
    ///
    /// The first failure among the parts that ended while waiting for room (`part` is then not
    /// started).
    pub async fn start(&mut self, part: object_store::UploadPart) -> object_store::Result<()> {
        while self.running.len() >= self.limit {
            self.next().await?;
        }
        self.running.spawn(part);
        Ok(())
    }

    /// Waits for every part started.
    ///
    /// # Errors
    ///
    /// The first part failure seen (the rest keep running until the set is dropped).
    pub async fn finish(&mut self) -> object_store::Result<()> {
        while !self.running.is_empty() {
            self.next().await?;
        }
        Ok(())
    }

    async fn next(&mut self) -> object_store::Result<()> {
        match self.running.join_next().await {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(object_store::Error::Generic {
                store: "pagestore",
                source: format!("a part upload task ended: {e}").into(),
            }),
        }
    }
}

/// The version tag of an object the store just wrote (as [`MountTable::stat`] will report it),
/// from the store's answer to the write; `None` if the store did not say.
pub fn written_version(r: &object_store::PutResult) -> Option<String> {
    r.e_tag.as_deref().map(store_tag)
}

/// A store's etag as a version tag: without quotes, and never in the form of a write-back
/// version (such an etag gets a `store-` prefix), so that no object of a store shares file ids
/// with a file written through the cluster.
fn store_tag(etag: &str) -> String {
    let t = etag.trim_matches('"');
    if pagestore_protocol::writeback::is_wb_tag(t) {
        format!("store-{t}")
    } else {
        t.to_string()
    }
}

/// What a conditional write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written; the new object's version tag, if the store gave it.
    Written(Option<String>),
    /// The condition failed: nothing was written.
    ConditionFailed,
}

impl PutOutcome {
    /// Whether the object was written.
    pub fn written(&self) -> bool {
        matches!(self, PutOutcome::Written(_))
    }
}

fn version_of(meta: &object_store::ObjectMeta) -> String {
    match &meta.e_tag {
        Some(e) => store_tag(e),
        None => format!(
            "{}-{}",
            meta.last_modified.timestamp_nanos_opt().unwrap_or(0),
            meta.size
        ),
    }
}

/// The version a listing entry gives an object: its ETag, or "" (unknown) where the listing
/// has none. Some S3-protocol servers list objects without ETags yet answer one to HEAD and
/// GET, and a listing's LastModified (milliseconds) is finer than the Last-Modified header
/// (seconds), so a `mtime-size` tag made from a listing would match no stat of the same
/// object: a read pinned to it would fail as changed. An entry without a version is not used
/// as a stat ([`ObjectInfo::listed`]).
fn listed_version(meta: &object_store::ObjectMeta) -> String {
    meta.e_tag.as_deref().map(store_tag).unwrap_or_default()
}

impl MountTable {
    /// Builds the table from `(logical prefix, URL)` pairs. `file://` mounts may name any
    /// local directory: this is for clients and tools that run with their user's own rights. A
    /// node uses [`MountTable::new_confined`].
    pub fn new(mounts: &[(String, String)]) -> Result<MountTable, UfsError> {
        Self::build(mounts, None)
    }

    /// Builds the table like [`MountTable::new`], but a `file://` mount whose directory (with
    /// symlinks resolved) is not beneath one of `roots` is a [`UfsError::Config`] error.
    ///
    /// A node's table must also fit the wire: clients receive it in every `ClusterInfo`
    /// answer, so a table beyond [`pagestore_protocol::frame::MAX_MOUNTS`] mounts or
    /// [`pagestore_protocol::frame::MAX_MOUNT_TABLE_BYTES`] bytes of prefixes and URLs is a
    /// [`UfsError::Config`] error that names the limit.
    pub fn new_confined(
        mounts: &[(String, String)],
        roots: &FileRoots,
    ) -> Result<MountTable, UfsError> {
        let t = Self::build(mounts, Some(roots))?;
        pagestore_protocol::frame::check_mount_table(&t.public_mounts()).map_err(|e| {
            UfsError::Config(format!(
                "{}: clients could not receive this mount table",
                e.peer_message()
            ))
        })?;
        Ok(t)
    }

    /// A table for reading around the cluster (a client's fallback): the mounts that open here
    /// are served; paths under those that do not (a store whose credentials this client lacks)
    /// are [`UfsError::Config`] errors that say why, not "not found".
    pub fn new_partial(mounts: &[(String, String)]) -> MountTable {
        let mut ok = Vec::new();
        let mut unavailable = Vec::new();
        for pair in mounts {
            match Self::build(std::slice::from_ref(pair), None) {
                Ok(_) => ok.push(pair.clone()),
                Err(e) => {
                    let prefix = pair.0.trim_end_matches('/').to_string();
                    tracing::warn!(mount = %prefix, error = %e, "this mount is not readable here");
                    unavailable.push((prefix, e.to_string()));
                }
            }
        }
        let mut t = Self::build(&ok, None).unwrap_or(MountTable {
            mounts: Vec::new(),
            unavailable: Vec::new(),
        });
        unavailable.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        t.unavailable = unavailable;
        t
    }

    fn build(
        mounts: &[(String, String)],
        roots: Option<&FileRoots>,
    ) -> Result<MountTable, UfsError> {
        let mut out = Vec::new();
        for (prefix, url) in mounts {
            let prefix = prefix.trim_end_matches('/').to_string();
            if out.iter().any(|m: &Mount| m.prefix == prefix) {
                return Err(UfsError::Config(format!("{prefix}/ is mounted twice")));
            }
            let u = url::Url::parse(url)
                .map_err(|e| UfsError::Config(format!("{}: {e}", redact(url))))?;
            let mut paged = None;
            let (store, local): (Arc<dyn ObjectStore>, _) = if u.scheme() == "file" {
                let (fs, real) = open_local(url, &u)?;
                if let Some(roots) = roots {
                    if !roots.allows(&real) {
                        return Err(UfsError::Config(format!(
                            "{prefix}/ = {}: {} is not beneath a directory this node allows \
                             for file:// mounts (--allow-file-root, allow_file_roots)",
                            redact(url),
                            real.display()
                        )));
                    }
                }
                let fs = Arc::new(fs);
                (fs.clone(), Some(fs))
            } else if let Some((store, bucket)) = paged_mount(url, &u)? {
                paged = Some(bucket);
                (store, None)
            } else {
                (store_for(url)?, None)
            };
            // The egress price is for the nodes' accounting (docs/OPERATIONS.md, "Egress"):
            // checked here, so that a node never starts with one it cannot read.
            pagestore_protocol::source::egress_price(url)
                .map_err(|e| UfsError::Config(format!("{prefix}/ = {}: {e}", redact(url))))?;
            let write = WritePolicy::of_url(url)
                .map_err(|e| UfsError::Config(format!("{prefix}/ = {}: {e}", redact(url))))?;
            out.push(Mount {
                prefix,
                url: url.clone(),
                store,
                local,
                paged,
                emulate: Emulation::parse(url)?,
                write,
            });
        }
        out.sort_by_key(|m| std::cmp::Reverse(m.prefix.len()));
        Ok(MountTable {
            mounts: out,
            unavailable: Vec::new(),
        })
    }

    /// Mode bits, owner and group of what `path` names, where its mount is a local directory
    /// (`file://`) and it is a regular file or a directory there. `Ok(None)`: the mount is not
    /// local (its store has no file modes), or nothing is there.
    pub fn local_attributes(&self, path: &str) -> Result<Option<(u32, u32, u32)>, UfsError> {
        let (m, p) = self.resolve(path)?;
        match &m.local {
            None => Ok(None),
            Some(fs) => fs
                .attributes(&p)
                .map_err(|e| UfsError::Config(format!("{path}: {e}"))),
        }
    }

    /// Prefixes of the mounts this table could not open (see [`MountTable::new_partial`]).
    pub fn unavailable_prefixes(&self) -> impl Iterator<Item = &str> {
        self.unavailable.iter().map(|(p, _)| p.as_str())
    }

    /// How the mount of `path` takes writes (`through` for a path no mount holds).
    pub fn write_policy(&self, path: &str) -> WritePolicy {
        self.resolve(path)
            .map_or(WritePolicy::Through, |(m, _)| m.write)
    }

    /// The logical prefix of the mount holding `path` ("" for the root mount).
    pub fn mount_of(&self, path: &str) -> Option<&str> {
        self.resolve(path).ok().map(|(m, _)| m.prefix.as_str())
    }

    /// Whether `path` falls under a `file://` mount of this table.
    pub fn is_local(&self, path: &str) -> bool {
        self.resolve(path).is_ok_and(|(m, _)| m.local.is_some())
    }

    /// Every mount prefix, opened here or not.
    fn prefixes(&self) -> impl Iterator<Item = &str> {
        self.mounts
            .iter()
            .map(|m| m.prefix.as_str())
            .chain(self.unavailable.iter().map(|(p, _)| p.as_str()))
    }

    /// The mounts, as `(logical prefix, URL)`.
    pub fn mounts(&self) -> impl Iterator<Item = (&str, &str)> {
        self.mounts
            .iter()
            .map(|m| (m.prefix.as_str(), m.url.as_str()))
    }

    fn resolve(&self, path: &str) -> Result<(&Mount, StorePath), UfsError> {
        check_path(path)?;
        let under = |prefix: &str| {
            prefix.is_empty()
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|r| r.is_empty() || r.starts_with('/'))
        };
        // A mount that could not be opened here hides the shorter mounts above it.
        let best = self
            .mounts
            .iter()
            .find(|m| under(&m.prefix))
            .map(|m| m.prefix.len());
        for (prefix, why) in &self.unavailable {
            if under(prefix) && best.is_none_or(|b| prefix.len() > b) {
                return Err(UfsError::Config(format!(
                    "{path}: the mount {prefix}/ cannot be read from here ({why})"
                )));
            }
        }
        for m in &self.mounts {
            let rest = if m.prefix.is_empty() {
                Some(path)
            } else {
                path.strip_prefix(&m.prefix)
                    .filter(|r| r.is_empty() || r.starts_with('/'))
            };
            if let Some(rest) = rest {
                let rel = rest.trim_start_matches('/');
                let p = StorePath::parse(rel)
                    .map_err(|e| UfsError::BadPath(format!("{path:?}: {e}")))?;
                return Ok((m, p));
            }
        }
        Err(UfsError::NotFound(path.to_string()))
    }

    /// Size and version of an object.
    pub async fn stat(&self, path: &str) -> Result<ObjectInfo, UfsError> {
        let (m, p) = self.resolve(path)?;
        m.emulate.wait(0).await;
        let meta = m.store.head(&p).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => UfsError::NotFound(path.to_string()),
            e => UfsError::Store(path.to_string(), e),
        })?;
        let version = version_of(&meta);
        Ok(ObjectInfo {
            path: path.to_string(),
            size: meta.size,
            file_id: file_id(path, &version),
            store_tag: version.clone(),
            version,
            mtime_ns: mtime_ns(&meta.last_modified),
            state: FileState::Stored,
        })
    }

    /// Reads `range` of the object at `info`'s version. Bytes past the end are not returned
    /// (a range starting at or after the end gives no bytes).
    pub async fn read(&self, info: &ObjectInfo, range: Range<u64>) -> Result<Bytes, UfsError> {
        let end = range.end.min(info.size);
        if range.start >= end {
            return Ok(Bytes::new());
        }
        let (m, p) = self.resolve(&info.path)?;
        m.emulate.wait(end - range.start).await;
        let opts = GetOptions {
            range: Some(GetRange::Bounded(range.start..end)),
            ..Default::default()
        };
        let expected = info.store_version();
        let changed = || UfsError::Changed {
            path: info.path.clone(),
            expected: expected.to_string(),
        };
        let got = m.store.get_opts(&p, opts).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => UfsError::NotFound(info.path.clone()),
            // The local store found the file rewritten while it read it.
            object_store::Error::Precondition { .. } => changed(),
            e => UfsError::Store(info.path.clone(), e),
        })?;
        // The version is checked against what was actually read (not every store honours
        // conditional reads the same way).
        if version_of(&got.meta) != expected || got.meta.size != info.size {
            return Err(changed());
        }
        got.bytes().await.map_err(|e| match e {
            object_store::Error::Precondition { .. } => changed(),
            e => UfsError::Store(info.path.clone(), e),
        })
    }

    /// Writes `data` as the object at `path` (replacing it), in one request.
    pub async fn put(&self, path: &str, data: Bytes) -> Result<(), UfsError> {
        let (m, p) = self.resolve(path)?;
        m.emulate.wait(data.len() as u64).await;
        m.store
            .put(&p, data.into())
            .await
            .map(|_| ())
            .map_err(|e| UfsError::Store(path.to_string(), e))
    }

    /// Starts a multipart write of the object at `path` (for large objects: parts are sent as
    /// they come and the object appears when the upload completes).
    pub async fn put_multipart(
        &self,
        path: &str,
    ) -> Result<Box<dyn object_store::MultipartUpload>, UfsError> {
        let (m, p) = self.resolve(path)?;
        m.emulate.wait(0).await;
        m.store
            .put_multipart(&p)
            .await
            .map(|u| m.emulate.upload(u))
            .map_err(|e| UfsError::Store(path.to_string(), e))
    }

    /// Writes `data` as the object at `path` in one request, with `attributes` (where the
    /// store keeps them), if `mode` allows it (`PutMode::Create`: nothing there;
    /// `PutMode::Update`: the object has that version), as one atomic step of the store.
    /// `Ok(Written(version))`: written, with the version tag the store gave the new object
    /// (the one [`MountTable::stat`] reports; `None` if the store did not say);
    /// `Ok(ConditionFailed)`: nothing was written. A store that cannot do the conditional write
    /// answers `UfsError::Store` with `object_store::Error::NotImplemented`.
    pub async fn put_if(
        &self,
        path: &str,
        data: Bytes,
        mode: object_store::PutMode,
        attributes: object_store::Attributes,
    ) -> Result<PutOutcome, UfsError> {
        let (m, p) = self.resolve(path)?;
        // GCS compares generations, which the version tags here do not carry.
        if matches!(&mode, object_store::PutMode::Update(v) if v.version.is_none())
            && m.url.starts_with("gs://")
        {
            return Err(not_implemented(
                path,
                "a conditional update (If-Match) on a GCS mount",
            ));
        }
        let opts = object_store::PutOptions {
            mode,
            attributes,
            ..Default::default()
        };
        m.emulate.wait(data.len() as u64).await;
        match m.store.put_opts(&p, data.into(), opts).await {
            Ok(r) => Ok(PutOutcome::Written(written_version(&r))),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(PutOutcome::ConditionFailed),
            Err(object_store::Error::NotFound { .. }) => Err(UfsError::NotFound(path.into())),
            Err(e) => Err(UfsError::Store(path.to_string(), e)),
        }
    }

    /// Starts a multipart write of `path` that completes only if `mode` allows it, atomically.
    /// Only `file://` mounts can (object_store has no conditional multipart completion); other
    /// mounts answer `object_store::Error::NotImplemented` for a mode other than `Overwrite`. A
    /// failed condition is `object_store::Error::Precondition` or `AlreadyExists` from
    /// `complete`.
    pub async fn put_multipart_if(
        &self,
        path: &str,
        mode: object_store::PutMode,
        attributes: object_store::Attributes,
    ) -> Result<Box<dyn object_store::MultipartUpload>, UfsError> {
        self.put_multipart_late(path, mode, attributes, None).await
    }

    /// [`MountTable::put_multipart_if`] whose object, on a `file://` mount, takes the
    /// attributes set in `late` before its completion instead of `attributes` (other stores
    /// keep `attributes`, which they take at the start).
    pub async fn put_multipart_late(
        &self,
        path: &str,
        mode: object_store::PutMode,
        attributes: object_store::Attributes,
        late: Option<&crate::localfs::LateAttributes>,
    ) -> Result<Box<dyn object_store::MultipartUpload>, UfsError> {
        let (m, p) = self.resolve(path)?;
        let mut opts = object_store::PutMultipartOptions {
            attributes,
            ..Default::default()
        };
        if let Some(late) = late {
            opts.extensions.insert(late.clone());
        }
        if mode != object_store::PutMode::Overwrite {
            if m.local.is_none() {
                return Err(not_implemented(path, "a conditional multipart write"));
            }
            opts.extensions.insert(crate::localfs::CommitMode(mode));
        }
        m.emulate.wait(0).await;
        m.store
            .put_multipart_opts(&p, opts)
            .await
            .map(|u| m.emulate.upload(u))
            .map_err(|e| UfsError::Store(path.to_string(), e))
    }

    /// The attributes kept with the object at `path` (Content-Type, Cache-Control,
    /// Content-Disposition, Content-Encoding, Content-Language, user metadata; empty where the
    /// store keeps none): `file://` mounts read them from the file, other stores from a HEAD.
    pub async fn object_attributes(
        &self,
        path: &str,
    ) -> Result<object_store::Attributes, UfsError> {
        let (m, p) = self.resolve(path)?;
        let found = match &m.local {
            Some(local) => local.object_attributes(&p).await,
            None => {
                let opts = GetOptions {
                    head: true,
                    ..Default::default()
                };
                m.store.get_opts(&p, opts).await.map(|r| r.attributes)
            }
        };
        found.map_err(|e| match e {
            object_store::Error::NotFound { .. } => UfsError::NotFound(path.to_string()),
            e => UfsError::Store(path.to_string(), e),
        })
    }

    /// Deletes the object at `path` if it has version `version`, atomically. `Ok(false)`: it
    /// has another version and stays. Only `file://` mounts can; others answer
    /// `object_store::Error::NotImplemented`.
    pub async fn delete_if(&self, path: &str, version: &str) -> Result<bool, UfsError> {
        let (m, p) = self.resolve(path)?;
        let Some(local) = &m.local else {
            return Err(not_implemented(path, "a conditional delete"));
        };
        m.emulate.wait(0).await;
        match local.delete_if(&p, version).await {
            Ok(()) => Ok(true),
            Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(object_store::Error::NotFound { .. }) => Err(UfsError::NotFound(path.into())),
            Err(e) => Err(UfsError::Store(path.to_string(), e)),
        }
    }

    /// Copies the object at `from` to `to` inside the store (both under the same mount);
    /// objects in different mounts answer `object_store::Error::NotImplemented`.
    pub async fn copy(&self, from: &str, to: &str) -> Result<(), UfsError> {
        let (mf, pf) = self.resolve(from)?;
        let (mt, pt) = self.resolve(to)?;
        if mf.prefix != mt.prefix {
            return Err(not_implemented(to, "a copy between two mounts"));
        }
        mf.emulate.wait(0).await;
        mf.store.copy(&pf, &pt).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => UfsError::NotFound(from.to_string()),
            e => UfsError::Store(to.to_string(), e),
        })
    }

    /// Deletes the object at `path`.
    pub async fn delete(&self, path: &str) -> Result<(), UfsError> {
        let (m, p) = self.resolve(path)?;
        m.emulate.wait(0).await;
        m.store.delete(&p).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => UfsError::NotFound(path.to_string()),
            e => UfsError::Store(path.to_string(), e),
        })
    }

    /// The entries directly under a logical directory (mount points included at the root).
    pub async fn list(&self, dir: &str) -> Result<Vec<Entry>, UfsError> {
        let mut out: Vec<Entry> = self
            .scan(dir)
            .await?
            .into_iter()
            .map(|e| match e.is_dir {
                true => Entry::Dir(e.name),
                false => Entry::File(e.name, e.size),
            })
            .collect();
        out.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        out.dedup();
        Ok(out)
    }

    /// The entries directly under a logical directory as the store lists them (mount points
    /// included), unsorted: files with size, version tag and modification time.
    async fn scan(&self, dir: &str) -> Result<Vec<DirEntry>, UfsError> {
        check_path(dir)?;
        let dir = dir.trim_end_matches('/');
        let dir = if dir.is_empty() { "/" } else { dir };
        let mut out = self.mount_points_in(dir);
        match self.resolve(dir) {
            Ok((m, p)) => {
                let prefix = if p.as_ref().is_empty() {
                    None
                } else {
                    Some(&p)
                };
                let r = m
                    .store
                    .list_with_delimiter(prefix)
                    .await
                    .map_err(|e| UfsError::Store(dir.to_string(), e))?;
                out.extend(store_entries(r.common_prefixes, r.objects));
            }
            Err(UfsError::NotFound(_)) if !out.is_empty() => {}
            Err(e) => return Err(e),
        }
        Ok(out)
    }

    /// The mount points directly below the logical directory `dir` (no trailing slash, `/`
    /// for the root), as directory entries.
    fn mount_points_in(&self, dir: &str) -> Vec<DirEntry> {
        let mut out = Vec::new();
        for prefix in self.prefixes() {
            let parent = prefix.rsplit_once('/').map_or("", |(p, _)| p);
            let parent = if parent.is_empty() { "/" } else { parent };
            if !prefix.is_empty() && parent == dir {
                out.push(DirEntry::dir(
                    prefix.rsplit('/').next().unwrap_or_default().to_string(),
                ));
            }
        }
        out
    }

    /// Whether [`MountTable::list_head`] can give the head of `dir`'s listing sooner than
    /// [`MountTable::list_entries`] gives all of it: where `dir` is in a `file://`, an
    /// `s3://`, a `gs://` or an `az://` mount.
    pub fn has_list_head(&self, dir: &str) -> bool {
        self.resolve(dir)
            .is_ok_and(|(m, _)| m.local.is_some() || m.paged.is_some())
    }

    /// The first entries (at most `max`, at least one) of what [`MountTable::list_entries`]
    /// gives for `dir`, and whether more may follow them, without examining the rest of a
    /// large directory (`file://`, `s3://`, `gs://` and `az://` mounts; elsewhere the whole listing is
    /// made and cut).
    pub async fn list_head(
        &self,
        dir: &str,
        max: usize,
    ) -> Result<(Vec<DirEntry>, bool), UfsError> {
        let max = max.max(1);
        let dir = dir.trim_end_matches('/');
        let dir = if dir.is_empty() { "/" } else { dir };
        let head = match self.resolve(dir) {
            Ok((m, p)) => match (&m.local, &m.paged) {
                (Some(local), _) => Some(
                    local
                        .list_head(&p, max)
                        .await
                        .map(|(dirs, files, more)| (store_entries(dirs, files), more)),
                ),
                (None, Some(paged)) => paged.head(&p, max).await,
                (None, None) => None,
            },
            Err(_) => None,
        };
        let Some(head) = head else {
            let mut all = self.list_entries(dir).await?;
            let more = all.len() > max;
            all.truncate(max);
            return Ok((all, more));
        };
        let (listed, more) = head.map_err(|e| UfsError::Store(dir.to_string(), e))?;
        // Every name after the head is greater than its last: mount points beyond it come in
        // the pages after.
        let last = listed.iter().map(|e| e.name.clone()).max();
        let mut out = self.mount_points_in(dir);
        out.extend(listed);
        let mut out = sorted_entries(out);
        if let Some(last) = last.filter(|_| more) {
            out.retain(|e| e.name <= last);
        }
        let more = more || out.len() > max;
        out.truncate(max);
        Ok((out, more))
    }

    /// What `path` names: an object, or a directory (a mount point, a parent of one, or a
    /// prefix with objects under it).
    pub async fn stat_path(&self, path: &str) -> Result<PathKind, UfsError> {
        check_path(path)?;
        let trimmed = path.trim_end_matches('/');
        let dir = if trimmed.is_empty() { "/" } else { trimmed };
        // Mount points and their parents are directories.
        let at_or_above =
            |p: &str| p == dir || p.starts_with(dir) && p[dir.len()..].starts_with('/');
        if dir == "/" || self.prefixes().any(at_or_above) {
            return Ok(PathKind::DIR);
        }
        // `/a/b/` names a directory: an object at `a/b` is not it.
        let as_dir = dir.len() < path.len();
        match self.stat(dir).await {
            Ok(_) if as_dir => {}
            Ok(info) => {
                return Ok(PathKind::File {
                    size: info.size,
                    store_tag: info.version.clone(),
                    version_tag: info.version,
                    file_id: FileId::from_u128(info.file_id),
                    mtime_ns: info.mtime_ns,
                    state: pagestore_protocol::frame::FileState::Stored,
                })
            }
            Err(UfsError::NotFound(_)) => {}
            // Some stores refuse a HEAD of a directory instead of answering NotFound.
            Err(UfsError::Store(..)) if self.is_dir(dir).await? => return Ok(PathKind::DIR),
            Err(e) => return Err(e),
        }
        if self.is_dir(dir).await? {
            Ok(PathKind::DIR)
        } else {
            Err(UfsError::NotFound(path.to_string()))
        }
    }

    async fn is_dir(&self, dir: &str) -> Result<bool, UfsError> {
        let (m, p) = self.resolve(dir)?;
        let r = m
            .store
            .list_with_delimiter(Some(&p))
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => UfsError::NotFound(dir.to_string()),
                e => UfsError::Store(dir.to_string(), e),
            });
        match r {
            Ok(r) => Ok(!r.objects.is_empty() || !r.common_prefixes.is_empty()),
            Err(UfsError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The entries of directory `dir` sorted by name, as the wire protocol carries them: files
    /// with their size, version tag and modification time, so that a reader of a listing needs
    /// no `stat` of what it listed.
    pub async fn list_entries(&self, dir: &str) -> Result<Vec<DirEntry>, UfsError> {
        Ok(sorted_entries(self.scan(dir).await?))
    }

    /// The mounts with credentials removed from their URLs (safe to show and to send).
    pub fn public_mounts(&self) -> Vec<MountEntry> {
        self.mounts
            .iter()
            .map(|m| MountEntry {
                prefix: m.prefix.clone(),
                url: redact(&m.url),
            })
            .collect()
    }
}

/// The entries of a store listing's common prefixes and objects.
fn store_entries(dirs: Vec<StorePath>, files: Vec<object_store::ObjectMeta>) -> Vec<DirEntry> {
    let dirs = dirs
        .into_iter()
        .map(|d| DirEntry::dir(d.filename().unwrap_or_default().to_string()));
    let files = files.into_iter().map(|o| DirEntry {
        name: o.location.filename().unwrap_or_default().to_string(),
        is_dir: false,
        size: o.size,
        version_tag: listed_version(&o),
        mtime_ns: mtime_ns(&o.last_modified),
    });
    dirs.chain(files).collect()
}

/// `v` without unnamed entries, sorted by name; a name that is both a file and a directory
/// (possible in object stores) shows once, as the directory.
fn sorted_entries(mut v: Vec<DirEntry>) -> Vec<DirEntry> {
    v.retain(|e| !e.name.is_empty());
    v.sort_by(|a, b| a.name.cmp(&b.name).then(b.is_dir.cmp(&a.is_dir)));
    v.dedup_by(|b, a| a.name == b.name);
    v
}

/// Removes the user information (`user:password@`) of every URL in `text` (error messages
/// of stores and HTTP clients may quote an endpoint with it).
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        // The authority ends at the first of these; userinfo is what precedes its last '@'.
        let end = rest
            .find(['/', '?', '#', ' ', ')', '"', '\'', '>', ','])
            .unwrap_or(rest.len());
        if let Some(at) = rest[..end].rfind('@') {
            rest = &rest[at + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// `url` without secrets: query parameters that carry credentials are dropped, and user
/// information (`user:password@`) is removed from the URL and from URLs in its parameters
/// (`endpoint=http://user:pass@host`).
pub fn redact(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else {
        return scrub(url.split('?').next().unwrap_or_default());
    };
    let kept: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| {
            !matches!(
                k.as_ref(),
                "access_key_id"
                    | "secret_access_key"
                    | "session_token"
                    | "token"
                    | "access_key"
                    | "sas"
                    | "service_account_key"
            )
        })
        .map(|(k, v)| (k.into_owned(), scrub(&v)))
        .collect();
    if kept.is_empty() {
        u.set_query(None);
    } else {
        u.query_pairs_mut().clear().extend_pairs(kept);
    }
    let _ = u.set_password(None);
    let _ = u.set_username("");
    // Whatever the URL parser kept (a scheme it cannot edit), the text must not carry it.
    scrub(u.as_str())
}

impl From<UfsError> for SourceError {
    fn from(e: UfsError) -> SourceError {
        let code = match &e {
            UfsError::NotFound(_) => ErrorCode::NotFound,
            UfsError::BadPath(_) => ErrorCode::BadRequest,
            UfsError::Changed { .. } => ErrorCode::Changed,
            UfsError::Config(_) => ErrorCode::Unavailable,
            UfsError::Store(..) => ErrorCode::Io,
        };
        SourceError::new(code, e.to_string())
    }
}

/// The mount table as a shard's [`Source`] (the miss path of `pagestored`). The table can be
/// replaced while the node runs (a mount changed in etcd); loads in flight finish with the
/// table they started with.
pub struct UfsSource(std::sync::RwLock<Arc<MountTable>>);

impl UfsSource {
    /// A source reading through `table`.
    pub fn new(table: Arc<MountTable>) -> UfsSource {
        UfsSource(std::sync::RwLock::new(table))
    }

    /// The table in force.
    pub fn table(&self) -> Arc<MountTable> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads through `table` from now on.
    pub fn replace(&self, table: Arc<MountTable>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = table;
    }
}

impl Source for UfsSource {
    fn read(&self, file: &FileRef, range: Range<u64>) -> SourceFuture<Bytes> {
        let table = self.table();
        let info = ObjectInfo {
            path: file.path.clone(),
            size: file.size,
            version: file.version_tag.clone(),
            file_id: file.file_id.as_u128(),
            mtime_ns: 0,
            state: FileState::Stored,
            store_tag: String::new(),
        };
        Box::pin(async move { Ok(table.read(&info, range).await?) })
    }

    fn stat(&self, path: &str) -> SourceFuture<PathKind> {
        let table = self.table();
        let path = path.to_string();
        Box::pin(async move { Ok(table.stat_path(&path).await?) })
    }

    fn list(&self, path: &str) -> SourceFuture<Vec<DirEntry>> {
        let table = self.table();
        let path = path.to_string();
        Box::pin(async move { Ok(table.list_entries(&path).await?) })
    }

    fn list_head(&self, path: &str, max: usize) -> Option<SourceFuture<(Vec<DirEntry>, bool)>> {
        let table = self.table();
        if !table.has_list_head(path) {
            return None;
        }
        let path = path.to_string();
        Some(Box::pin(
            async move { Ok(table.list_head(&path, max).await?) },
        ))
    }

    fn mounts(&self) -> Vec<MountEntry> {
        self.table().public_mounts()
    }
}

#[cfg(test)]
mod tests {
    use super::name_cut;

    #[test]
    fn a_head_ends_before_the_first_name_an_unlisted_directory_could_have() {
        // Keys up to `a-b` listed: directory `a` (key `a/`) may follow, so names from `a` on wait.
        assert_eq!(name_cut("a-b"), "a");
        assert_eq!(name_cut("ab.c-d"), "ab");
        assert_eq!(name_cut("x.y"), "x");
        // A directory's key: names before it are final, its own included.
        assert_eq!(name_cut("a/"), "a/");
        assert!("a" < name_cut("a/"));
        // A file: a directory of the same name may follow.
        assert_eq!(name_cut("f00"), "f00");
        // Bytes above `/` (and UTF-8) never cut earlier.
        assert_eq!(name_cut("é0Z_~"), "é0Z_~");
        assert_eq!(name_cut("-"), "-");
    }
}
