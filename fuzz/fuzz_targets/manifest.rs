//! Feeds arbitrary bytes to `pagectl load`'s manifest parser (plain lines and JSON lines).
//! It must not panic, and every path it accepts is absolute.

#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::manifest(data));
