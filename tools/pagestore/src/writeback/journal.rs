//! The write-back journal: every record a node takes in, appended to one file and made durable
//! (`fdatasync`) before the node acknowledges it, read back at start. docs/FORMAT.md
//! ("The write-back journal") has the layout.
//!
//! ```text
//! file:  "PSWJ" | u32 version (2) | entry*
//! entry: u32 len | u32 crc32(bytes) | bytes (the records of one append, archived together:
//!        frame::encode_file_records)
//! ```
//!
//! Version 1 archived the records without their attributes (`frame::decode_file_records_v1`
//! reads them); a version-1 journal is read at start and rewritten as version 2.
//!
//! One append is one entry, so the records of one change (a rename's two) come back together
//! or not at all. A torn last entry (a crash during an append) fails its length or checksum:
//! reading stops there and the file is cut back to the last whole entry, which loses nothing
//! acknowledged (an append is acknowledged only after its sync). A damaged entry with whole
//! entries after it is not a torn append: it is skipped (its records are lost and logged), the
//! entries after it are kept, the file is copied aside and the journal rewritten. When the file has grown well past what the
//! records need, [`Journal::compact`] writes the live records to a new file and renames it over
//! the old one (sync, rename, sync of the directory), so a crash leaves one or the other whole.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use pagestore_protocol::frame::{self, FileRecord};

const MAGIC: &[u8; 4] = b"PSWJ";
const VERSION: u32 = 2;
const HEAD: u64 = 8;
/// Largest entry a reader accepts: one batch of records at most.
const MAX_ENTRY: u32 = frame::MAX_RECORDS_PAYLOAD;

/// The journal file of one node.
pub struct Journal {
    path: PathBuf,
    file: File,
    len: u64,
}

fn bad(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {why}", path.display()),
    )
}

impl Journal {
    /// Opens (or creates) the journal `records.log` in `dir` and reads every whole entry.
    /// A torn tail is cut off (and logged); damaged entries with whole entries after them are
    /// skipped, the file copied to `records.log.damaged-<unix seconds>` and rewritten (logged as
    /// an error); a file that is not a journal is an error.
    pub fn open(dir: &Path) -> io::Result<(Journal, Vec<FileRecord>)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("records.log");
        // A compaction that crashed before its rename leaves its new file behind: the old
        // one is whole, the new one is not needed.
        let _ = std::fs::remove_file(dir.join("records.log.new"));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut data = Vec::new();
        file.read_to_end(&mut data)?;
        if data.is_empty() {
            let mut j = Journal { path, file, len: 0 };
            j.write_head()?;
            return Ok((j, Vec::new()));
        }
        if data.len() < HEAD as usize || &data[..4] != MAGIC {
            return Err(bad(&path, "not a pagestore write-back journal"));
        }
        let version = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        let decode: Decode = match version {
            VERSION => frame::decode_file_records,
            1 => frame::decode_file_records_v1,
            _ => {
                return Err(bad(
                    &path,
                    format!(
                        "journal version {version}; this release reads versions 1 to {VERSION}"
                    ),
                ))
            }
        };
        let found = read_entries(&data[HEAD as usize..], decode);
        let records = found.records;
        if !found.damaged.is_empty() {
            // Damage inside the file, not a torn append: whole entries follow it. The records
            // of the damaged entries are lost; everything else is kept. The file as it was is
            // kept beside it for the operator, and the journal is rewritten from what was read.
            let copy = dir.join(format!(
                "records.log.damaged-{}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            ));
            std::fs::write(&copy, &data)?;
            let ranges: Vec<String> = found
                .damaged
                .iter()
                .map(|(a, b)| format!("{}..{}", HEAD as usize + a, HEAD as usize + b))
                .collect();
            tracing::error!(
                path = %path.display(),
                damaged_bytes = %ranges.join(", "),
                kept = records.len(),
                copy = %copy.display(),
                "write-back journal: damaged entries skipped (their records are lost); \
                 the records around them are kept and the journal rewritten"
            );
        } else if version != VERSION {
            tracing::info!(
                path = %path.display(),
                records = records.len(),
                "write-back journal of version {version}: rewritten as version {VERSION}"
            );
        }
        if !found.damaged.is_empty() || version != VERSION {
            let mut j = Journal {
                path,
                file,
                len: data.len() as u64,
            };
            j.compact(records.iter())?;
            return Ok((j, records));
        }
        let len = HEAD + found.end as u64;
        if len < data.len() as u64 {
            tracing::warn!(
                path = %path.display(),
                kept = records.len(),
                cut = data.len() as u64 - len,
                "write-back journal: a torn last entry was cut off"
            );
            file.set_len(len)?;
            file.sync_data()?;
        }
        file.seek(SeekFrom::Start(len))?;
        Ok((Journal { path, file, len }, records))
    }

    fn write_head(&mut self) -> io::Result<()> {
        let mut head = [0u8; HEAD as usize];
        head[..4].copy_from_slice(MAGIC);
        head[4..].copy_from_slice(&VERSION.to_le_bytes());
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(&head)?;
        self.file.sync_data()?;
        self.len = HEAD;
        Ok(())
    }

    /// Appends `records` and makes them durable. On an error nothing is acknowledged, and the
    /// file is cut back to where it was.
    pub fn append(&mut self, records: &[FileRecord]) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for batch in records.chunks(frame::MAX_RECORD_BATCH) {
            encode_entry(batch, &mut buf).map_err(|e| bad(&self.path, e))?;
        }
        let r = self
            .file
            .write_all(&buf)
            .and_then(|_| self.file.sync_data());
        match r {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                let _ = self.file.seek(SeekFrom::Start(self.len));
                Err(e)
            }
        }
    }

    /// Bytes the journal file holds.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the journal holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len <= HEAD
    }

    /// Rewrites the journal with `records` only (the live table).
    pub fn compact<'a>(&mut self, records: impl Iterator<Item = &'a FileRecord>) -> io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join("records.log.new");
        let mut buf = Vec::with_capacity(64 << 10);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        let all: Vec<FileRecord> = records.cloned().collect();
        for batch in all.chunks(frame::MAX_RECORD_BATCH) {
            encode_entry(batch, &mut buf).map_err(|e| bad(&self.path, e))?;
        }
        let written = File::create(&tmp).and_then(|mut f| {
            f.write_all(&buf)?;
            f.sync_all()
        });
        if let Err(e) = written {
            // A full disk, most likely: the part written would only take more of it.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &self.path)?;
        File::open(dir)?.sync_all()?;
        let mut file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        file.seek(SeekFrom::End(0))?;
        self.file = file;
        self.len = buf.len() as u64;
        Ok(())
    }
}

fn encode_entry(batch: &[FileRecord], out: &mut Vec<u8>) -> Result<(), frame::FrameError> {
    let bytes = frame::encode_file_records(batch)?;
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    out.extend_from_slice(&bytes);
    Ok(())
}

/// What [`read_entries`] found in a journal's entries.
#[derive(Debug, Default)]
struct Found {
    /// The records of every whole entry, in order.
    records: Vec<FileRecord>,
    /// Where the last whole entry ends: what follows it is a torn tail (or nothing).
    end: usize,
    /// Damaged byte ranges between whole entries (not a torn tail: whole entries follow them).
    damaged: Vec<(usize, usize)>,
}

/// Bytes of checksums a search for the next whole entry after a damaged length may compute.
const RESYNC_BUDGET: usize = 256 << 20;

/// How the entries of one journal version archive their records.
type Decode = fn(&[u8]) -> Result<Vec<FileRecord>, frame::FrameError>;

/// Reads the entry at `at`: `Ok((records, next))`, or why not.
fn entry_at(data: &[u8], at: usize, decode: Decode) -> Result<(Vec<FileRecord>, usize), Bad> {
    let Some(head) = data.get(at..at + 8) else {
        return Err(Bad::Incomplete);
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len == 0 || len > MAX_ENTRY {
        return Err(Bad::Length);
    }
    let next = at + 8 + len as usize;
    let Some(body) = data.get(at + 8..next) else {
        return Err(Bad::Incomplete);
    };
    if crc32fast::hash(body) != crc {
        return Err(Bad::Body(next));
    }
    decode(body)
        .map(|batch| (batch, next))
        .map_err(|_| Bad::Body(next))
}

/// Why an entry did not read.
enum Bad {
    /// The file ends inside its head or body: a torn tail.
    Incomplete,
    /// Its length is impossible, so where the next entry starts is unknown.
    Length,
    /// Its body fails its checksum or archive; the next entry would start at this offset.
    Body(usize),
}

/// Reads every whole entry of `data` (the bytes after the head). An entry that fails is a torn
/// tail when nothing whole follows it (a crash during an append: the file ends inside it, it is
/// the last entry, or only zeros follow); otherwise it is damage, skipped and reported, and
/// reading goes on with the next whole entry (found by its length, or searched for when the
/// length itself is damaged).
fn read_entries(data: &[u8], decode: Decode) -> Found {
    let mut f = Found::default();
    let mut at = 0usize;
    while at < data.len() {
        let skip_to = match entry_at(data, at, decode) {
            Ok((batch, next)) => {
                f.records.extend(batch);
                f.end = next;
                at = next;
                continue;
            }
            Err(Bad::Incomplete) => break,
            Err(Bad::Body(next)) if next >= data.len() => break,
            Err(Bad::Body(next)) => {
                if data[next..].iter().all(|b| *b == 0) {
                    break;
                }
                next
            }
            Err(Bad::Length) => {
                if data[at..].iter().all(|b| *b == 0) {
                    break;
                }
                match next_whole_entry(data, at + 1, decode) {
                    Some(p) => p,
                    None => {
                        // Nothing whole follows: the rest is lost either way.
                        f.damaged.push((at, data.len()));
                        break;
                    }
                }
            }
        };
        f.damaged.push((at, skip_to));
        at = skip_to;
    }
    f
}

/// The first offset from `from` where a whole entry starts, within [`RESYNC_BUDGET`].
fn next_whole_entry(data: &[u8], from: usize, decode: Decode) -> Option<usize> {
    let mut spent = 0usize;
    for p in from..data.len().saturating_sub(8) {
        let len = u32::from_le_bytes([data[p], data[p + 1], data[p + 2], data[p + 3]]) as usize;
        if len == 0 || len > MAX_ENTRY as usize || p + 8 + len > data.len() {
            continue;
        }
        spent += len;
        if spent > RESYNC_BUDGET {
            return None;
        }
        if entry_at(data, p, decode).is_ok() {
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pagestore_protocol::frame::{Attr, FileId, RecordEntry, RecordState};

    fn rec(i: u64) -> FileRecord {
        FileRecord {
            path: format!("/ckpt/f{i}"),
            hlc: i << 16,
            origin: FileId::from_u128(7),
            entry: RecordEntry::File {
                version_tag: pagestore_protocol::writeback::new_tag(u128::from(i)),
                size: i * 1000,
                mtime_ns: 5,
                state: RecordState::Final,
                store_tag: String::new(),
                transient: false,
                // Every other record keeps attributes, to check they come back.
                attrs: (0..i % 2)
                    .map(|_| Attr {
                        name: "x-amz-meta-step".into(),
                        value: i.to_string(),
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn appended_records_come_back_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, got) = Journal::open(dir.path()).unwrap();
        assert!(got.is_empty() && j.is_empty());
        j.append(&[rec(1), rec(2)]).unwrap();
        j.append(&[rec(3)]).unwrap();
        drop(j);
        let (j, got) = Journal::open(dir.path()).unwrap();
        assert_eq!(got, vec![rec(1), rec(2), rec(3)]);
        assert!(!j.is_empty());
    }

    #[test]
    fn a_torn_tail_is_cut_and_nothing_before_it_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        j.append(&[rec(1), rec(2)]).unwrap();
        let whole = j.len();
        j.append(&[rec(3)]).unwrap();
        drop(j);
        let path = dir.path().join("records.log");
        // Every cut inside the last entry, and a flipped byte in it, keep exactly the first two.
        let full = std::fs::read(&path).unwrap();
        for cut in [whole + 1, whole + 7, whole + 8, full.len() as u64 - 1] {
            std::fs::write(&path, &full[..cut as usize]).unwrap();
            let (j, got) = Journal::open(dir.path()).unwrap();
            assert_eq!(got, vec![rec(1), rec(2)], "cut at {cut}");
            assert_eq!(j.len(), whole);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        }
        let mut flipped = full.clone();
        flipped[whole as usize + 12] ^= 0x40;
        std::fs::write(&path, &flipped).unwrap();
        let (mut j, got) = Journal::open(dir.path()).unwrap();
        assert_eq!(got, vec![rec(1), rec(2)]);
        // Appends go on after the cut.
        j.append(&[rec(4)]).unwrap();
        drop(j);
        assert_eq!(
            Journal::open(dir.path()).unwrap().1,
            vec![rec(1), rec(2), rec(4)]
        );
    }

    #[test]
    fn the_records_of_one_append_come_back_together_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        j.append(&[rec(1)]).unwrap();
        let before = j.len();
        j.append(&[rec(2), rec(3)]).unwrap();
        drop(j);
        let path = dir.path().join("records.log");
        let full = std::fs::read(&path).unwrap();
        // Cut anywhere inside the second append: neither of its records comes back.
        for cut in (before + 1)..(full.len() as u64) {
            std::fs::write(&path, &full[..cut as usize]).unwrap();
            assert_eq!(
                Journal::open(dir.path()).unwrap().1,
                vec![rec(1)],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn compaction_keeps_only_what_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        for i in 0..50 {
            j.append(&[rec(i)]).unwrap();
        }
        let before = j.len();
        let keep = [rec(7), rec(9)];
        j.compact(keep.iter()).unwrap();
        assert!(j.len() < before);
        j.append(&[rec(60)]).unwrap();
        drop(j);
        assert_eq!(
            Journal::open(dir.path()).unwrap().1,
            vec![rec(7), rec(9), rec(60)]
        );
        // A compaction's leftover new file is ignored and removed.
        std::fs::write(dir.path().join("records.log.new"), b"half").unwrap();
        assert_eq!(Journal::open(dir.path()).unwrap().1.len(), 3);
        assert!(!dir.path().join("records.log.new").exists());
    }

    /// The journal of `n` appends of one record each, and where each entry starts.
    fn journal_of(dir: &Path, n: u64) -> Vec<u64> {
        let (mut j, _) = Journal::open(dir).unwrap();
        let mut starts = Vec::new();
        for i in 1..=n {
            starts.push(j.len());
            j.append(&[rec(i)]).unwrap();
        }
        starts
    }

    fn damaged_copies(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("records.log.damaged-"))
            .collect()
    }

    #[test]
    fn a_damaged_entry_in_the_middle_loses_only_its_own_records() {
        let dir = tempfile::tempdir().unwrap();
        let starts = journal_of(dir.path(), 4);
        let path = dir.path().join("records.log");
        let mut bytes = std::fs::read(&path).unwrap();
        // A flipped bit in the second entry's body.
        bytes[starts[1] as usize + 20] ^= 0x08;
        std::fs::write(&path, &bytes).unwrap();
        let (mut j, got) = Journal::open(dir.path()).unwrap();
        assert_eq!(got, vec![rec(1), rec(3), rec(4)]);
        // The file as it was is kept for the operator; the journal is whole again.
        let copies = damaged_copies(dir.path());
        assert_eq!(copies.len(), 1, "{copies:?}");
        assert_eq!(std::fs::read(&copies[0]).unwrap(), bytes);
        j.append(&[rec(5)]).unwrap();
        drop(j);
        assert_eq!(
            Journal::open(dir.path()).unwrap().1,
            vec![rec(1), rec(3), rec(4), rec(5)]
        );
        assert_eq!(damaged_copies(dir.path()).len(), 1);
    }

    #[test]
    fn a_damaged_length_in_the_middle_is_passed_by_finding_the_next_whole_entry() {
        for len in [0u32, u32::MAX, 3] {
            let dir = tempfile::tempdir().unwrap();
            let starts = journal_of(dir.path(), 4);
            let path = dir.path().join("records.log");
            let mut bytes = std::fs::read(&path).unwrap();
            let at = starts[1] as usize;
            bytes[at..at + 4].copy_from_slice(&len.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let got = Journal::open(dir.path()).unwrap().1;
            assert_eq!(got, vec![rec(1), rec(3), rec(4)], "length {len}");
        }
    }

    #[test]
    fn zeros_after_the_last_whole_entry_are_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        journal_of(dir.path(), 2);
        let path = dir.path().join("records.log");
        let whole = std::fs::read(&path).unwrap();
        let mut bytes = whole.clone();
        bytes.extend_from_slice(&[0u8; 4096]);
        std::fs::write(&path, &bytes).unwrap();
        let (j, got) = Journal::open(dir.path()).unwrap();
        assert_eq!(got, vec![rec(1), rec(2)]);
        assert_eq!(j.len(), whole.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), whole);
        assert!(damaged_copies(dir.path()).is_empty());
    }

    #[test]
    fn a_file_that_is_not_a_journal_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.log");
        std::fs::write(&path, b"something else entirely").unwrap();
        let e = Journal::open(dir.path()).err().unwrap();
        assert!(
            e.to_string().contains("not a pagestore write-back journal"),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"something else entirely");
    }

    #[test]
    fn a_version_1_journal_is_read_and_rewritten_as_version_2() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.log");
        // A journal as the release before attributes wrote it: two appends.
        let records: Vec<FileRecord> = (1..=4).map(rec).collect();
        let mut old = Vec::new();
        old.extend_from_slice(MAGIC);
        old.extend_from_slice(&1u32.to_le_bytes());
        for batch in records.chunks(2) {
            let bytes = frame::encode_file_records_v1(batch).unwrap();
            old.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            old.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
            old.extend_from_slice(&bytes);
        }
        std::fs::write(&path, &old).unwrap();
        let without_attrs: Vec<FileRecord> = records
            .iter()
            .cloned()
            .map(|mut r| {
                if let RecordEntry::File { attrs, .. } = &mut r.entry {
                    attrs.clear();
                }
                r
            })
            .collect();
        let (mut j, got) = Journal::open(dir.path()).unwrap();
        assert_eq!(got, without_attrs);
        let data = std::fs::read(&path).unwrap();
        assert_eq!(
            &data[4..8],
            &VERSION.to_le_bytes(),
            "rewritten as version 2"
        );
        // Appends after it are version 2's, attributes included, and all of it reads back.
        j.append(&[rec(5)]).unwrap();
        drop(j);
        let (_, got) = Journal::open(dir.path()).unwrap();
        let mut want = without_attrs;
        want.push(rec(5));
        assert_eq!(got, want);
    }
}
