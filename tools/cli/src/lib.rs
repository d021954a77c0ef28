//! What pagestore's binaries share (`pagestored`, `pagectl`, `pagefs`, `pages3`, `pagebench`)
//! and the Python package (`client/python`): the cluster options and client start-up
//! ([`ClusterArgs`]), preload jobs ([`load`]), bounded HTTP serving for the endpoints outside
//! clients reach ([`http_guard`]), sizes, defaults, logging and error printing. It links the
//! client library, never the engine or the server.

use std::path::PathBuf;

mod cluster;
pub mod http_guard;
pub mod load;

pub use cluster::{parse_or_exit, wrap_help, ClusterArgs, Error};

/// Where the embedded single-node default keeps everything (override with `PAGESTORE_HOME`).
pub const DEFAULT_HOME: &str = "/var/tmp/pagestore";

/// Base QUIC address of the embedded default (shard `i` on port 7400 + `i`).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7400";

/// `PAGESTORE_HOME`, or [`DEFAULT_HOME`].
pub fn home() -> PathBuf {
    std::env::var_os("PAGESTORE_HOME").map_or_else(|| DEFAULT_HOME.into(), PathBuf::from)
}

/// Parses a byte size: a number with an optional binary suffix `K`, `M`, `G` or `T` (an `i`
/// and/or `B` after it is accepted): `4M` is 4,194,304 bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix('B').unwrap_or(t);
    let t = t.strip_suffix('i').unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(format!(
                        "{s:?}: unknown size suffix {c:?} (use K, M, G or T)"
                    ))
                }
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64K, 4M, 100G)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Logs to stderr at the level in `PAGESTORE_LOG` (or `RUST_LOG`): error, warn, info (the
/// default), debug or trace.
pub fn init_logging() {
    let level = std::env::var("PAGESTORE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|v| v.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// An error and its causes on one line, each cause once (typed errors often repeat their
/// cause in their own message, see `pagestore_client::Error`): what the binaries print before
/// they exit. Every text goes through `ufs::scrub`: a store's error, kept as a source, may
/// quote an endpoint URL with credentials that the messages above it leave out.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = pagestore_client::ufs::scrub(&cause.to_string());
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        for bad in ["", "x", "4X", "-1", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn error_chain_prints_each_cause_once() {
        use anyhow::Context as _;
        let io = || std::io::Error::other("disk on fire");
        let e = Err::<(), _>(io()).context("/x/f1").unwrap_err();
        assert_eq!(error_chain(&e), "/x/f1: disk on fire");
        // A cause its message already holds (as the engine's I/O errors do) is not repeated.
        #[derive(Debug)]
        struct Put(std::io::Error);
        impl std::fmt::Display for Put {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "write /x/f1: {}", self.0)
            }
        }
        impl std::error::Error for Put {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Err::<(), _>(Put(io())).context("engine put").unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "engine put: write /x/f1: disk on fire: disk on fire"
        );
        assert_eq!(error_chain(&e), "engine put: write /x/f1: disk on fire");
    }
    #[test]
    fn error_chain_shows_a_store_error_once_and_without_credentials() {
        use anyhow::Context as _;
        use pagestore_client::{ufs::UfsError, Error};
        let store = object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::other(
                "error sending request for url (http://euser:epass@127.0.0.1:9/b/k)",
            )),
        };
        let e = Err::<(), _>(Error::from(UfsError::Store("/s3/k".into(), store)))
            .context("cat /s3/k")
            .unwrap_err();
        // The raw chain quotes the endpoint's user information; the printed one does not.
        assert!(format!("{e:#}").contains("epass"), "{e:#}");
        assert_eq!(
            error_chain(&e),
            "cat /s3/k: unavailable: /s3/k: Generic S3 error: error sending request for url \
             (http://127.0.0.1:9/b/k)"
        );
    }
}
