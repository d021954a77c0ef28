//! `pagefs`: mounts pagestore's logical namespace read-only through FUSE (see
//! `pagestore_tools::pagefs` for the file system itself, `docs/OPERATIONS.md` for its use).

use std::{
    ffi::CString,
    io::Write,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    time::Duration,
};

use fuser::{MountOption, SessionACL, SessionUnmounter};
use pagestore_client::{tls, Client, ClientOptions, ClusterSource};
use pagestore_tools::{
    flag, home, init_logging,
    pagefs::{FsOptions, PageFs},
    parse_size, Args, DEFAULT_LISTEN,
};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

const USAGE: &str = "\
usage: pagefs MOUNTPOINT [OPTIONS]

Mounts the cluster's namespace (the same paths as `pagectl ls /`) read-only at MOUNTPOINT, an
empty directory, and serves it until SIGINT or SIGTERM, which unmount it. Prints `ready
MOUNTPOINT` on standard output once mounted. Needs root (or CAP_SYS_ADMIN) and /dev/fuse.

options:
  --cluster WHERE         member file, any member's IP:PORT, or etcd://HOST:PORT[/CLUSTER]
                          (default $PAGESTORE_CLUSTER or 127.0.0.1:7400)
  --tls-dir DIR           directory with the cluster's ca-cert.pem (and client-cert.pem and
                          client-key.pem, or ca-key.pem, if the cluster requires client
                          certificates); default $PAGESTORE_TLS_DIR or $PAGESTORE_HOME/cache/tls
  --no-fallback           fail reads (EIO) instead of reading the under storage when a member
                          is down
  --timeout SECS          time allowed per request to a member (default 3)
  --attr-ttl SECS         how long the kernel may cache names, sizes and kinds (default 10; 0 asks
                          every time)
  --threads N             FUSE request threads and client runtime threads (default: CPUs,
                          2 to 16)
  --readahead SIZE        kernel read-ahead window of the mount (default the larger of 8M and
                          two pages; 0 keeps the kernel's default)
  --allow-other           let users other than the one mounting read the files (the
                          kernel enforces the modes shown: a file:// mount's files keep
                          their own modes and owners; refused if a file:// mount's
                          directory is not on this machine)";

fn main() {
    init_logging();
    let code = match real_main() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pagefs: {e}");
            1
        }
    };
    std::process::exit(code);
}

struct Settings {
    mountpoint: PathBuf,
    cluster: String,
    tls_dir: PathBuf,
    client: ClientOptions,
    attr_ttl: Duration,
    threads: usize,
    readahead: Option<u64>,
    allow_other: bool,
}

fn parse_args() -> Result<Option<Settings>, String> {
    let mut args = Args::from_env();
    let mut s = Settings {
        mountpoint: PathBuf::new(),
        cluster: std::env::var("PAGESTORE_CLUSTER").unwrap_or_else(|_| DEFAULT_LISTEN.into()),
        tls_dir: std::env::var_os("PAGESTORE_TLS_DIR")
            .map_or_else(|| home().join("cache").join("tls"), PathBuf::from),
        client: ClientOptions::default(),
        attr_ttl: Duration::from_secs(10),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 16)),
        readahead: None,
        allow_other: false,
    };
    let mut words = Vec::new();
    while let Some(arg) = args.next() {
        match flag(&arg) {
            "--cluster" => s.cluster = args.value(&arg)?,
            "--tls-dir" => s.tls_dir = args.value(&arg)?.into(),
            "--no-fallback" => s.client.fallback = false,
            "--timeout" => {
                s.client.call_timeout =
                    Duration::from_secs_f64(args.parsed::<f64>(&arg)?.clamp(0.01, 1e6))
            }
            "--attr-ttl" => {
                s.attr_ttl = Duration::from_secs_f64(args.parsed::<f64>(&arg)?.clamp(0.0, 1e6))
            }
            "--threads" => s.threads = args.parsed::<usize>(&arg)?.clamp(1, 256),
            "--readahead" => s.readahead = Some(parse_size(&args.value(&arg)?)?),
            "--allow-other" => s.allow_other = true,
            "-h" | "--help" | "help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            f if f.starts_with("--") => return Err(format!("unknown option {f:?}\n\n{USAGE}")),
            _ => words.push(arg),
        }
    }
    match words.as_slice() {
        [mp] => s.mountpoint = mp.into(),
        [] => return Err(format!("no mount point\n\n{USAGE}")),
        _ => {
            return Err(format!(
                "one mount point expected, got {words:?}\n\n{USAGE}"
            ))
        }
    }
    Ok(Some(s))
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

fn real_main() -> Result<(), String> {
    let Some(s) = parse_args()? else {
        return Ok(());
    };
    let mp = check_mountpoint(&s.mountpoint)?;
    check_dev_fuse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(s.threads)
        .thread_name("pagefs-io")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let client = runtime.block_on(async {
        let tls = tls::client_config(&s.tls_dir).map_err(|e| e.to_string())?;
        Client::connect(
            &ClusterSource::parse(&s.cluster),
            tls,
            None,
            s.client.clone(),
        )
        .await
        .map_err(|e| e.to_string())
    })?;
    let page = u64::from(client.page_size());
    let readahead = s.readahead.unwrap_or((2 * page).max(8 << 20));
    let fs = PageFs::new(
        client.clone(),
        runtime.handle().clone(),
        FsOptions {
            attr_ttl: s.attr_ttl,
            readahead: u32::try_from(readahead.max(4096)).unwrap_or(u32::MAX),
            ..FsOptions::default()
        },
    );
    if s.allow_other {
        let blind = fs.mounts_without_modes();
        if !blind.is_empty() {
            return Err(format!(
                "--allow-other: the cluster's file:// mounts {} are not directories on this \
                 machine, so pagefs cannot report their files' modes and the kernel could not \
                 keep other users out of files they may not read; mount without --allow-other, \
                 or run pagefs on the machine that has these directories",
                blind.join(", ")
            ));
        }
    }
    // Signals are caught from here on, so one that comes during the mount still unmounts.
    let (mut term, mut int) = {
        let _rt = runtime.enter();
        let term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
        let int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
        (term, int)
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName("pagestore".into()),
        MountOption::Subtype("pagestore".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
    ];
    config.acl = if s.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(s.threads);
    config.clone_fd = true;
    let slot = fs.notifier_slot();
    let mut session = fuser::Session::new(fs, &mp, &config).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => "; mounting needs root (or CAP_SYS_ADMIN)",
            _ if e.kind() == std::io::ErrorKind::NotFound => {
                "; mounting as a user needs fusermount3 (Debian package fuse3), or run as root"
            }
            _ => "",
        };
        format!("cannot mount at {}: {e}{hint}", mp.display())
    })?;
    slot.set(session.notifier());
    let mut unmounter = session.unmount_callable();
    if readahead > 0 {
        if let Err(e) = set_read_ahead(&mp, readahead) {
            warn!("read-ahead stays at the kernel's default: {e}");
        }
    }
    let mut run = runtime.spawn_blocking(move || session.run());
    info!(
        "mounted {} (cluster {}, page size {page}, attribute TTL {:?}, {} threads)",
        mp.display(),
        s.cluster,
        s.attr_ttl,
        s.threads
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
            unmount(&mut unmounter, &mp)?;
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
        Err(ended) => {
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
                    if let Err(e) = unmount(&mut unmounter, &mp) {
                        warn!("{e}");
                    }
                    Err(why)
                }
            }
        }
    };
    say(&format!("unmounted {} {:?}", mp.display(), client.stats()));
    result
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
