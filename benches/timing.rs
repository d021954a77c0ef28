#![allow(dead_code)] // each benchmark uses part of this module
//! A tiny timing helper shared by the micro-benchmarks (no external harness: each benchmark
//! prints nanoseconds per operation next to a reference measured in the same run).

use std::time::Instant;

/// True under `cargo bench`; under `cargo test` the benchmarks only run briefly (smoke).
pub fn full_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Runs `f` (which performs `ops_per_call` operations) until `budget_ms` have passed, after a
/// warm-up, and returns nanoseconds per operation (best of 5 rounds).
pub fn ns_per_op(ops_per_call: u64, mut f: impl FnMut()) -> f64 {
    let budget_ms = if full_run() { 200 } else { 5 };
    let mut best = f64::MAX;
    f();
    for _ in 0..5 {
        let t = Instant::now();
        let mut calls = 0u64;
        while t.elapsed().as_millis() < budget_ms {
            f();
            calls += 1;
        }
        let ns = t.elapsed().as_nanos() as f64 / (calls * ops_per_call) as f64;
        best = best.min(ns);
    }
    best
}

/// Prints one row: the measured operation, its reference and the ratio.
pub fn row(name: &str, ns: f64, reference: &str, ref_ns: f64) {
    println!(
        "{name:<44} {ns:>9.1} ns/op   {reference:<28} {ref_ns:>9.1} ns/op   ratio {:>6.2}",
        ns / ref_ns
    );
}

/// A small xorshift generator (deterministic inputs).
pub struct Rng(pub u64);

impl Rng {
    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
