//! Certificate roles with real processes: `pagectl cert issue` makes reader and writer
//! certificates from the cluster CA; a reader reads but cannot drop what others read; a writer
//! can; clear errors for a missing role or CA key.
#![allow(clippy::unwrap_used)]

mod common;

use common::{bytes, Cluster};

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn readers_read_writers_invalidate_and_certificates_come_from_pagectl() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let content = bytes(5, 3 << 20);
    std::fs::write(data.join("f"), &content).unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    s.nodes = 2;
    s.mtls = true;
    let c = Cluster::start(dir, s);
    let ca = c.ca_dir.to_str().unwrap().to_string();
    let reader = c.dir.path().join("reader");
    let writer = c.dir.path().join("writer");
    let (reader_dir, writer_dir) = (reader.to_str().unwrap(), writer.to_str().unwrap());

    let out = c.pagectl(&["cert", "issue", "--role", "reader", reader_dir]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("reader certificate"), "{}", text(&out));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(reader.join("client-key.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        !reader.join("ca-key.pem").exists(),
        "the CA key is not handed out"
    );
    let out = c.pagectl(&["cert", "issue", "--role", "writer", writer_dir]);
    assert!(out.status.success(), "{}", text(&out));

    // The reader reads (the cluster requires certificates: its own is enough).
    let out = c.pagectl(&["--tls-dir", reader_dir, "cat", "/data/f"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == content, "the reader got other bytes");
    // It cannot drop what the cluster caches for everyone, and is told why.
    let out = c.pagectl(&["--tls-dir", reader_dir, "free", "/data"]);
    assert!(
        !out.status.success(),
        "a reader freed pages: {}",
        text(&out)
    );
    assert!(text(&out).contains("writer role"), "{}", text(&out));
    // Every node counted the refusals it answered (each shard is asked to invalidate).
    let refused: f64 = c
        .nodes
        .iter()
        .map(|n| {
            let admin = n.admin.as_deref().unwrap();
            let (code, text) =
                pagestore_testkit::local_cluster::http_get(admin, "/metrics").unwrap();
            assert_eq!(code, 200);
            text.lines()
                .filter(|l| l.starts_with("pagestore_forbidden_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum();
    assert!(
        refused >= 4.0,
        "2 nodes x 2 shards refused, /metrics shows {refused}"
    );
    // The pages it could not drop are still hits for the next reader.
    let out = c.pagectl(&["--tls-dir", reader_dir, "cat", "/data/f"]);
    assert!(out.stdout == content);
    // A writer may.
    let out = c.pagectl(&["--tls-dir", writer_dir, "free", "/data"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("freed 3 cached pages"),
        "{}",
        text(&out)
    );

    // Clear errors: no role, an unknown role, no CA key where the certificate is issued from.
    let out = c.pagectl(&["cert", "issue", reader_dir]);
    assert!(
        !out.status.success() && text(&out).contains("--role"),
        "{}",
        text(&out)
    );
    let out = c.pagectl(&["cert", "issue", "--role", "root", reader_dir]);
    assert!(
        !out.status.success() && text(&out).contains("expected reader"),
        "{}",
        text(&out)
    );
    let elsewhere = c.dir.path().join("elsewhere");
    let out = c.pagectl(&[
        "--tls-dir",
        reader_dir,
        "cert",
        "issue",
        "--role",
        "admin",
        elsewhere.to_str().unwrap(),
    ]);
    assert!(
        !out.status.success() && text(&out).contains("ca-key.pem"),
        "{}",
        text(&out)
    );
    assert!(!elsewhere.exists());
    // Issuing over an existing certificate is refused rather than silently replacing it.
    let out = c.pagectl(&[
        "--tls-dir",
        &ca,
        "cert",
        "issue",
        "--role",
        "admin",
        reader_dir,
    ]);
    assert!(
        !out.status.success() && text(&out).contains("already"),
        "{}",
        text(&out)
    );
}

/// Off loopback, `pagestored` requires client certificates by default: a node listening on a
/// non-loopback address (10.77.0.1, in a network namespace of the test's own, so nothing
/// outside the machine can reach it) refuses a client without a certificate and says why, and
/// serves one with a reader certificate issued by `pagectl cert issue`.
#[test]
fn off_loopback_a_node_requires_client_certificates_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let script = format!(
        r#"set -e
ip link set lo up
ip addr add 10.77.0.1/32 dev lo
mkdir -p {d}/data {d}/anon
echo hello > {d}/data/f
{stored} --listen 10.77.0.1:7400 --admin off --cache-dir {d}/cache --cache-size 64M \
  --page-size 64K --shards 1 --no-pin --mount /data=file://{d}/data > {d}/log 2>&1 &
node=$!
trap 'kill $node 2>/dev/null' EXIT
for i in $(seq 100); do [ -f {d}/cache/tls/node-key.pem ] && break; sleep 0.1; done
cp {d}/cache/tls/ca-cert.pem {d}/anon/
for i in $(seq 50); do
  {ctl} --cluster 10.77.0.1:7400 --tls-dir {d}/cache/tls stat /data/f >/dev/null 2>&1 && break
  sleep 0.2
done
if {ctl} --cluster 10.77.0.1:7400 --tls-dir {d}/anon cat /data/f; then echo ANONYMOUS-SERVED; fi
{ctl} --tls-dir {d}/cache/tls cert issue --role reader {d}/reader >/dev/null
echo "READER:$({ctl} --cluster 10.77.0.1:7400 --tls-dir {d}/reader cat /data/f)"
"#,
        stored = common::PAGESTORED,
        ctl = common::PAGECTL,
    );
    let out = std::process::Command::new("unshare")
        .args(["--net", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let t = text(&out);
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    assert!(out.status.success(), "{t}\nnode log:\n{log}");
    assert!(!t.contains("ANONYMOUS-SERVED"), "{t}");
    assert!(
        t.contains("the node requires a client certificate from the cluster CA"),
        "{t}"
    );
    assert!(t.contains("READER:hello"), "{t}\nnode log:\n{log}");
}
