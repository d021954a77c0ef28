//! The bodies of the fuzz targets, as plain functions: the cargo-fuzz targets in
//! `fuzz_targets/` call them, and so does the bounded smoke run on stable Rust
//! (`tools/pagestore/tests/fuzz_smoke.rs`). Each must not panic, whatever the input.

use pagestore_protocol::frame::{
    decode_counters, decode_hot_report, decode_job_record, decode_job_records, decode_request,
    decode_request_frame, decode_request_head, decode_response, decode_response_frame,
    encode_counters, encode_hot_report, encode_job_record, encode_job_records, encode_request,
    encode_response, Preamble, RequestBody, ResponseBody, PREAMBLE_LEN,
};

/// Frame decoders of `pagestore_protocol::frame`: anything that decodes must re-encode, and
/// so must the record a `Counters`, `Jobs` or `Hot` payload carries.
pub fn decode_frame(data: &[u8]) {
    if let Ok((request, payload)) = decode_request_frame(data) {
        let payload_len = u32::try_from(payload.len()).expect("payload fits u32");
        let mut out = Vec::new();
        encode_request(&request, payload_len, &mut out).expect("decoded request re-encodes");
        if request.body == RequestBody::Jobs && !payload.is_empty() {
            job_record(&data[payload]);
        }
    }
    if let Ok((response, payload)) = decode_response_frame(data) {
        let payload_len = u32::try_from(payload.len()).expect("payload fits u32");
        let mut out = Vec::new();
        encode_response(&response, payload_len, &mut out).expect("decoded response re-encodes");
        match response.body {
            ResponseBody::Counters => counters(&data[payload]),
            ResponseBody::Jobs => job_records(&data[payload]),
            ResponseBody::Hot => hot_report(&data[payload]),
            _ => {}
        }
    }
    // The two-step path a stream reader takes: preamble first, then however
    // many header bytes arrived (possibly fewer than announced).
    if let Ok(preamble) = Preamble::decode_prefix(data) {
        let rest = &data[PREAMBLE_LEN..];
        let header = &rest[..rest.len().min(preamble.header_len as usize)];
        let _ = decode_request(&preamble, header);
        let _ = decode_response(&preamble, header);
        // A shard that received the payload apart from the head decodes the same request,
        // or fails as the whole frame does.
        let head = data.len().min(preamble.payload_range().start);
        let apart = decode_request_head(&data[..head], data.len() - head);
        let whole = decode_request_frame(data).map(|(request, _)| request);
        assert_eq!(apart.is_ok(), whole.is_ok(), "{apart:?} / {whole:?}");
        if let (Ok(a), Ok(w)) = (apart, whole) {
            assert_eq!(a, w);
        }
    }
}

/// The payload decoders of `Counters`, `Jobs` and `Hot` on their own: anything that decodes
/// re-encodes, and what that encodes to decodes and encodes to the same bytes.
pub fn decode_payload(data: &[u8]) {
    counters(data);
    job_record(data);
    job_records(data);
    hot_report(data);
}

fn hot_report(payload: &[u8]) {
    if let Ok(r) = decode_hot_report(payload) {
        let bytes = encode_hot_report(&r).expect("decoded hot report re-encodes");
        let again = decode_hot_report(&bytes).expect("re-encoded hot report decodes");
        assert_eq!(encode_hot_report(&again).ok(), Some(bytes));
    }
}

fn counters(payload: &[u8]) {
    if let Ok(c) = decode_counters(payload) {
        let bytes = encode_counters(&c).expect("decoded counters re-encode");
        let again = decode_counters(&bytes).expect("re-encoded counters decode");
        assert_eq!(again, c);
    }
}

fn job_record(payload: &[u8]) {
    if let Ok(r) = decode_job_record(payload) {
        let bytes = encode_job_record(&r).expect("decoded job record re-encodes");
        let again = decode_job_record(&bytes).expect("re-encoded job record decodes");
        assert_eq!(encode_job_record(&again).ok(), Some(bytes));
    }
}

fn job_records(payload: &[u8]) {
    if let Ok(r) = decode_job_records(payload) {
        let bytes = encode_job_records(&r).expect("decoded job records re-encode");
        let again = decode_job_records(&bytes).expect("re-encoded job records decode");
        assert_eq!(encode_job_records(&again).ok(), Some(bytes));
    }
}

/// The S3 gateway's request checks (`pages3::fuzz_request`: method, target, headers, body).
pub fn s3_request(data: &[u8]) {
    pages3::fuzz_request(data);
}

/// `pagectl load`'s manifest parser (plain lines and JSON lines): every path it returns is
/// absolute.
pub fn manifest(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(paths) = pagestore_tools::load::parse_manifest(&text) {
        assert!(paths.iter().all(|p| p.starts_with('/')), "{paths:?}");
    }
}
