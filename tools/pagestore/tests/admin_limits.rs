//! The admin HTTP endpoint (`pagestore_tools::admin::serve_with`) as an attacker meets it,
//! over real TCP connections: a client that sends half a request head is cut off after the
//! header deadline, connections over the limit are answered 503 and closed, and the accept loop
//! backs off instead of spinning when the process is out of file descriptors.
//!
//! One test per binary run matters here: the file descriptor test lowers RLIMIT_NOFILE of the
//! whole process, so the tests of this file run one after another (a shared lock).
#![allow(clippy::unwrap_used)]

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use pagestore_cli::http_guard::Limits;
use pagestore_protocol::{members::Membership, ring::RingConfig};
use pagestore_tools::admin::{self, Admin, RingState};

/// Held for the whole of each test, runtime included: a runtime built while the other test has
/// lowered RLIMIT_NOFILE would fail for want of descriptors.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `test` alone (see [`SERIAL`]) on a fresh two-thread runtime.
fn serial<F: std::future::Future<Output = ()>>(test: F) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test);
}

fn admin_state() -> Arc<Admin> {
    Arc::new(Admin {
        // No node: every answer is "503 stopping", which is all these tests need.
        node: std::sync::Weak::new(),
        ring: RwLock::new(RingState {
            membership: Arc::new(Membership::new(Vec::new(), RingConfig::default(), 0).unwrap()),
            down: Vec::new(),
            mode: "file",
        }),
        etcd: None,
        writeback: None,
    })
}

async fn start(limits: Limits) -> SocketAddr {
    admin::serve_with(admin_state(), "127.0.0.1:0".parse().unwrap(), limits)
        .await
        .unwrap()
}

/// Reads until EOF or an error; returns what arrived and when the connection ended.
fn read_to_close(mut s: TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let t0 = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("connection still open after {limit:?}: {e}"),
        }
    }
    (got, t0.elapsed())
}

#[test]
fn half_a_header_is_cut_off_and_extra_connections_are_refused() {
    serial(half_a_header());
}

async fn half_a_header() {
    let addr = start(Limits {
        header_timeout: Duration::from_secs(1),
        max_connections: 3,
        ..Limits::ADMIN
    })
    .await;
    tokio::task::spawn_blocking(move || {
        // A complete request is answered.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let (got, _) = read_to_close(s, Duration::from_secs(10));
        assert!(
            got.starts_with(b"HTTP/1.1 503") && String::from_utf8_lossy(&got).contains("stopping"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        // Half a head: cut off after about a second.
        let mut slow = Vec::new();
        for _ in 0..3 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
                .unwrap();
            slow.push(s);
        }
        std::thread::sleep(Duration::from_millis(200));
        // The fourth connection is over the limit: 503 and closed at once.
        let s = TcpStream::connect(addr).unwrap();
        let (got, took) = read_to_close(s, Duration::from_secs(5));
        assert!(
            got.starts_with(b"HTTP/1.1 503") && took < Duration::from_millis(900),
            "over the limit: {took:?} {}",
            String::from_utf8_lossy(&got)
        );
        for s in slow {
            let (_, took) = read_to_close(s, Duration::from_secs(8));
            assert!(
                took < Duration::from_secs(3),
                "half a head kept for {took:?}"
            );
        }
        // Their places are free again.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let (got, _) = read_to_close(s, Duration::from_secs(10));
        assert!(got.starts_with(b"HTTP/1.1 503"), "after the cut-off");
    })
    .await
    .unwrap();
}

/// CPU time (user + system) of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass; no other memory is touched.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut ru), 0);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn nofile() -> libc::rlimit {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `r` only.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r
}

fn set_nofile(r: &libc::rlimit) {
    // SAFETY: setrlimit reads `r` only.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, r) }, 0);
}

#[test]
fn accept_backs_off_when_out_of_file_descriptors() {
    serial(out_of_descriptors());
}

async fn out_of_descriptors() {
    let addr = start(Limits::ADMIN).await;
    let spent = tokio::task::spawn_blocking(move || {
        // Sockets made while descriptors are still available; connected once none are, so that
        // the server's accept fails with EMFILE while they wait in its backlog.
        let socks: Vec<socket2_free::Sock> = (0..4).map(|_| socket2_free::Sock::new()).collect();
        let old = nofile();
        // The lowest free descriptor number: with the soft limit there, every new descriptor
        // fails.
        // SAFETY: dup of fd 0 (or a failure) has no effect beyond a new descriptor we close.
        let lowest = unsafe { libc::dup(0) };
        assert!(lowest >= 0);
        // SAFETY: `lowest` is the descriptor dup just returned; nothing else owns it.
        unsafe { libc::close(lowest) };
        set_nofile(&libc::rlimit {
            rlim_cur: lowest as libc::rlim_t,
            rlim_max: old.rlim_max,
        });
        for s in &socks {
            s.connect(addr);
        }
        std::thread::sleep(Duration::from_millis(300));
        let c0 = cpu_time();
        std::thread::sleep(Duration::from_millis(1500));
        let spent = cpu_time() - c0;
        set_nofile(&old);
        // With descriptors back, the waiting connections are served.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let (got, _) = read_to_close(s, Duration::from_secs(10));
        assert!(got.starts_with(b"HTTP/1.1 503"), "after the limit is back");
        drop(socks);
        spent
    })
    .await
    .unwrap();
    assert!(
        spent < Duration::from_millis(400),
        "the process used {spent:?} of CPU in 1.5 s while accept failed: the loop spins"
    );
}

/// A TCP socket created before descriptors run out, connected later (connect needs no new
/// descriptor).
mod socket2_free {
    use std::net::SocketAddr;

    pub struct Sock(libc::c_int);

    impl Sock {
        pub fn new() -> Sock {
            // SAFETY: socket() takes no pointers; the result is checked.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            Sock(fd)
        }

        pub fn connect(&self, addr: SocketAddr) {
            let SocketAddr::V4(v4) = addr else {
                panic!("IPv4 only")
            };
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sin` is a valid sockaddr_in that lives across the call, and its size is
            // passed with it.
            let rc = unsafe {
                libc::connect(
                    self.0,
                    (&sin as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
        }
    }

    impl Drop for Sock {
        fn drop(&mut self) {
            // SAFETY: the descriptor is owned by this value and closed once.
            unsafe { libc::close(self.0) };
        }
    }
}
