//! Writing through the cluster: files of `back` and `transient` mounts, and the namespace
//! changes of those mounts (rename, delete, directories).
//!
//! A [`Writer`] gives the file it writes a fresh write-back version. Its pages go to each of
//! the page's write members (the owner and the next members on distinct nodes, as many as the
//! cluster's write replicas), each of which answers only once the page is durable on its disk;
//! a commit then makes the path name the version, durably on the write replicas of the records
//! and on every node that answers. A page is never sent twice at once, and a page that is
//! changed after it was sent is read back, changed and sent again, so the members always hold
//! the last bytes written.
//!
//! - [`Writer::flush`] (fsync): every page written so far is durable and the file, at its size
//!   now, is visible to every reader.
//! - [`Writer::close`]: the same, and the version takes no more changes: the cluster may flush
//!   it to the under storage.
//!
//! While a committed file is open, its writer repeats its last commit every [`KEEPALIVE`], so
//! that an idle writer is not taken for gone. A writer that stops without closing leaves what
//! it committed (the cluster seals the version once its writer has been silent for the lease,
//! then flushes it) and pages it never committed: until its first commit, a writer renews its
//! pages on the members that hold them every [`RENEW_EVERY`] (`Renew`), and a member drops
//! them once neither a page nor a renewal came for its orphan grace (`--write-orphan-grace`,
//! 2 minutes by default). A writer given up before any commit ([`Writer::discard`], or dropped
//! unclosed) has its members drop its pages at once. A writer that finds a member dropped its
//! pages, or that could not reach one for half the grace, fails its first commit
//! ([`Error::Changed`]) rather than name pages that member may no longer hold.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use pagestore_protocol::{
    frame::{
        self, Attr, ChangeOp, Expect, FileId, FileState, Key, PathKind, RequestBody, ResponseBody,
        WriteBackSummary,
    },
    ring::{self, path_hash, MemberId},
    writeback::{fresh_tag, unix_ns, WritePolicy, DEFAULT_ORPHAN_GRACE, WRITE_SLOP},
};
use tokio::task::JoinHandle;

use crate::{
    client::{Attempt, Error},
    spill::Spill,
    ufs::ObjectInfo,
    Client,
};

/// How long a writer waits for room when the cluster's dirty limit is reached (the cluster
/// flushes meanwhile) before it gives up with [`Error::NoSpace`].
pub const DEFAULT_WRITE_WAIT: Duration = Duration::from_secs(120);

/// How often an open writer commits what it has, so that the cluster knows it is alive (a
/// version silent for the cluster's lease is sealed and flushed without it).
pub const KEEPALIVE: Duration = Duration::from_secs(30);

/// How long a page or a commit is retried while too few of its members can be reached (a
/// member the client gave up on for a moment, a busy machine) before the write fails.
pub const UNREACHABLE_WAIT: Duration = Duration::from_secs(30);

/// How often, at most, a writer renews the pages of a version no commit names yet on the
/// members that hold them (more often when a member's orphan grace is under a minute: a
/// quarter of it). The first renewal goes a second after the first page, to learn the grace.
pub const RENEW_EVERY: Duration = Duration::from_secs(15);

/// When the first renewal goes, after the writer's first page.
const FIRST_RENEW: Duration = Duration::from_secs(1);

/// Settings of a [`Writer`].
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// Make the file visible (empty) as soon as it is opened, as a POSIX create does; otherwise
    /// it appears whole at the first flush or at close, as an S3 PUT does.
    pub visible_at_open: bool,
    /// Pages sent at once (default 8).
    pub inflight: usize,
    /// How long a page waits for room at the dirty limit (default [`DEFAULT_WRITE_WAIT`]).
    pub write_wait: Duration,
    /// What the path must hold for the file's first commit to take it (default
    /// [`Expect::Any`]): checked and committed in one step by the path's metadata owner, so a
    /// conditional create or replace is atomic. A first commit that finds otherwise fails
    /// with [`Error::Precondition`] and changes nothing.
    pub expect: Expect,
    /// The object's attributes (Content-Type, user metadata...; [`Attr`] names them), kept
    /// with the file by the cluster, answered by [`Client::attributes`] and written with the
    /// object when it is flushed. At most [`frame::MAX_ATTRS`] within
    /// [`frame::MAX_ATTRS_BYTES`] ([`Error::Invalid`] otherwise).
    pub attrs: Vec<Attr>,
    /// A directory for the pages a random writer leaves between fsyncs (default none): with
    /// one, a page beyond the `inflight` kept in memory goes to an unlinked file there and is
    /// sent once, at the next flush or close; without, it is sent at once and read back from
    /// its write members at its next write (a whole page each way for a small write).
    pub spill_dir: Option<std::path::PathBuf>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            visible_at_open: false,
            inflight: 8,
            write_wait: DEFAULT_WRITE_WAIT,
            expect: Expect::Any,
            attrs: Vec::new(),
            spill_dir: None,
        }
    }
}

type PageSend = JoinHandle<Result<u32, Error>>;

/// A file being written through the cluster (see the module docs).
pub struct Writer {
    client: Arc<Client>,
    path: String,
    tag: String,
    file_id: u128,
    page_size: u64,
    size: u64,
    mtime_ns: i64,
    options: WriteOptions,
    /// Pages being filled here, not sent yet.
    open: BTreeMap<u64, BytesMut>,
    /// Pages left in the spill file, not sent yet (with [`WriteOptions::spill_dir`]).
    spill: Option<Spill>,
    /// Pages the write members hold, with the length they hold.
    sent: HashMap<u64, u32>,
    /// Pages being sent.
    sending: BTreeMap<u64, (u32, PageSend)>,
    /// Every member each page was ever sent to (see [`Client::send_page`]): shared with the
    /// sends in progress, never two of the same page at once.
    holders: Arc<Mutex<HashMap<u64, Vec<MemberId>>>>,
    /// The last commit that left the version open (none before the first, and after close),
    /// which the keep-alive repeats; held while a commit is sent so that commits keep order.
    last_open_commit: Arc<tokio::sync::Mutex<Option<ChangeOp>>>,
    /// Repeats the last open commit every [`KEEPALIVE`], so that the cluster does not take
    /// the writer of an idle open file for gone.
    keepalive: Option<JoinHandle<()>>,
    closed: bool,
    /// A commit of the version was sent (answered or not): it is no longer given up with
    /// [`RequestBody::Discard`], since the cluster may name it.
    commit_tried: bool,
    /// The runtime the writer was made on: a writer dropped without a commit gives its pages
    /// up from a task there.
    runtime: Option<tokio::runtime::Handle>,
    /// The position of the version's first answered commit (0 before it): sent with every
    /// later commit and page ([`ChangeOp::Commit`]'s `since`).
    since: u64,
    /// Before the first commit: which members hold pages, and when each was last heard.
    uncommitted: Arc<Mutex<Uncommitted>>,
    /// Renews the pages on their members until the first commit ([`RENEW_EVERY`]).
    renewer: Option<JoinHandle<()>>,
}

/// Before a version's first commit: the members that took each page, when each member was last
/// sent a page or answered a renewal holding some, and which may have dropped them (it went
/// half the orphan grace unheard, or said it holds none after it took one). The commit is
/// refused only when a page may be gone from every member that took it: a member that died
/// (R >= 2) costs nothing while the page's other members hold it. Pure, so that the rules are
/// tested without waiting minutes.
#[derive(Debug, Default)]
struct Uncommitted {
    heard: HashMap<MemberId, Instant>,
    /// When each member first answered that it took a page.
    took: HashMap<MemberId, Instant>,
    /// The members that took the last copy sent of each page.
    pages: HashMap<u64, Vec<MemberId>>,
    /// The least orphan grace the members told (none yet: [`DEFAULT_ORPHAN_GRACE`]).
    grace: Option<Duration>,
    /// Members that may have dropped the pages, each with the first reason found.
    lapsed: HashMap<MemberId, Lapse>,
}

/// Why a member may no longer hold a version's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lapse {
    /// It was neither sent a page nor heard from by a renewal for this long.
    Quiet(Duration),
    /// A renewal found none of its pages there, after it took one.
    Dropped,
}

impl Uncommitted {
    fn grace(&self) -> Duration {
        self.grace.unwrap_or(DEFAULT_ORPHAN_GRACE)
    }

    /// How long a member may go unheard: half its grace, the rest leaving room for the
    /// first commit to reach it.
    fn kept(&self) -> Duration {
        self.grace() / 2
    }

    /// How long to wait before the next round of renewals.
    fn renew_every(&self) -> Duration {
        RENEW_EVERY.min(self.grace() / 4)
    }

    /// Page `page` was sent to `asked` from `at`, and taken by `took` (when it ended; none
    /// when the send failed).
    fn sent(
        &mut self,
        page: u64,
        (asked, took): (&[MemberId], &[MemberId]),
        at: Instant,
        ended: Instant,
    ) {
        let kept = self.kept();
        for &m in asked {
            let last = self.heard.entry(m).or_insert(at);
            let quiet = at.saturating_duration_since(*last);
            *last = (*last).max(at);
            if quiet >= kept {
                self.lapsed.entry(m).or_insert(Lapse::Quiet(quiet));
            }
        }
        for &m in took {
            self.took.entry(m).or_insert(ended);
        }
        if !took.is_empty() {
            self.pages.insert(page, took.to_vec());
        }
    }

    /// A renewal of member `m` sent at `at` found `pages` there; the node's grace is `grace`.
    fn renewed(&mut self, m: MemberId, at: Instant, pages: u32, grace: Duration) {
        self.grace = Some(self.grace.map_or(grace, |g| g.min(grace)));
        if pages > 0 {
            if let Some(last) = self.heard.get_mut(&m) {
                *last = (*last).max(at);
            }
            return;
        }
        match self.took.get(&m) {
            // It took a page before this renewal left, and holds none now.
            Some(&took) if took < at => {
                self.lapsed.entry(m).or_insert(Lapse::Dropped);
            }
            // Taken meanwhile: the next renewal finds it.
            Some(_) => {}
            // Asked, never took one (a send that failed there): nothing of it to lose.
            None => {
                self.heard.remove(&m);
            }
        }
    }

    /// The members to renew.
    fn members(&self) -> Vec<MemberId> {
        let mut m: Vec<MemberId> = self.heard.keys().copied().collect();
        m.sort();
        m
    }

    /// Why member `m` may have dropped the version's pages by `now`, if it may have.
    fn lapse_of(&self, m: MemberId, now: Instant) -> Option<Lapse> {
        self.lapsed.get(&m).copied().or_else(|| {
            let quiet = now.saturating_duration_since(*self.heard.get(&m)?);
            (quiet >= self.kept()).then_some(Lapse::Quiet(quiet))
        })
    }

    /// A page that may be gone from every member that took it by `now`, with one of those
    /// members and why, if there is such a page.
    fn lost(&self, now: Instant) -> Option<(u64, MemberId, Lapse)> {
        let mut pages: Vec<(&u64, &Vec<MemberId>)> = self.pages.iter().collect();
        pages.sort();
        pages.into_iter().find_map(|(&page, took)| {
            if !took.iter().all(|&m| self.lapse_of(m, now).is_some()) {
                return None;
            }
            let first = *took.first()?;
            Some((page, first, self.lapse_of(first, now)?))
        })
    }
}

/// Renews version `tag`'s pages on the members `uncommitted` names, until it is aborted (the
/// first commit, the writer's end) or a member says a record names the version.
async fn renew_loop(client: Arc<Client>, tag: String, uncommitted: Arc<Mutex<Uncommitted>>) {
    let lock = |u: &Mutex<Uncommitted>| {
        let g = u.lock().unwrap_or_else(|p| p.into_inner());
        (g.members(), g.renew_every())
    };
    let mut wait = FIRST_RENEW;
    loop {
        tokio::time::sleep(wait).await;
        let (members, _) = lock(&uncommitted);
        let layout = client.layout();
        let at = Instant::now();
        let asks = members.into_iter().map(|m| {
            let (client, addr) = (&client, layout.membership.addr_of(m));
            let body = RequestBody::Renew {
                version_tag: tag.clone(),
            };
            async move {
                let Some(addr) = addr else {
                    return (m, Err(Error::unavailable("left the ring")));
                };
                (
                    m,
                    client.call(addr, body, Bytes::new()).await.map(|(b, _)| b),
                )
            }
        });
        for (m, answer) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(ResponseBody::Held { pages, grace_ms }) => uncommitted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .renewed(m, at, pages, Duration::from_millis(grace_ms.max(1))),
                // Committed meanwhile: its commits keep it alive.
                Err(Error::Changed(_)) => return,
                other => tracing::debug!(
                    node = format_args!("{:032x}", m.node),
                    shard = m.shard,
                    answer = ?other,
                    "renewing an uncommitted file's pages"
                ),
            }
        }
        // After the answers: the grace they told sets the pace.
        wait = lock(&uncommitted).1;
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        for task in [self.keepalive.take(), self.renewer.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
        // A writer dropped before any commit (an aborted upload, a failed copy) gives its
        // pages up now rather than leave them to the nodes' orphan grace (2 minutes by
        // default, during which they count against the dirty limit).
        if self.closed || self.commit_tried {
            return;
        }
        let Some(runtime) = self.runtime.clone() else {
            return;
        };
        let (client, tag, members) = self.give_up();
        if members.is_empty() {
            return;
        }
        let path = self.path.clone();
        runtime.spawn(async move {
            if let Err(e) = discard_on(&client, &tag, &members).await {
                tracing::debug!(%path, error = %e, "giving up a dropped writer's pages");
            }
        });
    }
}

/// Asks each of `members` to drop the pages of version `tag`. Returns the pages dropped, or
/// the first failure (pages left behind are dropped after the members' orphan grace).
async fn discard_on(client: &Client, tag: &str, members: &[MemberId]) -> Result<u64, Error> {
    let layout = client.layout();
    let body = RequestBody::Discard {
        version_tag: tag.to_string(),
    };
    let asks = members.iter().map(|&m| {
        let body = body.clone();
        let addr = layout.membership.addr_of(m);
        async move {
            let Some(addr) = addr else {
                return Err(Error::unavailable(format!(
                    "member {:032x}/{} has left the ring",
                    m.node, m.shard
                )));
            };
            match client.call(addr, body, Bytes::new()).await? {
                (ResponseBody::Removed { pages }, _) => Ok(u64::from(pages)),
                (other, _) => Err(Error::unavailable(format!(
                    "{addr}: unexpected answer {other:?} to Discard"
                ))),
            }
        }
    });
    let mut dropped = 0;
    let mut first_err = None;
    for answer in futures_util::future::join_all(asks).await {
        match answer {
            Ok(n) => dropped += n,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        None => Ok(dropped),
        Some(e) => Err(e),
    }
}

impl Client {
    /// Starts writing `path` anew (as `open(O_CREAT | O_TRUNC)` does): a fresh version, empty.
    /// The path's mount must be a `back` or `transient` one ([`Error::ReadOnly`] otherwise:
    /// `through` mounts are written with [`Client::put`]).
    pub async fn create(
        self: &Arc<Self>,
        path: &str,
        options: WriteOptions,
    ) -> Result<Writer, Error> {
        crate::ufs::check_written_path(path)?;
        self.cached_mount(path)?;
        frame::check_attrs("attributes", &options.attrs)
            .map_err(|e| Error::Invalid(format!("{path}: {e}")))?;
        let tag = fresh_tag();
        let page_size = u64::from(self.page_size());
        let spill = options
            .spill_dir
            .as_deref()
            .map(|d| Spill::new(d, page_size));
        let mut w = Writer {
            client: self.clone(),
            path: path.to_string(),
            file_id: ring::file_id(path, &tag),
            tag,
            page_size,
            size: 0,
            mtime_ns: unix_ns(),
            options,
            open: BTreeMap::new(),
            spill,
            sent: HashMap::new(),
            sending: BTreeMap::new(),
            holders: Arc::default(),
            last_open_commit: Arc::new(tokio::sync::Mutex::new(None)),
            keepalive: None,
            closed: false,
            commit_tried: false,
            runtime: tokio::runtime::Handle::try_current().ok(),
            since: 0,
            uncommitted: Arc::default(),
            renewer: None,
        };
        if w.options.visible_at_open {
            w.commit(false).await?;
        }
        Ok(w)
    }

    /// Opens `path` for writing and keeps what it holds (as `open(O_WRONLY)` without
    /// `O_TRUNC` does): a fresh version that starts as a copy of the current content. A path
    /// that does not exist starts empty.
    pub async fn open_write(
        self: &Arc<Self>,
        path: &str,
        options: WriteOptions,
    ) -> Result<Writer, Error> {
        let current = match self.stat(path).await {
            Ok(info) => Some(info),
            Err(Error::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let mut w = self.create(path, options).await?;
        if let Some(info) = current {
            w.copy_from(&info).await?;
        }
        Ok(w)
    }

    /// Writes `data` as the whole file at `path` of a `back` or `transient` mount, visible at
    /// once and complete (as an S3 PUT is). Returns what a stat now answers.
    pub async fn write_file(
        self: &Arc<Self>,
        path: &str,
        data: Bytes,
    ) -> Result<ObjectInfo, Error> {
        let mut w = self.create(path, WriteOptions::default()).await?;
        w.write_bytes(0, data).await?;
        w.close().await
    }

    /// The mount of `path`, which must take writes through the cluster.
    fn cached_mount(&self, path: &str) -> Result<WritePolicy, Error> {
        let policy = self.write_policy(path);
        if policy.is_cached() {
            Ok(policy)
        } else {
            Err(Error::ReadOnly(format!(
                "{path}: its mount writes through to the under storage (write=through); write \
                 it with the store's credentials, or mount it with write=back"
            )))
        }
    }

    /// Sends a namespace change to the members that keep the records of `path` (its metadata
    /// owner first), and returns the change's position in the cluster's order.
    pub(crate) async fn change(&self, path: &str, op: ChangeOp) -> Result<u64, Error> {
        // A commit (or a file's new time) is the same change when sent again (a repeated one
        // is already in force): retried while no member can be reached. Other changes are sent
        // once (a rename that a member applied without its answer arriving would fail when
        // sent again).
        if !matches!(op, ChangeOp::Commit { .. } | ChangeOp::SetTime { .. }) {
            return self.change_once(path, op).await;
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            match self.change_once(path, op.clone()).await {
                Err(Error::Unavailable { message, .. }) if started.elapsed() < UNREACHABLE_WAIT => {
                    tracing::debug!(path, why = %message, "no member took a commit; again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    async fn change_once(&self, path: &str, op: ChangeOp) -> Result<u64, Error> {
        let layout = self.layout();
        let ring = layout.membership.ring();
        let members: Vec<_> = ring
            .replicas_of_hash(path_hash(path), 3)
            .into_iter()
            .filter(|m| !layout.down.contains(&m.node))
            .filter_map(|m| layout.membership.addr_of(m))
            .collect();
        let mut why = Vec::new();
        // A member whose disk has no room for the change's record answers NoSpace; another
        // member may have room (the change then needs the write replicas' room, not this
        // one's). NoSpace only when no member took it and one said so.
        let mut no_space = None;
        // Members backed off after failures are passed over first, then asked anyway if no
        // other took the change: after a moment of overload they may well be alive, and the
        // change was never sent to them.
        let (ready, backed_off): (Vec<_>, Vec<_>) =
            members.into_iter().partition(|a| self.reachable(*a));
        let tries = ready
            .into_iter()
            .map(|a| (a, false))
            .chain(backed_off.into_iter().map(|a| (a, true)));
        for (addr, despite) in tries {
            let body = RequestBody::Change { op: op.clone() };
            let attempt = if despite {
                self.ask_despite_backoff(addr, body, Bytes::new()).await
            } else {
                self.ask_with(addr, body, Bytes::new()).await
            };
            match attempt {
                Attempt::Answer(Ok((ResponseBody::Applied { hlc }, _))) => return Ok(hlc),
                Attempt::Answer(Ok((other, _))) => {
                    return Err(Error::unavailable(format!("unexpected answer {other:?}")))
                }
                Attempt::Answer(Err(Error::NoSpace(m))) => {
                    why.push(format!("{addr}: {m}"));
                    no_space.get_or_insert(m);
                }
                Attempt::Answer(Err(e)) => return Err(e),
                Attempt::Failed(w) | Attempt::StoreFailed(w) | Attempt::Unverified(w) => {
                    why.push(w)
                }
            }
        }
        if let Some(m) = no_space {
            return Err(Error::NoSpace(format!("{path}: {m}")));
        }
        Err(Error::unavailable(format!(
            "{path}: no member took the change ({})",
            why.join("; ")
        )))
    }

    /// Renames the file `from` to `to` within one `back` or `transient` mount, atomically for
    /// readers (the write-to-temp-then-rename of checkpoint savers). With `replace` false an
    /// existing `to` is [`Error::Exists`].
    pub async fn rename(&self, from: &str, to: &str, replace: bool) -> Result<(), Error> {
        crate::ufs::check_written_path(from)?;
        crate::ufs::check_written_path(to)?;
        self.cached_mount(from)?;
        let same = {
            let layout = self.layout();
            let a = crate::client::mount_entry(&layout.mounts, from).map(|m| m.prefix.clone());
            let b = crate::client::mount_entry(&layout.mounts, to).map(|m| m.prefix.clone());
            a == b
        };
        if !same {
            return Err(Error::BadPath(format!(
                "{from} -> {to}: a rename stays within one mount"
            )));
        }
        let op = ChangeOp::Rename {
            from: from.into(),
            to: to.into(),
            replace,
        };
        self.change(from, op).await.map(|_| ())
    }

    /// Deletes the file `path` of a `back` or `transient` mount (the under storage's copy too,
    /// once the cluster's flusher gets to it).
    pub async fn remove_file(&self, path: &str) -> Result<(), Error> {
        self.remove_file_if(path, Expect::Any).await
    }

    /// [`Client::remove_file`] only if the path holds what `expect` says ([`Expect::Version`]:
    /// that version of the file), checked and deleted in one step by the path's metadata
    /// owner; otherwise [`Error::Precondition`] and nothing changes.
    pub async fn remove_file_if(&self, path: &str, expect: Expect) -> Result<(), Error> {
        crate::ufs::check_written_path(path)?;
        self.cached_mount(path)?;
        let op = ChangeOp::Delete {
            path: path.into(),
            dir: false,
            expect,
        };
        self.change(path, op).await.map(|_| ())
    }

    /// Sets the modification time of the file `path` of a `back` or `transient` mount, which
    /// must hold write-back version `version_tag` ([`Error::Changed`] otherwise, as once a newer
    /// version replaced it; [`Error::NotFound`] for a file only in the under storage, whose
    /// time is the store's). The file's bytes and state stay as they are. With an empty
    /// `version_tag`, the time of the directory made through the cluster at `path`
    /// ([`Error::NotFound`] for a directory of the store, or one implied by paths beneath it).
    pub async fn set_time(
        &self,
        path: &str,
        version_tag: &str,
        mtime_ns: i64,
    ) -> Result<(), Error> {
        crate::ufs::check_written_path(path)?;
        self.cached_mount(path)?;
        let op = ChangeOp::SetTime {
            path: path.into(),
            version_tag: version_tag.into(),
            mtime_ns,
        };
        self.change(path, op).await.map(|_| ())
    }

    /// Sets the modification time of whatever `path` holds now, where the cluster keeps its
    /// time: a file written through the cluster, flushed or not (its version is stat'ed, and a
    /// newer version that replaces it meanwhile is set in its turn), or a directory made
    /// through the cluster. `Ok(false)`: the path is a file or a directory only in the under
    /// storage (or a directory implied by the paths beneath it), whose time is the store's,
    /// and nothing was set.
    pub async fn touch(&self, path: &str, mtime_ns: i64) -> Result<bool, Error> {
        let mut tries = 0;
        loop {
            let version = match self.stat_path(path).await? {
                PathKind::File {
                    version_tag, state, ..
                } if state != FileState::Stored => version_tag,
                PathKind::File { .. } => return Ok(false),
                // Only a directory made through the cluster has a time of its own: one of the
                // store, or implied by the paths beneath it, has no record to set.
                PathKind::Dir { .. } if !self.write_policy(path).is_cached() => return Ok(false),
                PathKind::Dir { .. } => {
                    return match self.set_time(path, "", mtime_ns).await {
                        Err(Error::NotFound(_)) => Ok(false),
                        r => r.map(|()| true),
                    }
                }
            };
            tries += 1;
            match self.set_time(path, &version, mtime_ns).await {
                // Replaced, deleted, or flushed and forgotten since the stat: look again.
                Err(Error::Changed(_) | Error::NotFound(_)) if tries < 3 => continue,
                r => return r.map(|()| true),
            }
        }
    }

    /// Makes the directory `path` in a `back` or `transient` mount; its modification time is
    /// now.
    pub async fn make_dir(&self, path: &str) -> Result<(), Error> {
        self.make_dir_at(path, unix_ns()).await
    }

    /// Makes the directory `path` in a `back` or `transient` mount with the modification time
    /// `mtime_ns` (nanoseconds since the Unix epoch).
    pub async fn make_dir_at(&self, path: &str, mtime_ns: i64) -> Result<(), Error> {
        crate::ufs::check_written_path(path)?;
        self.cached_mount(path)?;
        let op = ChangeOp::MakeDir {
            path: path.into(),
            mtime_ns,
        };
        self.change(path, op).await.map(|_| ())
    }

    /// Removes the empty directory `path` of a `back` or `transient` mount.
    pub async fn remove_dir(&self, path: &str) -> Result<(), Error> {
        crate::ufs::check_written_path(path)?;
        self.cached_mount(path)?;
        let op = ChangeOp::Delete {
            path: path.into(),
            dir: true,
            expect: Expect::Any,
        };
        self.change(path, op).await.map(|_| ())
    }

    /// What waits to reach the under storage under `prefix` (a file or a directory), as the
    /// members that keep its records say: the first that answers.
    pub async fn write_back_state(&self, prefix: &str) -> Result<WriteBackSummary, Error> {
        let body = RequestBody::WriteBackState {
            prefix: prefix.into(),
        };
        match self.ask_record_keeper(prefix, body).await? {
            ResponseBody::WriteBack { summary } => Ok(summary),
            other => Err(Error::unavailable(format!("unexpected answer {other:?}"))),
        }
    }

    /// The attributes (Content-Type, user metadata...) that the cluster keeps with write-back
    /// version `version` of the file at `path` ([`WriteOptions::attrs`]), as the members that
    /// keep its records say: [`Error::NotFound`] when they name another version there. A file
    /// of the under storage, or a flushed one, has its attributes in the store.
    pub async fn attributes(&self, path: &str, version: &str) -> Result<Vec<Attr>, Error> {
        let body = RequestBody::Attributes {
            path: path.into(),
            version_tag: version.into(),
        };
        match self.ask_record_keeper(path, body).await? {
            ResponseBody::Attributes { attrs } => Ok(attrs),
            other => Err(Error::unavailable(format!("unexpected answer {other:?}"))),
        }
    }

    /// Asks `body` of the members that keep the records of `path` (every node keeps them all;
    /// the path's first members are asked first): the first answer.
    async fn ask_record_keeper(
        &self,
        path: &str,
        body: RequestBody,
    ) -> Result<ResponseBody, Error> {
        crate::ufs::check_path(path)?;
        let layout = self.layout();
        let ring = layout.membership.ring();
        let members: Vec<_> = ring
            .replicas_of_hash(path_hash(path), 3)
            .into_iter()
            .filter(|m| !layout.down.contains(&m.node))
            .filter_map(|m| layout.membership.addr_of(m))
            .collect();
        for addr in members {
            match self.ask_with(addr, body.clone(), Bytes::new()).await {
                Attempt::Answer(Ok((answer, _))) => return Ok(answer),
                Attempt::Answer(Err(e)) => return Err(e),
                Attempt::Failed(_) | Attempt::StoreFailed(_) | Attempt::Unverified(_) => {}
            }
        }
        Err(Error::unavailable(format!("{path}: no member answered")))
    }

    /// Sends page `page` of write-back version `tag` (`bytes`) to its write members: as many
    /// distinct ones as the cluster's write replicas, trying the next members when one cannot
    /// be reached, waiting (up to `wait`) while the members' dirty limit is reached, and
    /// sending again (for up to [`UNREACHABLE_WAIT`]) while too few members can be reached.
    ///
    /// `holders` lists every member that was ever asked to take this page (whether it answered
    /// or not: one that timed out may have stored it): each of them that is not down must take
    /// the new bytes too. A member left holding an earlier copy of a page would serve it to
    /// readers, and to the flusher, under the same version. A member first asked during this
    /// send holds nothing of the page or these same bytes, so the tries again after a failure
    /// do not wait for it (a member that died meanwhile is replaced by the next candidate).
    /// `took` gets each member that answered it stored the page.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn send_page(
        &self,
        (tag, since): (&str, u64),
        file_id: u128,
        page: u64,
        bytes: &Bytes,
        wait: Duration,
        holders: &mut Vec<MemberId>,
        took: &mut Vec<MemberId>,
    ) -> Result<(), Error> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        let earlier = holders.clone();
        loop {
            match self
                .send_page_once(
                    (tag, since),
                    file_id,
                    page,
                    bytes,
                    (&earlier, holders),
                    took,
                )
                .await
            {
                Err(Error::NoSpace(m)) if started.elapsed() < wait => {
                    tracing::debug!(page, why = %m, "write members are full; waiting for flushes");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                // Too few members answered (one given up on for a moment: on a busy machine
                // the silence rule gives up on live members too); the page is the same when
                // sent again.
                Err(Error::Unavailable { message, .. }) if started.elapsed() < UNREACHABLE_WAIT => {
                    tracing::debug!(page, why = %message, "too few members took a page; again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    async fn send_page_once(
        &self,
        (tag, since): (&str, u64),
        file_id: u128,
        page: u64,
        bytes: &Bytes,
        (earlier, holders): (&[MemberId], &mut Vec<MemberId>),
        took: &mut Vec<MemberId>,
    ) -> Result<(), Error> {
        let layout = self.layout();
        let ring = layout.membership.ring();
        let want = usize::from(layout.write_replicas());
        let candidates = ring.replicas(file_id, page, want + WRITE_SLOP);
        let need = want.min(candidates.len()).max(1);
        let key = Key {
            file_id: FileId::from_u128(file_id),
            page,
        };
        let up = |m: &MemberId| !layout.down.contains(&m.node);
        // The members that hold an earlier copy come first: they must all take this one.
        let must: Vec<MemberId> = candidates
            .iter()
            .filter(|m| earlier.contains(m) && up(m))
            .copied()
            .collect();
        let order: Vec<(MemberId, SocketAddr)> = must
            .iter()
            .chain(candidates.iter().filter(|m| !must.contains(m) && up(m)))
            .filter_map(|&m| layout.membership.addr_of(m).map(|a| (m, a)))
            .collect();
        let body = RequestBody::WriteDirty {
            key,
            version_tag: tag.to_string(),
            len: bytes.len() as u32,
            epoch: ring.epoch(),
            since,
        };
        // The members the page still needs are sent it at once (with R = 2 a page costs one
        // round trip, not two); the next candidates stand in for those that fail.
        let mut stored = 0;
        let mut missed = Vec::new();
        let mut last_err = None;
        let mut next = 0;
        while (stored < need || next < must.len()) && next < order.len() {
            let count = (need.saturating_sub(stored)).max(must.len().saturating_sub(next));
            let wave = &order[next..(next + count).min(order.len())];
            next += wave.len();
            for (m, _) in wave {
                if !holders.contains(m) {
                    holders.push(*m);
                }
            }
            let answers = futures_util::future::join_all(wave.iter().map(|&(m, addr)| {
                let body = body.clone();
                async move { (m, addr, self.ask_with(addr, body, bytes.clone()).await) }
            }))
            .await;
            for (m, addr, answer) in answers {
                match answer {
                    Attempt::Answer(Ok((ResponseBody::Written, _))) => {
                        stored += 1;
                        took.push(m);
                    }
                    Attempt::Answer(Ok((other, _))) => {
                        last_err = Some(Error::unavailable(format!("unexpected answer {other:?}")))
                    }
                    // Full, a closed version, a refusal: the same on every member.
                    Attempt::Answer(Err(e)) => return Err(e),
                    Attempt::Failed(why) | Attempt::StoreFailed(why) | Attempt::Unverified(why) => {
                        if must.contains(&m) {
                            missed.push(addr);
                        }
                        last_err = Some(Error::unavailable(format!(
                            "write member {addr} did not take page {page}: {why}"
                        )))
                    }
                }
            }
        }
        if !missed.is_empty() {
            // Sent again until they take it (or are found down): readers must not find the
            // earlier bytes there.
            return Err(Error::unavailable(format!(
                "page {page}: write members {missed:?} hold an earlier copy and did not take \
                 this one ({})",
                last_err.map(|e| e.to_string()).unwrap_or_default()
            )));
        }
        if stored >= need {
            return Ok(());
        }
        Err(last_err.unwrap_or_else(|| {
            Error::unavailable(format!(
                "only {stored} of the {need} write members took page {page}"
            ))
        }))
    }
}

/// Appends bytes `from..to` of a page whose first `held.len()` bytes are `held` (the rest
/// reads as zeros) to `out`.
fn copy_held(out: &mut BytesMut, held: &[u8], from: usize, to: usize) {
    let have = held.len().min(to);
    if from < have {
        out.extend_from_slice(&held[from..have]);
    }
    out.resize(out.len() + (to - from) - have.saturating_sub(from), 0);
}

/// Writes `src` into the page buffer `buf` at `at`: the bytes it holds are overwritten, the rest
/// appended (only a gap before `at` is zero-filled, never bytes about to be written).
fn put_at(buf: &mut BytesMut, at: usize, src: &[u8]) {
    if buf.len() <= at {
        buf.resize(at, 0);
        buf.extend_from_slice(src);
    } else {
        let over = (buf.len() - at).min(src.len());
        buf[at..at + over].copy_from_slice(&src[..over]);
        buf.extend_from_slice(&src[over..]);
    }
}

impl Writer {
    /// The path written.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The file's size now.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Sets the file's modification time (nanoseconds since the Unix epoch), sent with the
    /// next commit; a later write or truncation sets it to that moment again, as on a disk.
    pub fn set_mtime(&mut self, mtime_ns: i64) {
        self.mtime_ns = mtime_ns;
    }

    /// Replaces the file's attributes ([`WriteOptions::attrs`], checked as there), sent with
    /// the next commit: a writer that learns them from the bytes (a digest) sets them before
    /// [`Writer::close`].
    pub fn set_attrs(&mut self, attrs: Vec<Attr>) -> Result<(), Error> {
        frame::check_attrs("attributes", &attrs)
            .map_err(|e| Error::Invalid(format!("{}: {e}", self.path)))?;
        self.options.attrs = attrs;
        Ok(())
    }

    /// The write-back version this writer writes.
    pub fn version(&self) -> &str {
        &self.tag
    }

    /// What a reader of the version written so far is given.
    fn info(&self, size: u64) -> ObjectInfo {
        ObjectInfo {
            path: self.path.clone(),
            size,
            version: self.tag.clone(),
            file_id: self.file_id,
            mtime_ns: self.mtime_ns,
            state: FileState::Writing,
            store_tag: String::new(),
        }
    }

    /// Starts the version as a copy of `base` (the file's content when opened for writing).
    async fn copy_from(&mut self, base: &ObjectInfo) -> Result<(), Error> {
        let ps = self.page_size;
        for page in 0..base.size.div_ceil(ps) {
            let bytes = self.client.read_page(base, page, 0, ps as u32).await?;
            self.write_at(page * ps, &bytes).await?;
        }
        self.size = base.size;
        Ok(())
    }

    /// Writes `data` at `offset` (beyond the end: the gap reads as zeros).
    pub async fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.write_from(offset, data, None).await
    }

    /// [`Writer::write_at`] for bytes the caller hands over: each whole page of `data` (a page
    /// it covers from its first byte to its last) is sent as it is, without being copied into
    /// a page buffer first. The rest is written as `write_at` writes it.
    pub async fn write_bytes(&mut self, offset: u64, data: Bytes) -> Result<(), Error> {
        self.write_from(offset, &data, Some(&data)).await
    }

    /// `data` at `offset`; `whole`: the same bytes, owned, whose whole pages are sent as they
    /// are.
    async fn write_from(
        &mut self,
        offset: u64,
        data: &[u8],
        whole: Option<&Bytes>,
    ) -> Result<(), Error> {
        self.check_open()?;
        let ps = self.page_size;
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let page = at / ps;
            let in_page = (at % ps) as usize;
            let n = (ps as usize - in_page).min(data.len() - done);
            if let Some(s) = self.spill.as_mut().filter(|s| s.held(page).is_some()) {
                // Written where it falls in the spill file; sent at the next flush.
                s.write(page, in_page, &data[done..done + n])
                    .map_err(|e| spill_error(&self.path, &e))?;
                done += n;
                self.size = self.size.max(at + n as u64);
                continue;
            }
            if let Some(b) = whole.filter(|_| n as u64 == ps) {
                // The whole page is these bytes: whatever it held here goes.
                self.open.remove(&page);
                self.send_bytes(page, b.slice(done..done + n)).await?;
                done += n;
                self.size = self.size.max(at + n as u64);
                continue;
            }
            let mut buf = self.take_page(page).await?;
            put_at(&mut buf, in_page, &data[done..done + n]);
            // A page is sent once a write fills it up to its end, as a sequential writer
            // does. A write elsewhere in a page that is already whole (a random writer) leaves
            // it open for the next writes: sending it at once would cost, for each small write,
            // waiting for that send, reading the page back and sending it again.
            let full = buf.len() as u64 == ps && (in_page + n) as u64 == ps;
            self.open.insert(page, buf);
            done += n;
            self.size = self.size.max(at + n as u64);
            if full {
                self.send(page).await?;
            }
        }
        // Too many pages filled here: spill the oldest, or send it.
        while self.open.len() > self.options.inflight.max(1) {
            let Some((&page, _)) = self.open.iter().next() else {
                break;
            };
            if let Some(s) = &mut self.spill {
                if let Some(buf) = self.open.remove(&page) {
                    s.put(page, &buf).map_err(|e| spill_error(&self.path, &e))?;
                }
            } else {
                self.send(page).await?;
            }
        }
        self.mtime_ns = unix_ns();
        Ok(())
    }

    /// The bytes of `page` to change: from here, else read back from its members, else zeros.
    async fn take_page(&mut self, page: u64) -> Result<BytesMut, Error> {
        if let Some(b) = self.open.remove(&page) {
            return Ok(b);
        }
        if let Some(s) = &mut self.spill {
            if let Some(b) = s.take(page).map_err(|e| spill_error(&self.path, &e))? {
                return Ok(b);
            }
        }
        self.wait_sent(page).await?;
        let Some(&len) = self.sent.get(&page) else {
            return Ok(BytesMut::with_capacity(self.page_size as usize));
        };
        let info = self.info((page + 1) * self.page_size);
        let bytes = self.client.read_page(&info, page, 0, len).await?;
        if bytes.len() != len as usize {
            return Err(Error::unavailable(format!(
                "{}: page {page} read back with {} bytes, {len} were written",
                self.path,
                bytes.len()
            )));
        }
        let mut b = BytesMut::with_capacity(self.page_size as usize);
        b.extend_from_slice(&bytes);
        Ok(b)
    }

    /// Waits for a send of `page` in progress, if any.
    async fn wait_sent(&mut self, page: u64) -> Result<(), Error> {
        if let Some((len, task)) = self.sending.remove(&page) {
            join(task).await?;
            self.sent.insert(page, len);
        }
        Ok(())
    }

    /// Starts sending the open page `page` (at most `inflight` sends at once).
    async fn send(&mut self, page: u64) -> Result<(), Error> {
        let Some(buf) = self.open.remove(&page) else {
            return Ok(());
        };
        self.send_bytes(page, buf.freeze()).await
    }

    /// Starts sending `bytes` as page `page` (at most `inflight` sends at once).
    async fn send_bytes(&mut self, page: u64, bytes: Bytes) -> Result<(), Error> {
        self.wait_sent(page).await?;
        while self.sending.len() >= self.options.inflight.max(1) {
            let Some((&oldest, _)) = self.sending.iter().next() else {
                break;
            };
            self.wait_sent(oldest).await?;
        }
        let len = bytes.len() as u32;
        let (client, tag, since, id, wait, holders) = (
            self.client.clone(),
            self.tag.clone(),
            self.since,
            self.file_id,
            self.options.write_wait,
            self.holders.clone(),
        );
        let uncommitted = (since == 0).then(|| self.uncommitted.clone());
        if since == 0 && self.renewer.is_none() {
            let renew = renew_loop(self.client.clone(), tag.clone(), self.uncommitted.clone());
            self.renewer = Some(tokio::spawn(renew));
        }
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut held = take_holders(&holders, page);
            let mut took = Vec::new();
            let sent = client
                .send_page((&tag, since), id, page, &bytes, wait, &mut held, &mut took)
                .await;
            if let Some(u) = uncommitted {
                let ended = Instant::now();
                let mut u = u.lock().unwrap_or_else(|p| p.into_inner());
                u.sent(page, (&held, &took), started, ended);
            }
            holders
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(page, held);
            sent.map(|()| len)
        });
        self.sending.insert(page, (len, task));
        Ok(())
    }

    /// Reads `len` bytes at `offset` of what this writer has written so far (fewer at the end of
    /// the file): its pages in memory, else what the page's write members hold (after a send
    /// of it in progress), zeros in holes. Nothing is sent or committed: a process that reads
    /// the file it is writing (through pagefs) does not make it durable at every read.
    pub async fn read_at(&mut self, offset: u64, len: u64) -> Result<Bytes, Error> {
        self.check_open()?;
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let ps = self.page_size;
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        let mut at = offset;
        while at < end {
            let page = at / ps;
            let from = (at - page * ps) as usize;
            let to = (end.min((page + 1) * ps) - page * ps) as usize;
            let spilled = self.spill.as_ref().and_then(|s| s.held(page));
            if let Some(b) = self.open.get(&page) {
                copy_held(&mut out, b, from, to);
            } else if let (Some(held), Some(s)) = (spilled, &mut self.spill) {
                let n = to.min(held as usize).saturating_sub(from);
                let b = s
                    .read(page, from, from + n)
                    .map_err(|e| spill_error(&self.path, &e))?;
                out.extend_from_slice(&b);
                out.resize(out.len() + (to - from - n), 0);
            } else {
                self.wait_sent(page).await?;
                match self.sent.get(&page) {
                    Some(&held) if from < held as usize => {
                        let n = to.min(held as usize) - from;
                        let info = self.info((page + 1) * ps);
                        let b = self
                            .client
                            .read_page(&info, page, from as u32, n as u32)
                            .await?;
                        if b.len() != n {
                            return Err(Error::unavailable(format!(
                                "{}: page {page} read back with {} bytes at {from}, {n} were \
                                 written",
                                self.path,
                                b.len()
                            )));
                        }
                        out.extend_from_slice(&b);
                        out.resize(out.len() + (to - from - n), 0);
                    }
                    _ => out.resize(out.len() + (to - from), 0),
                }
            }
            at = page * ps + to as u64;
        }
        Ok(out.freeze())
    }

    /// Cuts or extends the file to `size` bytes (an extension reads as zeros).
    pub async fn set_len(&mut self, size: u64) -> Result<(), Error> {
        self.check_open()?;
        let ps = self.page_size;
        if size < self.size {
            let keep = size.div_ceil(ps);
            let beyond: Vec<u64> = self.open.range(keep..).map(|(&p, _)| p).collect();
            for p in beyond {
                self.open.remove(&p);
            }
            if let Some(s) = &mut self.spill {
                s.drop_from(keep);
            }
            for p in self
                .sending
                .keys()
                .copied()
                .filter(|&p| p >= keep)
                .collect::<Vec<_>>()
            {
                self.wait_sent(p).await?;
            }
            self.sent.retain(|&p, _| p < keep);
            if size % ps != 0 {
                let last = size / ps;
                let mut buf = self.take_page(last).await?;
                buf.truncate((size % ps) as usize);
                self.open.insert(last, buf);
            }
        }
        self.size = size;
        self.mtime_ns = unix_ns();
        Ok(())
    }

    /// Makes every page written so far durable on its write members, fills holes with zeros,
    /// and commits the file at its size now (visible to every reader; `fsync`).
    pub async fn flush(&mut self) -> Result<(), Error> {
        self.check_open()?;
        self.settle().await?;
        self.commit(false).await
    }

    /// [`Writer::flush`], and the version is final: the cluster may flush it to the under
    /// storage. Returns what a stat of the path now answers.
    pub async fn close(mut self) -> Result<ObjectInfo, Error> {
        self.check_open()?;
        self.settle().await?;
        self.commit(true).await?;
        self.closed = true;
        let mut info = self.info(self.size);
        info.state = FileState::Dirty;
        Ok(info)
    }

    /// Gives the file up before any commit: nothing of it becomes visible, and the write
    /// members drop the pages sent so far at once (rather than after their orphan grace), so
    /// the room those pages took under the dirty limit is free again. Sends in progress are
    /// stopped. Returns the pages the members dropped. [`Error::Changed`] once a commit was
    /// tried ([`Writer::flush`], [`Writer::close`], [`WriteOptions::visible_at_open`]): the
    /// cluster may name the version, and a committed file is deleted instead. A writer dropped
    /// without a commit does the same, unwaited.
    pub async fn discard(mut self) -> Result<u64, Error> {
        if self.commit_tried || self.closed {
            return Err(Error::Changed(format!(
                "{}: a commit of this file was sent, so it is not discarded; delete it instead",
                self.path
            )));
        }
        let (client, tag, members) = self.give_up();
        self.closed = true;
        discard_on(&client, &tag, &members).await
    }

    /// Stops the sends in progress and forgets the pages here; returns what a discard needs:
    /// the client, the version and every member that may hold one of its pages (those sent
    /// to, and every candidate of a page whose send was stopped).
    fn give_up(&mut self) -> (Arc<Client>, String, Vec<MemberId>) {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let mut members: Vec<MemberId> = Vec::new();
        let stopped: Vec<u64> = std::mem::take(&mut self.sending)
            .into_iter()
            .map(|(page, (_, task))| {
                task.abort();
                page
            })
            .collect();
        if !stopped.is_empty() {
            let layout = self.client.layout();
            let want = usize::from(layout.write_replicas()) + WRITE_SLOP;
            for page in stopped {
                members.extend(layout.membership.ring().replicas(self.file_id, page, want));
            }
        }
        for held in self
            .holders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .flat_map(|(_, h)| h)
        {
            members.push(held);
        }
        members.sort_by_key(|m| (m.node, m.shard));
        members.dedup();
        self.open.clear();
        self.sent.clear();
        self.spill = None;
        (self.client.clone(), self.tag.clone(), members)
    }

    /// Sends every page the file needs at its size: the open ones, zeros for holes, and again
    /// any page held with another length than the size now gives it; then waits for them all.
    async fn settle(&mut self) -> Result<(), Error> {
        let ps = self.page_size;
        let pages = self.size.div_ceil(ps);
        for page in 0..pages {
            let want = (self.size - page * ps).min(ps) as usize;
            let held = self
                .sending
                .get(&page)
                .map(|(l, _)| *l)
                .or_else(|| self.sent.get(&page).copied());
            let spilled = self.spill.as_ref().is_some_and(|s| s.held(page).is_some());
            if !self.open.contains_key(&page) && !spilled && held == Some(want as u32) {
                continue;
            }
            let mut buf = self.take_page(page).await?;
            buf.resize(want, 0);
            self.open.insert(page, buf);
            self.send(page).await?;
        }
        for p in self.sending.keys().copied().collect::<Vec<_>>() {
            self.wait_sent(p).await?;
        }
        Ok(())
    }

    async fn commit(&mut self, last: bool) -> Result<(), Error> {
        if self.since == 0 {
            let (lost, grace) = {
                let u = self.uncommitted.lock().unwrap_or_else(|p| p.into_inner());
                (u.lost(Instant::now()), u.grace().as_secs_f64())
            };
            if let Some((page, m, lapse)) = lost {
                let member = format!("{:032x}/{}", m.node, m.shard);
                let why = match lapse {
                    Lapse::Quiet(quiet) => format!(
                        "member {member} was neither sent a page of this file nor reached by a \
                         renewal for {:.0} s before its first commit (a node drops the pages of \
                         an uncommitted file {grace:.0} s after its writer was last heard)",
                        quiet.as_secs_f64()
                    ),
                    Lapse::Dropped => format!(
                        "member {member} dropped this file's pages as a gone writer's (nothing \
                         reached it from this writer for its orphan grace, {grace:.0} s)"
                    ),
                };
                let why =
                    format!("{why}, and no other member that took page {page} is sure to hold it");
                return Err(Error::Changed(format!(
                    "{}: {why}; write it again",
                    self.path
                )));
            }
        }
        let mut op = ChangeOp::Commit {
            path: self.path.clone(),
            version_tag: self.tag.clone(),
            size: self.size,
            mtime_ns: self.mtime_ns,
            last,
            expect: self.options.expect.clone(),
            attrs: self.options.attrs.clone(),
            since: self.since,
        };
        let mut open = self.last_open_commit.lock().await;
        self.commit_tried = true;
        let hlc = self.client.change(&self.path, op.clone()).await?;
        if self.since == 0 {
            // Later commits and pages (and the keepalive's repeats) say when the cluster
            // first took it.
            self.since = hlc.max(1);
            if let Some(r) = self.renewer.take() {
                r.abort();
            }
            *self.uncommitted.lock().unwrap_or_else(|p| p.into_inner()) = Uncommitted::default();
            if let ChangeOp::Commit { since, .. } = &mut op {
                *since = self.since;
            }
        }
        if last {
            *open = None;
            drop(open);
            if let Some(k) = self.keepalive.take() {
                k.abort();
            }
            return Ok(());
        }
        *open = Some(op);
        drop(open);
        if self.keepalive.is_none() {
            let (client, path, last_open) = (
                self.client.clone(),
                self.path.clone(),
                self.last_open_commit.clone(),
            );
            self.keepalive = Some(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(KEEPALIVE).await;
                    let open = last_open.lock().await;
                    let Some(op) = open.clone() else {
                        return;
                    };
                    if let Err(e) = client.change(&path, op).await {
                        tracing::warn!(%path, error = %e, "keeping an open file's version alive");
                    }
                }
            }));
        }
        Ok(())
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.closed {
            return Err(Error::Changed(format!("{}: closed", self.path)));
        }
        Ok(())
    }
}

fn spill_error(path: &str, e: &std::io::Error) -> Error {
    let m = format!("{path}: the writer's spill file: {e}");
    if e.kind() == std::io::ErrorKind::StorageFull {
        Error::NoSpace(m)
    } else {
        Error::unavailable(m)
    }
}

fn take_holders(holders: &Mutex<HashMap<u64, Vec<MemberId>>>, page: u64) -> Vec<MemberId> {
    holders
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&page)
        .unwrap_or_default()
}

async fn join(task: PageSend) -> Result<u32, Error> {
    task.await
        .map_err(|e| Error::unavailable_from("a page send stopped", e))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `put_at` against a plain model: a vector grown with zeros, then overwritten.
    #[test]
    fn put_at_writes_like_a_zero_filled_overwrite() {
        let cases: &[(&[u8], usize, &[u8])] = &[
            (b"", 0, b"abc"),
            (b"", 3, b"abc"),
            (b"xy", 2, b"abc"),
            (b"xyz", 1, b"ab"),
            (b"xyz", 1, b"abcd"),
            (b"xyz", 0, b""),
            (b"xyz", 5, b""),
            (b"xyzw", 1, b"a"),
        ];
        for &(start, at, src) in cases {
            let mut model = start.to_vec();
            if model.len() < at + src.len() {
                model.resize(at + src.len(), 0);
            }
            model[at..at + src.len()].copy_from_slice(src);
            let mut buf = BytesMut::from(start);
            put_at(&mut buf, at, src);
            assert_eq!(&buf[..], &model[..], "{start:?} at {at} with {src:?}");
        }
    }

    /// Before its first commit, a version is given up once some page may be gone from every
    /// member that took it: each went half the orphan grace unheard (no page sent to it, no
    /// renewal answered by it with pages held), whether that gap is still open at the commit or
    /// was closed by a later page (the member may have dropped the earlier ones meanwhile), or
    /// a renewal found it holding none after it took one. Members that never took a page have
    /// nothing to lose, and a page another member still holds is not lost.
    #[test]
    fn uncommitted_pages_are_given_up_when_a_page_may_be_gone_from_every_member() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let m = |node: u128| MemberId { node, shard: 0 };
        let (a, b, c) = (m(1), m(2), m(3));
        let mut u = Uncommitted::default();
        assert_eq!(u.lost(t0 + s(3600)), None, "nothing sent, nothing to lose");
        assert_eq!(u.kept(), DEFAULT_ORPHAN_GRACE / 2);
        assert_eq!(u.renew_every(), RENEW_EVERY);
        // Page 0 taken by a and b; page 1 asked of c, which never answers, then taken by a.
        u.sent(0, (&[a, b], &[a, b]), t0, t0 + s(1));
        u.sent(1, (&[c], &[]), t0, t0 + s(1));
        u.sent(1, (&[c, a], &[a]), t0, t0 + s(2));
        assert_eq!(u.members(), vec![a, b, c]);
        // Renewals every 15 s keep a and b; c holds none and is no longer renewed.
        for k in 1..=8 {
            let at = t0 + s(15 * k);
            u.renewed(a, at, 2, s(120));
            u.renewed(b, at, 1, s(120));
            u.renewed(c, at, 0, s(120));
        }
        assert_eq!(u.members(), vec![a, b]);
        assert_eq!(u.lost(t0 + s(120 + 59)), None, "two minutes of renewals");
        // b is not reached any more (its node died): page 0 is still on a.
        for k in 9..=12 {
            u.renewed(a, t0 + s(15 * k), 2, s(120));
        }
        assert_eq!(u.lost(t0 + s(180)), None);
        // a is not reached either for half the grace: page 0 may be gone from both.
        assert_eq!(u.lost(t0 + s(180 + 59)), None);
        assert_eq!(u.lost(t0 + s(180 + 60)), Some((0, a, Lapse::Quiet(s(60)))));
        // A member that tells a shorter grace shortens the rules for every member.
        let mut u = Uncommitted::default();
        u.sent(0, (&[a], &[a]), t0, t0);
        u.renewed(a, t0 + s(1), 1, s(8));
        assert_eq!((u.kept(), u.renew_every()), (s(4), s(2)));
        assert_eq!(u.lost(t0 + s(4)), None);
        assert_eq!(u.lost(t0 + s(5)), Some((0, a, Lapse::Quiet(s(4)))));
        // A gap closed by a later page stays on record.
        let mut u = Uncommitted::default();
        u.sent(0, (&[a], &[a]), t0, t0);
        u.sent(1, (&[a], &[a]), t0 + s(61), t0 + s(62));
        assert_eq!(u.lost(t0 + s(62)), Some((0, a, Lapse::Quiet(s(61)))));
        // Sends that end out of order keep the latest start.
        let mut u = Uncommitted::default();
        u.sent(0, (&[a], &[a]), t0 + s(40), t0 + s(41));
        u.sent(1, (&[a], &[a]), t0, t0 + s(42));
        assert_eq!(u.lost(t0 + s(40 + 59)), None);
        // A member that took a page and holds none at a later renewal dropped it: lost when
        // it was the page's only member, not while another holds it.
        let mut u = Uncommitted::default();
        u.sent(0, (&[a, b], &[a, b]), t0, t0 + s(1));
        u.sent(1, (&[a], &[a]), t0, t0 + s(1));
        u.renewed(a, t0 + s(2), 0, s(120));
        assert_eq!(u.lost(t0 + s(2)), Some((1, a, Lapse::Dropped)));
        let mut u = Uncommitted::default();
        u.sent(0, (&[a, b], &[a, b]), t0, t0 + s(1));
        u.renewed(a, t0 + s(2), 0, s(120));
        assert_eq!(u.lost(t0 + s(2)), None);
        // A page sent again to other members is judged by them.
        u.renewed(b, t0 + s(2), 0, s(120));
        assert_eq!(u.lost(t0 + s(2)), Some((0, a, Lapse::Dropped)));
        u.sent(0, (&[c], &[c]), t0 + s(3), t0 + s(4));
        assert_eq!(u.lost(t0 + s(4)), None);
        // A member whose first page it took after the renewal left is not taken for one that
        // dropped it (the renewal may have been answered before the page was stored).
        let mut u = Uncommitted::default();
        u.sent(0, (&[a], &[a]), t0, t0 + s(3));
        u.renewed(a, t0 + s(2), 0, s(120));
        assert_eq!(u.lost(t0 + s(3)), None);
        assert_eq!(u.members(), vec![a]);
    }
}
