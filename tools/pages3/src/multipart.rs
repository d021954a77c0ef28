//! Multipart uploads staged on local disk: parts wait in the staging directory until
//! CompleteMultipartUpload sends them, in order, to a multipart upload of the under storage.

use std::{
    collections::{hash_map::RandomState, BTreeMap, HashMap},
    hash::{BuildHasher, Hasher},
    io,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::SystemTime,
};

use bytes::BytesMut;
use s3s::{
    dto::{CompleteMultipartUploadInput, CompleteMultipartUploadOutput},
    S3Error, S3ErrorCode, S3Request, S3Response, S3Result, TrailingHeaders,
};
use tokio::io::AsyncWriteExt;

use super::{
    checks::Digests,
    errors::{internal, io_failure, part_error, store_error},
    keys::etag,
    write::{BodyReader, WRITE_CHUNK},
    Gateway,
};

/// Parts of a multipart upload must be at least this large, except the last (as in S3).
const MIN_PART: u64 = 5 << 20;

/// Part numbers go from 1 to this (as in S3).
pub(super) const MAX_PART_NUMBER: i32 = 10_000;

/// Names of upload directories under the staging directory.
const UPLOAD_DIR_PREFIX: &str = "upload-";

/// CompleteMultipartUpload: checks the part list, sends the staged parts, then invalidates the
/// cluster's pages of the object.
pub(super) async fn complete_multipart_upload(
    gw: &Gateway,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let input = req.input;
    let path = gw.write_path(&input.bucket, &input.key)?;
    let ufs = gw.writable()?;
    let wanted: Vec<(i32, Option<String>)> = input
        .multipart_upload
        .and_then(|m| m.parts)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            (
                p.part_number.unwrap_or(0),
                p.e_tag.map(|t| t.value().trim_matches('"').to_string()),
            )
        })
        .collect();
    let files = gw
        .uploads
        .begin_complete(&input.upload_id, &path, &wanted)?;
    let old = ufs.stat(&path).await.ok().map(|i| i.file_id);
    match send_parts(ufs, &path, &files).await {
        Ok(()) => {}
        Err(e) => {
            gw.uploads.end_complete(&input.upload_id, false).await;
            return Err(e);
        }
    }
    gw.uploads.end_complete(&input.upload_id, true).await;
    gw.client.invalidate(&path, old).await;
    let info = ufs.stat(&path).await.map_err(store_error)?;
    Ok(S3Response::new(CompleteMultipartUploadOutput {
        bucket: Some(input.bucket.clone()),
        key: Some(input.key.clone()),
        e_tag: Some(etag(&info.version)),
        location: Some(format!("/{}/{}", input.bucket, input.key)),
        ..CompleteMultipartUploadOutput::default()
    }))
}

/// Streams staged part files, in order, to a multipart upload of the under storage, re-cut
/// into [`WRITE_CHUNK`] parts (which meets every store's minimum part size).
async fn send_parts(
    ufs: &pagestore_client::ufs::MountTable,
    path: &str,
    files: &[PathBuf],
) -> S3Result<()> {
    use tokio::io::AsyncReadExt;
    let fail = internal;
    let mut upload = ufs.put_multipart(path).await.map_err(store_error)?;
    let result: S3Result<()> = async {
        let mut pending = Vec::new();
        let mut buf = BytesMut::with_capacity(WRITE_CHUNK);
        let mut sent_any = false;
        for f in files {
            let mut file = tokio::fs::File::open(f)
                .await
                .map_err(|e| fail(format!("staged part {}: {e}", f.display())))?;
            loop {
                if buf.capacity() - buf.len() == 0 {
                    buf.reserve(WRITE_CHUNK - buf.len());
                }
                let n = file
                    .read_buf(&mut buf)
                    .await
                    .map_err(|e| fail(format!("staged part {}: {e}", f.display())))?;
                if n == 0 {
                    break;
                }
                if buf.len() >= WRITE_CHUNK {
                    let part = buf.split_to(WRITE_CHUNK).freeze();
                    pending.push(upload.put_part(part.into()));
                    sent_any = true;
                    if pending.len() >= 2 {
                        pending.remove(0).await.map_err(|e| part_error(path, e))?;
                    }
                }
            }
        }
        if !buf.is_empty() || !sent_any {
            pending.push(upload.put_part(buf.split().freeze().into()));
        }
        for p in pending {
            p.await.map_err(|e| part_error(path, e))?;
        }
        upload.complete().await.map_err(|e| part_error(path, e))?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = upload.abort().await;
    }
    result
}

struct PartFile {
    etag: String,
    size: u64,
    file: PathBuf,
}

struct Upload {
    /// The logical path the upload writes.
    path: String,
    dir: PathBuf,
    parts: BTreeMap<i32, PartFile>,
    /// CompleteMultipartUpload is sending the parts.
    completing: bool,
}

pub(super) struct Uploads {
    dir: PathBuf,
    open: Mutex<HashMap<String, Upload>>,
}

/// An unpredictable id: 128 bits from the operating system's random source, in hex. Should
/// that source fail (it does not on Linux once booted), the bits come from the process's
/// randomly keyed hasher over a counter and the time instead.
pub(super) fn random_id() -> String {
    let mut bits = [0u8; 16];
    if let Err(e) = getrandom::fill(&mut bits) {
        tracing::warn!(error = %e, "the OS random source failed; ids come from a keyed hash");
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        for half in bits.chunks_mut(8) {
            let mut h = RandomState::new().build_hasher();
            h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
            h.write_u128(
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    bits.iter().map(|b| format!("{b:02x}")).collect()
}

fn no_such_upload(id: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NoSuchUpload,
        format!(
            "upload {id:?} does not exist (it was completed or aborted, or the gateway \
             restarted since it began)"
        ),
    )
}

impl Uploads {
    pub(super) fn open(dir: &Path) -> Result<Uploads, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("staging directory {}: {e}", dir.display()))?;
        // Uploads of an earlier run cannot be completed (their state was in its memory).
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("staging directory {}: {e}", dir.display()))?;
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(UPLOAD_DIR_PREFIX)
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(Uploads {
            dir: dir.to_path_buf(),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Upload>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) async fn create(&self, path: String) -> S3Result<String> {
        let id = random_id();
        let dir = self.dir.join(format!("{UPLOAD_DIR_PREFIX}{id}"));
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| internal(format!("staging directory {}: {e}", dir.display())))?;
        self.lock().insert(
            id.clone(),
            Upload {
                path,
                dir,
                parts: BTreeMap::new(),
                completing: false,
            },
        );
        Ok(id)
    }

    /// The upload's directory, if `id` is open for `path` and not completing.
    fn dir_of(&self, id: &str, path: &str) -> S3Result<PathBuf> {
        let open = self.lock();
        match open.get(id) {
            Some(u) if u.path == path && !u.completing => Ok(u.dir.clone()),
            Some(u) if u.completing => Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                "the upload is being completed",
            )),
            _ => Err(no_such_upload(id)),
        }
    }

    /// Stages one part (checked as PutObject checks a body); returns its ETag (without
    /// quotes).
    pub(super) async fn put_part(
        &self,
        id: &str,
        path: &str,
        number: i32,
        mut body: BodyReader,
        mut digests: Digests,
        trailers: Option<&TrailingHeaders>,
    ) -> S3Result<String> {
        let dir = self.dir_of(id, path)?;
        let tmp = dir.join(format!("part-{number:05}.{}.tmp", random_id()));
        let what = format!("staging part {number} in {}", tmp.display());
        let fail = |e: io::Error| io_failure(&what, e);
        let mut file = match tokio::fs::File::create(&tmp).await {
            Ok(f) => f,
            Err(e) => {
                body.drain().await;
                return Err(fail(e));
            }
        };
        // Fixed keys: the same bytes get the same ETag.
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        let mut size = 0u64;
        let written: S3Result<()> = async {
            while let Some(chunk) = body.next().await? {
                hash.write(&chunk);
                digests.update(&chunk);
                size += chunk.len() as u64;
                file.write_all(&chunk).await.map_err(fail)?;
            }
            file.flush().await.map_err(fail)?;
            digests.verify(trailers.and_then(TrailingHeaders::take).as_ref())?;
            Ok(())
        }
        .await;
        drop(file);
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            body.drain().await;
            return Err(e);
        }
        let etag = format!("{:016x}{size:x}", hash.finish());
        let dest = dir.join(format!("part-{number:05}"));
        let mut open = self.lock();
        // Aborted or completed while the body was arriving: drop the part.
        match open.get_mut(id) {
            Some(u) if !u.completing => {
                std::fs::rename(&tmp, &dest).map_err(fail)?;
                u.parts.insert(
                    number,
                    PartFile {
                        etag: etag.clone(),
                        size,
                        file: dest,
                    },
                );
                Ok(etag)
            }
            _ => {
                let _ = std::fs::remove_file(&tmp);
                Err(no_such_upload(id))
            }
        }
    }

    /// Checks the client's part list against the staged parts and marks the upload as
    /// completing; returns the part files in order.
    fn begin_complete(
        &self,
        id: &str,
        path: &str,
        wanted: &[(i32, Option<String>)],
    ) -> S3Result<Vec<PathBuf>> {
        let mut open = self.lock();
        let u = match open.get_mut(id) {
            Some(u) if u.path == path && !u.completing => u,
            Some(u) if u.completing => {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidRequest,
                    "the upload is already being completed",
                ))
            }
            _ => return Err(no_such_upload(id)),
        };
        if wanted.is_empty() {
            return Err(S3Error::with_message(
                S3ErrorCode::MalformedXML,
                "the part list is empty",
            ));
        }
        let mut files = Vec::with_capacity(wanted.len());
        let mut prev = 0;
        for (i, (number, tag)) in wanted.iter().enumerate() {
            if *number <= prev {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidPartOrder,
                    "parts must be listed in ascending order of part number",
                ));
            }
            prev = *number;
            let part = u.parts.get(number).ok_or_else(|| {
                S3Error::with_message(
                    S3ErrorCode::InvalidPart,
                    format!("part {number} was not uploaded"),
                )
            })?;
            if tag.as_deref() != Some(part.etag.as_str()) {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidPart,
                    format!("part {number}: the ETag does not match the uploaded part's"),
                ));
            }
            if i + 1 < wanted.len() && part.size < MIN_PART {
                return Err(S3Error::with_message(
                    S3ErrorCode::EntityTooSmall,
                    format!(
                        "part {number} has {} bytes; every part but the last needs at least {MIN_PART}",
                        part.size
                    ),
                ));
            }
            files.push(part.file.clone());
        }
        u.completing = true;
        Ok(files)
    }

    /// Ends a completion: on success the upload and its files go; on failure it can be
    /// completed again.
    async fn end_complete(&self, id: &str, done: bool) {
        let dir = {
            let mut open = self.lock();
            if done {
                open.remove(id).map(|u| u.dir)
            } else {
                if let Some(u) = open.get_mut(id) {
                    u.completing = false;
                }
                None
            }
        };
        if let Some(dir) = dir {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
    }

    pub(super) async fn abort(&self, id: &str, path: &str) -> S3Result<()> {
        let dir = {
            let mut open = self.lock();
            match open.get(id) {
                Some(u) if u.path == path && !u.completing => open.remove(id).map(|u| u.dir),
                Some(u) if u.completing => {
                    return Err(S3Error::with_message(
                        S3ErrorCode::InvalidRequest,
                        "the upload is being completed",
                    ))
                }
                _ => return Err(no_such_upload(id)),
            }
        };
        if let Some(dir) = dir {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
        Ok(())
    }
}
