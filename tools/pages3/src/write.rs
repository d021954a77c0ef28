//! PutObject and DeleteObject(s): writes go through to the under storage, then the cluster's
//! pages of the object are invalidated. Also the sweep of staged files that a killed gateway
//! left in `file://` stores.

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use hyper::HeaderMap;
use pagestore_client::{ufs::ObjectInfo, Client, Error as ClientError};
use s3s::{
    dto::{DeleteObjectsInput, DeleteObjectsOutput, DeletedObject, StreamingBlob},
    S3Error, S3ErrorCode, S3Request, S3Response, S3Result, TrailingHeaders,
};

use super::{
    checks::{self, Digests},
    errors::{client_error, invalid, part_error, store_error},
    keys::{key_path, percent_decode, KeyPath},
    Gateway,
};

/// Buffer size for PutObject bodies: smaller bodies are written in one request, larger ones
/// as a multipart upload of parts this size. Also the part size used to send staged uploads.
pub(super) const WRITE_CHUNK: usize = 16 << 20;

impl Gateway {
    pub(super) fn writable(&self) -> S3Result<&pagestore_client::ufs::MountTable> {
        let table = if self.writable {
            self.client.writable().ok()
        } else {
            None
        };
        table.ok_or_else(|| {
            S3Error::with_message(
                S3ErrorCode::NotImplemented,
                "this gateway is read-only: start pages3 with --mount /LOGICAL=URL (with \
                 credentials for the store) to allow writes",
            )
        })
    }

    /// The logical path a write goes to.
    pub(super) fn write_path(&self, bucket: &str, key: &str) -> S3Result<String> {
        let path = key_path(bucket, key)?;
        checks::check_written_key_len(key)?;
        match path {
            KeyPath::Object(p) => Ok(p),
            KeyPath::Marker => Err(invalid(format!(
                "{key:?}: pagestore has no directory markers; directories exist while they hold \
                 objects"
            ))),
        }
    }

    /// Writes `body` to `path`: in one request when it is small, else as a multipart upload
    /// streamed in [`WRITE_CHUNK`] parts; then invalidates the cluster's pages of the object.
    /// The object appears only when the body was complete (an aws-chunked body: exactly its
    /// declared decoded length) and matched every digest the request names; else nothing is
    /// written and the old object stays.
    pub(super) async fn write_object(
        &self,
        path: &str,
        body: Option<StreamingBlob>,
        headers: &HeaderMap,
        trailers: Option<&TrailingHeaders>,
    ) -> S3Result<ObjectInfo> {
        let ufs = self.writable()?;
        let mut digests = Digests::from_headers(headers)?;
        let mut body = BodyReader::new(body, headers);
        let mut buf = BytesMut::new();
        let mut upload = None;
        let mut pending = Vec::new();
        let old = ufs.stat(path).await.ok().map(|i| i.file_id);
        let result: Result<(), S3Error> = async {
            while let Some(chunk) = body.next().await? {
                digests.update(&chunk);
                buf.extend_from_slice(&chunk);
                while buf.len() >= WRITE_CHUNK {
                    let part = buf.split_to(WRITE_CHUNK).freeze();
                    if upload.is_none() {
                        upload = Some(ufs.put_multipart(path).await.map_err(store_error)?);
                    }
                    if let Some(u) = upload.as_mut() {
                        pending.push(u.put_part(part.into()));
                    }
                    if pending.len() >= 2 {
                        pending.remove(0).await.map_err(|e| part_error(path, e))?;
                    }
                }
            }
            digests.verify(trailers.and_then(TrailingHeaders::take).as_ref())?;
            match upload.as_mut() {
                None => ufs
                    .put(path, buf.split().freeze())
                    .await
                    .map_err(store_error)?,
                Some(u) => {
                    if !buf.is_empty() {
                        pending.push(u.put_part(buf.split().freeze().into()));
                    }
                    for p in pending.drain(..) {
                        p.await.map_err(|e| part_error(path, e))?;
                    }
                    u.complete().await.map_err(|e| part_error(path, e))?;
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            pending.clear();
            if let Some(mut u) = upload {
                let _ = u.abort().await;
            }
            body.drain().await;
            return Err(e);
        }
        self.client.invalidate(path, old).await;
        ufs.stat(path).await.map_err(store_error)
    }
}

/// Most bytes of a refused body read and dropped so that the client gets the answer instead of
/// a broken pipe.
const MAX_DRAIN: u64 = 64 << 20;

/// Reads a PutObject or UploadPart body: refuses it when it fails or, when aws-chunked, when
/// it is not exactly its declared decoded length.
pub(super) struct BodyReader {
    body: Option<StreamingBlob>,
    /// The decoded length an aws-chunked body declares.
    declared: Option<u64>,
    /// The length the client sends (Content-Length or the decoded length).
    expected: Option<u64>,
    received: u64,
    failed: bool,
}

impl BodyReader {
    pub(super) fn new(body: Option<StreamingBlob>, headers: &HeaderMap) -> BodyReader {
        let declared = if checks::is_aws_chunked(headers) {
            checks::decoded_length(headers)
        } else {
            None
        };
        let expected = declared.or_else(|| {
            headers
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
        });
        BodyReader {
            body,
            declared,
            expected,
            received: 0,
            failed: false,
        }
    }

    /// The next piece; `None` at a complete end.
    pub(super) async fn next(&mut self) -> S3Result<Option<Bytes>> {
        let next = match self.body.as_mut() {
            Some(b) => b.next().await,
            None => None,
        };
        let incomplete = |msg: String| S3Error::with_message(S3ErrorCode::IncompleteBody, msg);
        match next {
            Some(Ok(chunk)) => {
                self.received += chunk.len() as u64;
                if let Some(d) = self.declared.filter(|d| self.received > *d) {
                    self.failed = true;
                    return Err(incomplete(format!(
                        "the aws-chunked body has more than the {d} bytes its \
                         x-amz-decoded-content-length declares"
                    )));
                }
                Ok(Some(chunk))
            }
            Some(Err(e)) => {
                self.failed = true;
                Err(incomplete(format!("reading the request body: {e}")))
            }
            None => {
                if let Some(d) = self.declared.filter(|d| self.received != *d) {
                    self.failed = true;
                    return Err(incomplete(format!(
                        "the aws-chunked body has {} bytes where its \
                         x-amz-decoded-content-length declares {d}",
                        self.received
                    )));
                }
                Ok(None)
            }
        }
    }

    /// After a refusal that was not the body's fault: reads the rest of the body (at most
    /// [`MAX_DRAIN`] bytes, and not more than its declared length), so that the client, still
    /// sending, reads the error instead of a reset connection.
    pub(super) async fn drain(&mut self) {
        if self.failed {
            return;
        }
        let Some(expected) = self.expected else {
            return;
        };
        if expected.saturating_sub(self.received) > MAX_DRAIN {
            return;
        }
        while let Some(body) = self.body.as_mut() {
            match body.next().await {
                Some(Ok(chunk)) => self.received += chunk.len() as u64,
                _ => break,
            }
        }
    }
}

/// DeleteObjects: each key deleted on its own; a key that fails is listed with its error.
pub(super) async fn delete_objects(
    gw: &Gateway,
    req: S3Request<DeleteObjectsInput>,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let input = req.input;
    gw.writable()?;
    if input.delete.objects.len() > checks::MAX_DELETE_KEYS {
        return Err(S3Error::with_message(
            S3ErrorCode::MalformedXML,
            format!(
                "the request names {} keys; one DeleteObjects may name at most {}",
                input.delete.objects.len(),
                checks::MAX_DELETE_KEYS
            ),
        ));
    }
    gw.require_bucket(&input.bucket).await?;
    let quiet = input.delete.quiet.unwrap_or(false);
    let mut deleted = Vec::new();
    let mut errors = Vec::new();
    for o in input.delete.objects {
        let result = match key_path(&input.bucket, &o.key) {
            Ok(KeyPath::Marker) => Ok(()),
            Ok(KeyPath::Object(p)) => match gw.client.delete(&p).await {
                Ok(()) | Err(ClientError::NotFound(_)) => Ok(()),
                Err(e) => Err(client_error(e)),
            },
            Err(e) => Err(e),
        };
        match result {
            Ok(()) if !quiet => deleted.push(DeletedObject {
                key: Some(o.key),
                ..DeletedObject::default()
            }),
            Ok(()) => {}
            Err(e) => errors.push(s3s::dto::Error {
                code: Some(e.code().as_str().to_string()),
                key: Some(o.key),
                message: e.message().map(str::to_string),
                version_id: None,
            }),
        }
    }
    Ok(S3Response::new(DeleteObjectsOutput {
        deleted: Some(deleted),
        errors: Some(errors),
        ..DeleteObjectsOutput::default()
    }))
}

// ---------------------------------------------------------------------------------------------
// Staged files of `file://` stores

/// Whether `name` is a file the local store stages a write in
/// ([`pagestore_client::localfs::TMP_PREFIX`]; the store neither lists nor serves such names).
pub fn is_staged_name(name: &str) -> bool {
    name.starts_with(pagestore_client::localfs::TMP_PREFIX)
}

/// The directory of a `file://` mount URL.
fn file_dir(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("file://")?;
    let path = rest.split(['?', '#']).next().unwrap_or(rest);
    let path = String::from_utf8(percent_decode(path.as_bytes())).ok()?;
    Some(PathBuf::from(path)).filter(|p| p.is_absolute())
}

/// Removes, under `dir`, the staged upload files last modified before `before` (uploads of a
/// gateway that was killed; this run's own uploads are newer). Symbolic links are not followed.
/// Returns how many were removed.
pub fn sweep_dir(dir: &Path, before: SystemTime) -> usize {
    let mut removed = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file()
                && is_staged_name(&e.file_name().to_string_lossy())
                && meta.modified().is_ok_and(|m| m < before)
                && std::fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}

/// Starts removing, in the background, the staged files earlier runs left in the `file://`
/// stores this gateway writes.
pub(super) fn sweep_staged(client: &Client, before: SystemTime) {
    let Ok(table) = client.writable() else {
        return;
    };
    let dirs: Vec<PathBuf> = table
        .mounts()
        .filter_map(|(_, url)| file_dir(url))
        .collect();
    if dirs.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("pages3-sweep".into())
        .spawn(move || {
            for d in dirs {
                let n = sweep_dir(&d, before);
                if n > 0 {
                    tracing::info!(
                        dir = %d.display(),
                        removed = n,
                        "removed staged upload files left by an earlier run"
                    );
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the sweep of staged upload files");
    }
}
