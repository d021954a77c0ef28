//! Feeds arbitrary bytes to the payload decoders of `Counters`, `Jobs` and `Hot` frames
//! (`pagestore_protocol::frame::decode_counters`, `decode_job_record`, `decode_job_records`,
//! `decode_hot_report`).
//!
//! The decoders must never panic, whatever the input. Anything that does decode must be a
//! valid record: it re-encodes, and its encoding decodes again.

#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::decode_payload(data));
