//! The `pagestored` daemon ([`daemon`]), its admin endpoint and metrics, and what `pagectl`
//! needs beside the client library (preload jobs, cache rules).

pub mod admin;
pub mod daemon;
pub mod load;
pub mod metrics;
pub mod rules;
pub mod top;
pub mod writeback;
