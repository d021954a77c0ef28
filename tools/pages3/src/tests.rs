//! Unit tests of the gateway's key mapping, listing order, tokens and read pieces.

#![allow(clippy::unwrap_used)]
use hyper::{HeaderMap, Method};
use pagestore_protocol::frame::DirEntry;
use s3s::S3ErrorCode;

use super::{
    keys::{decode_token, encode_token, key_path, url_encode, KeyPath},
    list::{sorted_level, subtree_after},
    multipart::check_part_number,
    read::chunks,
    valid_bucket,
};

#[test]
fn keys_map_to_paths_and_traversal_is_refused() {
    assert_eq!(
        key_path("data", "a/b.bin").unwrap(),
        KeyPath::Object("/data/a/b.bin".into())
    );
    assert_eq!(
        key_path("data", "a/").unwrap(),
        KeyPath::Marker("/data/a".into())
    );
    assert_eq!(
        key_path("data", "100%.txt").unwrap(),
        KeyPath::Object("/data/100%.txt".into())
    );
    assert_eq!(
        key_path("data", "..x/y..").unwrap(),
        KeyPath::Object("/data/..x/y..".into())
    );
    for bad in [
        "..",
        "../etc/passwd",
        "a/../../b",
        "a/./b",
        ".",
        "%2e%2e/x",
        "%2E%2e/x",
        "a/%252e%252e/b",
        "a/%2e%2e%2fb",
        "a/..%2fb",
        "a\0b",
        "a/%00",
        "a//b",
        "/a",
        "",
    ] {
        let e = key_path("data", bad).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{bad:?}");
    }
    for bad in ["..", ".", "", "a/b", "%2e%2e"] {
        assert!(!valid_bucket(bad), "{bad:?}");
    }
    assert!(valid_bucket("data"));
    assert!(valid_bucket("Data_1"));
}

#[test]
fn tokens_round_trip_and_junk_is_refused() {
    for k in ["", "a", "big/f00001", "ünïcode/ключ"] {
        assert_eq!(decode_token(&encode_token(k)).unwrap(), k);
    }
    for junk in ["", "x00", "k0", "kzz", "kff"] {
        assert!(decode_token(junk).is_err(), "{junk:?}");
    }
}

#[test]
fn pieces_follow_page_boundaries() {
    let v: Vec<_> = chunks(100, 2500, 1000).collect();
    assert_eq!(v, vec![(100, 900), (1000, 1000), (2000, 500)]);
    assert_eq!(chunks(5, 5, 1000).count(), 0);
    let v: Vec<_> = chunks(0, 1000, 1000).collect();
    assert_eq!(v, vec![(0, 1000)]);
}

#[test]
fn level_sort_puts_directory_keys_where_their_children_sort() {
    let e = |name: &str, is_dir: bool| DirEntry {
        name: name.into(),
        is_dir,
        size: 1,
        version_tag: String::new(),
        mtime_ns: 0,
    };
    let v = sorted_level(
        "p/",
        vec![e("a", true), e("a-b", false), e("a0", false), e("b", false)],
        "",
    );
    let keys: Vec<_> = v.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["p/a-b", "p/a/", "p/a0", "p/b"]);
    assert!(subtree_after("p/a/", Some("p/a-b")));
    assert!(subtree_after("p/a/", Some("p/a/x")));
    assert!(!subtree_after("p/a/", Some("p/a/")));
    assert!(!subtree_after("p/a/", Some("p/a0")));
}

#[test]
fn url_encoding_keeps_slashes() {
    assert_eq!(url_encode("a b/c+d%é"), "a%20b/c%2Bd%25%C3%A9");
}

#[test]
fn part_numbers_go_from_1_to_10000() {
    for n in [1, 5_000, 10_000] {
        assert!(check_part_number(n).is_ok(), "{n}");
    }
    for n in [i32::MIN, -1, 0, 10_001] {
        let e = check_part_number(n).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::InvalidArgument, "{n}");
        assert!(e.message().unwrap_or("").contains(&n.to_string()), "{n}");
    }
}

#[test]
fn markers_are_remembered_listed_under_their_parent_and_forgotten() {
    let m = super::Markers::default();
    assert!(m.put("/data/a", 1));
    assert!(m.put("/data/a/b", 2));
    assert!(m.put("/data/ab", 3));
    assert!(m.put("/other/a", 4));
    assert_eq!(m.get("/data/a"), Some(1));
    assert_eq!(m.get("/data/a/"), None);
    assert_eq!(m.children("/data"), vec!["a".to_string(), "ab".to_string()]);
    assert_eq!(m.children("/data/a"), vec!["b".to_string()]);
    assert!(m.children("/data/a/b").is_empty());
    m.remove("/data/a");
    assert_eq!(m.get("/data/a"), None);
    assert_eq!(m.children("/data"), vec!["ab".to_string()]);
    assert_eq!(m.children("/data/a"), vec!["b".to_string()]);
}

/// `x-amz-copy-source` headers that s3s refuses for their bucket, though it names a mount
/// (shorter than 3 characters, upper case, an underscore), are taken by the gateway's route
/// with a stand-in bucket that s3s parses; headers s3s parses itself, and names no mount can
/// have, are left to s3s.
#[test]
fn copy_sources_naming_mounts_s3_would_refuse_are_routed_with_a_stand_in() {
    let routed = |h: &str| match super::nonstandard_source(h) {
        Some(super::Routed::CopySource { bucket, header }) => Some((bucket, header)),
        _ => None,
    };
    let stand_in = |rest: &str| format!("{}/{rest}", super::SOURCE_STAND_IN);
    assert_eq!(
        routed("ck/run/a.bin"),
        Some(("ck".into(), stand_in("run/a.bin")))
    );
    assert_eq!(
        routed("/w/a%20b.bin?versionId=null"),
        Some(("w".into(), stand_in("a%20b.bin?versionId=null")))
    );
    assert_eq!(routed("My_Data/x"), Some(("My_Data".into(), stand_in("x"))));
    assert_eq!(routed("%63k/x"), Some(("ck".into(), stand_in("x"))));
    for left in [
        "data/x",
        "/data/x?versionId=3",
        "arn:aws:s3:us-east-1:1:accesspoint/a/object/k",
        "ck",
        "%2Fck/x",
        "../x",
        "%00/x",
    ] {
        assert_eq!(routed(left), None, "{left}");
    }
    // A copy s3s would take, and every other PUT, are not routed.
    let put = |source: Option<&str>| {
        let mut h = HeaderMap::new();
        if let Some(v) = source {
            h.insert("x-amz-copy-source", v.parse().unwrap());
        }
        super::routed(&Method::PUT, &"/ck/dst".parse().unwrap(), &h).is_some()
    };
    assert!(put(Some("ck/src")));
    assert!(!put(Some("data/src")));
    assert!(!put(None));
}
