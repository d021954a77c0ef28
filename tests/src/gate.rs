//! A TCP relay with a gate, for fault injection: [`GateProxy`] forwards connections to a
//! server (an [`crate::S3Server`]), and while its gate is shut it holds every byte clients send,
//! so a test can stop a request to the store part way and act while it waits.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpStream,
    },
    sync::{oneshot, watch},
};

/// A relay to `target` on a loopback port of its own, on a thread with its own runtime.
/// Dropping it stops it (and the connections it relays).
#[derive(Debug)]
pub struct GateProxy {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    counts: Arc<Counts>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl GateProxy {
    /// Relays to `target`, gate open.
    pub fn start(target: SocketAddr) -> io::Result<GateProxy> {
        let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (open, gate) = watch::channel(true);
        let counts = Arc::new(Counts::default());
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let counted = counts.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gate-proxy-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    loop {
                        tokio::select! {
                            _ = &mut stop_rx => return,
                            accepted = listener.accept() => {
                                let Ok((client, _)) = accepted else { continue };
                                let (gate, counts) = (gate.clone(), counted.clone());
                                tokio::spawn(async move {
                                    let Ok(server) = TcpStream::connect(target).await else {
                                        return;
                                    };
                                    let (cr, cw) = client.into_split();
                                    let (sr, sw) = server.into_split();
                                    tokio::join!(
                                        pipe(cr, sw, Some((gate, counts))),
                                        pipe(sr, cw, None)
                                    );
                                });
                            }
                        }
                    }
                });
            })?;
        Ok(GateProxy {
            addr,
            open,
            counts,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds what clients send from now on (what the server answers still passes).
    pub fn shut(&self) {
        self.open.send_replace(false);
    }

    /// Lets what was held, and everything after it, through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Bytes clients sent while the gate was shut (held, or let through since).
    pub fn held_bytes(&self) -> u64 {
        self.counts.held.load(Ordering::Relaxed)
    }

    /// Bytes clients sent, in all.
    pub fn sent_bytes(&self) -> u64 {
        self.counts.sent.load(Ordering::Relaxed)
    }
}

impl Drop for GateProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What clients sent.
#[derive(Debug, Default)]
struct Counts {
    sent: AtomicU64,
    held: AtomicU64,
}

/// Copies `from` to `to` until either ends; with a gate, each chunk read while it is shut is
/// counted and waits for it to open.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    gate: Option<(watch::Receiver<bool>, Arc<Counts>)>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some((gate, counts)) = &gate {
            counts.sent.fetch_add(n as u64, Ordering::Relaxed);
            let mut gate = gate.clone();
            if !*gate.borrow() {
                counts.held.fetch_add(n as u64, Ordering::Relaxed);
                if gate.wait_for(|open| *open).await.is_err() {
                    break;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
