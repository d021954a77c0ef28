//! The fuzzing entry of the gateway's request checks.

use std::time::{Duration, SystemTime};

use hyper::{HeaderMap, Method, Uri};

use super::{
    checks::{self, ChunkedCheck, Digests, Policy},
    keys::{check_segments, decode_token, key_path, percent_decode, url_encode},
    read::chunks,
    valid_bucket,
};

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
