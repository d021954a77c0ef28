//! `raw`'s second reference: the same random reads as the glommio pass, on an io_uring that the
//! thread drives itself with the io-uring crate (issue 15's "disk I/O the shard drives itself").
//!
//! One thread per shard file, pinned like the shard executors, each with its own ring. Two set-ups:
//!
//! - `ring`: `IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN` (completions are handed
//!   over only when the thread asks for them, no task work interrupts it), the file and the
//!   buffers registered (`READ_FIXED`);
//! - `ring-plain`: a ring with no set-up flags and plain `READ`s into unregistered buffers.
//!
//! Both keep `--qd` reads in flight per thread: each completion's slot is refilled with a new
//! read before the next wait, so the queue never drains to refill in batches. What separates these
//! from glommio's `DmaFile` pass is the reactor alone (same file, offsets, depth and buffers
//! sizes), which is the measurement issue 15 asks for before the engine's disk I/O moves.

use std::{
    alloc::{alloc, dealloc, Layout},
    fs::OpenOptions,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use io_uring::{opcode, types, IoUring};

use crate::local::{new_hist, rng_next};

/// How a ring is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingSetup {
    /// Single issuer, deferred and cooperative task work, registered file and buffers.
    Tuned,
    /// No set-up flags, plain reads into unregistered buffers.
    Plain,
}

impl RingSetup {
    /// The workload name prefix in reports.
    pub fn name(self) -> &'static str {
        match self {
            RingSetup::Tuned => "ring",
            RingSetup::Plain => "ring-plain",
        }
    }
}

/// Where the reads go: the data area of one shard file.
#[derive(Clone, Copy, Debug)]
pub struct Area {
    /// Offset of the first slot's data.
    pub data_off: u64,
    /// Slots (pages) in the file.
    pub pages: u64,
    /// Slot size.
    pub page: u64,
    /// Bytes per read (4 KiB or the page size).
    pub block: u64,
}

/// `qd` aligned buffers of `len` bytes, freed on drop.
struct Buffers {
    ptrs: Vec<*mut u8>,
    layout: Layout,
}

impl Buffers {
    fn new(qd: usize, len: usize) -> Result<Buffers> {
        let layout = Layout::from_size_align(len.max(4096), 4096).context("buffer layout")?;
        let mut b = Buffers {
            ptrs: Vec::with_capacity(qd),
            layout,
        };
        for _ in 0..qd {
            // SAFETY: the layout has a non-zero size (at least 4096).
            let p = unsafe { alloc(layout) };
            if p.is_null() {
                bail!("out of memory for {qd} read buffers of {len} bytes");
            }
            b.ptrs.push(p);
        }
        Ok(b)
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        for &p in &self.ptrs {
            // SAFETY: each pointer came from `alloc` with this layout and is freed once.
            unsafe { dealloc(p, self.layout) };
        }
    }
}

/// Reads `area` at random for `secs` with `qd` reads in flight on a ring set up as `setup`, from
/// the calling thread. Returns the reads done and their latency histogram (nanoseconds).
pub fn read_random(
    path: &Path,
    area: Area,
    qd: usize,
    secs: f64,
    seed: u64,
    setup: RingSetup,
) -> Result<(u64, Histogram<u64>)> {
    let qd = qd.max(1);
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("{}", path.display()))?;
    let entries = (qd as u32).next_power_of_two().max(8);
    // Declared before the ring, so dropped after it.
    let bufs = Buffers::new(qd, area.block as usize)?;
    let mut ring: IoUring = match setup {
        RingSetup::Tuned => IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .build(entries),
        RingSetup::Plain => IoUring::builder().build(entries),
    }
    .context("io_uring set-up")?;
    if setup == RingSetup::Tuned {
        ring.submitter()
            .register_files(&[file.as_raw_fd()])
            .context("registering the file")?;
        let iovecs: Vec<libc::iovec> = bufs
            .ptrs
            .iter()
            .map(|&p| libc::iovec {
                iov_base: p.cast(),
                iov_len: area.block as usize,
            })
            .collect();
        // SAFETY: every registered buffer stays allocated while the ring exists (`bufs` is
        // declared before `ring`, so it is dropped after it).
        unsafe { ring.submitter().register_buffers(&iovecs) }.context("registering buffers")?;
    }
    let per_page = (area.page / area.block).max(1);
    let mut x = seed | 1;
    let mut next_pos = move || {
        let r = rng_next(&mut x);
        area.data_off + (r % area.pages.max(1)) * area.page + ((r >> 32) % per_page) * area.block
    };
    let mut started = vec![Instant::now(); qd];
    let ptrs = bufs.ptrs.clone();
    let fd = file.as_raw_fd();
    let push = |ring: &mut IoUring, slot: usize, pos: u64| -> bool {
        let buf = ptrs[slot];
        let len = area.block as u32;
        let entry = match setup {
            RingSetup::Tuned => opcode::ReadFixed::new(types::Fixed(0), buf, len, slot as u16)
                .offset(pos)
                .build(),
            RingSetup::Plain => opcode::Read::new(types::Fd(fd), buf, len)
                .offset(pos)
                .build(),
        }
        .user_data(slot as u64);
        // SAFETY: the buffer (`bufs`, one per slot, never shared by two reads in flight) and the
        // file outlive the read: the loop below waits for every read it submitted before it
        // returns, and both are dropped after the ring.
        unsafe { ring.submission().push(&entry) }.is_ok()
    };
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut ops, mut hist, mut inflight) = (0u64, new_hist(), 0usize);
    let mut failed = None;
    for (slot, at) in started.iter_mut().enumerate() {
        *at = Instant::now();
        if !push(&mut ring, slot, next_pos()) {
            failed = Some(anyhow!("submission queue full"));
            break;
        }
        inflight += 1;
    }
    let mut done = Vec::with_capacity(qd);
    // Every read submitted is waited for, also after an error: a buffer is never freed under a
    // read in flight.
    while inflight > 0 {
        if let Err(e) = ring.submit_and_wait(1) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // The ring cannot be waited on: the reads in flight keep their buffers for good.
            std::mem::forget(bufs);
            return Err(anyhow!("io_uring_enter: {e}"));
        }
        done.clear();
        done.extend(
            ring.completion()
                .map(|c| (c.user_data() as usize, c.result())),
        );
        let now = Instant::now();
        for &(slot, res) in &done {
            inflight -= 1;
            if res < 0 {
                failed.get_or_insert_with(|| {
                    anyhow!("read: {}", std::io::Error::from_raw_os_error(-res))
                });
            } else if res as u64 != area.block {
                failed.get_or_insert_with(|| anyhow!("short read: {res} of {} bytes", area.block));
            } else {
                let _ = hist.record(now.duration_since(started[slot]).as_nanos() as u64);
                ops += 1;
            }
            if now < deadline && failed.is_none() {
                started[slot] = now;
                if push(&mut ring, slot, next_pos()) {
                    inflight += 1;
                } else {
                    failed = Some(anyhow!("submission queue full"));
                }
            }
        }
    }
    drop(ring);
    drop(bufs);
    drop(file);
    if let Some(e) = failed {
        return Err(e);
    }
    Ok((ops, hist))
}

/// Runs [`read_random`] on one thread per file, all at once; with `pin`, thread `i` is pinned to
/// CPU `i` modulo the CPUs, as the engine places its shard executors. Returns the reads done and their latencies.
pub fn read_random_on_threads(
    files: &[std::path::PathBuf],
    area: Area,
    qd: usize,
    secs: f64,
    seed: u64,
    setup: RingSetup,
    pin: bool,
) -> Result<(u64, Histogram<u64>)> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let path = path.clone();
            let seed = seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            std::thread::spawn(move || {
                if pin {
                    pin_to(i % cpus);
                }
                read_random(&path, area, qd, secs, seed, setup)
            })
        })
        .collect();
    let (mut ops, mut hist) = (0, new_hist());
    for t in threads {
        let (n, h) = t.join().map_err(|_| anyhow!("a ring thread panicked"))??;
        ops += n;
        hist.add(h)?;
    }
    Ok((ops, hist))
}

/// Pins the calling thread to `cpu` (best effort: a refusal leaves it unpinned).
fn pin_to(cpu: usize) {
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is within the set's capacity (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size passed, for the calling thread (0).
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}
