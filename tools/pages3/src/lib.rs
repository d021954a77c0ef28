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
//! `docs/SECURITY.md`; the checks are in [`checks`] and [`pagestore_cli::http_guard`].
//!
//! The module is cut along the S3 operation groups: `keys` maps keys to logical paths and
//! encodes listing keys and tokens, `errors` turns client and store failures into S3 errors
//! without server details, `cond` evaluates conditional requests (412/304, and the store write
//! modes of `If-None-Match: *` and `If-Match`), `list` serves ListObjects and ListObjectsV2 (with
//! ETags), `read` GetObject, `write` PutObject and DeleteObject(s) (and sweeps staged files of
//! `file://` stores), `multipart` the multipart uploads staged on local disk (part MD5s, `md5-N`
//! ETags, repeated completions, ListMultipartUploads), `copy` CopyObject, UploadPartCopy and
//! GetObjectAttributes, `acl` the ACLs (every one the owner's full control; any other asked for
//! is refused) and expected-owner headers. This file holds the service (authentication, access
//! checks, routing, bucket names, request ids), HeadObject and ListBuckets, and the [`S3`]
//! implementation, a table of the operations that calls into those modules.

mod acl;
mod aliases;
mod attrs;
pub mod checks;
mod cond;
mod copy;
mod errors;
mod fuzz;
mod keys;
mod list;
mod multipart;
mod read;
mod record;
#[cfg(test)]
mod tests;
mod write;

use std::{
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    time::{Duration, SystemTime},
};

use hyper::{body::Incoming, http::Extensions, HeaderMap, Method, Uri};
use pagestore_client::{ufs::ObjectInfo, Client, Error as ClientError};
use pagestore_protocol::frame::{FileState, PathKind};
use s3s::{
    access::{S3Access, S3AccessContext},
    auth::{S3Auth, SecretKey},
    dto::{
        AbortMultipartUploadInput, AbortMultipartUploadOutput, Bucket, BucketLocationConstraint,
        CompleteMultipartUploadInput, CompleteMultipartUploadOutput, CopyObjectInput,
        CopyObjectOutput, CreateBucketInput, CreateBucketOutput, CreateMultipartUploadInput,
        CreateMultipartUploadOutput, DeleteBucketInput, DeleteBucketOutput, DeleteObjectInput,
        DeleteObjectOutput, DeleteObjectsInput, DeleteObjectsOutput, ETag, GetBucketAclInput,
        GetBucketAclOutput, GetBucketLocationInput, GetBucketLocationOutput,
        GetBucketVersioningInput, GetBucketVersioningOutput, GetObjectAclInput, GetObjectAclOutput,
        GetObjectAttributesInput, GetObjectAttributesOutput, GetObjectInput, GetObjectOutput,
        HeadBucketInput, HeadBucketOutput, HeadObjectInput, HeadObjectOutput, ListBucketsInput,
        ListBucketsOutput, ListMultipartUploadsInput, ListMultipartUploadsOutput,
        ListObjectVersionsInput, ListObjectVersionsOutput, ListObjectsInput, ListObjectsOutput,
        ListObjectsV2Input, ListObjectsV2Output, ListPartsInput, ListPartsOutput,
        PutBucketAclInput, PutBucketAclOutput, PutObjectAclInput, PutObjectAclOutput,
        PutObjectInput, PutObjectOutput, Timestamp, UploadPartCopyInput, UploadPartCopyOutput,
        UploadPartInput, UploadPartOutput,
    },
    route::S3Route,
    service::{S3Service, S3ServiceBuilder},
    validation::NameValidation,
    Body, HttpError, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, StdError, S3,
};

use aliases::Aliases;
use checks::{Checksums, ChunkedCheck, Digests, Policy};
use cond::{check_read, ReadConditions, Tags};
use errors::{client_error, internal, invalid, no_such_bucket};
use keys::{decode_token, encode_token, etag, key_path, segment_is_safe, KeyPath};
use multipart::{check_part_number, Uploads};
use pagestore_cli::http_guard::{self, Limits, StallBody};
use write::{sweep_staged, BodyReader};

#[doc(hidden)]
pub use fuzz::fuzz_request;
pub use write::{is_staged_name, sweep_dir};

/// The most keys one listing returns (S3's limit; larger `max-keys` are lowered to it).
pub const MAX_KEYS: usize = 1000;

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
        aliases: Arc::new(Aliases::default()),
        attr_cache: Arc::new(attrs::AttrCache::default()),
        markers: Arc::new(Markers::default()),
    };
    let policy = Policy {
        anonymous: options.anonymous,
        allow_sigv2: options.allow_sigv2,
    };
    // Serves, unsigned and never reachable from the network, the GETs whose Range header S3
    // ignores and the copies whose source bucket S3 would refuse (see `Routes`).
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
    b.set_route(Routes { inner, policy });
    b.set_validation(BucketNames);
    Ok(b.build())
}

/// Serves `service` on `listener` with `limits` until `shutdown` resolves; then stops
/// accepting, lets the requests under way finish (at most [`SHUTDOWN_GRACE`]) and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: S3Service,
    region: String,
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
            region: region.clone(),
        },
        shutdown,
        SHUTDOWN_GRACE,
    )
    .await;
}

/// What every request passes before s3s: its body fails when it stalls, and an aws-chunked
/// body fails when it ends without its final chunk. An error answer to a request that came with
/// a body closes the connection (see [`finish_response`]).
#[derive(Clone)]
struct Front {
    s3: S3Service,
    stall: Duration,
    /// The gateway's region (`--region`), named to clients that sign for no region.
    region: String,
}

type FrontFuture =
    Pin<Box<dyn Future<Output = Result<hyper::Response<Body>, HttpError>> + Send + 'static>>;

impl hyper::service::Service<hyper::Request<Incoming>> for Front {
    type Response = hyper::Response<Body>;
    type Error = HttpError;
    type Future = FrontFuture;

    fn call(&self, mut req: hyper::Request<Incoming>) -> FrontFuture {
        if let Some(uri) = checks::sigv2_bucket_uri(req.uri(), req.headers()) {
            *req.uri_mut() = uri;
        }
        let chunked = checks::is_aws_chunked(req.headers());
        let with_body = has_body(req.headers());
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
        let wrong_region = checks::malformed_region(req.uri(), req.headers());
        let region = self.region.clone();
        let attributes = req.method() == hyper::Method::GET
            && checks::query_value(req.uri(), "attributes").is_some();
        Box::pin(async move {
            let mut resp = match wrong_region {
                Some(asked) => region_error(&asked, &region),
                None => s3.call(req).await?,
            };
            if attributes && resp.status() == hyper::StatusCode::OK {
                attrs::unquote_etag(resp.body_mut());
            }
            finish_response(
                &mut resp,
                &multipart::random_id()[..16].to_ascii_uppercase(),
                with_body,
            );
            Ok(resp)
        })
    }
}

/// 400 AuthorizationHeaderMalformed for a request signed for `asked`, which is no region, with
/// the `<Region>` to sign for instead, as S3 answers it.
fn region_error(asked: &str, region: &str) -> hyper::Response<Body> {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AuthorizationHeaderMalformed\
         </Code><Message>The authorization header is malformed; the region '{}' is wrong; \
         expecting '{}'</Message><Region>{}</Region></Error>",
        esc(asked),
        esc(region),
        esc(region)
    );
    let mut resp = hyper::Response::new(Body::from(body));
    *resp.status_mut() = hyper::StatusCode::BAD_REQUEST;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    resp
}

/// Whether a request declares a body (a non-zero `Content-Length`, or `Transfer-Encoding`).
fn has_body(headers: &HeaderMap) -> bool {
    use hyper::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
    headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// What every answer gets on its way out: an `x-amz-request-id` header, and the same id as
/// `<RequestId>` in an error body (S3's error format); a 304 goes without a body.
///
/// An error answer to a request that declared a body (`with_body`) also says
/// `Connection: close`, and the connection ends after it. Such a request is often answered
/// before its body is read (a missing upload, a refused key), and then nobody knows how much
/// of the body the client will still send: a client that sent `Expect: 100-continue` may send
/// it after its own timeout (botocore waits 1 s), or not at all. Were the connection kept, the
/// server could take the start of the client's next request for the rest of this body, and
/// read that request from the wrong byte (the likely cause of a rare `SignatureDoesNotMatch`
/// on the request after such an error, seen in the boto3 test on a loaded machine).
fn finish_response(resp: &mut hyper::Response<Body>, id: &str, with_body: bool) {
    use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
    if let Ok(v) = HeaderValue::from_str(id) {
        resp.headers_mut().insert("x-amz-request-id", v);
    }
    if with_body && resp.status().as_u16() >= 400 {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if resp.status() == hyper::StatusCode::NOT_MODIFIED {
        *resp.body_mut() = Body::empty();
        resp.headers_mut().remove(CONTENT_TYPE);
        resp.headers_mut().remove(CONTENT_LENGTH);
        return;
    }
    if resp.status().as_u16() < 400 {
        return;
    }
    let Some(body) = resp.body().bytes() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return;
    };
    if text.contains("<RequestId>") {
        return;
    }
    let Some(at) = text.rfind("</Error>") else {
        return;
    };
    let with_id = format!("{}<RequestId>{id}</RequestId>{}", &text[..at], &text[at..]);
    if let Ok(v) = HeaderValue::from_str(&with_id.len().to_string()) {
        resp.headers_mut().insert(CONTENT_LENGTH, v);
    }
    *resp.body_mut() = Body::from(with_id);
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

/// Requests s3s would refuse but S3 serves, answered through an unsigned service over the same
/// gateway (never reachable from the network) once they passed the usual checks, without their
/// signature:
///
/// - GET and HEAD of an object with a Range header S3 ignores (one it cannot parse, such as
///   `bytes=5-3`, or several ranges): forwarded without it, so answered with the whole object,
///   as S3 does.
/// - CopyObject and UploadPartCopy whose `x-amz-copy-source` names a bucket S3 would not allow
///   (a mount named `/w` or `/Data`: s3s checks the header against S3's bucket rules before
///   pages3 sees it): forwarded naming [`SOURCE_STAND_IN`] instead, with the real bucket in a
///   [`SourceBucket`] extension, which only this route sets.
struct Routes {
    inner: S3Service,
    policy: Policy,
}

/// Which of [`Routes`]' requests a request is (kept in its extensions by `is_match`).
#[derive(Clone, Debug)]
enum Routed {
    IgnoredRange,
    CopySource {
        /// The source's bucket, decoded.
        bucket: String,
        /// The header with [`SOURCE_STAND_IN`] in place of the bucket.
        header: String,
    },
}

/// The bucket a copy forwarded by [`Routes`] names in `x-amz-copy-source`: a valid S3 name
/// that stands for the [`SourceBucket`] beside it.
pub(crate) const SOURCE_STAND_IN: &str = "pages3-copy-source";

/// The real source bucket of a copy forwarded by [`Routes`] (see [`SOURCE_STAND_IN`]).
#[derive(Clone, Debug)]
pub(crate) struct SourceBucket(pub(crate) String);

/// A copy's source bucket that is a mount name S3 would refuse, and the header naming
/// [`SOURCE_STAND_IN`] in its place; `None` for any other header (s3s parses those itself).
fn nonstandard_source(header: &str) -> Option<Routed> {
    let path = header.strip_prefix('/').unwrap_or(header);
    let (bucket, rest) = path.split_once('/')?;
    let bucket = String::from_utf8(keys::percent_decode(bucket.as_bytes())).ok()?;
    if bucket.starts_with("arn:") || s3s::path::check_bucket_name(&bucket) || !valid_bucket(&bucket)
    {
        return None;
    }
    Some(Routed::CopySource {
        bucket,
        header: format!("{SOURCE_STAND_IN}/{rest}"),
    })
}

fn routed(method: &Method, uri: &Uri, headers: &HeaderMap) -> Option<Routed> {
    if method == Method::PUT {
        let source = headers.get("x-amz-copy-source")?.to_str().ok()?;
        return nonstandard_source(source);
    }
    if method != Method::GET && method != Method::HEAD {
        return None;
    }
    let range = headers.get(hyper::header::RANGE)?;
    if range
        .to_str()
        .is_ok_and(|r| s3s::dto::Range::parse(r).is_ok())
    {
        return None;
    }
    let (bucket, key) = uri.path().trim_start_matches('/').split_once('/')?;
    let whole = !bucket.is_empty()
        && !key.is_empty()
        && uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|kv| !kv.is_empty())
            .all(|kv| {
                let k = kv.split_once('=').map_or(kv, |p| p.0);
                GET_OBJECT_PARAMS.contains(&k) || k.starts_with("response-") || is_auth_param(k)
            });
    whole.then_some(Routed::IgnoredRange)
}

#[async_trait::async_trait]
impl S3Route for Routes {
    fn is_match(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        extensions: &mut Extensions,
    ) -> bool {
        match routed(method, uri, headers) {
            Some(r) => {
                extensions.insert(r);
                true
            }
            None => false,
        }
    }

    async fn check_access(&self, req: &mut S3Request<Body>) -> S3Result<()> {
        let op = match req.extensions.get::<Routed>() {
            Some(Routed::CopySource { .. })
                if checks::query_value(&req.uri, "uploadId").is_some() =>
            {
                "UploadPartCopy"
            }
            Some(Routed::CopySource { .. }) => "CopyObject",
            _ => "GetObject",
        };
        checks::check_request(
            self.policy,
            req.credentials.is_some(),
            &req.method,
            &req.uri,
            &req.headers,
            op,
            SystemTime::now(),
        )
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let routed = req
            .extensions
            .get::<Routed>()
            .cloned()
            .ok_or_else(|| internal("a routed request without its route".into()))?;
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
            let dropped = name == hyper::header::AUTHORIZATION
                || match routed {
                    Routed::IgnoredRange => name == hyper::header::RANGE,
                    Routed::CopySource { .. } => name == "x-amz-copy-source",
                };
            if !dropped {
                forward = forward.header(name, value);
            }
        }
        if let Routed::CopySource { bucket, header } = routed {
            forward = forward
                .header("x-amz-copy-source", header)
                .extension(SourceBucket(bucket));
        }
        let forward = forward
            .body(Body::empty())
            .map_err(|e| internal(format!("forwarding a request s3s would refuse: {e}")))?;
        let resp = self.inner.call(forward).await.map_err(|e| {
            internal(format!(
                "a request s3s would refuse: {:?}",
                StdError::from(e)
            ))
        })?;
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
// The gateway

/// Directory markers (zero-byte objects whose keys end in `/`, which S3 file-system clients
/// such as s3fs-fuse's `mkdir` and pyarrow's `create_dir` put) put through this gateway: a
/// file system store has no empty objects named `dir/`, and pagestore stores none, so the
/// gateway remembers them instead, in memory, until they are deleted (or the gateway
/// restarts). A remembered marker answers HEAD and GET (0 bytes) and appears in delimited
/// listings of its parent as a common prefix, as it would on S3, so that a directory made
/// empty is there until it is removed. At most [`MAX_MARKERS`] are kept.
#[derive(Default)]
struct Markers {
    /// Logical directory path (`/bucket/a/b`) -> when the marker was put (ns since the epoch).
    made: std::sync::Mutex<std::collections::BTreeMap<String, i64>>,
}

/// The most directory markers one gateway remembers.
const MAX_MARKERS: usize = 10_000;

impl Markers {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, i64>> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers the marker of directory `dir`; false if there is no room for another.
    fn put(&self, dir: &str, now_ns: i64) -> bool {
        let mut m = self.lock();
        if m.len() >= MAX_MARKERS && !m.contains_key(dir) {
            return false;
        }
        m.insert(dir.to_string(), now_ns);
        true
    }

    /// When the marker of `dir` was put, if it was.
    fn get(&self, dir: &str) -> Option<i64> {
        self.lock().get(dir).copied()
    }

    fn remove(&self, dir: &str) {
        self.lock().remove(dir);
    }

    /// The names of the remembered directories directly inside `parent` (`/bucket` or
    /// `/bucket/a`).
    fn children(&self, parent: &str) -> Vec<String> {
        let from = format!("{parent}/");
        self.lock()
            .range(from.clone()..)
            .take_while(|(k, _)| k.starts_with(&from))
            .filter_map(|(k, _)| {
                let rest = &k[from.len()..];
                (!rest.contains('/')).then(|| rest.to_string())
            })
            .collect()
    }
}

#[derive(Clone)]
struct Gateway {
    client: Arc<Client>,
    region: String,
    writable: bool,
    /// Reported as bucket creation time (objects report their own modification times).
    started: SystemTime,
    uploads: Arc<Uploads>,
    /// ETags of objects this gateway wrote from multipart uploads.
    aliases: Arc<Aliases>,
    /// Attributes (Content-Type, user metadata...) of object versions read lately.
    attr_cache: Arc<attrs::AttrCache>,
    /// Directory markers put through this gateway.
    markers: Arc<Markers>,
}

impl Gateway {
    /// The ETags of the object `info`: the one reported (S3's `md5-N` form for an object this
    /// gateway completed from a multipart upload, while it keeps that version; else the store's
    /// version tag) and the store's.
    fn tags_of(&self, info: &ObjectInfo) -> Tags {
        self.tags_at(&info.path, &info.version)
    }

    /// The checksums the writer of the object `info` named, verified, while this gateway
    /// remembers the version it wrote (see `Aliases`).
    fn checksums_of(&self, info: &ObjectInfo) -> Option<Checksums> {
        self.aliases.checksums(&info.path, &info.version)
    }

    /// The checksums to answer a HeadObject or GetObject of `info` with, if it asks for them
    /// (`x-amz-checksum-mode: ENABLED`), as S3 answers: the object's for a request of the whole
    /// object (`range`: a Range was asked), the part's for a request of one part, else none.
    fn checksums_for_read(
        &self,
        info: &ObjectInfo,
        mode: Option<&s3s::dto::ChecksumMode>,
        range: bool,
        part: Option<&aliases::PartOf>,
    ) -> Checksums {
        let asked = mode.is_some_and(|m| m.as_str() == s3s::dto::ChecksumMode::ENABLED);
        match part {
            _ if !asked => Checksums::default(),
            Some(p) => p.checksums.clone(),
            None if range => Checksums::default(),
            None => self.checksums_of(info).unwrap_or_default(),
        }
    }

    /// The ETags of version `version` of the object at `path` (see [`Gateway::tags_of`]).
    fn tags_at(&self, path: &str, version: &str) -> Tags {
        let store = etag(version);
        let reported = self
            .aliases
            .get(path, version)
            .map_or_else(|| store.clone(), ETag::Strong);
        Tags { reported, store }
    }

    /// The object at `key` of `bucket` and its ETags, if the read conditions `conds` let it be
    /// read (else 304 or 412, as S3 answers).
    async fn stat_for_read(
        &self,
        bucket: &str,
        key: &str,
        conds: &ReadConditions<'_>,
    ) -> S3Result<(ObjectInfo, Tags)> {
        let info = self.stat_object(bucket, key).await?;
        let tags = self.tags_of(&info);
        check_read(conds, &tags, self.modified(&info))?;
        Ok((info, tags))
    }

    /// When the object `info` was last modified, as reported (Last-Modified) and as the
    /// If-Modified-Since and If-Unmodified-Since conditions compare it.
    fn modified(&self, info: &ObjectInfo) -> SystemTime {
        info.modified()
    }

    fn last_modified(&self) -> Timestamp {
        Timestamp::from(self.started)
    }
}

/// `Last-Modified` of an object: its modification time in the store.
fn modified(mtime_ns: i64) -> Timestamp {
    Timestamp::from(pagestore_client::ufs::system_time(mtime_ns))
}

impl Gateway {
    async fn bucket_exists(&self, bucket: &str) -> S3Result<bool> {
        if !valid_bucket(bucket) {
            return Ok(false);
        }
        let dir = format!("/{bucket}");
        if self.markers.get(&dir).is_some() {
            return Ok(true);
        }
        match self.client.stat_path(&dir).await {
            Ok(PathKind::Dir { .. }) => Ok(true),
            Ok(PathKind::File { .. }) => Ok(false),
            Err(ClientError::NotFound(_) | ClientError::NotDir(_)) => Ok(false),
            Err(e) => Err(client_error(e)),
        }
    }

    /// Whether this gateway writes the bucket `bucket` through a mount of the namespace's root
    /// (`--mount /=URL`, whose prefix is ""), where CreateBucket may make it.
    fn root_writable(&self, bucket: &str) -> bool {
        let probe = format!("/{bucket}/k");
        self.writable()
            .ok()
            .and_then(|t| t.mount_of(&probe))
            .is_some_and(str::is_empty)
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
            KeyPath::Marker(dir) => {
                self.require_bucket(bucket).await?;
                // A marker put through this gateway reads as the empty object it was.
                if let Some(mtime_ns) = self.markers.get(&dir) {
                    return Ok(ObjectInfo {
                        path: format!("{dir}/"),
                        size: 0,
                        version: write::EMPTY_MD5.to_string(),
                        file_id: 0,
                        mtime_ns,
                        state: FileState::Stored,
                        store_tag: String::new(),
                    });
                }
                return Err(S3Error::with_message(
                    S3ErrorCode::NoSuchKey,
                    format!("{key}: no directory marker was put here"),
                ));
            }
        };
        match self.client.stat(&path).await {
            Ok(info) => {
                self.recall(&info).await;
                Ok(info)
            }
            Err(e) => Err(self.object_error(bucket, e).await),
        }
    }

    /// Learns what the writer of the object `info` recorded with it ([`record`]) when this
    /// gateway does not know that version: an earlier run of it, or another gateway, wrote it.
    /// Its ETag, checksums and parts are then reported as the writer reported them.
    async fn recall(&self, info: &ObjectInfo) {
        if info.path.ends_with('/') || self.aliases.knows(&info.path, &info.version) {
            return;
        }
        // Attributes read lately are looked at where they are cached (a read of an object with
        // no record does this on every request: no copy of them).
        let found = match self.attr_cache.record(&info.path, &info.version) {
            Some(r) => r,
            None => record::of(&self.attributes_of(info).await),
        };
        if let Some(r) = found.filter(|r| r.size == info.size) {
            self.aliases
                .set(&info.path, &info.version, &r.etag, r.checksums, r.parts);
        }
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let input = req.input;
        let max = match input.max_buckets {
            None => usize::MAX,
            Some(n) if (1..=10_000).contains(&n) => n as usize,
            Some(n) => {
                return Err(invalid(format!(
                    "max-buckets {n} is not between 1 and 10000"
                )))
            }
        };
        let after = match input.continuation_token.as_deref() {
            None | Some("") => None,
            Some(t) => Some(decode_token(t)?),
        };
        let prefix = input.prefix.clone().unwrap_or_default();
        let entries = self.client.list("/").await.map_err(client_error)?;
        // Buckets made by CreateBucket here that hold no object yet are listed too.
        let made = self.markers.children("");
        let mut names: Vec<String> = entries
            .into_iter()
            .filter(|e| e.is_dir)
            .map(|e| e.name)
            .chain(made)
            .filter(|name| valid_bucket(name) && name.starts_with(&prefix))
            .filter(|name| after.as_deref().is_none_or(|a| name.as_str() > a))
            .collect();
        names.sort();
        names.dedup();
        let next = (names.len() > max).then(|| encode_token(&names[max - 1]));
        names.truncate(max);
        let buckets = names
            .into_iter()
            .map(|name| Bucket {
                name: Some(name),
                creation_date: Some(self.last_modified()),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(acl::owner()),
            continuation_token: next,
            prefix: input.prefix,
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

    /// CreateBucket: buckets are the cluster's top-level directories. Creating one that exists
    /// answers as S3 does for a bucket its caller owns (200 in us-east-1, else 409
    /// BucketAlreadyOwnedByYou), so that clients which create their bucket before writing
    /// (`aws s3 mb`, s3cmd, SDK helpers) work; a name S3 would refuse is 400 InvalidBucketName.
    /// A new bucket is made where the gateway writes the namespace's root (a mount of `/`): it
    /// is remembered as a directory marker is (`Markers`) until it holds objects; elsewhere
    /// a top-level directory is a mount the gateway cannot add (501, with the reason).
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let bucket = &req.input.bucket;
        if !s3s::path::check_bucket_name(bucket) {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidBucketName,
                format!("{bucket:?} is not a valid S3 bucket name"),
            ));
        }
        if !self.bucket_exists(bucket).await? {
            if !self.root_writable(bucket) {
                return Err(S3Error::with_message(
                    S3ErrorCode::NotImplemented,
                    format!(
                        "{bucket}: pages3 makes buckets only where it writes the namespace's root \
                         (pages3 --mount /=URL); here a bucket is a top-level directory of the \
                         cluster, e.g. a mount (pagestored --mount /{bucket}=URL)"
                    ),
                ));
            }
            self.remember_marker(&format!("/{bucket}"))?;
            return Ok(S3Response::new(CreateBucketOutput {
                location: Some(format!("/{bucket}")),
            }));
        }
        if self.region != "us-east-1" {
            return Err(S3Error::with_message(
                S3ErrorCode::BucketAlreadyOwnedByYou,
                format!("{bucket}: the bucket exists and is yours"),
            ));
        }
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{bucket}")),
        }))
    }

    /// DeleteBucket: 404 for a bucket that does not exist and 409 BucketNotEmpty for one that
    /// holds keys, as S3 answers; an empty bucket under the root mount this gateway writes goes
    /// (204); any other empty bucket is a mount that the gateway cannot remove: 501 with the
    /// reason.
    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let bucket = &req.input.bucket;
        self.require_bucket(bucket).await?;
        let dir = format!("/{bucket}");
        if self.holds_keys(bucket).await? {
            return Err(S3Error::with_message(
                S3ErrorCode::BucketNotEmpty,
                format!("{bucket}: the bucket you tried to delete is not empty"),
            ));
        }
        if self.root_writable(bucket) {
            // Nothing in it: what remains is this gateway's memory of it (if it made it) and
            // directories that hold no object, which no listing shows.
            self.markers.remove(&dir);
            return Ok(S3Response::new(DeleteBucketOutput {}));
        }
        Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            format!(
                "{bucket}: pages3 cannot delete buckets; a bucket is a top-level directory of \
                 the cluster (a mount): remove it from the mount table instead"
            ),
        ))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = &req.input;
        keys::check_version_id(input.version_id.as_deref())?;
        let conds = ReadConditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        };
        let (info, tags) = self
            .stat_for_read(&input.bucket, &input.key, &conds)
            .await?;
        let part = self.part_of(&info, input.part_number, input.range.is_some())?;
        let modified = self.modified(&info);
        let a = self.served_attributes(&info).await;
        let sums = self.checksums_for_read(
            &info,
            input.checksum_mode.as_ref(),
            input.range.is_some(),
            part.as_ref(),
        );
        let checksum_type = sums.checksum_type();
        let [crc32, crc32c, sha1, sha256, crc64nvme] = sums.values;
        let (start, end) = part.as_ref().map_or((0, info.size), |p| (p.start, p.end));
        Ok(S3Response::new(HeadObjectOutput {
            checksum_crc32: crc32,
            checksum_crc32c: crc32c,
            checksum_sha1: sha1,
            checksum_sha256: sha256,
            checksum_crc64nvme: crc64nvme,
            checksum_type,
            parts_count: part
                .as_ref()
                .map(|p| i32::try_from(p.count).unwrap_or(i32::MAX)),
            content_range: part
                .as_ref()
                .filter(|p| p.end > p.start)
                .map(|_| format!("bytes {start}-{}/{}", end.saturating_sub(1), info.size)),
            accept_ranges: Some("bytes".into()),
            content_length: Some((end - start).try_into().unwrap_or(i64::MAX)),
            content_type: Some(a.content_type()),
            cache_control: a.cache_control,
            content_disposition: a.content_disposition,
            content_encoding: a.content_encoding,
            content_language: a.content_language,
            metadata: a.metadata,
            expires: a.expires,
            e_tag: Some(tags.reported),
            last_modified: Some(modified.into()),
            ..HeadObjectOutput::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        read::get_object(self, req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        list::list_objects_v2(self, req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        list::list_objects(self, req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        list::list_object_versions(self, req).await
    }

    /// GetBucketVersioning: buckets here are never versioned, which S3 answers with an empty
    /// configuration (no `Status`).
    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        self.require_bucket(&req.input.bucket).await?;
        Ok(S3Response::new(GetBucketVersioningOutput::default()))
    }

    /// GetBucketAcl: the owner's full control, the only ACL here (`acl`).
    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        self.require_bucket(&req.input.bucket).await?;
        Ok(S3Response::new(GetBucketAclOutput {
            grants: Some(acl::grants()),
            owner: Some(acl::owner()),
        }))
    }

    /// PutBucketAcl: accepted only for the ACL every bucket has; any other is 400
    /// AccessControlListNotSupported (`acl`).
    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        acl::check_put(req.input.access_control_policy.as_ref(), &req.headers)?;
        self.require_bucket(&req.input.bucket).await?;
        Ok(S3Response::new(PutBucketAclOutput {}))
    }

    /// GetObjectAcl: the owner's full control, for an object that exists.
    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        let input = &req.input;
        keys::check_version_id(input.version_id.as_deref())?;
        self.stat_object(&input.bucket, &input.key).await?;
        Ok(S3Response::new(GetObjectAclOutput {
            grants: Some(acl::grants()),
            owner: Some(acl::owner()),
            request_charged: None,
        }))
    }

    /// PutObjectAcl: as PutBucketAcl, for an object that exists.
    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        let input = &req.input;
        acl::check_put(input.access_control_policy.as_ref(), &req.headers)?;
        keys::check_version_id(input.version_id.as_deref())?;
        self.stat_object(&input.bucket, &input.key).await?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        write::put_object(self, req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        write::delete_object(self, req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        copy::copy_object(self, req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        copy::upload_part_copy(self, req).await
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        copy::get_object_attributes(self, req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        multipart::list_parts(self, req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        multipart::list_multipart_uploads(self, req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        write::delete_objects(self, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        let path = self.write_path(&input.bucket, &input.key)?;
        self.may_write(&path)?;
        self.require_bucket(&input.bucket).await?;
        let attributes = attrs::Asked {
            content_type: input.content_type.as_deref(),
            cache_control: input.cache_control.as_deref(),
            content_disposition: input.content_disposition.as_deref(),
            content_encoding: input.content_encoding.as_deref(),
            content_language: input.content_language.as_deref(),
            metadata: input.metadata.as_ref(),
            expires: input.expires.as_ref(),
        }
        .attributes()?;
        let sum = multipart::upload_sum(
            input.checksum_algorithm.as_ref(),
            input.checksum_type.as_ref(),
        )?;
        let id = self.uploads.create(path, attributes, sum).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            checksum_algorithm: input.checksum_algorithm.filter(|_| sum.is_some()),
            checksum_type: sum.map(multipart::UploadSum::checksum_type),
            ..CreateMultipartUploadOutput::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let path = self.write_path(&input.bucket, &input.key)?;
        check_part_number(input.part_number)?;
        let (tag, sums) = self
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
        let [crc32, crc32c, sha1, sha256, crc64nvme] = sums.values;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(tag)),
            checksum_crc32: crc32,
            checksum_crc32c: crc32c,
            checksum_sha1: sha1,
            checksum_sha256: sha256,
            checksum_crc64nvme: crc64nvme,
            ..UploadPartOutput::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        multipart::complete_multipart_upload(self, req).await
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
