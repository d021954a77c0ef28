//! The one Python virtual environment the tests share (`target/pyenv`): created on first use
//! with exact versions of every package a test imports, so that the pages3 tests (boto3, s3fs,
//! the AWS CLI, s3cmd, pyarrow) and the Python package's tests (`client/python`: fsspec,
//! pandas, pytest, maturin) install once per machine, not once per test binary.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, OnceLock},
};

/// Exact versions that work together: left alone, pip backtracks through s3fs and aiobotocore
/// releases (to ancient ones, or to pins the package index may not serve).
pub const PACKAGES: &[&str] = &[
    "boto3==1.43.117",
    "botocore==1.43.117",
    "aiobotocore==3.10.0",
    "s3fs==2026.9.0",
    "fsspec==2026.9.0",
    // Real clients of the pages3 tests (the AWS CLI that goes with this botocore, s3cmd,
    // pyarrow's own S3 file system).
    "awscli==1.46.3",
    "s3cmd==2.4.0",
    "pyarrow==26.0.1",
    // The Python package's tests: Parquet through pandas, pytest, and the build tool.
    "pandas==3.1.1",
    "numpy==2.4.6",
    "pytest==9.2.0",
    "maturin==1.16.0",
];

/// What must import for the environment to count as ready.
const IMPORTS: &str = "import boto3, s3fs, fsspec, pyarrow.fs, pyarrow.parquet, awscli, S3, \
                       pandas, pytest, maturin";

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The virtual environment's directory (`target/pyenv` of the workspace).
pub fn venv() -> PathBuf {
    workspace_root().join("target").join("pyenv")
}

/// The virtual environment's `python`, the environment created (or completed) on first use.
/// Panics with what to install when `python3 -m venv` or pip fails.
pub fn python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    static SETUP: Mutex<()> = Mutex::new(());
    let _g = SETUP.lock().unwrap_or_else(|p| p.into_inner());
    PY.get_or_init(|| {
        let venv = venv();
        let py = venv.join("bin").join("python");
        let ready = || {
            Command::new(&py)
                .args(["-c", IMPORTS])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if ready() {
            return py;
        }
        let out = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run python3 ({e}): install python3 and python3-venv (apt-get install \
                     python3-venv)"
                )
            });
        assert!(
            out.status.success(),
            "cannot create a Python virtual environment at {}: {}\ninstall the venv module: \
             apt-get install python3-venv",
            venv.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(venv.join("bin").join("pip"))
            .args(["install", "-q"])
            .args(PACKAGES)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pip install {} into {} failed:\n{}{}",
            PACKAGES.join(" "),
            venv.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            ready(),
            "{IMPORTS:?} still fails after pip install into {}",
            venv.display()
        );
        py
    })
    .clone()
}
