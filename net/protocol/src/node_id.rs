//! A node's identity: a UUID generated once and kept in a read-only file.

use std::{
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

/// Problems with the node id file.
#[derive(Debug)]
pub enum NodeIdError {
    /// Reading or writing the file failed.
    Io(PathBuf, std::io::Error),
    /// The file exists but does not hold a UUID.
    Invalid(PathBuf, String),
}

impl std::fmt::Display for NodeIdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeIdError::Io(p, e) => write!(f, "node id file {}: {e}", p.display()),
            NodeIdError::Invalid(p, m) => write!(
                f,
                "node id file {}: {m}; restore it from a backup, or delete it to give this node \
                 a new identity (its cached pages then belong to a new ring member)",
                p.display()
            ),
        }
    }
}

impl std::error::Error for NodeIdError {}

/// Formats a node id the usual UUID way (8-4-4-4-12 lowercase hex).
pub fn format_uuid(id: u128) -> String {
    let h = format!("{id:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Parses a UUID in 8-4-4-4-12 hex form (or 32 hex digits).
pub fn parse_uuid(s: &str) -> Option<u128> {
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(&hex, 16).ok()
}

/// A random version-4 UUID from the kernel's random source.
pub fn new_uuid() -> std::io::Result<u128> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut b)
    })?;
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    Ok(u128::from_be_bytes(b))
}

/// Loads the node id from `path`, creating it (mode 0444) on first start.
pub fn load_or_create(path: &Path) -> Result<u128, NodeIdError> {
    match std::fs::read_to_string(path) {
        Ok(s) => parse_uuid(&s).ok_or_else(|| {
            NodeIdError::Invalid(path.into(), format!("{:?} is not a UUID", s.trim()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = new_uuid().map_err(|e| NodeIdError::Io(path.into(), e))?;
            let tmp = path.with_extension("tmp");
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o444)
                .open(&tmp)
                .map_err(|e| NodeIdError::Io(tmp.clone(), e))?;
            writeln!(f, "{}", format_uuid(id))
                .and_then(|_| f.sync_all())
                .map_err(|e| NodeIdError::Io(tmp.clone(), e))?;
            std::fs::rename(&tmp, path).map_err(|e| NodeIdError::Io(path.into(), e))?;
            Ok(id)
        }
        Err(e) => Err(NodeIdError::Io(path.into(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_stable_and_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("node-id");
        let a = load_or_create(&p).unwrap();
        let b = load_or_create(&p).unwrap();
        assert_eq!(a, b);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o444
        );
        assert_eq!((a >> 76) & 0xf, 4, "version 4 UUID");
        assert_ne!(a, load_or_create(&dir.path().join("other")).unwrap());
    }

    #[test]
    fn a_damaged_file_is_an_error_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("node-id");
        std::fs::write(&p, "not-a-uuid\n").unwrap();
        let e = load_or_create(&p).unwrap_err().to_string();
        assert!(e.contains("not a UUID") && e.contains("delete it"), "{e}");
    }

    #[test]
    fn uuid_text_round_trip() {
        let id = 0x0123_4567_89ab_cdef_0011_2233_4455_6677u128;
        let s = format_uuid(id);
        assert_eq!(s, "01234567-89ab-cdef-0011-223344556677");
        assert_eq!(parse_uuid(&s), Some(id));
        assert_eq!(parse_uuid("0123456789abcdef0011223344556677"), Some(id));
        assert_eq!(parse_uuid("xyz"), None);
    }
}
