//! Feeds arbitrary bytes, read as an S3 request (method and target, headers, body), to the
//! request checks of the `pages3` gateway. Nothing may panic.

#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::s3_request(data));
