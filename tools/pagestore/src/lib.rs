//! The `pagestored` daemon ([`daemon`]), its admin endpoint and metrics, and what `pagectl`
//! needs beside the client library (cache rules; preload jobs are `pagestore_cli::load`,
//! re-exported here as [`load`]).

pub mod admin;
pub mod daemon;
pub use pagestore_cli::load;
pub mod metrics;
pub mod rules;
pub mod top;
pub mod writeback;
