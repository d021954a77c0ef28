//! Seconds-long runs of every pagebench target, so the harness cannot rot. Real measurements are
//! not part of the test suite (docs/BENCHMARKS.md).

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::process::Command;

fn pagebench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pagebench"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "pagebench {args:?} failed:\n{stdout}\n{}",
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
    assert_eq!(out.matches("  ratio").count(), 3, "{out}");
    let mut args = vec!["raw", "--dir", dir, "--workloads", "read,read4k"];
    args.extend(SMALL);
    let out = pagebench(&args);
    assert!(out.contains("raw-read4k"), "{out}");
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
    // `cargo test --workspace` builds pagestored next to pagebench.
    let pagestored =
        std::path::Path::new(env!("CARGO_BIN_EXE_pagebench")).with_file_name("pagestored");
    assert!(
        pagestored.exists(),
        "{} missing: build it with cargo build -p pagestore-tools",
        pagestored.display()
    );
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
