//! Environment problems at start-up are clear errors, not panics: io_uring blocked by a seccomp
//! filter, and a cache directory on a file system without O_DIRECT.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::process::Command;

use common::*;
use pagestore_engine::{Engine, StartError};

const CHILD: &str = "PAGESTORE_STARTUP_CHILD_DIR";

/// Installs a seccomp filter that makes `io_uring_setup` fail with EPERM, as container runtimes
/// do, then starts an engine. Runs only in the child spawned by the test below.
#[test]
#[ignore = "helper process for io_uring_blocked_by_seccomp_is_a_clear_error"]
#[cfg(target_arch = "x86_64")]
fn io_uring_child() {
    let Ok(dir) = std::env::var(CHILD) else {
        return;
    };
    const IO_URING_SETUP: u32 = 425;
    let filter = [
        // load the syscall number
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if it is io_uring_setup, fall through to EPERM; otherwise skip to ALLOW
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: IO_URING_SETUP,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut _,
    };
    // SAFETY: prctl with valid arguments; `prog` and `filter` outlive the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const _
            ),
            0
        );
    }
    match Engine::start(config(std::path::Path::new(&dir), 1, 64 * KIB, 4)) {
        Err(e @ StartError::IoUringUnavailable(_)) => println!("EXPECTED-ERROR: {e}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("engine started without io_uring"),
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn io_uring_blocked_by_seccomp_is_a_clear_error() {
    let dir = tempdir();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "io_uring_child",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("EXPECTED-ERROR: io_uring is unavailable: io_uring_setup failed"),
        "{stdout}"
    );
}

/// ramfs has no O_DIRECT. Mounting needs root (CI runs as root); elsewhere the test is skipped.
#[test]
fn a_file_system_without_o_direct_is_a_clear_error() {
    let dir = tempdir();
    let mnt = dir.path().join("ramfs");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(&mnt)
        .status();
    if !matches!(mounted, Ok(s) if s.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount ramfs"
        );
        eprintln!("cannot mount ramfs (not root?): skipping");
        return;
    }
    let r = Engine::start(config(&mnt, 1, 64 * KIB, 4));
    let _ = Command::new("umount").arg(&mnt).status();
    match r {
        Err(e @ StartError::DirectIoUnsupported { .. }) => {
            assert!(e.to_string().contains("does not support O_DIRECT"), "{e}");
        }
        Err(e) => panic!("expected DirectIoUnsupported, got {e}"),
        Ok(_) => panic!("an engine started on ramfs"),
    }
}
