//! The disk seam: every byte the engine reads or writes goes through [`Device`].
//!
//! It wraps one glommio `DmaFile` (O_DIRECT over io_uring). It may carry [`DiskHooks`], an
//! interposer installed at engine start that sees every read, write and preallocation first and
//! may fail it (tests inject disk errors this way; production engines have none).
//! glommio's file API is used only here and in `cachefile.rs` (opening files); its executor only in
//! `engine.rs`. The hit path hands out glommio's `ReadResult` (through `PageData`) so senders on
//! the same executor can transmit from the buffer the disk wrote into.

use std::{
    fmt, io,
    path::{Path, PathBuf},
    sync::Arc,
};

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

/// What a cache-file operation is about to do, as [`DiskHooks`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskOp {
    /// A read of `len` bytes at `pos`.
    Read,
    /// A write of `len` bytes at `pos`.
    Write,
    /// Reserving disk blocks for `[0, len)` (fallocate); `pos` is 0.
    Preallocate,
}

/// One cache-file operation, handed to [`DiskHooks::before`] before it reaches the disk.
#[derive(Clone, Copy, Debug)]
pub struct DiskIo<'a> {
    /// The operation.
    pub op: DiskOp,
    /// The shard doing it.
    pub shard: usize,
    /// The cache file.
    pub path: &'a Path,
    /// Byte offset in the file.
    pub pos: u64,
    /// Bytes read or written (for `Preallocate`, the size reserved).
    pub len: u64,
}

/// An interposer on every cache-file read, write and preallocation, installed for the life of an
/// engine with [`crate::EngineConfig::disk_hooks`]. The engine never installs one itself: tests
/// use it to inject disk faults (`pagestore-testkit`'s `FaultyDisk`). Without hooks the cost is
/// one `None` check per operation.
pub trait DiskHooks: Send + Sync + fmt::Debug {
    /// Called on the shard's thread before each operation. An error fails the operation with that
    /// error (keep its errno: `io::Error::from_raw_os_error`), and the disk is not touched.
    fn before(&self, io: &DiskIo<'_>) -> io::Result<()>;
}

/// One open cache file.
pub(crate) struct Device {
    file: DmaFile,
    path: PathBuf,
    shard: usize,
    hooks: Option<Arc<dyn DiskHooks>>,
}

impl Device {
    pub(crate) fn new(
        file: DmaFile,
        path: PathBuf,
        shard: usize,
        hooks: Option<Arc<dyn DiskHooks>>,
    ) -> Self {
        Device {
            file,
            path,
            shard,
            hooks,
        }
    }

    /// Runs the hooks, if any, for one operation.
    #[inline]
    fn hook(&self, op: DiskOp, pos: u64, len: u64) -> io::Result<()> {
        match &self.hooks {
            None => Ok(()),
            Some(h) => h.before(&DiskIo {
                op,
                shard: self.shard,
                path: &self.path,
                pos,
                len,
            }),
        }
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
        self.hook(DiskOp::Read, pos, len as u64)?;
        self.file.read_at_aligned(pos, len).await.map_err(to_io)
    }

    /// Writes the whole buffer at `pos` (4096-aligned). A short write is an error.
    pub(crate) async fn write(&self, buf: DmaBuffer, pos: u64) -> io::Result<()> {
        let want = buf.len();
        self.hook(DiskOp::Write, pos, want as u64)?;
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
        self.hook(DiskOp::Preallocate, 0, size)?;
        self.file.pre_allocate(size, false).await.map_err(to_io)
    }

    pub(crate) async fn sync(&self) -> io::Result<()> {
        self.file.fdatasync().await.map_err(to_io)
    }

    pub(crate) async fn close(self) -> io::Result<()> {
        self.file.close().await.map_err(to_io)
    }
}
