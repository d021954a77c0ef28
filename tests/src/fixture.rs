//! The cluster the integration tests of the binaries share: `pagestored` processes on 127.0.0.1
//! (see [`crate::local_cluster`]) in a temporary directory removed afterwards, with panicking
//! helpers (a test that cannot start its cluster has failed).
//!
//! The binaries are found next to the running test's own target directory, where cargo puts
//! every binary of the workspace that `cargo test --workspace` builds.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use pagestore_client::{Client, ClientOptions};

use crate::local_cluster::{LocalCluster, Settings};

/// A workspace binary (`pagestored`, `pagectl`, `pagefs`, `pages3`) in the target directory
/// of the running test (`target/debug/NAME` for `target/debug/deps/TEST-HASH`). Panics with
/// the command that builds it when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test executable lives in target/PROFILE/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: `cargo test --workspace` builds it (or `cargo build --workspace \
         --bins`)",
        path.display()
    );
    path
}

/// A started cluster and the directory that holds it (removed when the cluster is dropped).
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

/// Settings for a cluster of `pagestored` processes in a fresh directory under `/var/tmp`
/// (O_DIRECT-capable, unlike tmpfs), or under `PAGESTORE_TEST_DIR`.
pub fn settings() -> (tempfile::TempDir, Settings) {
    let base = std::env::var("PAGESTORE_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).unwrap();
    let s = Settings::new(binary("pagestored"), dir.path());
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

    /// The index of the node with a shard at `addr`.
    pub fn node_of(&self, addr: std::net::SocketAddr) -> usize {
        self.nodes
            .iter()
            .position(|n| {
                n.base.ip() == addr.ip()
                    && (n.base.port()..n.base.port() + self.shards).contains(&addr.port())
            })
            .unwrap()
    }

    pub async fn hits_and_misses(&self, _client: &Client) -> (u64, u64) {
        self.inner.hits_and_misses().await.unwrap()
    }

    pub fn terminate(&mut self, i: usize) -> std::process::ExitStatus {
        self.inner.terminate(i).unwrap()
    }

    /// Runs `pagectl` against this cluster.
    pub fn pagectl(&self, args: &[&str]) -> std::process::Output {
        self.inner.pagectl(&binary("pagectl"), args).unwrap()
    }
}

pub use crate::data::bytes;
