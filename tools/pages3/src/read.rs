//! GetObject and HeadObject support: a GetObject body is read page by page, pinned to the
//! version stat-ed when the request began, with pages read ahead of the connection.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use futures_util::{stream, Stream, StreamExt};
use pagestore_client::{ufs::ObjectInfo, Client, Error as ClientError};
use s3s::{
    dto::{GetObjectInput, GetObjectOutput, StreamingBlob},
    stream::{ByteStream, RemainingLength},
    S3Error, S3ErrorCode, S3Request, S3Response, S3Result, StdError,
};
use tokio::sync::mpsc;

use super::{
    aliases::PartOf, cond::ReadConditions, errors::client_error, multipart::check_part_number,
    Gateway,
};

/// Pages a GetObject reads ahead of the connection.
const READ_AHEAD_PAGES: usize = 4;

/// The page-aligned pieces of `start..end` (the first may start inside a page).
pub(super) fn chunks(start: u64, end: u64, page: u64) -> impl Iterator<Item = (u64, u64)> {
    let page = page.max(1);
    let mut off = start;
    std::iter::from_fn(move || {
        if off >= end {
            return None;
        }
        let stop = ((off / page + 1).saturating_mul(page)).min(end);
        let piece = (off, stop - off);
        off = stop;
        Some(piece)
    })
}

/// A GetObject body: the first piece, read before the response started, then the rest from a
/// task that reads pages ahead.
struct BodyStream {
    first: Option<Bytes>,
    rx: Option<mpsc::Receiver<io::Result<Bytes>>>,
    remaining: usize,
}

impl Stream for BodyStream {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            this.remaining = this.remaining.saturating_sub(b.len());
            return Poll::Ready(Some(Ok(b)));
        }
        let Some(rx) = this.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                this.remaining = this.remaining.saturating_sub(b.len());
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.rx = None;
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.rx = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl ByteStream for BodyStream {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(self.remaining)
    }
}

/// Reads `info` at each piece (pinned to its version) and sends the bytes in order.
async fn read_pieces(
    client: Arc<Client>,
    info: ObjectInfo,
    pieces: impl Iterator<Item = (u64, u64)> + Send + 'static,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    let reads = stream::iter(pieces)
        .map(|(off, len)| {
            let (client, info) = (client.clone(), info.clone());
            async move { read_piece(&client, &info, off, len).await }
        })
        .buffered(READ_AHEAD_PAGES);
    tokio::pin!(reads);
    while let Some(r) = reads.next().await {
        let failed = r.is_err();
        if tx.send(r.map_err(io::Error::from)).await.is_err() || failed {
            // The client went away, or the read failed (the connection is cut short).
            return;
        }
    }
}

async fn read_piece(
    client: &Client,
    info: &ObjectInfo,
    off: u64,
    len: u64,
) -> Result<Bytes, ClientError> {
    let b = client.read_at(info, off, len).await?;
    if b.len() as u64 != len {
        return Err(ClientError::Changed(format!(
            "{}: {} bytes at {off} where {len} were expected; the object changed",
            info.path,
            b.len()
        )));
    }
    Ok(b)
}

impl Gateway {
    /// `partNumber` of a GetObject or HeadObject of `info` (`range`: a Range was asked too):
    /// `None` to read the whole object (no part asked, or part 1 of an object written in one
    /// piece or not known to this gateway as a multipart one, as S3 answers part 1 of a
    /// PutObject's); the part's bytes for a multipart object this gateway completed (while it
    /// remembers it); 400 InvalidPart for a part the object does not have (never the whole
    /// object under another part's name: a parallel downloader would assemble it N times), as
    /// S3 answers; 400 for a part number outside 1..=10000 or one asked with a Range.
    pub(super) fn part_of(
        &self,
        info: &ObjectInfo,
        part_number: Option<i32>,
        range: bool,
    ) -> S3Result<Option<PartOf>> {
        let Some(n) = part_number else {
            return Ok(None);
        };
        if range {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                "a Range and a partNumber cannot be asked together",
            ));
        }
        check_part_number(n)?;
        let count = match self.aliases.part(&info.path, &info.version, n) {
            Some(Ok(p)) => return Ok(Some(p)),
            Some(Err(count)) => count,
            None if n == 1 => return Ok(None),
            None => 1,
        };
        Err(S3Error::with_message(
            S3ErrorCode::InvalidPart,
            format!("the object has no part {n} (it has {count} part(s))"),
        ))
    }
}

/// GetObject: the first piece is read before answering, the rest streams from a task.
pub(super) async fn get_object(
    gw: &Gateway,
    req: S3Request<GetObjectInput>,
) -> S3Result<S3Response<GetObjectOutput>> {
    let input = &req.input;
    super::keys::check_version_id(input.version_id.as_deref())?;
    let conds = ReadConditions {
        if_match: input.if_match.as_ref(),
        if_none_match: input.if_none_match.as_ref(),
        if_modified_since: input.if_modified_since.as_ref(),
        if_unmodified_since: input.if_unmodified_since.as_ref(),
    };
    let (info, tags) = gw.stat_for_read(&input.bucket, &input.key, &conds).await?;
    let modified = gw.modified(&info);
    let part = gw.part_of(&info, input.part_number, input.range.is_some())?;
    let (start, end) = match &input.range {
        None => part.as_ref().map_or((0, info.size), |p| (p.start, p.end)),
        // No range of an empty object is satisfiable, a suffix range neither (as S3 answers;
        // a 206 could not say `bytes 0--1/0`).
        Some(r) if info.size == 0 => {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidRange,
                format!(
                    "the range {} is not satisfiable: the object is empty",
                    r.to_header_string()
                ),
            ))
        }
        Some(r) => {
            let r = r.check(info.size).map_err(|_| {
                S3Error::with_message(
                    S3ErrorCode::InvalidRange,
                    format!(
                        "the range {} is outside the object's {} bytes",
                        r.to_header_string(),
                        info.size
                    ),
                )
            })?;
            (r.start, r.end)
        }
    };
    let len = end - start;
    let page = u64::from(gw.client.page_size());
    let mut pieces = chunks(start, end, page);
    // The first piece is read before answering, so that a failure is a proper error.
    let first = match pieces.next() {
        Some((off, n)) => Some(
            read_piece(&gw.client, &info, off, n)
                .await
                .map_err(client_error)?,
        ),
        None => None,
    };
    let rx = match first.as_ref() {
        Some(b) if (b.len() as u64) < len => {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(read_pieces(gw.client.clone(), info.clone(), pieces, tx));
            Some(rx)
        }
        _ => None,
    };
    let body = BodyStream {
        first,
        rx,
        remaining: usize::try_from(len).unwrap_or(usize::MAX),
    };
    let a = gw.served_attributes(&info).await;
    let sums = gw.checksums_for_read(
        &info,
        input.checksum_mode.as_ref(),
        input.range.is_some(),
        part.as_ref(),
    );
    let checksum_type = sums.checksum_type();
    let [crc32, crc32c, sha1, sha256, crc64nvme] = sums.values;
    // response-* parameters override what is kept, as in S3.
    let or = |asked: &Option<String>, kept: Option<String>| asked.clone().or(kept);
    Ok(S3Response::new(GetObjectOutput {
        checksum_crc32: crc32,
        checksum_crc32c: crc32c,
        checksum_sha1: sha1,
        checksum_sha256: sha256,
        checksum_crc64nvme: crc64nvme,
        checksum_type,
        parts_count: part
            .as_ref()
            .map(|p| i32::try_from(p.count).unwrap_or(i32::MAX)),
        cache_control: or(&input.response_cache_control, a.cache_control.clone()),
        content_disposition: or(
            &input.response_content_disposition,
            a.content_disposition.clone(),
        ),
        content_encoding: or(&input.response_content_encoding, a.content_encoding.clone()),
        content_language: or(&input.response_content_language, a.content_language.clone()),
        metadata: a.metadata.clone(),
        expires: input.response_expires.clone().or(a.expires.clone()),
        accept_ranges: Some("bytes".into()),
        body: Some(StreamingBlob::new(body)),
        content_length: Some(len.try_into().unwrap_or(i64::MAX)),
        // (An empty part has no range to give: 200 with no bytes.)
        content_range: (input.range.is_some() || part.as_ref().is_some_and(|p| p.end > p.start))
            .then(|| format!("bytes {start}-{}/{}", end.saturating_sub(1), info.size)),
        content_type: Some(
            input
                .response_content_type
                .clone()
                .unwrap_or_else(|| a.content_type()),
        ),
        e_tag: Some(tags.reported),
        last_modified: Some(modified.into()),
        ..GetObjectOutput::default()
    }))
}

/// A stream of the bytes `start..end` of `info` read through the cluster, page by page
/// (the source of a copy between mounts, or of UploadPartCopy).
pub(super) fn object_blob(
    client: Arc<Client>,
    info: ObjectInfo,
    start: u64,
    end: u64,
) -> StreamingBlob {
    let page = u64::from(client.page_size());
    let pieces: Vec<(u64, u64)> = chunks(start, end, page).collect();
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(read_pieces(client, info, pieces.into_iter(), tx));
    StreamingBlob::new(BodyStream {
        first: None,
        rx: Some(rx),
        remaining: usize::try_from(end.saturating_sub(start)).unwrap_or(usize::MAX),
    })
}
