//! Start-up checks that turn environment problems into clear errors instead of panics.

use crate::error::StartError;

/// Checks that io_uring can be set up and supports the operations the engine issues.
pub fn probe_io_uring() -> Result<(), StartError> {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let ring = io_uring::IoUring::new(4).map_err(|e| {
        let hint = if disabled != 0 {
            format!("kernel.io_uring_disabled = {disabled}; set it to 0 (sysctl)")
        } else {
            "the kernel may be too old (5.8+ needed) or a seccomp profile (container runtime) \
             filters io_uring_setup; allow it"
                .to_string()
        };
        StartError::IoUringUnavailable(format!("io_uring_setup failed: {e}; {hint}"))
    })?;
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe).map_err(|e| {
        StartError::IoUringUnavailable(format!("cannot probe io_uring opcodes: {e}"))
    })?;
    use io_uring::opcode;
    let needed = [
        (opcode::Read::CODE, "READ"),
        (opcode::Write::CODE, "WRITE"),
        (opcode::ReadFixed::CODE, "READ_FIXED"),
        (opcode::WriteFixed::CODE, "WRITE_FIXED"),
        (opcode::Fsync::CODE, "FSYNC"),
        (opcode::Fallocate::CODE, "FALLOCATE"),
    ];
    let missing: Vec<&str> = needed
        .iter()
        .filter(|(code, _)| !probe.is_supported(*code))
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(StartError::IoUringUnavailable(format!(
            "the kernel's io_uring lacks {}; a 5.8 or newer kernel is needed",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// Raises RLIMIT_MEMLOCK so the shards can register their buffer arenas. Best effort: an
/// unprivileged process keeps its limit, and glommio then reports a clear error or falls back.
pub fn raise_memlock(bytes: u64) {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass; the pointer is valid for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut cur) } != 0 {
        return;
    }
    if cur.rlim_cur == libc::RLIM_INFINITY || cur.rlim_cur >= bytes {
        return;
    }
    let want = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: if cur.rlim_max == libc::RLIM_INFINITY {
            cur.rlim_max
        } else {
            cur.rlim_max.max(bytes)
        },
    };
    // SAFETY: setrlimit only reads the struct; failure is reported by the return value.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &want) };
    if rc != 0 {
        tracing::warn!(
            wanted = bytes,
            current = cur.rlim_cur,
            "could not raise RLIMIT_MEMLOCK; registered I/O buffers may be unavailable"
        );
    }
}

/// Free bytes on the file system holding `path` (for unprivileged users).
pub fn free_space(path: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is plain data; zeroed is a valid value for it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Checks that files in `dir` can be opened with O_DIRECT (tmpfs before Linux 6.6, ramfs,
/// overlayfs and many network or FUSE file systems refuse it).
pub fn probe_direct_io(dir: &std::path::Path) -> Result<(), StartError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(".pagestore-odirect-probe");
    let r = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let _ = std::fs::remove_file(&path);
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Err(StartError::DirectIoUnsupported { path, source: e })
        }
        Err(e) => Err(StartError::io(
            "probing O_DIRECT in",
            Some(dir.to_path_buf()),
            e,
        )),
    }
}
