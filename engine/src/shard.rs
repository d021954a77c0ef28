//! One shard: the cache files, index and counters owned by one core.
//!
//! Everything here runs on the shard's own executor thread. State lives in `RefCell`/`Cell`
//! (never a lock) and no borrow is held across an `.await`. The hit path ([`Shard::get`]) is:
//! index lookup (B-tree, no allocation) → one O_DIRECT read of the checksum chunks that cover the
//! requested range → checksum verification → the caller gets a view into the buffer the disk
//! wrote into.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    ops::Deref,
    rc::Rc,
    sync::Arc,
};

use glommio::io::{DmaBuffer, ReadResult};

use crate::{
    cachefile::{now_ms, CacheFile, Recovered},
    error::{EngineError, Result},
    event::Event,
    format::{Geometry, SlotHeader, FLAG_DIRTY, FLAG_PINNED},
    index::{Index, Lookup, PageMeta, Removal, ReserveError, RuleStats, SlotState},
    key::PageKey,
    policy::SlotId,
    rules::{Rules, NO_RULE},
    stats::{Counters, ShardStats},
};

/// Bytes of one page (or part of one) read from the cache. Dereferences to the bytes; they live in
/// the DMA buffer the disk read went into (no copy).
pub struct PageData(Option<ReadResult>);

impl PageData {
    /// The underlying glommio buffer view, for zero-copy senders on the same executor.
    pub fn into_read_result(self) -> Option<ReadResult> {
        self.0
    }
}

impl Deref for PageData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Some(r) => r,
            None => &[],
        }
    }
}

impl std::fmt::Debug for PageData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageData({} bytes)", self.len())
    }
}

/// The bytes of a page being stored.
enum PageBytes<'a> {
    /// Borrowed; copied once into a DMA buffer.
    Slice(&'a [u8]),
    /// Already in a DMA buffer: the first `usize` bytes.
    Dma(DmaBuffer, usize),
}

impl PageBytes<'_> {
    /// The first `len` bytes of `buf`; `BufferTooShort` when it holds fewer.
    fn dma(buf: DmaBuffer, len: usize) -> Result<PageBytes<'static>> {
        if len > buf.len() {
            return Err(EngineError::BufferTooShort {
                len,
                capacity: buf.len(),
            });
        }
        Ok(PageBytes::Dma(buf, len))
    }

    fn len(&self) -> usize {
        match self {
            PageBytes::Slice(s) => s.len(),
            PageBytes::Dma(_, n) => *n,
        }
    }
}

/// What a put did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The page was written.
    Stored,
    /// The same key with the same version tag was already cached; nothing was written.
    AlreadyPresent,
}

/// What the index knows about a cached page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageInfo {
    /// Bytes in the page.
    pub len: u32,
    /// Under-storage version tag given at put time.
    pub version: u64,
    /// Insert time (ms since the Unix epoch).
    pub inserted_ms: u64,
    /// Whether the page is pinned (by request or by its rule).
    pub pinned: bool,
    /// Whether the page is dirty (never evicted; see [`Shard::put_dirty`]).
    pub dirty: bool,
    /// The page's rule number (0: none; see [`Shard::rules`]).
    pub rule: u8,
}

/// The dirty pages one shard holds of one file ([`Shard::dirty_files`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyFile {
    /// The file id (of a write-back version).
    pub file_id: u128,
    /// Dirty pages of it.
    pub pages: u32,
    /// Their bytes.
    pub bytes: u64,
    /// When the newest of them was stored, or their writer last renewed them
    /// ([`Shard::renew_dirty`]), whichever is later (ms since the Unix epoch).
    pub newest_ms: u64,
}

/// Group commit of dirty pages: one `fdatasync` serves every write that completed before it
/// started. Generations count syncs started; a write is durable once a sync of a generation
/// started after it has succeeded.
#[derive(Default)]
struct SyncState {
    started: Cell<u64>,
    completed: Cell<u64>,
    last_ok: Cell<u64>,
    running: Cell<bool>,
    done: Event,
}

/// Recovery figures of one shard.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecoveryInfo {
    pub pages: u64,
    pub dropped: u64,
    pub micros: u64,
}

/// A shard's state. Only reachable on its own executor (it is `!Send`); other threads go through
/// [`crate::ShardHandle`].
pub struct Shard {
    id: usize,
    geo: Geometry,
    files: Vec<CacheFile>,
    index: RefCell<Index>,
    /// Puts in progress, so concurrent puts of one key are coalesced.
    filling: RefCell<HashMap<PageKey, Rc<Event>>>,
    /// Notified when the last reader of a removed page finishes.
    reads_done: Event,
    counters: Counters,
    recovery: Cell<RecoveryInfo>,
    rules: Arc<Rules>,
    /// The most bytes of dirty pages this shard takes.
    dirty_limit: u64,
    sync: SyncState,
    /// When the writer of each version with dirty pages here last said it is still writing
    /// it ([`Shard::renew_dirty`]; ms since the Unix epoch). Only versions with dirty pages
    /// have an entry.
    renewed: RefCell<HashMap<u128, u64>>,
}

/// Ends a read when dropped, even if the reading future is cancelled.
struct ReadGuard<'a> {
    shard: &'a Shard,
    slot: SlotId,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if self.shard.index.borrow_mut().end_read(self.slot) {
            self.shard.reads_done.notify_all();
        }
    }
}

/// Removes the coalescing entry of a put when dropped, and wakes the puts waiting on it.
struct FillGuard<'a> {
    shard: &'a Shard,
    key: PageKey,
}

impl Drop for FillGuard<'_> {
    fn drop(&mut self) {
        if let Some(ev) = self.shard.filling.borrow_mut().remove(&self.key) {
            ev.notify_all();
        }
    }
}

impl Shard {
    pub(crate) fn new(
        id: usize,
        files: Vec<(CacheFile, Recovered)>,
        index: Index,
        started: std::time::Instant,
        rules: Arc<Rules>,
        dirty_limit: u64,
    ) -> Shard {
        let geo = *files[0].0.geometry();
        let mut shard = Shard {
            id,
            geo,
            files: Vec::with_capacity(files.len()),
            index: RefCell::new(index),
            filling: RefCell::new(HashMap::new()),
            reads_done: Event::default(),
            counters: Counters::default(),
            recovery: Cell::new(RecoveryInfo::default()),
            rules,
            dirty_limit,
            sync: SyncState::default(),
            renewed: RefCell::new(HashMap::new()),
        };
        // Restore pages oldest first so the eviction order approximates the old one.
        let mut restored: Vec<(SlotId, SlotHeader)> = Vec::new();
        let mut dropped = 0;
        for (fi, (file, rec)) in files.into_iter().enumerate() {
            dropped += rec.dropped;
            if rec.formatted {
                tracing::info!(shard = id, path = %file.device().path().display(), "new cache file formatted");
            }
            restored.extend(
                rec.pages
                    .into_iter()
                    .map(|(local, h)| (fi as u32 * geo.nslots + local, h)),
            );
            shard.files.push(file);
        }
        restored.sort_by_key(|(slot, h)| (h.inserted_ms, *slot));
        let mut losers = Vec::new();
        let kept;
        {
            let mut index = shard.index.borrow_mut();
            for (slot, h) in &restored {
                let meta = PageMeta {
                    len: h.len,
                    version: h.version,
                    inserted_ms: h.inserted_ms,
                };
                let pinned = h.flags & FLAG_PINNED != 0;
                let dirty = h.flags & FLAG_DIRTY != 0;
                if let Some(loser) = index.restore_with(*slot, h.key, meta, pinned, dirty, h.rule) {
                    losers.push(loser);
                }
            }
            // Duplicates (a crash between publishing a replacement and clearing the old copy):
            // the older copy is forgotten; its header is cleared before the slot is reused.
            for slot in &losers {
                index.reclaimed(*slot, false);
            }
            // A quota lowered since the pages were stored: the rule's oldest pages go the same way
            // (counted as quota evictions, not as damage).
            let trimmed = index.enforce_quotas();
            for slot in &trimmed {
                index.reclaimed(*slot, false);
            }
            kept = index.len();
        }
        shard.recovery.set(RecoveryInfo {
            pages: kept as u64,
            dropped: dropped + losers.len() as u64,
            micros: started.elapsed().as_micros() as u64,
        });
        shard
    }

    /// This shard's index (0-based).
    pub fn id(&self) -> usize {
        self.id
    }

    /// The engine's rule table (rule numbers for [`Shard::put_in_rule`]).
    pub fn rules(&self) -> &Arc<Rules> {
        &self.rules
    }

    /// Accounting of every rule on this shard, indexed by rule number (entry 0: pages no rule
    /// covers).
    pub fn rule_stats(&self) -> Vec<RuleStats> {
        let index = self.index.borrow();
        (0..index.rule_count())
            .map(|r| index.rule_stats(r as u8))
            .collect()
    }

    /// The cache's page size.
    pub fn page_size(&self) -> u32 {
        self.geo.page_size
    }

    fn locate(&self, slot: SlotId) -> (&CacheFile, u32) {
        let n = self.geo.nslots;
        (&self.files[(slot / n) as usize], slot % n)
    }

    fn info_of(&self, slot: SlotId) -> PageInfo {
        let index = self.index.borrow();
        let s = index.slot(slot);
        PageInfo {
            len: s.meta.len,
            version: s.meta.version,
            inserted_ms: s.meta.inserted_ms,
            pinned: s.pinned_any(),
            dirty: s.dirty,
            rule: s.rule,
        }
    }

    /// The clock the index's TTL checks need: the wall clock pages are stamped with, read only
    /// when some rule has a TTL.
    fn now_for(index: &Index) -> u64 {
        if index.has_ttl() {
            now_ms()
        } else {
            0
        }
    }

    /// Whether a page is cached and readable (a page past its rule's TTL is not).
    pub fn contains(&self, key: &PageKey) -> bool {
        let index = self.index.borrow();
        index.lookup_live(key, Self::now_for(&index)).is_some()
    }

    /// What the index knows about a cached page (none for a page past its rule's TTL).
    pub fn page_info(&self, key: &PageKey) -> Option<PageInfo> {
        let slot = {
            let index = self.index.borrow();
            index.lookup_live(key, Self::now_for(&index))?
        };
        Some(self.info_of(slot))
    }

    /// Reads bytes `[offset, offset + len)` of a page, clipped to the page's length.
    ///
    /// `Ok(None)` is a miss: the page is not cached, or it was and failed its checksum (it is then
    /// dropped and counted; corrupt bytes are never returned), or it was past its rule's TTL (it
    /// is then dropped and counted). An `offset` past the end of the page is
    /// [`EngineError::BadRange`].
    pub async fn get(&self, key: &PageKey, offset: u32, len: u32) -> Result<Option<PageData>> {
        Ok(self.read(key, offset, len).await?.map(|(data, _)| data))
    }

    /// Like [`Shard::get`], also returning what the index knows about the page that was read
    /// (its length and version tag, consistent with the bytes).
    pub async fn read(
        &self,
        key: &PageKey,
        offset: u32,
        len: u32,
    ) -> Result<Option<(PageData, PageInfo)>> {
        let lookup = {
            let mut index = self.index.borrow_mut();
            let now = Self::now_for(&index);
            index.begin_read(key, now)
        };
        let (slot, meta) = match lookup {
            Lookup::Hit(slot, meta) => (slot, meta),
            Lookup::Miss => {
                self.counters.misses.set(self.counters.misses.get() + 1);
                return Ok(None);
            }
            Lookup::Expired(removal) => {
                self.counters.misses.set(self.counters.misses.get() + 1);
                // As for a corrupt page: the miss is the answer; a failed clear only means the
                // page is dropped again after a restart.
                let _ = self.reclaim(removal).await;
                return Ok(None);
            }
        };
        let guard = ReadGuard { shard: self, slot };
        if offset > meta.len {
            return Err(EngineError::BadRange {
                offset,
                page_len: meta.len,
            });
        }
        let end = offset.saturating_add(len).min(meta.len);
        if end == offset {
            self.count_hit(0);
            return Ok(Some((PageData(None), self.info_of(slot))));
        }
        let chunk = self.geo.chunk_size;
        let first = offset / chunk;
        let last = end.div_ceil(chunk); // exclusive
        let start = first * chunk;
        // The stored bytes end at the page length rounded up to a block.
        let stop = (last * chunk).min(meta.len.next_multiple_of(4096));
        let (file, local) = self.locate(slot);
        let pos = self.geo.data_off(local) + start as u64;
        let read = match file.device().read(pos, (stop - start) as usize).await {
            Ok(r) => r,
            Err(e) => {
                self.counters
                    .io_errors
                    .set(self.counters.io_errors.get() + 1);
                return Err(EngineError::io(
                    "reading page from",
                    Some(file.device().path().clone()),
                    e,
                ));
            }
        };
        let verified = (first..last).all(|c| {
            let lo = (c * chunk - start) as usize;
            let hi = (((c + 1) * chunk).min(meta.len) - start) as usize;
            hi <= read.len() && crc32fast::hash(&read[lo..hi]) == file.chunk_crc(local, c)
        });
        if !verified {
            drop(guard);
            self.counters
                .checksum_failures
                .set(self.counters.checksum_failures.get() + 1);
            self.counters.misses.set(self.counters.misses.get() + 1);
            tracing::warn!(shard = self.id, %key, slot, "page failed its checksum; dropped");
            let removal = self.index.borrow_mut().remove_if_slot(key, slot);
            // The miss is the answer; failing to clear the header only means the page is checked
            // (and dropped) again after a restart.
            let _ = self.reclaim(removal).await;
            return Ok(None);
        }
        let n = end - offset;
        self.count_hit(n as u64);
        let view = ReadResult::slice(&read, (offset - start) as usize, n as usize);
        let info = self.info_of(slot);
        drop(guard);
        Ok(Some((PageData(view), info)))
    }

    fn count_hit(&self, bytes: u64) {
        let c = &self.counters;
        c.hits.set(c.hits.get() + 1);
        c.hit_bytes.set(c.hit_bytes.get() + bytes);
    }

    /// Stores a page (at most the page size; only a file's last page should be short).
    ///
    /// Readers never see a partly written page: it becomes visible only after its data, checksums
    /// and header are on disk. A put of a key that is already cached with the same `version` does
    /// nothing; with another version the new page replaces the old. Concurrent puts of one key
    /// are coalesced: later ones wait for the first and then find the page present.
    pub async fn put(&self, key: &PageKey, data: &[u8], version: u64) -> Result<PutOutcome> {
        self.put_bytes(key, PageBytes::Slice(data), version, NO_RULE)
            .await
    }

    /// Stores a *dirty* page: one written through the cluster that the under storage does not
    /// hold yet. It replaces any cached copy of the key (whatever its version: a writer may
    /// rewrite a page), is never evicted (only [`Shard::mark_clean`] makes it an ordinary page,
    /// only [`Shard::discard_file`] and [`Shard::remove`] drop it), belongs to no rule, and is
    /// durable (`fdatasync`, shared with the other dirty puts in flight) when this returns.
    ///
    /// # Errors
    ///
    /// [`EngineError::DirtyFull`] when the page would take the shard past its dirty limit
    /// (nothing is stored), [`EngineError::CacheFull`] when no slot can be freed, and the errors
    /// of [`Shard::put`].
    pub async fn put_dirty(&self, key: &PageKey, data: &[u8], version: u64) -> Result<()> {
        self.put_dirty_bytes(key, PageBytes::Slice(data), version)
            .await
    }

    /// Like [`Shard::put_dirty`], for bytes already in a DMA buffer (from
    /// [`Shard::alloc_buffer`]): the first `len` bytes are the page, written without another
    /// copy.
    ///
    /// # Errors
    ///
    /// As [`Shard::put_dirty`], and [`EngineError::BufferTooShort`] when `len` exceeds the
    /// buffer.
    pub async fn put_dirty_buffer(
        &self,
        key: &PageKey,
        buf: DmaBuffer,
        len: usize,
        version: u64,
    ) -> Result<()> {
        self.put_dirty_bytes(key, PageBytes::dma(buf, len)?, version)
            .await
    }

    async fn put_dirty_bytes(
        &self,
        key: &PageKey,
        data: PageBytes<'_>,
        version: u64,
    ) -> Result<()> {
        if data.len() > self.geo.page_size as usize {
            return Err(EngineError::PageTooLarge {
                len: data.len(),
                page_size: self.geo.page_size,
            });
        }
        loop {
            let pending = self.filling.borrow().get(key).cloned();
            match pending {
                Some(ev) => ev.listen().await,
                None => break,
            }
        }
        {
            let index = self.index.borrow();
            let replaced = index
                .lookup(key)
                .map(|s| index.slot(s))
                .filter(|s| s.dirty)
                .map_or(0, |s| u64::from(s.meta.len));
            let dirty = index.dirty_bytes();
            if dirty - replaced + data.len() as u64 > self.dirty_limit {
                let c = &self.counters;
                c.dirty_refused.set(c.dirty_refused.get() + 1);
                return Err(EngineError::DirtyFull {
                    dirty,
                    limit: self.dirty_limit,
                });
            }
        }
        self.filling
            .borrow_mut()
            .insert(*key, Rc::new(Event::default()));
        let fill = FillGuard {
            shard: self,
            key: *key,
        };
        self.store(key, data, version, NO_RULE, true).await?;
        drop(fill);
        self.durable().await?;
        let c = &self.counters;
        c.dirty_puts.set(c.dirty_puts.get() + 1);
        Ok(())
    }

    /// Waits until everything written before the call is on stable storage: a `fdatasync` of
    /// every cache file that started after the call, shared by all callers waiting for one.
    async fn durable(&self) -> Result<()> {
        let s = &self.sync;
        let need = s.started.get() + 1;
        loop {
            if s.last_ok.get() >= need {
                return Ok(());
            }
            if !s.running.get() {
                s.running.set(true);
                let generation = s.started.get() + 1;
                s.started.set(generation);
                let r = self.sync().await;
                s.completed.set(generation);
                if r.is_ok() {
                    s.last_ok.set(generation);
                }
                s.running.set(false);
                s.done.notify_all();
                self.counters.syncs.set(self.counters.syncs.get() + 1);
                if generation >= need {
                    return r;
                }
                continue;
            }
            let wait = s.done.listen();
            if s.running.get() {
                wait.await;
            }
            if s.completed.get() >= need && s.last_ok.get() < need {
                return Err(EngineError::io(
                    "syncing dirty pages to",
                    Some(self.files[0].device().path().clone()),
                    std::io::Error::other("the sync covering this write failed"),
                ));
            }
        }
    }

    /// Like [`Shard::put`], for a page of rule number `rule` ([`Rules::classify`] of its file's
    /// path): the page counts against the rule's quota (the rule's oldest page makes room when
    /// it is at its quota), expires after its TTL, and is pinned if the rule pins. An unknown
    /// rule number stores the page under no rule.
    ///
    /// # Errors
    ///
    /// As [`Shard::put`], and [`EngineError::QuotaFull`] when the rule is at its quota and none
    /// of its pages can be evicted.
    pub async fn put_in_rule(
        &self,
        key: &PageKey,
        data: &[u8],
        version: u64,
        rule: u8,
    ) -> Result<PutOutcome> {
        self.put_bytes(key, PageBytes::Slice(data), version, rule)
            .await
    }

    /// A buffer for [`Shard::put_buffer`]: `len` rounded up to 4096 bytes, suitable for O_DIRECT
    /// (from this shard's registered arena when it has room).
    pub fn alloc_buffer(&self, len: usize) -> DmaBuffer {
        self.files[0]
            .device()
            .alloc(len.next_multiple_of(4096).max(4096))
    }

    /// Like [`Shard::put`], for bytes already in a DMA buffer (from [`Shard::alloc_buffer`]): the
    /// first `len` bytes are the page, and they are written without another copy.
    pub async fn put_buffer(
        &self,
        key: &PageKey,
        buf: DmaBuffer,
        len: usize,
        version: u64,
    ) -> Result<PutOutcome> {
        self.put_bytes(key, PageBytes::dma(buf, len)?, version, NO_RULE)
            .await
    }

    async fn put_bytes(
        &self,
        key: &PageKey,
        data: PageBytes<'_>,
        version: u64,
        rule: u8,
    ) -> Result<PutOutcome> {
        if data.len() > self.geo.page_size as usize {
            return Err(EngineError::PageTooLarge {
                len: data.len(),
                page_size: self.geo.page_size,
            });
        }
        loop {
            if let Some(info) = self.page_info(key) {
                if info.version == version {
                    return Ok(PutOutcome::AlreadyPresent);
                }
            }
            let pending = self.filling.borrow().get(key).cloned();
            match pending {
                Some(ev) => ev.listen().await,
                None => break,
            }
        }
        self.filling
            .borrow_mut()
            .insert(*key, Rc::new(Event::default()));
        let _fill = FillGuard {
            shard: self,
            key: *key,
        };
        self.store(key, data, version, rule, false).await?;
        Ok(PutOutcome::Stored)
    }

    // Long because: the three crash-ordered steps (clear the old header, write data and
    // table, write the header) read best in one place; each is a short block below.
    async fn store(
        &self,
        key: &PageKey,
        data: PageBytes<'_>,
        version: u64,
        rule: u8,
        dirty: bool,
    ) -> Result<()> {
        let res = self.index.borrow_mut().reserve_for(rule);
        let r = res.map_err(|e| match e {
            ReserveError::Full => EngineError::CacheFull,
            ReserveError::Quota { rule } => EngineError::QuotaFull {
                rule: self
                    .rules
                    .get(rule)
                    .map_or_else(|| format!("#{rule}"), |r| r.prefix.clone()),
            },
        })?;
        // The rule the index reserved for (an unknown number is stored as no rule).
        let rule = self.index.borrow().slot(r.slot).rule;
        if r.evicted.is_some() {
            self.counters
                .evictions
                .set(self.counters.evictions.get() + 1);
        }
        let slot = r.slot;
        let (file, local) = self.locate(slot);
        let path = || Some(file.device().path().clone());
        let fail = |needs_clear: bool, op: &'static str, e: std::io::Error| {
            self.index.borrow_mut().abort(slot, needs_clear);
            self.counters
                .io_errors
                .set(self.counters.io_errors.get() + 1);
            EngineError::io(op, path(), e)
        };

        // 1. A slot that held a page gets its header cleared first, so no crash can leave the
        //    old header describing the new bytes.
        if r.needs_clear {
            file.with_header(local, crate::format::clear_header);
            if let Err(e) = file.persist_header(local).await {
                return Err(fail(true, "clearing slot header in", e));
            }
        }

        // 2. Data and checksum table. Both belong to a slot no header points at yet.
        let len = data.len() as u32;
        let padded = data.len().next_multiple_of(4096);
        let mut buf = match data {
            PageBytes::Slice(d) => {
                let mut b = file.device().alloc(padded.max(4096));
                b.as_bytes_mut()[..d.len()].copy_from_slice(d);
                b
            }
            PageBytes::Dma(b, _) => b,
        };
        buf.as_bytes_mut()[len as usize..padded].fill(0);
        buf.trim_to_size(padded);
        let chunk = self.geo.chunk_size as usize;
        let chunks = self.geo.chunks_for(len);
        let data_crc = file.with_table(local, |table| {
            table.fill(0);
            for (i, c) in buf.as_bytes()[..len as usize].chunks(chunk).enumerate() {
                table[i * 4..i * 4 + 4].copy_from_slice(&crc32fast::hash(c).to_le_bytes());
            }
            crc32fast::hash(&table[..chunks as usize * 4])
        });
        if len > 0 {
            let (w, t) = futures_lite::future::zip(
                file.device().write(buf, self.geo.data_off(local)),
                file.persist_table(local),
            )
            .await;
            if let Err(e) = w.and(t) {
                return Err(fail(false, "writing page to", e));
            }
        }

        // 3. The header makes the page exist. A pin by request carries over to the new copy.
        //    The new copy is stamped later than the old one, so that recovery, finding both
        //    (a crash before the old header is cleared), keeps the new one.
        let (old_pinned, old_ms) = {
            let index = self.index.borrow();
            index.lookup(key).map_or((false, 0), |s| {
                let s = index.slot(s);
                (s.pinned, s.meta.inserted_ms)
            })
        };
        let header = SlotHeader {
            key: *key,
            len,
            data_crc,
            version,
            inserted_ms: now_ms().max(old_ms + 1),
            flags: if old_pinned { FLAG_PINNED } else { 0 } | if dirty { FLAG_DIRTY } else { 0 },
            rule,
        };
        file.with_header(local, |h| header.encode(local, h));
        if let Err(e) = file.persist_header(local).await {
            file.with_header(local, crate::format::clear_header);
            return Err(fail(true, "writing page header to", e));
        }
        let meta = PageMeta {
            len,
            version,
            inserted_ms: header.inserted_ms,
        };
        let previous = self.index.borrow().lookup(key);
        let displaced = self
            .index
            .borrow_mut()
            .commit_with(slot, *key, meta, old_pinned, dirty);
        let c = &self.counters;
        c.inserts.set(c.inserts.get() + 1);
        c.insert_bytes.set(c.insert_bytes.get() + len as u64);
        // The replaced copy is reclaimed now, or once its readers finish.
        let removal = match (displaced, previous) {
            (Some(old), _) => Removal::Reclaim(old),
            (None, Some(old)) => Removal::Deferred(old),
            (None, None) => Removal::NotFound,
        };
        // A failed clear leaves the slot marked for clearing before reuse; the new page is stored.
        let _ = self.reclaim(removal).await;
        Ok(())
    }

    /// Clears the header of a page that left the index, once its readers are done, and frees the
    /// slot. Returns whether there was anything to reclaim.
    async fn reclaim(&self, removal: Removal) -> Result<bool> {
        let slot = match removal {
            Removal::NotFound => return Ok(false),
            Removal::Reclaim(slot) => slot,
            Removal::Deferred(slot) => {
                loop {
                    let wait = self.reads_done.listen();
                    if self.index.borrow().slot(slot).readers == 0 {
                        break;
                    }
                    wait.await;
                }
                slot
            }
        };
        debug_assert_eq!(self.index.borrow().slot(slot).state, SlotState::Doomed);
        let (file, local) = self.locate(slot);
        file.with_header(local, crate::format::clear_header);
        let r = file.persist_header(local).await;
        self.index.borrow_mut().reclaimed(slot, r.is_ok());
        match r {
            Ok(()) => Ok(true),
            Err(e) => {
                self.counters
                    .io_errors
                    .set(self.counters.io_errors.get() + 1);
                Err(EngineError::io(
                    "clearing page header in",
                    Some(file.device().path().clone()),
                    e,
                ))
            }
        }
    }

    /// Removes a page. Returns whether it was cached. Once this returns `Ok`, the removal is on
    /// disk (the page does not come back after a restart).
    pub async fn remove(&self, key: &PageKey) -> Result<bool> {
        let removal = self.index.borrow_mut().remove(key);
        let removed = self.reclaim(removal).await?;
        if removed {
            self.counters.removals.set(self.counters.removals.get() + 1);
        }
        Ok(removed)
    }

    /// Removes every cached page of a file except dirty ones (the only copies of data the under
    /// storage does not hold yet; see [`Shard::discard_file`]). Returns how many were removed.
    /// All of them leave the index at once (no later read sees any of them); the headers are
    /// then cleared on disk.
    pub async fn remove_file(&self, file_id: u128) -> Result<usize> {
        self.remove_pages(file_id, false).await
    }

    /// Demotes the evictable pages of `file_id` (a version a newer one replaced): they are
    /// evicted before any other page, while a reader that opened the version may still read
    /// them. Returns how many. No I/O.
    pub fn demote_file(&self, file_id: u128) -> usize {
        self.index.borrow_mut().demote_file(file_id)
    }

    /// Removes every page of a file, dirty ones too: for a write-back version that is gone
    /// (replaced, deleted or abandoned). Returns how many were removed.
    pub async fn discard_file(&self, file_id: u128) -> Result<usize> {
        self.renewed.borrow_mut().remove(&file_id);
        self.remove_pages(file_id, true).await
    }

    async fn remove_pages(&self, file_id: u128, dirty_too: bool) -> Result<usize> {
        let removals: Vec<Removal> = {
            let mut index = self.index.borrow_mut();
            let keys: Vec<PageKey> = index
                .file_keys(file_id)
                .filter(|k| dirty_too || index.lookup(k).is_none_or(|s| !index.slot(s).dirty))
                .collect();
            keys.iter().map(|k| index.remove(k)).collect()
        };
        let n = removals.len();
        self.counters
            .removals
            .set(self.counters.removals.get() + n as u64);
        let mut first_err = None;
        for r in removals {
            if let Err(e) = self.reclaim(r).await {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Pins or unpins a cached page. Pinned pages are never evicted; the pin is stored in the
    /// page header and survives restarts. A page its rule pins stays pinned when unpinned here.
    /// Returns whether the page is cached.
    pub async fn set_pinned(&self, key: &PageKey, pinned: bool) -> Result<bool> {
        let Some(slot) = self.index.borrow_mut().set_pinned(key, pinned) else {
            return Ok(false);
        };
        self.write_flag(slot, FLAG_PINNED, pinned, "writing pin flag to")
            .await?;
        Ok(true)
    }

    /// Sets or clears header flag `flag` of the page in `slot` and writes the header.
    async fn write_flag(&self, slot: SlotId, flag: u8, on: bool, op: &'static str) -> Result<()> {
        let (file, local) = self.locate(slot);
        let g = self.geo;
        file.with_header(local, |h| {
            if let crate::format::HeaderState::Valid(mut hdr) =
                SlotHeader::decode(local, g.page_size, h)
            {
                hdr.flags = if on {
                    hdr.flags | flag
                } else {
                    hdr.flags & !flag
                };
                hdr.encode(local, h);
            }
        });
        file.persist_header(local)
            .await
            .map_err(|e| EngineError::io(op, Some(file.device().path().clone()), e))
    }

    /// Makes every dirty page of a file an ordinary cached page (evictable): the under storage
    /// holds the file now. Returns how many pages changed. A page whose header cannot be
    /// rewritten stays clean in memory and becomes dirty again only after a restart (where the
    /// flusher finds it clean in the under storage again).
    pub async fn mark_clean(&self, file_id: u128) -> Result<usize> {
        self.renewed.borrow_mut().remove(&file_id);
        let slots: Vec<SlotId> = {
            let mut index = self.index.borrow_mut();
            let keys: Vec<PageKey> = index
                .file_keys(file_id)
                .filter(|k| index.lookup(k).is_some_and(|s| index.slot(s).dirty))
                .collect();
            keys.iter()
                .filter_map(|k| index.set_dirty(k, false))
                .collect()
        };
        let mut first_err = None;
        for &slot in &slots {
            if let Err(e) = self
                .write_flag(slot, FLAG_DIRTY, false, "writing dirty flag to")
                .await
            {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(slots.len()),
        }
    }

    /// The writer of write-back version `file_id` is still writing it, at `now_ms`: its dirty
    /// pages here count as stored then ([`DirtyFile::newest_ms`]), so they are not taken for
    /// a gone writer's. Returns the dirty pages held of it (0: none, and nothing is noted).
    pub fn renew_dirty(&self, file_id: u128, now_ms: u64) -> u32 {
        let pages = self.index.borrow().dirty_pages_of(file_id);
        if pages > 0 {
            let mut renewed = self.renewed.borrow_mut();
            let at = renewed.entry(file_id).or_insert(now_ms);
            *at = (*at).max(now_ms);
        }
        pages
    }

    /// The files this shard holds dirty pages of, in file id order.
    pub fn dirty_files(&self) -> Vec<DirtyFile> {
        let index = self.index.borrow();
        let mut renewed = self.renewed.borrow_mut();
        // Versions with no dirty page left here are forgotten.
        renewed.retain(|&f, _| index.dirty_pages_of(f) > 0);
        index
            .dirty_files()
            .map(|(file_id, pages)| {
                let (mut bytes, mut newest_ms) = (0, renewed.get(&file_id).copied().unwrap_or(0));
                for k in index.file_keys(file_id) {
                    if let Some(s) = index.lookup(&k).map(|s| index.slot(s)) {
                        if s.dirty {
                            bytes += u64::from(s.meta.len);
                            newest_ms = newest_ms.max(s.meta.inserted_ms);
                        }
                    }
                }
                DirtyFile {
                    file_id,
                    pages,
                    bytes,
                    newest_ms,
                }
            })
            .collect()
    }

    /// A snapshot of this shard's counters and occupancy.
    pub fn stats(&self) -> ShardStats {
        let index = self.index.borrow();
        let c = &self.counters;
        let rec = self.recovery.get();
        ShardStats {
            shard: self.id,
            slots: index.nslots() as u64,
            capacity_bytes: index.nslots() as u64 * self.geo.page_size as u64,
            pages: index.len() as u64,
            bytes: index.bytes(),
            hits: c.hits.get(),
            hit_bytes: c.hit_bytes.get(),
            misses: c.misses.get(),
            inserts: c.inserts.get(),
            insert_bytes: c.insert_bytes.get(),
            evictions: c.evictions.get(),
            removals: c.removals.get(),
            checksum_failures: c.checksum_failures.get(),
            io_errors: c.io_errors.get(),
            metadata_writes: self.files.iter().map(|f| f.meta_writes()).sum(),
            recovered_pages: rec.pages,
            recovery_dropped: rec.dropped,
            recovery_micros: rec.micros,
            dirty_pages: u64::from(index.dirty_pages()),
            dirty_bytes: index.dirty_bytes(),
            dirty_limit: self.dirty_limit,
            dirty_puts: c.dirty_puts.get(),
            dirty_refused: c.dirty_refused.get(),
            syncs: c.syncs.get(),
        }
    }

    /// Flushes the cache files to stable storage.
    pub async fn sync(&self) -> Result<()> {
        for f in &self.files {
            f.sync()
                .await
                .map_err(|e| EngineError::io("syncing", Some(f.device().path().clone()), e))?;
        }
        Ok(())
    }

    pub(crate) async fn close(self) -> Result<()> {
        self.sync().await?;
        for f in self.files {
            let p = f.device().path().clone();
            f.close()
                .await
                .map_err(|e| EngineError::io("closing", Some(p), e))?;
        }
        Ok(())
    }
}
