//! `pagefs`: mounts pagestore's logical namespace through FUSE, read-only except where a mount
//! takes writes (see the `pagefs` library for the file system itself, `docs/OPERATIONS.md` for
//! its use).

use std::{
    ffi::CString,
    io::Write,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context};
use clap::Parser;
use fuser::{MountOption, SessionACL, SessionUnmounter};
use pagefs::{FsOptions, PageFs};
use pagestore_cli::{init_logging, parse_size, ClusterArgs};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

/// The short form of the usage, for a missing mount point.
const USAGE: &str = "usage: pagefs MOUNTPOINT [OPTIONS] (pagefs --help lists the options)";

/// Mounts the cluster's namespace through FUSE.
///
/// Mounts the cluster's namespace (the same paths as `pagectl ls /`) at MOUNTPOINT, an empty
/// directory, and serves it until SIGINT or SIGTERM, which unmount it. Paths of write=back and
/// write=transient mounts are written through the cluster; paths of write=through mounts whose
/// store this machine can write (a file:// directory here, S3 credentials in AWS_*) are staged
/// locally and sent to the store at fsync and close; everything else is read-only (EROFS), and
/// so is everything with --read-only. Prints `ready MOUNTPOINT` on standard output once
/// mounted. Needs root (or CAP_SYS_ADMIN) and /dev/fuse. With --no-fallback, reads of a member
/// that is down fail (EIO), and write=through mounts are read-only.
#[derive(Parser, Debug)]
// An option given twice takes its last value, as before clap.
#[command(
    name = "pagefs",
    override_usage = "pagefs MOUNTPOINT [OPTIONS]",
    args_override_self = true
)]
struct Cli {
    /// Where to mount: an empty directory
    #[arg(value_name = "MOUNTPOINT")]
    mountpoint: Option<PathBuf>,

    /// How long the kernel may cache names, sizes and kinds (0 asks every time)
    #[arg(
        long,
        value_name = "SECS",
        default_value = "10",
        allow_negative_numbers = true,
        value_parser = parse_attr_ttl
    )]
    attr_ttl: Duration,

    /// FUSE request threads and client runtime threads (default: CPUs, 2 to 16; at most 256)
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// Kernel read-ahead window of the mount (default the larger of 8M and two pages; 0 keeps
    /// the kernel's default)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    readahead: Option<u64>,

    /// Let users other than the one mounting read the files (the kernel enforces the modes
    /// shown: a file:// mount's files keep their own modes and owners; refused if a file://
    /// mount's directory is not on this machine)
    #[arg(long)]
    allow_other: bool,

    /// Allow running programs from the mount (it is mounted noexec by default: the files are
    /// data; with --exec, a file's execute bits are the ones shown, from its mode on a file://
    /// mount, none on object stores)
    #[arg(long)]
    exec: bool,

    /// Refuse every write (EROFS) and mount read-only, whatever the mounts take
    #[arg(long)]
    read_only: bool,

    /// Where files written to write=through mounts wait until fsync or close sends them to the
    /// store: a local disk with room for the largest file written at once (default
    /// $PAGESTORE_HOME/pagefs-staging)
    #[arg(long, value_name = "DIR")]
    staging_dir: Option<PathBuf>,

    #[command(flatten)]
    cluster: ClusterArgs,
}

/// `--attr-ttl SECS`: 0 to a million seconds.
fn parse_attr_ttl(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_nan() {
        return Err("not a number".into());
    }
    Ok(Duration::from_secs_f64(v.clamp(0.0, 1e6)))
}

fn main() {
    init_logging();
    let cli: Cli = pagestore_cli::parse_or_exit(1);
    if let Err(e) = real_main(cli) {
        eprintln!("pagefs: {}", pagestore_cli::error_chain(&e));
        std::process::exit(1);
    }
}

/// The mount point must be an empty directory that is not a dead mount.
fn check_mountpoint(mp: &Path) -> Result<PathBuf, String> {
    let shown = mp.display();
    match std::fs::metadata(mp) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(format!(
                "{shown} is a FUSE mount whose process has gone; unmount it first \
                 (umount -l {shown}, or fusermount3 -u {shown})"
            ))
        }
        Err(e) => {
            return Err(format!(
                "mount point {shown}: {e}; create an empty directory"
            ))
        }
        Ok(m) if !m.is_dir() => return Err(format!("mount point {shown} is not a directory")),
        Ok(_) => {}
    }
    let mut entries = std::fs::read_dir(mp).map_err(|e| format!("mount point {shown}: {e}"))?;
    if entries.next().is_some() {
        return Err(format!(
            "mount point {shown} is not empty; mount on an empty directory"
        ));
    }
    std::fs::canonicalize(mp).map_err(|e| format!("mount point {shown}: {e}"))
}

fn check_dev_fuse() -> Result<(), String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(
            "FUSE is unavailable: /dev/fuse does not exist. Load the module (modprobe fuse) or, \
             in a container, pass the device (--device /dev/fuse --cap-add SYS_ADMIN)"
                .into(),
        ),
        Err(e) => Err(format!(
            "FUSE is unavailable: cannot open /dev/fuse ({e}); run pagefs as root, or give the \
             container the device (--device /dev/fuse --cap-add SYS_ADMIN)"
        )),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let Some(mountpoint) = &cli.mountpoint else {
        bail!("no mount point\n\n{USAGE}");
    };
    let threads = cli.threads.map_or_else(
        || std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 16)),
        |n| n.clamp(1, 256),
    );
    let mp = check_mountpoint(mountpoint).map_err(anyhow::Error::msg)?;
    check_dev_fuse().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("pagefs-io")
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let client = runtime.block_on(cli.cluster.connect(None))?;
    let page = u64::from(client.page_size());
    let readahead = cli.readahead.unwrap_or((2 * page).max(8 << 20));
    let fs = PageFs::new(
        client.clone(),
        runtime.handle().clone(),
        FsOptions {
            attr_ttl: cli.attr_ttl,
            readahead: u32::try_from(readahead.max(4096)).unwrap_or(u32::MAX),
            read_only: cli.read_only,
            staging_dir: cli
                .staging_dir
                .clone()
                .unwrap_or_else(|| pagestore_cli::home().join("pagefs-staging")),
            ..FsOptions::default()
        },
    );
    let writable = fs.takes_writes();
    let drain = fs.drain();
    if cli.allow_other {
        check_allow_other(&fs)?;
    }
    // Signals are caught from here on, so one that comes during the mount still unmounts.
    let (mut term, mut int) = {
        let _rt = runtime.enter();
        let term = signal(SignalKind::terminate()).context("SIGTERM")?;
        let int = signal(SignalKind::interrupt()).context("SIGINT")?;
        (term, int)
    };
    let config = mount_config(&cli, threads, writable);
    let slot = fs.notifier_slot();
    let mut session = fuser::Session::new(fs, &mp, &config).map_err(|e| mount_error(&e, &mp))?;
    slot.set(session.notifier());
    let mut unmounter = session.unmount_callable();
    if readahead > 0 {
        if let Err(e) = set_read_ahead(&mp, readahead) {
            warn!("read-ahead stays at the kernel's default: {e}");
        }
    }
    let mut run = runtime.spawn_blocking(move || session.run());
    info!(
        "mounted {} (cluster {}, page size {page}, attribute TTL {:?}, {} threads, {})",
        mp.display(),
        cli.cluster.cluster(),
        cli.attr_ttl,
        threads,
        if writable {
            "writes where the mounts take them"
        } else {
            "read-only"
        }
    );
    // Not println!: a closed standard output must not panic with the file system mounted.
    say(&format!("ready {}", mp.display()));

    let stop = runtime.block_on(async {
        tokio::select! {
            _ = term.recv() => Ok("SIGTERM"),
            _ = int.recv() => Ok("SIGINT"),
            r = &mut run => Err(r),
        }
    });
    let result = match stop {
        Ok(sig) => {
            info!("{sig}: unmounting {}", mp.display());
            unmount(&mut unmounter, &mp).map_err(anyhow::Error::msg)?;
            // The session ends once the kernel lets go; after a lazy unmount that is when the
            // last open file closes. A second signal stops waiting.
            runtime.block_on(async {
                tokio::select! {
                    _ = &mut run => {}
                    _ = term.recv() => warn!("second signal: exiting with files still open"),
                    _ = int.recv() => warn!("second signal: exiting with files still open"),
                }
            });
            Ok(())
        }
        Err(ended) => session_ended(ended, &mut unmounter, &mp),
    };
    // Files released just before the end are still being closed (committed for good).
    let left = runtime.block_on(drain.finish(Duration::from_secs(120)));
    if left > 0 {
        warn!("{left} file(s) were still open for writing at exit; closed them");
    }
    say(&format!("unmounted {} {:?}", mp.display(), client.stats()));
    result
}

/// `--allow-other` is refused while a file:// mount is not a directory here: pagefs could not
/// report its files' modes, so the kernel could not keep other users out.
fn check_allow_other(fs: &PageFs) -> anyhow::Result<()> {
    let blind = fs.mounts_without_modes();
    if !blind.is_empty() {
        bail!(
            "--allow-other: the cluster's file:// mounts {} are not directories on this \
             machine, so pagefs cannot report their files' modes and the kernel could not \
             keep other users out of files they may not read; mount without --allow-other, \
             or run pagefs on the machine that has these directories",
            blind.join(", ")
        );
    }
    Ok(())
}

/// The mount options: read-only unless some mount takes writes (`writable`), permissions
/// checked by the kernel, no devices or set-user-id programs, no execution unless `--exec`,
/// `threads` FUSE threads.
fn mount_config(cli: &Cli, threads: usize, writable: bool) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        if writable {
            MountOption::RW
        } else {
            MountOption::RO
        },
        MountOption::FSName("pagestore".into()),
        MountOption::Subtype("pagestore".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
        if cli.exec {
            MountOption::Exec
        } else {
            MountOption::NoExec
        },
    ];
    config.acl = if cli.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads);
    config.clone_fd = true;
    config
}

/// Why the mount failed, with a hint for the usual causes.
fn mount_error(e: &std::io::Error, mp: &Path) -> anyhow::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => "; mounting needs root (or CAP_SYS_ADMIN)",
        _ if e.kind() == std::io::ErrorKind::NotFound => {
            "; mounting as a user needs fusermount3 (Debian package fuse3), or run as root"
        }
        _ => "",
    };
    anyhow::anyhow!("cannot mount at {}: {e}{hint}", mp.display())
}

/// The FUSE session ended without a signal: unmounted from outside (fine), or failed (the
/// mount point is unmounted, and the error returned).
fn session_ended(
    ended: Result<std::io::Result<()>, tokio::task::JoinError>,
    unmounter: &mut SessionUnmounter,
    mp: &Path,
) -> anyhow::Result<()> {
    let why = match ended {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("the FUSE session failed: {e}")),
        Err(e) => Some(format!("the FUSE session stopped: {e}")),
    };
    match why {
        None => {
            info!("{} was unmounted from outside", mp.display());
            Ok(())
        }
        Some(why) => {
            if let Err(e) = unmount(unmounter, mp) {
                warn!("{e}");
            }
            Err(anyhow::Error::msg(why))
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Unmounts `mp`; if it is busy (open files, a shell inside), detaches it lazily: it leaves the
/// namespace now and goes away when its last file closes.
fn unmount(unmounter: &mut SessionUnmounter, mp: &Path) -> Result<(), String> {
    match unmounter.unmount() {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            warn!(
                "{} is busy (open files or a working directory inside); detaching it lazily",
                mp.display()
            );
            let c = CString::new(mp.as_os_str().as_bytes())
                .map_err(|_| format!("{}: a path with a NUL byte", mp.display()))?;
            // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(format!(
                    "cannot unmount {}: {e}; run umount -l {0}",
                    mp.display()
                ));
            }
            Ok(())
        }
        Err(e) => Err(format!(
            "cannot unmount {}: {e}; run umount -l {0}",
            mp.display()
        )),
    }
}

/// Sets the kernel's read-ahead window of the FUSE mount at `mp` (the FUSE handshake cannot
/// raise it above the kernel's default of 128 KiB; sysfs can).
fn set_read_ahead(mp: &Path, bytes: u64) -> Result<(), String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let want = mp.as_os_str().as_bytes();
    let dev = info
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            let fstype = f.get(sep + 1)?;
            (fstype.starts_with("fuse") && unescape(f.get(4)?) == want).then(|| f[2].to_string())
        })
        .next_back()
        .ok_or_else(|| format!("{} not found in /proc/self/mountinfo", mp.display()))?;
    let file = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    std::fs::write(&file, format!("{}\n", bytes.div_ceil(1024)))
        .map_err(|e| format!("{file}: {e}"))?;
    info!("read-ahead {} KiB ({file})", bytes.div_ceil(1024));
    Ok(())
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("pagefs").chain(line.split_whitespace()))
    }

    #[test]
    fn the_mount_point_goes_before_or_after_the_options() {
        for line in [
            "/mnt/ps --cluster /m --tls-dir /t --timeout 2 --no-fallback --attr-ttl 0",
            "--cluster /m --tls-dir /t /mnt/ps --timeout=2 --no-fallback --attr-ttl=0",
        ] {
            let c = parse(line).unwrap();
            assert_eq!(c.mountpoint, Some(PathBuf::from("/mnt/ps")), "{line}");
            assert_eq!(c.cluster.cluster(), "/m");
            assert_eq!(c.cluster.tls_dir(), PathBuf::from("/t"));
            assert_eq!(c.attr_ttl, Duration::ZERO);
            let o = c.cluster.client_options().unwrap();
            assert!(!o.fallback);
            assert_eq!(o.call_timeout, Duration::from_secs(2));
        }
        let c = parse("/mnt --threads 4 --readahead 16M --allow-other --exec").unwrap();
        assert_eq!(
            (c.threads, c.readahead, c.allow_other, c.exec),
            (Some(4), Some(16 << 20), true, true)
        );
        assert!(mount_config(&c, 2, false)
            .mount_options
            .contains(&MountOption::Exec));
        let c = parse("/mnt").unwrap();
        assert_eq!(c.attr_ttl, Duration::from_secs(10));
        assert_eq!(
            (c.threads, c.readahead, c.allow_other, c.exec),
            (None, None, false, false)
        );
        let o = mount_config(&c, 2, false).mount_options;
        assert!(o.contains(&MountOption::NoExec) && !o.contains(&MountOption::Exec));
        assert!(o.contains(&MountOption::RO) && !o.contains(&MountOption::RW));
        let o = mount_config(&c, 2, true).mount_options;
        assert!(o.contains(&MountOption::RW) && o.contains(&MountOption::NoExec));
        assert!(!c.read_only && c.staging_dir.is_none());
        let c = parse("/mnt --read-only --staging-dir /st").unwrap();
        assert!(c.read_only);
        assert_eq!(c.staging_dir, Some(PathBuf::from("/st")));
        // No mount point parses; real_main refuses it with the usage line.
        assert_eq!(parse("").unwrap().mountpoint, None);
        for (line, needle) in [
            ("/a /b", "/b"),
            ("/a --readahead lots", "--readahead"),
            ("/a --frobnicate", "--frobnicate"),
            (
                "/a --etcd-user u --cluster 127.0.0.1:1 --attr-ttl x",
                "--attr-ttl",
            ),
        ] {
            let e = parse(line).unwrap_err().to_string();
            assert!(e.contains(needle), "{line}: {e}");
        }
        let c = parse("/a --etcd-user u --cluster 127.0.0.1:1").unwrap();
        assert!(matches!(
            c.cluster.client_options(),
            Err(pagestore_cli::Error::EtcdFlagsWithoutEtcd)
        ));
    }
}
