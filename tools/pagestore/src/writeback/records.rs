//! The namespace of `back` and `transient` mounts as one node keeps it: a record per path made
//! through the cluster (a file, a directory, a deletion), with no I/O and no clock (callers pass
//! the times), so that every rule here is tested without a disk or a network.
//!
//! Every node keeps all records (the journal makes them durable, replication and pulls make them
//! agree). Of two records of one path the one with the larger [`FileRecord::order`] wins
//! ([`Records::apply`]): last writer wins in the cluster's order, and the steps that keep a
//! change's identity (a seal, a flush, a deletion applied to the store) rank after it, so that
//! nodes that see the same records in any order end with the same table.
//!
//! A client's change is planned here ([`Records::plan`]): checked against the records, then
//! turned into the records that express it, which the caller stamps, applies and hands on.

use std::{
    borrow::Borrow,
    collections::{hash_map::Entry, BTreeMap, BTreeSet, HashMap, HashSet},
    ops::Bound,
};

use pagestore_protocol::{
    frame::{
        Attr, ChangeOp, ErrorCode, Expect, FileId, FileRecord, RecordEntry, RecordState,
        WriteBackSummary,
    },
    ring,
    writeback::{beneath_file, hlc_ms, is_wb_tag, parent, records_digest},
};

/// Why a change cannot be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The wire's category (`NotFound`, `Exists`, `NotEmpty`, `BadRequest`, `Changed`).
    pub code: ErrorCode,
    /// For people.
    pub message: String,
}

/// Whether a path that holds the file version `current` (`None`: no file) meets `expect`;
/// otherwise why not.
pub fn expect_met(path: &str, expect: &Expect, current: Option<&str>) -> Result<(), String> {
    match (expect, current) {
        (Expect::Any, _) | (Expect::Absent, None) => Ok(()),
        (Expect::Version(v), Some(c)) if v == c => Ok(()),
        (Expect::Absent, Some(_)) => Err(format!("{path}: a file exists there already")),
        (Expect::Version(_), Some(_)) => Err(format!("{path}: holds another version")),
        (Expect::Version(_), None) => Err(format!("{path}: no such file")),
    }
}

fn refused(code: ErrorCode, message: impl Into<String>) -> Refused {
    Refused {
        code,
        message: message.into(),
    }
}

/// What a path is, as far as the records know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known<'a> {
    /// A record says what it is (a file, a directory or a deletion).
    Record(&'a FileRecord),
    /// A directory because records lie beneath it.
    Implied,
    /// The records say nothing: ask the under storage.
    Unknown,
}

/// What a planned change needs from the under storage before its records apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Apply these records (stamped by the caller).
    Records(Vec<FileRecord>),
    /// `from` is a flushed file (or an object of the store): copy it to `to` in the store, then
    /// plan again with the copy's store tag ([`Records::plan_store_rename`]).
    CopyInStore {
        /// Source path.
        from: String,
        /// Destination path.
        to: String,
    },
    /// The change is already in force (a repeated commit): nothing to do.
    Nothing,
}

/// A record with its hlc and origin left for the caller to stamp.
fn unstamped(path: &str, entry: RecordEntry) -> FileRecord {
    FileRecord {
        path: path.to_string(),
        hlc: 0,
        origin: FileId::default(),
        entry,
    }
}

/// What [`Records::apply_batch`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Paths whose record changed.
    pub taken: Vec<String>,
    /// Versions (file ids) that some record held before and none holds now: their pages are
    /// no longer anyone's.
    pub gone: Vec<u128>,
    /// Versions whose file is in the under storage now.
    pub cleaned: Vec<u128>,
    /// Versions sealed: they take no more pages.
    pub sealed: Vec<u128>,
}

/// How a record stands against the one its path has ([`Records::rank`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rank {
    /// It ranks higher (or the path has none): it is taken.
    Above,
    /// It ranks lower or is the same: it is not.
    Below,
    /// The same flush of the same version, but another object in the store: the version
    /// reached the store twice (two nodes that both took themselves for its flusher, one after
    /// the other, or a flusher that died between its upload and handing on its record). The
    /// store holds one of the two objects; the record that names it is the one to keep, and
    /// only the store can tell which.
    Restamp,
}

/// Whether `new` is a [`Rank::Restamp`] of `old` (their ranks are equal).
fn restamps(old: &FileRecord, new: &FileRecord) -> bool {
    match (&old.entry, &new.entry) {
        (
            RecordEntry::File {
                version_tag: a,
                state: RecordState::Clean,
                store_tag: sa,
                ..
            },
            RecordEntry::File {
                version_tag: b,
                state: RecordState::Clean,
                store_tag: sb,
                ..
            },
        ) => a == b && sa != sb && !sb.is_empty(),
        _ => false,
    }
}

/// A record as [`Records`] keeps it: ordered, and found, by its path, so that the path is kept
/// once (a map from paths to records would keep it twice).
#[derive(Debug)]
struct ByPath(FileRecord);

impl Borrow<str> for ByPath {
    fn borrow(&self) -> &str {
        &self.0.path
    }
}

impl PartialEq for ByPath {
    fn eq(&self, other: &Self) -> bool {
        self.0.path == other.0.path
    }
}

impl Eq for ByPath {}

impl PartialOrd for ByPath {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByPath {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.path.cmp(&other.0.path)
    }
}

/// The paths whose records name one version: nearly always one, kept without a vector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Paths {
    One(Box<str>),
    Many(Vec<Box<str>>),
}

impl Paths {
    fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            Paths::One(p) => (Some(&**p), &[][..]),
            Paths::Many(v) => (None, &v[..]),
        };
        one.into_iter().chain(many.iter().map(|p| &**p))
    }
}

/// The records one node keeps.
#[derive(Default, Debug)]
pub struct Records {
    /// Every record, in path order.
    by_path: BTreeSet<ByPath>,
    /// File id of each live file record's version -> its paths (one, except while a node
    /// takes the records of a rename in another order than they were made).
    by_file: HashMap<u128, Paths>,
    /// File id of each deleted record's version -> its paths (a version deleted while open
    /// takes no more pages).
    deleted: HashMap<u128, Paths>,
    /// Directory -> live records (files and directories) beneath it at any depth.
    implied: BTreeMap<String, u32>,
    /// Bytes the records take in their encoded form, roughly (for compaction).
    approx_bytes: usize,
    /// Records past which a change that adds a path is refused (`Full`); `None`: no bound.
    limit: Option<usize>,
}

fn is_live(r: &FileRecord) -> bool {
    !matches!(r.entry, RecordEntry::Deleted { .. })
}

/// Whether `r` needs no more work and was made `keep_ms` or longer before `now_ms`: a deletion
/// the store has applied, or a file flushed to it.
fn settled(r: &FileRecord, now_ms: u64, keep_ms: u64) -> bool {
    matches!(
        r.entry,
        RecordEntry::Deleted { pending: false, .. }
            | RecordEntry::File {
                state: RecordState::Clean,
                ..
            }
    ) && now_ms.saturating_sub(hlc_ms(r.hlc)) >= keep_ms
}

fn approx_len(r: &FileRecord) -> usize {
    64 + r.path.len()
        + match &r.entry {
            RecordEntry::File {
                version_tag,
                store_tag,
                attrs,
                ..
            } => {
                version_tag.len()
                    + store_tag.len()
                    + attrs
                        .iter()
                        .map(|a| 32 + a.name.len() + a.value.len())
                        .sum::<usize>()
            }
            RecordEntry::Dir { .. } => 0,
            RecordEntry::Deleted { prev_tag, .. } => prev_tag.len(),
        }
}

fn multi_insert(m: &mut HashMap<u128, Paths>, id: u128, path: &str) {
    match m.entry(id) {
        Entry::Vacant(e) => {
            e.insert(Paths::One(path.into()));
        }
        Entry::Occupied(mut e) => match e.get_mut() {
            Paths::One(p) if &**p == path => {}
            Paths::One(p) => {
                let first = std::mem::take(p);
                e.insert(Paths::Many(vec![first, path.into()]));
            }
            Paths::Many(v) => {
                if !v.iter().any(|p| &**p == path) {
                    v.push(path.into());
                }
            }
        },
    }
}

fn multi_remove(m: &mut HashMap<u128, Paths>, id: u128, path: &str) {
    let Entry::Occupied(mut e) = m.entry(id) else {
        return;
    };
    match e.get_mut() {
        Paths::One(p) if &**p == path => {
            e.remove();
        }
        Paths::One(_) => {}
        Paths::Many(v) => {
            v.retain(|p| &**p != path);
            match v.len() {
                0 => {
                    e.remove();
                }
                1 => {
                    if let Some(last) = v.pop() {
                        e.insert(Paths::One(last));
                    }
                }
                _ => {}
            }
        }
    }
}

/// The ancestors of an absolute path, nearest first, "/" last.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut cur = Some(path);
    std::iter::from_fn(move || {
        let p = parent(cur?)?;
        cur = Some(p);
        Some(p)
    })
}

/// The file id of a write-back version.
pub fn version_id(tag: &str) -> u128 {
    ring::file_id("", tag)
}

impl Records {
    /// An empty table.
    pub fn new() -> Records {
        Records::default()
    }

    /// Refuses changes that would add a path once `limit` records are kept ([`Records::plan`]):
    /// the bound on the memory the records take. Records from peers are always taken.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = Some(limit);
    }

    /// Number of records (deletions included).
    pub fn len(&self) -> usize {
        self.by_path.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_path.is_empty()
    }

    /// Roughly the bytes the records take encoded.
    pub fn approx_bytes(&self) -> usize {
        self.approx_bytes
    }

    /// Every record, in path order.
    pub fn iter(&self) -> impl Iterator<Item = &FileRecord> {
        self.by_path.iter().map(|r| &r.0)
    }

    /// Takes in the records of one change (or any set of records) and says what it did to
    /// write-back versions: see [`Applied`]. Call it with a change's records together, so that
    /// a rename (a new path holding the version, the old path deleted) never looks like the
    /// version going away.
    pub fn apply_batch(&mut self, batch: Vec<FileRecord>) -> Applied {
        let mut touched = Vec::new();
        let mut out = Applied::default();
        for rec in batch {
            let before = self.get(&rec.path).and_then(|r| match &r.entry {
                RecordEntry::File { version_tag, .. } => Some(version_id(version_tag)),
                _ => None,
            });
            let path = rec.path.clone();
            if !self.apply(rec) {
                continue;
            }
            out.taken.push(path.clone());
            touched.extend(before);
            if let Some(r) = self.get(&path) {
                if let RecordEntry::File {
                    version_tag, state, ..
                } = &r.entry
                {
                    let id = version_id(version_tag);
                    touched.push(id);
                    match state {
                        RecordState::Clean => out.cleaned.push(id),
                        RecordState::Sealed => out.sealed.push(id),
                        _ => {}
                    }
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        out.gone = touched
            .into_iter()
            .filter(|id| self.by_file(*id).is_none())
            .collect();
        out
    }

    /// How `rec` stands against the record its path has.
    pub fn rank(&self, rec: &FileRecord) -> Rank {
        let Some(old) = self.get(&rec.path) else {
            return Rank::Above;
        };
        match old.order().cmp(&rec.order()) {
            std::cmp::Ordering::Less => Rank::Above,
            std::cmp::Ordering::Greater => Rank::Below,
            std::cmp::Ordering::Equal if restamps(old, rec) => Rank::Restamp,
            std::cmp::Ordering::Equal => Rank::Below,
        }
    }

    /// Takes in `rec` if it ranks above the record its path has (or the path has none), or
    /// if it is a [`Rank::Restamp`] of it: the caller takes a restamp only once the store
    /// showed it holds the restamp's object, and the journal replays what was taken in the
    /// order it was taken. Returns whether it took it.
    pub fn apply(&mut self, rec: FileRecord) -> bool {
        if matches!(self.rank(&rec), Rank::Below) {
            return false;
        }
        if let Some(old) = self.by_path.take(rec.path.as_str()) {
            self.unindex(&old.0);
        }
        self.index(&rec);
        self.by_path.insert(ByPath(rec));
        true
    }

    fn index(&mut self, r: &FileRecord) {
        self.approx_bytes += approx_len(r);
        match &r.entry {
            RecordEntry::File { version_tag, .. } => {
                multi_insert(&mut self.by_file, version_id(version_tag), &r.path);
            }
            RecordEntry::Deleted { prev_tag, .. } if !prev_tag.is_empty() => {
                multi_insert(&mut self.deleted, version_id(prev_tag), &r.path);
            }
            _ => {}
        }
        if is_live(r) {
            for a in ancestors(&r.path) {
                *self.implied.entry(a.to_string()).or_insert(0) += 1;
            }
        }
    }

    fn unindex(&mut self, r: &FileRecord) {
        self.approx_bytes = self.approx_bytes.saturating_sub(approx_len(r));
        match &r.entry {
            RecordEntry::File { version_tag, .. } => {
                multi_remove(&mut self.by_file, version_id(version_tag), &r.path);
            }
            RecordEntry::Deleted { prev_tag, .. } if !prev_tag.is_empty() => {
                multi_remove(&mut self.deleted, version_id(prev_tag), &r.path);
            }
            _ => {}
        }
        if is_live(r) {
            for a in ancestors(&r.path) {
                if let Some(n) = self.implied.get_mut(a) {
                    *n -= 1;
                    if *n == 0 {
                        self.implied.remove(a);
                    }
                }
            }
        }
    }

    /// The record of `path`, if any.
    pub fn get(&self, path: &str) -> Option<&FileRecord> {
        self.by_path.get(path).map(|r| &r.0)
    }

    /// What the records say `path` is.
    pub fn known(&self, path: &str) -> Known<'_> {
        match self.get(path) {
            Some(r) if is_live(r) => Known::Record(r),
            // A deleted path that is still a directory (records beneath it) is one.
            Some(_) if self.implied.contains_key(path) => Known::Implied,
            Some(r) => Known::Record(r),
            None if self.implied.contains_key(path) => Known::Implied,
            None => Known::Unknown,
        }
    }

    /// The nearest ancestor of `path` that the records know as a live file, if the records
    /// know it before they know one as a directory: a new file cannot go beneath it.
    pub fn file_ancestor<'p>(&self, path: &'p str) -> Option<&'p str> {
        for a in ancestors(path) {
            match self.known(a) {
                Known::Record(r) if is_live(r) => {
                    return matches!(r.entry, RecordEntry::File { .. }).then_some(a)
                }
                Known::Implied => return None,
                _ => {}
            }
        }
        None
    }

    /// Refuses a change that makes `path` beneath a file ([`Records::file_ancestor`]).
    fn refuse_beneath_file(&self, path: &str) -> Result<(), Refused> {
        match self.file_ancestor(path) {
            Some(file) => Err(refused(ErrorCode::NotDir, beneath_file(path, file))),
            None => Ok(()),
        }
    }

    /// The live file record holding write-back version `file_id`, if any (of two, the later:
    /// a rename's new path).
    pub fn by_file(&self, file_id: u128) -> Option<&FileRecord> {
        self.by_file
            .get(&file_id)?
            .iter()
            .filter_map(|p| self.get(p))
            .max_by_key(|r| r.order())
    }

    /// Whether a live record, or a deletion, names version `file_id`.
    pub fn names(&self, file_id: u128) -> bool {
        self.by_file(file_id).is_some() || self.deleted.contains_key(&file_id)
    }

    /// Whether pages of version `file_id` may still be written: its record is open, or it has
    /// none yet (a writer before its first commit) and was not deleted.
    pub fn takes_pages(&self, file_id: u128) -> bool {
        match self.by_file(file_id).map(|r| &r.entry) {
            Some(RecordEntry::File { state, .. }) => *state == RecordState::Open,
            Some(_) => false,
            None => !self.deleted.contains_key(&file_id),
        }
    }

    /// The records of `dir`'s direct children, and the names of directories beneath it that
    /// only records imply, in name order (a name may appear in both).
    pub fn children<'a>(&'a self, dir: &str) -> (Vec<(&'a str, &'a FileRecord)>, Vec<&'a str>) {
        let prefix = if dir == "/" {
            "/".to_string()
        } else {
            format!("{}/", dir.trim_end_matches('/'))
        };
        let direct = |p: &'a str| -> Option<&'a str> {
            let rest = p.strip_prefix(prefix.as_str())?;
            (!rest.is_empty() && !rest.contains('/')).then_some(rest)
        };
        let records = self
            .by_path
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .map(|r| &r.0)
            .take_while(|r| r.path.starts_with(prefix.as_str()))
            .filter_map(|r| direct(&r.path).map(|name| (name, r)))
            .collect();
        (records, self.implied_names(&prefix))
    }

    /// The names of the entries beneath `prefix` (a directory and one trailing slash) that
    /// live records beneath them make directories, in name order.
    fn implied_names<'a>(&'a self, prefix: &str) -> Vec<&'a str> {
        self.implied
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .map(|(p, _)| p.as_str())
            .take_while(|p| p.starts_with(prefix))
            .filter_map(|p| {
                let rest = &p[prefix.len()..];
                (!rest.is_empty() && !rest.contains('/')).then_some(rest)
            })
            .collect()
    }

    /// A planned change's `records` with a new modification time, `now_ns`, for each
    /// directory made through the cluster that they create, remove or rename an entry in, as a
    /// disk's directory takes one. A record makes an entry where it is live and its path holds
    /// nothing live now; it removes one where it is a deletion and its path holds something
    /// (a live record, or, with no record, the store's object the change was checked against).
    /// A rewrite of a file, a new time set, and directories the records do not make (the
    /// store's, implied ones, a mount's own) take none; nor does a directory the change itself
    /// makes, moves or removes.
    pub fn with_parent_times(&self, mut records: Vec<FileRecord>, now_ns: i64) -> Vec<FileRecord> {
        // A directory rename plans a record per path beneath it: look them up, not through.
        let planned: HashSet<&str> = records.iter().map(|r| r.path.as_str()).collect();
        let mut dirs: Vec<&str> = Vec::new();
        for r in &records {
            let now = self.get(&r.path);
            let changes_entry = if is_live(r) {
                !now.is_some_and(is_live)
            } else {
                now.is_none_or(is_live)
            };
            let Some(dir) = parent(&r.path).filter(|_| changes_entry) else {
                continue;
            };
            if planned.contains(dir) || dirs.contains(&dir) {
                continue;
            }
            if let Some(RecordEntry::Dir { mtime_ns }) = self.get(dir).map(|d| &d.entry) {
                if *mtime_ns != now_ns {
                    dirs.push(dir);
                }
            }
        }
        let times: Vec<FileRecord> = dirs
            .into_iter()
            .map(|d| unstamped(d, RecordEntry::Dir { mtime_ns: now_ns }))
            .collect();
        records.extend(times);
        records
    }

    /// Whether any live record lies beneath `dir`.
    pub fn has_children(&self, dir: &str) -> bool {
        self.implied.contains_key(dir.trim_end_matches('/'))
            || (dir == "/" && self.implied.contains_key("/"))
    }

    /// Plans client change `op` against the records (see the module docs). `transient`: the
    /// path's mount keeps files on the cluster only. The caller checks what only the under
    /// storage knows (an object or directory there).
    pub fn plan(&self, op: &ChangeOp, transient: bool) -> Result<Plan, Refused> {
        let plan = self.plan_unbounded(op, transient)?;
        let adds = |p: &str| !self.by_path.contains(p);
        let adds_paths = match &plan {
            Plan::Records(recs) => recs.iter().any(|r| adds(&r.path)),
            Plan::CopyInStore { from, to } => adds(from) || adds(to),
            Plan::Nothing => false,
        };
        match self.limit {
            Some(limit) if adds_paths && self.len() >= limit => Err(refused(
                ErrorCode::Full,
                format!(
                    "the cluster keeps {} write-back records, its limit \
                     (--write-records-max): new paths wait until flushed files' records are \
                     forgotten (--write-records-keep)",
                    self.len()
                ),
            )),
            _ => Ok(plan),
        }
    }

    /// Refuses (`Changed`) a commit of a version no record names and that its writer had
    /// committed before (`since`, the position of the first answered commit) at least
    /// `keep_ms` before `now_ms`: a record is forgotten only `keep_ms` after its last change,
    /// which comes after that first commit, so such a version's record may have been
    /// forgotten once flushed, and taking the commit would bring back a version the cluster
    /// has let go (over whatever the path holds now). A version committed more recently than
    /// that cannot have been forgotten, and is planned as usual.
    pub fn refuse_forgotten(
        &self,
        op: &ChangeOp,
        now_ms: u64,
        keep_ms: u64,
    ) -> Result<(), Refused> {
        let ChangeOp::Commit {
            path,
            version_tag,
            since,
            ..
        } = op
        else {
            return Ok(());
        };
        if !self.may_be_forgotten(version_id(version_tag), *since, now_ms, keep_ms) {
            return Ok(());
        }
        Err(refused(
            ErrorCode::Changed,
            format!(
                "{path}: this version was first committed {} s ago and the cluster keeps no \
                 record of it any more (flushed, then forgotten after --write-records-keep): \
                 it takes no more changes; open the file again",
                now_ms.saturating_sub(hlc_ms(*since)) / 1000
            ),
        ))
    }

    /// Whether version `file_id`, which its writer first committed at position `since` (0:
    /// not yet), may be one whose record was forgotten: no record or deletion names it and
    /// `since` lies `keep_ms` or more before `now_ms` (see [`Records::refuse_forgotten`]).
    pub fn may_be_forgotten(&self, file_id: u128, since: u64, now_ms: u64, keep_ms: u64) -> bool {
        since != 0 && !self.names(file_id) && now_ms.saturating_sub(hlc_ms(since)) >= keep_ms
    }

    fn plan_unbounded(&self, op: &ChangeOp, transient: bool) -> Result<Plan, Refused> {
        match op {
            ChangeOp::Commit {
                path,
                version_tag,
                size,
                mtime_ns,
                last,
                expect,
                attrs,
                // Checked by `refuse_forgotten`.
                since: _,
            } => {
                let plan = self.plan_commit(
                    path,
                    version_tag,
                    (*size, *mtime_ns),
                    *last,
                    transient,
                    attrs,
                )?;
                // A version's first commit (the path does not name it yet) meets `expect`.
                if self.by_file(version_id(version_tag)).is_none() {
                    self.check_expect(path, expect)?;
                }
                Ok(plan)
            }
            ChangeOp::Rename { from, to, replace } => self.plan_rename(from, to, *replace),
            ChangeOp::Delete { path, dir, expect } => {
                // A conditional delete takes only the version it names (a path that is no
                // file fails it too).
                self.check_expect(path, expect)?;
                self.plan_delete(path, *dir)
            }
            ChangeOp::MakeDir { path, mtime_ns } => {
                self.refuse_beneath_file(path)?;
                match self.known(path) {
                    Known::Record(r) if is_live(r) => Err(refused(
                        ErrorCode::Exists,
                        format!("{path}: already exists"),
                    )),
                    Known::Implied => Err(refused(
                        ErrorCode::Exists,
                        format!("{path}: already exists"),
                    )),
                    _ => Ok(Plan::Records(vec![unstamped(
                        path,
                        RecordEntry::Dir {
                            mtime_ns: *mtime_ns,
                        },
                    )])),
                }
            }
            ChangeOp::SetTime {
                path,
                version_tag,
                mtime_ns,
            } => self.plan_set_time(path, version_tag, *mtime_ns),
        }
    }

    /// A new modification time for the file `path` holds, if it holds `tag`: the same record
    /// with the time changed (its state, store version and attributes as they are). An empty
    /// `tag` names the directory made through the cluster at `path`.
    fn plan_set_time(&self, path: &str, tag: &str, mtime_ns: i64) -> Result<Plan, Refused> {
        let not_here = || {
            refused(
                ErrorCode::NotFound,
                format!(
                    "{path}: nothing made through the cluster is here (a file or directory only \
                     in the under storage has the store's modification time, or none)"
                ),
            )
        };
        let Some(r) = self.get(path) else {
            return Err(not_here());
        };
        let now = match &r.entry {
            RecordEntry::File { version_tag, .. } if version_tag != tag => {
                return Err(refused(
                    ErrorCode::Changed,
                    format!("{path}: holds another version now ({version_tag})"),
                ))
            }
            RecordEntry::Dir { .. } if !tag.is_empty() => {
                return Err(refused(
                    ErrorCode::IsDir,
                    format!("{path}: a directory now, not version {tag}"),
                ))
            }
            RecordEntry::File { mtime_ns, .. } | RecordEntry::Dir { mtime_ns } => *mtime_ns,
            RecordEntry::Deleted { .. } => return Err(not_here()),
        };
        if now == mtime_ns {
            return Ok(Plan::Nothing);
        }
        let mut entry = r.entry.clone();
        if let RecordEntry::File { mtime_ns: m, .. } | RecordEntry::Dir { mtime_ns: m } = &mut entry
        {
            *m = mtime_ns;
        }
        Ok(Plan::Records(vec![unstamped(path, entry)]))
    }

    /// Whether `path` holds what a conditional commit expects, as far as the records know (a
    /// path they know nothing of is for the caller to check in the under storage).
    fn check_expect(&self, path: &str, expect: &Expect) -> Result<(), Refused> {
        let current = match self.known(path) {
            Known::Record(r) => match &r.entry {
                RecordEntry::File { version_tag, .. } => Some(version_tag.as_str()),
                _ => None,
            },
            Known::Implied | Known::Unknown => return Ok(()),
        };
        expect_met(path, expect, current).map_err(|m| refused(ErrorCode::Precondition, m))
    }

    fn plan_commit(
        &self,
        path: &str,
        tag: &str,
        (size, mtime_ns): (u64, i64),
        last: bool,
        transient: bool,
        attrs: &[Attr],
    ) -> Result<Plan, Refused> {
        if !is_wb_tag(tag) {
            return Err(refused(
                ErrorCode::BadRequest,
                format!("{tag:?} is not a write-back version tag"),
            ));
        }
        let id = version_id(tag);
        let state = if last {
            RecordState::Final
        } else {
            RecordState::Open
        };
        let entry = |state| RecordEntry::File {
            version_tag: tag.to_string(),
            size,
            mtime_ns,
            state,
            store_tag: String::new(),
            transient,
            attrs: attrs.to_vec(),
        };
        match self.by_file(id) {
            // The version's file (wherever a rename put it) is updated.
            Some(r) => {
                let RecordEntry::File {
                    state: now,
                    size: now_size,
                    ..
                } = &r.entry
                else {
                    unreachable!("by_file indexes file records");
                };
                match now {
                    RecordState::Open => Ok(Plan::Records(vec![unstamped(&r.path, entry(state))])),
                    // A repeated last commit (a retry) is already in force.
                    _ if last && *now_size == size => Ok(Plan::Nothing),
                    _ => Err(refused(
                        ErrorCode::Changed,
                        format!(
                            "{}: this version was closed (or sealed after its writer went \
                             silent) and takes no more changes; open the file again",
                            r.path
                        ),
                    )),
                }
            }
            // Deleted while its writer had it open: it stays deleted.
            None if self.deleted.contains_key(&id) => Ok(Plan::Nothing),
            None => {
                if let Known::Record(r) = self.known(path) {
                    if matches!(r.entry, RecordEntry::Dir { .. }) {
                        return Err(refused(ErrorCode::IsDir, format!("{path}: is a directory")));
                    }
                }
                if self.known(path) == Known::Implied {
                    return Err(refused(ErrorCode::IsDir, format!("{path}: is a directory")));
                }
                self.refuse_beneath_file(path)?;
                Ok(Plan::Records(vec![unstamped(path, entry(state))]))
            }
        }
    }

    fn plan_rename(&self, from: &str, to: &str, replace: bool) -> Result<Plan, Refused> {
        if from == to {
            return Ok(Plan::Nothing);
        }
        if to.starts_with(&format!("{}/", from.trim_end_matches('/'))) {
            return Err(refused(
                ErrorCode::BadRequest,
                format!("cannot move {from} into itself"),
            ));
        }
        self.refuse_beneath_file(to)?;
        match self.known(to) {
            Known::Record(r) if is_live(r) => match r.entry {
                RecordEntry::Dir { .. } => {
                    return Err(refused(ErrorCode::IsDir, format!("{to}: is a directory")))
                }
                _ if !replace => {
                    return Err(refused(ErrorCode::Exists, format!("{to}: already exists")))
                }
                _ => {}
            },
            Known::Implied => {
                return Err(refused(ErrorCode::IsDir, format!("{to}: is a directory")))
            }
            _ => {}
        }
        match self.known(from) {
            Known::Record(r) => match &r.entry {
                RecordEntry::File {
                    version_tag,
                    size,
                    mtime_ns,
                    state,
                    transient,
                    attrs,
                    ..
                } => {
                    if *state == RecordState::Clean {
                        return Ok(Plan::CopyInStore {
                            from: from.into(),
                            to: to.into(),
                        });
                    }
                    let moved = RecordEntry::File {
                        version_tag: version_tag.clone(),
                        size: *size,
                        mtime_ns: *mtime_ns,
                        // A sealed version is closed for good.
                        state: match state {
                            RecordState::Sealed => RecordState::Final,
                            s => *s,
                        },
                        store_tag: String::new(),
                        transient: *transient,
                        attrs: attrs.clone(),
                    };
                    Ok(Plan::Records(vec![
                        unstamped(to, moved),
                        unstamped(
                            from,
                            RecordEntry::Deleted {
                                prev_tag: version_tag.clone(),
                                pending: !*transient,
                            },
                        ),
                    ]))
                }
                RecordEntry::Dir { .. } => Err(refused(
                    ErrorCode::BadRequest,
                    format!("{from}: renaming directories is not supported"),
                )),
                RecordEntry::Deleted { .. } => Err(refused(
                    ErrorCode::NotFound,
                    format!("{from}: no such file"),
                )),
            },
            Known::Implied => Err(refused(
                ErrorCode::BadRequest,
                format!("{from}: renaming directories is not supported"),
            )),
            // Maybe an object of the store: the caller finds out.
            Known::Unknown => Ok(Plan::CopyInStore {
                from: from.into(),
                to: to.into(),
            }),
        }
    }

    /// The records of a rename whose source the store held (a flushed file, or an object
    /// never written through the cluster), after the store copied it to `to`: `to` becomes a
    /// clean file at the copy's store version `store_tag` (`size` bytes), keeping the version
    /// of a flushed file (so its cached pages) or taking `fresh_tag` for an object of the store;
    /// `from` is deleted, in the store too once the flusher gets to it.
    pub fn plan_store_rename(
        &self,
        from: &str,
        to: &str,
        store_tag: &str,
        (size, mtime_ns): (u64, i64),
        fresh_tag: &str,
    ) -> Vec<FileRecord> {
        let (version_tag, transient, attrs) = match self.known(from) {
            Known::Record(FileRecord {
                entry:
                    RecordEntry::File {
                        version_tag,
                        transient,
                        attrs,
                        ..
                    },
                ..
            }) => (version_tag.clone(), *transient, attrs.clone()),
            _ => (fresh_tag.to_string(), false, Vec::new()),
        };
        vec![
            unstamped(
                to,
                RecordEntry::File {
                    version_tag: version_tag.clone(),
                    size,
                    mtime_ns,
                    state: RecordState::Clean,
                    store_tag: store_tag.to_string(),
                    transient,
                    attrs,
                },
            ),
            unstamped(
                from,
                RecordEntry::Deleted {
                    prev_tag: version_tag,
                    pending: true,
                },
            ),
        ]
    }

    fn plan_delete(&self, path: &str, dir: bool) -> Result<Plan, Refused> {
        match self.known(path) {
            Known::Record(r) => match (&r.entry, dir) {
                (RecordEntry::File { .. }, true) => Err(refused(
                    ErrorCode::NotDir,
                    format!("{path}: not a directory"),
                )),
                (RecordEntry::Dir { .. }, false) => {
                    Err(refused(ErrorCode::IsDir, format!("{path}: is a directory")))
                }
                (RecordEntry::Deleted { .. }, _) => Err(refused(
                    ErrorCode::NotFound,
                    format!("{path}: no such file or directory"),
                )),
                (
                    RecordEntry::File {
                        version_tag,
                        transient,
                        ..
                    },
                    false,
                ) => Ok(Plan::Records(vec![unstamped(
                    path,
                    RecordEntry::Deleted {
                        prev_tag: version_tag.clone(),
                        pending: !*transient,
                    },
                )])),
                (RecordEntry::Dir { .. }, true) => {
                    if self.has_children(path) {
                        return Err(refused(
                            ErrorCode::NotEmpty,
                            format!("{path}: directory not empty"),
                        ));
                    }
                    Ok(Plan::Records(vec![unstamped(
                        path,
                        RecordEntry::Deleted {
                            prev_tag: String::new(),
                            pending: false,
                        },
                    )]))
                }
            },
            Known::Implied if dir => Err(refused(
                ErrorCode::NotEmpty,
                format!("{path}: directory not empty"),
            )),
            Known::Implied => Err(refused(ErrorCode::IsDir, format!("{path}: is a directory"))),
            // An object (or directory) of the store, or nothing: the caller checks the store;
            // a file's deletion is recorded and applied to the store by the flusher.
            Known::Unknown => Ok(Plan::Records(vec![unstamped(
                path,
                RecordEntry::Deleted {
                    prev_tag: String::new(),
                    pending: !dir,
                },
            )])),
        }
    }

    /// The records after `after` in path order, at most `max`, and whether more follow.
    pub fn after(&self, after: &str, max: usize) -> (Vec<FileRecord>, bool) {
        let mut it = self
            .by_path
            .range::<str, _>((Bound::Excluded(after), Bound::Unbounded))
            .map(|r| r.0.clone());
        let out: Vec<FileRecord> = it.by_ref().take(max).collect();
        let more = it.next().is_some();
        (out, more)
    }

    /// The records of directory `dir`'s entries whose names sort after `after` ("" for all),
    /// in name order: each entry's own record, if any, then, for an entry that live records
    /// beneath it make a directory, the first of them ([`Records::first_beneath`]); at most
    /// `max` records (an entry's two are never split across pages), and whether entries were
    /// left out. What a node lists `dir` with, so what a peer that missed a change there takes
    /// before it lists it. `None` when `digest` (not 0) is the digest of those records, every
    /// page together ([`Records::digest_in`]): the asker holds the same.
    pub fn in_dir(
        &self,
        dir: &str,
        after: &str,
        max: usize,
        digest: u64,
    ) -> Option<(Vec<FileRecord>, bool)> {
        let entries = self.entries_in(dir, after);
        if digest != 0 && records_digest(entries.iter().flatten().copied()) == digest {
            return None;
        }
        let mut out: Vec<FileRecord> = Vec::new();
        for entry in entries {
            if !out.is_empty() && out.len() + entry.len() > max {
                return Some((out, true));
            }
            out.extend(entry.into_iter().cloned());
        }
        Some((out, false))
    }

    /// The digest of what [`Records::in_dir`] gives of `dir` after `after`, every page
    /// together ([`records_digest`]): what a node sends with its `RecordsIn` so that a peer
    /// holding the same answers nothing.
    pub fn digest_in(&self, dir: &str, after: &str) -> u64 {
        records_digest(self.entries_in(dir, after).into_iter().flatten())
    }

    /// The records of each of `dir`'s entries named after `after`, entry by entry in name
    /// order ([`Records::in_dir`]).
    fn entries_in(&self, dir: &str, after: &str) -> Vec<Vec<&FileRecord>> {
        // Both in name order, each name once: merged, not sorted again.
        let (own, implied) = self.children(dir);
        let mut own = own.into_iter().filter(|&(n, _)| n > after).peekable();
        let mut implied = implied.into_iter().filter(|&n| n > after).peekable();
        let base = dir.trim_end_matches('/');
        let mut out = Vec::new();
        loop {
            let name = match (own.peek(), implied.peek()) {
                (None, None) => return out,
                (Some(&(o, _)), Some(&i)) => o.min(i),
                (Some(&(o, _)), None) => o,
                (None, Some(&i)) => i,
            };
            let record = own.next_if(|&(o, _)| o == name).map(|(_, r)| r);
            let beneath = implied
                .next_if(|&i| i == name)
                .and_then(|_| self.first_beneath(&format!("{base}/{name}")));
            out.push(record.into_iter().chain(beneath).collect());
        }
    }

    /// The first live record beneath directory `dir` in path order (deletions before it passed
    /// over): what makes `dir` a directory to a node that lacks it. None, without a scan, when
    /// the live records imply no directory there.
    pub fn first_beneath(&self, dir: &str) -> Option<&FileRecord> {
        self.live_beneath(dir).next()
    }

    /// The live records beneath directory `dir` in path order (deletions passed over); none,
    /// without a scan, when the live records imply no directory there.
    pub fn live_beneath<'a>(&'a self, dir: &str) -> impl Iterator<Item = &'a FileRecord> + 'a {
        let trimmed = dir.trim_end_matches('/');
        let key = if trimmed.is_empty() { "/" } else { trimmed };
        let implied = self.implied.contains_key(key);
        let prefix = format!("{trimmed}/");
        self.by_path
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .map(|r| &r.0)
            .take_while(move |r| implied && r.path.starts_with(&prefix))
            .filter(|r| is_live(r))
    }

    /// The paths of directory `dir`'s entries that live records beneath them make
    /// directories, in name order.
    pub fn implied_entries(&self, dir: &str) -> Vec<String> {
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        self.implied_names(&prefix)
            .into_iter()
            .map(|name| format!("{prefix}{name}"))
            .collect()
    }

    /// The work of a flusher: the records that the under storage lacks, in the order of their
    /// last change. A file whose writer holds it open is included once its last change is at
    /// least `lease_ms` old at `now_ms` (its writer went silent: seal it first).
    pub fn flushable(&self, now_ms: u64, lease_ms: u64) -> Vec<&FileRecord> {
        let mut v: Vec<&FileRecord> = self
            .iter()
            .filter(|r| match &r.entry {
                RecordEntry::File {
                    state, transient, ..
                } => {
                    !transient
                        && match state {
                            RecordState::Final | RecordState::Sealed => true,
                            RecordState::Open => now_ms.saturating_sub(hlc_ms(r.hlc)) >= lease_ms,
                            RecordState::Clean => false,
                        }
                }
                RecordEntry::Deleted { pending, .. } => *pending,
                RecordEntry::Dir { .. } => false,
            })
            .collect();
        v.sort_by_key(|r| r.hlc);
        v
    }

    /// What waits to reach the under storage under `prefix` (a file or a directory), at
    /// `now_ms`. The counters of flushes are the caller's.
    pub fn summary(&self, prefix: &str, now_ms: u64) -> WriteBackSummary {
        let dir = format!("{}/", prefix.trim_end_matches('/'));
        let mut s = WriteBackSummary::default();
        let under = |p: &str| p == prefix || p.starts_with(&dir) || prefix == "/";
        let mut oldest: Option<u64> = None;
        for r in self.iter().filter(|r| under(&r.path)) {
            match &r.entry {
                RecordEntry::File {
                    state,
                    transient: false,
                    size,
                    ..
                } if *state != RecordState::Clean => {
                    s.files_dirty += 1;
                    s.bytes_dirty += size;
                    oldest = Some(oldest.map_or(hlc_ms(r.hlc), |o| o.min(hlc_ms(r.hlc))));
                }
                RecordEntry::Deleted { pending: true, .. } => {
                    s.deletes_pending += 1;
                    oldest = Some(oldest.map_or(hlc_ms(r.hlc), |o| o.min(hlc_ms(r.hlc))));
                }
                _ => {}
            }
        }
        s.oldest_dirty_ms = oldest.map_or(0, |o| now_ms.saturating_sub(o).max(1));
        s
    }

    /// The records that need no more work at `now_ms`, made more than `keep_ms` before:
    /// deletions the store has applied and files flushed to it (a scan that needs no write
    /// access; [`Records::forget`] takes them out). Every node forgets them by the same rule; a
    /// forgotten file is the store's object from then on, under the store's version.
    pub fn settled(&self, now_ms: u64, keep_ms: u64) -> Vec<String> {
        self.iter()
            .filter(|r| settled(r, now_ms, keep_ms))
            .map(|r| r.path.clone())
            .collect()
    }

    /// Whether `rec` (a peer's) is a record this table has forgotten, or would forget at once:
    /// the path has no record here and `rec` is settled at `now_ms` ([`Records::settled`]).
    /// Every node forgets such a record by the same rule, so one a peer has not yet forgotten
    /// is not taken back (the path would answer its write-back version again, then the
    /// store's, until the next sweep).
    pub fn forgotten_by_now(&self, rec: &FileRecord, now_ms: u64, keep_ms: u64) -> bool {
        self.get(&rec.path).is_none() && settled(rec, now_ms, keep_ms)
    }

    /// Forgets the records of `paths` that are still settled at `now_ms` (see
    /// [`Records::settled`]). Returns how many.
    pub fn forget(&mut self, paths: &[String], now_ms: u64, keep_ms: u64) -> usize {
        let mut n = 0;
        for p in paths {
            if !self.get(p).is_some_and(|r| settled(r, now_ms, keep_ms)) {
                continue;
            }
            if let Some(r) = self.by_path.take(p.as_str()) {
                self.unindex(&r.0);
                n += 1;
            }
        }
        n
    }

    /// Takes in a peer's records (`theirs`): those that rank higher than ours. Returns them.
    pub fn merge(&mut self, theirs: Vec<FileRecord>) -> Vec<FileRecord> {
        let mut taken = Vec::new();
        for r in theirs {
            if self.apply(r.clone()) {
                taken.push(r);
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests;
