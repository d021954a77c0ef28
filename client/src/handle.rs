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
