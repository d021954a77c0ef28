//! A running `pagefs` for the tests: started over a test cluster, unmounted by a drop guard so
//! that a failing test leaves no mount behind.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use pagestore_testkit::fixture::Cluster;

const PAGEFS: &str = env!("CARGO_BIN_EXE_pagefs");

pub fn mounted(mp: &Path) -> bool {
    let want = mp.display().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// A running `pagefs`. Dropping it stops the process and makes sure nothing stays mounted.
pub struct Mount {
    pub child: Option<Child>,
    pub lines: mpsc::Receiver<String>,
    pub mp: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mount {
    pub fn start(c: &Cluster, extra: &[&str]) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let mp = std::fs::canonicalize(dir.path()).unwrap();
        let mut child = Command::new(PAGEFS)
            .arg(&mp)
            .arg("--cluster")
            .arg(&c.members)
            .arg("--tls-dir")
            .arg(&c.ca_dir)
            .args(extra)
            // Only the cluster's mount table: no store credentials of this machine's own.
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env(
                "PAGESTORE_LOG",
                std::env::var("PAGESTORE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut m = Mount {
            child: Some(child),
            lines,
            mp,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match m.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(l) if l.starts_with("ready") => break,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(_) => {
                    let status = m.child.as_mut().unwrap().try_wait();
                    panic!("pagefs did not become ready ({status:?}); it needs root and /dev/fuse");
                }
            }
        }
        assert!(mounted(&m.mp), "ready means mounted");
        m
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.mp.join(p.trim_start_matches('/'))
    }

    /// SIGTERM; the exit status and what it printed after "ready".
    pub fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let mut child = self.child.take().unwrap();
        assert_eq!(kill(child.id(), libc::SIGTERM), 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("pagefs did not exit within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self.lines.try_iter().collect();
        (status, out)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if mounted(&self.mp) {
            let _ = Command::new("umount").arg("-l").arg(&self.mp).status();
        }
        if mounted(&self.mp) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mp)
                .status();
        }
    }
}

/// kill(2) on a child of this process.
pub fn kill(pid: u32, sig: libc::c_int) -> i32 {
    // SAFETY: kill(2) takes two integers; no memory is involved.
    unsafe { libc::kill(pid as libc::pid_t, sig) }
}
