//! A real cluster for tests: see `pagestore_testkit::fixture`.
#![allow(dead_code, unused_imports)]

pub use pagestore_testkit::fixture::{bytes, settings, Cluster};

pub const PAGESTORED: &str = env!("CARGO_BIN_EXE_pagestored");
pub const PAGECTL: &str = env!("CARGO_BIN_EXE_pagectl");
