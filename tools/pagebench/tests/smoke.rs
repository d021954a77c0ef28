//! Seconds-long runs of every pagebench target, so the harness cannot rot. Real measurements are
//! not part of the test suite (docs/BENCHMARKS.md).

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::process::Command;

fn pagebench(args: &[&str]) -> String {
    run(Command::new(env!("CARGO_BIN_EXE_pagebench")).args(args))
}

/// Runs `cmd`, which must succeed; returns its standard output.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

const SMALL: [&str; 10] = [
    "--size",
    "32M",
    "--page-size",
    "1M",
    "--shards",
    "2",
    "--qd",
    "2",
    "--seconds",
    "0.3",
];

#[test]
fn local_prints_every_workload_as_json() {
    let d = dir();
    let dir = d.path().to_str().unwrap();
    let mut args = vec!["local", "--dir", dir, "--json"];
    args.extend(SMALL);
    let out = pagebench(&args);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let rows = v.as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["write", "read", "read4k"]);
    for r in rows {
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        assert!(r["bytes_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Reads come only from the cache.
    assert_eq!(rows[1]["hit_ratio"].as_f64(), Some(1.0));
    // The 32 MiB write workload wrote exactly 32 MiB.
    assert_eq!(rows[0]["bytes"].as_u64(), Some(32 << 20));
}

#[test]
fn restart_reports_restored_pages() {
    let d = dir();
    let dir = d.path().to_str().unwrap();
    let out = pagebench(&[
        "restart",
        "--dir",
        dir,
        "--page-size",
        "64K",
        "--pages",
        "2000",
        "--shards",
        "2",
        "--qd",
        "4",
    ]);
    assert!(out.contains("restart: 2000 pages restored"), "{out}");
}

#[test]
fn compare_and_raw_against_fio() {
    if Command::new("fio").arg("--version").output().is_err() {
        // CI installs fio (.ci/run); on a machine without it this target cannot run.
        assert!(std::env::var_os("CI").is_none(), "fio is missing in CI");
        eprintln!("fio not installed: skipping the compare smoke test");
        return;
    }
    let d = dir();
    let dir = d.path().to_str().unwrap();
    let mut args = vec!["compare", "--dir", dir];
    args.extend(SMALL);
    let out = pagebench(&args);
    // write, write-full, read, read4k at the one depth given: fio both ways for each, the
    // faster marked as the reference.
    let ratios = out.lines().filter(|l| l.starts_with("  ratio")).count();
    assert_eq!(ratios, 4, "{out}");
    assert_eq!(out.matches("(plain)").count(), 4, "{out}");
    assert_eq!(
        out.matches("(--fixedbufs --registerfiles)").count(),
        4,
        "{out}"
    );
    assert_eq!(out.matches("<- reference").count(), 4, "{out}");
    assert!(
        out.contains("32 inserts into the full cache evicted 32 pages"),
        "{out}"
    );
    let mut args = vec!["raw", "--dir", dir, "--workloads", "read,read4k"];
    args.extend(SMALL);
    let out = pagebench(&args);
    // glommio's reads, then the same on a ring the thread drives itself, tuned and plain.
    for row in [
        "raw-read4k",
        "ring-read4k",
        "ring-plain-read4k",
        "ring-read ",
    ] {
        assert!(out.contains(row), "{row}: {out}");
    }
    args.push("--no-pin");
    let out = pagebench(&args);
    assert!(out.contains("ring-plain-read"), "{out}");
}

#[test]
fn compare_sweeps_depths_against_fio_at_its_best() {
    if Command::new("fio").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "fio is missing in CI");
        eprintln!("fio not installed: skipping the depth sweep smoke test");
        return;
    }
    let d = dir();
    let out = pagebench(&[
        "compare",
        "--dir",
        d.path().to_str().unwrap(),
        "--size",
        "16M",
        "--page-size",
        "1M",
        "--shards",
        "1",
        "--seconds",
        "0.2",
        "--qd",
        "1,4",
        "--workloads",
        "write-full,read4k",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let rows = v.as_array().unwrap();
    let got: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| (r["qd"].as_u64().unwrap(), r["workload"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            (1, "write-full"),
            (1, "read4k"),
            (4, "write-full"),
            (4, "read4k")
        ]
    );
    for r in rows {
        let runs = &r["fio_runs"];
        let plain = runs["plain"]["bytes_per_sec"].as_f64().unwrap();
        let fixed = runs["fixedbufs_registerfiles"]["bytes_per_sec"]
            .as_f64()
            .unwrap();
        assert!(plain > 0.0 && fixed > 0.0, "{r}");
        // The faster run is the reference, and the ratio is taken against it.
        let taken = if fixed > plain {
            "fixedbufs_registerfiles"
        } else {
            "plain"
        };
        assert_eq!(r["fio_taken"], taken, "{r}");
        assert_eq!(runs["taken"], taken, "{r}");
        let best = r["fio"]["bytes_per_sec"].as_f64().unwrap();
        assert_eq!(best, plain.max(fixed), "{r}");
        let ratio = r["ratio_bw"].as_f64().unwrap();
        let engine = r["bytes_per_sec"].as_f64().unwrap();
        assert!((ratio - engine / best).abs() < 1e-9 * ratio.max(1.0), "{r}");
    }
    // Into a full cache, every insert evicts.
    for r in rows.iter().filter(|r| r["workload"] == "write-full") {
        assert_eq!(r["ops"].as_u64(), Some(16), "{r}");
        assert_eq!(r["evictions"].as_u64(), Some(16), "{r}");
    }
    // The target for 4 KiB reads is set at depth 8 and beyond only.
    assert!(rows[1]["target"].is_null(), "{}", rows[1]);
}

#[test]
fn bad_arguments_are_refused_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_pagebench"))
        .args(["local", "--qd", "zero"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--qd"));
}

#[test]
fn net_reads_pages_over_quic_on_loopback() {
    let d = dir();
    let dir = d.path().to_str().unwrap();
    let mut args = vec!["net", "--dir", dir];
    args.extend(SMALL);
    let out = pagebench(&args);
    let row = out
        .lines()
        .find(|l| l.starts_with("pagestore (QUIC)"))
        .unwrap_or_else(|| panic!("{out}"));
    let mbps: f64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(mbps > 0.0, "{out}");
    assert!(out.contains("QUIC path MTU reached"), "{out}");
}

#[test]
fn scale_prints_a_row_per_shard_count() {
    let d = dir();
    let dir = d.path().to_str().unwrap();
    let out = pagebench(&[
        "scale",
        "--dir",
        dir,
        "--size",
        "16M",
        "--page-size",
        "1M",
        "--shards",
        "2",
        "--qd",
        "2",
        "--seconds",
        "0.2",
        "--workloads",
        "write,read4k",
    ]);
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("read4k")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].split_whitespace().nth(1) == Some("1")
            && rows[1].split_whitespace().nth(1) == Some("2"),
        "{out}"
    );
}

#[test]
fn cluster_runs_three_real_nodes_and_checks_every_byte() {
    let pagestored = tool("pagestored");
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pagebench"))
        .args(["cluster", "--dir", d.path().to_str().unwrap()])
        .args([
            "--size",
            "128M",
            "--page-size",
            "1M",
            "--shards",
            "1",
            "--qd",
            "4",
        ])
        .args(["--seconds", "0.3", "--ufs-latency-ms", "2"])
        .env("PAGESTORED", &pagestored)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "cold / ufs =",
        "hits 128 / misses 128",
        "every page read byte-exact",
        "warm random 4 KiB reads through the client",
        "warm random 128 KiB reads through the client",
        "local engine ceiling",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
}

/// One of pagestore's binaries next to pagebench (`cargo test --workspace` builds them all).
fn tool(name: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_BIN_EXE_pagebench")).with_file_name(name);
    assert!(
        p.exists(),
        "{} missing: build it with cargo build --workspace --bins",
        p.display()
    );
    p
}

/// Runs pagebench with the pagestore binaries it starts; returns standard output.
fn pagebench_with_tools(args: &[&str]) -> String {
    run(Command::new(env!("CARGO_BIN_EXE_pagebench"))
        .args(args)
        .env("PAGESTORED", tool("pagestored"))
        .env("PAGEFS", tool("pagefs"))
        .env("PAGES3", tool("pages3"))
        .env("PAGECTL", tool("pagectl")))
}

/// A tiny dataset: 4 flat files of 2 MiB, 2 episodes of 3 s, 1 MiB pages.
const DATASET: [&str; 12] = [
    "--size",
    "8M",
    "--file-size",
    "2M",
    "--episodes",
    "2",
    "--episode-secs",
    "3",
    "--frame-size",
    "4K",
    "--page-size",
    "1M",
];

/// The runs of a target mode's JSON document, by workload.
fn runs(out: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let runs = v["runs"].as_array().unwrap().clone();
    for r in &runs {
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        assert!(r["bytes_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["verified_ops"].as_u64().unwrap() > 0, "{r}");
        for q in ["p50", "p90", "p99", "p99.9", "max"] {
            assert!(r["latency_us"][q].as_f64().is_some(), "{r}");
        }
    }
    runs
}

fn workloads(runs: &[serde_json::Value]) -> Vec<&str> {
    runs.iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect()
}

/// FUSE needs root and /dev/fuse (CI has both); elsewhere the test is skipped.
fn fuse_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && std::path::Path::new("/dev/fuse").exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root with /dev/fuse"
        );
        eprintln!("no FUSE here (needs root and /dev/fuse): skipping");
    }
    ok
}

#[test]
fn gen_then_every_workload_straight_from_the_under_storage() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let root = d.path().join("ds");
    let mut args = vec!["gen", "--dir", root.to_str().unwrap()];
    args.extend(DATASET);
    let out = pagebench(&args);
    assert!(out.contains("wrote 6 files"), "{out}");
    // Again: everything is kept.
    let out = pagebench(&args);
    assert!(
        out.contains("wrote 0 files") && out.contains("kept 6"),
        "{out}"
    );
    let url = format!("file://{}", root.display());
    let out = pagebench(&[
        "ufs",
        "--ufs",
        &url,
        "--seconds",
        "0.2",
        "--readers",
        "2",
        "--page-size",
        "1M",
        "--zipf",
        "1.1",
        "--json",
    ]);
    let r = runs(&out);
    assert_eq!(
        workloads(&r),
        ["seq", "pages", "rand4k", "rand128k", "zipf", "episodes"]
    );
    // seq reads every byte of the flat files once.
    assert_eq!(r[0]["bytes"].as_u64(), Some(8 << 20));
    assert_eq!(r[2]["block"].as_u64(), Some(4096));
    assert!(
        r[5]["ranges_per_sample"].as_f64().unwrap() >= 5.0,
        "{}",
        r[5]
    );

    // The same dataset written through object_store (--ufs), and read as plain files.
    let url2 = format!("file://{}", d.path().join("ds2").display());
    let mut args = vec!["gen", "--ufs", url2.as_str()];
    args.extend(DATASET);
    args.extend(["--layout", "interleaved"]);
    pagebench(&args);
    let out = pagebench(&[
        "fuse",
        "--path",
        d.path().join("ds2").to_str().unwrap(),
        "--direct",
        "--workloads",
        "rand128k,episodes",
        "--readers",
        "1,3",
        "--seconds",
        "0.2",
        "--bytes",
        "4M",
        "--page-size",
        "1M",
        "--json",
    ]);
    let r = runs(&out);
    assert_eq!(
        workloads(&r),
        ["rand128k", "rand128k", "episodes", "episodes"]
    );
    assert_eq!(r[1]["readers"].as_u64(), Some(3));
    // Interleaved episodes: the proprioception window is several ranges.
    assert!(
        r[2]["ranges_per_sample"].as_f64().unwrap() > 5.0,
        "{}",
        r[2]
    );
}

#[test]
fn fuse_target_mounts_pagefs_over_a_warm_cluster() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut args = vec![
        "fuse",
        "--dir",
        d.path().to_str().unwrap(),
        "--shards",
        "1",
        "--seconds",
        "0.2",
        "--readers",
        "2",
        "--json",
    ];
    args.extend(DATASET);
    let out = pagebench_with_tools(&args);
    let r = runs(&out);
    assert_eq!(r.len(), 6);
    for run in &r {
        assert_eq!(run["target"], "fuse");
        // Warm: every page the mount asked for was a hit.
        assert_eq!(run["misses"].as_u64(), Some(0), "{run}");
        assert!(run["cpu_seconds_per_gb"]["nodes"].is_number(), "{run}");
        assert!(run["cpu_seconds_per_gb"]["frontend"].is_number(), "{run}");
    }
    assert!(
        !std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .contains(d.path().to_str().unwrap()),
        "the mount is gone afterwards"
    );
}

#[test]
fn s3_and_client_targets_over_a_local_cluster() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let dir = d.path().to_str().unwrap();
    let mut args = vec![
        "s3",
        "--dir",
        dir,
        "--shards",
        "1",
        "--seconds",
        "0.2",
        "--readers",
        "2",
        "--workloads",
        "seq,rand128k,episodes",
        "--json",
    ];
    args.extend(DATASET);
    let r = runs(&pagebench_with_tools(&args));
    assert_eq!(workloads(&r), ["seq", "rand128k", "episodes"]);
    assert!(r
        .iter()
        .all(|x| x["target"] == "s3" && x["hit_ratio"] == 1.0));
    let mut args = vec![
        "client",
        "--dir",
        dir,
        "--shards",
        "1",
        "--nodes",
        "2",
        "--seconds",
        "0.2",
        "--cold",
        "--workloads",
        "seq,zipf",
    ];
    args.extend(DATASET);
    let out = pagebench_with_tools(&args);
    assert!(out.contains("cold: the cache starts empty"), "{out}");
    let seq = out
        .lines()
        .find(|l| l.starts_with("client  seq"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        seq.ends_with("0.0%"),
        "a cold scan misses every page: {out}"
    );
    assert!(out.contains("all byte-exact"), "{out}");

    // The served path swept over shard counts: one row per count, the first one the base.
    let mut args = vec![
        "scale",
        "--client",
        "--dir",
        dir,
        "--shards",
        "2",
        "--seconds",
        "0.2",
        "--readers",
        "2",
        "--workloads",
        "rand128k",
    ];
    args.extend(DATASET);
    let out = pagebench_with_tools(&args);
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("rand128k")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows[0].ends_with("1.00"), "{out}");
}

#[test]
fn fusecmp_compares_the_mount_the_client_and_the_engine() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = pagebench_with_tools(&[
        "fusecmp",
        "--dir",
        d.path().to_str().unwrap(),
        "--size",
        "16M",
        "--file-size",
        "4M",
        "--page-size",
        "1M",
        "--shards",
        "1",
        "--seconds",
        "0.2",
    ]);
    for w in ["seq", "rand4k", "rand128k"] {
        for rd in ["1", "8"] {
            let row = out
                .lines()
                .find(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 6 && f[0] == w && f[1] == rd && f[5].ends_with('x')
                })
                .unwrap_or_else(|| panic!("no {w} x {rd} row in:\n{out}"));
            assert!(!row.contains(" - "), "every path measured: {row}");
        }
    }
    assert!(
        out.contains("sequential FUSE / client: 1 reader(s)"),
        "{out}"
    );
    assert!(
        out.contains("the client library and the engine: identical"),
        "{out}"
    );
}

#[test]
fn compare_times_a_preload_job() {
    if Command::new("fio").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "fio is missing in CI");
        eprintln!("fio not installed: skipping the preload smoke test");
        return;
    }
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = pagebench_with_tools(&[
        "compare",
        "--dir",
        d.path().to_str().unwrap(),
        "--workloads",
        "preload",
        "--manifest-files",
        "300",
        "--manifest-file-size",
        "16K",
        "--page-size",
        "1M",
        "--shards",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let p = &v["preload"];
    assert_eq!(p["files"].as_u64(), Some(300));
    let first = p["submission_to_first_page_secs"].as_f64().unwrap();
    let done = p["submission_to_completion_secs"].as_f64().unwrap();
    assert!(first > 0.0 && first <= done, "{p}");
    let all = p["submission_to_all_pages_cached_secs"].as_f64().unwrap();
    assert!(all >= first, "{p}");
    for k in [
        "ufs_read_bytes_per_sec",
        "disk_write_bytes_per_sec",
        "ratio_to_bound",
    ] {
        assert!(p[k].as_f64().unwrap() > 0.0, "{k}: {p}");
    }
    assert_eq!(p["sample_misses"].as_u64(), Some(0), "{p}");
}

#[test]
fn cluster_and_the_engine_targets_print_json() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let dir = d.path().to_str().unwrap();
    let out = pagebench_with_tools(&[
        "cluster",
        "--dir",
        dir,
        "--size",
        "32M",
        "--page-size",
        "1M",
        "--shards",
        "1",
        "--qd",
        "4",
        "--seconds",
        "0.2",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    // The cluster target writes 64 MiB files: one here, 64 pages.
    assert_eq!(v["counters"]["hits"].as_u64(), Some(64), "{v}");
    assert_eq!(v["passes"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["random"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["kill"]["byte_exact"], true, "{v}");
    let mut args = vec!["scale", "--dir", dir, "--workloads", "read4k", "--json"];
    args.extend(SMALL);
    let v: serde_json::Value = serde_json::from_str(pagebench(&args).trim()).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    let v: serde_json::Value = serde_json::from_str(
        pagebench(&[
            "restart",
            "--dir",
            dir,
            "--page-size",
            "64K",
            "--pages",
            "500",
            "--shards",
            "1",
            "--json",
        ])
        .trim(),
    )
    .unwrap();
    assert_eq!(v["pages_restored"].as_u64(), Some(500), "{v}");
}

#[test]
fn fanout_reads_one_file_once_from_the_store_for_every_reader() {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = pagebench_with_tools(&[
        "fanout",
        "--dir",
        d.path().to_str().unwrap(),
        "--size",
        "12M",
        "--page-size",
        "1M",
        "--shards",
        "1",
        "--readers",
        "3,9",
        "--seconds",
        "0.2",
        "--ufs-latency-ms",
        "2",
        "--ufs-mbps",
        "100",
        "--verify",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let size = 12u64 << 20;
    assert_eq!(v["direct"].as_array().unwrap().len(), 2, "{v}");
    let passes = v["passes"].as_array().unwrap();
    // Without and with the memory tier and hot-page replicas: readers 3 and 9, cold and warm,
    // and the hot-page pass with 9 readers.
    assert_eq!(passes.len(), 4 * 5, "{v}");
    let page = 1u64 << 20;
    for p in passes {
        let readers = p["readers"].as_u64().unwrap();
        let name = p["name"].as_str().unwrap();
        let replicas = p["replicas"] == true;
        let served: u64 = p["node_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum();
        assert_eq!(p["client_fallbacks"].as_u64(), Some(0), "{p}");
        assert_eq!(p["client_store_bytes"].as_u64(), Some(0), "{p}");
        if name.starts_with("hot page") {
            // One page read again and again: from its owner alone without replicas (one node
            // of three serves everything), spread over the nodes with them.
            assert_eq!(readers, 9, "{p}");
            let bytes = p["bytes"].as_u64().unwrap();
            assert!(bytes > 0 && bytes % page == 0, "{p}");
            assert_eq!(p["store_bytes"].as_u64(), Some(0), "{p}");
            let balance = p["node_max_over_mean"].as_f64().unwrap();
            if replicas {
                assert!(p["hot_reads"].as_u64().unwrap() > 0, "{p}");
                assert!(balance < 3.0, "{p}");
            } else {
                assert_eq!(p["hot_reads"].as_u64(), Some(0), "{p}");
                assert_eq!(balance, 3.0, "{p}");
            }
            continue;
        }
        assert_eq!(p["bytes"].as_u64(), Some(readers * size), "{p}");
        let cold = name.starts_with("cold");
        let store = p["store_bytes"].as_u64().unwrap();
        assert_eq!(store, if cold { size } else { 0 }, "{p}");
        // With replicas the nodes also served copies of pages that turned hot to each other.
        if replicas {
            assert!(served >= readers * size && served % page == 0, "{p}");
        } else {
            assert_eq!(served, readers * size, "{p}");
        }
        if p["memory_tier"] == true && !cold {
            assert!(p["memory_hits"].as_u64().unwrap() > 0, "{p}");
        }
    }
    let shard = v["same_shard"].as_array().unwrap();
    assert_eq!(shard.len(), 2, "{v}");
    assert!(shard[0]["disk_hits"].as_u64().unwrap() > 0, "{v}");
    assert!(shard[1]["memory_hits"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["memory_over_disk_same_shard"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert_eq!(v["completion_ratios"].as_array().unwrap().len(), 20, "{v}");
}

#[test]
fn checkpoint_writes_back_and_flushes_against_the_store_and_fio() {
    if Command::new("fio").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "fio is missing in CI");
        eprintln!("fio not installed: skipping the checkpoint smoke test");
        return;
    }
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    // Two writers of 20 MiB: a multipart write of two parts each, straight and in the flush;
    // R = 1 and R = 2 on two nodes; a fast emulated store.
    let out = pagebench_with_tools(&[
        "checkpoint",
        "--dir",
        d.path().to_str().unwrap(),
        "--size",
        "40M",
        "--writers",
        "2",
        "--nodes",
        "2",
        "--page-size",
        "1M",
        "--shards",
        "1",
        "--ufs-latency-ms",
        "1",
        "--ufs-mbps",
        "400",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["setup"]["bytes"].as_u64(), Some(40 << 20), "{v}");
    let refs = &v["references"];
    let straight = refs["store_straight"].as_array().unwrap();
    assert_eq!(straight.len(), 2, "{v}");
    for r in straight.iter().chain([&refs["store_unthrottled"]]) {
        assert!(r["bytes_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["blocked_secs"].as_array().unwrap().len(), 2, "{r}");
    }
    assert!(refs["fio_write"]["bytes_per_sec"].as_f64().unwrap() > 0.0);
    let legs = v["legs"].as_array().unwrap();
    let names: Vec<&str> = legs.iter().map(|l| l["name"].as_str().unwrap()).collect();
    for want in [
        "client, R=1",
        "client, R=1, un-throttled store",
        "client, R=2",
        "client, R=2, un-throttled store",
    ] {
        assert!(names.contains(&want), "{want} missing: {names:?}");
    }
    for l in legs {
        assert_eq!(l["blocked_secs"].as_array().unwrap().len(), 2, "{l}");
        assert!(l["blocked_secs_max"].as_f64().unwrap() > 0.0, "{l}");
        for k in ["parts_in_flight", "one_part_in_flight"] {
            assert!(
                l["blocked_shorter_than_store"][k].as_f64().unwrap() > 0.0,
                "{l}"
            );
        }
        assert!(l["over_fio"].as_f64().unwrap() > 0.0, "{l}");
        assert!(
            l["cpu_seconds_per_gb"]["nodes"].as_f64().unwrap() > 0.0,
            "{l}"
        );
        let f = &l["flush"];
        assert_eq!(f["bytes"].as_u64(), Some(40 << 20), "{l}");
        assert!(f["secs"].as_f64().unwrap() > 0.0, "{l}");
        assert!(f["over_store"].as_f64().unwrap() > 0.0, "{l}");
    }
    // pagefs: a leg of its own where the build takes writes, a note where it does not.
    let notes = v["notes"].as_array().unwrap();
    for r in [1, 2] {
        let leg = names.contains(&format!("pagefs, R={r}").as_str());
        let noted = notes.iter().any(|n| {
            let n = n.as_str().unwrap();
            n.starts_with("pagefs: ") && n.contains(&format!("(R={r}"))
        });
        assert!(leg != noted, "R={r}: {names:?} {notes:?}");
        if fuse_available() && !leg {
            assert!(
                notes.iter().any(|n| n
                    .as_str()
                    .unwrap()
                    .starts_with("pagefs: writes not supported by this build")),
                "{notes:?}"
            );
        }
    }
    assert_eq!(v["byte_exact"], true);
    // Nothing is left behind: no data, no mount.
    assert!(!d.path().join("checkpoint").exists());
    assert!(!std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(d.path().to_str().unwrap()));
}

#[test]
fn smallfiles_reads_every_file_through_every_path_and_preloads_them() {
    if Command::new("fio").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "fio is missing in CI");
        eprintln!("fio not installed: skipping the smallfiles smoke test");
        return;
    }
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let (files, size) = (150u64, 8192u64);
    let out = pagebench_with_tools(&[
        "smallfiles",
        "--dir",
        d.path().to_str().unwrap(),
        "--files",
        "150",
        "--file-size",
        "8K",
        "--parallel",
        "4",
        "--nodes",
        "1",
        "--shards",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["files"].as_u64(), Some(files), "{v}");
    assert_eq!(v["byte_exact"], true);
    let paths = v["paths"].as_array().unwrap();
    let names: Vec<&str> = paths
        .iter()
        .map(|p| p["target"].as_str().unwrap())
        .collect();
    let mut want = vec!["direct", "client-cold", "client-warm", "client-written"];
    if fuse_available() {
        want.push("pagefs-warm");
    }
    want.push("pages3-warm");
    assert_eq!(names, want, "{v}");
    for p in paths {
        // Every file opened, stat'ed, read whole and checked, once.
        assert_eq!(p["files"].as_u64(), Some(files), "{p}");
        assert_eq!(p["bytes"].as_u64(), Some(files * size), "{p}");
        assert_eq!(p["verified_ops"].as_u64(), Some(files), "{p}");
        assert_eq!(p["readers"].as_u64(), Some(4), "{p}");
        assert!(p["files_per_sec"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["vs_direct"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["latency_us"]["p99"].as_f64().unwrap() > 0.0, "{p}");
    }
    assert_eq!(paths[0]["vs_direct"].as_f64(), Some(1.0));
    // The written copy's directory lists the same names as the dataset's (checked by the
    // run), timed.
    let setup = v["setup"].as_array().unwrap();
    assert!(
        setup.iter().any(|n| n
            .as_str()
            .unwrap()
            .starts_with("listings: the dataset's 1 director")),
        "{v}"
    );
    // Cold: every file's page a miss; warm: every one a hit.
    assert_eq!(paths[1]["misses"].as_u64(), Some(files), "{}", paths[1]);
    for p in &paths[2..] {
        assert_eq!(p["hit_ratio"].as_f64(), Some(1.0), "{p}");
        assert_eq!(p["misses"].as_u64(), Some(0), "{p}");
    }
    // The preload of the same files, timed, against its references.
    let pl = &v["preload"];
    assert_eq!(pl["files"].as_u64(), Some(files), "{pl}");
    assert_eq!(pl["bytes"].as_u64(), Some(files * size), "{pl}");
    let first = pl["submission_to_first_page_secs"].as_f64().unwrap();
    let done = pl["submission_to_completion_secs"].as_f64().unwrap();
    assert!(first > 0.0 && first <= done, "{pl}");
    assert!(pl["ratio_to_bound"].as_f64().unwrap() > 0.0, "{pl}");
    let disk = &pl["disk_write_fio"];
    let best = pl["disk_write_bytes_per_sec"].as_f64().unwrap();
    let (plain, fixed) = (
        disk["plain"]["bytes_per_sec"].as_f64().unwrap(),
        disk["fixedbufs_registerfiles"]["bytes_per_sec"]
            .as_f64()
            .unwrap(),
    );
    assert_eq!(best, plain.max(fixed), "{pl}");
    assert_eq!(pl["sample_misses"].as_u64(), Some(0), "{pl}");
    // Nothing is left running or mounted; the caches are gone.
    assert!(!std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(d.path().to_str().unwrap()));
    assert!(!d.path().join("smallfiles").join("nodes").exists());
    assert!(!d
        .path()
        .join("smallfiles")
        .join("preload")
        .join("nodes")
        .exists());
}
