//! Settings: the config file, the flags over it, defaults and errors.
#![allow(clippy::unwrap_used)]

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;
use pagestore_engine::PolicyKind;
use pagestore_mounts::etcd::RingMode;

use super::{AdminAddr, Cli, Settings, SettingsError, Size};

fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("pagestored").chain(args.iter().copied()))
}

fn flags(args: &[&str]) -> Settings {
    cli(args).unwrap().flags.into_settings()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn every_key_of_the_documented_example_parses() {
    let s = Settings::from_toml(
        r#"
cache_dirs = ["/nvme0/pagestore", "/nvme1/pagestore"]
cache_size = "3T"
memory_cache = "32G"
page_size = 4194304
shards = 0
policy = "s3fifo"
listen = "10.0.0.1:7400"
members = "/etc/pagestore/members"
etcd_user = "pagestore"
etcd_password_file = "/etc/pagestore/etcd-password"
etcd_ca = "/etc/pagestore/etcd-ca.pem"
etcd_cert = "/etc/pagestore/etcd-client.pem"
etcd_key = "/etc/pagestore/etcd-client-key.pem"
ring_mode = "static"
lease_ttl = 10
tls_dir = "/etc/pagestore/tls"
require_client_cert = true
max_connections = 1024
max_connections_per_ip = 128
max_partial_bytes = "256M"
request_stall_timeout = 2.5
retry_rate = 128
metadata_ttl = 10
replicas = 1
hot_replicas = 2
hot_threshold = 50.5
hot_cool = 5
ufs_inflight = 16
ufs_threads = 2
admin = "off"
pin = false
allow_file_roots = ["/mnt/shared"]

[mounts]
"/train/" = "s3://bucket/datasets?region=us-east-1"
"/scratch" = "file:///mnt/shared"

[[rule]]
prefix = "/train/team-a/"
quota = "20GiB"
ttl = "2h"

[[rule]]
prefix = "/train/eval"
pin = true
"#,
    )
    .unwrap();
    assert_eq!(s.cache_size, Some(Size(3 << 40)));
    assert_eq!(s.memory_cache, Some(Size(32 << 30)));
    assert_eq!(s.page_size, Some(Size(4 << 20)));
    assert_eq!(s.policy, Some(PolicyKind::S3Fifo));
    assert_eq!(s.ring_mode, Some(RingMode::Static));
    assert_eq!(s.lease_ttl, Some(10.0));
    assert_eq!(s.request_stall_timeout, Some(2.5));
    assert_eq!(s.admin, Some(AdminAddr::Off));
    assert_eq!(s.pin, Some(false));
    assert_eq!(
        s.mounts.as_deref().unwrap(),
        [
            ("/scratch".to_string(), "file:///mnt/shared".to_string()),
            (
                "/train".to_string(),
                "s3://bucket/datasets?region=us-east-1".to_string()
            ),
        ]
    );
    let rules = s.rules.unwrap();
    assert_eq!(rules[0].quota, Some(20 << 30));
    assert_eq!(rules[0].ttl, Some(Duration::from_secs(7200)));
    assert!(rules[1].pin);
}

#[test]
fn flags_win_over_the_file_and_lists_replace_the_file_s() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        &dir,
        "p.toml",
        "cache_dirs = [\"/a\", \"/b\"]\ncache_size = \"256M\"\nlisten = \"127.0.0.1:1\"\n\
         require_client_cert = true\nreplicas = 2\n[mounts]\n\"/x\" = \"file:///x\"\n",
    );
    let c = cli(&[
        "--config",
        cfg.to_str().unwrap(),
        "--listen=127.0.0.1:2",
        "--cache-dir",
        "/c",
        "--allow-anonymous",
        "--rule",
        "/r:pin=true",
    ])
    .unwrap();
    let s = c.settings().unwrap();
    assert_eq!(s.listen, Some("127.0.0.1:2".parse().unwrap()), "flag wins");
    assert_eq!(
        s.cache_dirs,
        Some(vec![PathBuf::from("/c")]),
        "list replaced"
    );
    assert_eq!(s.cache_size, Some(Size(256 << 20)), "from the file");
    assert_eq!(s.require_client_cert, Some(false));
    assert_eq!(s.replicas, Some(2));
    assert_eq!(s.mounts.unwrap().len(), 1, "the file's mounts stay");
    assert_eq!(s.rules.unwrap()[0].prefix, "/r");
    // Without flags the file's settings hold; without a file, only the flags'.
    let s = cli(&["--config", cfg.to_str().unwrap()])
        .unwrap()
        .settings()
        .unwrap();
    assert_eq!(s.cache_dirs.unwrap().len(), 2);
    assert_eq!(s.require_client_cert, Some(true));
}

#[test]
fn repeated_flags_both_syntaxes_and_last_one_wins() {
    let s = flags(&[
        "--mount",
        "/a=file:///a",
        "--mount=/b/=file:///b",
        "--cache-dir=/1",
        "--cache-dir",
        "/2",
        "--allow-file-root",
        "/r",
        "--shards",
        "1",
        "--shards=3",
        "--require-client-cert",
        "--allow-anonymous",
        "--require-client-cert",
        "--no-pin",
        "--reformat",
        "--admin",
        "127.0.0.1:0",
        "--max-partial-bytes",
        "512M",
    ]);
    assert_eq!(
        s.mounts.unwrap(),
        [
            ("/a".to_string(), "file:///a".to_string()),
            ("/b".to_string(), "file:///b".to_string())
        ]
    );
    assert_eq!(
        s.cache_dirs.unwrap(),
        [PathBuf::from("/1"), PathBuf::from("/2")]
    );
    assert_eq!(s.allow_file_roots.unwrap(), [PathBuf::from("/r")]);
    assert_eq!(s.shards, Some(3));
    assert_eq!(s.require_client_cert, Some(true));
    assert_eq!(s.pin, Some(false));
    assert!(s.reformat);
    assert_eq!(
        s.admin,
        Some(AdminAddr::At(SocketAddr::from(([127, 0, 0, 1], 0))))
    );
    assert_eq!(s.max_partial_bytes, Some(Size(512 << 20)));
    assert_eq!(flags(&[]), Settings::default());
}

#[test]
fn node_id_takes_the_cache_directory_either_side() {
    for args in [
        &["node-id", "--cache-dir", "/n"][..],
        &["--cache-dir", "/n", "node-id"][..],
    ] {
        let c = cli(args).unwrap();
        assert!(matches!(c.command, Some(super::cli::Command::NodeId)));
        assert_eq!(
            c.flags.into_settings().cache_dirs,
            Some(vec![PathBuf::from("/n")])
        );
    }
}

#[test]
fn an_unknown_key_is_refused_naming_it_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(&dir, "bad.toml", "cache_size = \"1G\"\nbogus = 1\n");
    let e = Settings::from_file(&cfg).unwrap_err();
    assert!(matches!(e, SettingsError::Parse { .. }), "{e:?}");
    let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(text.contains("unknown field `bogus`"), "{text}");
    assert!(text.contains(&cfg.display().to_string()), "{text}");
    let e = Settings::from_file(&dir.path().join("missing.toml")).unwrap_err();
    assert!(e.to_string().starts_with("cannot read config file"), "{e}");
}

#[test]
fn bad_values_name_the_key_or_the_flag() {
    let e = Settings::from_toml("cache_size = \"4X\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cache_size") && e.contains("unknown size suffix"),
        "{e}"
    );
    let e = Settings::from_toml("page_size = -1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("page_size") && e.contains("not a size"), "{e}");
    let e = Settings::from_toml("policy = \"mru\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("use lru or s3fifo"), "{e}");
    let e = Settings::from_toml("[mounts]\n\"data\" = \"file:///d\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("must start with /"), "{e}");
    let e = Settings::from_toml("[[rule]]\nprefix = \"/a\"\nquota = \"lots\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("rule /a: quota"), "{e}");
    for (args, want) in [
        (&["--cache-size", "4X"][..], "--cache-size"),
        (&["--max-partial-bytes=lots"][..], "--max-partial-bytes"),
        (&["--listen", "nowhere"][..], "--listen"),
        (&["--admin", "on"][..], "IP:PORT or off"),
        (&["--policy", "mru"][..], "use lru or s3fifo"),
        (&["--ring-mode", "sometimes"][..], "use dynamic or static"),
        (&["--mount", "data=file:///d"][..], "must start with /"),
        (&["--rule", "/a:ttl=soon"][..], "rule /a: ttl"),
        (&["--shards"][..], "--shards"),
    ] {
        let e = cli(args).unwrap_err().to_string();
        assert!(e.contains(want), "{args:?}: {e}");
    }
    let e = cli(&["--frobnicate"]).unwrap_err();
    assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
}

#[test]
fn resolution_checks_ranges_and_combinations() {
    let bad = |args: &[&str], want: &str| {
        let e = flags(args).resolve().unwrap_err().to_string();
        assert!(e.contains(want), "{args:?}: {e}");
    };
    bad(
        &["--lease-ttl", "1", "--etcd", "etcd://127.0.0.1:1"],
        "2 to 3600",
    );
    bad(&["--request-stall-timeout", "0"], "0.1 to 3600");
    bad(&["--page-size", "8G"], "at most 64M");
    bad(
        &["--max-partial-bytes", "1M"],
        "cannot hold one whole request",
    );
    bad(&["--members", "/m", "--etcd", "etcd://h:1"], "choose one");
    bad(&["--ring-mode", "static"], "needs --etcd");
    bad(&["--etcd-user", "u"], "need --etcd");
    bad(&["--etcd", "http://127.0.0.1:2379"], "etcd://HOST:PORT");
    bad(
        &["--rule", "/a:quota=1G", "--rule", "/a/:ttl=1s"],
        "appears twice",
    );
}

/// Defaults of the embedded single-node node (with `PAGESTORE_HOME` unset: this test does not
/// create anything, it gives every path).
#[test]
fn defaults_are_the_embedded_single_node_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let s = Settings {
        cache_dirs: Some(vec![dir.path().join("cache")]),
        mounts: Some(vec![("/data".into(), format!("file://{}", data.display()))]),
        ..Settings::default()
    };
    let r = s.resolve().unwrap();
    assert_eq!(r.listen, SocketAddr::from(([127, 0, 0, 1], 7400)));
    assert_eq!(r.admin, Some(SocketAddr::from(([127, 0, 0, 1], 7399))));
    assert_eq!((r.cache_size, r.page_size, r.shards), (1 << 30, 4 << 20, 0));
    assert_eq!(r.policy, PolicyKind::Lru);
    assert_eq!(r.limits, pagestore_server::endpoint::Limits::default());
    assert_eq!(r.metadata_ttl, Duration::from_secs(10));
    assert_eq!(r.lease_ttl, Duration::from_secs(10));
    assert_eq!((r.replicas, r.ufs_inflight, r.ufs_threads), (0, 16, 2));
    assert!(!r.pin && !r.reformat);
    assert_eq!(r.require_client_cert, None);
    assert!(r.members.is_none() && r.etcd.is_none() && r.tls_dir.is_none());
    assert_eq!(r.file_roots.roots(), [data.canonicalize().unwrap()]);
    // Without cache directories, the default is under PAGESTORE_HOME.
    assert_eq!(
        Settings::default().cache_dirs_or_default(),
        [pagestore_cli::home().join("cache")]
    );
}

/// `s` with one `file://` mount of an existing directory in `dir`, so that it resolves.
fn with_data_mount(dir: &tempfile::TempDir, s: Settings) -> Settings {
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    Settings {
        mounts: Some(vec![(
            "/data".to_string(),
            format!("file://{}", data.display()),
        )]),
        ..s
    }
}

#[test]
fn the_memory_tier_is_off_by_default_and_sized_by_flag_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let base = |s: Settings| with_data_mount(&dir, s);
    assert_eq!(base(Settings::default()).resolve().unwrap().memory_cache, 0);
    let f = flags(&["--memory-cache", "2G"]);
    assert_eq!(f.memory_cache, Some(Size(2 << 30)));
    assert_eq!(base(f).resolve().unwrap().memory_cache, 2 << 30);
    let file = Settings::from_toml("memory_cache = \"512M\"").unwrap();
    assert_eq!(file.memory_cache, Some(Size(512 << 20)));
    let both = file.overridden_by(flags(&["--memory-cache=1G"]));
    assert_eq!(both.memory_cache, Some(Size(1 << 30)));
    assert!(cli(&["--memory-cache", "lots"]).is_err());
}

#[test]
fn shards_are_unpinned_unless_pinning_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let base = |s: Settings| with_data_mount(&dir, s);
    assert!(!base(Settings::default()).resolve().unwrap().pin);
    assert_eq!(flags(&[]).pin, None);
    assert_eq!(flags(&["--pin"]).pin, Some(true));
    assert_eq!(flags(&["--no-pin"]).pin, Some(false));
    assert!(base(flags(&["--pin"])).resolve().unwrap().pin);
    let file = Settings::from_toml("pin = true").unwrap();
    assert!(base(file.clone()).resolve().unwrap().pin);
    assert!(
        !base(file.overridden_by(flags(&["--no-pin"])))
            .resolve()
            .unwrap()
            .pin
    );
    let e = cli(&["--pin", "--no-pin"]).unwrap_err().to_string();
    assert!(e.contains("--pin") && e.contains("--no-pin"), "{e}");
}

#[test]
fn hot_page_replicas_default_on_and_take_flags_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let base = |s: Settings| with_data_mount(&dir, s);
    let d = base(Settings::default()).resolve().unwrap().spread;
    assert_eq!(
        (d.spread, d.threshold, d.cool),
        (3, 20.0, Duration::from_secs(30))
    );
    assert!(d.enabled());
    let file = Settings::from_toml("hot_replicas = 2\nhot_threshold = 5\nhot_cool = 60\n").unwrap();
    let both = file.overridden_by(flags(&["--hot-replicas", "1", "--hot-cool=2.5"]));
    let r = base(both).resolve().unwrap().spread;
    assert_eq!(
        (r.spread, r.threshold, r.cool),
        (1, 5.0, Duration::from_millis(2500))
    );
    assert!(!r.enabled(), "--hot-replicas 1 turns replicas off");
    let bad = |args: &[&str], want: &str| {
        let e = base(flags(args)).resolve().unwrap_err().to_string();
        assert!(e.contains(want), "{args:?}: {e}");
    };
    bad(&["--hot-replicas", "0"], "--hot-replicas 0");
    bad(&["--hot-threshold", "0"], "--hot-threshold");
    bad(&["--hot-threshold=-3"], "--hot-threshold");
    bad(&["--hot-cool", "0.5"], "1 to 86400");
    assert!(cli(&["--hot-replicas", "300"]).is_err());
}

#[test]
fn write_back_records_are_kept_a_day_and_a_million_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let base = |s: Settings| with_data_mount(&dir, s);
    let d = base(Settings::default()).resolve().unwrap();
    assert_eq!(
        (d.write_records_keep, d.write_records_max),
        (Duration::from_secs(86400), 1_000_000)
    );
    let file =
        Settings::from_toml("write_records_keep = 3600\nwrite_records_max = 5000\n").unwrap();
    let r = base(file.clone()).resolve().unwrap();
    assert_eq!(
        (r.write_records_keep, r.write_records_max),
        (Duration::from_secs(3600), 5000)
    );
    let both = file.overridden_by(flags(&["--write-records-keep", "1.5"]));
    let r = base(both).resolve().unwrap();
    assert_eq!(
        (r.write_records_keep, r.write_records_max),
        (Duration::from_millis(1500), 5000)
    );
    let bad = |args: &[&str], want: &str| {
        let e = base(flags(args)).resolve().unwrap_err().to_string();
        assert!(e.contains(want), "{args:?}: {e}");
    };
    bad(&["--write-records-keep", "0.5"], "1 to 31536000");
    bad(&["--write-records-keep", "NaN"], "--write-records-keep");
    bad(&["--write-records-max", "0"], "--write-records-max 0");
}

#[test]
fn a_never_committed_files_pages_are_dropped_after_two_minutes_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let base = |s: Settings| with_data_mount(&dir, s);
    let d = base(Settings::default()).resolve().unwrap();
    assert_eq!(d.write_orphan_grace, Duration::from_secs(120));
    let file = Settings::from_toml("write_orphan_grace = 600\n").unwrap();
    assert_eq!(
        base(file.clone()).resolve().unwrap().write_orphan_grace,
        Duration::from_secs(600)
    );
    let both = file.overridden_by(flags(&["--write-orphan-grace", "2.5"]));
    assert_eq!(
        base(both).resolve().unwrap().write_orphan_grace,
        Duration::from_millis(2500)
    );
    for (arg, want) in [
        ("0.5", "1 to 86400"),
        ("90000", "1 to 86400"),
        ("inf", "--write-orphan-grace"),
    ] {
        let e = base(flags(&["--write-orphan-grace", arg]))
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{arg}: {e}");
    }
}
