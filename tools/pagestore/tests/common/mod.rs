//! A real cluster for tests: see `pagestore_testkit::fixture`.
#![allow(dead_code, unused_imports)]

pub use pagestore_testkit::fixture::{bytes, settings, Cluster};

pub const PAGESTORED: &str = env!("CARGO_BIN_EXE_pagestored");
pub const PAGECTL: &str = env!("CARGO_BIN_EXE_pagectl");

/// The sum over every node of the `/metrics` samples whose line starts with `prefix` (a
/// metric's name, with `{` to take only its labelled samples).
pub fn metric_total(c: &Cluster, prefix: &str) -> u64 {
    use pagestore_testkit::local_cluster::http_get;
    let mut n = 0;
    for node in &c.nodes {
        let (_, metrics) = http_get(node.admin.as_deref().unwrap(), "/metrics").unwrap();
        for line in metrics.lines().filter(|l| l.starts_with(prefix)) {
            n += line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64;
        }
    }
    n
}
