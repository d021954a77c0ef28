//! Memory the write-back records take on every node: heap bytes per record of a namespace of
//! flushed checkpoint files, measured with a counting allocator, against the bytes the same
//! records take encoded (what the journal and a `Records` answer hold) in the same run.
//! OPERATIONS.md's `--write-records-max` row quotes this figure.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicIsize, Ordering},
};

use pagestore_protocol::{
    frame::{encode_file_records, FileId, FileRecord, RecordEntry, RecordState},
    writeback::new_tag,
};
use pagestore_tools::writeback::records::Records;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts live bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, new_size) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The `i`th file of a checkpoint namespace: a 60-byte path, flushed (an S3-style ETag as its
/// store version), no attributes.
fn record(i: u64) -> FileRecord {
    let path = format!(
        "/ckpt/run-{:04}/step-{:06}/shard-{:05}-of-00064.safetensors",
        i / 100_000,
        i / 64,
        i % 64
    );
    FileRecord {
        path,
        hlc: (1_700_000_000_000 + i) << 16,
        origin: FileId::from_u128(7),
        entry: RecordEntry::File {
            version_tag: new_tag(u128::from(i) * 0x9e37_79b9_7f4a_7c15),
            size: 1 << 30,
            mtime_ns: 1_700_000_000_000_000_000,
            state: RecordState::Clean,
            store_tag: format!("\"{:032x}\"", u128::from(i) * 31),
            transient: false,
            attrs: Vec::new(),
        },
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n: u64 = if full { 1_000_000 } else { 20_000 };
    let path_len = record(0).path.len();
    let before = live();
    let mut t = Records::new();
    for i in 0..n {
        t.apply(record(i));
    }
    let heap = (live() - before) as f64 / n as f64;
    assert_eq!(t.len() as u64, n);
    let sample: Vec<FileRecord> = (0..1_000).map(record).collect();
    let encoded = encode_file_records(&sample)
        .expect("a thousand records fit one payload")
        .len() as f64
        / 1_000.0;
    println!(
        "records: {n} flushed files, {path_len}-byte paths: {heap:.0} heap bytes per record, \
         {encoded:.0} encoded (ratio {:.2})",
        heap / encoded
    );
    drop(t);
}
