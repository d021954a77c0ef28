//! Write-back through real `pagestored` processes: files written to a `write=back` mount are
//! acknowledged once durable on the write replicas, read byte-exact by every client before and
//! after they are flushed, flushed to the store with the exact bytes and the same version, and
//! nothing acknowledged is lost when a node is SIGKILLed, restarted, or the store goes away.
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use common::{bytes, Cluster};
use pagestore_client::{Client, ClientOptions, Error, WriteOptions};
use pagestore_protocol::{
    frame::{self, Attr, DirEntry, FileState, PathKind},
    node_id::format_uuid,
    ring::{self, path_hash},
};
use pagestore_testkit::{local_cluster::Settings, S3Server};

const MIB: usize = 1 << 20;

/// A cluster with `/ck` a write-back mount over `store` (URL parameters `params` added) and
/// `/data` an ordinary one.
fn cluster(nodes: usize, extra: &[&str], params: &str) -> (Cluster, std::path::PathBuf) {
    cluster_with(nodes, extra, params, |_, _| {})
}

/// [`cluster`], with `tune` given the settings and the `/data` directory before the nodes
/// start.
fn cluster_with(
    nodes: usize,
    extra: &[&str],
    params: &str,
    tune: impl FnOnce(&mut Settings, &std::path::Path),
) -> (Cluster, std::path::PathBuf) {
    let (dir, mut s) = common::settings();
    let store = dir.path().join("store");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    s.nodes = nodes;
    s.mounts = vec![
        format!("/ck=file://{}?write=back{params}", store.display()),
        format!("/data=file://{}", data.display()),
    ];
    s.extra = extra.iter().map(|x| x.to_string()).collect();
    tune(&mut s, &data);
    (Cluster::start(dir, s), store)
}

async fn read_all(c: &Arc<Client>, path: &str) -> Vec<u8> {
    let info = c.stat(path).await.unwrap();
    c.read_at(&info, 0, info.size).await.unwrap().to_vec()
}

/// The names a listing of `dir` gives, in its order.
async fn names(c: &Client, dir: &str) -> Vec<String> {
    c.list(dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// Waits (up to `limit`) until nothing under `prefix` waits for the store.
async fn synced(c: &Client, prefix: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        let s = c.write_back_state(prefix).await.unwrap();
        if s.files_dirty == 0 && s.deletes_pending == 0 {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{prefix} not flushed after {limit:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn state_of(k: &PathKind) -> FileState {
    match k {
        PathKind::File { state, .. } => *state,
        PathKind::Dir { .. } => panic!("a directory"),
    }
}

/// The addresses of the first `n` members of `path`'s successors on `client`'s ring (its
/// metadata owner first).
fn path_members(client: &Client, path: &str, n: usize) -> Vec<std::net::SocketAddr> {
    let membership = client.membership();
    membership
        .ring()
        .replicas_of_hash(path_hash(path), n)
        .into_iter()
        .filter_map(|m| membership.addr_of(m))
        .collect()
}

/// The index of the node that is `path`'s metadata owner (and so its flusher while alive).
fn owner_of(c: &Cluster, client: &Client, path: &str) -> usize {
    let owner = client.membership().ring().owner_of_hash(path_hash(path));
    node_index(c, owner.unwrap().node)
}

/// Writes `data` at offset 0 of `w` and flushes it, in a task of its own (the test meanwhile
/// stops or resumes nodes); the writer comes back for its close.
fn write_and_flush(
    mut w: pagestore_client::Writer,
    data: Vec<u8>,
) -> tokio::task::JoinHandle<Result<pagestore_client::Writer, Error>> {
    tokio::spawn(async move {
        w.write_at(0, &data).await?;
        w.flush().await?;
        Ok(w)
    })
}

/// A fresh client that learns the cluster from node `i` (no back-off carried over).
async fn client_through(c: &Cluster, i: usize) -> Arc<Client> {
    Client::connect(
        &pagestore_client::ClusterSource::Addr(c.nodes[i].base),
        pagestore_client::tls::client_config(&c.ca_dir).unwrap(),
        None,
        ClientOptions::default(),
    )
    .await
    .unwrap()
}

/// The index in `c.nodes` of the node whose id is `node`.
fn node_index(c: &Cluster, node: u128) -> usize {
    c.nodes
        .iter()
        .position(|n| n.id == format_uuid(node))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_through_the_cluster_are_read_everywhere_before_and_after_their_flush() {
    let (c, store) = cluster(3, &["--write-replicas", "2"], "");
    let writer = c.client(ClientOptions::default()).await;
    let reader = c.client(ClientOptions::default()).await;
    assert_eq!(writer.write_replicas(), 2);
    let ps = MIB;

    // Whole files of every awkward size, each complete and visible at close.
    let sizes = [0, 1, ps - 1, ps, ps + 1, 3 * ps + 5];
    for (i, &n) in sizes.iter().enumerate() {
        let want = bytes(i as u64 + 1, n);
        let mut w = writer
            .create(&format!("/ck/sizes/f{i}"), WriteOptions::default())
            .await
            .unwrap();
        // Odd-sized pieces, so pages are filled by several writes.
        for (k, piece) in want.chunks(777_777).enumerate() {
            w.write_at((k * 777_777) as u64, piece).await.unwrap();
        }
        let info = w.close().await.unwrap();
        assert_eq!(info.size, n as u64);
        assert_eq!(
            read_all(&reader, &format!("/ck/sizes/f{i}")).await,
            want,
            "f{i}"
        );
    }
    let listed = names(&reader, "/ck/sizes").await;
    assert_eq!(
        listed,
        (0..sizes.len())
            .map(|i| format!("f{i}"))
            .collect::<Vec<_>>()
    );

    // An open file: visible at its size after each flush (fsync), not in the store while its
    // writer holds it open; random writes, a hole, a truncation.
    let path = "/ck/run/model.pt";
    let mut model = bytes(99, 2 * ps + 10);
    let mut w = writer
        .create(
            path,
            WriteOptions {
                visible_at_open: true,
                ..WriteOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(reader.stat(path).await.unwrap().size, 0);
    w.write_at(0, &model).await.unwrap();
    w.flush().await.unwrap();
    assert_eq!(read_all(&reader, path).await, model);
    assert_eq!(
        state_of(&reader.stat_path(path).await.unwrap()),
        FileState::Writing
    );
    let patch = bytes(7, 300_000);
    let at = ps - 100_000;
    model[at..at + patch.len()].copy_from_slice(&patch);
    w.write_at(at as u64, &patch).await.unwrap();
    // Past the end: the gap reads as zeros.
    let tail = bytes(8, 1000);
    let end = model.len() + ps / 2;
    model.resize(end, 0);
    model.extend_from_slice(&tail);
    w.write_at(end as u64, &tail).await.unwrap();
    w.flush().await.unwrap();
    assert_eq!(read_all(&reader, path).await, model);
    w.set_len((2 * ps + 3) as u64).await.unwrap();
    model.truncate(2 * ps + 3);
    let version = w.version().to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !store.join("run/model.pt").exists(),
        "a file its writer holds open is not flushed"
    );
    w.close().await.unwrap();
    assert_eq!(read_all(&reader, path).await, model);

    // Small writes scattered over pages already whole: each page is read back from its
    // members at most once (when it is first changed after it was sent), not once per write.
    let rpath = "/ck/rand/r.bin";
    let mut rmodel = bytes(5, 3 * ps);
    let mut w = writer.create(rpath, WriteOptions::default()).await.unwrap();
    w.write_at(0, &rmodel).await.unwrap();
    // What was written reads back before any commit: here from the members (the pages were
    // sent as they filled), across page boundaries, short at the end.
    let span = w.read_at(ps as u64 - 10, 20).await.unwrap();
    assert_eq!(&span[..], &rmodel[ps - 10..ps + 10]);
    let all = w.read_at(0, 4 * ps as u64).await.unwrap();
    assert!(all[..] == rmodel[..], "read_at of the sent pages");
    let page_reads = |c: &Client| {
        let s = c.stats();
        s.owner_reads + s.replica_reads
    };
    let before = page_reads(&writer);
    for k in 0..60u64 {
        // Never ending at a page's end (that would send the page, as a sequential writer's).
        let at = ((k * 7919 * 4096 + 1000) % (3 * ps as u64 - 8192)) as usize;
        let piece = bytes(1000 + k, 4096);
        rmodel[at..at + 4096].copy_from_slice(&piece);
        w.write_at(at as u64, &piece).await.unwrap();
    }
    let read_back = page_reads(&writer) - before;
    assert!(
        read_back <= 3,
        "{read_back} page reads for 60 small writes into 3 pages"
    );
    // Owned bytes over the middle page and halves of its neighbours: the middle page is sent
    // as given (its changed copy in memory goes), the halves land in the pages in memory.
    let over = bytes(4, 2 * ps);
    rmodel[ps / 2..ps / 2 + 2 * ps].copy_from_slice(&over);
    let before = page_reads(&writer);
    w.write_bytes((ps / 2) as u64, over.into()).await.unwrap();
    assert_eq!(page_reads(&writer), before, "nothing read back");
    // From the pages in memory now, and zeros in a hole past the old end.
    let far = bytes(6, 100);
    w.write_at((3 * ps + ps / 2) as u64, &far).await.unwrap();
    rmodel.resize(3 * ps + ps / 2, 0);
    rmodel.extend_from_slice(&far);
    let all = w.read_at(0, 5 * ps as u64).await.unwrap();
    assert!(all[..] == rmodel[..], "read_at of changed pages and a hole");
    assert!(
        matches!(reader.stat(rpath).await, Err(Error::NotFound(_))),
        "reading what one writes commits nothing"
    );
    w.close().await.unwrap();
    assert_eq!(read_all(&reader, rpath).await, rmodel);

    // Flushed: the store holds the exact bytes; readers see the same version as before.
    synced(&reader, "/ck", Duration::from_secs(30)).await;
    assert_eq!(std::fs::read(store.join("run/model.pt")).unwrap(), model);
    for (i, &n) in sizes.iter().enumerate() {
        assert_eq!(
            std::fs::read(store.join(format!("sizes/f{i}"))).unwrap(),
            bytes(i as u64 + 1, n)
        );
    }
    let after = reader.stat_path(path).await.unwrap();
    assert_eq!(state_of(&after), FileState::Clean);
    assert!(matches!(&after, PathKind::File { version_tag, .. } if *version_tag == version));
    assert_eq!(read_all(&reader, path).await, model);
    // A fresh client reads it too (pages from the cache or, once evicted, from the store).
    let fresh = c.client(ClientOptions::default()).await;
    assert_eq!(read_all(&fresh, path).await, model);

    // The checkpoint saver's pattern: write to a temporary name, rename over the final one.
    let ckpt = bytes(5, 3 * ps);
    let mut w = writer
        .create("/ck/run/.tmp-ckpt", WriteOptions::default())
        .await
        .unwrap();
    w.write_at(0, &ckpt).await.unwrap();
    w.close().await.unwrap();
    writer
        .rename("/ck/run/.tmp-ckpt", "/ck/run/model.pt", true)
        .await
        .unwrap();
    assert_eq!(read_all(&reader, path).await, ckpt);
    assert!(matches!(
        reader.stat("/ck/run/.tmp-ckpt").await,
        Err(Error::NotFound(_))
    ));
    let e = writer
        .rename("/ck/run/model.pt", "/ck/sizes/f1", false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Exists(_)), "{e}");
    // A flushed file renamed: copied in the store, same bytes, the old name gone everywhere.
    synced(&reader, "/ck", Duration::from_secs(30)).await;
    writer
        .rename("/ck/sizes/f5", "/ck/sizes/moved", false)
        .await
        .unwrap();
    assert_eq!(
        read_all(&reader, "/ck/sizes/moved").await,
        bytes(6, 3 * ps + 5)
    );
    synced(&reader, "/ck", Duration::from_secs(30)).await;
    assert!(!store.join("sizes/f5").exists());
    assert_eq!(
        std::fs::read(store.join("sizes/moved")).unwrap(),
        bytes(6, 3 * ps + 5)
    );
    assert_eq!(std::fs::read(store.join("run/model.pt")).unwrap(), ckpt);
    assert!(!store.join("run/.tmp-ckpt").exists());

    // A file beneath a file, or where a directory is: refused as such (the flush could never
    // write either to a store).
    let e = writer
        .write_file("/ck/sizes/f1/under", vec![1u8; 10].into())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NotDir(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "/ck/sizes/f1/under: /ck/sizes/f1 is a file: not a directory"
    );
    let e = writer
        .write_file("/ck/sizes", vec![1u8; 10].into())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::IsDir(_)), "{e:?}");
    assert_eq!(e.to_string(), "/ck/sizes: is a directory");

    // Deletion and directories.
    writer.remove_file("/ck/sizes/f0").await.unwrap();
    assert!(matches!(
        reader.stat("/ck/sizes/f0").await,
        Err(Error::NotFound(_))
    ));
    writer.make_dir("/ck/empty").await.unwrap();
    assert!(matches!(
        writer.make_dir("/ck/empty").await,
        Err(Error::Exists(_))
    ));
    assert!(reader
        .list("/ck")
        .await
        .unwrap()
        .iter()
        .any(|e| e.name == "empty" && e.is_dir));
    assert!(matches!(
        writer.remove_dir("/ck/sizes").await,
        Err(Error::NotEmpty(_))
    ));
    // A directory made through the cluster keeps its time, and takes a new one; one implied by
    // the files beneath it, the mount's, or one of a write=through mount has none to set.
    let (made, set) = (1_500_000_000_123_456_789, 1_700_000_000_000_000_001);
    writer.make_dir_at("/ck/dated", made).await.unwrap();
    let dir_time = |entries: Vec<DirEntry>| {
        let e = entries.iter().find(|e| e.name == "dated").unwrap();
        (e.is_dir, e.mtime_ns)
    };
    assert_eq!(
        reader.stat_path("/ck/dated").await.unwrap(),
        PathKind::Dir { mtime_ns: made }
    );
    assert_eq!(dir_time(reader.list("/ck").await.unwrap()), (true, made));
    assert!(writer.touch("/ck/dated", set).await.unwrap());
    assert_eq!(
        reader.stat_path("/ck/dated").await.unwrap(),
        PathKind::Dir { mtime_ns: set }
    );
    assert_eq!(dir_time(reader.list("/ck").await.unwrap()), (true, set));
    // An entry made in it, then removed: its time moves to each change's, as on a disk.
    let before = pagestore_protocol::writeback::unix_ns();
    writer
        .write_file("/ck/dated/f", vec![1u8; 10].into())
        .await
        .unwrap();
    let PathKind::Dir { mtime_ns: made_in } = reader.stat_path("/ck/dated").await.unwrap() else {
        panic!("/ck/dated is no directory")
    };
    assert!(made_in >= before, "{made_in} < {before}");
    writer.remove_file("/ck/dated/f").await.unwrap();
    let PathKind::Dir {
        mtime_ns: removed_in,
    } = reader.stat_path("/ck/dated").await.unwrap()
    else {
        panic!("/ck/dated is no directory")
    };
    assert!(removed_in > made_in, "{removed_in} <= {made_in}");
    for implied in ["/ck/sizes", "/ck", "/data"] {
        assert!(!writer.touch(implied, set).await.unwrap(), "{implied}");
        assert_eq!(reader.stat_path(implied).await.unwrap(), PathKind::DIR);
    }
    writer.remove_dir("/ck/dated").await.unwrap();
    writer.remove_dir("/ck/empty").await.unwrap();
    assert!(matches!(
        reader.stat_path("/ck/empty").await,
        Err(Error::NotFound(_))
    ));
    synced(&reader, "/ck", Duration::from_secs(30)).await;
    assert!(!store.join("sizes/f0").exists());

    // A through mount takes no write-back writes; a reader certificate takes none at all.
    assert!(matches!(
        writer.create("/data/x", WriteOptions::default()).await,
        Err(Error::ReadOnly(_))
    ));
    let no_cert = tempfile::tempdir().unwrap();
    std::fs::copy(
        c.ca_dir.join("ca-cert.pem"),
        no_cert.path().join("ca-cert.pem"),
    )
    .unwrap();
    let anonymous = Client::connect(
        &c.source(),
        pagestore_client::tls::client_config(no_cert.path()).unwrap(),
        None,
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let refused = anonymous.write_file("/ck/evil", vec![1u8; 10].into()).await;
    assert!(matches!(refused, Err(Error::Forbidden(_))), "{refused:?}");
    assert!(matches!(
        anonymous
            .rename("/ck/run/model.pt", "/ck/stolen", true)
            .await,
        Err(Error::Forbidden(_))
    ));
    assert_eq!(read_all(&reader, path).await, ckpt);
}

/// A page rewritten while one of the members holding it cannot be reached: the write waits for
/// that member rather than leave it the earlier bytes, which readers (asking the owner first)
/// and the flusher would be given under the same version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_rewritten_while_a_member_holding_it_is_frozen_is_read_new_from_every_member() {
    let (c, store) = cluster(3, &["--write-replicas", "2"], "");
    let writer = c.client(ClientOptions::default()).await;
    let path = "/ck/frozen/ckpt.bin";
    let old = bytes(21, 100_000);
    let mut w = writer.create(path, WriteOptions::default()).await.unwrap();
    w.write_at(0, &old).await.unwrap();
    w.flush().await.unwrap();

    // Freeze the owner of page 0 (the first member readers ask), then rewrite the page.
    let file_id = ring::file_id(path, w.version());
    let owner = writer.membership().ring().replicas(file_id, 0, 1)[0].node;
    let frozen = node_index(&c, owner);
    c.signal(frozen, libc::SIGSTOP).unwrap();
    let new = bytes(22, 150_000);
    let rewrite = write_and_flush(w, new.clone());
    // Long enough for the writer to give the frozen member up (its silence rule) and back it
    // off: the rewrite must not complete on the other members alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !rewrite.is_finished(),
        "the rewrite finished while a member holding the page was frozen"
    );
    c.signal(frozen, libc::SIGCONT).unwrap();
    let w = rewrite.await.unwrap().unwrap();

    // A fresh client asks the owner first: it has the new bytes, as has every other member.
    let reader = c.client(ClientOptions::default()).await;
    assert_eq!(read_all(&reader, path).await, new);
    w.close().await.unwrap();
    synced(&reader, "/ck", Duration::from_secs(30)).await;
    assert_eq!(std::fs::read(store.join("frozen/ckpt.bin")).unwrap(), new);
}

/// A page's first send finds its first member dead and its second frozen: the next candidate
/// takes it, and once the frozen member is back the write completes on two live members. The
/// dead member, asked in that same send, holds nothing of the page, so the tries again do not
/// wait for it (they did, and the write failed after 30 s). While only one member can take the
/// page the write is not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_write_with_one_member_dead_and_one_frozen_completes_when_the_frozen_one_is_back() {
    let (mut c, store) = cluster(3, &["--write-replicas", "2"], "");
    let writer = c.client(ClientOptions::default()).await;
    let path = "/ck/dead/ckpt.bin";
    let w = writer.create(path, WriteOptions::default()).await.unwrap();
    let file_id = ring::file_id(path, w.version());
    let members = writer.membership().ring().replicas(file_id, 0, 2);
    let (dead, frozen) = (
        node_index(&c, members[0].node),
        node_index(&c, members[1].node),
    );
    c.inner.kill(dead);
    c.signal(frozen, libc::SIGSTOP).unwrap();
    let data = bytes(23, 120_000);
    let write = write_and_flush(w, data.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !write.is_finished(),
        "the write was acknowledged while only one member could take it"
    );
    c.signal(frozen, libc::SIGCONT).unwrap();
    let w = tokio::time::timeout(Duration::from_secs(20), write)
        .await
        .expect("the write still waits 20 s after the frozen member is back")
        .unwrap()
        .unwrap();
    w.close().await.unwrap();
    let reader = c.client(ClientOptions::default()).await;
    assert_eq!(read_all(&reader, path).await, data);
    synced(&reader, "/ck", Duration::from_secs(30)).await;
    assert_eq!(std::fs::read(store.join("dead/ckpt.bin")).unwrap(), data);
}

/// Create-only: the commit is refused if the path holds a file.
fn absent() -> WriteOptions {
    WriteOptions {
        expect: frame::Expect::Absent,
        ..WriteOptions::default()
    }
}

/// Compare and swap: the commit is refused unless the path holds version `v`.
fn swap(v: &str) -> WriteOptions {
    WriteOptions {
        expect: frame::Expect::Version(v.to_string()),
        ..WriteOptions::default()
    }
}

/// Writes `data` as the whole file `path` with `opts` and closes it.
async fn write_whole(
    c: &Arc<Client>,
    path: &str,
    opts: WriteOptions,
    data: &[u8],
) -> Result<(), Error> {
    let mut w = c.create(path, opts).await?;
    w.write_at(0, data).await?;
    w.close().await.map(|_| ())
}

/// Conditional commits: of two writers creating one path only if absent, exactly one
/// succeeds (the check and the commit are one step at the path's metadata owner); a
/// compare-and-swap takes only the version there now, a file the records know or one only the
/// store holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_commits_take_a_path_only_as_they_expect() {
    let (c, store) = cluster(3, &["--write-replicas", "2"], "");
    let a = c.client(ClientOptions::default()).await;
    let b = c.client(ClientOptions::default()).await;
    let mut wa = a.create("/ck/lock", absent()).await.unwrap();
    let mut wb = b.create("/ck/lock", absent()).await.unwrap();
    wa.write_at(0, b"a").await.unwrap();
    wb.write_at(0, b"b").await.unwrap();
    let (ra, rb) = tokio::join!(wa.close(), wb.close());
    let won = match (&ra, &rb) {
        (Ok(_), Err(Error::Precondition(_))) => b"a",
        (Err(Error::Precondition(_)), Ok(_)) => b"b",
        other => panic!("exactly one create-only commit wins: {other:?}"),
    };
    assert_eq!(read_all(&a, "/ck/lock").await, won);

    // Compare and swap on a file the records know.
    let now = a.stat("/ck/lock").await.unwrap().version;
    let mut w = b.create("/ck/lock", swap("wb1-0")).await.unwrap();
    w.write_at(0, b"x").await.unwrap();
    assert!(matches!(w.close().await, Err(Error::Precondition(_))));
    let mut w = b.create("/ck/lock", swap(&now)).await.unwrap();
    w.write_at(0, b"c").await.unwrap();
    w.close().await.unwrap();
    assert_eq!(read_all(&a, "/ck/lock").await, b"c");

    // A file only the store holds: create-only refused, a swap of its version taken.
    std::fs::write(store.join("old.bin"), b"stored").unwrap();
    let mut w = a.create("/ck/old.bin", absent()).await.unwrap();
    w.write_at(0, b"y").await.unwrap();
    assert!(matches!(w.close().await, Err(Error::Precondition(_))));
    let v = a.stat("/ck/old.bin").await.unwrap().version;
    let mut w = a.create("/ck/old.bin", swap(&v)).await.unwrap();
    w.write_at(0, b"new").await.unwrap();
    w.close().await.unwrap();
    assert_eq!(read_all(&b, "/ck/old.bin").await, b"new");
    synced(&a, "/ck", Duration::from_secs(30)).await;
    assert_eq!(std::fs::read(store.join("old.bin")).unwrap(), b"new");
}

/// A change names its paths in the one spelling the cluster keeps. Stores spell `/ck//f` and
/// `/ck/f/` as `ck/f`: a change taken under either would be a second record of that object, so
/// a client that skips the library's checks (a raw `Change`) is refused with the reason, and
/// the file, its record and its object stay as they were; the library refuses the same paths
/// (and names over 255 bytes) before asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_names_its_paths_in_one_spelling_only() {
    let (c, store) = cluster(1, &["--write-replicas", "1"], "");
    let a = c.client(ClientOptions::default()).await;
    write_whole(&a, "/ck/f", WriteOptions::default(), b"kept")
        .await
        .unwrap();
    synced(&a, "/ck", Duration::from_secs(30)).await;
    let version = a.stat("/ck/f").await.unwrap().version;
    let addr = a.membership().nodes().next().unwrap().shard_addr(0);
    let long = format!("/ck/{}", "n".repeat(256));
    let commit = |path: &str| frame::ChangeOp::Commit {
        path: path.into(),
        version_tag: pagestore_protocol::writeback::fresh_tag(),
        size: 0,
        mtime_ns: 0,
        last: true,
        expect: frame::Expect::Any,
        attrs: Vec::new(),
        since: 0,
    };
    let delete = |path: &str| frame::ChangeOp::Delete {
        path: path.into(),
        dir: false,
        expect: frame::Expect::Any,
    };
    let ops = [
        (commit("/ck//f"), "empty segment"),
        (commit("/ck/f/"), "empty segment"),
        (commit("/ck/./f"), "a . segment"),
        (commit(&long), "256 bytes, more than 255"),
        (commit("/ck/a\nb"), "control character U+000A"),
        (commit("/elsewhere/f"), "no mount of this node holds it"),
        (delete("/ck/f/"), "empty segment"),
        (delete("/ck//f"), "empty segment"),
        (
            frame::ChangeOp::MakeDir {
                path: "/ck/d/".into(),
                mtime_ns: 0,
            },
            "empty segment",
        ),
        (
            frame::ChangeOp::Rename {
                from: "/ck/f".into(),
                to: "/ck//g".into(),
                replace: true,
            },
            "empty segment",
        ),
    ];
    for (op, why) in ops {
        let shown = format!("{op:?}");
        let r = a
            .call(addr, frame::RequestBody::Change { op }, bytes::Bytes::new())
            .await;
        match r {
            Err(Error::BadPath(m)) => assert!(m.contains(why), "{shown}: {m}"),
            other => panic!("{shown}: {other:?}"),
        }
    }
    for bad in ["/ck//g", "/ck/g/", long.as_str()] {
        let r = a.create(bad, WriteOptions::default()).await.err();
        assert!(matches!(r, Some(Error::BadPath(_))), "create {bad}: {r:?}");
        let r = a.put(bad, bytes::Bytes::from_static(b"x")).await;
        assert!(matches!(r, Err(Error::BadPath(_))), "put {bad}: {r:?}");
    }
    let r = a.delete("/ck/f/").await;
    assert!(matches!(r, Err(Error::BadPath(_))), "delete: {r:?}");

    assert_eq!(a.stat("/ck/f").await.unwrap().version, version);
    assert_eq!(read_all(&a, "/ck/f").await, b"kept");
    assert_eq!(names(&a, "/ck").await, ["f"]);
    synced(&a, "/ck", Duration::from_secs(30)).await;
    assert_eq!(std::fs::read(store.join("f")).unwrap(), b"kept");
    let mut in_store: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    in_store.sort();
    assert_eq!(in_store, ["f"]);
}

/// The metadata owner of a path is killed: the next member takes the path's changes with every
/// acknowledged record, so conditional changes still take the path only as they expect. A
/// create-only commit of the committed file is refused, a swap of a wrong version refused and
/// of the version there taken (then the old version's swap refused); a delete conditional on
/// a replaced version refused, on the version there taken; a create-only of a deleted path
/// taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_changes_hold_when_the_paths_metadata_owner_is_killed() {
    use pagestore_protocol::frame::Expect;
    let (mut c, _store) = cluster(3, &["--write-replicas", "2"], "");
    let a = c.client(ClientOptions::default()).await;
    let mut w = a.create("/ck/m/lock", absent()).await.unwrap();
    w.write_at(0, b"one").await.unwrap();
    w.close().await.unwrap();
    let one = a.stat("/ck/m/lock").await.unwrap().version;
    a.write_file("/ck/m/gone", b"gone".to_vec().into())
        .await
        .unwrap();
    a.remove_file("/ck/m/gone").await.unwrap();
    let victim = owner_of(&c, &a, "/ck/m/lock");
    c.inner.kill(victim);

    let b = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(2),
            ..ClientOptions::default()
        })
        .await;
    let write = |opts, data| write_whole(&b, "/ck/m/lock", opts, data);
    let r = write(absent(), b"two").await;
    assert!(
        matches!(r, Err(Error::Precondition(_))),
        "create-only: {r:?}"
    );
    let r = write(swap("wb1-0"), b"two").await;
    assert!(
        matches!(r, Err(Error::Precondition(_))),
        "wrong swap: {r:?}"
    );
    write(swap(&one), b"three").await.unwrap();
    assert_eq!(read_all(&b, "/ck/m/lock").await, b"three");
    let r = write(swap(&one), b"four").await;
    assert!(
        matches!(r, Err(Error::Precondition(_))),
        "stale swap: {r:?}"
    );
    let three = b.stat("/ck/m/lock").await.unwrap().version;
    let r = b.remove_file_if("/ck/m/lock", Expect::Version(one)).await;
    assert!(
        matches!(r, Err(Error::Precondition(_))),
        "stale delete: {r:?}"
    );
    b.remove_file_if("/ck/m/lock", Expect::Version(three))
        .await
        .unwrap();
    assert!(matches!(
        b.stat("/ck/m/lock").await,
        Err(Error::NotFound(_))
    ));
    let mut w = b.create("/ck/m/gone", absent()).await.unwrap();
    w.write_at(0, b"back").await.unwrap();
    w.close().await.unwrap();
    assert_eq!(read_all(&b, "/ck/m/gone").await, b"back");
}

/// A member that missed a file's record judges the next conditional changes of the path: it
/// was down when the file was committed (the owner and the third node acknowledged it), and
/// came back while the owner was dead and the third node frozen, so its pull at start found
/// nobody to pull from. Asked once the third node is back, it takes the path's record from it
/// first (`RecordsOf`), so a create-only commit is refused and a swap of the version there is
/// taken. Judged on its own records, it took the create-only commit or refused the swap (the
/// store holds no such file, or the flushed object under the store's version). A directory of a
/// transient mount written meanwhile is not empty to it either (a peer's answer carries the
/// first file beneath it; on its own it answered "no such file or directory"), and with the
/// third node frozen again a conditional change is refused as unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_missed_a_files_record_judges_its_conditional_changes_with_it() {
    use pagestore_protocol::frame::Expect;
    // `/ck` as usual, and `/scratch` a transient mount: its files never reach the store, so
    // only the records say what is beneath a directory there.
    let (dir, mut s) = common::settings();
    let (store, scratch) = (dir.path().join("store"), dir.path().join("scratch"));
    std::fs::create_dir_all(&store).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    s.nodes = 3;
    s.mounts = vec![
        format!("/ck=file://{}?write=back", store.display()),
        format!("/scratch=file://{}?write=transient", scratch.display()),
    ];
    s.extra = vec!["--write-replicas".into(), "2".into()];
    let mut c = Cluster::start(dir, s);
    let patient = ClientOptions {
        call_timeout: Duration::from_secs(15),
        ..ClientOptions::default()
    };
    let a = c.client(patient.clone()).await;
    let path = "/ck/lag/lock";
    let order: Vec<usize> = a
        .membership()
        .ring()
        .replicas_of_hash(path_hash(path), 3)
        .iter()
        .map(|m| node_index(&c, m.node))
        .collect();
    let (owner, lagging, third) = (order[0], order[1], order[2]);
    c.inner.kill(lagging);
    let mut w = a.create(path, absent()).await.unwrap();
    w.write_at(0, b"one").await.unwrap();
    w.close().await.unwrap();
    a.write_file("/scratch/lagdir/f", b"in a directory".to_vec().into())
        .await
        .unwrap();
    let one = a.stat(path).await.unwrap().version;
    c.inner.kill(owner);
    c.signal(third, libc::SIGSTOP).unwrap();
    c.start_node(lagging);
    // Its pull at start asks the peers for 15 s (a last ask may still wait out its call
    // timeout), then gives up, having taken nothing; the next pull comes 30 s after the start.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while writeback_metric(&c, lagging, "pulls_total") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pull at start never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.signal(third, libc::SIGCONT).unwrap();
    assert_eq!(writeback_metric(&c, lagging, "records_pulled_total"), 0.0);
    assert_eq!(
        writeback_metric(&c, lagging, "records_caught_up_total"),
        0.0
    );

    // The owner does not answer: the member that missed the record, next in ring order, judges.
    let b = c.client(patient).await;
    let write = |opts, data| write_whole(&b, path, opts, data);
    let r = write(absent(), b"two").await;
    assert!(
        matches!(r, Err(Error::Precondition(_))),
        "create-only: {r:?}"
    );
    assert!(
        writeback_metric(&c, lagging, "records_caught_up_total") >= 1.0,
        "the lagging member did not judge the change (records pulled since: {})",
        writeback_metric(&c, lagging, "records_pulled_total")
    );
    write(swap(&one), b"three").await.unwrap();
    assert_eq!(read_all(&b, path).await, b"three");
    let r = write(swap(&one), b"four").await;
    assert!(
        matches!(r, Err(Error::Precondition(_))),
        "stale swap: {r:?}"
    );

    // Asked directly: a directory it knows nothing of is not empty, a peer's answer carries a
    // file beneath it.
    let addr = b
        .membership()
        .nodes()
        .find(|n| format_uuid(n.id) == c.nodes[lagging].id)
        .unwrap()
        .shard_addr(0);
    let rmdir = frame::RequestBody::Change {
        op: frame::ChangeOp::Delete {
            path: "/scratch/lagdir".into(),
            dir: true,
            expect: Expect::Any,
        },
    };
    let r = b.call(addr, rmdir, bytes::Bytes::new()).await;
    assert!(matches!(r, Err(Error::NotEmpty(_))), "rmdir: {r:?}");
    assert_eq!(read_all(&b, "/scratch/lagdir/f").await, b"in a directory");

    // With the third node frozen too, a conditional change cannot be judged: the member asked
    // refuses it as unavailable (the client would try again), not judge it on its own records.
    // Asked by a client that waits for the member's answer however long it is silent (one
    // that gave the member up first would see the change applied once the third is let go).
    let three = b.stat(path).await.unwrap().version;
    let delete = frame::RequestBody::Change {
        op: frame::ChangeOp::Delete {
            path: path.into(),
            dir: false,
            expect: Expect::Version(three),
        },
    };
    let waits = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(15),
            min_silence: Duration::from_secs(15),
            ..ClientOptions::default()
        })
        .await;
    c.signal(third, libc::SIGSTOP).unwrap();
    let r = waits.call(addr, delete.clone(), bytes::Bytes::new()).await;
    c.signal(third, libc::SIGCONT).unwrap();
    assert!(
        matches!(&r, Err(Error::Unavailable { message, .. }) if message.contains("other node(s) answered")),
        "judged alone: {r:?}"
    );
    // Asked again at once, while its client of its peers still backs the third node off (for
    // a second since that failure, the shortest back-off): the third is asked anyway, since
    // no other peer answers, and the change is judged with its records and taken.
    let r = waits.call(addr, delete, bytes::Bytes::new()).await;
    assert!(
        matches!(r, Ok((frame::ResponseBody::Applied { .. }, _))),
        "asked again: {r:?}"
    );
    assert!(matches!(b.stat(path).await, Err(Error::NotFound(_))));
}

/// A node restarted after a file it owns was rewritten without it answers no stat of the
/// mount, nor a summary of what waits for the store, from its own records until it has taken
/// its peers' (its pull at start): they would give the version from before it went down. Asked while both its peers are frozen (the pull
/// cannot end), it refuses as unavailable, which sends a client to the path's next member;
/// once a peer is back it answers the new version. The store is slowed so that nothing is
/// flushed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_answers_no_stat_from_its_records_before_it_has_taken_its_peers() {
    let (mut c, _store) = cluster(3, &["--write-replicas", "2"], "&emulate_latency_ms=2000");
    let a = c.client(ClientOptions::default()).await;
    let path = (0..)
        .map(|i| format!("/ck/restart/f{i}"))
        .find(|p| owner_of(&c, &a, p) == 0)
        .unwrap();
    let owner = path_members(&a, &path, 1)[0];
    a.write_file(&path, b"before".to_vec().into())
        .await
        .unwrap();
    c.inner.kill(0);
    let new = b"written while node 0 was down".to_vec();
    a.write_file(&path, new.clone().into()).await.unwrap();
    for i in [1, 2] {
        c.signal(i, libc::SIGSTOP).unwrap();
    }
    c.start_node(0);
    // A client of its own (the first one has node 0 backed off).
    let direct = client_through(&c, 0).await;
    let stat = frame::RequestBody::StatPath { path: path.clone() };
    let r = direct.call(owner, stat.clone(), bytes::Bytes::new()).await;
    let state = frame::RequestBody::WriteBackState {
        prefix: "/ck".into(),
    };
    let summary = direct.call(owner, state, bytes::Bytes::new()).await;
    for i in [1, 2] {
        c.signal(i, libc::SIGCONT).unwrap();
    }
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    // Nor what waits for the store (`pagectl sync` would take its word for it).
    assert!(
        matches!(summary, Err(Error::Unavailable { .. })),
        "{summary:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match direct.call(owner, stat.clone(), bytes::Bytes::new()).await {
            Ok((frame::ResponseBody::PathInfo { kind }, _)) => {
                assert!(
                    matches!(kind, PathKind::File { size, .. } if size == new.len() as u64),
                    "{kind:?}"
                );
                break;
            }
            other => assert!(Instant::now() < deadline, "{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let b = c.client(ClientOptions::default()).await;
    assert_eq!(read_all(&b, &path).await, new);
}

/// Node `i`'s `pagestore_writeback_<name>`.
fn writeback_metric(c: &Cluster, i: usize, name: &str) -> f64 {
    let text = metrics_text(c, i);
    let family = format!("pagestore_writeback_{name}{{");
    text.lines()
        .find_map(|l| l.strip_prefix(family.as_str()))
        .and_then(|rest| rest.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no {family} in {text}"))
}

/// Waits (30 s at most) until the nodes have retired `want` pages of replaced or deleted
/// versions between them (`pagestore_writeback_pages_retired_total`).
async fn pages_retired(c: &Cluster, want: usize) {
    let retired = || -> f64 {
        (0..c.nodes.len())
            .map(|i| writeback_metric(c, i, "pages_retired_total"))
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while retired() < want as f64 {
        assert!(
            Instant::now() < deadline,
            "{} pages retired, not {want}",
            retired()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Node `i`'s `/metrics`.
fn metrics_text(c: &Cluster, i: usize) -> String {
    let admin = c.nodes[i].admin.as_deref().unwrap();
    pagestore_testkit::local_cluster::http_get(admin, "/metrics")
        .unwrap()
        .1
}

/// Node `i`'s metric `name`, summed over its series (shards).
fn node_metric(c: &Cluster, i: usize, name: &str) -> f64 {
    let text = metrics_text(c, i);
    let family = format!("{name}{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(family.as_str()))
        .filter_map(|rest| rest.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// This node's `pagestore_writeback_clock_lead_seconds`.
fn clock_lead(c: &Cluster, i: usize) -> f64 {
    writeback_metric(c, i, "clock_lead_seconds")
}

/// Nodes whose wall clocks disagree by minutes (libfaketime: node 0 three minutes fast, node 1
/// two minutes slow, node 2 right): every node's change stamps follow the fastest clock it has
/// seen. Node 0, the metadata owner of a file, is asked to delete it while both others are
/// down, and dies; the file is written again once the others are back (and acknowledged), and
/// that is what everyone reads, and what the store holds, once node 0 is back. The delete is
/// refused before node 0 stamps or keeps it (no other node answers: no write set can take it);
/// were it kept, stamped three minutes ahead of the slow node's clock, it would win over the
/// new write unless the slow node's stamps followed the fast clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_delete_by_a_fast_clocked_owner_that_died_loses_to_a_later_write() {
    use pagestore_testkit::local_cluster::faketime;
    let (dir, mut s) = common::settings();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    s.nodes = 3;
    s.mounts = vec![format!("/ck=file://{}?write=back", store.display())];
    s.extra = vec!["--write-replicas".into(), "2".into()];
    s.start = Some(0);
    let mut c = Cluster::start(dir, s);
    c.nodes[0].env = faketime("+3m").unwrap();
    c.nodes[1].env = faketime("-2m").unwrap();
    for i in 0..3 {
        c.start_node(i);
    }
    let a = c.client(ClientOptions::default()).await;
    let path = (0..)
        .map(|i| format!("/ck/clocks/f{i}"))
        .find(|p| owner_of(&c, &a, p) == 0)
        .unwrap();
    a.write_file(&path, b"one".to_vec().into()).await.unwrap();
    // Every node took node 0's change, and its stamps now run on node 0's clock.
    let leads: Vec<f64> = (0..3).map(|i| clock_lead(&c, i)).collect();
    assert!(leads[0] < 1.0, "{leads:?}");
    assert!((leads[1] - 300.0).abs() < 20.0, "{leads:?}");
    assert!((leads[2] - 180.0).abs() < 20.0, "{leads:?}");

    // The owner is asked for a delete alone: the others are down, so it is refused.
    c.inner.kill(1);
    c.inner.kill(2);
    let r = tokio::time::timeout(Duration::from_secs(10), a.remove_file(&path)).await;
    assert!(
        !matches!(r, Ok(Ok(()))),
        "a delete no other node took: {r:?}"
    );
    c.inner.kill(0);
    c.start_node(1);
    c.start_node(2);

    // The path's next owner takes it over; a write there is acknowledged.
    let b = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(2),
            ..ClientOptions::default()
        })
        .await;
    b.write_file(&path, b"two, acknowledged".to_vec().into())
        .await
        .unwrap();
    assert_eq!(read_all(&b, &path).await, b"two, acknowledged");

    // Node 0 comes back (as fast as it was), owner of the path again, with its delete.
    c.start_node(0);
    let direct = client_through(&c, 0).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let kind = loop {
        match direct.stat_path(&path).await {
            Ok(k) => break k,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "{path} on the returned owner: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(matches!(kind, PathKind::File { size: 17, .. }), "{kind:?}");
    let reader = c.client(ClientOptions::default()).await;
    assert_eq!(read_all(&reader, &path).await, b"two, acknowledged");
    synced(&reader, "/ck", Duration::from_secs(60)).await;
    let rel = path.trim_start_matches("/ck/");
    assert_eq!(
        std::fs::read(store.join(rel)).unwrap(),
        b"two, acknowledged"
    );
    assert_eq!(read_all(&reader, &path).await, b"two, acknowledged");
}

/// A node with a memory tier: a page of a file being written that readers read again and
/// again is served from disk, never from a copy in memory that a rewrite would leave behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_page_is_never_served_from_the_memory_tier() {
    let (c, _store) = cluster(1, &["--memory-cache", "64M"], "");
    let writer = c.client(ClientOptions::default()).await;
    let reader = c.client(ClientOptions::default()).await;
    let path = "/ck/mem/log.bin";
    let mut model = bytes(31, 200_000);
    let mut w = writer.create(path, WriteOptions::default()).await.unwrap();
    w.write_at(0, &model).await.unwrap();
    w.flush().await.unwrap();
    for round in 0..4u64 {
        // Read often enough for the tier to want the page.
        for _ in 0..3 {
            assert_eq!(read_all(&reader, path).await, model, "round {round}");
        }
        let patch = bytes(40 + round, 5000);
        let at = (round * 20_000) as usize;
        model[at..at + patch.len()].copy_from_slice(&patch);
        w.write_at(at as u64, &patch).await.unwrap();
        w.flush().await.unwrap();
        assert_eq!(
            read_all(&reader, path).await,
            model,
            "after rewrite {round}"
        );
    }
    w.close().await.unwrap();
    assert_eq!(read_all(&reader, path).await, model);
}

/// A version replaced while its pages sit in the memory tier leaves the tier (RAM is for
/// what is read now), and a reader that opened it reads on from disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_version_leaves_the_memory_tier_and_is_read_on_from_disk() {
    let (c, _store) = cluster(1, &["--memory-cache", "64M"], "");
    let writer = c.client(ClientOptions::default()).await;
    let reader = c.client(ClientOptions::default()).await;
    let path = "/ck/mem/latest.pt";
    let first = bytes(33, 3 * MIB + 100);
    writer.write_file(path, first.clone().into()).await.unwrap();
    synced(&writer, "/ck", Duration::from_secs(60)).await;
    let opened = reader.stat(path).await.unwrap();
    let in_memory = || node_metric(&c, 0, "pagestore_memory_bytes");
    let deadline = Instant::now() + Duration::from_secs(30);
    while in_memory() == 0.0 {
        assert!(Instant::now() < deadline, "the tier never took the pages");
        let got = reader.read_at(&opened, 0, opened.size).await.unwrap();
        assert!(got[..] == first[..]);
    }
    writer
        .write_file(path, bytes(34, MIB).into())
        .await
        .unwrap();
    pages_retired(&c, first.len().div_ceil(MIB)).await;
    assert_eq!(
        in_memory(),
        0.0,
        "the replaced version stayed in the memory tier"
    );
    let got = reader.read_at(&opened, 0, opened.size).await.unwrap();
    assert!(got[..] == first[..], "the replaced version read on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_loses_nothing_acknowledged_and_another_node_flushes_it() {
    // A slow store (20 ms per request, 25 MB/s per request): flushes take seconds.
    let (mut c, store) = cluster(
        3,
        &["--write-replicas", "2"],
        "&emulate_latency_ms=20&emulate_mbps=25",
    );
    let writer = c.client(ClientOptions::default()).await;
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| {
            (
                format!("/ck/job/part-{i}"),
                bytes(40 + i, 24 * MIB + i as usize),
            )
        })
        .collect();
    for (p, b) in &files {
        writer.write_file(p, b.clone().into()).await.unwrap();
    }
    // Every write is acknowledged; kill the node that flushes the first file, mid-flush.
    let victim = owner_of(&c, &writer, &files[0].0);
    c.inner.kill(victim);
    let killed_at = Instant::now();

    // Readers keep getting every acknowledged byte (pages from the surviving replicas). The
    // killed node's port refuses at once; a survivor busy with the flush, beside the other
    // tests' clusters on two cores, may be silent for seconds (given up after 2 s, the read
    // failed once in a run of the whole file: "no write member of page 11 ... answered").
    let reader = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(15),
            min_silence: Duration::from_secs(2),
            ..ClientOptions::default()
        })
        .await;
    for (p, b) in &files {
        assert_eq!(&read_all(&reader, p).await, b, "{p} after the kill");
    }
    // The survivors flush it all, the killed node's share too.
    synced(&reader, "/ck", Duration::from_secs(120)).await;
    for (p, b) in &files {
        let rel = p.trim_start_matches("/ck/");
        assert_eq!(
            &std::fs::read(store.join(rel)).unwrap(),
            b,
            "{p} in the store"
        );
    }
    eprintln!(
        "everything flushed {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );

    // The killed node comes back, catches up with the records, and serves what it holds.
    c.start_node(victim);
    let again = c.client(ClientOptions::default()).await;
    for (p, b) in &files {
        assert_eq!(&read_all(&again, p).await, b, "{p} after the restart");
    }
    let one = client_through(&c, victim).await;
    let start = Instant::now();
    loop {
        let kind = one.stat_path(&files[0].0).await.unwrap();
        if state_of(&kind) == FileState::Clean {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{kind:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It learnt of the flushes by pulling the records from its peers.
    assert!(writeback_metric(&c, victim, "pulls_total") >= 1.0);
    assert!(writeback_metric(&c, victim, "records_pulled_total") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_killed_before_its_flush_keeps_what_it_acknowledged() {
    let (mut c, store) = cluster(1, &[], "&emulate_latency_ms=20&emulate_mbps=10");
    let writer = c.client(ClientOptions::default()).await;
    assert_eq!(writer.write_replicas(), 1);
    let files: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| {
            (
                format!("/ck/r1/f{i}"),
                bytes(60 + i, 12 * MIB + 7 * i as usize),
            )
        })
        .collect();
    // Each file with its attributes (a Content-Type and user metadata), which the cluster
    // keeps with it through the restart and the flush writes with the object.
    let attrs_of = |i: usize| {
        vec![
            Attr {
                name: "content-type".into(),
                value: "application/x-ckpt".into(),
            },
            Attr {
                name: "x-amz-meta-shard".into(),
                value: i.to_string(),
            },
        ]
    };
    let mut versions = Vec::new();
    for (i, (p, b)) in files.iter().enumerate() {
        let options = WriteOptions {
            attrs: attrs_of(i),
            ..WriteOptions::default()
        };
        let mut w = writer.create(p, options).await.unwrap();
        w.write_at(0, b).await.unwrap();
        versions.push(w.close().await.unwrap().version);
    }
    // Attributes past their limits are refused before anything is written.
    let too_many = WriteOptions {
        attrs: (0..=frame::MAX_ATTRS)
            .map(|i| Attr {
                name: format!("x-amz-meta-k{i}"),
                value: "v".into(),
            })
            .collect(),
        ..WriteOptions::default()
    };
    let e = writer.create("/ck/r1/bad", too_many).await.err().unwrap();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    // At 10 MB/s the first flush is still running: nothing of it is in the store yet.
    c.inner.kill(0);
    assert!(!store.join("r1/f2").exists());
    c.start_node(0);
    let reader = c.client(ClientOptions::default()).await;
    for (i, (p, b)) in files.iter().enumerate() {
        assert_eq!(&read_all(&reader, p).await, b, "{p} after the restart");
        let kept = reader.attributes(p, &versions[i]).await.unwrap();
        assert_eq!(kept, attrs_of(i), "{p}'s attributes after the restart");
    }
    assert!(matches!(
        reader
            .attributes(&files[0].0, "wb1-00000000000000000000000000000001")
            .await,
        Err(Error::NotFound(_))
    ));
    synced(&reader, "/ck", Duration::from_secs(60)).await;
    let local = pagestore_client::localfs::LocalStore::new(&store).unwrap();
    for (i, (p, b)) in files.iter().enumerate() {
        let rel = p.trim_start_matches("/ck/");
        assert_eq!(
            &std::fs::read(store.join(rel)).unwrap(),
            b,
            "{p} in the store"
        );
        let kept = local
            .object_attributes(&object_store::path::Path::from(rel))
            .await
            .unwrap();
        assert_eq!(
            pagestore_client::ufs::wire_attrs(&kept),
            attrs_of(i),
            "{p}'s attributes in the store"
        );
    }
}

/// A tmpfs of `bytes` mounted at `at` (as root), unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(at: &std::path::Path, bytes: u64) -> SmallDisk {
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs at {}", at.display());
        SmallDisk(at.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The disk under a node's write-back journal fills up: a change that the journal cannot take
/// is refused as "no space" with the reason (ENOSPC through pagefs), not as a failed node after
/// 30 s of retries, and nothing of it is kept; once there is room the same change is taken.
/// The journal is put on a small tmpfs (the cache files stay where O_DIRECT works) and every
/// free page of it taken by a filler file, so an append fails once it needs a page of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_journal_refuses_changes_as_no_space() {
    let (mut c, _store) = cluster(1, &["--write-replicas", "1"], "");
    let a = c.client(ClientOptions::default()).await;
    write_whole(&a, "/ck/before", WriteOptions::default(), b"kept")
        .await
        .unwrap();
    c.inner.kill(0);
    let wb = c.nodes[0].cache_dir.join("writeback");
    let journal = std::fs::read(wb.join("records.log")).unwrap();
    let _small = SmallDisk::mount(&wb, 256 << 10);
    std::fs::write(wb.join("records.log"), &journal).unwrap();
    let filler = wb.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = [0u8; 4096];
        while f.write_all(&block).is_ok() {}
    }
    c.start_node(0);
    let started = Instant::now();
    let mut refused = None;
    for i in 0..200 {
        let path = format!("/ck/f{i}");
        match write_whole(&a, &path, WriteOptions::default(), b"x").await {
            Ok(_) => {}
            Err(Error::NoSpace(m)) => {
                refused = Some((path, m));
                break;
            }
            Err(e) => panic!("{path}: {e}"),
        }
    }
    let (path, m) = refused.expect("the journal's disk filled up");
    assert!(
        m.contains("No space left on device") && m.contains("cache directory is full"),
        "{m}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused at once, not retried: {:?}",
        started.elapsed()
    );
    let gone = a.stat(&path).await;
    assert!(matches!(gone, Err(Error::NotFound(_))), "{path}: {gone:?}");

    std::fs::remove_file(&filler).unwrap();
    write_whole(&a, &path, WriteOptions::default(), b"now")
        .await
        .unwrap();
    assert_eq!(read_all(&a, &path).await, b"now");
    assert_eq!(read_all(&a, "/ck/before").await, b"kept");
    c.inner.kill(0);
}

const KEY: &str = "wbkey";
const SECRET: &str = "wbsecret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_for_30_s_keeps_the_dirty_data_writers_wait_then_everything_flushes() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("bucket")).unwrap();
    let s3 = S3Server::start(root.path(), KEY, SECRET).unwrap();
    let port = s3.addr().port();
    let (dir, mut s) = common::settings();
    s.nodes = 1;
    s.mounts = vec![format!(
        "/ck=s3://bucket/ckpt?endpoint={}&access_key_id={KEY}&secret_access_key={SECRET}&write=back",
        s3.endpoint()
    )];
    // A small write-back buffer: 48 MiB of dirty pages.
    s.extra = vec!["--dirty-limit".into(), "48M".into()];
    let c = Cluster::start(dir, s);
    // Not a test of telling a silent shard: with a dozen clusters on two loaded vCPUs a shard
    // may miss the default 200 ms for a ping, and the discard below would be given up.
    let writer = c
        .client(ClientOptions {
            min_silence: Duration::from_secs(2),
            ..ClientOptions::default()
        })
        .await;

    drop(s3);
    let down = Instant::now();
    // Writes are acknowledged at cluster speed while the store is down.
    let files: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("/ck/out/f{i}"), bytes(80 + i, 10 * MIB)))
        .collect();
    for (p, b) in &files {
        writer.write_file(p, b.clone().into()).await.unwrap();
    }
    // The flusher fails and says why; the data stays.
    let start = Instant::now();
    let state = loop {
        let s = writer.write_back_state("/ck").await.unwrap();
        if s.flush_errors > 0 && !s.last_error.is_empty() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(state.files_dirty, 3);
    for (p, b) in &files {
        assert_eq!(
            &read_all(&writer, p).await,
            b,
            "{p} while the store is down"
        );
    }
    // Beyond the dirty limit a writer waits, and is told there is no space when waiting does
    // not make room; what was acknowledged before stays.
    let small_wait = WriteOptions {
        write_wait: Duration::from_secs(3),
        ..WriteOptions::default()
    };
    let mut w = writer.create("/ck/out/big", small_wait).await.unwrap();
    let big = bytes(90, 40 * MIB);
    let mut refused = None;
    for (k, piece) in big.chunks(MIB).enumerate() {
        if let Err(e) = w.write_at((k * MIB) as u64, piece).await {
            refused = Some(e);
            break;
        }
    }
    let refused = match refused {
        // Given up: its members drop its pages at once, not after their orphan grace.
        Some(e) => {
            let dropped = w.discard().await.unwrap();
            assert!(
                dropped > 0,
                "the refused writer's pages were dropped: {dropped}"
            );
            e
        }
        // A close that fails before its commit drops the writer, which gives its pages up.
        None => w.close().await.map(|_| ()).unwrap_err(),
    };
    assert!(matches!(refused, Error::NoSpace(_)), "{refused}");
    for (p, b) in &files {
        assert_eq!(&read_all(&writer, p).await, b);
    }

    // The store comes back after 30 s on its old address: everything flushes.
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(down.elapsed())).await;
    let _s3 = S3Server::start_at(root.path(), KEY, SECRET, port).unwrap();
    synced(&writer, "/ck", Duration::from_secs(60)).await;
    for (p, b) in &files {
        let rel = p.trim_start_matches("/ck/");
        let on_disk = std::fs::read(root.path().join("bucket/ckpt").join(rel)).unwrap();
        assert_eq!(&on_disk, b, "{p} in the store");
    }
    // Flushed pages are clean, and the given-up file left none behind.
    dirty_settles_at(&c, 0).await;
    // With room again, a write of the same size goes through.
    writer
        .write_file("/ck/out/after", bytes(91, 20 * MIB).into())
        .await
        .unwrap();
    synced(&writer, "/ck", Duration::from_secs(60)).await;
}

/// A file's time set while the file is being flushed (a `touch` during the upload) is kept, and
/// costs no second upload: the flusher writes `Clean` over the record as it is when the upload
/// ends, not as it was when the upload began. The store's requests are held at a gate while
/// the time is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_set_during_the_flush_is_kept_without_a_second_upload() {
    use pagestore_testkit::gate::GateProxy;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("bucket")).unwrap();
    let s3 = S3Server::start(root.path(), KEY, SECRET).unwrap();
    let gate = GateProxy::start(s3.addr()).unwrap();
    let (dir, mut s) = common::settings();
    s.nodes = 1;
    s.mounts = vec![format!(
        "/ck=s3://bucket/ckpt?endpoint={}&access_key_id={KEY}&secret_access_key={SECRET}&write=back",
        gate.endpoint()
    )];
    let c = Cluster::start(dir, s);
    let w = c.client(ClientOptions::default()).await;
    let data = bytes(31, 3 * MIB);
    // Committed open first (a first commit asks the store what the path holds), then closed
    // with the gate shut.
    let mut f = w.create("/ck/t", WriteOptions::default()).await.unwrap();
    f.write_at(0, &data).await.unwrap();
    f.flush().await.unwrap();
    let before = gate.sent_bytes();
    gate.shut();
    f.close().await.unwrap();
    // The flush has begun: its first request to the store waits at the gate.
    let start = Instant::now();
    while gate.held_bytes() == 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "no flush began");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let when = 1_400_000_000_500_000_000;
    assert!(w.touch("/ck/t", when).await.unwrap());
    gate.open();
    synced(&w, "/ck", Duration::from_secs(60)).await;
    let info = w.stat("/ck/t").await.unwrap();
    assert_eq!((info.mtime_ns, info.state), (when, FileState::Clean));
    // One upload: the store was sent the file's bytes once (and some requests' headers).
    let sent = gate.sent_bytes() - before;
    assert!(
        sent >= data.len() as u64 && sent < data.len() as u64 + (256 << 10),
        "{sent} bytes sent to the store for a file of {}",
        data.len()
    );
    assert_eq!(
        std::fs::read(root.path().join("bucket/ckpt/t")).unwrap(),
        data
    );
}

/// Bytes of dirty pages over every shard of every node, from their `/metrics`.
fn dirty_bytes(c: &Cluster) -> u64 {
    common::metric_total(c, "pagestore_shard_dirty_bytes{")
}

/// Waits (up to 20 s) until the nodes hold exactly `want` bytes of dirty pages.
async fn dirty_settles_at(c: &Cluster, want: u64) {
    let start = Instant::now();
    loop {
        let n = dirty_bytes(c);
        if n == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the nodes hold {n} bytes of dirty pages, {want} expected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Until its first commit, a writer renews its pages on the members that hold them: a writer
/// idle for longer than the nodes' orphan grace keeps them and commits its file whole. A writer
/// that stops (killed, or suspended as here: its runtime is not driven) has its pages dropped
/// once the grace has passed since it was last heard, which frees the room they took under the
/// dirty limit; if it wakes up, its commit fails with a clear error instead of naming pages
/// that are gone.
#[test]
fn uncommitted_pages_live_as_long_as_their_writer_and_no_longer() {
    let grace = Duration::from_secs(4);
    let (c, store) = cluster(
        2,
        &["--write-replicas", "2", "--write-orphan-grace", "4"],
        "",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let a = rt.block_on(c.client(ClientOptions::default()));
    let ps = a.page_size() as usize;
    let data = bytes(3, 3 * ps + 10);
    // The idle writer: two pages sent (two write replicas each), no commit.
    let mut idle = rt.block_on(async {
        let mut w = a.create("/ck/idle", WriteOptions::default()).await.unwrap();
        w.write_at(0, &data[..2 * ps]).await.unwrap();
        dirty_settles_at(&c, 4 * ps as u64).await;
        w
    });
    let idle_since = Instant::now();
    // The stopped writer: three pages sent, and a first renewal answered; then nothing.
    let stopped = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_b, mut gone) = stopped.block_on(async {
        let b = c.client(ClientOptions::default()).await;
        let mut w = b.create("/ck/gone", WriteOptions::default()).await.unwrap();
        w.write_at(0, &data[..3 * ps]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        (b, w)
    });
    rt.block_on(dirty_settles_at(&c, 10 * ps as u64));
    // The stopped writer's pages go after the grace (and a reconciliation, every 5 s at
    // most); the idle writer's stay.
    rt.block_on(dirty_settles_at(&c, 4 * ps as u64));
    assert_eq!(
        common::metric_total(&c, "pagestore_writeback_orphans_dropped_total"),
        6,
        "three pages on two members"
    );
    // The idle writer, silent for longer than the grace, finishes its file.
    std::thread::sleep((2 * grace).saturating_sub(idle_since.elapsed()));
    assert!(idle_since.elapsed() >= 2 * grace);
    rt.block_on(async {
        idle.write_at(2 * ps as u64, &data[2 * ps..]).await.unwrap();
        idle.close().await.unwrap();
        assert_eq!(read_all(&a, "/ck/idle").await, data);
        synced(&a, "/ck", Duration::from_secs(60)).await;
    });
    assert_eq!(std::fs::read(store.join("idle")).unwrap(), data);
    // The stopped writer wakes up: its commit is refused, and nothing appears.
    match stopped.block_on(gone.flush()) {
        Err(Error::Changed(m)) => assert!(
            m.starts_with("/ck/gone: member ") && m.ends_with("write it again"),
            "{m}"
        ),
        other => panic!("a commit of dropped pages: {other:?}"),
    }
    assert!(rt.block_on(a.stat("/ck/gone")).is_err());
    assert!(!store.join("gone").exists());
}

/// A writer that gives its file up before committing it (an aborted upload, a failed copy)
/// leaves nothing behind: its write members drop its pages at once, not after their orphan
/// grace, so the room they took under the dirty limit is free again; a dropped writer does the
/// same. A committed version is not discarded, by the writer or by a request naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_given_up_before_its_commit_leaves_nothing_behind_at_once() {
    let (c, _store) = cluster(2, &[], "");
    let writer = c.client(ClientOptions::default()).await;
    let ps = writer.page_size() as usize;
    // Five whole pages are sent as they fill; the partial sixth stays in the writer.
    let data = bytes(7, 5 * ps + 100);
    // Two write replicas of five pages.
    let held = 2 * 5 * ps as u64;
    // A writer whose sent pages the members all hold, and no commit.
    let half_written = |path: &'static str| {
        let (writer, data, c) = (&writer, &data, &c);
        async move {
            let mut w = writer.create(path, WriteOptions::default()).await.unwrap();
            w.write_at(0, data).await.unwrap();
            dirty_settles_at(c, held).await;
            w
        }
    };

    let w = half_written("/ck/gone").await;
    assert_eq!(w.discard().await.unwrap(), 10, "pages dropped");
    assert_eq!(dirty_bytes(&c), 0, "nothing left once discard answered");
    let w = half_written("/ck/dropped").await;
    drop(w);
    dirty_settles_at(&c, 0).await;
    for p in ["/ck/gone", "/ck/dropped"] {
        assert!(
            matches!(writer.stat(p).await, Err(Error::NotFound(_))),
            "{p}"
        );
    }

    // Committed (fsync): the writer refuses to discard it, and so does every shard asked
    // directly (and to renew it); the file reads whole.
    let mut w = writer
        .create("/ck/kept", WriteOptions::default())
        .await
        .unwrap();
    w.write_at(0, &data).await.unwrap();
    w.flush().await.unwrap();
    let tag = w.version().to_string();
    assert!(matches!(w.discard().await, Err(Error::Changed(_))));
    for node in &c.nodes {
        for shard in 0..c.shards {
            let addr = std::net::SocketAddr::new(node.base.ip(), node.base.port() + shard);
            let body = frame::RequestBody::Discard {
                version_tag: tag.clone(),
            };
            let answer = writer.call(addr, body, Default::default()).await;
            assert!(matches!(answer, Err(Error::Changed(_))), "{answer:?}");
            // Nor renewed: its commits keep it alive.
            let body = frame::RequestBody::Renew {
                version_tag: tag.clone(),
            };
            let answer = writer.call(addr, body, Default::default()).await;
            assert!(matches!(answer, Err(Error::Changed(_))), "{answer:?}");
            let body = frame::RequestBody::Discard {
                version_tag: "not-a-tag".into(),
            };
            let answer = writer.call(addr, body, Default::default()).await;
            assert!(
                answer
                    .as_ref()
                    .is_err_and(|e| e.to_string().contains("write-back version tag")),
                "{answer:?}"
            );
        }
    }
    assert_eq!(read_all(&writer, "/ck/kept").await, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_cut_by_a_crash_leaves_the_file_at_exactly_one_of_its_names() {
    let (mut c, _store) = cluster(1, &[], "&emulate_latency_ms=20&emulate_mbps=1");
    let writer = c.client(ClientOptions::default()).await;
    let n = 60usize;
    for i in 0..n {
        writer
            .write_file(
                &format!("/ck/r/tmp-{i}"),
                bytes(i as u64, 50_000 + i).into(),
            )
            .await
            .unwrap();
    }
    // Rename them one after another; SIGKILL the node partway.
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let task = {
        let (writer, acked) = (writer.clone(), acked.clone());
        tokio::spawn(async move {
            for i in 0..n {
                let r = writer
                    .rename(
                        &format!("/ck/r/tmp-{i}"),
                        &format!("/ck/r/final-{i}"),
                        false,
                    )
                    .await;
                if r.is_err() {
                    break;
                }
                acked.lock().unwrap().push(i);
            }
        })
    };
    let start = Instant::now();
    while acked.lock().unwrap().len() < n / 3 {
        assert!(start.elapsed() < Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.inner.kill(0);
    let _ = task.await;
    let acked: Vec<usize> = acked.lock().unwrap().clone();
    assert!(acked.len() < n, "the kill came after every rename");
    c.start_node(0);
    let reader = c.client(ClientOptions::default()).await;
    for i in 0..n {
        let old = reader.stat(&format!("/ck/r/tmp-{i}")).await;
        let new = reader.stat(&format!("/ck/r/final-{i}")).await;
        let (at, other) = match (old, new) {
            (Ok(_), Err(Error::NotFound(_))) => ("tmp", "final"),
            (Err(Error::NotFound(_)), Ok(_)) => ("final", "tmp"),
            (a, b) => panic!("file {i}: old name {a:?}, new name {b:?}: not exactly one"),
        };
        if acked.contains(&i) {
            assert_eq!(at, "final", "file {i}: its rename was acknowledged");
        }
        let _ = other;
        assert_eq!(
            read_all(&reader, &format!("/ck/r/{at}-{i}")).await,
            bytes(i as u64, 50_000 + i),
            "file {i}"
        );
    }
}

/// A flushed file's record is forgotten `--write-records-keep` after its last write: the file is
/// then the store's object (the same bytes, under the store's version). And a node keeps at most
/// `--write-records-max` records: past it, a change that adds a path is refused with "no space"
/// (nothing half-made), while the paths it keeps still take new versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_files_records_are_forgotten_and_the_records_kept_are_bounded() {
    use pagestore_protocol::writeback::is_wb_tag;
    let (c, store) = cluster(
        2,
        &[
            "--write-replicas",
            "2",
            "--write-records-keep",
            "3",
            "--write-records-max",
            "3",
        ],
        "",
    );
    let a = c.client(ClientOptions::default()).await;
    let b = c.client(ClientOptions::default()).await;
    let write = |path: &'static str, body: Vec<u8>| {
        let a = a.clone();
        async move {
            let mut w = a.create(path, WriteOptions::default()).await?;
            w.write_at(0, &body).await?;
            w.close().await
        }
    };
    for i in 0..3 {
        let path = ["/ck/f0", "/ck/f1", "/ck/f2"][i];
        write(path, bytes(i as u64, 1000 + i)).await.unwrap();
    }
    match write("/ck/f3", b"one too many".to_vec()).await {
        Err(Error::NoSpace(m)) => assert!(m.contains("--write-records-max"), "{m}"),
        other => panic!("a fourth path past --write-records-max 3: {other:?}"),
    }
    assert!(matches!(b.stat("/ck/f3").await, Err(Error::NotFound(_))));
    // A kept path takes a new version.
    write("/ck/f0", b"f0 again".to_vec()).await.unwrap();
    assert_eq!(read_all(&b, "/ck/f0").await, b"f0 again");
    let before = b.stat("/ck/f1").await.unwrap();
    assert!(is_wb_tag(&before.version), "{before:?}");

    // Flushed, then forgotten: served as the store's object, byte-exact, by every client.
    synced(&a, "/ck", Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = b.stat("/ck/f1").await.unwrap();
        if now.version != before.version {
            assert!(!is_wb_tag(&now.version), "{now:?}");
            assert_eq!(now.size, before.size);
            break;
        }
        assert!(Instant::now() < deadline, "/ck/f1 still a write-back file");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for cl in [&a, &b] {
        assert_eq!(read_all(cl, "/ck/f0").await, b"f0 again");
        assert_eq!(read_all(cl, "/ck/f1").await, bytes(1, 1001));
        assert_eq!(read_all(cl, "/ck/f2").await, bytes(2, 1002));
    }
    assert_eq!(std::fs::read(store.join("f1")).unwrap(), bytes(1, 1001));
    let text = pagestore_testkit::local_cluster::http_get(
        c.nodes[0].admin.as_deref().unwrap(),
        "/metrics",
    )
    .unwrap()
    .1;
    let forgotten: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("pagestore_writeback_records_forgotten_total"))
        .and_then(|rest| rest.split_whitespace().last()?.parse().ok())
        .unwrap_or(0);
    assert!(forgotten >= 3, "{text}");

    // Room again for new paths.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match write("/ck/f3", b"now it fits".to_vec()).await {
            Ok(_) => break,
            Err(Error::NoSpace(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(read_all(&b, "/ck/f3").await, b"now it fits");
}

/// A writer stopped (as a suspended process is: it sends nothing, not even the commits that
/// keep its open version alive) is sealed after `--write-lease`; its file is flushed, and its
/// record forgotten after `--write-records-keep`. When the writer wakes up and writes and
/// commits again, its first page is refused (`Changed`), and so is a commit that names no new
/// page: its version does not come back over the store's object, which keeps the bytes
/// flushed, and no node takes its pages.
#[test]
fn a_writer_stopped_until_its_flushed_file_is_forgotten_cannot_bring_its_version_back() {
    use pagestore_protocol::writeback::is_wb_tag;
    let (c, store) = cluster(
        2,
        &[
            "--write-replicas",
            "2",
            "--write-lease",
            "5",
            "--write-records-keep",
            "3",
        ],
        "",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let b = rt.block_on(c.client(ClientOptions::default()));
    // The stopped writer: its runtime runs only when this test drives it.
    let stopped = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_a, mut w) = stopped.block_on(async {
        let a = c.client(ClientOptions::default()).await;
        let mut w = a.create("/ck/late", WriteOptions::default()).await.unwrap();
        w.write_at(0, b"what was flushed").await.unwrap();
        w.flush().await.unwrap();
        (a, w)
    });
    let first = rt.block_on(b.stat("/ck/late")).unwrap();
    assert!(is_wb_tag(&first.version), "{first:?}");
    // Sealed, flushed, forgotten: the path is the store's object.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = rt.block_on(b.stat("/ck/late")).unwrap();
        if !is_wb_tag(&now.version) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still a write-back file: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        std::fs::read(store.join("late")).unwrap(),
        b"what was flushed"
    );
    // The writer wakes up. A commit alone (its pages are all sent) is refused by the
    // metadata owner...
    match stopped.block_on(w.flush()) {
        Err(Error::Changed(m)) => assert!(
            m.contains("--write-records-keep") && m.contains("first committed"),
            "{m}"
        ),
        other => panic!("a late commit of a forgotten version: {other:?}"),
    }
    // ...and a page by its write members, before any commit.
    let late = stopped.block_on(async {
        w.write_at(0, b"written too late").await?;
        w.flush().await
    });
    match late {
        Err(Error::Changed(m)) => assert!(
            m.contains("--write-records-keep") && m.contains("takes no more pages"),
            "{m}"
        ),
        other => panic!("a late page of a forgotten version: {other:?}"),
    }
    let now = rt.block_on(b.stat("/ck/late")).unwrap();
    assert!(!is_wb_tag(&now.version), "{now:?}");
    assert_eq!(rt.block_on(read_all(&b, "/ck/late")), b"what was flushed");
    assert_eq!(
        std::fs::read(store.join("late")).unwrap(),
        b"what was flushed"
    );
}

/// A random writer with a spill directory: pages beyond the ones kept in memory wait in the
/// spill file, and what it reads back before its flush, what other clients read after it, and
/// what the store holds after the flush are all equal to the same writes made on a local
/// buffer, truncations and extensions included. Nothing is left in the spill directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_writer_spills_pages_to_a_local_file_and_loses_none() {
    let (c, store) = cluster(2, &["--write-replicas", "2"], "");
    let a = c.client(ClientOptions::default()).await;
    let b = c.client(ClientOptions::default()).await;
    let spill = tempfile::tempdir().unwrap();
    let ps = a.page_size() as usize;
    let options = WriteOptions {
        spill_dir: Some(spill.path().to_path_buf()),
        inflight: 2,
        ..WriteOptions::default()
    };
    let mut w = a.create("/ck/spilled", options).await.unwrap();
    let mut want = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for i in 0..400u64 {
        match i {
            // A truncation into a spilled page, then an extension past it.
            150 => {
                let size = (5 * ps + 123) as u64;
                w.set_len(size).await.unwrap();
                want.truncate(size as usize);
            }
            250 => {
                let size = (11 * ps + 7) as u64;
                w.set_len(size).await.unwrap();
                want.resize(size as usize, 0);
            }
            // A flush in the middle: the spilled pages go, and the next writes spill again.
            300 => w.flush().await.unwrap(),
            _ => {
                let at = next(12 * ps as u64) as usize;
                let len = 1 + next(9000) as usize;
                let data = bytes(i, len);
                w.write_at(at as u64, &data).await.unwrap();
                if want.len() < at + len {
                    want.resize(at + len, 0);
                }
                want[at..at + len].copy_from_slice(&data);
            }
        }
        if i % 50 == 49 {
            let got = w.read_at(0, want.len() as u64 + 10).await.unwrap();
            assert!(got[..] == want[..], "read back by the writer at step {i}");
        }
    }
    w.close().await.unwrap();
    assert!(
        read_all(&b, "/ck/spilled").await == want,
        "read by another client"
    );
    synced(&a, "/ck", Duration::from_secs(30)).await;
    assert!(
        std::fs::read(store.join("spilled")).unwrap() == want,
        "the store"
    );
    assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
}

/// A change that no ready member takes goes to the members backed off after failures too: a
/// moment when every member failed to answer (here all three stalled, as under heavy load)
/// must not refuse the changes that come after it without one try, and the change never
/// reached them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_reaches_members_backed_off_after_a_stall() {
    use pagestore_protocol::frame::Expect;
    let (c, _store) = cluster(3, &["--write-replicas", "2"], "");
    let a = c
        .client(ClientOptions {
            // Short, so that a stall backs every member off soon; long enough for an awake
            // node under load to answer the change.
            call_timeout: Duration::from_secs(3),
            // Backed off longer than this test runs.
            min_backoff: Duration::from_secs(60),
            max_backoff: Duration::from_secs(60),
            ..ClientOptions::default()
        })
        .await;
    a.write_file("/ck/stall/f", b"x".to_vec().into())
        .await
        .unwrap();
    let v = a.stat("/ck/stall/f").await.unwrap().version;
    // The members that keep the path's records (its metadata owner and the next two).
    let members = path_members(&a, "/ck/stall/f", 3);
    assert_eq!(members.len(), 3);
    // A change while every node is stalled (on a version the file does not have: harmless
    // when they take it up later): each member fails to answer within the call timeout and is
    // backed off. Should an answer slip out before a stop takes hold, stall them again.
    for attempt in 1.. {
        for i in 0..3 {
            c.inner.signal(i, libc::SIGSTOP).unwrap();
        }
        let r = a
            .remove_file_if("/ck/stall/f", Expect::Version("v0".into()))
            .await;
        for i in 0..3 {
            c.inner.signal(i, libc::SIGCONT).unwrap();
        }
        if members.iter().all(|m| !a.reachable(*m)) {
            break;
        }
        assert!(
            attempt < 5,
            "members not all backed off after {attempt} stalls: {members:?}, last {r:?}"
        );
    }
    // The nodes are awake again (a client of its own asks, so that `a`'s back-off is left as
    // it is): after a stall under load they may take seconds to work off what queued up.
    let other = c.client(ClientOptions::default()).await;
    assert_eq!(other.stat("/ck/stall/f").await.unwrap().version, v);
    assert!(members.iter().all(|m| !a.reachable(*m)));
    a.remove_file_if("/ck/stall/f", Expect::Version(v))
        .await
        .unwrap();
    // Asked by a client whose members are not backed off (`a`'s may be again if one was slow
    // to answer the change it then took).
    let after = other.stat("/ck/stall/f").await;
    assert!(matches!(after, Err(Error::NotFound(_))), "{after:?}");
}

/// A reader that opened a file reads on after the file is replaced by a rename (a checkpoint
/// saver's write-to-temp-then-rename) or deleted before its flush: the version's pages become
/// ordinary cached pages. They were dropped at once, and the reader's next page failed
/// ("unavailable: no write member of page 1 ... answered"; EIO through pagefs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_replaced_or_deleted_before_its_flush_is_read_on_by_a_reader_that_opened_it() {
    // A slow store (2 s a request): nothing here is flushed before it is replaced.
    let (c, store) = cluster(3, &["--write-replicas", "2"], "&emulate_latency_ms=2000");
    let saver = c.client(ClientOptions::default()).await;
    let reader = c.client(ClientOptions::default()).await;
    let page = saver.page_size() as usize;
    let path = "/ck/open/latest.pt";
    let first = bytes(61, 3 * page + 1000);
    let second = bytes(62, 2 * page + 7);
    saver.write_file(path, first.clone().into()).await.unwrap();
    // The reader opens it (the version is pinned) and reads its first page.
    let opened = reader.stat(path).await.unwrap();
    let head = reader.read_at(&opened, 0, page as u64).await.unwrap();
    assert!(head[..] == first[..page]);
    // Replaced by a rename.
    saver
        .write_file("/ck/open/.latest.pt.tmp", second.clone().into())
        .await
        .unwrap();
    saver
        .rename("/ck/open/.latest.pt.tmp", path, true)
        .await
        .unwrap();
    assert_eq!(read_all(&saver, path).await, second);
    assert!(
        std::fs::read(store.join("open/latest.pt")).ok() != Some(first.clone()),
        "the first version was flushed before the test could replace it"
    );
    let rest = reader
        .read_at(&opened, page as u64, opened.size)
        .await
        .unwrap();
    assert!(rest[..] == first[page..], "the replaced version read on");
    // Its pages stay readable, demoted on each of its two write members: evicted before any
    // other page (the engine's tests show the order).
    pages_retired(&c, 2 * first.len().div_ceil(page)).await;
    // Deleted: a reader of the second version reads it whole.
    let opened = reader.stat(path).await.unwrap();
    saver.remove_file(path).await.unwrap();
    assert!(matches!(reader.stat(path).await, Err(Error::NotFound(_))));
    let got = reader.read_at(&opened, 0, opened.size).await.unwrap();
    assert!(got[..] == second[..], "the deleted version read on");
    pages_retired(
        &c,
        2 * (first.len().div_ceil(page) + second.len().div_ceil(page)),
    )
    .await;
    // The store ends with neither: nothing of a replaced version is flushed.
    synced(&saver, "/ck", Duration::from_secs(60)).await;
    assert!(!store.join("open/latest.pt").exists());
    assert!(!store.join("open/.latest.pt.tmp").exists());
}

/// A checkpoint rewritten in place again and again (as a trainer saves `latest.pt` every few
/// minutes) does not push the data read before it out of the cache: each version a newer one
/// replaces is demoted, and the next version's pages take its room, not the working set's.
/// One shard of 16 pages of 64 KiB: a working set of 6 pages read once, then a checkpoint of
/// 4 pages written 5 times; under LRU, the versions flushed after the working set was read
/// would be younger than it, and from the third version on it would lose pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_rewritten_in_place_leaves_the_working_set_in_the_cache() {
    const PAGE: usize = 64 << 10;
    let working = bytes(71, 6 * PAGE);
    let (c, _store) = cluster_with(1, &[], "", |s, data| {
        std::fs::write(data.join("w"), &working).unwrap();
        s.shards = 1;
        s.page_size = "64K".into();
        s.cache_size = "2M".into();
    });
    let client = c.client(ClientOptions::default()).await;
    let store_reads = || async {
        client
            .shard_counters()
            .await
            .into_iter()
            .map(|(_, _, s)| s.expect("the shard answers").ufs_reads)
            .sum::<u64>()
    };
    assert_eq!(read_all(&client, "/data/w").await, working);
    assert_eq!(
        store_reads().await,
        6,
        "the working set read once, from the store"
    );
    let mut last = Vec::new();
    for round in 0..5u8 {
        last = bytes(72 + u64::from(round), 4 * PAGE);
        client
            .write_file("/ck/latest.pt", last.clone().into())
            .await
            .unwrap();
        synced(&client, "/ck", Duration::from_secs(60)).await;
    }
    pages_retired(&c, 4 * 4).await;
    assert_eq!(read_all(&client, "/ck/latest.pt").await, last);
    assert_eq!(read_all(&client, "/data/w").await, working);
    assert_eq!(
        store_reads().await,
        6,
        "the working set was evicted for replaced versions of the checkpoint"
    );
}

/// A write member whose copy of a flushed page is gone and whose store read finds another
/// object at the path than its record names (as when two flushes of one version raced, until
/// the records agree) answers `Changed`: the reader asks the page's other write member, which
/// holds the page itself. (A reader in `tests/etcd.rs` got `Changed` after a frozen owner's
/// thaw.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_member_that_finds_the_store_changed_is_passed_over_for_one_holding_the_page() {
    let (c, store) = cluster(3, &["--write-replicas", "2"], "");
    let a = c.client(ClientOptions::default()).await;
    let path = "/ck/twice/f.bin";
    let data = bytes(71, 100_000);
    a.write_file(path, data.clone().into()).await.unwrap();
    synced(&a, "/ck", Duration::from_secs(30)).await;
    let info = a.stat(path).await.unwrap();
    assert_eq!(info.state, FileState::Clean);
    // The store's object is replaced by the same bytes: a new file, so another version tag.
    let object = store.join("twice/f.bin");
    std::fs::remove_file(&object).unwrap();
    std::fs::write(&object, &data).unwrap();
    // The page's first member, which a read asks first, forgets its copy if it has one (an
    // admin's `RemoveFile` to that shard): its miss finds the store's new object.
    let first = a.membership().ring().replicas(info.file_id, 0, 1)[0];
    let addr = a.membership().addr_of(first).unwrap();
    let body = frame::RequestBody::RemoveFile {
        file_id: frame::FileId::from_u128(info.file_id),
        epoch: 0,
    };
    let (answer, _) = a.call(addr, body, bytes::Bytes::new()).await.unwrap();
    assert!(
        matches!(answer, frame::ResponseBody::Removed { .. }),
        "{answer:?}"
    );
    let got = a.read_at(&info, 0, info.size).await.unwrap();
    assert!(got[..] == data[..], "read from the other write member");
}

/// With one node there is no member of another node to compare its silence with: a node that
/// does not answer for a second (busy, as on a machine whose every core a gateway, its
/// readers and the node share) is waited for, up to the call timeout, and not backed off after
/// a ping of a few hundred milliseconds, which failed every request for up to 30 s after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_node_silent_for_a_second_is_waited_for_not_backed_off() {
    let (c, _store) = cluster(1, &["--write-replicas", "1"], "");
    let a = c.client(ClientOptions::default()).await;
    let data = bytes(91, 1000);
    a.write_file("/ck/lone/f", data.clone().into())
        .await
        .unwrap();
    let info = a.stat("/ck/lone/f").await.unwrap();
    // Answers enough for the member's usual answer time.
    for _ in 0..20 {
        a.read_at(&info, 0, 1000).await.unwrap();
    }
    c.inner.signal(0, libc::SIGSTOP).unwrap();
    let read = tokio::spawn({
        let (a, info) = (a.clone(), info.clone());
        async move { a.read_at(&info, 0, 1000).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.inner.signal(0, libc::SIGCONT).unwrap();
    let got = read.await.unwrap();
    assert!(
        matches!(&got, Ok(b) if b[..] == data[..]),
        "the read across the pause: {got:?}"
    );
    let addrs = path_members(&a, "/ck/lone/f", 2);
    assert!(!addrs.is_empty());
    assert!(addrs.iter().all(|m| a.reachable(*m)), "a member backed off");
}

/// A cluster of 3 (R = 2) for the tests of a node frozen while the cluster writes, once every
/// node has taken its peers' records at start (until then it answers no stat), with two
/// clients: a writer that backs a node off for longer than the test once it found it silent
/// (its changes go to the next member, and none waits in the frozen node's socket for it to
/// take on its own once it is let go; it gives a node up only after 3 s of silence, so that no
/// other node, slow beside the other tests' clusters, is backed off as long), and a patient
/// one that waits for a node's answer however long it is busy after being let go (one that
/// gave it up would ask the next member).
async fn frozen_member_cluster() -> (Cluster, std::path::PathBuf, Arc<Client>, Arc<Client>) {
    let (c, store) = cluster(3, &["--write-replicas", "2"], "");
    let writer = c
        .client(ClientOptions {
            min_backoff: Duration::from_secs(120),
            max_backoff: Duration::from_secs(120),
            min_silence: Duration::from_secs(3),
            call_timeout: Duration::from_secs(15),
            ..ClientOptions::default()
        })
        .await;
    let patient = c
        .client(ClientOptions {
            call_timeout: Duration::from_secs(15),
            min_silence: Duration::from_secs(15),
            ..ClientOptions::default()
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (0..3).any(|i| writeback_metric(&c, i, "pulls_total") < 1.0) {
        assert!(Instant::now() < deadline, "the pulls at start never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (c, store, writer, patient)
}

/// Freezes node `i` (SIGSTOP) and has `writer` back it off: `path`, which the node owns, is
/// asked of it, found silent, then of the next member.
async fn freeze_and_back_off(c: &Cluster, i: usize, writer: &Client, path: &str) {
    let addr = path_members(writer, path, 1)[0];
    c.inner.signal(i, libc::SIGSTOP).unwrap();
    if writer.reachable(addr) {
        let _ = writer.stat(path).await;
        assert!(!writer.reachable(addr));
    }
}

/// Every entry of directory `dir` as the node at `addr` lists it (page by page).
async fn listed_by(client: &Client, addr: std::net::SocketAddr, dir: &str) -> Vec<DirEntry> {
    let mut all: Vec<DirEntry> = Vec::new();
    loop {
        let list = frame::RequestBody::List {
            path: dir.into(),
            start_after: all.last().map(|e| e.name.clone()).unwrap_or_default(),
        };
        match client.call(addr, list, bytes::Bytes::new()).await {
            Ok((frame::ResponseBody::Listing { entries, more }, _)) => {
                all.extend(entries);
                if !more {
                    return all;
                }
            }
            other => panic!("{addr} listed {dir}: {other:?}"),
        }
    }
}

/// A path's metadata owner frozen while the path is written (the change goes to the next
/// member, which hands it to the third: two of three hold it, so it is acknowledged) answers
/// a stat of the path as soon as it is let go with the new file, not from its own records,
/// which miss it until its next pull (30 s): before it answers a stat of a path written
/// through the cluster, a node takes the records of the path that enough of its peers hold to
/// overlap every write set. A second write, a replacement, is read new too. Without this, the
/// owner answered not found. The same for a listing of a directory written in the same pause
/// (`RecordsIn`): without it, the owner listed the store's object (flushed meanwhile) under
/// the store's version, not the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_missed_a_change_while_frozen_answers_a_stat_or_listing_with_it_once_back() {
    let (c, _store, a, patient) = frozen_member_cluster().await;
    let path = "/ck/frozen-owner/f";
    // A directory listed through the owner, whose file is written in the same pause.
    let dir = "/ck/frozen-list";
    let owner_addr = path_members(&a, path, 1)[0];
    let owner = owner_of(&c, &a, path);
    for (round, data) in [&b"first"[..], &b"second, longer"[..]]
        .into_iter()
        .enumerate()
    {
        freeze_and_back_off(&c, owner, &a, path).await;
        let written = a.write_file(path, data.to_vec().into()).await;
        let listed = a
            .write_file(&format!("{dir}/g"), data.to_vec().into())
            .await;
        c.inner.signal(owner, libc::SIGCONT).unwrap();
        let version = written.unwrap().version;
        // First a listing of the other directory (a stat of `path` takes the records of its
        // ancestors, and so could take the other file's with them).
        let listed = listed.unwrap().version;
        let entries = listed_by(&patient, owner_addr, dir).await;
        assert!(
            entries
                .iter()
                .any(|e| e.name == "g" && e.version_tag == listed),
            "round {round}: the owner listed {entries:?}, the cluster holds g at {listed}"
        );
        let stat = frame::RequestBody::StatPath { path: path.into() };
        let r = patient.call(owner_addr, stat, bytes::Bytes::new()).await;
        assert!(
            matches!(
                &r,
                Ok((frame::ResponseBody::PathInfo { kind: PathKind::File { version_tag, .. } }, _))
                    if *version_tag == version
            ),
            "round {round}: the owner answered {r:?}, the cluster holds {version}"
        );
        assert_eq!(read_all(&patient, path).await, data);
    }
}

/// A directory of more entries than one `RecordsIn` answer holds (1,000 records), written
/// while its metadata owner was frozen, is listed whole by the owner once it is let go, each
/// file under the version the cluster holds: the owner takes every page of its peer's records
/// of the directory before it lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_missed_a_large_directory_while_frozen_lists_all_of_it_once_back() {
    use futures_util::StreamExt;
    let (c, _store, a, patient) = frozen_member_cluster().await;
    let dir = "/ck/frozen-many";
    let owner_addr = path_members(&a, dir, 1)[0];
    let owner = owner_of(&c, &a, dir);
    freeze_and_back_off(&c, owner, &a, dir).await;
    let n = frame::MAX_RECORD_BATCH + 150;
    let written: Vec<(String, String)> = futures_util::stream::iter(0..n)
        .map(|i| {
            let a = a.clone();
            async move {
                let name = format!("{i:05}");
                let info = a
                    .write_file(&format!("{dir}/{name}"), vec![i as u8; 10].into())
                    .await;
                (name, info.unwrap().version)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    c.inner.signal(owner, libc::SIGCONT).unwrap();
    let mut want = written;
    want.sort();
    let got: Vec<(String, String)> = listed_by(&patient, owner_addr, dir)
        .await
        .into_iter()
        .map(|e| (e.name, e.version_tag))
        .collect();
    assert_eq!(got.len(), n, "the owner listed {} of {n} files", got.len());
    let wrong: Vec<_> = got.iter().zip(&want).filter(|(g, w)| g != w).collect();
    assert!(
        wrong.is_empty(),
        "the owner listed {} of {n} entries unlike the cluster (listed, held), first: {:?}",
        wrong.len(),
        wrong.first()
    );
    // Caught up, the owner holds what its peers hold of the directory: listed again, a peer
    // answers that it holds the same (its digest), sending none of the 1,150 records. (The
    // flushes of the files change their records meanwhile: list until one listing falls
    // between them.)
    let same = |c: &Cluster| -> f64 {
        (0..3)
            .filter(|&i| i != owner)
            .map(|i| writeback_metric(c, i, "listings_same_total"))
            .sum()
    };
    let before = same(&c);
    let deadline = Instant::now() + Duration::from_secs(60);
    while same(&c) == before {
        assert!(
            Instant::now() < deadline,
            "no peer answered a listing's RecordsIn as holding the same records"
        );
        assert_eq!(listed_by(&patient, owner_addr, dir).await.len(), n);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Directories whose files were all deleted while a node was frozen are gone from that
/// node's answers as soon as it is let go, though its records of those files are live: before
/// it lists a directory, stats a path or judges a change of one, the node confirms its live
/// records beneath each entry (each path) where its peers did not give it the same first live
/// record there, and takes their deletions. One directory is listed, another stated first,
/// each with more files than one `RecordsOf` holds (64), and a third made again through the
/// node, its metadata owner. Without it, the node listed and stated the directories until its
/// next pull, and refused the new one as existing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_missed_a_deep_deletion_while_frozen_lists_and_stats_without_it_once_back() {
    let (c, store, a, patient) = frozen_member_cluster().await;
    let parent = "/ck/frozen-deep";
    let (listed, stated, made) = (
        format!("{parent}/a"),
        format!("{parent}/b"),
        format!("{parent}/c"),
    );
    // The directory made again first: the deletions last handed on may still reach the node
    // once it is let go (its peers retry them for a while).
    let files: Vec<String> = [(&made, 5), (&listed, 70), (&stated, 70)]
        .into_iter()
        .flat_map(|(dir, n)| (0..n).map(move |i| format!("{dir}/x/y/f{i:02}")))
        .collect();
    let kept = [&listed, &stated, &made].map(|d| format!("{d}/keep"));
    for f in files.iter().chain(&kept) {
        a.write_file(f, b"bytes".to_vec().into()).await.unwrap();
    }
    let again = format!("{made}/x");
    let owner_addr = path_members(&a, &again, 1)[0];
    let owner = owner_of(&c, &a, &again);
    let names = |entries: Vec<DirEntry>| entries.into_iter().map(|e| e.name).collect::<Vec<_>>();
    // The node holds every file before it is frozen.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (dir, n) in [(&listed, 70), (&stated, 70), (&made, 5)] {
        while listed_by(&patient, owner_addr, &format!("{dir}/x/y"))
            .await
            .len()
            < n
        {
            assert!(Instant::now() < deadline, "the node never held the files");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            names(listed_by(&patient, owner_addr, dir).await),
            ["keep", "x"]
        );
    }
    // Backed off with a path of its own (the stat that finds it silent is answered once it is
    // let go, and would take the deletions beneath the path it names).
    let probe = (0..)
        .map(|k| format!("{parent}/probe-{k}"))
        .find(|p| owner_of(&c, &a, p) == owner)
        .unwrap();
    freeze_and_back_off(&c, owner, &a, &probe).await;
    for f in &files {
        a.remove_file(f).await.unwrap();
    }
    // The deletions reach the store before the node is let go (the store's objects would
    // make the directory exist whatever the records say).
    let in_store = store.join("frozen-deep/c/x/y");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir(&in_store).is_ok_and(|mut d| d.next().is_some()) {
        assert!(
            Instant::now() < deadline,
            "the deletions never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.inner.signal(owner, libc::SIGCONT).unwrap();
    let entries = names(listed_by(&patient, owner_addr, &listed).await);
    assert_eq!(
        entries,
        ["keep"],
        "the node listed {listed} with the deleted directory"
    );
    let gone = format!("{stated}/x");
    let stat = frame::RequestBody::StatPath { path: gone.clone() };
    let r = patient.call(owner_addr, stat, bytes::Bytes::new()).await;
    assert!(
        matches!(&r, Err(Error::NotFound(_))),
        "the node answered a stat of the deleted {gone}: {r:?}"
    );
    let entries = names(listed_by(&patient, owner_addr, &stated).await);
    assert_eq!(
        entries,
        ["keep"],
        "the node listed {stated} with the deleted directory"
    );
    assert!(patient.reachable(owner_addr));
    patient.make_dir(&again).await.unwrap();
    // 70 files beneath each of two directories take two rounds of 64 at least.
    let rounds = writeback_metric(&c, owner, "confirm_rounds_total");
    assert!(rounds >= 5.0, "{rounds} rounds confirmed 145 files");
}
