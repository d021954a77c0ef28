//! `pagestored` on its own: the embedded default (a data directory and a cache under
//! `PAGESTORE_HOME`), the TOML config file with flags overriding it, configuration errors, and
//! the daemon as a library type (`pagestore_tools::daemon::Daemon`) in this process.
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use common::{PAGECTL, PAGESTORED};

struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts pagestored and returns it with the lines it printed up to "ready".
fn start(home: &std::path::Path, args: &[&str]) -> (Daemon, Vec<String>) {
    let mut child = Command::new(PAGESTORED)
        .args(args)
        .env("PAGESTORE_HOME", home)
        .env("PAGESTORE_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for l in BufReader::new(out).lines() {
            let l = l.unwrap();
            let ready = l.starts_with("ready");
            lines.push(l);
            if ready {
                let _ = tx.send(lines.clone());
            }
        }
    });
    let lines = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    (Daemon(child), lines)
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn the_embedded_default_serves_its_data_directory() {
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let port = free_udp_port();
    let listen = format!("127.0.0.1:{port}");
    let (_d, lines) = start(
        home.path(),
        &[
            "--listen", &listen, "--shards", "1", "--no-pin", "--admin", "off",
        ],
    );
    let text = lines.join("\n");
    assert!(
        text.contains(&format!("/data <- file://{}/data", home.path().display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}/cache", home.path().display())),
        "{text}"
    );
    // pagectl finds the node's CA through PAGESTORE_HOME, like a user on that machine.
    let out = Command::new(PAGECTL)
        .args(["--cluster", &listen, "cat", "/data/README.txt"])
        .env("PAGESTORE_HOME", home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("pagectl cat /data/NAME"));
}

/// `n` `--mount` flags, `/m0` to `/m{n-1}`, each an anonymous S3 bucket (opened without
/// reaching it).
fn many_mounts(n: usize) -> Vec<String> {
    (0..n)
        .flat_map(|i| {
            [
                "--mount".to_string(),
                format!("/m{i}=s3://b?endpoint=http://127.0.0.1:1&anonymous=true"),
            ]
        })
        .collect()
}

#[test]
fn a_mount_table_clients_can_receive_serves_and_a_larger_one_is_refused_at_start() {
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    // 256 mounts (MAX_MOUNTS): the node starts and clients receive the whole table.
    let port = free_udp_port();
    let listen = format!("127.0.0.1:{port}");
    let mounts = many_mounts(256);
    let mut args: Vec<&str> = vec![
        "--listen", &listen, "--shards", "1", "--no-pin", "--admin", "off",
    ];
    args.extend(mounts.iter().map(String::as_str));
    let (d, _) = start(home.path(), &args);
    let out = Command::new(PAGECTL)
        .args(["--cluster", &listen, "ls", "/"])
        .env("PAGESTORE_HOME", home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for i in [0, 100, 255] {
        assert!(text.contains(&format!("m{i}/")), "m{i} missing from {text}");
    }
    drop(d);
    // 257: refused at start, naming the limit (before, the node started and every client
    // then failed with "response encoding failed").
    let out = Command::new(PAGESTORED)
        .args([
            "--listen", &listen, "--shards", "1", "--no-pin", "--admin", "off",
        ])
        .args(many_mounts(257))
        .env("PAGESTORE_HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("257 mounts, at most MAX_MOUNTS = 256"), "{e}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
}

#[test]
fn a_config_file_sets_everything_and_flags_win() {
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let data = home.path().join("elsewhere");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("x"), "from the config's mount").unwrap();
    let (p1, p2) = (free_udp_port(), free_udp_port());
    let cfg = home.path().join("pagestored.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dirs = [\"{}/c\"]\ncache_size = \"256M\"\npage_size = \"1M\"\nshards = 1\n\
             policy = \"s3fifo\"\nlisten = \"127.0.0.1:{p1}\"\nadmin = \"off\"\npin = false\n\
             [mounts]\n\"/cfg\" = \"file://{}\"\n",
            home.path().display(),
            data.display()
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{p2}");
    let (_d, lines) = start(
        home.path(),
        &["--config", cfg.to_str().unwrap(), "--listen", &listen],
    );
    let text = lines.join("\n");
    assert!(
        text.contains(&format!("UDP ports {p2}-{p2}")),
        "the flag wins: {text}"
    );
    assert!(text.contains("/cfg <- file://"), "{text}");
    let out = Command::new(PAGECTL)
        .args(["--cluster", &listen, "--tls-dir"])
        .arg(home.path().join("c/tls"))
        .args(["cat", "/cfg/x"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from the config's mount"
    );
}

#[test]
fn configuration_errors_are_clear_and_exit_2() {
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(PAGESTORED)
            .args(args)
            .env("PAGESTORE_HOME", home.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let bad = home.path().join("bad.toml");
    std::fs::write(&bad, "bogus = 1\n").unwrap();
    assert!(run(&["--config", bad.to_str().unwrap()]).contains("unknown field `bogus`"));
    assert!(run(&["--config", "/nonexistent.toml"]).contains("cannot read config file"));
    assert!(run(&["--policy", "mru"]).contains("use lru or s3fifo"));
    assert!(run(&["--mount", "data=file:///tmp"]).contains("must start with /"));
    assert!(
        run(&["--mount", "/s3=s3://bucket?endpoint=http://127.0.0.1:1"]).contains("no credentials")
    );
    assert!(run(&["--frobnicate"]).contains("unknown argument"));
    let members = home.path().join("members");
    std::fs::write(
        &members,
        "00000000-0000-4000-8000-000000000001 127.0.0.1:1 1\n",
    )
    .unwrap();
    let e = run(&[
        "--members",
        members.to_str().unwrap(),
        "--no-pin",
        "--admin",
        "off",
    ]);
    assert!(e.contains("does not list this node; add the line"), "{e}");
    let e = run(&[
        "--members",
        members.to_str().unwrap(),
        "--listen",
        "0.0.0.0:7400",
    ]);
    assert!(e.contains("listen on this node's own IP"), "{e}");
    // Membership in etcd: clear errors for bad settings and an etcd that does not answer.
    let e = run(&["--etcd", "http://127.0.0.1:2379"]);
    assert!(e.contains("etcd://HOST:PORT"), "{e}");
    let e = run(&[
        "--etcd",
        "etcd://127.0.0.1:1",
        "--members",
        members.to_str().unwrap(),
    ]);
    assert!(e.contains("choose one"), "{e}");
    assert!(run(&["--ring-mode", "static"]).contains("needs --etcd"));
    let e = run(&["--etcd", "etcd://127.0.0.1:1", "--ring-mode", "sometimes"]);
    assert!(e.contains("use dynamic or static"), "{e}");
    assert!(run(&["--etcd", "etcd://127.0.0.1:1", "--lease-ttl", "1"]).contains("2 to 3600"));
    let e = run(&[
        "--etcd",
        "etcd://127.0.0.1:1/test",
        "--no-pin",
        "--admin",
        "off",
    ]);
    assert!(
        e.contains("etcd unreachable") && e.contains("check --etcd"),
        "{e}"
    );
    // The same settings from the config file.
    let cfg = home.path().join("etcd.toml");
    std::fs::write(
        &cfg,
        "etcd = \"etcd://127.0.0.1:1/test\"\nring_mode = \"static\"\nlease_ttl = 5\n\
         admin = \"off\"\npin = false\n",
    )
    .unwrap();
    let e = run(&["--config", cfg.to_str().unwrap()]);
    assert!(e.contains("etcd unreachable"), "{e}");
}

/// The daemon as a library type: started in this process over a temporary directory, read
/// through a client byte-exact, stopped, and started again on the same directory.
#[test]
fn the_daemon_runs_in_process_and_stops_cleanly() {
    use pagestore_client::{tls::client_config, Client, ClientOptions, ClusterSource};
    use pagestore_tools::daemon::{AdminAddr, Daemon, Settings, Size};

    let base = std::env::var("PAGESTORE_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let want = common::bytes(7, (3 << 20) + 12_345);
    std::fs::write(data.join("f"), &want).unwrap();
    let port = free_udp_port();
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let settings = Settings {
        cache_dirs: Some(vec![dir.path().join("cache")]),
        cache_size: Some(Size(64 << 20)),
        page_size: Some(Size(1 << 20)),
        shards: Some(1),
        mounts: Some(vec![("/d".into(), format!("file://{}", data.display()))]),
        listen: Some(listen),
        admin: Some(AdminAddr::At("127.0.0.1:0".parse().unwrap())),
        pin: Some(false),
        ..Settings::default()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let read = |d: &Daemon| {
        let tls = client_config(d.tls_dir()).unwrap();
        let source = ClusterSource::Addr(d.listen());
        let options = ClientOptions {
            fallback: false,
            ..ClientOptions::default()
        };
        rt.block_on(async {
            let c = Client::connect(&source, tls, None, options).await.unwrap();
            c.read("/d/f", 0..u64::MAX).await.unwrap()
        })
    };

    let d = Daemon::start(settings.clone()).unwrap();
    assert_eq!((d.listen(), d.shards()), (listen, 1));
    assert!(d.banner().contains("/d <- file://"), "{}", d.banner());
    let admin = d.admin_addr().unwrap();
    assert!(read(&d) == want, "byte-exact through the node");
    let metrics = http_get(admin, "/metrics");
    assert!(
        counter(&metrics, "pagestore_misses_total") >= 4,
        "{metrics}"
    );
    let id = d.node_id();
    d.stop().unwrap();

    // Stopped: its UDP port and admin port are free again.
    std::net::UdpSocket::bind(listen).unwrap();
    std::net::TcpListener::bind(admin).unwrap();

    // Started again on the same directory: the same node, its cache warm.
    let d = Daemon::start(settings).unwrap();
    assert_eq!(d.node_id(), id);
    assert!(read(&d) == want);
    let metrics = http_get(d.admin_addr().unwrap(), "/metrics");
    assert!(counter(&metrics, "pagestore_hits_total") >= 4, "{metrics}");
    assert_eq!(counter(&metrics, "pagestore_misses_total"), 0, "{metrics}");
    d.stop().unwrap();
}

/// The body of `GET path` from a plain HTTP server.
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// The sum of a Prometheus counter's samples.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
