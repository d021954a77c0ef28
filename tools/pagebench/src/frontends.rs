//! The self-contained setups: a local cluster of real `pagestored` processes over the dataset
//! directory, warmed, with a `pagefs` mount or a `pages3` gateway in front of it. Everything
//! started here is stopped (and unmounted) when dropped.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::{stream, StreamExt};
use pagestore_cli::ClusterArgs;
use pagestore_client::{Client, ClientOptions};
use pagestore_testkit::local_cluster::{LocalCluster, Settings};

use crate::{
    bench::{stat_all, Catalog},
    Opts,
};

/// The logical prefix the self-contained cluster mounts the dataset at (and the S3 bucket
/// name through pages3).
pub const PREFIX: &str = "/bench";

/// One of pagestore's binaries (`pagestored`, `pagefs`, `pages3`): `$NAME` (upper case) if set, else next to this executable.
pub fn tool_binary(name: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(name.to_uppercase()) {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    let p = exe.with_file_name(name);
    if p.exists() {
        Ok(p)
    } else {
        Err(anyhow!(
            "{} not found: build it first (cargo build --release --workspace --bins) or set {}",
            p.display(),
            name.to_uppercase()
        ))
    }
}

fn log_level() -> String {
    std::env::var("PAGESTORE_LOG").unwrap_or_else(|_| "warn".into())
}

/// A local cluster over a dataset directory, and a client of it.
pub struct Stack {
    /// The nodes.
    pub cluster: LocalCluster,
    /// A client (also the source of the hit counters).
    pub client: Arc<Client>,
    /// Where the nodes keep their caches.
    pub nodes_dir: PathBuf,
}

impl Stack {
    /// Starts `nodes` nodes (`--shards` shards, `--page-size` pages each) over `dataset`
    /// mounted at [`PREFIX`], with room for every page of `sizes` (files of these sizes; a
    /// page takes a whole slot of the page size however short it is).
    pub fn start(
        o: &Opts,
        work: &Path,
        dataset: &Path,
        nodes: usize,
        sizes: impl Iterator<Item = u64>,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Stack> {
        Stack::start_with(o, work, dataset, nodes, sizes, Vec::new(), rt)
    }

    /// [`Stack::start`] with `more_mounts` (`PREFIX=URL`) beside the dataset's.
    pub fn start_with(
        o: &Opts,
        work: &Path,
        dataset: &Path,
        nodes: usize,
        sizes: impl Iterator<Item = u64>,
        more_mounts: Vec<String>,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Stack> {
        let page = u64::from(o.page_size).max(1);
        // The descriptor takes a page too.
        let bytes = sizes.map(|s| s.div_ceil(page).max(1) * page).sum::<u64>() + page;
        let binary = tool_binary("pagestored")?;
        let nodes_dir = work.join("nodes");
        let _ = std::fs::remove_dir_all(&nodes_dir);
        let dataset =
            std::fs::canonicalize(dataset).with_context(|| dataset.display().to_string())?;
        let url = crate::bench::with_emulation(&format!("file://{}", dataset.display()), o);
        let mut s = Settings::new(&binary, &nodes_dir);
        s.nodes = nodes.max(1);
        s.shards = u16::try_from(o.shards).map_err(|_| anyhow!("--shards: too many"))?;
        s.page_size = o.page_size.to_string();
        // Hash placement is within a few percent of even; leave room for it and the metadata.
        let per_node = bytes / s.nodes as u64 * 5 / 4 + (256 << 20);
        check_space(work, per_node * s.nodes as u64)?;
        s.cache_size = per_node.to_string();
        s.mounts = vec![format!("{PREFIX}={url}")];
        s.mounts.extend(more_mounts);
        s.metadata_ttl = "600".into();
        // Every read of a page goes to its owner: the front ends are compared on one path, and
        // a warm run is all hits. Hot-page replicas would copy re-read pages to other nodes
        // (a miss at each) part-way through a run; `fanout` measures them.
        s.extra = vec!["--hot-replicas".into(), "1".into()];
        let cluster = LocalCluster::start(s).map_err(anyhow::Error::msg)?;
        let client = rt
            .block_on(cluster.client(ClientOptions::default()))
            .map_err(anyhow::Error::msg)?;
        Ok(Stack {
            cluster,
            client,
            nodes_dir,
        })
    }

    /// The node processes' ids.
    pub fn pids(&self) -> Vec<u32> {
        self.cluster
            .nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect()
    }

    /// Loads every file of `cat` into the cache (as `pagectl load` does): seconds taken.
    pub fn warm(&self, cat: &Catalog, rt: &tokio::runtime::Runtime) -> Result<f64> {
        let t0 = Instant::now();
        let client = self.client.clone();
        rt.block_on(async {
            let infos = stat_all(cat, PREFIX, |p| {
                let c = client.clone();
                async move { Ok(c.stat(&p).await?) }
            })
            .await?;
            let results: Vec<Result<()>> = stream::iter(infos)
                .map(|info| {
                    let c = client.clone();
                    async move {
                        c.load(&info)
                            .await
                            .map(|_| ())
                            .with_context(|| format!("loading {}", info.path))
                    }
                })
                .buffer_unordered(8)
                .collect()
                .await;
            results.into_iter().collect::<Result<()>>()
        })?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// Fails with advice when the file system under `dir` has less than `need` bytes free.
pub(crate) fn check_space(dir: &Path, need: u64) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| anyhow!("{}: a path with a NUL byte", dir.display()))?;
    // SAFETY: statvfs is plain data, filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Ok(());
    }
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    if need > free {
        bail!(
            "the nodes' caches need {:.1} GB on {} and {:.1} GB are free: every file takes at \
             least one page of cache (--page-size), so use smaller pages or fewer or smaller \
             files, or another --dir",
            need as f64 / 1e9,
            dir.display(),
            free as f64 / 1e9
        );
    }
    Ok(())
}

impl Drop for Stack {
    fn drop(&mut self) {
        for i in 0..self.cluster.nodes.len() {
            self.cluster.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.nodes_dir);
    }
}

fn is_mounted(mp: &Path) -> bool {
    let want = mp.display().to_string();
    std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
    })
}

fn lazy_unmount(mp: &Path) {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(mp)
        .stderr(Stdio::null())
        .status();
    if is_mounted(mp) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mp)
            .stderr(Stdio::null())
            .status();
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(p, sig) };
    }
}

/// Waits for a line starting with `prefix` on the child's standard output; returns the rest.
fn wait_line(child: &mut Child, prefix: &'static str, what: &str) -> Result<String> {
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix(prefix) {
                let _ = tx.send(rest.trim().to_string());
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(rest) => return Ok(rest),
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!("{what} exited before it was ready ({status})");
                }
            }
            Err(_) => bail!("{what} did not say it was ready within 30 s"),
        }
    }
}

/// A running `pagefs`; dropping it stops it and makes sure nothing stays mounted.
pub struct FuseMount {
    child: Option<Child>,
    /// The mount point.
    pub mp: PathBuf,
    /// Its process id.
    pub pid: u32,
}

impl FuseMount {
    /// Mounts the cluster at `mp` (created if needed; must be empty).
    pub fn start(cluster: &LocalCluster, mp: &Path, threads: Option<usize>) -> Result<FuseMount> {
        let binary = tool_binary("pagefs")?;
        if let Err(e) = std::fs::metadata(mp) {
            if e.raw_os_error() == Some(libc::ENOTCONN) {
                // A mount left behind by a killed run.
                lazy_unmount(mp);
            }
        }
        std::fs::create_dir_all(mp).with_context(|| mp.display().to_string())?;
        let mp = std::fs::canonicalize(mp).with_context(|| mp.display().to_string())?;
        if is_mounted(&mp) {
            bail!(
                "{} is already a mount point; unmount it first (umount -l {0})",
                mp.display()
            );
        }
        let mut cmd = Command::new(&binary);
        cmd.arg(&mp)
            .arg("--cluster")
            .arg(&cluster.members)
            .arg("--tls-dir")
            .arg(&cluster.ca_dir);
        if let Some(t) = threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        let mut child = cmd
            .env("PAGESTORE_LOG", log_level())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| binary.display().to_string())?;
        let pid = child.id();
        let mut m = FuseMount {
            child: None,
            mp,
            pid,
        };
        let ready = wait_line(&mut child, "ready", "pagefs");
        m.child = Some(child);
        ready.map_err(|e| anyhow!("{e:#} (pagefs needs root and /dev/fuse)"))?;
        Ok(m)
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(&self.mp) {
            lazy_unmount(&self.mp);
        }
    }
}

/// A running `pages3`; killed when dropped.
pub struct Gateway {
    child: Child,
    /// `http://IP:PORT`.
    pub endpoint: String,
    /// Its process id.
    pub pid: u32,
}

impl Gateway {
    /// Starts a gateway in front of `cluster` that takes requests signed with `key`/`secret`.
    pub fn start(
        cluster: &LocalCluster,
        key: &str,
        secret: &str,
        staging: &Path,
    ) -> Result<Gateway> {
        let binary = tool_binary("pages3")?;
        let mut child = Command::new(&binary)
            .args(["--listen", "127.0.0.1:0", "--cluster"])
            .arg(&cluster.members)
            .arg("--tls-dir")
            .arg(&cluster.ca_dir)
            .arg("--staging-dir")
            .arg(staging)
            .args(["--access-key", key, "--secret-key", secret])
            .env("PAGESTORE_LOG", log_level())
            .env_remove("PAGES3_ACCESS_KEY")
            .env_remove("PAGES3_SECRET_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| binary.display().to_string())?;
        let pid = child.id();
        match wait_line(&mut child, "ready ", "pages3") {
            Ok(endpoint) => Ok(Gateway {
                child,
                endpoint,
                pid,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The mount-table URL of an S3 endpoint: `s3://BUCKET/PREFIX?endpoint=..&region=..` with the
/// credentials (if given) as query parameters.
pub fn s3_url(
    endpoint: &str,
    bucket: &str,
    prefix: &str,
    region: &str,
    key: Option<&str>,
    secret: Option<&str>,
) -> String {
    let mut url = format!(
        "s3://{bucket}/{}?endpoint={}&region={}",
        prefix.trim_matches('/'),
        encode(endpoint),
        encode(region)
    );
    if let (Some(k), Some(s)) = (key, secret) {
        url.push_str(&format!(
            "&access_key_id={}&secret_access_key={}",
            encode(k),
            encode(s)
        ));
    }
    url
}

/// Connects to an external cluster (`--cluster`, `--tls-dir` and the other client options).
pub async fn connect(cluster: &ClusterArgs) -> Result<Arc<Client>> {
    cluster
        .connect(None)
        .await
        .with_context(|| format!("--cluster {}", cluster.cluster()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_encode_what_the_query_needs() {
        let u = s3_url(
            "http://127.0.0.1:9/",
            "b",
            "/p/q/",
            "us-east-1",
            Some("k"),
            Some("a+b/c="),
        );
        assert_eq!(
            u,
            "s3://b/p/q?endpoint=http%3A%2F%2F127.0.0.1%3A9%2F&region=us-east-1&access_key_id=k\
             &secret_access_key=a%2Bb%2Fc%3D"
        );
    }
}
