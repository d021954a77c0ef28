//! The client's errors as Python exceptions: the `OSError` subclass Python's own file
//! functions raise for the same condition, with `errno`, `strerror` (the whole cause chain,
//! credentials scrubbed) and `filename` set.

use pyo3::{
    exceptions::{
        PyFileExistsError, PyFileNotFoundError, PyIsADirectoryError, PyNotADirectoryError,
        PyOSError, PyPermissionError,
    },
    PyErr,
};

use pagestore_client::{pool::ConnectFailure, Error};

/// The error and its causes on one line, each once, without credentials.
fn chain(e: Error) -> String {
    pagestore_cli::error_chain(&anyhow::Error::from(e))
}

/// `e` as the Python exception for its kind:
///
/// | error | exception | errno |
/// |---|---|---|
/// | `NotFound` | `FileNotFoundError` | ENOENT |
/// | `IsDir` | `IsADirectoryError` | EISDIR |
/// | `NotDir` | `NotADirectoryError` | ENOTDIR |
/// | `Forbidden` (the certificate's role) | `PermissionError` | EACCES |
/// | `Changed` (the pinned version is gone) | `OSError` | ESTALE |
/// | `BadPath`, `BadRange`, `Config` | `OSError` | EINVAL |
/// | `Unavailable` | `OSError` | EIO |
pub fn to_py(e: Error) -> PyErr {
    to_py_in(e, None)
}

/// [`to_py`], the message prefixed with `context` (`"DIR: "`).
fn to_py_in(e: Error, context: Option<&str>) -> PyErr {
    enum Exc {
        NotFound,
        IsDir,
        NotDir,
        Exists,
        Permission,
        Other,
    }
    let (exc, errno, path) = match &e {
        Error::NotFound(p) => (Exc::NotFound, libc::ENOENT, Some(p.clone())),
        Error::IsDir(p) => (Exc::IsDir, libc::EISDIR, Some(p.clone())),
        Error::NotDir(p) => (Exc::NotDir, libc::ENOTDIR, Some(p.clone())),
        Error::Forbidden(_) => (Exc::Permission, libc::EACCES, None),
        Error::Changed(_) => (Exc::Other, libc::ESTALE, None),
        Error::Exists(_) | Error::Precondition(_) => (Exc::Exists, libc::EEXIST, None),
        Error::NotEmpty(_) => (Exc::Other, libc::ENOTEMPTY, None),
        Error::NoSpace(_) => (Exc::Other, libc::ENOSPC, None),
        Error::ReadOnly(_) => (Exc::Other, libc::EROFS, None),
        Error::BadPath(_) | Error::BadRange(_) | Error::Invalid(_) | Error::Config { .. } => {
            (Exc::Other, libc::EINVAL, None)
        }
        Error::Unavailable { .. } if refused_certificate(&e) => {
            (Exc::Permission, libc::EACCES, None)
        }
        Error::Unavailable { .. } => (Exc::Other, libc::EIO, None),
    };
    let text = match context {
        Some(c) => format!("{c}: {}", chain(e)),
        None => chain(e),
    };
    let args = (errno, text, path);
    match exc {
        Exc::NotFound => PyFileNotFoundError::new_err(args),
        Exc::IsDir => PyIsADirectoryError::new_err(args),
        Exc::NotDir => PyNotADirectoryError::new_err(args),
        Exc::Exists => PyFileExistsError::new_err(args),
        Exc::Permission => PyPermissionError::new_err(args),
        Exc::Other => PyOSError::new_err(args),
    }
}

/// Whether a node refused this client for its TLS certificate (none, or not the cluster's):
/// a permission matter, whatever transport error carried it.
fn refused_certificate(e: &Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(ConnectFailure::Refused(quinn::ConnectionError::ConnectionClosed(close))) =
            c.downcast_ref::<ConnectFailure>()
        {
            // TLS alerts travel as QUIC CRYPTO_ERROR 0x100 + alert.
            let code = u64::from(close.error_code);
            return (0x100..=0x1ff).contains(&code);
        }
        cause = c.source();
    }
    false
}

/// A cluster-options error: the client's own kinds as [`to_py`], settings as `OSError`
/// (EINVAL).
pub fn cli_to_py(e: pagestore_cli::Error) -> PyErr {
    match e {
        pagestore_cli::Error::Client(e) => to_py(e),
        e => PyOSError::new_err((libc::EINVAL, e.to_string())),
    }
}

/// A preload job's listing error.
pub fn load_to_py(e: pagestore_cli::load::LoadError) -> PyErr {
    use pagestore_cli::load::LoadError;
    match e {
        LoadError::Cluster(e) => to_py(e),
        LoadError::Listing { dir, source } => to_py_in(source, Some(&dir)),
        e @ LoadError::Manifest { .. } => PyOSError::new_err((libc::EINVAL, e.to_string())),
    }
}
