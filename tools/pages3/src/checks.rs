//! Request checks of the gateway that s3s does not make: which signatures are accepted and
//! how old they may be, how long a presigned URL may live, which keys fit a file system, body
//! digests, and the framing of aws-chunked bodies.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use bytes::{Buf, Bytes};
use hyper::{
    body::{Body, Frame, SizeHint},
    HeaderMap, Method, Uri,
};
use s3s::{
    checksum::ChecksumHasher,
    crypto::{Checksum as _, Md5},
    S3Error, S3ErrorCode, S3Result,
};

/// Largest clock difference accepted for a signed request's date (as SigV4 in s3s).
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// Longest lifetime of a presigned URL (7 days, as in S3).
pub const MAX_PRESIGNED_EXPIRY: u64 = 604_800;

/// Longest key, in bytes (as in S3).
pub const MAX_KEY_LEN: usize = 1024;

/// Longest path segment of a key, in bytes (a file name on the file systems under the cache).
pub const MAX_SEGMENT_LEN: usize = pagestore_protocol::writeback::MAX_NAME_LEN;

/// Longest path segment of a key that is written (the local store stages a write under a
/// short temporary name, so the limit is the file system's).
pub const MAX_WRITTEN_SEGMENT_LEN: usize = MAX_SEGMENT_LEN;

/// Refuses keys of writes whose segments leave no room for the store's staging suffix.
pub fn check_written_key_len(key: &str) -> S3Result<()> {
    check_key_len(key)?;
    if let Some(seg) = key.split('/').find(|s| s.len() > MAX_WRITTEN_SEGMENT_LEN) {
        return Err(S3Error::with_message(
            S3ErrorCode::KeyTooLongError,
            format!(
                "a path segment of the key has {} bytes; written keys may have at most \
                 {MAX_WRITTEN_SEGMENT_LEN} per segment",
                seg.len()
            ),
        ));
    }
    Ok(())
}

/// Most keys in one DeleteObjects request (as in S3).
pub const MAX_DELETE_KEYS: usize = 1000;

/// Who may do what, beyond a valid signature.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Unsigned GET and HEAD requests are served.
    pub anonymous: bool,
    /// Signature Version 2 (header or query) is accepted, within [`MAX_SKEW`].
    pub allow_sigv2: bool,
}

/// Whether the request is signed with Signature Version 2 (header `Authorization: AWS
/// key:sig`, or a query with `Signature`).
pub fn is_sigv2(uri: &Uri, headers: &HeaderMap) -> bool {
    let header = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("AWS ") && !v.starts_with("AWS4-"));
    header || query_value(uri, "Signature").is_some()
}

/// The URI a Signature Version 2 request to a bucket itself (path `/bucket`, no key) is
/// verified with: `/bucket/`. SigV2 clients (botocore, s3cmd, minio-go) sign a bucket's
/// resource as `/bucket/` whatever path they send, as S3 takes it; s3s signs the path as sent,
/// so without this every SigV2 CreateBucket, ListObjects or DeleteBucket failed with
/// SignatureDoesNotMatch (even where SigV2 is refused: the refusal comes after the signature).
/// `None`: the URI stays as it is.
pub fn sigv2_bucket_uri(uri: &Uri, headers: &HeaderMap) -> Option<Uri> {
    let bucket = uri.path().strip_prefix('/')?;
    if bucket.is_empty() || bucket.contains('/') || !is_sigv2(uri, headers) {
        return None;
    }
    let path_and_query = match uri.query() {
        Some(q) => format!("/{bucket}/?{q}"),
        None => format!("/{bucket}/"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// The first value of the query parameter `name` (not percent-decoded: the values checked here
/// are numbers).
pub(super) fn query_value<'a>(uri: &'a Uri, name: &str) -> Option<&'a str> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then_some(v)
    })
}

/// The region of a SigV4 request's credential scope (the Authorization header's `Credential=`,
/// or a presigned URL's `X-Amz-Credential`) when it is not a region name at all (`[a-z0-9-]+`),
/// such as the `US` that s3cmd's default configuration signs with. S3 answers such a request
/// 400 AuthorizationHeaderMalformed naming the region to use, and clients (s3cmd) sign it again
/// for that region; the S3 library would refuse it with an error they do not act on.
pub fn malformed_region(uri: &Uri, headers: &HeaderMap) -> Option<String> {
    let scope = match headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        Some(auth) => auth
            .strip_prefix("AWS4-HMAC-SHA256")?
            .split(',')
            .find_map(|p| p.trim().strip_prefix("Credential="))?
            .to_string(),
        None => String::from_utf8(super::keys::percent_decode(
            query_value(uri, "X-Amz-Credential")?.as_bytes(),
        ))
        .ok()?,
    };
    // ACCESS_KEY/DATE/REGION/s3/aws4_request
    let region = scope.split('/').nth(2)?;
    let valid = !region.is_empty()
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    (!valid).then(|| region.to_string())
}

fn unix_now(now: SystemTime) -> i64 {
    match now.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn sigv4_required() -> S3Error {
    S3Error::with_message(
        S3ErrorCode::InvalidRequest,
        "The authorization mechanism you have provided is not supported: this gateway accepts \
         only AWS Signature Version 4 (AWS4-HMAC-SHA256). Signature Version 2 is refused unless \
         pages3 runs with --allow-sigv2",
    )
}

fn skewed() -> S3Error {
    S3Error::with_message(
        S3ErrorCode::RequestTimeTooSkewed,
        "The difference between the request time and the server's time is too large (more \
         than 15 minutes), or the request's date cannot be read",
    )
}

/// The checks of every request after its signature was verified (`signed`): Signature Version
/// 2 refused or held to the clock, presigned lifetimes, the anonymous policy, browser POST
/// uploads refused, ACL and expected-owner headers (`acl`).
pub fn check_request(
    policy: Policy,
    signed: bool,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    op: &str,
    now: SystemTime,
) -> S3Result<()> {
    if op == "PostObject" {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "browser-based POST uploads are not served by pages3; use PutObject",
        ));
    }
    if let Some(name) = headers
        .keys()
        .map(|k| k.as_str())
        .find(|k| is_sse_header(k))
    {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            format!(
                "server-side encryption ({name}) is not supported: pages3 stores and serves \
                 objects as they are sent; send the request without encryption headers"
            ),
        ));
    }
    if signed && is_sigv2(uri, headers) {
        if !policy.allow_sigv2 {
            return Err(sigv4_required());
        }
        let now = unix_now(now);
        if let Some(expires) = query_value(uri, "Expires") {
            // Presigned: an absolute expiry time (s3s checks that it is not past).
            let expires: i64 = expires.parse().map_err(|_| {
                S3Error::with_message(
                    S3ErrorCode::AuthorizationQueryParametersError,
                    "Expires is not a number of seconds since 1970",
                )
            })?;
            if expires.saturating_sub(now) > MAX_PRESIGNED_EXPIRY as i64 {
                return Err(S3Error::with_message(
                    S3ErrorCode::AuthorizationQueryParametersError,
                    "Expires must be at most a week (604800 seconds) from now",
                ));
            }
        } else {
            // Header-signed: every date the request carries must be near the server's clock,
            // so that a captured request cannot be replayed later.
            let mut any = false;
            for name in ["date", "x-amz-date"] {
                for v in headers.get_all(name) {
                    any = true;
                    let t = v
                        .to_str()
                        .ok()
                        .and_then(parse_http_date)
                        .ok_or_else(skewed)?;
                    if t.abs_diff(now) > MAX_SKEW.as_secs() {
                        return Err(skewed());
                    }
                }
            }
            if !any {
                return Err(skewed());
            }
        }
    }
    if let Some(expires) = query_value(uri, "X-Amz-Expires") {
        match expires.parse::<u64>() {
            Ok(n) if n <= MAX_PRESIGNED_EXPIRY => {}
            _ => {
                return Err(S3Error::with_message(
                    S3ErrorCode::AuthorizationQueryParametersError,
                    "X-Amz-Expires must be less than a week (in seconds); that is, the given \
                     X-Amz-Expires must be less than 604800 seconds",
                ))
            }
        }
    }
    if !signed {
        let read = matches!(method.as_str(), "GET" | "HEAD");
        match (policy.anonymous, read) {
            (true, true) => {}
            (true, false) => {
                return Err(S3Error::with_message(
                    S3ErrorCode::AccessDenied,
                    "Unsigned requests may only read; sign writes with the gateway's credentials",
                ))
            }
            (false, _) => {
                return Err(S3Error::with_message(
                    S3ErrorCode::AccessDenied,
                    "Signature is required (this gateway does not serve anonymous requests)",
                ))
            }
        }
    }
    super::acl::check_headers(op, headers)?;
    super::acl::check_expected_owner(headers)
}

/// Whether a request header asks for server-side encryption (SSE-S3, SSE-KMS, SSE-C, also for
/// a copy's source), which pages3 refuses rather than ignores.
pub fn is_sse_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("x-amz-server-side-encryption")
        || name.starts_with("x-amz-copy-source-server-side-encryption")
}

/// Parses an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`; `+0000` and `UTC` are accepted for
/// the zone, as clients send them) into seconds since 1970.
pub fn parse_http_date(s: &str) -> Option<i64> {
    let s = s.trim();
    let rest = match s.split_once(", ") {
        Some((_, r)) => r,
        None => s,
    };
    let mut it = rest.split_ascii_whitespace();
    let day: u32 = it.next()?.parse().ok()?;
    let month = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = it.next()?.parse().ok()?;
    let mut hms = it.next()?.split(':');
    let h: i64 = hms.next()?.parse().ok()?;
    let m: i64 = hms.next()?.parse().ok()?;
    let sec: i64 = hms.next()?.parse().ok()?;
    if hms.next().is_some() || !matches!(it.next()?, "GMT" | "UTC" | "+0000" | "Z") {
        return None;
    }
    if it.next().is_some()
        || !(1..=31).contains(&day)
        || !(1970..=9999).contains(&year)
        || h > 23
        || m > 59
        || sec > 60
        || h < 0
        || m < 0
        || sec < 0
    {
        return None;
    }
    // Days from the civil date (proleptic Gregorian).
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * mo as i64 + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + m * 60 + sec)
}

/// Refuses keys S3 refuses (over [`MAX_KEY_LEN`] bytes) and keys with a path segment no file
/// system under the cache can hold (over [`MAX_SEGMENT_LEN`] bytes).
pub fn check_key_len(key: &str) -> S3Result<()> {
    if key.len() > MAX_KEY_LEN {
        return Err(S3Error::with_message(
            S3ErrorCode::KeyTooLongError,
            format!("the key has {} bytes; the most is {MAX_KEY_LEN}", key.len()),
        ));
    }
    if let Some(seg) = key.split('/').find(|s| s.len() > MAX_SEGMENT_LEN) {
        return Err(S3Error::with_message(
            S3ErrorCode::KeyTooLongError,
            format!(
                "a path segment of the key has {} bytes; pagestore keys are file paths, whose \
                 segments may have at most {MAX_SEGMENT_LEN}",
                seg.len()
            ),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Digests

/// Decodes standard base64 (with padding); `None` if it is not.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim().as_bytes();
    if s.is_empty() || s.len() % 4 != 0 {
        return None;
    }
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let quads = s.len() / 4;
    for (qi, q) in s.chunks(4).enumerate() {
        let last = qi + 1 == quads;
        let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &q[..4 - pad] {
            n = n << 6 | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// The digest algorithms a PutObject or UploadPart may name.
const ALGORITHMS: [(&str, usize); 5] = [
    ("crc32", 4),
    ("crc32c", 4),
    ("sha1", 20),
    ("sha256", 32),
    ("crc64nvme", 8),
];

/// The index in the algorithms a request may name of the S3 `ChecksumAlgorithm` `name`
/// (`CRC32`, `CRC32C`, `SHA1`, `SHA256`, `CRC64NVME`; any case).
pub fn algorithm_index(name: &str) -> Option<usize> {
    ALGORITHMS
        .iter()
        .position(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// S3's name of algorithm `i` (`CRC32` ...).
pub fn algorithm_name(i: usize) -> String {
    ALGORITHMS
        .get(i)
        .map_or_else(String::new, |(n, _)| n.to_ascii_uppercase())
}

/// A hasher of algorithm `i` alone.
pub fn hasher_of(i: usize) -> ChecksumHasher {
    let mut h = ChecksumHasher::default();
    enable(&mut h, i);
    h
}

/// Makes `h` compute algorithm `i` (a new digest; one it computes already starts again).
fn enable(h: &mut ChecksumHasher, i: usize) {
    match i {
        0 => h.crc32 = Some(Default::default()),
        1 => h.crc32c = Some(Default::default()),
        2 => h.sha1 = Some(s3s::crypto::Sha1::new()),
        3 => h.sha256 = Some(s3s::crypto::Sha256::new()),
        _ => h.crc64nvme = Some(Default::default()),
    }
}

/// Algorithm `i`'s value (base64) in `c`.
pub fn value_at(c: s3s::dto::Checksum, i: usize) -> Option<String> {
    match i {
        0 => c.checksum_crc32,
        1 => c.checksum_crc32c,
        2 => c.checksum_sha1,
        3 => c.checksum_sha256,
        _ => c.checksum_crc64nvme,
    }
}

/// A multipart object's `COMPOSITE` checksum by algorithm `i`: the digest of its parts'
/// digests one after another, in base64, then `-` and the number of parts. `None` if a part's
/// value is not base64.
pub fn composite(i: usize, parts: &[&str]) -> Option<String> {
    let mut h = hasher_of(i);
    for p in parts {
        h.update(&base64_decode(p)?);
    }
    Some(format!("{}-{}", value_at(h.finalize(), i)?, parts.len()))
}

/// Whether `given`, a whole object's checksum named by a CompleteMultipartUpload (a composite
/// one with or without its `-N`), is `computed` (a composite one of `parts` parts ends in
/// `-N`).
pub fn same_object_checksum(given: &str, computed: &str, parts: usize) -> bool {
    let (value, count) = match given.trim().rsplit_once('-') {
        Some((v, n)) => (v, Some(n)),
        None => (given.trim(), None),
    };
    let computed = computed.rsplit_once('-').map_or(computed, |(v, _)| v);
    let want = base64_decode(value);
    want.is_some()
        && want == base64_decode(computed)
        && count.is_none_or(|n| n.parse() == Ok(parts))
}

/// Checks a body against the digests its request names (`Content-MD5`, `x-amz-checksum-*` as
/// headers, or as aws-chunked trailers announced by `x-amz-trailer`): `InvalidDigest` for a
/// `Content-MD5` that is not an MD5, `BadDigest` for a mismatch and for an `x-amz-checksum-*`
/// value that is not one of its algorithm (it cannot match; the conformance suite expects it).
pub struct Digests {
    /// The body's MD5 (always computed: S3's ETag of an object or part written in one piece).
    md5: Md5,
    /// `Content-MD5`, decoded.
    md5_expected: Option<Vec<u8>>,
    sums: ChecksumHasher,
    /// Expected values by algorithm index (from headers), decoded.
    expected: [Option<Vec<u8>>; 5],
    /// Algorithms whose value comes in a trailer.
    trailer: [bool; 5],
    /// Algorithms computed whether or not the request names them (a part of a multipart
    /// upload created with that algorithm).
    always: [bool; 5],
}

fn invalid_digest(what: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::InvalidDigest,
        format!("{what} is not a valid base64-encoded digest of the right length"),
    )
}

fn malformed_checksum(what: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::BadDigest,
        format!("{what} is not a base64-encoded checksum of its algorithm's length"),
    )
}

impl Digests {
    /// The digests `headers` name.
    pub fn from_headers(headers: &HeaderMap) -> S3Result<Digests> {
        let md5_expected = match headers.get("content-md5") {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(base64_decode)
                    .filter(|d| d.len() == 16)
                    .ok_or_else(|| invalid_digest("Content-MD5"))?,
            ),
        };
        let mut expected: [Option<Vec<u8>>; 5] = Default::default();
        let mut trailer = [false; 5];
        let announced: Vec<String> = headers
            .get_all("x-amz-trailer")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_ascii_lowercase())
            .collect();
        for (i, (name, len)) in ALGORITHMS.iter().enumerate() {
            let header = format!("x-amz-checksum-{name}");
            if let Some(v) = headers.get(header.as_str()) {
                let d = v
                    .to_str()
                    .ok()
                    .and_then(base64_decode)
                    .filter(|d| d.len() == *len)
                    .ok_or_else(|| malformed_checksum(&header))?;
                expected[i] = Some(d);
            }
            trailer[i] = announced.contains(&header);
        }
        let mut sums = ChecksumHasher::default();
        for i in 0..ALGORITHMS.len() {
            if expected[i].is_some() || trailer[i] {
                enable(&mut sums, i);
            }
        }
        Ok(Digests {
            md5: Md5::new(),
            md5_expected,
            sums,
            expected,
            trailer,
            always: [false; 5],
        })
    }

    /// Computes algorithm `i` too (its value comes back from [`Digests::verify`] whether or not
    /// the request named it).
    pub fn also_compute(&mut self, i: usize) {
        if i >= ALGORITHMS.len() || self.always[i] {
            return;
        }
        self.always[i] = true;
        if self.expected[i].is_none() && !self.trailer[i] {
            enable(&mut self.sums, i);
        }
    }

    /// Feeds body bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.md5.update(data);
        self.sums.update(data);
    }

    /// Compares the digests of everything fed with the expected ones (`trailers`: the
    /// aws-chunked trailers, once the body has ended), and returns the body's MD5 in hex and
    /// the checksums the request named, verified (and those [`Digests::also_compute`] added).
    pub fn verify(self, trailers: Option<&HeaderMap>) -> S3Result<(String, Checksums)> {
        let md5 = self.md5.finalize();
        if self.md5_expected.is_some_and(|want| md5[..] != want[..]) {
            return Err(S3Error::with_message(
                S3ErrorCode::BadDigest,
                "The Content-MD5 you specified did not match what was received",
            ));
        }
        let got = self.sums.finalize();
        let got = [
            got.checksum_crc32,
            got.checksum_crc32c,
            got.checksum_sha1,
            got.checksum_sha256,
            got.checksum_crc64nvme,
        ];
        let mut verified = Checksums::default();
        for (i, (name, len)) in ALGORITHMS.iter().enumerate() {
            let header = format!("x-amz-checksum-{name}");
            let mut want = self.expected[i].clone();
            if self.trailer[i] {
                let t = trailers
                    .and_then(|t| t.get(header.as_str()))
                    .ok_or_else(|| {
                        S3Error::with_message(
                            S3ErrorCode::InvalidRequest,
                            format!("the trailer {header} was announced but not sent"),
                        )
                    })?;
                let d = t
                    .to_str()
                    .ok()
                    .and_then(base64_decode)
                    .filter(|d| d.len() == *len)
                    .ok_or_else(|| malformed_checksum(&header))?;
                if want.as_ref().is_some_and(|w| *w != d) {
                    return Err(bad_checksum(name));
                }
                want = Some(d);
            }
            let Some(want) = want else {
                if self.always[i] {
                    verified.values[i] = got[i].clone();
                }
                continue;
            };
            let computed = got[i].as_deref().and_then(base64_decode);
            if computed.as_deref() != Some(&want[..]) {
                return Err(bad_checksum(name));
            }
            verified.values[i] = got[i].clone();
        }
        Ok((hex(&md5), verified))
    }
}

/// The checksums (base64, as S3 gives them) of an object or part that its writer named and the
/// gateway verified or computed, by algorithm: CRC32, CRC32C, SHA-1, SHA-256, CRC64NVME.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checksums {
    /// By algorithm, in that order.
    pub values: [Option<String>; 5],
    /// The checksum of a multipart object's parts' checksums (S3's `COMPOSITE`, `...-N`), not
    /// of its bytes (`FULL_OBJECT`).
    pub composite: bool,
}

impl Checksums {
    /// Algorithm `i`'s `value` alone.
    pub fn one(i: usize, value: String, composite: bool) -> Checksums {
        let mut c = Checksums {
            composite,
            ..Checksums::default()
        };
        if let Some(v) = c.values.get_mut(i) {
            *v = Some(value);
        }
        c
    }

    /// S3's `ChecksumType` of these checksums (`None`: none kept).
    pub fn checksum_type(&self) -> Option<s3s::dto::ChecksumType> {
        self.values.iter().any(Option::is_some).then(|| {
            s3s::dto::ChecksumType::from_static(if self.composite {
                s3s::dto::ChecksumType::COMPOSITE
            } else {
                s3s::dto::ChecksumType::FULL_OBJECT
            })
        })
    }

    /// As S3's `Checksum` element (`None`: no checksum kept).
    pub fn to_checksum(&self) -> Option<s3s::dto::Checksum> {
        let [crc32, crc32c, sha1, sha256, crc64nvme] = self.values.clone();
        let checksum_type = Some(self.checksum_type()?);
        Some(s3s::dto::Checksum {
            checksum_crc32: crc32,
            checksum_crc32c: crc32c,
            checksum_sha1: sha1,
            checksum_sha256: sha256,
            checksum_crc64nvme: crc64nvme,
            checksum_type,
        })
    }
}

/// 400 BadDigest: the `name` checksum named is not the one computed.
pub fn bad_checksum(name: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::BadDigest,
        format!(
            "The {} you specified did not match the calculated checksum",
            name.to_ascii_uppercase()
        ),
    )
}

// ---------------------------------------------------------------------------------------------
// aws-chunked framing

/// Whether the request body is aws-chunked (s3s decodes it; see [`ChunkedCheck`]).
pub fn is_aws_chunked(headers: &HeaderMap) -> bool {
    headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("STREAMING-"))
}

/// The decoded length an aws-chunked request declares.
pub fn decoded_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("x-amz-decoded-content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

#[derive(Debug)]
enum Framing {
    /// Reading a chunk's size line (bytes so far).
    Meta(Vec<u8>),
    /// Skipping this many bytes of chunk data and its CRLF.
    Data(u64),
    /// The final 0-size chunk was seen (trailers may follow).
    Done,
    /// Not aws-chunked framing as expected: s3s reports the error.
    Broken,
}

/// Longest chunk size line accepted (s3s accepts 4 KiB too).
const MAX_META: usize = 4096;

/// Follows the framing of an aws-chunked body as it passes (to s3s, which decodes it) and
/// fails the body at its end if the final 0-size chunk never came: s3s takes a body cut at a
/// chunk boundary for a complete one.
pub struct ChunkedCheck<B> {
    inner: B,
    state: Framing,
}

impl<B> ChunkedCheck<B> {
    /// Wraps the raw (still aws-chunked) body.
    pub fn new(inner: B) -> ChunkedCheck<B> {
        ChunkedCheck {
            inner,
            state: Framing::Meta(Vec::new()),
        }
    }

    /// Whether the final chunk was seen.
    pub fn complete(&self) -> bool {
        matches!(self.state, Framing::Done | Framing::Broken)
    }

    /// Follows `data`.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match &mut self.state {
                Framing::Done | Framing::Broken => return,
                Framing::Data(left) => {
                    let n = (*left).min(data.len() as u64);
                    *left -= n;
                    data.advance(n as usize);
                    if *left == 0 {
                        self.state = Framing::Meta(Vec::new());
                    }
                }
                Framing::Meta(line) => {
                    let (piece, end) = match data.iter().position(|&b| b == b'\n') {
                        Some(i) => (&data[..=i], true),
                        None => (data, false),
                    };
                    line.extend_from_slice(piece);
                    data.advance(piece.len());
                    if line.len() > MAX_META {
                        self.state = Framing::Broken;
                        return;
                    }
                    if end {
                        self.state = match chunk_size(line) {
                            Some(0) => Framing::Done,
                            Some(n) => Framing::Data(n.saturating_add(2)),
                            None => Framing::Broken,
                        };
                    }
                }
            }
        }
    }
}

/// The size in a chunk size line (`hex[;extensions]\r\n`).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\n")?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let hex = match line.iter().position(|&b| b == b';') {
        Some(i) => &line[..i],
        None => line,
    };
    if hex.is_empty() || hex.len() > 16 {
        return None;
    }
    let s = std::str::from_utf8(hex).ok()?;
    u64::from_str_radix(s.trim(), 16).ok()
}

impl<B> Body for ChunkedCheck<B>
where
    B: Body<Data = Bytes, Error = io::Error> + Unpin,
{
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.feed(d);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) if !this.complete() => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the aws-chunked body ended without its final 0-size chunk",
            )))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.complete()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Bytes in lower-case hex (an MD5 as an ETag shows it).
pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_malformed_md5_is_invalid_a_malformed_checksum_does_not_match() {
        let code = |name: &str, value: &str| {
            let mut m = HeaderMap::new();
            m.insert(
                hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
            Digests::from_headers(&m).err().map(|e| e.code().clone())
        };
        assert_eq!(
            code("content-md5", "AAAA"),
            Some(S3ErrorCode::InvalidDigest)
        );
        for (name, _) in ALGORITHMS {
            let header = format!("x-amz-checksum-{name}");
            assert_eq!(code(&header, "bad"), Some(S3ErrorCode::BadDigest), "{name}");
            assert_eq!(
                code(&header, "AAAA"),
                Some(S3ErrorCode::BadDigest),
                "{name}"
            );
        }
        // Well-formed values are taken (they are compared with the body later).
        assert!(code("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==").is_none());
        assert!(code("x-amz-checksum-crc32", "AAAAAA==").is_none());
    }

    #[test]
    fn regions_that_are_no_region_are_found_in_both_signatures() {
        let h = |auth: &str| {
            let mut m = HeaderMap::new();
            m.insert(hyper::header::AUTHORIZATION, auth.parse().unwrap());
            m
        };
        let uri: Uri = "/b/k".parse().unwrap();
        let auth = |region: &str| {
            format!(
                "AWS4-HMAC-SHA256 Credential=KEY/20261203/{region}/s3/aws4_request, \
                 SignedHeaders=host, Signature=00"
            )
        };
        assert_eq!(malformed_region(&uri, &h(&auth("US"))), Some("US".into()));
        assert_eq!(malformed_region(&uri, &h(&auth("us-east-1"))), None);
        assert_eq!(malformed_region(&uri, &h(&auth(""))), Some(String::new()));
        assert_eq!(malformed_region(&uri, &h("AWS KEY:sig")), None);
        assert_eq!(malformed_region(&uri, &HeaderMap::new()), None);
        let presigned: Uri =
            "/b/k?X-Amz-Credential=KEY%2F20261203%2FEU%2Fs3%2Faws4_request&X-Amz-Expires=60"
                .parse()
                .unwrap();
        assert_eq!(
            malformed_region(&presigned, &HeaderMap::new()),
            Some("EU".into())
        );
        let fine: Uri = "/b/k?X-Amz-Credential=KEY%2F20261203%2Feu-west-1%2Fs3%2Faws4_request"
            .parse()
            .unwrap();
        assert_eq!(malformed_region(&fine, &HeaderMap::new()), None);
    }

    #[test]
    fn http_dates_parse() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 +0000"), Some(0));
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2028 23:59:59 GMT"),
            Some(1_835_481_599)
        );
        for bad in [
            "",
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 1994 25:00:00 GMT",
            "Sun, 06 Nov 1994 08:49:37 PST",
        ] {
            assert_eq!(parse_http_date(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn base64_round_trips_and_junk_is_refused() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8h").unwrap(), b"hello!");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("aA==").unwrap(), b"h");
        for bad in ["", "a", "aGVsbG8", "aGVs=G8=", "a===", "@@@@"] {
            assert!(base64_decode(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn framing_needs_the_final_chunk() {
        let mut c = ChunkedCheck::new(());
        c.feed(b"5;chunk-signature=ab\r\nhel");
        assert!(!c.complete());
        c.feed(b"lo\r\n");
        assert!(!c.complete());
        c.feed(b"0;chunk-signature=cd\r\n\r\n");
        assert!(c.complete());
        let mut c = ChunkedCheck::new(());
        c.feed(b"3\r\nabc\r\n");
        assert!(!c.complete(), "cut after a data chunk");
        c.feed(b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n");
        assert!(c.complete());
    }

    #[test]
    fn long_keys_are_refused() {
        assert!(check_key_len(&"a".repeat(255)).is_ok());
        let e = check_key_len(&"a".repeat(256)).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::KeyTooLongError);
        let long = vec!["a".repeat(200); 6].join("/");
        let e = check_key_len(&long).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::KeyTooLongError);
    }

    #[test]
    fn sigv2_requests_to_a_bucket_are_verified_with_its_resource_as_clients_sign_it() {
        let mut v2 = HeaderMap::new();
        v2.insert("authorization", "AWS KEY:c2ln".parse().unwrap());
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        let fixed = |u: &str, h: &HeaderMap| sigv2_bucket_uri(&uri(u), h).map(|u| u.to_string());
        assert_eq!(fixed("/b", &v2).as_deref(), Some("/b/"));
        assert_eq!(
            fixed("/b?list-type=2&prefix=a%2F", &v2).as_deref(),
            Some("/b/?list-type=2&prefix=a%2F")
        );
        assert_eq!(
            fixed(
                "/b?Signature=x&Expires=1&AWSAccessKeyId=KEY",
                &HeaderMap::new()
            )
            .as_deref(),
            Some("/b/?Signature=x&Expires=1&AWSAccessKeyId=KEY")
        );
        // Keys, the bucket list, paths that have the slash, and SigV4 stay as they are.
        for u in ["/b/", "/b/k", "/", "/b/k/"] {
            assert_eq!(fixed(u, &v2), None, "{u}");
        }
        let mut v4 = HeaderMap::new();
        v4.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=KEY/20261206/us-east-1/s3/aws4_request, \
             SignedHeaders=host, Signature=00"
                .parse()
                .unwrap(),
        );
        assert_eq!(fixed("/b", &v4), None);
        assert_eq!(fixed("/b", &HeaderMap::new()), None);
    }

    #[test]
    fn sigv2_is_refused_unless_allowed_and_then_held_to_the_clock() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let get = Method::GET;
        let uri: Uri = "/b/k".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert("authorization", "AWS key:c2ln".parse().unwrap());
        h.insert("date", "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap());
        let strict = Policy {
            anonymous: false,
            allow_sigv2: false,
        };
        let loose = Policy {
            allow_sigv2: true,
            ..strict
        };
        let e = check_request(strict, true, &get, &uri, &h, "GetObject", now).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidRequest);
        check_request(loose, true, &get, &uri, &h, "GetObject", now).unwrap();
        let later = now + Duration::from_secs(16 * 60);
        let e = check_request(loose, true, &get, &uri, &h, "GetObject", later).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::RequestTimeTooSkewed);
        // A fresh Date next to a stale x-amz-date does not help.
        h.insert(
            "x-amz-date",
            "Sun, 06 Nov 1994 07:00:00 GMT".parse().unwrap(),
        );
        let e = check_request(loose, true, &get, &uri, &h, "GetObject", now).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::RequestTimeTooSkewed);
        let v4: Uri = "/b/k?X-Amz-Expires=604801&X-Amz-Signature=00"
            .parse()
            .unwrap();
        let e = check_request(strict, true, &get, &v4, &HeaderMap::new(), "GetObject", now)
            .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::AuthorizationQueryParametersError);
    }
}
