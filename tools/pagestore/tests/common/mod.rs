//! A real cluster for tests: `pagestored` processes on 127.0.0.1 (see
//! `pagestore_testkit::local_cluster`), in a temporary directory removed afterwards.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use pagestore_client::{Client, ClientOptions};
use pagestore_testkit::local_cluster::{LocalCluster, Settings};

pub const PAGESTORED: &str = env!("CARGO_BIN_EXE_pagestored");
pub const PAGECTL: &str = env!("CARGO_BIN_EXE_pagectl");

pub struct Cluster {
    pub inner: LocalCluster,
    pub dir: tempfile::TempDir,
}

impl std::ops::Deref for Cluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.inner
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.inner
    }
}

/// Settings for a cluster in a fresh directory under `/var/tmp` (O_DIRECT-capable, unlike
/// tmpfs), or under `PAGESTORE_TEST_DIR`.
pub fn settings() -> (tempfile::TempDir, Settings) {
    let base = std::env::var("PAGESTORE_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).unwrap();
    let s = Settings::new(PAGESTORED, dir.path());
    (dir, s)
}

impl Cluster {
    pub fn start(dir: tempfile::TempDir, s: Settings) -> Cluster {
        Cluster {
            inner: LocalCluster::start(s).unwrap(),
            dir,
        }
    }

    pub fn start_node(&mut self, i: usize) {
        self.inner.start_node(i).unwrap();
    }

    pub async fn client(&self, options: ClientOptions) -> Arc<Client> {
        self.inner.client(options).await.unwrap()
    }

    pub async fn hits_and_misses(&self, _client: &Client) -> (u64, u64) {
        self.inner.hits_and_misses().await.unwrap()
    }

    pub fn terminate(&mut self, i: usize) -> std::process::ExitStatus {
        self.inner.terminate(i).unwrap()
    }

    pub fn pagectl(&self, args: &[&str]) -> std::process::Output {
        self.inner.pagectl(PAGECTL.as_ref(), args).unwrap()
    }
}

/// Deterministic pseudo-random bytes.
#[allow(unused_imports)]
pub use pagestore_testkit::data::bytes;
