//! Shared pieces of the `pagestored` daemon and the client binaries (`pagectl`, `pagefs`,
//! `pages3`, and `pagebench`): the cluster options and client start-up ([`cli`]), sizes,
//! defaults and logging.

use std::{path::PathBuf, str::FromStr};

pub mod admin;
pub mod cli;
pub mod http_guard;
pub mod load;
pub mod local_cluster;
pub mod pagefs;
pub mod pages3;
pub mod rules;

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

/// A minimal command-line reader: `--name value`, `--name=value`, flags, and positionals.
pub struct Args {
    items: Vec<String>,
    pos: usize,
}

impl Args {
    /// The process's arguments after the program name.
    pub fn from_env() -> Args {
        Args {
            items: std::env::args().skip(1).collect(),
            pos: 0,
        }
    }

    /// Arguments from a list (tests).
    pub fn from_vec(items: Vec<String>) -> Args {
        Args { items, pos: 0 }
    }

    /// The next raw argument.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<String> {
        let a = self.items.get(self.pos).cloned();
        self.pos += 1;
        a
    }

    /// The value of option `name` whose flag `arg` was just read (`--name=v` or `--name v`).
    pub fn value(&mut self, arg: &str) -> Result<String, String> {
        if let Some((_, v)) = arg.split_once('=') {
            return Ok(v.to_string());
        }
        self.next().ok_or_else(|| format!("{arg} needs a value"))
    }

    /// Like [`Args::value`], parsed.
    pub fn parsed<T: FromStr>(&mut self, arg: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.value(arg)?;
        v.parse().map_err(|e| format!("{arg} {v:?}: {e}"))
    }
}

/// The option name of `arg` (`--x=1` gives `--x`).
pub fn flag(arg: &str) -> &str {
    arg.split_once('=').map_or(arg, |(f, _)| f)
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

/// The etcd settings of `pagestored` and `pagectl`: each of the flags `--etcd-user`,
/// `--etcd-password-file`, `--etcd-ca`, `--etcd-cert`, `--etcd-key` (in that order) that is given
/// wins over its `PAGESTORE_ETCD_*` variable.
pub fn etcd_options(
    flags: [Option<String>; 5],
) -> Result<pagestore_mounts::etcd::EtcdOptions, String> {
    use pagestore_mounts::etcd;
    let [user, password_file, ca, cert, key] = flags;
    let mut o = etcd::EtcdOptions::from_env().map_err(|e| e.to_string())?;
    if let Some(u) = user {
        o.user = Some(u);
    }
    if let Some(f) = password_file {
        o.password = Some(etcd::read_password_file(f.as_ref()).map_err(|e| e.to_string())?);
    }
    o.ca = ca.map(PathBuf::from).or(o.ca);
    o.cert = cert.map(PathBuf::from).or(o.cert);
    o.key = key.map(PathBuf::from).or(o.key);
    Ok(o)
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
    fn values_both_ways() {
        let mut a = Args::from_vec(vec!["--a=1".into(), "--b".into(), "2".into(), "--c".into()]);
        let x = a.next().unwrap();
        assert_eq!((flag(&x), a.value(&x).unwrap().as_str()), ("--a", "1"));
        let x = a.next().unwrap();
        assert_eq!(a.parsed::<u32>(&x).unwrap(), 2);
        let x = a.next().unwrap();
        assert!(a.value(&x).is_err());
    }
}
