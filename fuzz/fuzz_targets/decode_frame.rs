//! Feeds arbitrary bytes to the frame decoders of `pagestore_protocol::frame`.
//!
//! The decoders must never panic, whatever the input. Anything that does
//! decode must be a valid message: it re-encodes without error.

#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::decode_frame(data));
