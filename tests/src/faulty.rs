//! A faulty disk for engine tests: [`FaultyDisk`] implements the engine's [`DiskHooks`] seam and
//! fails a shard's cache-file writes or reads with any errno (ENOSPC, EIO, ...) at a chosen moment.
//!
//! ```no_run
//! # use pagestore_engine::{Engine, EngineConfig};
//! # use pagestore_testkit::faulty::{FaultConfig, FaultyDisk};
//! let disk = FaultyDisk::new();
//! let mut cfg = EngineConfig::new("/var/tmp/cache", 1 << 30);
//! cfg.disk_hooks = Some(disk.clone());
//! let engine = Engine::start(cfg).unwrap();
//! // The next write of shard 0 fails with ENOSPC.
//! disk.set(0, FaultConfig { write_errno: Some(libc::ENOSPC), ..Default::default() });
//! ```

use std::{
    collections::HashMap,
    io,
    sync::{Arc, Mutex, PoisonError},
};

use pagestore_engine::{DiskHooks, DiskIo, DiskOp};

/// Faults to inject into one shard's disk I/O.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// Fail writes (and preallocations) with this errno (e.g. `libc::ENOSPC`, `libc::EIO`)...
    pub write_errno: Option<i32>,
    /// ...after this many more writes have succeeded.
    pub writes_before_failure: u64,
    /// Fail every read with this errno.
    pub read_errno: Option<i32>,
}

/// One shard's plan: its faults and the writes let through since they were set.
#[derive(Clone, Copy, Debug, Default)]
struct Plan {
    config: FaultConfig,
    writes: u64,
}

/// Disk hooks that inject the faults set per shard with [`FaultyDisk::set`]. Install a clone in
/// `EngineConfig::disk_hooks` before the engine starts; set faults from any thread afterwards.
/// Until a shard's faults are set, its I/O passes untouched.
#[derive(Debug, Default)]
pub struct FaultyDisk {
    plans: Mutex<HashMap<usize, Plan>>,
}

impl FaultyDisk {
    /// A disk with no faults yet.
    pub fn new() -> Arc<FaultyDisk> {
        Arc::default()
    }

    /// Injects `faults` into shard `shard`'s I/O from now on, replacing what was set before and
    /// restarting the count of writes let through. `FaultConfig::default()` clears them.
    ///
    /// A request sent to the shard after this returns sees the new faults.
    pub fn set(&self, shard: usize, faults: FaultConfig) {
        self.plans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                shard,
                Plan {
                    config: faults,
                    writes: 0,
                },
            );
    }
}

impl DiskHooks for FaultyDisk {
    fn before(&self, io: &DiskIo<'_>) -> io::Result<()> {
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(plan) = plans.get_mut(&io.shard) else {
            return Ok(());
        };
        match io.op {
            DiskOp::Read => match plan.config.read_errno {
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None => Ok(()),
            },
            DiskOp::Write | DiskOp::Preallocate => {
                if let Some(errno) = plan.config.write_errno {
                    if plan.writes >= plan.config.writes_before_failure {
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                    plan.writes += 1;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use super::*;

    fn io(op: DiskOp, shard: usize) -> DiskIo<'static> {
        DiskIo {
            op,
            shard,
            path: Path::new("shard-0.cache"),
            pos: 0,
            len: 4096,
        }
    }

    #[test]
    fn writes_fail_after_the_allowance_and_reads_fail_at_once() {
        let d = FaultyDisk::new();
        assert!(d.before(&io(DiskOp::Write, 0)).is_ok());
        d.set(
            0,
            FaultConfig {
                write_errno: Some(libc::ENOSPC),
                writes_before_failure: 2,
                read_errno: Some(libc::EIO),
            },
        );
        assert!(d.before(&io(DiskOp::Write, 0)).is_ok());
        assert!(d.before(&io(DiskOp::Preallocate, 0)).is_ok());
        for _ in 0..2 {
            let e = d.before(&io(DiskOp::Write, 0)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        }
        let e = d.before(&io(DiskOp::Read, 0)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        // Other shards are untouched.
        assert!(d.before(&io(DiskOp::Write, 1)).is_ok());
        assert!(d.before(&io(DiskOp::Read, 1)).is_ok());
        // Cleared.
        d.set(0, FaultConfig::default());
        assert!(d.before(&io(DiskOp::Write, 0)).is_ok());
        assert!(d.before(&io(DiskOp::Read, 0)).is_ok());
    }
}
