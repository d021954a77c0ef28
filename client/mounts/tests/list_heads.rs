//! The heads of listings over real object-store servers: an S3-protocol server (s3s-fs, in
//! process; also as the XML API `object_store` speaks to `gs://` buckets) and Azurite (Azure
//! Blob Storage). A head is one store request, cut where the store's
//! key order and the listing's name order could disagree; it must always be the start of the
//! whole listing.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use pagestore_mounts::ufs::{parse_mount, MountTable};
use pagestore_testkit::{azurite::Azurite, S3Server};

/// Names where the store's key order and the listing's name order differ: directory `a` (key
/// `a/`) comes after `a-b` and `a.txt` in key order, before them by name; then enough files for
/// heads of many sizes.
fn objects() -> Vec<(String, Vec<u8>)> {
    let mut objects: Vec<(String, Vec<u8>)> = [
        ("a/x", &b"x"[..]),
        ("a-b", b"ab"),
        ("a-c/y", b"y"),
        ("a.txt", b"t"),
        ("a0", b"0"),
        ("ab/z", b"z"),
        ("b", b"b"),
        ("b.d/w", b"w"),
        ("b.d.e", b"e"),
    ]
    .iter()
    .map(|(n, d)| (n.to_string(), d.to_vec()))
    .collect();
    objects.extend((0..40).map(|i| (format!("f{i:02}"), vec![b'f'; i])));
    objects
}

/// Writes [`objects`] under `/data/names` through the mount.
async fn fill(t: &MountTable) {
    for (name, data) in objects() {
        t.put(&format!("/data/names/{name}"), data.into())
            .await
            .unwrap();
    }
}

/// Every head of `/data/names`, from 1 entry to more than it holds, is the start of its whole
/// listing; so is the mount root's, and a directory with nothing below it has an empty one.
async fn heads_start_the_listing(t: &MountTable) {
    let all = t.list_entries("/data/names").await.unwrap();
    assert_eq!(all.len(), 49, "{all:?}");
    assert!(t.has_list_head("/data/names"));
    for max in 1..=52 {
        let (head, more) = t.list_head("/data/names", max).await.unwrap();
        assert!(!head.is_empty() && head.len() <= max, "{max}: {head:?}");
        assert_eq!(head, all[..head.len()], "max {max}");
        if head.len() < all.len() {
            assert!(more, "max {max}: entries left out, and no more");
        }
    }
    let (head, more) = t.list_head("/data/names", 60).await.unwrap();
    assert!(!more && head == all);
    let (root, _) = t.list_head("/data", 10).await.unwrap();
    assert_eq!(root, t.list_entries("/data").await.unwrap());
    assert_eq!(
        t.list_head("/data/nothing-here", 5).await.unwrap(),
        (vec![], false)
    );
}

fn table(url: &str) -> MountTable {
    MountTable::new(&[parse_mount(&format!("/data={url}")).unwrap()]).unwrap()
}

#[tokio::test]
async fn s3_heads_are_the_start_of_the_whole_listing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("bucket")).unwrap();
    let server = S3Server::start(dir.path(), "k", "s").unwrap();
    let t = table(&format!(
        "s3://bucket/prefix?endpoint={}&access_key_id=k&secret_access_key=s&region=us-east-1",
        server.endpoint()
    ));
    fill(&t).await;
    heads_start_the_listing(&t).await;
}

#[tokio::test]
async fn gcs_heads_are_the_start_of_the_whole_listing() {
    // object_store lists (and reads and writes) a `gs://` bucket through Google Cloud
    // Storage's XML API, which answers as S3's does: an S3 server taking unsigned requests
    // stands in for it, reached over http:// at the mount's endpoint.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("bucket")).unwrap();
    let server = S3Server::start_unsigned(dir.path()).unwrap();
    let t = table(&format!(
        "gs://bucket/prefix?endpoint={}&anonymous=true",
        server.endpoint()
    ));
    // Written as the server's files (object_store asks for a token to write to GCS even
    // without credentials; a public bucket is read-only anyway).
    for (name, data) in objects() {
        let f = dir.path().join("bucket/prefix/names").join(name);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, data).unwrap();
    }
    heads_start_the_listing(&t).await;
}

#[tokio::test]
async fn azure_heads_are_the_start_of_the_whole_listing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Azurite::start(dir.path()).unwrap();
    server.create_container("ctr").unwrap();
    let t = table(&format!(
        "az://ctr/prefix?account={}&access_key={}&endpoint={}",
        pagestore_testkit::azurite::ACCOUNT,
        pagestore_testkit::azurite::ACCOUNT_KEY
            .replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D"),
        server.endpoint()
    ));
    fill(&t).await;
    heads_start_the_listing(&t).await;
}
