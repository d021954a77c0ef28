//! The Python package (`pagestore`) against real clusters of `pagestored` processes: the
//! extension module is built once per test run with maturin (`maturin develop`, the dev profile,
//! into the shared virtual environment, see `pagestore_testkit::python`), then pytest runs
//! `tests/py/` against it. The Python tests are the assertions: byte-exact reads of the
//! edge-case file set through fsspec (open/read/seek, cat_file, cat_ranges), listings, Parquet
//! through pandas and pyarrow, forked and spawned workers, preload and stats, errors as
//! exceptions; writes (tests/py/test_writes.py) to a write=back mount read back before and
//! after `pagestore.sync`, to a write=through one, and refused on a read-only one.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Instant,
};

use pagestore_testkit::{
    fixture::{self, Cluster},
    python,
};

/// The package's directory (`client/python`).
fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `python` with the `pagestore` package of this tree installed (maturin develop, once per
/// process).
fn python_with_module() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let py = python::python();
            let bin = py.parent().unwrap();
            let path = format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            let t0 = Instant::now();
            // The workspace's own target directory: only this crate and PyO3 build again.
            let target = python::workspace_root().join("target");
            let mut cmd = Command::new(bin.join("maturin"));
            cmd.args(["develop", "--quiet"])
                .current_dir(package_dir())
                .env("VIRTUAL_ENV", python::venv())
                .env("PATH", path)
                .env("CARGO_TARGET_DIR", &target)
                .env_remove("CONDA_PREFIX");
            // What cargo sets for a running test (CARGO_PKG_*, CARGO_MANIFEST_DIR, the library
            // path, ...) must not reach the inner cargo: build scripts that watch variables
            // would see a changed environment, and everything would build again.
            for (k, _) in std::env::vars_os() {
                let k = k.to_string_lossy().into_owned();
                let cargo_set = (k.starts_with("CARGO") && k != "CARGO_HOME")
                    || k.starts_with("RUSTC")
                    || matches!(
                        k.as_str(),
                        "LD_LIBRARY_PATH" | "OUT_DIR" | "RUST_RECURSION_COUNT"
                    );
                if cargo_set {
                    cmd.env_remove(&k);
                }
            }
            let out = cmd.output().expect("run maturin");
            assert!(
                out.status.success(),
                "maturin develop failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("maturin develop: {:.1} s", t0.elapsed().as_secs_f64());
            py
        })
        .clone()
}

/// Writes the data the Python tests read under `data`: the edge-case sizes around the page
/// size (`page`), a nested tree for listings, and nothing else (the tests add their Parquet
/// file themselves).
fn fill(data: &Path, page: usize) {
    let write = |rel: &str, b: &[u8]| {
        let p = data.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    };
    let sizes = [
        ("empty", 0),
        ("one", 1),
        ("page-1", page - 1),
        ("page", page),
        ("page+1", page + 1),
        ("pages3+123", 3 * page + 123),
    ];
    for (i, (name, size)) in sizes.iter().enumerate() {
        write(
            &format!("edge/{name}"),
            &fixture::bytes(1000 + i as u64, *size),
        );
    }
    for d in ["a", "b/c"] {
        for f in ["x.bin", "y.txt"] {
            write(&format!("tree/{d}/{f}"), format!("{d}/{f}").as_bytes());
        }
    }
    write("tree/top.txt", b"top");
}

/// Runs pytest on `tests/py/` (the `-k` expression `select`) against `cluster` (`store`: where
/// its write=back mount `/ck` flushes to); panics with
/// pytest's output when a test fails.
fn pytest(cluster: &Cluster, tls_dir: &Path, data: &Path, store: &Path, page: usize, select: &str) {
    let py = python_with_module();
    // PAGESTORE_TEST_PYTEST narrows it further while working on one test (a -k expression).
    let select = match std::env::var("PAGESTORE_TEST_PYTEST") {
        Ok(more) => format!("({select}) and ({more})"),
        Err(_) => select.to_string(),
    };
    let select = select.as_str();
    let t0 = Instant::now();
    let out = Command::new(&py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-k",
            select,
        ])
        .arg(package_dir().join("tests").join("py"))
        .env("PAGESTORE_CLUSTER", &cluster.members)
        .env("PAGESTORE_TLS_DIR", tls_dir)
        .env("PAGESTORE_TEST_DATA", data)
        .env("PAGESTORE_TEST_PAGE_SIZE", page.to_string())
        .env("PAGESTORE_TEST_PAGECTL", fixture::binary("pagectl"))
        .env("PAGESTORE_TEST_STORE", store)
        .env_remove("PAGESTORE_HOME")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pytest -k {select:?} failed ({:?}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "pytest -k {select:?}: {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        stdout.lines().last().unwrap_or_default()
    );
}

const PAGE: usize = 1 << 20;

/// Three nodes over a directory with the edge-case files; everything but the TLS refusal.
#[test]
fn fsspec_preload_stats_and_workers() {
    // The module builds while the cluster starts.
    let build = std::thread::spawn(python_with_module);
    let (dir, mut s) = fixture::settings();
    let data = dir.path().join("data");
    fill(&data, PAGE);
    // Writes: `/ck` is write=back (through the cluster, flushed to `store`); `/data` is
    // write=through to a directory this machine can write (staged, sent at close); `/s3` is a
    // store whose credentials only the nodes have (read-only from here).
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let s3root = dir.path().join("s3");
    std::fs::create_dir_all(s3root.join("bucket")).unwrap();
    std::fs::write(s3root.join("bucket/obj"), b"in s3").unwrap();
    let s3 = pagestore_testkit::S3Server::start(&s3root, "AKIDPY", "py-secret").unwrap();
    s.mounts = vec![
        format!("/data=file://{}", data.display()),
        format!("/ck=file://{}?write=back", store.display()),
        format!(
            "/s3=s3://bucket?endpoint={}&region=us-east-1&access_key_id=AKIDPY&secret_access_key=py-secret",
            s3.endpoint()
        ),
    ];
    let cluster = Cluster::start(dir, s);
    build.join().unwrap();
    let tls = cluster.ca_dir.clone();
    pytest(&cluster, &tls, &data, &store, PAGE, "not certificate");
    drop(s3);
}

/// A cluster that requires client certificates, and a client with only the CA certificate:
/// `PermissionError`, with what to do.
#[test]
fn a_client_without_a_certificate_gets_permission_error() {
    let build = std::thread::spawn(python_with_module);
    let (dir, mut s) = fixture::settings();
    let data = dir.path().join("data");
    fill(&data, PAGE);
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.mtls = true;
    s.nodes = 1;
    let cluster = Cluster::start(dir, s);
    build.join().unwrap();
    let certless = cluster.dir.path().join("certless");
    std::fs::create_dir_all(&certless).unwrap();
    std::fs::copy(
        cluster.ca_dir.join("ca-cert.pem"),
        certless.join("ca-cert.pem"),
    )
    .unwrap();
    pytest(
        &cluster,
        &certless,
        &data,
        Path::new(""),
        PAGE,
        "certificate",
    );
}
