//! The disk seam: every byte the engine reads or writes goes through [`Device`].
//!
//! It wraps one glommio `DmaFile` (O_DIRECT over io_uring) and carries an optional fault plan so
//! tests can make writes or reads fail with any errno (ENOSPC, EIO, ...) at a chosen moment.
//! glommio's file API is used only here and in `cachefile.rs` (opening files); its executor only in
//! `engine.rs`. The hit path hands out glommio's `ReadResult` (through `PageData`) so senders on
//! the same executor can transmit from the buffer the disk wrote into.

use std::{cell::Cell, io, path::PathBuf, rc::Rc};

use glommio::{
    io::{DmaBuffer, DmaFile, ReadResult},
    GlommioError,
};

/// Converts a glommio error to `io::Error`, keeping the errno (glommio's own conversion keeps only
/// the kind, and ENOSPC must stay recognisable).
pub(crate) fn to_io(e: GlommioError<()>) -> io::Error {
    match e {
        GlommioError::EnhancedIoError { source, .. } | GlommioError::IoError(source) => source,
        other => other.into(),
    }
}

/// Faults to inject into one shard's disk I/O. `Copy` and `Send`, so tests can set it from any
/// thread through [`crate::ShardHandle::set_faults`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// Fail writes with this errno (e.g. `libc::ENOSPC`, `libc::EIO`)...
    pub write_errno: Option<i32>,
    /// ...after this many more writes have succeeded.
    pub writes_before_failure: u64,
    /// Fail every read with this errno.
    pub read_errno: Option<i32>,
}

#[derive(Default)]
pub(crate) struct Faults {
    config: Cell<FaultConfig>,
    writes: Cell<u64>,
}

impl Faults {
    pub(crate) fn set(&self, c: FaultConfig) {
        self.config.set(c);
        self.writes.set(0);
    }

    fn check_write(&self) -> io::Result<()> {
        let c = self.config.get();
        if let Some(errno) = c.write_errno {
            let n = self.writes.get();
            if n >= c.writes_before_failure {
                return Err(io::Error::from_raw_os_error(errno));
            }
            self.writes.set(n + 1);
        }
        Ok(())
    }

    fn check_read(&self) -> io::Result<()> {
        match self.config.get().read_errno {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}

/// One open cache file.
pub(crate) struct Device {
    file: DmaFile,
    path: PathBuf,
    faults: Rc<Faults>,
}

impl Device {
    pub(crate) fn new(file: DmaFile, path: PathBuf, faults: Rc<Faults>) -> Self {
        Device { file, path, faults }
    }

    pub(crate) fn path(&self) -> &PathBuf {
        &self.path
    }

    /// A buffer suitable for O_DIRECT writes (from the shard's registered arena when it has room).
    pub(crate) fn alloc(&self, size: usize) -> DmaBuffer {
        self.file.alloc_dma_buffer(size)
    }

    /// Reads `len` bytes at `pos`; both must be 4096-aligned. May return fewer bytes at EOF.
    pub(crate) async fn read(&self, pos: u64, len: usize) -> io::Result<ReadResult> {
        self.faults.check_read()?;
        self.file.read_at_aligned(pos, len).await.map_err(to_io)
    }

    /// Writes the whole buffer at `pos` (4096-aligned). A short write is an error.
    pub(crate) async fn write(&self, buf: DmaBuffer, pos: u64) -> io::Result<()> {
        self.faults.check_write()?;
        let want = buf.len();
        let n = self.file.write_at(buf, pos).await.map_err(to_io)?;
        if n != want {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {n} of {want} bytes at offset {pos}"),
            ));
        }
        Ok(())
    }

    pub(crate) async fn truncate(&self, size: u64) -> io::Result<()> {
        self.file.truncate(size).await.map_err(to_io)
    }

    /// Reserves disk blocks for `[0, size)` (fallocate); the errno survives for ENOSPC handling.
    pub(crate) async fn preallocate(&self, size: u64) -> io::Result<()> {
        self.faults.check_write()?;
        self.file.pre_allocate(size, false).await.map_err(to_io)
    }

    pub(crate) async fn sync(&self) -> io::Result<()> {
        self.file.fdatasync().await.map_err(to_io)
    }

    pub(crate) async fn close(self) -> io::Result<()> {
        self.file.close().await.map_err(to_io)
    }
}
