//! File records as protocol versions 4 to 6 archived them, before write-back files kept
//! their attributes ([`RecordEntry::File`] without `attrs`): what version 1 of a node's
//! write-back journal holds. Read once at start (the journal is then rewritten in the
//! current form); written only by tests that make such a journal.

use rkyv::{Archive, Deserialize, Serialize};

use super::{
    check_file_records, decode_header, encode_archive, FileId, FileRecord, FrameError, RecordEntry,
    RecordState,
};

#[derive(Archive, Serialize, Deserialize)]
struct RecordV1 {
    path: String,
    hlc: u64,
    origin: FileId,
    entry: EntryV1,
}

#[derive(Archive, Serialize, Deserialize)]
enum EntryV1 {
    File {
        version_tag: String,
        size: u64,
        mtime_ns: i64,
        state: RecordState,
        store_tag: String,
        transient: bool,
    },
    Dir {
        mtime_ns: i64,
    },
    Deleted {
        prev_tag: String,
        pending: bool,
    },
}

/// Reads records archived as one vector in the version-1 form (any alignment); each is
/// checked as [`FileRecord::validate`] checks it.
pub fn decode_file_records_v1(payload: &[u8]) -> Result<Vec<FileRecord>, FrameError> {
    if payload.is_empty() {
        return Ok(Vec::new());
    }
    let old: Vec<RecordV1> = decode_header(payload)?;
    let records: Vec<FileRecord> = old
        .into_iter()
        .map(|r| FileRecord {
            path: r.path,
            hlc: r.hlc,
            origin: r.origin,
            entry: match r.entry {
                EntryV1::File {
                    version_tag,
                    size,
                    mtime_ns,
                    state,
                    store_tag,
                    transient,
                } => RecordEntry::File {
                    version_tag,
                    size,
                    mtime_ns,
                    state,
                    store_tag,
                    transient,
                    attrs: Vec::new(),
                },
                EntryV1::Dir { mtime_ns } => RecordEntry::Dir { mtime_ns },
                EntryV1::Deleted { prev_tag, pending } => {
                    RecordEntry::Deleted { prev_tag, pending }
                }
            },
        })
        .collect();
    check_file_records(&records)?;
    Ok(records)
}

/// Archives `records` in the version-1 form; their attributes are left out. For tests of
/// readers of old journals.
pub fn encode_file_records_v1(records: &[FileRecord]) -> Result<Vec<u8>, FrameError> {
    let old: Vec<RecordV1> = records
        .iter()
        .map(|r| RecordV1 {
            path: r.path.clone(),
            hlc: r.hlc,
            origin: r.origin,
            entry: match &r.entry {
                RecordEntry::File {
                    version_tag,
                    size,
                    mtime_ns,
                    state,
                    store_tag,
                    transient,
                    ..
                } => EntryV1::File {
                    version_tag: version_tag.clone(),
                    size: *size,
                    mtime_ns: *mtime_ns,
                    state: *state,
                    store_tag: store_tag.clone(),
                    transient: *transient,
                },
                RecordEntry::Dir { mtime_ns } => EntryV1::Dir {
                    mtime_ns: *mtime_ns,
                },
                RecordEntry::Deleted { prev_tag, pending } => EntryV1::Deleted {
                    prev_tag: prev_tag.clone(),
                    pending: *pending,
                },
            },
        })
        .collect();
    encode_archive(&old)
}
