//! An open file: tokio's `AsyncRead` and `AsyncSeek` over the cluster, pinned to the object
//! version that existed when it was opened, with read-ahead for sequential readers.

use std::{
    collections::BTreeMap,
    io::SeekFrom,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use tokio::{
    io::{AsyncRead, AsyncSeek, ReadBuf},
    task::JoinHandle,
};

use crate::{client::Error, ufs::ObjectInfo, Client};

/// Tells a sequential reader from a random one, for readers that fetch whole pages and read
/// ahead (pagefs, the Python `Reader`). A read belongs to a sequential run when it starts where
/// the previous read ended and the run started at the file's start or is now longer than a
/// page. So the first read of a file fetches only its bytes (a reader that looks at a file's
/// first bytes and seeks away is sent no pages; [`ReadRun::from_file_start`] for the kernel's
/// reads, which differ), and random readers whose reads happen to meet (one in 128 for 128 KiB
/// reads of a 16 MiB file) are not sent whole pages and a read-ahead they will not read.
#[derive(Debug, Default, Clone)]
pub struct ReadRun {
    /// Where the next sequential read starts (`None` before the first read).
    next: Option<u64>,
    /// Where the run of reads that ends at `next` started.
    start: u64,
}

impl ReadRun {
    /// For readers whose reads at a file's start always begin a sequential scan, such as the
    /// kernel's page-cache reads under a FUSE mount (it reads ahead from there): the first read
    /// counts when it is at offset 0.
    pub fn from_file_start() -> ReadRun {
        ReadRun {
            next: Some(0),
            start: 0,
        }
    }

    /// Records a read of `len` bytes at `offset` and says whether it belongs to a sequential
    /// run, for pages of `page_size` bytes.
    pub fn record(&mut self, offset: u64, len: u64, page_size: u64) -> bool {
        let continues = self.next == Some(offset);
        if !continues {
            self.start = offset;
        }
        let next = offset.saturating_add(len);
        self.next = Some(next);
        continues && (self.start == 0 || next - self.start > page_size)
    }
}

/// A file opened with [`Client::open`].
///
/// Reads go a page at a time: the page under the read position is fetched whole and kept
/// until the reader leaves it. When the reader moves on to the next page (a sequential scan),
/// the handle also starts fetching the following [`crate::ClientOptions::readahead`] pages in
/// the background, so that a scan keeps several pages in flight. A seek elsewhere stops the
/// read-ahead until the reader is sequential again. Every page is read at the version the
/// handle was opened with; if that version is gone from both the cache and the under storage,
/// reads fail with `ErrorKind::StaleNetworkFileHandle` instead of mixing versions.
pub struct FileHandle {
    client: Arc<Client>,
    info: Arc<ObjectInfo>,
    pos: u64,
    current: Option<(u64, Bytes)>,
    pending: BTreeMap<u64, JoinHandle<Result<Bytes, Error>>>,
}

impl FileHandle {
    pub(crate) fn new(client: Arc<Client>, info: ObjectInfo) -> FileHandle {
        FileHandle {
            client,
            info: Arc::new(info),
            pos: 0,
            current: None,
            pending: BTreeMap::new(),
        }
    }

    /// The object this handle reads (its path, size and pinned version).
    pub fn info(&self) -> &ObjectInfo {
        &self.info
    }

    /// The read position.
    pub fn position(&self) -> u64 {
        self.pos
    }

    fn start(&mut self, page: u64) {
        if self.pending.contains_key(&page) {
            return;
        }
        let ps = u64::from(self.client.page_size());
        if page.saturating_mul(ps) >= self.info.size {
            return;
        }
        let (client, info) = (self.client.clone(), self.info.clone());
        let len = self.client.page_size();
        self.pending.insert(
            page,
            tokio::spawn(async move { client.read_page(&info, page, 0, len).await }),
        );
    }

    /// Makes sure `page` is being fetched; when the reader is sequential, the pages after it too.
    fn schedule(&mut self, page: u64) {
        let sequential = match &self.current {
            Some((p, _)) => page == p + 1,
            None => page == 0,
        };
        self.start(page);
        if sequential {
            for p in page + 1..=page + self.client.options().readahead as u64 {
                self.start(p);
            }
        }
        // Pages behind the reader, or far from it after a seek, are not needed any more.
        let keep = page..=page + self.client.options().readahead as u64;
        self.pending.retain(|p, h| {
            let k = keep.contains(p);
            if !k {
                h.abort();
            }
            k
        });
    }
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        for h in self.pending.values() {
            h.abort();
        }
    }
}

impl AsyncRead for FileHandle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let ps = u64::from(this.client.page_size());
        loop {
            if this.pos >= this.info.size || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let page = this.pos / ps;
            if let Some((p, bytes)) = &this.current {
                if *p == page {
                    let off = (this.pos - page * ps) as usize;
                    if off >= bytes.len() {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!(
                                "{}: page {page} is shorter than the file size says",
                                this.info.path
                            ),
                        )));
                    }
                    let n = (bytes.len() - off).min(buf.remaining());
                    buf.put_slice(&bytes[off..off + n]);
                    this.pos += n as u64;
                    return Poll::Ready(Ok(()));
                }
            }
            this.schedule(page);
            let Some(h) = this.pending.get_mut(&page) else {
                return Poll::Ready(Ok(()));
            };
            let done = match Pin::new(h).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => r,
            };
            this.pending.remove(&page);
            match done {
                Ok(Ok(bytes)) => this.current = Some((page, bytes)),
                Ok(Err(e)) => return Poll::Ready(Err(e.into())),
                Err(e) => return Poll::Ready(Err(std::io::Error::other(e))),
            }
        }
    }
}

use std::future::Future;

impl AsyncSeek for FileHandle {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> std::io::Result<()> {
        let this = self.get_mut();
        let target = match position {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => this.info.size.checked_add_signed(d),
            SeekFrom::Current(d) => this.pos.checked_add_signed(d),
        };
        match target {
            Some(t) => {
                this.pos = t;
                Ok(())
            }
            None => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek to a negative or overflowing position",
            )),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        Poll::Ready(Ok(self.pos))
    }
}

#[cfg(test)]
mod tests {
    use super::ReadRun;

    #[test]
    fn whole_pages_go_to_sequential_runs_not_to_random_reads_that_meet() {
        const PS: u64 = 4 << 20;
        const K128: u64 = 128 << 10;
        // From the file's start, read on: a run from the second read.
        let mut r = ReadRun::default();
        assert!(!r.record(0, K128, PS), "the first read");
        assert!(r.record(K128, K128, PS));
        assert!(r.record(2 * K128, K128, PS));
        // A look at the first bytes, then a seek: no run.
        let mut r = ReadRun::default();
        assert!(!r.record(0, 8, PS));
        assert!(!r.record(PS - 8, 8, PS));
        // Random reads, two of which meet: never a run.
        let mut r = ReadRun::default();
        assert!(!r.record(7 * K128, K128, PS));
        assert!(!r.record(8 * K128, K128, PS), "met by chance");
        assert!(!r.record(40 * K128, K128, PS));
        // The kernel's reads: a read at the file's start begins a run at once.
        let mut r = ReadRun::from_file_start();
        assert!(r.record(0, K128, PS));
        assert!(r.record(K128, K128, PS));
        let mut r = ReadRun::from_file_start();
        assert!(!r.record(PS, K128, PS), "not at the start");
        // A run from the middle of the file: once it is longer than a page.
        let mut r = ReadRun::default();
        let start = 3 * PS + K128;
        let runs: Vec<bool> = (0..40)
            .map(|i| r.record(start + i * K128, K128, PS))
            .collect();
        let first = runs.iter().position(|&r| r).expect("a run");
        assert_eq!(first as u64, PS / K128, "{runs:?}");
        assert!(runs[first..].iter().all(|&r| r));
        // A seek ends the run; big reads make one at the second read.
        assert!(!r.record(PS, K128, PS), "after a seek");
        let mut r = ReadRun::default();
        assert!(!r.record(PS, PS, PS));
        assert!(r.record(2 * PS, PS, PS));
    }
}
