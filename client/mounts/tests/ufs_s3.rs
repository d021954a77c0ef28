//! The mount table over a real S3-protocol server (s3s-fs, started in-process by the testkit):
//! stat, byte-exact ranged reads, listing, missing keys, objects that change after stat, bad
//! credentials and missing credentials.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use pagestore_mounts::ufs::{parse_mount, Entry, MountTable, ObjectInfo, UfsError};
use pagestore_testkit::{sha256_hex, S3Server};

const KEY: &str = "testkey";
const SECRET: &str = "testsecret";
/// S3 bucket names need 3 to 63 characters: s3s refuses shorter ones (400 InvalidBucketName).
const BUCKET: &str = "bucket";
/// Large enough that object_store's ranged reads and the server's 4 KiB chunking both matter.
const EPISODE_LEN: usize = 300_000;

fn episode() -> Vec<u8> {
    // Not a short period: a misplaced range cannot match by accident.
    pagestore_testkit::data::bytes(1, EPISODE_LEN)
}

/// A bucket with `prefix/` holding `episodes/e1.bin`, `episodes/sub/deep.txt` and
/// `manifest.txt`, plus an object outside the prefix that must stay invisible.
struct Fixture {
    dir: tempfile::TempDir,
    server: S3Server,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(BUCKET).join("prefix");
        std::fs::create_dir_all(p.join("episodes/sub")).unwrap();
        std::fs::write(p.join("episodes/e1.bin"), episode()).unwrap();
        std::fs::write(p.join("episodes/sub/deep.txt"), b"deep").unwrap();
        std::fs::write(p.join("manifest.txt"), b"hello").unwrap();
        std::fs::write(dir.path().join(BUCKET).join("outside.txt"), b"no").unwrap();
        let server = S3Server::start(dir.path(), KEY, SECRET).unwrap();
        Fixture { dir, server }
    }

    fn url(&self, key: &str, secret: &str) -> String {
        format!(
            "s3://{BUCKET}/prefix?endpoint={}&access_key_id={key}&secret_access_key={secret}\
             &region=us-east-1",
            self.server.endpoint()
        )
    }

    fn table(&self) -> MountTable {
        let m = parse_mount(&format!("/data={}", self.url(KEY, SECRET))).unwrap();
        MountTable::new(&[m]).unwrap()
    }

    fn object_path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(BUCKET).join("prefix").join(rel)
    }
}

#[tokio::test]
async fn stat_gives_size_and_a_content_version() {
    let f = Fixture::new();
    let t = f.table();
    let info = t.stat("/data/episodes/e1.bin").await.unwrap();
    assert_eq!(info.path, "/data/episodes/e1.bin");
    assert_eq!(info.size, EPISODE_LEN as u64);
    // s3s-fs answers the MD5 of the content as a strong etag (32 hex digits), unquoted by ufs.
    assert_eq!(info.version.len(), 32, "{}", info.version);
    assert!(
        info.version.bytes().all(|b| b.is_ascii_hexdigit()),
        "{}",
        info.version
    );
    assert_eq!(
        info.file_id,
        pagestore_mounts::ufs::file_id(&info.path, &info.version)
    );
    // Same content, same version: stat is stable.
    assert_eq!(t.stat("/data/episodes/e1.bin").await.unwrap(), info);
    let m = t.stat("/data/manifest.txt").await.unwrap();
    assert_eq!(m.size, 5);
    assert_ne!(m.version, info.version);
    assert_ne!(m.file_id, info.file_id);
}

#[tokio::test]
async fn ranged_reads_are_byte_exact_and_short_past_the_end() {
    let f = Fixture::new();
    let t = f.table();
    let want = episode();
    let info = t.stat("/data/episodes/e1.bin").await.unwrap();
    let len = EPISODE_LEN as u64;
    for r in [
        0..1,
        0..10,
        1000..1010,
        4095..4097,
        4096..8192,
        12_345..200_001,
        0..len,
        len - 1..len,
    ] {
        let got = t.read(&info, r.clone()).await.unwrap();
        let (s, e) = (r.start as usize, r.end as usize);
        assert_eq!(got.len(), e - s, "{r:?}");
        assert_eq!(sha256_hex(&got), sha256_hex(&want[s..e]), "{r:?}");
    }
    // Past the end: short, then empty.
    let tail = t.read(&info, len - 10..len + 4096).await.unwrap();
    assert_eq!(&tail[..], &want[EPISODE_LEN - 10..]);
    assert_eq!(t.read(&info, 0..len * 2).await.unwrap().len(), EPISODE_LEN);
    assert!(t.read(&info, len..len + 10).await.unwrap().is_empty());
    assert!(t.read(&info, len + 5..len + 10).await.unwrap().is_empty());
    // Empty and inverted ranges give no bytes and do not reach the server.
    assert!(t.read(&info, 7..7).await.unwrap().is_empty());
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = 9..3;
    assert!(t.read(&info, inverted).await.unwrap().is_empty());
}

#[tokio::test]
async fn listing_shows_files_and_subdirectories_under_the_prefix_only() {
    let f = Fixture::new();
    let t = f.table();
    assert_eq!(t.list("/").await.unwrap(), vec![Entry::Dir("data".into())]);
    let data = t.list("/data").await.unwrap();
    assert_eq!(
        data,
        vec![
            Entry::Dir("episodes".into()),
            Entry::File("manifest.txt".into(), 5),
        ],
        "{data:?}"
    );
    assert_eq!(t.list("/data/").await.unwrap(), data);
    assert_eq!(
        t.list("/data/episodes").await.unwrap(),
        vec![
            Entry::Dir("sub".into()),
            Entry::File("e1.bin".into(), EPISODE_LEN as u64),
        ]
    );
    assert_eq!(
        t.list("/data/episodes/sub").await.unwrap(),
        vec![Entry::File("deep.txt".into(), 4)]
    );
    // A prefix with nothing below it lists as empty (S3 has no directories).
    assert!(t.list("/data/nothing-here").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_listed_version_is_the_one_a_stat_gives_or_none() {
    let f = Fixture::new();
    let t = f.table();
    // s3s-fs lists objects without ETags but answers one to HEAD and GET (as some S3-protocol
    // servers do), and its listing's times are finer than HEAD's Last-Modified.
    let entries = t.list_entries("/data/episodes").await.unwrap();
    let e = entries.iter().find(|e| e.name == "e1.bin").unwrap();
    let stat = t.stat("/data/episodes/e1.bin").await.unwrap();
    match ObjectInfo::listed("/data/episodes/e1.bin".into(), e) {
        // A version from the listing is the stat's, and reads pinned to it work.
        Some(listed) => {
            assert_eq!(listed.version, stat.version);
            let got = t.read(&listed, 0..EPISODE_LEN as u64).await.unwrap();
            assert_eq!(sha256_hex(&got), sha256_hex(&episode()));
        }
        // Else the entry says no version at all: nothing can pin a read to a made-up one.
        None => assert_eq!(e.version_tag, "", "{e:?}"),
    }
    assert!(!e.is_dir && e.size == EPISODE_LEN as u64, "{e:?}");
    let got = t.read(&stat, 0..EPISODE_LEN as u64).await.unwrap();
    assert_eq!(sha256_hex(&got), sha256_hex(&episode()));
}

#[tokio::test]
async fn unknown_keys_are_not_found() {
    let f = Fixture::new();
    let t = f.table();
    for p in [
        "/data/nope",
        "/data/episodes/e2.bin",
        // Outside the mount's prefix, although the bucket holds it.
        "/data/outside.txt",
        // Not "/data/episodes": S3 would answer 404 for a key that is only a prefix, but s3s-fs
        // answers 500 (it tries to hash the directory), which object_store retries for seconds.
    ] {
        assert!(
            matches!(t.stat(p).await, Err(UfsError::NotFound(_))),
            "{p}: {:?}",
            t.stat(p).await
        );
    }
    // Deleted after stat: the read says so.
    let info = t.stat("/data/manifest.txt").await.unwrap();
    std::fs::remove_file(f.object_path("manifest.txt")).unwrap();
    let r = t.read(&info, 0..5).await;
    assert!(matches!(r, Err(UfsError::NotFound(_))), "{r:?}");
}

#[tokio::test]
async fn an_object_rewritten_after_stat_is_refused_not_mixed() {
    let f = Fixture::new();
    let t = f.table();
    let old = t.stat("/data/episodes/e1.bin").await.unwrap();
    assert_eq!(t.read(&old, 0..4).await.unwrap().len(), 4);
    // Same size, different content: only the etag can tell.
    let mut changed = episode();
    changed[EPISODE_LEN / 2] ^= 0xff;
    std::fs::write(f.object_path("episodes/e1.bin"), &changed).unwrap();
    let r = t.read(&old, 0..4).await;
    assert!(
        matches!(&r, Err(UfsError::Changed { path, expected })
            if path == "/data/episodes/e1.bin" && *expected == old.version),
        "{r:?}"
    );
    let new = t.stat("/data/episodes/e1.bin").await.unwrap();
    assert_eq!(new.size, old.size);
    assert_ne!(new.version, old.version);
    assert_ne!(new.file_id, old.file_id);
    let mid = EPISODE_LEN as u64 / 2;
    assert_eq!(
        &t.read(&new, mid - 1..mid + 2).await.unwrap()[..],
        &changed[EPISODE_LEN / 2 - 1..EPISODE_LEN / 2 + 2]
    );
}

#[tokio::test]
async fn a_wrong_secret_is_an_error_not_a_panic() {
    let f = Fixture::new();
    let m = parse_mount(&format!("/data={}", f.url(KEY, "not-the-secret"))).unwrap();
    // Nothing is contacted when the table is built.
    let t = MountTable::new(&[m]).unwrap();
    // 403 SignatureDoesNotMatch, answered at once (not retried).
    let stat = t.stat("/data/manifest.txt").await;
    assert!(
        matches!(
            stat,
            Err(UfsError::Store(
                _,
                object_store::Error::PermissionDenied { .. }
            ))
        ),
        "{stat:?}"
    );
    let list = t.list("/data").await;
    assert!(
        matches!(&list, Err(e @ UfsError::Store(..)) if e.to_string().contains("403")),
        "{list:?}"
    );
    // An unknown access key, likewise.
    let m = parse_mount(&format!("/data={}", f.url("nobody", SECRET))).unwrap();
    let t = MountTable::new(&[m]).unwrap();
    let stat = t.stat("/data/manifest.txt").await;
    assert!(
        matches!(
            stat,
            Err(UfsError::Store(
                _,
                object_store::Error::PermissionDenied { .. }
            ))
        ),
        "{stat:?}"
    );
    // With the right secret, a read pinned to a version from the good mount works.
    let good = f.table();
    let info = good.stat("/data/manifest.txt").await.unwrap();
    assert_eq!(&good.read(&info, 0..5).await.unwrap()[..], b"hello");
}

#[test]
fn an_s3_mount_without_credentials_is_a_config_error() {
    // The environment is a fallback for the URL's credentials: remove it for this test. No other
    // test in this file reads it (they all pass credentials in the URL).
    std::env::remove_var("AWS_ACCESS_KEY_ID");
    std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    let f = Fixture::new();
    for url in [
        format!("s3://{BUCKET}/prefix?endpoint={}", f.server.endpoint()),
        // A key without a secret is no better.
        format!(
            "s3://{BUCKET}/prefix?endpoint={}&access_key_id={KEY}",
            f.server.endpoint()
        ),
    ] {
        let m = parse_mount(&format!("/data={url}")).unwrap();
        match MountTable::new(&[m]) {
            Err(UfsError::Config(msg)) => assert!(msg.contains("no credentials"), "{msg}"),
            Err(e) => panic!("{url}: expected a configuration error, got {e:?}"),
            Ok(_) => panic!("{url}: accepted without credentials"),
        }
    }
}
