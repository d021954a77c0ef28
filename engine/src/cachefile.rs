//! One shard's cache file in one cache directory: creation, recovery, the in-memory mirror of
//! the metadata region, and ordered metadata writes.
//!
//! The metadata region (superblock, slot headers, checksum tables) is small (about 0.1% of the
//! file at the default sizes) and is mirrored in memory. Changes are made in the mirror and then
//! persisted block by block. Two writes of one block are never in flight at once (a later one could
//! land first and undo the newer content), and a caller's change is durable once a write that
//! *started after* the change has completed: that is what [`CacheFile::persist_block`] waits for.

use std::{
    cell::{Cell, RefCell},
    io,
    path::{Path, PathBuf},
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use glommio::io::OpenOptions;

use crate::{
    device::{Device, DiskHooks},
    error::StartError,
    event::Event,
    format::{
        clear_header, FileIdent, Geometry, HeaderState, SlotHeader, SuperError, Superblock, BLOCK,
        FLAG_DIRTY, FORMAT_VERSION,
    },
    rules::Rules,
};

/// Opening, formatting and recovering a cache file happen at start-up.
type Result<T, E = StartError> = std::result::Result<T, E>;

/// Bytes per read while loading the metadata region at start-up.
const RECOVERY_READ: u64 = 8 << 20;

#[derive(Clone, Copy, Default)]
struct BlockWrites {
    started: u64,
    completed: u64,
    writing: bool,
    last_ok: bool,
}

/// What recovery found in one file.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// Valid pages: local slot and header.
    pub pages: Vec<(u32, SlotHeader)>,
    /// Headers that were damaged, whose checksum table did not match, or whose rule number no
    /// longer means what it meant when the page was stored (cleared).
    pub dropped: u64,
    /// True if the file was created or reformatted.
    pub formatted: bool,
}

pub(crate) struct CacheFile {
    dev: Device,
    geo: Geometry,
    mirror: RefCell<Vec<u8>>,
    blocks: RefCell<Vec<BlockWrites>>,
    written: Event,
    meta_writes: Cell<u64>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn random_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let s = std::collections::hash_map::RandomState::new();
    let mut a = s.build_hasher();
    a.write_u64(now_ms());
    let mut b = s.build_hasher();
    b.write_u32(std::process::id());
    ((a.finish() as u128) << 64) | b.finish() as u128
}

/// Makes sure block 0 of the file holds written data before glommio opens it.
///
/// glommio decides once per device (and caches it per thread) whether reads can use the polled
/// io_uring by reading block 0 of the first file it opens there. On an empty or unwritten file
/// that read completes without touching the device, glommio wrongly concludes that polling works,
/// and every later read fails with EOPNOTSUPP. A real block 0 makes the probe honest.
fn ensure_first_block(path: &Path) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if f.metadata()?.len() < BLOCK {
        f.set_len(0)?;
        f.write_all(&[0u8; BLOCK as usize])?;
        f.sync_data()?;
    }
    Ok(())
}

/// Creates (if needed) and opens the cache file at `path` with O_DIRECT; a file system that
/// refuses O_DIRECT, or a device whose alignment is above [`BLOCK`], is a start-up error.
async fn open_direct(path: &Path) -> Result<glommio::io::DmaFile> {
    ensure_first_block(path)
        .map_err(|e| StartError::io("creating cache file", Some(path.to_path_buf()), e))?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .dma_open(path)
        .await
        .map_err(|e| {
            let e = crate::device::to_io(e);
            if e.kind() == io::ErrorKind::InvalidInput {
                StartError::DirectIoUnsupported {
                    path: path.to_path_buf(),
                    source: e,
                }
            } else {
                StartError::io("opening cache file", Some(path.to_path_buf()), e)
            }
        })?;
    if file.alignment() > BLOCK {
        return Err(StartError::Config(format!(
            "{}: the device needs {}-byte O_DIRECT alignment; at most {BLOCK} is supported",
            path.display(),
            file.alignment()
        )));
    }
    Ok(file)
}

/// How an existing file's superblock differs from the configured geometry and identity (empty:
/// it can be used as it is).
fn mismatches(sb: &Superblock, geo: Geometry, ident: FileIdent) -> Vec<String> {
    let mut why = Vec::new();
    let g = sb.geometry;
    if g.page_size != geo.page_size {
        why.push(format!(
            "page size is {} (configured {})",
            g.page_size, geo.page_size
        ));
    }
    if g.chunk_size != geo.chunk_size {
        why.push(format!(
            "checksum chunk is {} (configured {})",
            g.chunk_size, geo.chunk_size
        ));
    }
    if g.nslots != geo.nslots {
        why.push(format!(
            "it holds {} slots, the configured capacity gives {}",
            g.nslots, geo.nslots
        ));
    }
    if sb.ident != ident {
        let (a, b) = (sb.ident, ident);
        why.push(format!(
            "it belongs to shard {}/{} dir {}/{} (now shard {}/{} dir {}/{})",
            a.shard, a.shards, a.dir, a.dirs, b.shard, b.shards, b.dir, b.dirs
        ));
    }
    why
}

impl CacheFile {
    /// Opens (creating or formatting as needed) the cache file at `path` and recovers its index.
    /// `rules` is the engine's rule table: pages stored under another set of rule prefixes are
    /// dropped (see [`CacheFile::recover`]).
    pub(crate) async fn open(
        path: &Path,
        geo: Geometry,
        ident: FileIdent,
        reformat: bool,
        hooks: Option<Arc<dyn DiskHooks>>,
        rules: &Rules,
    ) -> Result<(CacheFile, Recovered)> {
        let existed = path.exists();
        let file = open_direct(path).await?;
        let ioerr = |op: &'static str| {
            let p = path.to_path_buf();
            move |e: glommio::GlommioError<()>| StartError::io(op, Some(p), crate::device::to_io(e))
        };
        let size = file.file_size().await.map_err(ioerr("reading size of"))?;
        let dev = Device::new(file, path.to_path_buf(), ident.shard as usize, hooks);
        let mut cf = CacheFile {
            dev,
            geo,
            mirror: RefCell::new(Vec::new()),
            blocks: RefCell::new(vec![
                BlockWrites::default();
                (geo.meta_end / BLOCK) as usize
            ]),
            written: Event::default(),
            meta_writes: Cell::new(0),
        };

        let mut need_format = !existed || size == 0;
        let mut found = None;
        if !need_format {
            let first = cf
                .dev
                .read(0, BLOCK as usize)
                .await
                .map_err(|e| StartError::io("reading superblock of", Some(path.into()), e))?;
            match Superblock::decode(&first) {
                Err(SuperError::Blank) => need_format = true,
                Err(SuperError::Version(v)) => {
                    // Another release's cache: not damage. Keep it unless told to discard it.
                    let reason = format!("format version {v}, this build reads {FORMAT_VERSION}");
                    if !reformat {
                        return Err(StartError::Incompatible {
                            path: path.to_path_buf(),
                            reason,
                        });
                    }
                    tracing::warn!(path = %path.display(), %reason, "reformatting cache file");
                    need_format = true;
                }
                Err(SuperError::Invalid(why)) if size >= geo.file_size => {
                    // Damage, not a setting. Clean pages are only copies, but dirty ones may be
                    // the only copy of acknowledged writes: recover under the configured
                    // geometry (each header names its slot and carries its checksum, and every
                    // page read is checked), keeping dirty pages alone, as when the rule
                    // prefixes change (an unknown fingerprint), and write a new superblock.
                    tracing::warn!(
                        path = %path.display(),
                        %why,
                        "cache file superblock damaged; rebuilding it from the configuration, \
                         keeping dirty pages and dropping clean ones"
                    );
                    found = Some(Superblock {
                        geometry: geo,
                        ident,
                        created_ms: now_ms(),
                        instance: random_u128(),
                        rules: rules.fingerprint().wrapping_add(1),
                    });
                }
                Err(SuperError::Invalid(why)) => {
                    // Damaged and shorter than the configured geometry: nothing to recover.
                    tracing::warn!(path = %path.display(), %why, "cache file damaged; reformatting");
                    need_format = true;
                }
                Ok(sb) => {
                    let why = mismatches(&sb, geo, ident);
                    found = Some(sb);
                    if why.is_empty() && size < geo.file_size {
                        let dirty = cf.count_dirty(&sb, size).await?;
                        if dirty > 0 {
                            return Err(StartError::Incompatible {
                                path: path.to_path_buf(),
                                reason: format!(
                                    "the file was cut to {size} of {} bytes, and it holds {dirty} \
                                     dirty page(s) (write-back data not in the store yet) that \
                                     rebuilding it would lose: restore the file, or delete it \
                                     to discard them",
                                    geo.file_size
                                ),
                            });
                        }
                        tracing::warn!(path = %path.display(), size, "cache file truncated; reformatting");
                        need_format = true;
                    } else if !why.is_empty() {
                        if !reformat {
                            return Err(StartError::Incompatible {
                                path: path.to_path_buf(),
                                reason: why.join("; "),
                            });
                        }
                        // Reformatting discards copies, never the only copy of acknowledged
                        // writes: dirty pages stop it.
                        let dirty = cf.count_dirty(&sb, size).await?;
                        if dirty > 0 {
                            return Err(StartError::Incompatible {
                                path: path.to_path_buf(),
                                reason: format!(
                                    "{}; and it holds {dirty} dirty page(s) (write-back data not \
                                     in the store yet), which reformat would lose: start with \
                                     the old settings and run `pagectl sync /` first (or delete \
                                     the file to discard them)",
                                    why.join("; ")
                                ),
                            });
                        }
                        tracing::warn!(path = %path.display(), reason = %why.join("; "), "reformatting cache file");
                        need_format = true;
                    }
                }
            }
        }

        let fingerprint = rules.fingerprint();
        let sb = match found {
            Some(sb) if !need_format => sb,
            _ => {
                cf.format(ident, fingerprint).await?;
                return Ok((
                    cf,
                    Recovered {
                        formatted: true,
                        ..Default::default()
                    },
                ));
            }
        };
        let rec = cf.recover(sb, fingerprint, rules.len()).await?;
        Ok((cf, rec))
    }

    /// Slot headers marked dirty in a file laid out as `sb` says (of `size` bytes), read from
    /// disk: what a reformat would lose that no store holds.
    async fn count_dirty(&self, sb: &Superblock, size: u64) -> Result<u64> {
        let g = sb.geometry;
        let end = g
            .header_off(g.nslots)
            .next_multiple_of(BLOCK)
            .min(size / BLOCK * BLOCK);
        let mut dirty = 0u64;
        let mut pos = 0u64;
        while pos < end {
            let len = RECOVERY_READ.min(end - pos);
            let r = self.dev.read(pos, len as usize).await.map_err(|e| {
                StartError::io(
                    "reading cache metadata of",
                    Some(self.dev.path().clone()),
                    e,
                )
            })?;
            let first = g.header_off(0).max(pos).saturating_sub(pos) as usize;
            for ho in (first..r.len()).step_by(64) {
                let slot = (pos + ho as u64 - g.header_off(0)) / 64;
                let Ok(slot) = u32::try_from(slot) else { break };
                if slot >= g.nslots || ho + 64 > r.len() {
                    break;
                }
                if let HeaderState::Valid(h) =
                    SlotHeader::decode(slot, g.page_size, &r[ho..ho + 64])
                {
                    dirty += u64::from(h.flags & FLAG_DIRTY != 0);
                }
            }
            pos += len;
        }
        Ok(dirty)
    }

    async fn format(&mut self, ident: FileIdent, rules: u64) -> Result<()> {
        let path = self.dev.path().clone();
        let err = |op: &'static str, p: &PathBuf| {
            let p = p.clone();
            move |e: io::Error| StartError::io(op, Some(p), e)
        };
        // Drop all old content first: fresh extents read as zeroes, so every header is empty.
        self.dev
            .truncate(0)
            .await
            .map_err(err("truncating", &path))?;
        match self.dev.preallocate(self.geo.file_size).await {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                tracing::warn!(path = %path.display(), "fallocate unsupported; cache file will be sparse");
                self.dev
                    .truncate(self.geo.file_size)
                    .await
                    .map_err(err("sizing", &path))?;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                let available = crate::probe::free_space(&path).unwrap_or(0);
                let _ = self.dev.truncate(0).await;
                return Err(StartError::NoSpace {
                    path,
                    needed: self.geo.file_size,
                    available,
                });
            }
            Err(e) => return Err(StartError::io("preallocating", Some(path), e)),
        }
        let mut mirror = vec![0u8; self.geo.meta_end as usize];
        Superblock {
            geometry: self.geo,
            ident,
            created_ms: now_ms(),
            instance: random_u128(),
            rules,
        }
        .encode(&mut mirror[..BLOCK as usize]);
        *self.mirror.borrow_mut() = mirror;
        self.write_block(0)
            .await
            .map_err(err("writing superblock of", &path))?;
        self.dev.sync().await.map_err(err("syncing", &path))?;
        Ok(())
    }

    /// Loads the metadata region and returns every page whose header and checksum table agree.
    /// Damaged headers are cleared on disk. Page data is not read.
    ///
    /// `sb` is the file's superblock. If it records another rule fingerprint than `fingerprint`
    /// (the set of rule prefixes changed), every page is dropped: its rule number may now name
    /// another rule, and a page that a new rule covers has no number at all. Pages whose rule
    /// number is past the `nrules` rules are dropped too. The superblock gets the new
    /// fingerprint once the cleared headers are on disk.
    async fn recover(
        &mut self,
        sb: Superblock,
        fingerprint: u64,
        nrules: usize,
    ) -> Result<Recovered> {
        let path = self.dev.path().clone();
        let mut mirror = vec![0u8; self.geo.meta_end as usize];
        let mut pos = 0u64;
        while pos < self.geo.meta_end {
            let len = RECOVERY_READ.min(self.geo.meta_end - pos);
            let r =
                self.dev.read(pos, len as usize).await.map_err(|e| {
                    StartError::io("reading cache metadata of", Some(path.clone()), e)
                })?;
            if r.len() as u64 != len {
                return Err(StartError::Incompatible {
                    path,
                    reason: "metadata region shorter than expected".into(),
                });
            }
            mirror[pos as usize..(pos + len) as usize].copy_from_slice(&r);
            pos += len;
        }

        let g = self.geo;
        let mut rec = Recovered::default();
        let mut dirty_blocks = Vec::new();
        let rules_changed = sb.rules != fingerprint;
        let mut rule_dropped = 0u64;
        let mut rule_cleared = 0u64;
        for slot in 0..g.nslots {
            let ho = g.header_off(slot) as usize;
            match SlotHeader::decode(slot, g.page_size, &mirror[ho..ho + 64]) {
                HeaderState::Empty => {}
                HeaderState::Valid(h) => {
                    let to = g.table_off(slot) as usize;
                    let n = g.chunks_for(h.len) as usize * 4;
                    let whole = crc32fast::hash(&mirror[to..to + n]) == h.data_crc;
                    let rule_unknown = rules_changed || usize::from(h.rule) > nrules;
                    if whole && !rule_unknown {
                        rec.pages.push((slot, h));
                    } else if whole && h.flags & FLAG_DIRTY != 0 {
                        // A dirty page may be the only copy of acknowledged bytes: it stays,
                        // under no rule (a rule only sets eviction, TTL and quota, and a dirty
                        // page is not evicted until it is flushed).
                        let h = SlotHeader { rule: 0, ..h };
                        h.encode(slot, &mut mirror[ho..ho + 64]);
                        dirty_blocks.push(ho as u64 / BLOCK);
                        rec.pages.push((slot, h));
                        rule_cleared += 1;
                    } else {
                        clear_header(&mut mirror[ho..ho + 64]);
                        dirty_blocks.push(ho as u64 / BLOCK);
                        if whole {
                            rule_dropped += 1;
                        } else {
                            rec.dropped += 1;
                        }
                    }
                }
                HeaderState::Invalid => {
                    clear_header(&mut mirror[ho..ho + 64]);
                    dirty_blocks.push(ho as u64 / BLOCK);
                    rec.dropped += 1;
                }
            }
        }
        *self.mirror.borrow_mut() = mirror;
        dirty_blocks.dedup();
        for b in dirty_blocks {
            self.persist_block(b).await.map_err(|e| {
                StartError::io("clearing damaged headers in", Some(path.clone()), e)
            })?;
        }
        if rule_dropped > 0 {
            tracing::warn!(
                path = %path.display(),
                pages = rule_dropped,
                "the rule prefixes changed since these pages were stored; dropped them (their \
                 rule cannot be recomputed without their paths)"
            );
            rec.dropped += rule_dropped;
        }
        if rule_cleared > 0 {
            tracing::warn!(
                path = %path.display(),
                pages = rule_cleared,
                "kept dirty pages whose rule is unknown now, under no rule"
            );
        }
        if rules_changed {
            // The cleared headers must be on disk before the superblock says the remaining
            // rule numbers (none) follow the new table.
            self.dev
                .sync()
                .await
                .map_err(|e| StartError::io("syncing", Some(path.clone()), e))?;
            Superblock {
                rules: fingerprint,
                ..sb
            }
            .encode(&mut self.mirror.borrow_mut()[..BLOCK as usize]);
            self.persist_block(0)
                .await
                .map_err(|e| StartError::io("writing superblock of", Some(path.clone()), e))?;
        }
        Ok(rec)
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub(crate) fn device(&self) -> &Device {
        &self.dev
    }

    /// Number of metadata block writes issued so far.
    pub(crate) fn meta_writes(&self) -> u64 {
        self.meta_writes.get()
    }

    /// Runs `f` on the mirror bytes of a slot's header.
    pub(crate) fn with_header<R>(&self, slot: u32, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let o = self.geo.header_off(slot) as usize;
        f(&mut self.mirror.borrow_mut()[o..o + 64])
    }

    /// Runs `f` on the mirror bytes of a slot's checksum table (full page's worth).
    pub(crate) fn with_table<R>(&self, slot: u32, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let o = self.geo.table_off(slot) as usize;
        let n = self.geo.table_bytes() as usize;
        f(&mut self.mirror.borrow_mut()[o..o + n])
    }

    /// The stored checksum of chunk `chunk` of `slot`.
    pub(crate) fn chunk_crc(&self, slot: u32, chunk: u32) -> u32 {
        let o = (self.geo.table_off(slot) + chunk as u64 * 4) as usize;
        let m = self.mirror.borrow();
        u32::from_le_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]])
    }

    /// Persists the header of `slot`.
    pub(crate) async fn persist_header(&self, slot: u32) -> io::Result<()> {
        self.persist_block(self.geo.header_off(slot) / BLOCK).await
    }

    /// Persists the checksum table of `slot`. Tables of at least one block are block-aligned and
    /// owned by their slot alone, so they go out in one write; smaller tables share a block with
    /// their neighbours and go through the ordered block writer.
    pub(crate) async fn persist_table(&self, slot: u32) -> io::Result<()> {
        let start = self.geo.table_off(slot);
        let len = self.geo.table_bytes();
        if len < BLOCK {
            return self.persist_block(start / BLOCK).await;
        }
        self.write_blocks(start / BLOCK, len / BLOCK).await
    }

    /// Returns once the current mirror content of `block` is on disk.
    pub(crate) async fn persist_block(&self, block: u64) -> io::Result<()> {
        let b = block as usize;
        let need = self.blocks.borrow()[b].started + 1;
        loop {
            let st = self.blocks.borrow()[b];
            if st.completed >= need {
                return if st.last_ok {
                    Ok(())
                } else {
                    Err(io::Error::other("metadata block write failed"))
                };
            }
            if st.writing {
                self.written.listen().await;
                continue;
            }
            let round = {
                let mut blocks = self.blocks.borrow_mut();
                blocks[b].started += 1;
                blocks[b].writing = true;
                blocks[b].started
            };
            let r = self.write_block(block).await;
            {
                let mut blocks = self.blocks.borrow_mut();
                blocks[b].writing = false;
                blocks[b].completed = round;
                blocks[b].last_ok = r.is_ok();
            }
            self.written.notify_all();
            if round >= need {
                return r;
            }
        }
    }

    async fn write_block(&self, block: u64) -> io::Result<()> {
        self.write_blocks(block, 1).await
    }

    async fn write_blocks(&self, first: u64, count: u64) -> io::Result<()> {
        let len = (count * BLOCK) as usize;
        let mut buf = self.dev.alloc(len);
        {
            let m = self.mirror.borrow();
            let o = (first * BLOCK) as usize;
            buf.as_bytes_mut().copy_from_slice(&m[o..o + len]);
        }
        self.meta_writes.set(self.meta_writes.get() + 1);
        self.dev.write(buf, first * BLOCK).await
    }

    pub(crate) async fn sync(&self) -> io::Result<()> {
        self.dev.sync().await
    }

    pub(crate) async fn close(self) -> io::Result<()> {
        self.dev.close().await
    }
}
