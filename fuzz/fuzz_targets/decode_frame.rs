//! Feeds arbitrary bytes to the frame decoders of `pagestore_net::frame`.
//!
//! The decoders must never panic, whatever the input. Anything that does
//! decode must be a valid message: it re-encodes without error.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagestore_net::frame::{
    decode_request, decode_request_frame, decode_response, decode_response_frame,
    encode_request, encode_response, Preamble, PREAMBLE_LEN,
};

fuzz_target!(|data: &[u8]| {
    if let Ok((request, payload)) = decode_request_frame(data) {
        let payload_len = u32::try_from(payload.len()).expect("payload fits u32");
        let mut out = Vec::new();
        encode_request(&request, payload_len, &mut out).expect("decoded request re-encodes");
    }
    if let Ok((response, payload)) = decode_response_frame(data) {
        let payload_len = u32::try_from(payload.len()).expect("payload fits u32");
        let mut out = Vec::new();
        encode_response(&response, payload_len, &mut out).expect("decoded response re-encodes");
    }
    // The two-step path a stream reader takes: preamble first, then however
    // many header bytes arrived (possibly fewer than announced).
    if let Ok(preamble) = Preamble::decode_prefix(data) {
        let rest = &data[PREAMBLE_LEN..];
        let header = &rest[..rest.len().min(preamble.header_len as usize)];
        let _ = decode_request(&preamble, header);
        let _ = decode_response(&preamble, header);
    }
});
