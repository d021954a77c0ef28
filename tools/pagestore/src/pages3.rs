//! `pages3`: an S3-compatible gateway over the cluster client (the `s3s` server framework).
//!
//! Mapping: the first component of the logical namespace is the bucket and the rest is the key,
//! so the mount `/data` is the bucket `data` and `s3://data/a/b.bin` is `/data/a/b.bin`.
//! ListBuckets lists the top-level directories. Reads go through the cluster (cached pages);
//! writes go through to the under storage and then invalidate the cluster's pages of the object.
//!
//! Keys with `.` or `..` segments (also percent-encoded, once or several times), NUL bytes or
//! empty segments are refused with `400 InvalidArgument` before anything reaches the cluster or
//! the store; keys over 1024 bytes, or with a segment over 255 bytes, with `400
//! KeyTooLongError`.
//!
//! What the gateway refuses beyond s3s's own checks (Signature Version 2, long-lived presigned
//! URLs, wrong digests, cut aws-chunked bodies, slow clients, too many connections) is in
//! `docs/SECURITY.md`; the checks are in [`checks`] and [`crate::http_guard`].

pub mod checks;

use std::{
    collections::{hash_map::RandomState, BTreeMap, HashMap},
    future::Future,
    hash::{BuildHasher, Hasher},
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use bytes::{Bytes, BytesMut};
use futures_util::{stream, Stream, StreamExt};
use hyper::{body::Incoming, http::Extensions, HeaderMap, Method, Uri};
use pagestore_client::{ufs::ObjectInfo, Client, Error as ClientError};
use pagestore_protocol::frame::{DirEntry, PathKind};
use s3s::{
    access::{S3Access, S3AccessContext},
    auth::{S3Auth, SecretKey},
    dto::{
        AbortMultipartUploadInput, AbortMultipartUploadOutput, Bucket, BucketLocationConstraint,
        CommonPrefix, CompleteMultipartUploadInput, CompleteMultipartUploadOutput,
        CreateMultipartUploadInput, CreateMultipartUploadOutput, DeleteObjectInput,
        DeleteObjectOutput, DeleteObjectsInput, DeleteObjectsOutput, DeletedObject, ETag,
        EncodingType, GetBucketLocationInput, GetBucketLocationOutput, GetObjectInput,
        GetObjectOutput, HeadBucketInput, HeadBucketOutput, HeadObjectInput, HeadObjectOutput,
        ListBucketsInput, ListBucketsOutput, ListObjectsInput, ListObjectsOutput,
        ListObjectsV2Input, ListObjectsV2Output, Object, ObjectStorageClass, Owner, PutObjectInput,
        PutObjectOutput, StreamingBlob, Timestamp, UploadPartInput, UploadPartOutput,
    },
    route::S3Route,
    service::{S3Service, S3ServiceBuilder},
    stream::{ByteStream, RemainingLength},
    validation::NameValidation,
    Body, HttpError, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, StdError,
    TrailingHeaders, S3,
};

use crate::http_guard::{self, Limits, StallBody};
use checks::{ChunkedCheck, Digests, Policy};
use tokio::{io::AsyncWriteExt, sync::mpsc};

/// The most keys one listing returns (S3's limit; larger `max-keys` are lowered to it).
pub const MAX_KEYS: usize = 1000;

/// Pages a GetObject reads ahead of the connection.
const READ_AHEAD_PAGES: usize = 4;

/// Buffer size for PutObject bodies: smaller bodies are written in one request, larger ones
/// as a multipart upload of parts this size. Also the part size used to send staged uploads.
const WRITE_CHUNK: usize = 16 << 20;

/// Parts of a multipart upload must be at least this large, except the last (as in S3).
const MIN_PART: u64 = 5 << 20;

/// Part numbers go from 1 to this (as in S3).
const MAX_PART_NUMBER: i32 = 10_000;

/// Names of upload directories under the staging directory.
const UPLOAD_DIR_PREFIX: &str = "upload-";

/// How long a stopping gateway waits for requests under way.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Gateway settings.
pub struct Options {
    /// The region reported by GetBucketLocation and HeadBucket.
    pub region: String,
    /// Where parts of multipart uploads wait for CompleteMultipartUpload.
    pub staging_dir: PathBuf,
    /// The access key and secret key that signed requests must use (SigV4).
    pub credentials: Option<(String, String)>,
    /// Also serve unsigned GET and HEAD requests (reads, listings). Writes always need a
    /// signature.
    pub anonymous: bool,
    /// Accept writes (the operator gave the under storage with credentials, `--mount`).
    /// Without it the gateway is read-only, even where the client's fallback mount table could
    /// write.
    pub writable: bool,
    /// Accept Signature Version 2 (header or query), held to the same 15-minute clock rule as
    /// SigV4. Off by default: SigV2 is refused with `400 InvalidRequest`.
    pub allow_sigv2: bool,
}

/// Builds the S3 service: the gateway over `client`, SigV4 authentication, the request policy
/// ([`checks::check_request`]) and the bucket name rules. Prepares the staging directory
/// (upload directories left by an earlier run are removed) and, when writable, removes in the
/// background the staged files an earlier run left in `file://` stores.
pub fn service(client: Arc<Client>, options: Options) -> Result<S3Service, String> {
    if options.credentials.is_none() && !options.anonymous {
        return Err(
            "no credentials: give --access-key and --secret-key (or PAGES3_ACCESS_KEY \
             and PAGES3_SECRET_KEY), or --anonymous to serve unsigned reads to anyone"
                .into(),
        );
    }
    let uploads = Arc::new(Uploads::open(&options.staging_dir)?);
    let started = SystemTime::now();
    if options.writable {
        sweep_staged(&client, started);
    }
    let gateway = Gateway {
        client,
        region: options.region,
        writable: options.writable,
        started,
        uploads,
    };
    let policy = Policy {
        anonymous: options.anonymous,
        allow_sigv2: options.allow_sigv2,
    };
    // Serves, unsigned and never reachable from the network, the GETs whose Range header S3
    // ignores (see `IgnoredRange`).
    let mut inner = S3ServiceBuilder::new(gateway.clone());
    inner.set_validation(BucketNames);
    let inner = inner.build();
    let mut b = S3ServiceBuilder::new(gateway);
    // Without an auth provider s3s answers every signed request 501; with one it also runs the
    // access check below on every request, signed or not.
    b.set_auth(KeyAuth {
        pair: options
            .credentials
            .map(|(k, s)| (k, SecretKey::from(s.as_str()))),
        anonymous: options.anonymous,
    });
    b.set_access(Access { policy });
    b.set_route(IgnoredRange { inner, policy });
    b.set_validation(BucketNames);
    Ok(b.build())
}

/// Serves `service` on `listener` with `limits` until `shutdown` resolves; then stops
/// accepting, lets the requests under way finish (at most [`SHUTDOWN_GRACE`]) and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: S3Service,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let stall = limits.body_stall_timeout;
    http_guard::serve(
        listener,
        limits,
        move |_peer| Front {
            s3: service.clone(),
            stall,
        },
        shutdown,
        SHUTDOWN_GRACE,
    )
    .await;
}

/// What every request passes before s3s: its body fails when it stalls, and an aws-chunked
/// body fails when it ends without its final chunk.
#[derive(Clone)]
struct Front {
    s3: S3Service,
    stall: Duration,
}

type FrontFuture =
    Pin<Box<dyn Future<Output = Result<hyper::Response<Body>, HttpError>> + Send + 'static>>;

impl hyper::service::Service<hyper::Request<Incoming>> for Front {
    type Response = hyper::Response<Body>;
    type Error = HttpError;
    type Future = FrontFuture;

    fn call(&self, req: hyper::Request<Incoming>) -> FrontFuture {
        let chunked = checks::is_aws_chunked(req.headers());
        let stall = self.stall;
        let req = req.map(|b| {
            let b = StallBody::new(b, stall);
            if chunked {
                Body::http_body_unsync(ChunkedCheck::new(b))
            } else {
                Body::http_body_unsync(b)
            }
        });
        let s3 = self.s3.clone();
        Box::pin(async move { s3.call(req).await })
    }
}

// ---------------------------------------------------------------------------------------------
// Authentication and access

/// SigV4 keys: the one configured pair.
struct KeyAuth {
    pair: Option<(String, SecretKey)>,
    anonymous: bool,
}

#[async_trait::async_trait]
impl S3Auth for KeyAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match &self.pair {
            Some((k, s)) if k == access_key => Ok(s.clone()),
            Some(_) => Err(S3Error::with_message(
                S3ErrorCode::InvalidAccessKeyId,
                "The access key is not known to this gateway",
            )),
            None if self.anonymous => Err(S3Error::with_message(
                S3ErrorCode::InvalidAccessKeyId,
                "This gateway has no credentials and serves unsigned requests only: send them \
                 unsigned (boto3: Config(signature_version=UNSIGNED); s3fs: anon=True)",
            )),
            None => Err(S3Error::new(S3ErrorCode::InvalidAccessKeyId)),
        }
    }
}

/// [`checks::check_request`] on every request, after s3s verified its signature.
struct Access {
    policy: Policy,
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        checks::check_request(
            self.policy,
            cx.credentials().is_some(),
            cx.method(),
            cx.uri(),
            cx.headers(),
            cx.s3_op().name(),
            SystemTime::now(),
        )
    }
}

/// Query parameters of a GetObject (the rest name other operations, or sign the request).
const GET_OBJECT_PARAMS: &[&str] = &["versionId", "partNumber", "x-id"];

/// Parameters that carry a query signature (SigV4 or SigV2).
fn is_auth_param(k: &str) -> bool {
    k.starts_with("X-Amz-") || matches!(k, "Signature" | "AWSAccessKeyId" | "Expires")
}

/// GET and HEAD of an object with a Range header S3 ignores (one it cannot parse, such as
/// `bytes=5-3`, or several ranges): answered with the whole object, as S3 does, where s3s
/// would refuse the request. After the usual checks the request goes, without its signature and
/// its Range header, to an unsigned service over the same gateway.
struct IgnoredRange {
    inner: S3Service,
    policy: Policy,
}

#[async_trait::async_trait]
impl S3Route for IgnoredRange {
    fn is_match(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        _: &mut Extensions,
    ) -> bool {
        if method != Method::GET && method != Method::HEAD {
            return false;
        }
        let Some(range) = headers.get(hyper::header::RANGE) else {
            return false;
        };
        if range
            .to_str()
            .is_ok_and(|r| s3s::dto::Range::parse(r).is_ok())
        {
            return false;
        }
        let Some((bucket, key)) = uri.path().trim_start_matches('/').split_once('/') else {
            return false;
        };
        !bucket.is_empty()
            && !key.is_empty()
            && uri
                .query()
                .unwrap_or("")
                .split('&')
                .filter(|kv| !kv.is_empty())
                .all(|kv| {
                    let k = kv.split_once('=').map_or(kv, |p| p.0);
                    GET_OBJECT_PARAMS.contains(&k) || k.starts_with("response-") || is_auth_param(k)
                })
    }

    async fn check_access(&self, req: &mut S3Request<Body>) -> S3Result<()> {
        checks::check_request(
            self.policy,
            req.credentials.is_some(),
            &req.method,
            &req.uri,
            &req.headers,
            "GetObject",
            SystemTime::now(),
        )
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let query: Vec<&str> = req
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|kv| !kv.is_empty() && !is_auth_param(kv.split_once('=').map_or(kv, |p| p.0)))
            .collect();
        let mut target = req.uri.path().to_string();
        if !query.is_empty() {
            target.push('?');
            target.push_str(&query.join("&"));
        }
        let mut forward = hyper::Request::builder()
            .method(req.method.clone())
            .uri(target);
        for (name, value) in &req.headers {
            if name != hyper::header::AUTHORIZATION && name != hyper::header::RANGE {
                forward = forward.header(name, value);
            }
        }
        let forward = forward
            .body(Body::empty())
            .map_err(|e| internal(format!("forwarding a GET without its Range: {e}")))?;
        let resp = self
            .inner
            .call(forward)
            .await
            .map_err(|e| internal(format!("GET without its Range: {:?}", StdError::from(e))))?;
        let (parts, body) = resp.into_parts();
        let mut out = S3Response::with_headers(body, parts.headers);
        out.status = Some(parts.status);
        Ok(out)
    }
}

/// Buckets are top-level names of the logical namespace: any single path segment that is not
/// `.` or `..` (looser than AWS's DNS rules, so that mounts such as `/Data_1` are reachable
/// with path-style requests).
struct BucketNames;

impl NameValidation for BucketNames {
    fn validate_bucket_name(&self, name: &str) -> bool {
        valid_bucket(name)
    }
}

fn valid_bucket(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0', '\\'])
        && segment_is_safe(name.as_bytes())
}

// ---------------------------------------------------------------------------------------------
// Keys and paths

/// Decodes `%XX` escapes (invalid escapes are kept as they are).
fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// Whether a key segment stays clear of `.`, `..` and NUL however many times it is
/// percent-decoded (a store or a later hop might decode it again).
fn segment_is_safe(seg: &[u8]) -> bool {
    let mut cur = seg.to_vec();
    for _ in 0..8 {
        if cur.contains(&0) {
            return false;
        }
        if cur
            .split(|&b| b == b'/' || b == b'\\')
            .any(|p| p == b"." || p == b"..")
        {
            return false;
        }
        let next = percent_decode(&cur);
        if next == cur {
            return true;
        }
        cur = next;
    }
    // Still decoding after that many rounds: refuse rather than guess.
    false
}

fn invalid(msg: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, msg)
}

/// What a key names.
#[derive(Debug, PartialEq, Eq)]
enum KeyPath {
    /// An object: its logical path.
    Object(String),
    /// A key ending in `/` (a "directory marker"): no object in pagestore.
    Marker,
}

/// The logical path of `key` in `bucket`, or the reason it is refused.
fn key_path(bucket: &str, key: &str) -> S3Result<KeyPath> {
    if !valid_bucket(bucket) {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidBucketName,
            format!("{bucket:?} is not a bucket name"),
        ));
    }
    if key.is_empty() {
        return Err(invalid("the key is empty".into()));
    }
    checks::check_key_len(key)?;
    check_segments(key)?;
    let (body, marker) = match key.strip_suffix('/') {
        Some(b) => (b, true),
        None => (key, false),
    };
    if body.is_empty() || body.split('/').any(str::is_empty) {
        return Err(invalid(format!(
            "key {key:?} has an empty path segment (pagestore keys are file paths)"
        )));
    }
    if marker {
        return Ok(KeyPath::Marker);
    }
    Ok(KeyPath::Object(format!("/{bucket}/{key}")))
}

/// Refuses `.` and `..` segments (plain or percent-encoded) and NUL anywhere in `s`.
fn check_segments(s: &str) -> S3Result<()> {
    if !s.split('/').all(|seg| segment_is_safe(seg.as_bytes())) {
        return Err(invalid(format!(
            "{s:?} has a . or .. segment (possibly percent-encoded) or a NUL byte; such keys are \
             refused"
        )));
    }
    Ok(())
}

/// `%XX`-encodes everything except unreserved characters and `/` (listing `encoding-type=url`).
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Continuation tokens: the last key of the page, hex-encoded behind a version letter.
fn encode_token(last: &str) -> String {
    let mut t = String::with_capacity(1 + 2 * last.len());
    t.push('k');
    for b in last.as_bytes() {
        t.push_str(&format!("{b:02x}"));
    }
    t
}

fn decode_token(t: &str) -> S3Result<String> {
    let bad = || invalid("the continuation token is not one this gateway issued".into());
    let hex = t.strip_prefix('k').ok_or_else(bad)?;
    if hex.len() % 2 != 0 {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16).map_err(|_| bad()))
        .collect::<S3Result<Vec<u8>>>()?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// An ETag from a version tag (visible ASCII without quotes, as a header value needs).
fn etag(version: &str) -> ETag {
    ETag::Strong(
        version
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() && c != '"' {
                    c
                } else {
                    '_'
                }
            })
            .collect(),
    )
}

/// The page-aligned pieces of `start..end` (the first may start inside a page).
fn chunks(start: u64, end: u64, page: u64) -> impl Iterator<Item = (u64, u64)> {
    let page = page.max(1);
    let mut off = start;
    std::iter::from_fn(move || {
        if off >= end {
            return None;
        }
        let stop = ((off / page + 1).saturating_mul(page)).min(end);
        let piece = (off, stop - off);
        off = stop;
        Some(piece)
    })
}

// ---------------------------------------------------------------------------------------------
// The gateway

#[derive(Clone)]
struct Gateway {
    client: Arc<Client>,
    region: String,
    writable: bool,
    /// Reported as Last-Modified and bucket creation time: pagestore does not carry
    /// modification times (the ETag tells versions apart).
    started: SystemTime,
    uploads: Arc<Uploads>,
}

fn client_error(e: ClientError) -> S3Error {
    match e {
        ClientError::NotFound(p) => S3Error::with_message(
            S3ErrorCode::NoSuchKey,
            format!("{p}: the specified key does not exist"),
        ),
        ClientError::IsDir(p) => S3Error::with_message(
            S3ErrorCode::NoSuchKey,
            format!("{p} is a directory (list it with a prefix ending in /)"),
        ),
        ClientError::NotDir(p) => S3Error::with_message(
            S3ErrorCode::NoSuchKey,
            format!("{p}: a parent is not a directory"),
        ),
        ClientError::BadPath(m) => invalid(m),
        ClientError::BadRange(m) => S3Error::with_message(S3ErrorCode::InvalidRange, m),
        // Retryable: the client opens the new version.
        e @ ClientError::Changed(_) => {
            let id = incident();
            tracing::info!(error = %e, incident = %id, "object changed during a read");
            S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                format!("the object changed during the request; retry it (incident {id})"),
            )
        }
        // The messages of these name members, store URLs and server paths: logged only.
        e @ ClientError::Unavailable(_) => {
            let id = incident();
            tracing::warn!(error = %e, incident = %id, "request failed");
            S3Error::with_message(
                S3ErrorCode::ServiceUnavailable,
                format!(
                    "the cluster or the under storage is unavailable; retry later (incident \
                     {id} in the gateway's log)"
                ),
            )
        }
        e @ ClientError::Config(_) => internal(e.to_string()),
        e @ ClientError::Forbidden(_) => {
            let id = incident();
            tracing::warn!(error = %e, incident = %id, "the cluster refused a request of this gateway (its certificate lacks the role)");
            S3Error::with_message(
                S3ErrorCode::AccessDenied,
                format!("the cache cluster refused this gateway's request (incident {id} in the gateway's log)"),
            )
        }
    }
}

/// A short id that ties an error answer to the gateway's log line with the details.
fn incident() -> String {
    random_id()[..12].to_string()
}

/// Whether `e`, or an error it wraps, is the file system running out of space (or the file
/// size limit, or a quota).
fn out_of_space(e: &(dyn std::error::Error + 'static)) -> bool {
    let full = |io: &io::Error| {
        matches!(
            io.raw_os_error(),
            Some(libc::ENOSPC | libc::EFBIG | libc::EDQUOT)
        )
    };
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if full(io) {
                return true;
            }
        }
        cur = err.source();
    }
    // Stores that keep only the text of the system error.
    let text = e.to_string();
    [libc::ENOSPC, libc::EFBIG, libc::EDQUOT]
        .iter()
        .any(|n| text.contains(&format!("(os error {n})")))
}

/// The answer to a write that does not fit: 400 EntityTooLarge (not retried by clients; see
/// docs/SECURITY.md).
fn no_space(detail: &dyn std::fmt::Display) -> S3Error {
    let id = incident();
    tracing::warn!(error = %detail, incident = %id, "write refused: out of space");
    S3Error::with_message(
        S3ErrorCode::EntityTooLarge,
        format!(
            "the object does not fit in the free space of the under storage (incident {id} in \
             the gateway's log)"
        ),
    )
}

/// A failed write to the under storage at `path`, as an S3 error without server details.
fn store_error(e: pagestore_client::ufs::UfsError) -> S3Error {
    use pagestore_client::ufs::UfsError;
    match e {
        UfsError::Store(_, ref inner) if out_of_space(inner) => no_space(&e),
        e @ UfsError::Store(..) => client_error(ClientError::Unavailable(e.to_string())),
        e => client_error(e.into()),
    }
}

/// A failed file operation of the gateway itself (staging), without server details.
fn io_failure(what: &str, e: io::Error) -> S3Error {
    if out_of_space(&e) {
        return no_space(&format!("{what}: {e}"));
    }
    internal(format!("{what}: {e}"))
}

/// One item of a listing, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Object { key: String, size: u64 },
    Prefix(String),
}

impl Item {
    fn key(&self) -> &str {
        match self {
            Item::Object { key, .. } | Item::Prefix(key) => key,
        }
    }
}

/// Listing arguments common to ListObjects and ListObjectsV2.
struct ListArgs<'a> {
    bucket: &'a str,
    prefix: &'a str,
    delimited: bool,
    after: Option<&'a str>,
    max: usize,
}

/// A listing page.
struct Page {
    items: Vec<Item>,
    truncated: bool,
}

/// The entries of a directory, each with its sort key (`name`, or `name/` for a directory: the
/// order of its keys among its siblings').
fn sorted_level(dir_key: &str, entries: Vec<DirEntry>, partial: &str) -> Vec<(String, bool, u64)> {
    let mut v: Vec<(String, bool, u64)> = entries
        .into_iter()
        .filter(|e| !e.name.is_empty() && !e.name.contains('/') && e.name.starts_with(partial))
        .map(|e| {
            let mut k = String::with_capacity(dir_key.len() + e.name.len() + 1);
            k.push_str(dir_key);
            k.push_str(&e.name);
            if e.is_dir {
                k.push('/');
            }
            (k, e.is_dir, e.size)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.dedup_by(|b, a| a.0 == b.0);
    v
}

/// Whether a directory whose keys all start with `prefix` may hold keys after `after`.
fn subtree_after(prefix: &str, after: Option<&str>) -> bool {
    match after {
        None => true,
        Some(a) => prefix > a || (a.starts_with(prefix) && a != prefix),
    }
}

impl Gateway {
    fn last_modified(&self) -> Timestamp {
        Timestamp::from(self.started)
    }

    async fn bucket_exists(&self, bucket: &str) -> S3Result<bool> {
        if !valid_bucket(bucket) {
            return Ok(false);
        }
        match self.client.stat_path(&format!("/{bucket}")).await {
            Ok(PathKind::Dir) => Ok(true),
            Ok(PathKind::File { .. }) => Ok(false),
            Err(ClientError::NotFound(_) | ClientError::NotDir(_)) => Ok(false),
            Err(e) => Err(client_error(e)),
        }
    }

    async fn require_bucket(&self, bucket: &str) -> S3Result<()> {
        if self.bucket_exists(bucket).await? {
            Ok(())
        } else {
            Err(no_such_bucket(bucket))
        }
    }

    /// A NotFound for an object is NoSuchBucket when its bucket is missing.
    async fn object_error(&self, bucket: &str, e: ClientError) -> S3Error {
        if matches!(e, ClientError::NotFound(_) | ClientError::NotDir(_))
            && matches!(self.bucket_exists(bucket).await, Ok(false))
        {
            return no_such_bucket(bucket);
        }
        client_error(e)
    }

    /// The object at `key`, stat-ed once (reads are pinned to this version).
    async fn stat_object(&self, bucket: &str, key: &str) -> S3Result<ObjectInfo> {
        let path = match key_path(bucket, key)? {
            KeyPath::Object(p) => p,
            KeyPath::Marker => {
                self.require_bucket(bucket).await?;
                return Err(S3Error::with_message(
                    S3ErrorCode::NoSuchKey,
                    format!("{key}: keys ending in / name no object here"),
                ));
            }
        };
        match self.client.stat(&path).await {
            Ok(info) => Ok(info),
            Err(e) => Err(self.object_error(bucket, e).await),
        }
    }

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
        let root = if impossible || dir_rel.is_empty() {
            None
        } else {
            Some(format!("/{}/{dir_rel}", a.bucket))
        };
        let top = match (&root, impossible) {
            (_, true) => None,
            (None, false) => self.entries(&format!("/{}", a.bucket)).await?,
            (Some(d), false) => self.entries(d).await?,
        };
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
        if a.delimited {
            for (key, is_dir, size) in level {
                let wanted = if is_dir {
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
                page.items.push(if is_dir {
                    Item::Prefix(key)
                } else {
                    Item::Object { key, size }
                });
            }
            return Ok(page);
        }
        // Depth first, in key order: a directory's keys all sort between its siblings' as its
        // sort key `name/` does.
        let mut stack = vec![level.into_iter()];
        while let Some(level) = stack.last_mut() {
            let Some((key, is_dir, size)) = level.next() else {
                stack.pop();
                continue;
            };
            if is_dir {
                if !subtree_after(&key, a.after) {
                    continue;
                }
                let dir = format!("/{}/{}", a.bucket, key.trim_end_matches('/'));
                // A directory that went away since its parent was listed has no keys.
                if let Some(entries) = self.entries(&dir).await? {
                    stack.push(sorted_level(&key, entries, "").into_iter());
                }
            } else if a.after.is_none_or(|after| key.as_str() > after) {
                if page.items.len() == a.max {
                    page.truncated = true;
                    break;
                }
                page.items.push(Item::Object { key, size });
            }
        }
        Ok(page)
    }

    fn object_entry(&self, key: String, size: u64, enc: bool) -> Object {
        Object {
            key: Some(if enc { url_encode(&key) } else { key }),
            size: Some(size.try_into().unwrap_or(i64::MAX)),
            last_modified: Some(self.last_modified()),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            ..Object::default()
        }
    }

    fn split_page(&self, page: Page, enc: bool) -> (Vec<Object>, Vec<CommonPrefix>) {
        let mut objects = Vec::new();
        let mut prefixes = Vec::new();
        for item in page.items {
            match item {
                Item::Object { key, size } => objects.push(self.object_entry(key, size, enc)),
                Item::Prefix(p) => prefixes.push(CommonPrefix {
                    prefix: Some(if enc { url_encode(&p) } else { p }),
                }),
            }
        }
        (objects, prefixes)
    }

    fn writable(&self) -> S3Result<&pagestore_client::ufs::MountTable> {
        let table = if self.writable {
            self.client.writable().ok()
        } else {
            None
        };
        table.ok_or_else(|| {
            S3Error::with_message(
                S3ErrorCode::NotImplemented,
                "this gateway is read-only: start pages3 with --mount /LOGICAL=URL (with \
                 credentials for the store) to allow writes",
            )
        })
    }

    /// The logical path a write goes to.
    fn write_path(&self, bucket: &str, key: &str) -> S3Result<String> {
        let path = key_path(bucket, key)?;
        checks::check_written_key_len(key)?;
        match path {
            KeyPath::Object(p) => Ok(p),
            KeyPath::Marker => Err(invalid(format!(
                "{key:?}: pagestore has no directory markers; directories exist while they hold \
                 objects"
            ))),
        }
    }

    /// Writes `body` to `path`: in one request when it is small, else as a multipart upload
    /// streamed in [`WRITE_CHUNK`] parts; then invalidates the cluster's pages of the object.
    /// The object appears only when the body was complete (an aws-chunked body: exactly its
    /// declared decoded length) and matched every digest the request names; else nothing is
    /// written and the old object stays.
    async fn write_object(
        &self,
        path: &str,
        body: Option<StreamingBlob>,
        headers: &HeaderMap,
        trailers: Option<&TrailingHeaders>,
    ) -> S3Result<ObjectInfo> {
        let ufs = self.writable()?;
        let mut digests = Digests::from_headers(headers)?;
        let mut body = BodyReader::new(body, headers);
        let mut buf = BytesMut::new();
        let mut upload = None;
        let mut pending = Vec::new();
        let old = ufs.stat(path).await.ok().map(|i| i.file_id);
        let result: Result<(), S3Error> = async {
            while let Some(chunk) = body.next().await? {
                digests.update(&chunk);
                buf.extend_from_slice(&chunk);
                while buf.len() >= WRITE_CHUNK {
                    let part = buf.split_to(WRITE_CHUNK).freeze();
                    if upload.is_none() {
                        upload = Some(ufs.put_multipart(path).await.map_err(store_error)?);
                    }
                    if let Some(u) = upload.as_mut() {
                        pending.push(u.put_part(part.into()));
                    }
                    if pending.len() >= 2 {
                        pending.remove(0).await.map_err(|e| part_error(path, e))?;
                    }
                }
            }
            digests.verify(trailers.and_then(TrailingHeaders::take).as_ref())?;
            match upload.as_mut() {
                None => ufs
                    .put(path, buf.split().freeze())
                    .await
                    .map_err(store_error)?,
                Some(u) => {
                    if !buf.is_empty() {
                        pending.push(u.put_part(buf.split().freeze().into()));
                    }
                    for p in pending.drain(..) {
                        p.await.map_err(|e| part_error(path, e))?;
                    }
                    u.complete().await.map_err(|e| part_error(path, e))?;
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            pending.clear();
            if let Some(mut u) = upload {
                let _ = u.abort().await;
            }
            body.drain().await;
            return Err(e);
        }
        self.client.invalidate(path, old).await;
        ufs.stat(path).await.map_err(store_error)
    }
}

/// A failed part or completion of a multipart write to the under storage.
fn part_error(path: &str, e: impl std::error::Error + 'static) -> S3Error {
    if out_of_space(&e) {
        return no_space(&format!("{path}: {e}"));
    }
    client_error(ClientError::Unavailable(format!("{path}: {e}")))
}

/// Most bytes of a refused body read and dropped so that the client gets the answer instead of
/// a broken pipe.
const MAX_DRAIN: u64 = 64 << 20;

/// Reads a PutObject or UploadPart body: refuses it when it fails or, when aws-chunked, when
/// it is not exactly its declared decoded length.
struct BodyReader {
    body: Option<StreamingBlob>,
    /// The decoded length an aws-chunked body declares.
    declared: Option<u64>,
    /// The length the client sends (Content-Length or the decoded length).
    expected: Option<u64>,
    received: u64,
    failed: bool,
}

impl BodyReader {
    fn new(body: Option<StreamingBlob>, headers: &HeaderMap) -> BodyReader {
        let declared = if checks::is_aws_chunked(headers) {
            checks::decoded_length(headers)
        } else {
            None
        };
        let expected = declared.or_else(|| {
            headers
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
        });
        BodyReader {
            body,
            declared,
            expected,
            received: 0,
            failed: false,
        }
    }

    /// The next piece; `None` at a complete end.
    async fn next(&mut self) -> S3Result<Option<Bytes>> {
        let next = match self.body.as_mut() {
            Some(b) => b.next().await,
            None => None,
        };
        let incomplete = |msg: String| S3Error::with_message(S3ErrorCode::IncompleteBody, msg);
        match next {
            Some(Ok(chunk)) => {
                self.received += chunk.len() as u64;
                if let Some(d) = self.declared.filter(|d| self.received > *d) {
                    self.failed = true;
                    return Err(incomplete(format!(
                        "the aws-chunked body has more than the {d} bytes its \
                         x-amz-decoded-content-length declares"
                    )));
                }
                Ok(Some(chunk))
            }
            Some(Err(e)) => {
                self.failed = true;
                Err(incomplete(format!("reading the request body: {e}")))
            }
            None => {
                if let Some(d) = self.declared.filter(|d| self.received != *d) {
                    self.failed = true;
                    return Err(incomplete(format!(
                        "the aws-chunked body has {} bytes where its \
                         x-amz-decoded-content-length declares {d}",
                        self.received
                    )));
                }
                Ok(None)
            }
        }
    }

    /// After a refusal that was not the body's fault: reads the rest of the body (at most
    /// [`MAX_DRAIN`] bytes, and not more than its declared length), so that the client, still
    /// sending, reads the error instead of a reset connection.
    async fn drain(&mut self) {
        if self.failed {
            return;
        }
        let Some(expected) = self.expected else {
            return;
        };
        if expected.saturating_sub(self.received) > MAX_DRAIN {
            return;
        }
        while let Some(body) = self.body.as_mut() {
            match body.next().await {
                Some(Ok(chunk)) => self.received += chunk.len() as u64,
                _ => break,
            }
        }
    }
}

/// A server-side failure: logged with its details (s3s's own log lines are off by default);
/// the client gets an incident id, never server paths or store locations.
fn internal(msg: String) -> S3Error {
    let id = incident();
    tracing::warn!(error = %msg, incident = %id, "request failed");
    S3Error::with_message(
        S3ErrorCode::InternalError,
        format!("internal error (incident {id} in the gateway's log)"),
    )
}

fn no_such_bucket(bucket: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NoSuchBucket,
        format!("{bucket}: no such bucket (buckets are the top-level directories, e.g. mounts)"),
    )
}

/// The `max-keys` of a listing.
fn max_keys(v: Option<i32>) -> S3Result<usize> {
    match v {
        None => Ok(MAX_KEYS),
        Some(n) if n < 0 => Err(invalid(format!("max-keys {n} is negative"))),
        Some(n) => Ok((n as usize).min(MAX_KEYS)),
    }
}

/// Whether the delimiter asks for one level; only `/` is supported.
fn delimited(d: Option<&str>) -> S3Result<bool> {
    match d {
        None | Some("") => Ok(false),
        Some("/") => Ok(true),
        Some(other) => Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            format!("delimiter {other:?}: pages3 supports only \"/\""),
        )),
    }
}

fn is_url(e: Option<&EncodingType>) -> bool {
    e.is_some_and(|e| e.as_str() == EncodingType::URL)
}

/// A GetObject body: the first piece, read before the response started, then the rest from a
/// task that reads pages ahead.
struct BodyStream {
    first: Option<Bytes>,
    rx: Option<mpsc::Receiver<io::Result<Bytes>>>,
    remaining: usize,
}

impl Stream for BodyStream {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            this.remaining = this.remaining.saturating_sub(b.len());
            return Poll::Ready(Some(Ok(b)));
        }
        let Some(rx) = this.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                this.remaining = this.remaining.saturating_sub(b.len());
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.rx = None;
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.rx = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl ByteStream for BodyStream {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(self.remaining)
    }
}

/// Reads `info` at each piece (pinned to its version) and sends the bytes in order.
async fn read_pieces(
    client: Arc<Client>,
    info: ObjectInfo,
    pieces: impl Iterator<Item = (u64, u64)> + Send + 'static,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    let reads = stream::iter(pieces)
        .map(|(off, len)| {
            let (client, info) = (client.clone(), info.clone());
            async move { read_piece(&client, &info, off, len).await }
        })
        .buffered(READ_AHEAD_PAGES);
    tokio::pin!(reads);
    while let Some(r) = reads.next().await {
        let failed = r.is_err();
        if tx.send(r.map_err(io::Error::from)).await.is_err() || failed {
            // The client went away, or the read failed (the connection is cut short).
            return;
        }
    }
}

async fn read_piece(
    client: &Client,
    info: &ObjectInfo,
    off: u64,
    len: u64,
) -> Result<Bytes, ClientError> {
    let b = client.read_at(info, off, len).await?;
    if b.len() as u64 != len {
        return Err(ClientError::Changed(format!(
            "{}: {} bytes at {off} where {len} were expected; the object changed",
            info.path,
            b.len()
        )));
    }
    Ok(b)
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let entries = self.client.list("/").await.map_err(client_error)?;
        let buckets = entries
            .into_iter()
            .filter(|e| e.is_dir && valid_bucket(&e.name))
            .map(|e| Bucket {
                name: Some(e.name),
                creation_date: Some(self.last_modified()),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(Owner {
                display_name: Some("pagestore".into()),
                id: Some("pagestore".into()),
            }),
            ..ListBucketsOutput::default()
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.require_bucket(&req.input.bucket).await?;
        // S3 reports us-east-1 as an empty location.
        let location_constraint = (self.region != "us-east-1")
            .then(|| BucketLocationConstraint::from(self.region.clone()));
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint,
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.require_bucket(&req.input.bucket).await?;
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(self.region.clone()),
            ..HeadBucketOutput::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = &req.input;
        let info = self.stat_object(&input.bucket, &input.key).await?;
        let tag = etag(&info.version);
        check_if_match(input.if_match.as_ref().and_then(|c| c.as_etag()), &tag)?;
        Ok(S3Response::new(HeadObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some(info.size.try_into().unwrap_or(i64::MAX)),
            content_type: Some("application/octet-stream".into()),
            e_tag: Some(tag),
            last_modified: Some(self.last_modified()),
            ..HeadObjectOutput::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = &req.input;
        if input.part_number.is_some_and(|n| n != 1) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidRange,
                "objects served by pages3 have one part",
            ));
        }
        let info = self.stat_object(&input.bucket, &input.key).await?;
        let tag = etag(&info.version);
        check_if_match(input.if_match.as_ref().and_then(|c| c.as_etag()), &tag)?;
        let (start, end) = match &input.range {
            None => (0, info.size),
            // No range of an empty object is satisfiable, a suffix range neither (as S3 answers;
            // a 206 could not say `bytes 0--1/0`).
            Some(r) if info.size == 0 => {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidRange,
                    format!(
                        "the range {} is not satisfiable: the object is empty",
                        r.to_header_string()
                    ),
                ))
            }
            Some(r) => {
                let r = r.check(info.size).map_err(|_| {
                    S3Error::with_message(
                        S3ErrorCode::InvalidRange,
                        format!(
                            "the range {} is outside the object's {} bytes",
                            r.to_header_string(),
                            info.size
                        ),
                    )
                })?;
                (r.start, r.end)
            }
        };
        let len = end - start;
        let page = u64::from(self.client.page_size());
        let mut pieces = chunks(start, end, page);
        // The first piece is read before answering, so that a failure is a proper error.
        let first = match pieces.next() {
            Some((off, n)) => Some(
                read_piece(&self.client, &info, off, n)
                    .await
                    .map_err(client_error)?,
            ),
            None => None,
        };
        let rx = match first.as_ref() {
            Some(b) if (b.len() as u64) < len => {
                let (tx, rx) = mpsc::channel(1);
                tokio::spawn(read_pieces(self.client.clone(), info.clone(), pieces, tx));
                Some(rx)
            }
            _ => None,
        };
        let body = BodyStream {
            first,
            rx,
            remaining: usize::try_from(len).unwrap_or(usize::MAX),
        };
        Ok(S3Response::new(GetObjectOutput {
            accept_ranges: Some("bytes".into()),
            body: Some(StreamingBlob::new(body)),
            content_length: Some(len.try_into().unwrap_or(i64::MAX)),
            content_range: input
                .range
                .is_some()
                .then(|| format!("bytes {start}-{}/{}", end.saturating_sub(1), info.size)),
            content_type: Some("application/octet-stream".into()),
            e_tag: Some(tag),
            last_modified: Some(self.last_modified()),
            ..GetObjectOutput::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let token = match input.continuation_token.as_deref() {
            Some(t) => Some(decode_token(t)?),
            None => None,
        };
        // A continuation token wins over start-after (it is later in the same listing).
        let after = token.as_deref().or(input.start_after.as_deref());
        let page = self
            .list_page(&ListArgs {
                bucket: &input.bucket,
                prefix: &prefix,
                delimited: delimited(input.delimiter.as_deref())?,
                after,
                max,
            })
            .await?;
        let enc = is_url(input.encoding_type.as_ref());
        let next = page
            .truncated
            .then(|| page.items.last().map(|i| encode_token(i.key())))
            .flatten();
        let truncated = page.truncated;
        let count = page.items.len();
        let (contents, prefixes) = self.split_page(page, enc);
        let code = |s: String| if enc { url_encode(&s) } else { s };
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(code(prefix)),
            delimiter: input.delimiter.map(code),
            start_after: input.start_after.map(code),
            max_keys: Some(max as i32),
            key_count: Some(count as i32),
            is_truncated: Some(truncated),
            continuation_token: input.continuation_token,
            next_continuation_token: next,
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..ListObjectsV2Output::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let page = self
            .list_page(&ListArgs {
                bucket: &input.bucket,
                prefix: &prefix,
                delimited: delimited(input.delimiter.as_deref())?,
                after: input.marker.as_deref().filter(|m| !m.is_empty()),
                max,
            })
            .await?;
        let enc = is_url(input.encoding_type.as_ref());
        let code = |s: String| if enc { url_encode(&s) } else { s };
        let next_marker = page
            .truncated
            .then(|| page.items.last().map(|i| code(i.key().to_string())))
            .flatten();
        let truncated = page.truncated;
        let (contents, prefixes) = self.split_page(page, enc);
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            prefix: Some(code(prefix)),
            delimiter: input.delimiter.map(code),
            marker: Some(code(input.marker.unwrap_or_default())),
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            next_marker,
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..ListObjectsOutput::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let path = self.write_path(&input.bucket, &input.key)?;
        self.writable()?;
        self.require_bucket(&input.bucket).await?;
        let info = self
            .write_object(
                &path,
                input.body,
                &req.headers,
                req.trailing_headers.as_ref(),
            )
            .await?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&info.version)),
            size: Some(info.size.try_into().unwrap_or(i64::MAX)),
            ..PutObjectOutput::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let input = &req.input;
        let path = match key_path(&input.bucket, &input.key)? {
            KeyPath::Object(p) => Some(p),
            KeyPath::Marker => None,
        };
        self.writable()?;
        self.require_bucket(&input.bucket).await?;
        if let Some(path) = path {
            match self.client.delete(&path).await {
                // Deleting what is not there succeeds, as in S3.
                Ok(()) | Err(ClientError::NotFound(_)) => {}
                Err(e) => return Err(client_error(e)),
            }
        }
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        self.writable()?;
        if input.delete.objects.len() > checks::MAX_DELETE_KEYS {
            return Err(S3Error::with_message(
                S3ErrorCode::MalformedXML,
                format!(
                    "the request names {} keys; one DeleteObjects may name at most {}",
                    input.delete.objects.len(),
                    checks::MAX_DELETE_KEYS
                ),
            ));
        }
        self.require_bucket(&input.bucket).await?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for o in input.delete.objects {
            let result = match key_path(&input.bucket, &o.key) {
                Ok(KeyPath::Marker) => Ok(()),
                Ok(KeyPath::Object(p)) => match self.client.delete(&p).await {
                    Ok(()) | Err(ClientError::NotFound(_)) => Ok(()),
                    Err(e) => Err(client_error(e)),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(()) if !quiet => deleted.push(DeletedObject {
                    key: Some(o.key),
                    ..DeletedObject::default()
                }),
                Ok(()) => {}
                Err(e) => errors.push(s3s::dto::Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key),
                    message: e.message().map(str::to_string),
                    version_id: None,
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors),
            ..DeleteObjectsOutput::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        let path = self.write_path(&input.bucket, &input.key)?;
        self.writable()?;
        self.require_bucket(&input.bucket).await?;
        let id = self.uploads.create(path).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            ..CreateMultipartUploadOutput::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let path = self.write_path(&input.bucket, &input.key)?;
        if !(1..=MAX_PART_NUMBER).contains(&input.part_number) {
            return Err(invalid(format!(
                "part number {} is not between 1 and {MAX_PART_NUMBER}",
                input.part_number
            )));
        }
        let tag = self
            .uploads
            .put_part(
                &input.upload_id,
                &path,
                input.part_number,
                BodyReader::new(input.body, &req.headers),
                Digests::from_headers(&req.headers)?,
                req.trailing_headers.as_ref(),
            )
            .await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(tag)),
            ..UploadPartOutput::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let path = self.write_path(&input.bucket, &input.key)?;
        let ufs = self.writable()?;
        let wanted: Vec<(i32, Option<String>)> = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                (
                    p.part_number.unwrap_or(0),
                    p.e_tag.map(|t| t.value().trim_matches('"').to_string()),
                )
            })
            .collect();
        let files = self
            .uploads
            .begin_complete(&input.upload_id, &path, &wanted)?;
        let old = ufs.stat(&path).await.ok().map(|i| i.file_id);
        match send_parts(ufs, &path, &files).await {
            Ok(()) => {}
            Err(e) => {
                self.uploads.end_complete(&input.upload_id, false).await;
                return Err(e);
            }
        }
        self.uploads.end_complete(&input.upload_id, true).await;
        self.client.invalidate(&path, old).await;
        let info = ufs.stat(&path).await.map_err(store_error)?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            e_tag: Some(etag(&info.version)),
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            ..CompleteMultipartUploadOutput::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = &req.input;
        let path = self.write_path(&input.bucket, &input.key)?;
        self.uploads.abort(&input.upload_id, &path).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}

fn check_if_match(cond: Option<&ETag>, current: &ETag) -> S3Result<()> {
    match cond {
        Some(want) if want.value().trim_matches('"') != current.value() => {
            Err(S3Error::with_message(
                S3ErrorCode::PreconditionFailed,
                "If-Match: the object has another ETag now",
            ))
        }
        _ => Ok(()),
    }
}

/// Streams staged part files, in order, to a multipart upload of the under storage, re-cut
/// into [`WRITE_CHUNK`] parts (which meets every store's minimum part size).
async fn send_parts(
    ufs: &pagestore_client::ufs::MountTable,
    path: &str,
    files: &[PathBuf],
) -> S3Result<()> {
    use tokio::io::AsyncReadExt;
    let fail = internal;
    let mut upload = ufs.put_multipart(path).await.map_err(store_error)?;
    let result: S3Result<()> = async {
        let mut pending = Vec::new();
        let mut buf = BytesMut::with_capacity(WRITE_CHUNK);
        let mut sent_any = false;
        for f in files {
            let mut file = tokio::fs::File::open(f)
                .await
                .map_err(|e| fail(format!("staged part {}: {e}", f.display())))?;
            loop {
                if buf.capacity() - buf.len() == 0 {
                    buf.reserve(WRITE_CHUNK - buf.len());
                }
                let n = file
                    .read_buf(&mut buf)
                    .await
                    .map_err(|e| fail(format!("staged part {}: {e}", f.display())))?;
                if n == 0 {
                    break;
                }
                if buf.len() >= WRITE_CHUNK {
                    let part = buf.split_to(WRITE_CHUNK).freeze();
                    pending.push(upload.put_part(part.into()));
                    sent_any = true;
                    if pending.len() >= 2 {
                        pending.remove(0).await.map_err(|e| part_error(path, e))?;
                    }
                }
            }
        }
        if !buf.is_empty() || !sent_any {
            pending.push(upload.put_part(buf.split().freeze().into()));
        }
        for p in pending {
            p.await.map_err(|e| part_error(path, e))?;
        }
        upload.complete().await.map_err(|e| part_error(path, e))?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = upload.abort().await;
    }
    result
}

// ---------------------------------------------------------------------------------------------
// Staged files of `file://` stores

/// Whether `name` is a file the local store stages a write in
/// ([`pagestore_client::localfs::TMP_PREFIX`]; the store neither lists nor serves such names).
pub fn is_staged_name(name: &str) -> bool {
    name.starts_with(pagestore_client::localfs::TMP_PREFIX)
}

/// The directory of a `file://` mount URL.
fn file_dir(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("file://")?;
    let path = rest.split(['?', '#']).next().unwrap_or(rest);
    let path = String::from_utf8(percent_decode(path.as_bytes())).ok()?;
    Some(PathBuf::from(path)).filter(|p| p.is_absolute())
}

/// Removes, under `dir`, the staged upload files last modified before `before` (uploads of a
/// gateway that was killed; this run's own uploads are newer). Symbolic links are not followed.
/// Returns how many were removed.
pub fn sweep_dir(dir: &Path, before: SystemTime) -> usize {
    let mut removed = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file()
                && is_staged_name(&e.file_name().to_string_lossy())
                && meta.modified().is_ok_and(|m| m < before)
                && std::fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}

/// Starts removing, in the background, the staged files earlier runs left in the `file://`
/// stores this gateway writes.
fn sweep_staged(client: &Client, before: SystemTime) {
    let Ok(table) = client.writable() else {
        return;
    };
    let dirs: Vec<PathBuf> = table
        .mounts()
        .filter_map(|(_, url)| file_dir(url))
        .collect();
    if dirs.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("pages3-sweep".into())
        .spawn(move || {
            for d in dirs {
                let n = sweep_dir(&d, before);
                if n > 0 {
                    tracing::info!(
                        dir = %d.display(),
                        removed = n,
                        "removed staged upload files left by an earlier run"
                    );
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the sweep of staged upload files");
    }
}

// ---------------------------------------------------------------------------------------------
// Multipart uploads staged on local disk

struct PartFile {
    etag: String,
    size: u64,
    file: PathBuf,
}

struct Upload {
    /// The logical path the upload writes.
    path: String,
    dir: PathBuf,
    parts: BTreeMap<i32, PartFile>,
    /// CompleteMultipartUpload is sending the parts.
    completing: bool,
}

struct Uploads {
    dir: PathBuf,
    open: Mutex<HashMap<String, Upload>>,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// An unpredictable id (process-random hash keys over a counter and the time).
fn random_id() -> String {
    let mut out = String::new();
    for _ in 0..2 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u128(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

fn no_such_upload(id: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NoSuchUpload,
        format!(
            "upload {id:?} does not exist (it was completed or aborted, or the gateway \
             restarted since it began)"
        ),
    )
}

impl Uploads {
    fn open(dir: &Path) -> Result<Uploads, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("staging directory {}: {e}", dir.display()))?;
        // Uploads of an earlier run cannot be completed (their state was in its memory).
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("staging directory {}: {e}", dir.display()))?;
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(UPLOAD_DIR_PREFIX)
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(Uploads {
            dir: dir.to_path_buf(),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Upload>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn create(&self, path: String) -> S3Result<String> {
        let id = random_id();
        let dir = self.dir.join(format!("{UPLOAD_DIR_PREFIX}{id}"));
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| internal(format!("staging directory {}: {e}", dir.display())))?;
        self.lock().insert(
            id.clone(),
            Upload {
                path,
                dir,
                parts: BTreeMap::new(),
                completing: false,
            },
        );
        Ok(id)
    }

    /// The upload's directory, if `id` is open for `path` and not completing.
    fn dir_of(&self, id: &str, path: &str) -> S3Result<PathBuf> {
        let open = self.lock();
        match open.get(id) {
            Some(u) if u.path == path && !u.completing => Ok(u.dir.clone()),
            Some(u) if u.completing => Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                "the upload is being completed",
            )),
            _ => Err(no_such_upload(id)),
        }
    }

    /// Stages one part (checked as PutObject checks a body); returns its ETag (without
    /// quotes).
    async fn put_part(
        &self,
        id: &str,
        path: &str,
        number: i32,
        mut body: BodyReader,
        mut digests: Digests,
        trailers: Option<&TrailingHeaders>,
    ) -> S3Result<String> {
        let dir = self.dir_of(id, path)?;
        let tmp = dir.join(format!("part-{number:05}.{}.tmp", random_id()));
        let what = format!("staging part {number} in {}", tmp.display());
        let fail = |e: io::Error| io_failure(&what, e);
        let mut file = match tokio::fs::File::create(&tmp).await {
            Ok(f) => f,
            Err(e) => {
                body.drain().await;
                return Err(fail(e));
            }
        };
        // Fixed keys: the same bytes get the same ETag.
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        let mut size = 0u64;
        let written: S3Result<()> = async {
            while let Some(chunk) = body.next().await? {
                hash.write(&chunk);
                digests.update(&chunk);
                size += chunk.len() as u64;
                file.write_all(&chunk).await.map_err(fail)?;
            }
            file.flush().await.map_err(fail)?;
            digests.verify(trailers.and_then(TrailingHeaders::take).as_ref())?;
            Ok(())
        }
        .await;
        drop(file);
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            body.drain().await;
            return Err(e);
        }
        let etag = format!("{:016x}{size:x}", hash.finish());
        let dest = dir.join(format!("part-{number:05}"));
        let mut open = self.lock();
        // Aborted or completed while the body was arriving: drop the part.
        match open.get_mut(id) {
            Some(u) if !u.completing => {
                std::fs::rename(&tmp, &dest).map_err(fail)?;
                u.parts.insert(
                    number,
                    PartFile {
                        etag: etag.clone(),
                        size,
                        file: dest,
                    },
                );
                Ok(etag)
            }
            _ => {
                let _ = std::fs::remove_file(&tmp);
                Err(no_such_upload(id))
            }
        }
    }

    /// Checks the client's part list against the staged parts and marks the upload as
    /// completing; returns the part files in order.
    fn begin_complete(
        &self,
        id: &str,
        path: &str,
        wanted: &[(i32, Option<String>)],
    ) -> S3Result<Vec<PathBuf>> {
        let mut open = self.lock();
        let u = match open.get_mut(id) {
            Some(u) if u.path == path && !u.completing => u,
            Some(u) if u.completing => {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidRequest,
                    "the upload is already being completed",
                ))
            }
            _ => return Err(no_such_upload(id)),
        };
        if wanted.is_empty() {
            return Err(S3Error::with_message(
                S3ErrorCode::MalformedXML,
                "the part list is empty",
            ));
        }
        let mut files = Vec::with_capacity(wanted.len());
        let mut prev = 0;
        for (i, (number, tag)) in wanted.iter().enumerate() {
            if *number <= prev {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidPartOrder,
                    "parts must be listed in ascending order of part number",
                ));
            }
            prev = *number;
            let part = u.parts.get(number).ok_or_else(|| {
                S3Error::with_message(
                    S3ErrorCode::InvalidPart,
                    format!("part {number} was not uploaded"),
                )
            })?;
            if tag.as_deref() != Some(part.etag.as_str()) {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidPart,
                    format!("part {number}: the ETag does not match the uploaded part's"),
                ));
            }
            if i + 1 < wanted.len() && part.size < MIN_PART {
                return Err(S3Error::with_message(
                    S3ErrorCode::EntityTooSmall,
                    format!(
                        "part {number} has {} bytes; every part but the last needs at least {MIN_PART}",
                        part.size
                    ),
                ));
            }
            files.push(part.file.clone());
        }
        u.completing = true;
        Ok(files)
    }

    /// Ends a completion: on success the upload and its files go; on failure it can be
    /// completed again.
    async fn end_complete(&self, id: &str, done: bool) {
        let dir = {
            let mut open = self.lock();
            if done {
                open.remove(id).map(|u| u.dir)
            } else {
                if let Some(u) = open.get_mut(id) {
                    u.completing = false;
                }
                None
            }
        };
        if let Some(dir) = dir {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
    }

    async fn abort(&self, id: &str, path: &str) -> S3Result<()> {
        let dir = {
            let mut open = self.lock();
            match open.get(id) {
                Some(u) if u.path == path && !u.completing => open.remove(id).map(|u| u.dir),
                Some(u) if u.completing => {
                    return Err(S3Error::with_message(
                        S3ErrorCode::InvalidRequest,
                        "the upload is being completed",
                    ))
                }
                _ => return Err(no_such_upload(id)),
            }
        };
        if let Some(dir) = dir {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
        Ok(())
    }
}

/// Fuzzing entry (`fuzz/`): `data` is read as a request (`METHOD TARGET` line, header lines,
/// an empty line, the body) and put through the gateway's own request checks: the signature
/// and presign policy, key and bucket mapping, listing tokens, ranges, digests and aws-chunked
/// framing. None of them may panic, whatever the input.
#[doc(hidden)]
pub fn fuzz_request(data: &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &[][..]),
    };
    let head = String::from_utf8_lossy(head);
    let mut lines = head.lines();
    let first = lines.next().unwrap_or("");
    let (method, target) = first.split_once(' ').unwrap_or((first, "/"));
    let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
    let uri: Uri = target.parse().unwrap_or_else(|_| Uri::from_static("/"));
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            if let (Ok(k), Ok(v)) = (
                hyper::header::HeaderName::from_bytes(k.trim().as_bytes()),
                hyper::header::HeaderValue::from_str(v.trim()),
            ) {
                headers.append(k, v);
            }
        }
    }
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    for anonymous in [false, true] {
        for allow_sigv2 in [false, true] {
            for signed in [false, true] {
                let policy = Policy {
                    anonymous,
                    allow_sigv2,
                };
                let _ = checks::check_request(
                    policy,
                    signed,
                    &method,
                    &uri,
                    &headers,
                    "PutObject",
                    now,
                );
            }
        }
    }
    let path = String::from_utf8_lossy(&percent_decode(uri.path().as_bytes())).into_owned();
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let bucket = parts.next().unwrap_or("");
    let key = parts.next().unwrap_or("");
    let _ = valid_bucket(bucket);
    let _ = key_path(bucket, key);
    let _ = check_segments(key);
    let _ = url_encode(key);
    if let Some(t) = uri.query() {
        let _ = decode_token(t);
        let _ = checks::is_sigv2(&uri, &headers);
    }
    if let Some(r) = headers.get("range").and_then(|v| v.to_str().ok()) {
        if let Ok(r) = s3s::dto::Range::parse(r) {
            for size in [0, 1, 4096, u64::MAX] {
                if let Ok(r) = r.check(size) {
                    let _ =
                        chunks(r.start, r.end.min(r.start.saturating_add(1 << 20)), 4096).count();
                }
            }
        }
    }
    if let Some(d) = headers.get("date").and_then(|v| v.to_str().ok()) {
        let _ = checks::parse_http_date(d);
    }
    if let Ok(mut digests) = Digests::from_headers(&headers) {
        digests.update(body);
        let _ = digests.verify(Some(&headers));
    }
    let mut framing = ChunkedCheck::new(());
    for piece in body.chunks(7) {
        framing.feed(piece);
    }
    let _ = framing.complete();
    let _ = checks::decoded_length(&headers);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_map_to_paths_and_traversal_is_refused() {
        assert_eq!(
            key_path("data", "a/b.bin").unwrap(),
            KeyPath::Object("/data/a/b.bin".into())
        );
        assert_eq!(key_path("data", "a/").unwrap(), KeyPath::Marker);
        assert_eq!(
            key_path("data", "100%.txt").unwrap(),
            KeyPath::Object("/data/100%.txt".into())
        );
        assert_eq!(
            key_path("data", "..x/y..").unwrap(),
            KeyPath::Object("/data/..x/y..".into())
        );
        for bad in [
            "..",
            "../etc/passwd",
            "a/../../b",
            "a/./b",
            ".",
            "%2e%2e/x",
            "%2E%2e/x",
            "a/%252e%252e/b",
            "a/%2e%2e%2fb",
            "a/..%2fb",
            "a\0b",
            "a/%00",
            "a//b",
            "/a",
            "",
        ] {
            let e = key_path("data", bad).unwrap_err();
            assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{bad:?}");
        }
        for bad in ["..", ".", "", "a/b", "%2e%2e"] {
            assert!(!valid_bucket(bad), "{bad:?}");
        }
        assert!(valid_bucket("data"));
        assert!(valid_bucket("Data_1"));
    }

    #[test]
    fn tokens_round_trip_and_junk_is_refused() {
        for k in ["", "a", "big/f00001", "ünïcode/ключ"] {
            assert_eq!(decode_token(&encode_token(k)).unwrap(), k);
        }
        for junk in ["", "x00", "k0", "kzz", "kff"] {
            assert!(decode_token(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn pieces_follow_page_boundaries() {
        let v: Vec<_> = chunks(100, 2500, 1000).collect();
        assert_eq!(v, vec![(100, 900), (1000, 1000), (2000, 500)]);
        assert_eq!(chunks(5, 5, 1000).count(), 0);
        let v: Vec<_> = chunks(0, 1000, 1000).collect();
        assert_eq!(v, vec![(0, 1000)]);
    }

    #[test]
    fn level_sort_puts_directory_keys_where_their_children_sort() {
        let e = |name: &str, is_dir: bool| DirEntry {
            name: name.into(),
            is_dir,
            size: 1,
        };
        let v = sorted_level(
            "p/",
            vec![e("a", true), e("a-b", false), e("a0", false), e("b", false)],
            "",
        );
        let keys: Vec<_> = v.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(keys, ["p/a-b", "p/a/", "p/a0", "p/b"]);
        assert!(subtree_after("p/a/", Some("p/a-b")));
        assert!(subtree_after("p/a/", Some("p/a/x")));
        assert!(!subtree_after("p/a/", Some("p/a/")));
        assert!(!subtree_after("p/a/", Some("p/a0")));
    }

    #[test]
    fn url_encoding_keeps_slashes() {
        assert_eq!(url_encode("a b/c+d%é"), "a%20b/c%2Bd%25%C3%A9");
    }
}
