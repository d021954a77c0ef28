//! Tests of the record table: the plans of every change, and a property test that nodes which
//! take the same records in any order, any number of times, end with the same table.
#![allow(clippy::unwrap_used)]

use super::*;
use pagestore_protocol::writeback::{new_tag, Hlc};
use proptest::prelude::*;

fn tag(n: u128) -> String {
    new_tag(n)
}

/// Stamps planned records as node `origin`'s change at `hlc`.
fn stamp(mut v: Vec<FileRecord>, hlc: u64, origin: u128) -> Vec<FileRecord> {
    for r in &mut v {
        r.hlc = hlc;
        r.origin = FileId::from_u128(origin);
    }
    v
}

/// Plans `op` and applies its records (stamped at `hlc`), as a sequencer does.
fn change(t: &mut Records, op: ChangeOp, hlc: u64) -> Result<Applied, Refused> {
    match t.plan(&op, false)? {
        Plan::Records(v) => Ok(t.apply_batch(stamp(v, hlc, 1))),
        Plan::Nothing => Ok(Applied::default()),
        Plan::CopyInStore { .. } => panic!("{op:?} needs the store"),
    }
}

fn commit(path: &str, t: u128, size: u64, last: bool) -> ChangeOp {
    commit_with(path, t, size, last, Expect::Any)
}

fn commit_if(path: &str, t: u128, expect: Expect) -> ChangeOp {
    commit_with(path, t, 1, true, expect)
}

fn commit_with(path: &str, t: u128, size: u64, last: bool, expect: Expect) -> ChangeOp {
    ChangeOp::Commit {
        path: path.into(),
        version_tag: tag(t),
        size,
        mtime_ns: 7,
        last,
        expect,
        attrs: Vec::new(),
        since: 0,
    }
}

/// `op` (a commit) with the attributes `content-type: ctype`.
fn typed(mut op: ChangeOp, ctype: &str) -> ChangeOp {
    if let ChangeOp::Commit { attrs, .. } = &mut op {
        *attrs = vec![Attr {
            name: "content-type".into(),
            value: ctype.into(),
        }];
    }
    op
}

/// The content type the record of `path` keeps.
fn ctype_of(t: &Records, path: &str) -> Option<String> {
    match &t.get(path)?.entry {
        RecordEntry::File { attrs, .. } => attrs
            .iter()
            .find(|a| a.name == "content-type")
            .map(|a| a.value.clone()),
        _ => None,
    }
}

#[test]
fn a_conditional_commit_takes_the_path_only_as_it_expects() {
    let mut t = Records::new();
    // Absent: a new path takes it, a second writer's version does not.
    change(&mut t, commit_if("/ck/a", 1, Expect::Absent), 1 << 16).unwrap();
    let e = t
        .plan(&commit_if("/ck/a", 2, Expect::Absent), false)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Precondition);
    // Version: only the version there now.
    let e = t
        .plan(&commit_if("/ck/a", 3, Expect::Version(tag(9))), false)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Precondition);
    change(
        &mut t,
        commit_if("/ck/a", 3, Expect::Version(tag(1))),
        2 << 16,
    )
    .unwrap();
    // Once a version holds the path, its own later commits are not checked again.
    let mut open = commit_if("/ck/b", 4, Expect::Absent);
    if let ChangeOp::Commit { last, .. } = &mut open {
        *last = false;
    }
    change(&mut t, open.clone(), 3 << 16).unwrap();
    assert!(t
        .plan(&commit_if("/ck/b", 4, Expect::Absent), false)
        .is_ok());
    // A path the records do not know is for the store to judge (`check_store`).
    assert!(t
        .plan(&commit_if("/ck/none", 5, Expect::Version(tag(1))), false)
        .is_ok());
    // A conditional delete takes only the version there now.
    let rm_if = |v: u128| ChangeOp::Delete {
        path: "/ck/a".into(),
        dir: false,
        expect: Expect::Version(tag(v)),
    };
    let e = t.plan(&rm_if(1), false).unwrap_err();
    assert_eq!(e.code, ErrorCode::Precondition);
    assert!(t.get("/ck/a").is_some_and(is_live));
    // A deleted path holds no file: no version matches, Absent does.
    change(&mut t, rm_if(3), 4 << 16).unwrap();
    let e = t.plan(&rm_if(3), false).unwrap_err();
    assert_eq!(e.code, ErrorCode::Precondition);
    let e = t
        .plan(&commit_if("/ck/a", 6, Expect::Version(tag(3))), false)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Precondition);
    change(&mut t, commit_if("/ck/a", 6, Expect::Absent), 5 << 16).unwrap();
}

fn state_of(t: &Records, path: &str) -> Option<(String, RecordState, u64)> {
    match &t.get(path)?.entry {
        RecordEntry::File {
            version_tag,
            state,
            size,
            ..
        } => Some((version_tag.clone(), *state, *size)),
        _ => None,
    }
}

#[test]
fn a_commit_makes_the_file_and_its_directories_and_the_last_one_closes_it() {
    let mut t = Records::new();
    change(&mut t, commit("/ck/a/b/f", 1, 0, false), 1 << 16).unwrap();
    assert_eq!(
        state_of(&t, "/ck/a/b/f"),
        Some((tag(1), RecordState::Open, 0))
    );
    assert_eq!(t.known("/ck/a/b"), Known::Implied);
    assert_eq!(t.known("/ck/a"), Known::Implied);
    assert_eq!(t.known("/ck/x"), Known::Unknown);
    assert!(t.takes_pages(version_id(&tag(1))));
    // A later commit of the same version grows it; the last one closes it.
    change(&mut t, commit("/ck/a/b/f", 1, 10, false), 2 << 16).unwrap();
    change(&mut t, commit("/ck/a/b/f", 1, 20, true), 3 << 16).unwrap();
    assert_eq!(
        state_of(&t, "/ck/a/b/f"),
        Some((tag(1), RecordState::Final, 20))
    );
    assert!(!t.takes_pages(version_id(&tag(1))));
    // A repeated last commit (a retry) changes nothing; another commit is refused.
    assert_eq!(
        t.plan(&commit("/ck/a/b/f", 1, 20, true), false),
        Ok(Plan::Nothing)
    );
    let e = t
        .plan(&commit("/ck/a/b/f", 1, 30, false), false)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Changed);
    // The directories list what is beneath them.
    let (recs, implied) = t.children("/ck");
    assert!(recs.is_empty());
    assert_eq!(implied, vec!["a"]);
    let (recs, _) = t.children("/ck/a/b");
    assert_eq!(recs.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec!["f"]);
    // A version that is not a write-back version is refused.
    let bad = ChangeOp::Commit {
        path: "/ck/g".into(),
        version_tag: "etag".into(),
        size: 1,
        mtime_ns: 0,
        last: true,
        expect: Expect::Any,
        attrs: Vec::new(),
        since: 0,
    };
    assert_eq!(t.plan(&bad, false).unwrap_err().code, ErrorCode::BadRequest);
}

#[test]
fn a_file_cannot_hold_a_new_file_beneath_it() {
    let mut t = Records::new();
    change(&mut t, commit("/b/foo/bar", 1, 3, true), 1 << 16).unwrap();
    // Beneath the file, at any depth: refused (no store could flush it), nothing recorded.
    for p in ["/b/foo/bar/xyzzy", "/b/foo/bar/x/y"] {
        let e = t.plan(&commit(p, 2, 1, true), false).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotDir, "{p}");
        assert!(e.message.contains("/b/foo/bar is a file"), "{}", e.message);
        assert!(t.get(p).is_none());
    }
    assert_eq!(t.file_ancestor("/b/foo/bar/xyzzy"), Some("/b/foo/bar"));
    // Nor a directory, nor a file renamed there.
    let mkdir = ChangeOp::MakeDir {
        path: "/b/foo/bar/d".into(),
        mtime_ns: 1,
    };
    assert_eq!(t.plan(&mkdir, false).unwrap_err().code, ErrorCode::NotDir);
    change(&mut t, commit("/b/other", 4, 1, true), 3 << 15).unwrap();
    let mv = ChangeOp::Rename {
        from: "/b/other".into(),
        to: "/b/foo/bar/moved".into(),
        replace: true,
    };
    assert_eq!(t.plan(&mv, false).unwrap_err().code, ErrorCode::NotDir);
    // Beside it, and beneath it once it is deleted: allowed.
    change(&mut t, commit("/b/foo/baz", 3, 1, true), 2 << 16).unwrap();
    let del = ChangeOp::Delete {
        path: "/b/foo/bar".into(),
        dir: false,
        expect: Expect::Any,
    };
    change(&mut t, del, 3 << 16).unwrap();
    assert_eq!(t.file_ancestor("/b/foo/bar/xyzzy"), None);
    change(&mut t, commit("/b/foo/bar/xyzzy", 2, 1, true), 4 << 16).unwrap();
}

#[test]
fn a_rename_moves_the_version_and_keeps_its_pages() {
    let mut t = Records::new();
    // Each commit of a version replaces its attributes.
    change(
        &mut t,
        typed(commit("/ck/.tmp", 1, 60, false), "text/x"),
        1 << 15,
    )
    .unwrap();
    assert_eq!(ctype_of(&t, "/ck/.tmp").as_deref(), Some("text/x"));
    change(
        &mut t,
        typed(commit("/ck/.tmp", 1, 100, true), "application/x-ckpt"),
        1 << 16,
    )
    .unwrap();
    change(&mut t, commit("/ck/model", 2, 50, true), 2 << 16).unwrap();
    // Without replace an existing target is refused.
    let no = ChangeOp::Rename {
        from: "/ck/.tmp".into(),
        to: "/ck/model".into(),
        replace: false,
    };
    assert_eq!(t.plan(&no, false).unwrap_err().code, ErrorCode::Exists);
    let yes = ChangeOp::Rename {
        from: "/ck/.tmp".into(),
        to: "/ck/model".into(),
        replace: true,
    };
    let applied = change(&mut t, yes, 3 << 16).unwrap();
    assert_eq!(
        state_of(&t, "/ck/model"),
        Some((tag(1), RecordState::Final, 100))
    );
    // The attributes move with the version.
    assert_eq!(
        ctype_of(&t, "/ck/model").as_deref(),
        Some("application/x-ckpt")
    );
    assert!(matches!(
        t.get("/ck/.tmp").unwrap().entry,
        RecordEntry::Deleted { pending: true, .. }
    ));
    // The renamed version is still held (its pages stay); the replaced one is gone.
    assert_eq!(applied.gone, vec![version_id(&tag(2))]);
    assert_eq!(t.by_file(version_id(&tag(1))).unwrap().path, "/ck/model");
    // A rename into itself, of a directory, or of nothing known is not a records-only rename.
    change(
        &mut t,
        ChangeOp::MakeDir {
            path: "/ck/d".into(),
            mtime_ns: 0,
        },
        4 << 16,
    )
    .unwrap();
    let into_itself = ChangeOp::Rename {
        from: "/ck/d".into(),
        to: "/ck/d/x".into(),
        replace: false,
    };
    assert_eq!(
        t.plan(&into_itself, false).unwrap_err().code,
        ErrorCode::BadRequest
    );
    let dir = ChangeOp::Rename {
        from: "/ck/d".into(),
        to: "/ck/e".into(),
        replace: false,
    };
    assert_eq!(t.plan(&dir, false).unwrap_err().code, ErrorCode::BadRequest);
    let unknown = ChangeOp::Rename {
        from: "/ck/store-object".into(),
        to: "/ck/y".into(),
        replace: false,
    };
    assert!(matches!(
        t.plan(&unknown, false),
        Ok(Plan::CopyInStore { .. })
    ));
}

#[test]
fn a_flushed_file_is_renamed_by_a_copy_in_the_store() {
    let mut t = Records::new();
    change(&mut t, commit("/ck/a", 1, 10, true), 1 << 16).unwrap();
    let mut clean = t.get("/ck/a").unwrap().clone();
    if let RecordEntry::File {
        state, store_tag, ..
    } = &mut clean.entry
    {
        *state = RecordState::Clean;
        *store_tag = "s1".into();
    }
    let applied = t.apply_batch(vec![clean]);
    assert_eq!(applied.cleaned, vec![version_id(&tag(1))]);
    let op = ChangeOp::Rename {
        from: "/ck/a".into(),
        to: "/ck/b".into(),
        replace: false,
    };
    assert_eq!(
        t.plan(&op, false),
        Ok(Plan::CopyInStore {
            from: "/ck/a".into(),
            to: "/ck/b".into()
        })
    );
    let recs = t.plan_store_rename("/ck/a", "/ck/b", "s2", (10, 8), &tag(9));
    t.apply_batch(stamp(recs, 2 << 16, 1));
    let b = t.get("/ck/b").unwrap();
    assert!(matches!(
        &b.entry,
        RecordEntry::File { version_tag, state: RecordState::Clean, store_tag, .. }
            if *version_tag == tag(1) && store_tag == "s2"
    ));
    // An object of the store renamed: a clean file of the fresh version at the copy.
    let recs = t.plan_store_rename("/ck/obj", "/ck/obj2", "s3", (5, 9), &tag(9));
    t.apply_batch(stamp(recs, 3 << 16, 1));
    assert_eq!(
        state_of(&t, "/ck/obj2"),
        Some((tag(9), RecordState::Clean, 5))
    );
    assert!(matches!(
        t.get("/ck/obj").unwrap().entry,
        RecordEntry::Deleted { pending: true, .. }
    ));
}

#[test]
fn deletes_and_directories() {
    let mut t = Records::new();
    change(
        &mut t,
        ChangeOp::MakeDir {
            path: "/ck/d".into(),
            mtime_ns: 1,
        },
        1 << 16,
    )
    .unwrap();
    let again = ChangeOp::MakeDir {
        path: "/ck/d".into(),
        mtime_ns: 2,
    };
    assert_eq!(t.plan(&again, false).unwrap_err().code, ErrorCode::Exists);
    change(&mut t, commit("/ck/d/f", 1, 3, true), 2 << 16).unwrap();
    let rmdir = ChangeOp::Delete {
        path: "/ck/d".into(),
        dir: true,
        expect: Expect::Any,
    };
    assert_eq!(t.plan(&rmdir, false).unwrap_err().code, ErrorCode::NotEmpty);
    let unlink_dir = ChangeOp::Delete {
        path: "/ck/d".into(),
        dir: false,
        expect: Expect::Any,
    };
    assert_eq!(
        t.plan(&unlink_dir, false).unwrap_err().code,
        ErrorCode::IsDir
    );
    let rmdir_file = ChangeOp::Delete {
        path: "/ck/d/f".into(),
        dir: true,
        expect: Expect::Any,
    };
    assert_eq!(
        t.plan(&rmdir_file, false).unwrap_err().code,
        ErrorCode::NotDir
    );
    let applied = change(
        &mut t,
        ChangeOp::Delete {
            path: "/ck/d/f".into(),
            dir: false,
            expect: Expect::Any,
        },
        3 << 16,
    )
    .unwrap();
    assert_eq!(applied.gone, vec![version_id(&tag(1))]);
    // Deleted while open: later commits of the version change nothing, and it takes no pages.
    assert_eq!(
        t.plan(&commit("/ck/d/f", 1, 9, true), false),
        Ok(Plan::Nothing)
    );
    assert!(!t.takes_pages(version_id(&tag(1))));
    // The directory is empty now: it goes; a second time it is not found.
    change(&mut t, rmdir.clone(), 4 << 16).unwrap();
    assert!(
        matches!(t.known("/ck/d"), Known::Record(r) if matches!(r.entry, RecordEntry::Deleted { .. }))
    );
    assert_eq!(t.plan(&rmdir, false).unwrap_err().code, ErrorCode::NotFound);
    // A commit over a directory is refused.
    change(
        &mut t,
        ChangeOp::MakeDir {
            path: "/ck/e".into(),
            mtime_ns: 1,
        },
        5 << 16,
    )
    .unwrap();
    assert_eq!(
        t.plan(&commit("/ck/e", 2, 1, true), false)
            .unwrap_err()
            .code,
        ErrorCode::IsDir
    );
    // Deleting what the records do not know is recorded (the store is the caller's to check).
    assert!(matches!(
        t.plan(&ChangeOp::Delete { path: "/ck/stored".into(), dir: false, expect: Expect::Any }, false),
        Ok(Plan::Records(v)) if matches!(v[0].entry, RecordEntry::Deleted { pending: true, .. })
    ));
}

#[test]
fn flushable_records_come_oldest_first_and_silent_writers_after_the_lease() {
    let mut t = Records::new();
    change(&mut t, commit("/ck/open", 1, 1, false), 10_000 << 16).unwrap();
    change(&mut t, commit("/ck/closed", 2, 1, true), 11_000 << 16).unwrap();
    change(&mut t, commit("/ck/early", 3, 1, true), 9_000 << 16).unwrap();
    let paths = |now: u64| {
        t.flushable(now, 5_000)
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(paths(12_000), vec!["/ck/early", "/ck/closed"]);
    // The open file's writer has been silent for the lease.
    assert_eq!(paths(15_000), vec!["/ck/early", "/ck/open", "/ck/closed"]);
    // Transient files are never flushed.
    let mut u = Records::new();
    if let Plan::Records(v) = u.plan(&commit("/tmp/x", 4, 1, true), true).unwrap() {
        u.apply_batch(stamp(v, 1 << 16, 1));
    }
    assert!(u.flushable(u64::MAX >> 20, 0).is_empty());
    let s = t.summary("/ck", 12_000);
    assert_eq!((s.files_dirty, s.bytes_dirty), (3, 3));
    assert_eq!(s.oldest_dirty_ms, 3_000);
    assert_eq!(t.summary("/other", 12_000).files_dirty, 0);
}

#[test]
fn pulls_page_through_the_records_in_path_order() {
    let mut t = Records::new();
    for i in 0..25u128 {
        change(
            &mut t,
            commit(&format!("/ck/f{i:02}"), i, 1, true),
            (i as u64 + 1) << 16,
        )
        .unwrap();
    }
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let (page, more) = t.after(&after, 10);
        seen.extend(page.iter().map(|r| r.path.clone()));
        match page.last() {
            Some(r) if more => after = r.path.clone(),
            _ => break,
        }
    }
    let want: Vec<String> = (0..25).map(|i| format!("/ck/f{i:02}")).collect();
    assert_eq!(seen, want);
}

#[test]
fn the_first_live_record_beneath_a_directory_is_found_past_deletions() {
    let mut t = Records::new();
    let del = |path: &str| ChangeOp::Delete {
        path: path.into(),
        dir: false,
        expect: Expect::Any,
    };
    // "/ck/d-x" and "/ck/d.x" sort between "/ck/d" and "/ck/d/": not beneath it.
    for (i, p) in [
        "/ck/d-x", "/ck/d.x", "/ck/d/a", "/ck/d/b", "/ck/d/c", "/ck/e/f",
    ]
    .iter()
    .enumerate()
    {
        change(
            &mut t,
            commit(p, i as u128 + 1, 1, true),
            (i as u64 + 1) << 16,
        )
        .unwrap();
    }
    assert_eq!(t.first_beneath("/ck/d").unwrap().path, "/ck/d/a");
    assert_eq!(t.first_beneath("/ck/d/").unwrap().path, "/ck/d/a");
    change(&mut t, del("/ck/d/a"), 10 << 16).unwrap();
    change(&mut t, del("/ck/d/b"), 11 << 16).unwrap();
    assert_eq!(t.first_beneath("/ck/d").unwrap().path, "/ck/d/c");
    change(&mut t, del("/ck/d/c"), 12 << 16).unwrap();
    assert_eq!(t.first_beneath("/ck/d"), None);
    assert_eq!(t.first_beneath("/ck/d/a"), None);
    assert_eq!(t.first_beneath("/ck").unwrap().path, "/ck/d-x");
    // The first live records beneath, as many as asked for, deletions passed over; the
    // entries that live records make directories.
    let paths = |v: Vec<&FileRecord>| v.into_iter().map(|r| r.path.clone()).collect::<Vec<_>>();
    assert_eq!(
        paths(t.live_beneath("/ck").take(2).collect()),
        ["/ck/d-x", "/ck/d.x"]
    );
    assert_eq!(
        paths(t.live_beneath("/ck/").collect()),
        ["/ck/d-x", "/ck/d.x", "/ck/e/f"]
    );
    assert_eq!(t.live_beneath("/ck/d").count(), 0);
    assert_eq!(t.implied_entries("/ck"), ["/ck/e"]);
    assert_eq!(t.implied_entries("/"), ["/ck"]);
    assert!(t.implied_entries("/ck/e").is_empty());
    // A long run of deletions does not hide what follows it.
    let mut u = Records::new();
    for i in 0..300u128 {
        let p = format!("/ck/g/{i:04}");
        change(&mut u, commit(&p, i + 1, 1, true), (2 * i as u64 + 1) << 16).unwrap();
        change(&mut u, del(&p), (2 * i as u64 + 2) << 16).unwrap();
    }
    assert_eq!(u.first_beneath("/ck/g"), None);
    change(&mut u, commit("/ck/g/zz", 9999, 1, true), 1 << 40).unwrap();
    assert_eq!(u.first_beneath("/ck/g").unwrap().path, "/ck/g/zz");
    assert_eq!(u.first_beneath("/").unwrap().path, "/ck/g/zz");
}

/// A directory's entries as its listing sees them: the records of its direct children and the
/// directories records beneath it imply.
fn entries_of(t: &Records, dir: &str) -> (Vec<(String, RecordEntry)>, Vec<String>) {
    let (own, implied) = t.children(dir);
    (
        own.into_iter()
            .map(|(n, r)| (n.to_string(), r.entry.clone()))
            .collect(),
        implied.into_iter().map(str::to_string).collect(),
    )
}

#[test]
fn a_directorys_entries_come_in_pages_that_list_it_on_a_node_that_had_none() {
    let mut t = Records::new();
    // "/ck/d-x" and "/ck/e/z" are not in "/ck/d"; "b-c" sorts before "b/".
    let files = [
        "/ck/d/a",
        "/ck/d/b-c",
        "/ck/d/b/x",
        "/ck/d/b/y",
        "/ck/d/gone",
        "/ck/d/m/n/o",
        "/ck/e/z",
        "/ck/d-x",
    ];
    for (i, p) in files.iter().enumerate() {
        change(
            &mut t,
            commit(p, i as u128 + 1, 1, true),
            (i as u64 + 1) << 16,
        )
        .unwrap();
    }
    let made = ChangeOp::MakeDir {
        path: "/ck/d/empty".into(),
        mtime_ns: 1,
    };
    change(&mut t, made, 20 << 16).unwrap();
    let del = ChangeOp::Delete {
        path: "/ck/d/gone".into(),
        dir: false,
        expect: Expect::Any,
    };
    change(&mut t, del, 21 << 16).unwrap();
    // Each entry's own record, and the first live record beneath an implied directory only.
    let (all, more) = t.in_dir("/ck/d", "", 1000, 0).unwrap();
    assert!(!more);
    let paths: Vec<&str> = all.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "/ck/d/a",
            "/ck/d/b/x",
            "/ck/d/b-c",
            "/ck/d/empty",
            "/ck/d/gone",
            "/ck/d/m/n/o"
        ]
    );
    let (rest, more) = t.in_dir("/ck/d/", "empty", 1000, 0).unwrap();
    assert!(!more);
    let paths: Vec<&str> = rest.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, vec!["/ck/d/gone", "/ck/d/m/n/o"]);
    // A node with no record lists the directory as this one does once it took every page,
    // however small the pages.
    for max in [1, 2, 3, 1000] {
        let mut u = Records::new();
        let mut after = String::new();
        let mut pages = 0;
        loop {
            let (page, more) = t.in_dir("/ck/d", &after, max, 0).unwrap();
            pages += 1;
            assert!(
                !page.is_empty() && page.len() <= max.max(2),
                "max {max}: {page:?}"
            );
            for r in &page {
                u.apply(r.clone());
            }
            if !more {
                break;
            }
            let last = &page[page.len() - 1].path["/ck/d/".len()..];
            after = last.split('/').next().unwrap().to_string();
        }
        assert!(pages <= 6, "max {max}: {pages} pages");
        assert_eq!(
            entries_of(&u, "/ck/d"),
            entries_of(&t, "/ck/d"),
            "max {max}"
        );
    }
    // Same records of the entries, same digest: a record deep beneath an entry after its
    // first live one changes nothing a listing shows; a new time of an entry, a deletion or
    // a flush does.
    let copy = || {
        let mut u = Records::new();
        for r in t.in_dir("/ck/d", "", 1000, 0).unwrap().0 {
            u.apply(r);
        }
        u
    };
    let mut u = copy();
    assert_eq!(u.digest_in("/ck/d", ""), t.digest_in("/ck/d", ""));
    change(&mut u, commit("/ck/d/b/z", 50, 1, true), 30 << 16).unwrap();
    assert_eq!(u.digest_in("/ck/d", ""), t.digest_in("/ck/d", ""));
    assert_ne!(t.digest_in("/ck/d", ""), t.digest_in("/ck/d", "a"));
    assert_eq!(
        t.digest_in("/ck/d", "m"),
        Records::new().digest_in("/ck/d", "")
    );
    let mut v = copy();
    change(&mut v, commit("/ck/d/a", 51, 2, true), 31 << 16).unwrap();
    assert_ne!(v.digest_in("/ck/d", ""), t.digest_in("/ck/d", ""));
    let mut v = copy();
    let gone = ChangeOp::Delete {
        path: "/ck/d/m/n/o".into(),
        dir: false,
        expect: Expect::Any,
    };
    change(&mut v, gone, 32 << 16).unwrap();
    assert_ne!(v.digest_in("/ck/d", ""), t.digest_in("/ck/d", ""));
    let mut v = copy();
    flushed(&mut v, "/ck/d/a", "etag-a");
    assert_ne!(v.digest_in("/ck/d", ""), t.digest_in("/ck/d", ""));
    // An asker with the same digest is told so; one with another gets every record.
    let same = t.digest_in("/ck/d", "");
    assert_eq!(t.in_dir("/ck/d", "", 1000, same), None);
    assert_eq!(
        t.in_dir("/ck/d", "", 1000, same ^ 1),
        t.in_dir("/ck/d", "", 1000, 0)
    );
    // A node with no record of the entries answers none (not that it holds the same: the
    // asker's records there may be what it missed the deletions of).
    let none = Records::new().digest_in("/ck/nothing", "");
    for (dir, after) in [("/ck/nothing", ""), ("/ck/d", "m")] {
        assert_eq!(t.in_dir(dir, after, 1000, 0), Some((Vec::new(), false)));
        assert_eq!(t.in_dir(dir, after, 1000, none), None);
        assert_eq!(t.in_dir(dir, after, 1000, same), Some((Vec::new(), false)));
    }
    // The root's entries.
    let (root, _) = t.in_dir("/", "", 1000, 0).unwrap();
    assert_eq!(
        root.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
        vec!["/ck/d-x"]
    );
}

#[test]
fn applied_deletions_are_forgotten_after_they_are_kept_long_enough() {
    let mut t = Records::new();
    change(&mut t, commit("/ck/f", 1, 1, true), 1_000 << 16).unwrap();
    change(
        &mut t,
        ChangeOp::Delete {
            path: "/ck/f".into(),
            dir: false,
            expect: Expect::Any,
        },
        2_000 << 16,
    )
    .unwrap();
    // Pending in the store: kept however old.
    assert_eq!(forget_old(&mut t, 1_000_000, 10), 0);
    deletion_applied(&mut t, "/ck/f", 1);
    assert_eq!(forget_old(&mut t, 2_005, 10), 0);
    assert_eq!(forget_old(&mut t, 2_010, 10), 1);
    assert!(t.is_empty());
    assert_eq!(t.known("/ck"), Known::Unknown);
}

/// A file's new time changes its record's time only: its version, size, state and store
/// version stay, closed or flushed; another version, a directory or an unknown path refuse.
#[test]
fn a_new_time_changes_nothing_else_of_the_file() {
    let mut t = Records::new();
    let set = |path: &str, v: u128, at: i64| ChangeOp::SetTime {
        path: path.into(),
        version_tag: tag(v),
        mtime_ns: at,
    };
    let time_of = |t: &Records, path: &str| match &t.get(path).unwrap().entry {
        RecordEntry::File { mtime_ns, .. } => *mtime_ns,
        e => panic!("{e:?}"),
    };
    change(&mut t, commit("/a/f", 1, 5, true), 10).unwrap();
    change(&mut t, set("/a/f", 1, -7), 20).unwrap();
    assert_eq!(state_of(&t, "/a/f"), Some((tag(1), RecordState::Final, 5)));
    assert_eq!(time_of(&t, "/a/f"), -7);
    // The same time again is no change.
    assert!(matches!(
        t.plan(&set("/a/f", 1, -7), false),
        Ok(Plan::Nothing)
    ));
    flushed(&mut t, "/a/f", "s1");
    change(&mut t, set("/a/f", 1, 1_500_000_000), 30).unwrap();
    assert_eq!(time_of(&t, "/a/f"), 1_500_000_000);
    match &t.get("/a/f").unwrap().entry {
        RecordEntry::File {
            state, store_tag, ..
        } => assert_eq!((*state, store_tag.as_str()), (RecordState::Clean, "s1")),
        e => panic!("{e:?}"),
    }
    let code = |t: &Records, op: ChangeOp| t.plan(&op, false).err().map(|r| r.code);
    assert_eq!(code(&t, set("/a/f", 2, 9)), Some(ErrorCode::Changed));
    assert_eq!(code(&t, set("/a/g", 1, 9)), Some(ErrorCode::NotFound));
    assert_eq!(code(&t, set("/a", 1, 9)), Some(ErrorCode::NotFound));
    change(
        &mut t,
        ChangeOp::MakeDir {
            path: "/d".into(),
            mtime_ns: 0,
        },
        40,
    )
    .unwrap();
    assert_eq!(code(&t, set("/d", 1, 9)), Some(ErrorCode::IsDir));
    check_indexes(&t);
}

/// A directory made through the cluster takes a new time (an empty version names it); a
/// version there, a directory only implied by the paths beneath it, a file, and a removed
/// directory refuse.
#[test]
fn a_directory_made_through_the_cluster_takes_a_new_time() {
    let mut t = Records::new();
    let set = |path: &str, version_tag: String, mtime_ns: i64| ChangeOp::SetTime {
        path: path.into(),
        version_tag,
        mtime_ns,
    };
    let mkdir = ChangeOp::MakeDir {
        path: "/ck/d".into(),
        mtime_ns: 5,
    };
    change(&mut t, mkdir, 10).unwrap();
    change(&mut t, commit("/ck/a/f", 1, 5, true), 11).unwrap();
    change(
        &mut t,
        set("/ck/d", String::new(), 1_600_000_000_000_000_000),
        20,
    )
    .unwrap();
    assert_eq!(
        t.get("/ck/d").map(|r| &r.entry),
        Some(&RecordEntry::Dir {
            mtime_ns: 1_600_000_000_000_000_000
        })
    );
    assert!(matches!(
        t.plan(
            &set("/ck/d", String::new(), 1_600_000_000_000_000_000),
            false
        ),
        Ok(Plan::Nothing)
    ));
    let code = |t: &Records, op: ChangeOp| t.plan(&op, false).err().map(|r| r.code);
    assert_eq!(code(&t, set("/ck/d", tag(1), 9)), Some(ErrorCode::IsDir));
    assert_eq!(
        code(&t, set("/ck/a", String::new(), 9)),
        Some(ErrorCode::NotFound)
    );
    assert_eq!(
        code(&t, set("/ck", String::new(), 9)),
        Some(ErrorCode::NotFound)
    );
    assert_eq!(
        code(&t, set("/ck/a/f", String::new(), 9)),
        Some(ErrorCode::Changed)
    );
    let rmdir = ChangeOp::Delete {
        path: "/ck/d".into(),
        dir: true,
        expect: Expect::Any,
    };
    change(&mut t, rmdir, 30).unwrap();
    assert_eq!(
        code(&t, set("/ck/d", String::new(), 9)),
        Some(ErrorCode::NotFound)
    );
    check_indexes(&t);
}

/// A directory made through the cluster takes the change's time when an entry is made,
/// removed or renamed in it; a rewrite, a new time set on a file, a directory the change
/// itself makes, and directories the records do not make take none.
#[test]
fn a_directory_takes_a_new_time_when_its_entries_change() {
    let mut t = Records::new();
    let mut hlc = 10;
    // Plans `op`, adds the directories' times at `now`, applies; the directories whose
    // records the change set.
    let mut step = |t: &mut Records, op: ChangeOp, now: i64| -> Vec<String> {
        let Plan::Records(v) = t.plan(&op, false).unwrap() else {
            panic!("{op:?}: no records")
        };
        let v = t.with_parent_times(v, now);
        let dirs = v
            .iter()
            .filter(|r| r.entry == RecordEntry::Dir { mtime_ns: now })
            .map(|r| r.path.clone())
            .collect();
        hlc += 1;
        t.apply_batch(stamp(v, hlc, 1));
        dirs
    };
    let mkdir = |p: &str| ChangeOp::MakeDir {
        path: p.into(),
        mtime_ns: 5,
    };
    let time_of = |t: &Records, p: &str| match t.get(p).map(|r| &r.entry) {
        Some(RecordEntry::Dir { mtime_ns }) => *mtime_ns,
        other => panic!("{p}: {other:?}"),
    };
    // /ck is the mount's (no record): a directory made in it moves no time.
    assert!(step(&mut t, mkdir("/ck/d"), 100).is_empty());
    assert_eq!(step(&mut t, mkdir("/ck/d/e"), 200), ["/ck/d"]);
    assert_eq!(time_of(&t, "/ck/d"), 200);
    // A new file; the same file's later commit (a rewrite) moves nothing.
    assert_eq!(step(&mut t, commit("/ck/d/f", 1, 3, false), 300), ["/ck/d"]);
    assert!(step(&mut t, commit("/ck/d/f", 1, 9, true), 400).is_empty());
    assert!(step(&mut t, commit("/ck/d/f", 2, 9, true), 450).is_empty());
    assert_eq!(time_of(&t, "/ck/d"), 300);
    // A file's new time moves nothing.
    let set = ChangeOp::SetTime {
        path: "/ck/d/f".into(),
        version_tag: tag(2),
        mtime_ns: 1,
    };
    assert!(step(&mut t, set, 500).is_empty());
    // A rename moves both directories' times, once each.
    let rename = |from: &str, to: &str| ChangeOp::Rename {
        from: from.into(),
        to: to.into(),
        replace: true,
    };
    let mut both = step(&mut t, rename("/ck/d/f", "/ck/d/e/g"), 600);
    both.sort();
    assert_eq!(both, ["/ck/d", "/ck/d/e"]);
    assert_eq!(
        step(&mut t, rename("/ck/d/e/g", "/ck/d/e/h"), 700),
        ["/ck/d/e"]
    );
    // Removing a file, then the directory: each moves its parent's time.
    let rm = |p: &str, dir: bool| ChangeOp::Delete {
        path: p.into(),
        dir,
        expect: Expect::Any,
    };
    assert_eq!(step(&mut t, rm("/ck/d/e/h", false), 800), ["/ck/d/e"]);
    assert_eq!(time_of(&t, "/ck/d/e"), 800);
    assert_eq!(step(&mut t, rm("/ck/d/e", true), 900), ["/ck/d"]);
    assert_eq!(time_of(&t, "/ck/d"), 900);
    // A directory only implied by the files beneath it takes no time.
    assert!(step(&mut t, commit("/ck/i/f", 3, 1, true), 1000).is_empty());
    assert!(step(&mut t, commit("/ck/i/g", 4, 1, true), 1100).is_empty());
    assert!(t.get("/ck/i").is_none());
    check_indexes(&t);
}

/// Only a second flush of the same version, naming another store object, ranks as a restamp;
/// a commit, a seal or a flush of another version at the same rank never does.
#[test]
fn only_a_second_flush_of_a_version_is_a_restamp() {
    let mut t = Records::new();
    change(&mut t, commit("/a/f", 1, 5, true), 10).unwrap();
    let committed = t.get("/a/f").unwrap().clone();
    let with = |state: RecordState, version: u128, store: &str| {
        let mut r = committed.clone();
        if let RecordEntry::File {
            state: s,
            store_tag,
            version_tag,
            ..
        } = &mut r.entry
        {
            *s = state;
            *store_tag = store.into();
            *version_tag = tag(version);
        }
        r
    };
    assert_eq!(t.rank(&committed), Rank::Below);
    assert_eq!(t.rank(&with(RecordState::Clean, 1, "s1")), Rank::Above);
    flushed(&mut t, "/a/f", "s1");
    assert_eq!(t.rank(&with(RecordState::Clean, 1, "s1")), Rank::Below);
    assert_eq!(t.rank(&with(RecordState::Clean, 1, "s2")), Rank::Restamp);
    assert_eq!(t.rank(&with(RecordState::Clean, 1, "")), Rank::Below);
    assert_eq!(t.rank(&with(RecordState::Clean, 2, "s2")), Rank::Below);
    assert_eq!(t.rank(&with(RecordState::Sealed, 1, "s2")), Rank::Below);
    assert!(t.apply(with(RecordState::Clean, 1, "s2")));
    assert_eq!(t.rank(&with(RecordState::Clean, 1, "s1")), Rank::Restamp);
    check_indexes(&t);
}

/// Forgets what is settled at `now_ms`, as a node's sweep does. Returns how many went.
fn forget_old(t: &mut Records, now_ms: u64, keep_ms: u64) -> usize {
    let old = t.settled(now_ms, keep_ms);
    t.forget(&old, now_ms, keep_ms)
}

/// Marks the deletion of `path` (which held version `v`) applied to the store, as its
/// flusher does.
fn deletion_applied(t: &mut Records, path: &str, v: u128) {
    let mut done = t.get(path).unwrap().clone();
    done.entry = RecordEntry::Deleted {
        prev_tag: tag(v),
        pending: false,
    };
    t.apply(done);
}

/// Marks `path`'s file flushed (clean at store version `store`), as its flusher does.
fn flushed(t: &mut Records, path: &str, store: &str) {
    let mut clean = t.get(path).unwrap().clone();
    if let RecordEntry::File {
        state, store_tag, ..
    } = &mut clean.entry
    {
        *state = RecordState::Clean;
        *store_tag = store.into();
    }
    assert!(t.apply(clean));
}

#[test]
fn flushed_files_are_forgotten_after_they_are_kept_long_enough_dirty_ones_never() {
    let mut t = Records::new();
    change(&mut t, commit("/ck/a", 1, 1, true), 1_000 << 16).unwrap();
    change(&mut t, commit("/ck/b", 2, 1, true), 1_000 << 16).unwrap();
    change(&mut t, commit("/ck/c", 3, 1, false), 1_000 << 16).unwrap();
    flushed(&mut t, "/ck/a", "s1");
    assert_eq!(forget_old(&mut t, 1_005, 10), 0, "not kept long enough yet");
    // Only the flushed file goes: the closed one waiting for its flush and the open one stay,
    // however old.
    assert_eq!(forget_old(&mut t, 1_000_000, 10), 1);
    assert_eq!(t.known("/ck/a"), Known::Unknown);
    assert!(t.by_file(version_id(&tag(1))).is_none());
    assert_eq!(state_of(&t, "/ck/b"), Some((tag(2), RecordState::Final, 1)));
    assert_eq!(state_of(&t, "/ck/c"), Some((tag(3), RecordState::Open, 1)));
    // The path is the store's again: a new commit there takes it as any new path.
    change(&mut t, commit_if("/ck/a", 4, Expect::Absent), 2_000 << 16).unwrap();
    check_indexes(&t);
}

#[test]
fn a_peers_record_of_a_file_this_node_forgot_is_not_taken_back() {
    let keep = 10;
    let mut t = Records::new();
    change(&mut t, commit("/ck/a", 1, 1, true), 1_000 << 16).unwrap();
    flushed(&mut t, "/ck/a", "s1");
    let theirs = t.get("/ck/a").unwrap().clone();
    assert!(!t.forgotten_by_now(&theirs, 1_000_000, keep), "held here");
    assert_eq!(forget_old(&mut t, 1_000_000, keep), 1);
    assert!(t.forgotten_by_now(&theirs, 1_000_000, keep));
    // Not settled yet (kept for less than `keep`), or not flushed: taken.
    assert!(!t.forgotten_by_now(&theirs, 1_005, keep));
    let mut dirty = theirs.clone();
    if let RecordEntry::File { state, .. } = &mut dirty.entry {
        *state = RecordState::Final;
    }
    assert!(!t.forgotten_by_now(&dirty, 1_000_000, keep));
}

/// `op` (a commit) sent by a writer whose first commit was answered at position `since`.
fn later(mut op: ChangeOp, at: u64) -> ChangeOp {
    if let ChangeOp::Commit { since, .. } = &mut op {
        *since = at;
    }
    op
}

#[test]
fn a_writer_cannot_bring_back_a_version_whose_record_was_forgotten() {
    let mut t = Records::new();
    let keep = 10_000;
    change(&mut t, commit("/ck/a", 1, 1, false), 1_000 << 16).unwrap();
    change(&mut t, commit("/ck/d", 2, 1, false), 1_000 << 16).unwrap();
    // Sealed (its writer silent), flushed, then forgotten; /ck/d deleted, then forgotten.
    change(&mut t, commit("/ck/a", 1, 1, true), 2_000 << 16).unwrap();
    flushed(&mut t, "/ck/a", "s1");
    change(
        &mut t,
        ChangeOp::Delete {
            path: "/ck/d".into(),
            dir: false,
            expect: Expect::Any,
        },
        2_000 << 16,
    )
    .unwrap();
    deletion_applied(&mut t, "/ck/d", 2);
    // While the records are kept, a late commit changes nothing (or is refused as closed).
    let late_a = later(commit("/ck/a", 1, 5, false), 1_000 << 16);
    let late_d = later(commit("/ck/d", 2, 5, false), 1_000 << 16);
    assert_eq!(t.refuse_forgotten(&late_a, 30_000, keep), Ok(()));
    assert_eq!(t.plan(&late_a, false).unwrap_err().code, ErrorCode::Changed);
    assert_eq!(t.plan(&late_d, false), Ok(Plan::Nothing));
    // Their pages: /ck/a's version is closed, /ck/d's deleted; neither is taken for forgotten.
    let (id_a, id_d) = (version_id(&tag(1)), version_id(&tag(2)));
    for id in [id_a, id_d] {
        assert!(!t.takes_pages(id));
        assert!(!t.may_be_forgotten(id, 1_000 << 16, 30_000, keep));
    }
    assert_eq!(forget_old(&mut t, 30_000, keep), 2);
    assert!(t.is_empty());
    // Forgotten, their pages would be taken as those of writers before their first commit;
    // `since` (the same as the commits') says otherwise. Since 0 (no commit answered yet) or
    // less than the keep ago, they are taken.
    for id in [id_a, id_d] {
        assert!(t.takes_pages(id));
        assert!(t.may_be_forgotten(id, 1_000 << 16, 30_000, keep));
        assert!(t.may_be_forgotten(id, 20_000 << 16, 30_000, keep));
        assert!(!t.may_be_forgotten(id, 0, 30_000, keep));
        assert!(!t.may_be_forgotten(id, 20_001 << 16, 30_000, keep));
    }
    // Forgotten: the table alone would take them as new files; their `since` says they are
    // too old to be new.
    for op in [&late_a, &late_d] {
        assert!(matches!(t.plan(op, false), Ok(Plan::Records(_))));
        let e = t.refuse_forgotten(op, 30_000, keep).unwrap_err();
        assert_eq!(e.code, ErrorCode::Changed, "{op:?}");
        assert!(e.message.contains("--write-records-keep"), "{}", e.message);
    }
    // A first commit, one first answered less than the keep ago (a node that missed the
    // record), and a version the records know, are planned as usual.
    for op in [
        commit("/ck/a", 3, 1, false),
        later(commit("/ck/n", 4, 1, false), 25_000 << 16),
        later(commit("/ck/n", 4, 1, false), 20_001 << 16),
    ] {
        assert_eq!(t.refuse_forgotten(&op, 30_000, keep), Ok(()), "{op:?}");
    }
    change(&mut t, commit("/ck/k", 5, 1, false), 29_000 << 16).unwrap();
    let kept = later(commit("/ck/k", 5, 2, false), 1 << 16);
    assert_eq!(t.refuse_forgotten(&kept, 30_000, keep), Ok(()));
    assert_eq!(
        t.refuse_forgotten(
            &later(commit("/ck/k", 6, 2, false), 20_000 << 16),
            30_000,
            keep
        )
        .unwrap_err()
        .code,
        ErrorCode::Changed
    );
}

#[test]
fn a_full_table_refuses_new_paths_and_takes_changes_to_kept_ones() {
    let mut t = Records::new();
    t.set_limit(2);
    change(&mut t, commit("/ck/a", 1, 1, true), 1_000 << 16).unwrap();
    change(&mut t, commit("/ck/b", 2, 1, true), 1_000 << 16).unwrap();
    let full = |r: Result<Applied, Refused>| {
        let e = r.unwrap_err();
        assert_eq!(e.code, ErrorCode::Full, "{e:?}");
        assert!(e.message.contains("--write-records-max"), "{e:?}");
    };
    full(change(&mut t, commit("/ck/c", 3, 1, true), 1_100 << 16));
    full(change(
        &mut t,
        ChangeOp::MakeDir {
            path: "/ck/d".into(),
            mtime_ns: 0,
        },
        1_100 << 16,
    ));
    full(change(
        &mut t,
        ChangeOp::Rename {
            from: "/ck/a".into(),
            to: "/ck/c".into(),
            replace: false,
        },
        1_100 << 16,
    ));
    // Paths it keeps take new versions and deletions.
    change(&mut t, commit("/ck/a", 4, 7, true), 1_200 << 16).unwrap();
    assert_eq!(state_of(&t, "/ck/a"), Some((tag(4), RecordState::Final, 7)));
    let del = ChangeOp::Delete {
        path: "/ck/b".into(),
        dir: false,
        expect: Expect::Any,
    };
    change(&mut t, del, 1_200 << 16).unwrap();
    // Records from peers are taken whatever the bound (their nodes bound their own changes).
    let mut theirs = t.get("/ck/a").unwrap().clone();
    theirs.path = "/ck/e".into();
    theirs.hlc = 1_300 << 16;
    assert!(t.apply(theirs));
    assert_eq!(t.len(), 3);
    // Once flushed files' records are forgotten, new paths fit again.
    flushed(&mut t, "/ck/a", "s4");
    flushed(&mut t, "/ck/e", "s4");
    deletion_applied(&mut t, "/ck/b", 2);
    assert_eq!(forget_old(&mut t, 10_000, 10), 3);
    change(&mut t, commit("/ck/c", 3, 1, true), 10_000 << 16).unwrap();
    check_indexes(&t);
}

/// The records `op` plans on `t`, stamped as node `origin`'s change at `hlc`.
fn planned(t: &Records, op: ChangeOp, hlc: u64, origin: u128) -> Vec<FileRecord> {
    match t.plan(&op, false).unwrap() {
        Plan::Records(v) => stamp(v, hlc, origin),
        other => panic!("{op:?}: {other:?}"),
    }
}

/// Clock skew at a takeover. Node A, whose clock runs 30 s ahead, makes changes of `/ck/a`
/// that every node takes as they are made. Its next change reaches node X only, and A dies
/// before acknowledging it. Node N takes A's paths over 2 s later and commits a client's
/// change of `/ck/a` (acknowledged). When N and X pull each other's records, both keep the
/// acknowledged change: N's clock had followed A's, so N's stamp sorts after anything A
/// stamped before it died, seen by N or not.
#[test]
fn an_acknowledged_change_outranks_one_a_fast_owner_stamped_and_died() {
    let (skew, t0) = (30_000, 1_000_000);
    let (a_clock, n_clock) = (Hlc::new(), Hlc::new());
    let (mut a, mut x, mut n) = (Records::new(), Records::new(), Records::new());
    let (id_a, id_n) = (1, 3);
    let seen = planned(
        &a,
        commit("/ck/a", 1, 5, true),
        a_clock.tick(t0 + skew),
        id_a,
    );
    for t in [&mut a, &mut x, &mut n] {
        t.apply_batch(seen.clone());
    }
    for r in &seen {
        n_clock.observe_at(r.hlc, t0 + 1);
    }
    let unacked = planned(
        &a,
        commit("/ck/a", 2, 6, true),
        a_clock.tick(t0 + 500 + skew),
        id_a,
    );
    a.apply_batch(unacked.clone());
    x.apply_batch(unacked);
    assert_eq!(state_of(&x, "/ck/a"), Some((tag(2), RecordState::Final, 6)));
    let acked = planned(
        &n,
        commit("/ck/a", 3, 7, true),
        n_clock.tick(t0 + 2_500),
        id_n,
    );
    n.apply_batch(acked);
    let pull = |t: &Records| t.after("", 1_000).0;
    let (from_x, from_n) = (pull(&x), pull(&n));
    n.merge(from_x);
    x.merge(from_n);
    for t in [&n, &x] {
        assert_eq!(state_of(t, "/ck/a"), Some((tag(3), RecordState::Final, 7)));
    }
}

// -- convergence --------------------------------------------------------------------------

const PATHS: [&str; 5] = ["/m/a", "/m/b", "/m/d/c", "/m/d", "/m/e"];

#[derive(Clone, Debug)]
enum Step {
    Commit(usize, u128, bool),
    Rename(usize, usize),
    Delete(usize, bool),
    MakeDir(usize),
    Clean(usize),
    SetTime(usize, i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..PATHS.len(), 0u128..4, any::<bool>()).prop_map(|(p, t, l)| Step::Commit(p, t, l)),
        (0..PATHS.len(), 0..PATHS.len()).prop_map(|(a, b)| Step::Rename(a, b)),
        (0..PATHS.len(), any::<bool>()).prop_map(|(p, d)| Step::Delete(p, d)),
        (0..PATHS.len()).prop_map(Step::MakeDir),
        (0..PATHS.len()).prop_map(Step::Clean),
        (0..PATHS.len(), 0i64..3).prop_map(|(p, t)| Step::SetTime(p, t)),
    ]
}

/// Runs `steps` as changes on a sequencer table, returning every batch it made.
fn history(steps: &[Step]) -> (Records, Vec<Vec<FileRecord>>) {
    let mut t = Records::new();
    let mut batches = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let hlc = (i as u64 + 1) << 16;
        let op = match s {
            Step::Commit(p, v, last) => commit(PATHS[*p], *v, *v as u64, *last),
            Step::Rename(a, b) => ChangeOp::Rename {
                from: PATHS[*a].into(),
                to: PATHS[*b].into(),
                replace: true,
            },
            Step::Delete(p, dir) => ChangeOp::Delete {
                path: PATHS[*p].into(),
                dir: *dir,
                expect: Expect::Any,
            },
            Step::MakeDir(p) => ChangeOp::MakeDir {
                path: PATHS[*p].into(),
                mtime_ns: 0,
            },
            Step::SetTime(p, at) => match t.get(PATHS[*p]).map(|r| &r.entry) {
                Some(RecordEntry::File { version_tag, .. }) => ChangeOp::SetTime {
                    path: PATHS[*p].into(),
                    version_tag: version_tag.clone(),
                    mtime_ns: *at,
                },
                Some(RecordEntry::Dir { .. }) => ChangeOp::SetTime {
                    path: PATHS[*p].into(),
                    version_tag: String::new(),
                    mtime_ns: *at,
                },
                _ => continue,
            },
            Step::Clean(p) => {
                let Some(r) = t.get(PATHS[*p]).cloned() else {
                    continue;
                };
                let RecordEntry::File {
                    version_tag,
                    size,
                    mtime_ns,
                    transient,
                    attrs,
                    state: RecordState::Final | RecordState::Sealed,
                    ..
                } = r.entry
                else {
                    continue;
                };
                // A flush keeps the change's identity.
                let clean = FileRecord {
                    entry: RecordEntry::File {
                        version_tag,
                        size,
                        mtime_ns,
                        state: RecordState::Clean,
                        store_tag: format!("s{i}"),
                        transient,
                        attrs,
                    },
                    ..r
                };
                t.apply_batch(vec![clean.clone()]);
                batches.push(vec![clean]);
                continue;
            }
        };
        if let Ok(Plan::Records(v)) = t.plan(&op, false) {
            let v = stamp(v, hlc, (i % 3) as u128);
            t.apply_batch(v.clone());
            batches.push(v);
        }
        check_indexes(&t);
    }
    (t, batches)
}

/// The derived indexes equal a recount of the records.
fn check_indexes(t: &Records) {
    let mut implied: BTreeMap<String, u32> = BTreeMap::new();
    let mut by_file: HashMap<u128, Vec<String>> = HashMap::new();
    let mut deleted: HashMap<u128, Vec<String>> = HashMap::new();
    for r in t.iter() {
        match &r.entry {
            RecordEntry::File { version_tag, .. } => by_file
                .entry(version_id(version_tag))
                .or_default()
                .push(r.path.clone()),
            RecordEntry::Deleted { prev_tag, .. } if !prev_tag.is_empty() => deleted
                .entry(version_id(prev_tag))
                .or_default()
                .push(r.path.clone()),
            _ => {}
        }
        if is_live(r) {
            for a in ancestors(&r.path) {
                *implied.entry(a.to_string()).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(t.implied, implied, "implied directories");
    for (index, want, what) in [
        (&t.by_file, &mut by_file, "version index"),
        (&t.deleted, &mut deleted, "deleted versions"),
    ] {
        assert_eq!(index.len(), want.len(), "{what}");
        for (id, paths) in want.iter_mut() {
            let kept = index.get(id);
            // Several paths only in a vector, one without.
            assert!(
                !matches!(kept, Some(Paths::Many(v)) if v.len() < 2),
                "{what}: {kept:?}"
            );
            let mut got: Vec<String> = kept
                .map(|p| p.iter().map(String::from).collect())
                .unwrap_or_default();
            got.sort();
            paths.sort();
            assert_eq!(&got, paths, "{what}");
        }
    }
}

fn table_of(t: &Records) -> Vec<FileRecord> {
    t.iter().cloned().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// A node that takes the same records in another order, or twice, or in pieces, ends
    /// with the sequencer's table.
    #[test]
    fn replicas_converge_whatever_the_order(
        steps in proptest::collection::vec(step(), 1..40),
        seed in any::<u64>(),
    ) {
        let (t, batches) = history(&steps);
        let mut records: Vec<FileRecord> = batches.iter().flatten().cloned().collect();
        // Shuffle deterministically.
        let mut x = seed | 1;
        for i in (1..records.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            records.swap(i, (x as usize) % (i + 1));
        }
        let mut u = Records::new();
        for r in records.iter().chain(records.iter().take(records.len() / 2)) {
            u.apply(r.clone());
        }
        prop_assert_eq!(table_of(&u), table_of(&t));
        check_indexes(&u);
        // Pulling in pages gives the same table again.
        let mut w = Records::new();
        let mut after = String::new();
        loop {
            let (page, more) = t.after(&after, 2);
            w.merge(page.clone());
            match page.last() {
                Some(r) if more => after = r.path.clone(),
                _ => break,
            }
        }
        prop_assert_eq!(table_of(&w), table_of(&t));
    }
}
