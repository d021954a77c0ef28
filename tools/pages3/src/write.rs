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
use object_store::{Attributes, PutMode};
use pagestore_client::{
    ufs::{written_version, ObjectInfo, PartUploads, PutOutcome, UfsError},
    Client, Error as ClientError,
};
use pagestore_protocol::frame::{Expect, PathKind};
use s3s::{
    dto::{
        DeleteObjectInput, DeleteObjectOutput, DeleteObjectsInput, DeleteObjectsOutput,
        DeletedObject, ETag, ETagCondition, PutObjectInput, PutObjectOutput, StreamingBlob,
    },
    S3Error, S3ErrorCode, S3Request, S3Response, S3Result, TrailingHeaders,
};

use super::{
    attrs::Asked,
    checks::{self, Checksums, Digests},
    cond::{precondition_failed, WriteCondition},
    errors::{client_error, conflict, invalid, store_error, upload_error},
    keys::{key_path, percent_decode, KeyPath},
    record::{self, Record},
    Gateway,
};

/// The ETag of an empty body (what S3 answers for a zero-byte directory marker).
pub(super) const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

/// PutObject: a key ending in `/` with an empty body is a directory marker, remembered by the
/// gateway (`Markers`), not stored (the store's directories exist while they hold objects);
/// other keys are written through [`Gateway::write_object`] under the request's condition.
pub(super) async fn put_object(
    gw: &Gateway,
    req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    let input = req.input;
    let cond = WriteCondition::of(input.if_match.as_ref(), input.if_none_match.as_ref())?;
    if let KeyPath::Marker(dir) = key_path(&input.bucket, &input.key)? {
        checks::check_written_key_len(&input.key)?;
        gw.may_write(&dir)?;
        gw.require_bucket(&input.bucket).await?;
        let mut body = BodyReader::new(input.body, &req.headers);
        let mut refused = None;
        if cond != WriteCondition::None {
            refused = Some(S3Error::with_message(
                S3ErrorCode::NotImplemented,
                "a conditional write of a directory marker (keys ending in /): pagestore keeps \
                 no markers",
            ));
        }
        while refused.is_none() {
            match body.next().await? {
                None => break,
                Some(b) if b.is_empty() => {}
                Some(_) => {
                    refused = Some(invalid(format!(
                        "{:?}: a key ending in / is a directory marker; pagestore keeps no \
                         markers and accepts them only empty",
                        input.key
                    )))
                }
            }
        }
        if refused.is_none() {
            refused = gw.remember_marker(&dir).err();
        }
        if let Some(e) = refused {
            body.drain().await;
            return Err(e);
        }
        return Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(EMPTY_MD5.into())),
            size: Some(0),
            ..PutObjectOutput::default()
        }));
    }
    let path = gw.write_path(&input.bucket, &input.key)?;
    gw.may_write(&path)?;
    gw.require_bucket(&input.bucket).await?;
    let attributes = Asked {
        content_type: input.content_type.as_deref(),
        cache_control: input.cache_control.as_deref(),
        content_disposition: input.content_disposition.as_deref(),
        content_encoding: input.content_encoding.as_deref(),
        content_language: input.content_language.as_deref(),
        metadata: input.metadata.as_ref(),
        expires: input.expires.as_ref(),
    }
    .attributes()?;
    let info = gw
        .write_object(
            &path,
            input.body,
            &req.headers,
            req.trailing_headers.as_ref(),
            &cond,
            attributes,
        )
        .await?;
    let sums = gw.checksums_of(&info).unwrap_or_default();
    let [crc32, crc32c, sha1, sha256, crc64nvme] = sums.values;
    Ok(S3Response::new(PutObjectOutput {
        e_tag: Some(gw.tags_of(&info).reported),
        size: Some(info.size.try_into().unwrap_or(i64::MAX)),
        checksum_crc32: crc32,
        checksum_crc32c: crc32c,
        checksum_sha1: sha1,
        checksum_sha256: sha256,
        checksum_crc64nvme: crc64nvme,
        ..PutObjectOutput::default()
    }))
}

/// DeleteObject: 204 whether or not there was an object (a directory name, a missing key or
/// a marker included, as S3 answers); with `If-Match`, the object goes only if it has that
/// ETag, atomically (`file://` mounts; other stores answer 501).
pub(super) async fn delete_object(
    gw: &Gateway,
    req: S3Request<DeleteObjectInput>,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    let input = &req.input;
    super::keys::check_version_id(input.version_id.as_deref())?;
    let path = key_path(&input.bucket, &input.key)?;
    match &path {
        KeyPath::Object(p) | KeyPath::Marker(p) => gw.may_write(p)?,
    }
    gw.require_bucket(&input.bucket).await?;
    gw.delete_key(path, input.if_match.as_ref()).await?;
    Ok(S3Response::new(DeleteObjectOutput::default()))
}

/// Buffer size for PutObject bodies: smaller bodies are written in one request, larger ones
/// as a multipart upload of parts this size. Also the part size used to send staged uploads.
pub(super) const WRITE_CHUNK: usize = 16 << 20;

impl Gateway {
    /// Whether this gateway may write `path`: through the cluster when its mount is a
    /// `write=back` or `write=transient` one (the cluster checks this gateway's certificate),
    /// else with the store's credentials (`--mount`).
    pub(super) fn may_write(&self, path: &str) -> S3Result<()> {
        if self.client.write_policy(path).is_cached() {
            return Ok(());
        }
        self.writable().map(|_| ())
    }

    /// Remembers the directory marker of `dir` (see `Markers`).
    pub(super) fn remember_marker(&self, dir: &str) -> S3Result<()> {
        if self
            .markers
            .put(dir, pagestore_protocol::writeback::unix_ns())
        {
            return Ok(());
        }
        Err(S3Error::with_message(
            S3ErrorCode::ServiceUnavailable,
            format!(
                "this gateway remembers {} directory markers already; delete some",
                super::MAX_MARKERS
            ),
        ))
    }

    /// Whether `path`'s mount takes writes through the cluster.
    pub(super) fn cached(&self, path: &str) -> bool {
        self.client.write_policy(path).is_cached()
    }

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
            KeyPath::Marker(_) => Err(invalid(format!(
                "{key:?}: pagestore has no directory markers; directories exist while they hold \
                 objects"
            ))),
        }
    }

    /// The key at `path` removed (see [`delete_object`]): `If-Match` (`cond`) makes it a
    /// conditional delete.
    pub(super) async fn delete_key(
        &self,
        path: KeyPath,
        cond: Option<&ETagCondition>,
    ) -> S3Result<()> {
        if let (KeyPath::Object(p), Some(cond)) = (&path, cond) {
            if self.cached(p) {
                return self.delete_cached_if(p, cond).await;
            }
        }
        let writable = match &path {
            KeyPath::Object(p) if self.cached(p) => None,
            _ => Some(self.writable()?),
        };
        let path = match (path, cond) {
            (KeyPath::Marker(dir), None) => {
                self.markers.remove(&dir);
                return Ok(());
            }
            (KeyPath::Marker(_), Some(_)) => {
                return Err(S3Error::with_message(
                    S3ErrorCode::NoSuchKey,
                    "If-Match: keys ending in / name no object here",
                ))
            }
            (KeyPath::Object(p), _) => p,
        };
        let (Some(cond), Some(ufs)) = (cond, writable) else {
            return match self.client.delete(&path).await {
                // Deleting what is not there succeeds, as in S3.
                Ok(())
                | Err(ClientError::NotFound(_) | ClientError::IsDir(_) | ClientError::NotDir(_)) => {
                    Ok(())
                }
                Err(e) => Err(client_error(e)),
            };
        };
        let info = match ufs.stat(&path).await {
            Ok(i) => i,
            Err(UfsError::NotFound(_)) => {
                return Err(S3Error::with_message(
                    S3ErrorCode::NoSuchKey,
                    "If-Match: the specified key does not exist",
                ))
            }
            Err(e) => return Err(store_error(e)),
        };
        self.recall(&info).await;
        if WriteCondition::Match(cond.clone())
            .mode(Some((&info.version, &self.tags_of(&info))))
            .is_err()
        {
            return Err(precondition_failed("If-Match: the object has another ETag"));
        }
        match ufs.delete_if(&path, &info.version).await {
            Ok(true) => {}
            Ok(false) => return Err(precondition_failed("If-Match: the object has another ETag")),
            Err(UfsError::NotFound(_)) => {
                return Err(S3Error::with_message(
                    S3ErrorCode::NoSuchKey,
                    "If-Match: the specified key does not exist",
                ))
            }
            Err(e) => return Err(store_error(e)),
        }
        self.client.invalidate(&path, Some(info.file_id)).await;
        Ok(())
    }

    /// [`Gateway::delete_key`] with `If-Match` on a `write=back` or `write=transient` bucket:
    /// the ETag is compared with the object there now (412, or 404 when there is none), and
    /// the path's metadata owner deletes it only if it still holds that version, in one step.
    async fn delete_cached_if(&self, path: &str, cond: &ETagCondition) -> S3Result<()> {
        let missing = || {
            S3Error::with_message(
                S3ErrorCode::NoSuchKey,
                "If-Match: the specified key does not exist",
            )
        };
        let info = match self.client.stat(path).await {
            Ok(i) => i,
            Err(ClientError::NotFound(_) | ClientError::IsDir(_) | ClientError::NotDir(_)) => {
                return Err(missing())
            }
            Err(e) => return Err(client_error(e)),
        };
        self.recall(&info).await;
        if WriteCondition::Match(cond.clone())
            .mode(Some((&info.version, &self.tags_of(&info))))
            .is_err()
        {
            return Err(precondition_failed("If-Match: the object has another ETag"));
        }
        let expect = pagestore_protocol::frame::Expect::Version(info.version.clone());
        match self.client.remove_file_if(path, expect).await {
            Ok(()) => Ok(()),
            Err(ClientError::NotFound(_)) => Err(missing()),
            Err(e) => Err(client_error(e)),
        }
    }

    /// The store's write mode for `cond` on `path` now: the current object is looked up (its
    /// file id comes back too, for the invalidation after the write).
    pub(super) async fn write_mode(
        &self,
        path: &str,
        cond: &WriteCondition,
    ) -> S3Result<(PutMode, Option<u128>)> {
        let ufs = self.writable()?;
        let current = match ufs.stat(path).await {
            Ok(i) => Some(i),
            Err(UfsError::NotFound(_)) => None,
            Err(_) if *cond == WriteCondition::None => None,
            Err(e) => return Err(store_error(e)),
        };
        if let Some(i) = current.as_ref().filter(|_| *cond != WriteCondition::None) {
            self.recall(i).await;
        }
        let mode = self.mode_on(cond, current.as_ref())?;
        Ok((mode, current.map(|i| i.file_id)))
    }

    /// The write mode `cond` asks for on the object `current` (`None`: nothing there).
    fn mode_on(&self, cond: &WriteCondition, current: Option<&ObjectInfo>) -> S3Result<PutMode> {
        let tags = current.map(|i| self.tags_of(i));
        cond.mode(
            current
                .zip(tags.as_ref())
                .map(|(i, t)| (i.version.as_str(), t)),
        )
    }

    /// After a failed write of `path`: 409 when the key names a directory or lies beneath an
    /// object (the store cannot hold both), else `e`.
    pub(super) async fn conflict_or(&self, path: &str, e: S3Error) -> S3Error {
        let Ok(ufs) = self.writable() else {
            return e;
        };
        let key = key_of(path);
        if matches!(ufs.stat_path(path).await, Ok(PathKind::Dir { .. })) {
            return conflict(format!(
                "{key:?} names a directory that holds objects; a key cannot be both an object \
                 and a prefix here"
            ));
        }
        let mut parent = path;
        // The bucket itself (`/bucket`) is a directory.
        while let Some((p, _)) = parent.rsplit_once('/') {
            if p.matches('/').count() < 2 {
                break;
            }
            if ufs.stat(p).await.is_ok() {
                let pk = key_of(p);
                return conflict(format!(
                    "{pk:?} is an object; no key beneath it can be written ({key:?})"
                ));
            }
            parent = p;
        }
        e
    }

    /// Writes `body` to `path`: in one request when it is small, else as a multipart upload
    /// streamed in [`WRITE_CHUNK`] parts; then invalidates the cluster's pages of the object.
    /// The object appears only when the body was complete (an aws-chunked body: exactly its
    /// declared decoded length) and matched every digest the request names, and when `cond`
    /// holds at that moment (the store's own conditional write); else nothing is written and
    /// the old object stays.
    pub(super) async fn write_object(
        &self,
        path: &str,
        body: Option<StreamingBlob>,
        headers: &HeaderMap,
        trailers: Option<&TrailingHeaders>,
        cond: &WriteCondition,
        attributes: Attributes,
    ) -> S3Result<ObjectInfo> {
        if self.cached(path) {
            return self
                .write_object_cached(path, body, headers, trailers, cond, attributes)
                .await;
        }
        let ufs = self.writable()?;
        let mut body = BodyReader::new(body, headers);
        let checked = async {
            let digests = Digests::from_headers(headers)?;
            let (mode, old) = self.write_mode(path, cond).await?;
            if mode != PutMode::Overwrite
                && !ufs.is_local(path)
                && body.expected.is_none_or(|n| n > WRITE_CHUNK as u64)
            {
                return Err(S3Error::with_message(
                    S3ErrorCode::NotImplemented,
                    format!(
                        "a conditional PutObject of more than {} MiB (or of unknown length) on \
                         this bucket's under storage",
                        WRITE_CHUNK >> 20
                    ),
                ));
            }
            Ok((digests, mode, old))
        }
        .await;
        let (mut digests, mode, old) = match checked {
            Ok(v) => v,
            Err(e) => {
                body.drain().await;
                return Err(e);
            }
        };
        let mut buf = BytesMut::new();
        let mut upload = None;
        // A `file://` mount takes the object's attributes at the end, with its record.
        let late = ufs
            .is_local(path)
            .then(pagestore_client::localfs::LateAttributes::default);
        // Two parts upload at once, each on its own, while the body's next part arrives.
        let mut pending = PartUploads::new(2);
        let mut size = 0u64;
        // The MD5 and checksums of the body and the version the write gave the object.
        let result: Result<((String, Checksums), Option<String>), S3Error> = async {
            while let Some(chunk) = body.next().await? {
                digests.update(&chunk);
                size += chunk.len() as u64;
                buf.extend_from_slice(&chunk);
                while buf.len() >= WRITE_CHUNK {
                    let part = buf.split_to(WRITE_CHUNK).freeze();
                    if upload.is_none() {
                        upload = Some(
                            ufs.put_multipart_late(
                                path,
                                mode.clone(),
                                attributes.clone(),
                                late.as_ref(),
                            )
                            .await
                            .map_err(store_error)?,
                        );
                    }
                    if let Some(u) = upload.as_mut() {
                        pending
                            .start(u.put_part(part.into()))
                            .await
                            .map_err(|e| upload_error(path, e))?;
                    }
                }
            }
            let md5 = digests.verify(trailers.and_then(TrailingHeaders::take).as_ref())?;
            let recorded = record::with_record(attributes.clone(), &Record::of_put(size, &md5));
            let version = match upload.as_mut() {
                None => match ufs
                    .put_if(path, buf.split().freeze(), mode.clone(), recorded)
                    .await
                    .map_err(store_error)?
                {
                    PutOutcome::Written(v) => v,
                    PutOutcome::ConditionFailed => {
                        return Err(precondition_failed(
                            "the object changed (or appeared) during the request",
                        ))
                    }
                },
                Some(u) => {
                    if !buf.is_empty() {
                        pending
                            .start(u.put_part(buf.split().freeze().into()))
                            .await
                            .map_err(|e| upload_error(path, e))?;
                    }
                    pending.finish().await.map_err(|e| upload_error(path, e))?;
                    if let Some(late) = &late {
                        late.set(recorded);
                    }
                    let done = u.complete().await.map_err(|e| upload_error(path, e))?;
                    written_version(&done)
                }
            };
            Ok((md5, version))
        }
        .await;
        let ((md5, checksums), version) = match result {
            Ok(v) => v,
            Err(e) => {
                drop(pending);
                if let Some(mut u) = upload {
                    let _ = u.abort().await;
                }
                body.drain().await;
                return Err(self.write_failed(path, e).await);
            }
        };
        self.client.invalidate(path, old).await;
        // S3's ETag of an object written in one piece is the MD5 of its bytes: this version
        // is reported with it (see `Aliases`). The version is the write's own answer, not a
        // stat's, which may already see another writer's object.
        match version {
            Some(v) => self.aliases.set(path, &v, &md5, checksums, Vec::new()),
            None => self.aliases.forget(path),
        }
        ufs.stat(path).await.map_err(store_error)
    }
}

impl Gateway {
    /// [`Gateway::write_object`] for a `write=back` or `write=transient` mount: the body is
    /// written through the cluster (acknowledged once durable on its write replicas, flushed
    /// to the store later) and appears whole, with the body's MD5 as its ETag, only when it
    /// was complete and matched its digests. A condition (`If-None-Match: *`, `If-Match`) is
    /// checked here first (412, or 404 for If-Match on a missing key) and again by the path's
    /// metadata owner when the file is committed, atomically with the commit. The object's
    /// attributes (Content-Type, user metadata) are kept with the file by the cluster and
    /// written with it to the store when it is flushed.
    async fn write_object_cached(
        &self,
        path: &str,
        body: Option<StreamingBlob>,
        headers: &HeaderMap,
        trailers: Option<&TrailingHeaders>,
        cond: &WriteCondition,
        attributes: Attributes,
    ) -> S3Result<ObjectInfo> {
        let mut body = BodyReader::new(body, headers);
        let expect = match self.cached_expect(path, cond).await {
            Ok(e) => e,
            Err(e) => {
                body.drain().await;
                return Err(e);
            }
        };
        let result: S3Result<(ObjectInfo, (String, Checksums))> = async {
            let mut digests = Digests::from_headers(headers)?;
            let options = pagestore_client::WriteOptions {
                expect,
                attrs: pagestore_client::ufs::wire_attrs(&attributes),
                ..Default::default()
            };
            let mut w = self
                .client
                .create(path, options)
                .await
                .map_err(|e| Self::cached_write_error(path, e))?;
            let mut at = 0u64;
            while let Some(chunk) = body.next().await? {
                digests.update(&chunk);
                w.write_at(at, &chunk).await.map_err(client_error)?;
                at += chunk.len() as u64;
            }
            let md5 = digests.verify(trailers.and_then(TrailingHeaders::take).as_ref())?;
            let recorded = record::with_record(attributes, &Record::of_put(at, &md5));
            w.set_attrs(pagestore_client::ufs::wire_attrs(&recorded))
                .map_err(client_error)?;
            let info = w
                .close()
                .await
                .map_err(|e| Self::cached_write_error(path, e))?;
            Ok((info, md5))
        }
        .await;
        match result {
            Ok((info, (md5, checksums))) => {
                self.aliases
                    .set(path, &info.version, &md5, checksums, Vec::new());
                Ok(info)
            }
            Err(e) => {
                // The writer, dropped before its commit, had its pages dropped.
                body.drain().await;
                Err(e)
            }
        }
    }

    /// What a write-back commit of `path` must find there for `cond` to hold, from the object
    /// there now (a condition that already fails is answered here).
    pub(super) async fn cached_expect(
        &self,
        path: &str,
        cond: &WriteCondition,
    ) -> S3Result<Expect> {
        if *cond == WriteCondition::None {
            return Ok(Expect::Any);
        }
        let current = match self.client.stat(path).await {
            Ok(i) => Some(i),
            Err(pagestore_client::Error::NotFound(_)) => None,
            Err(e) => return Err(client_error(e)),
        };
        if let Some(i) = &current {
            self.recall(i).await;
        }
        Ok(match self.mode_on(cond, current.as_ref())? {
            PutMode::Overwrite => Expect::Any,
            PutMode::Create => Expect::Absent,
            PutMode::Update(v) => Expect::Version(
                v.e_tag
                    .as_deref()
                    .unwrap_or_default()
                    .trim_matches('"')
                    .to_string(),
            ),
        })
    }

    /// A cluster write's error: a file/directory conflict is 409, as on a store written
    /// through (`conflict_or`).
    fn cached_write_error(path: &str, e: pagestore_client::Error) -> S3Error {
        match &e {
            pagestore_client::Error::IsDir(_) | pagestore_client::Error::NotDir(_) => {
                let key = key_of(path);
                conflict(format!(
                    "{key:?}: a key cannot be both an object and a prefix here (a key beneath \
                     an object, or an object where keys lie beneath)"
                ))
            }
            _ => client_error(e),
        }
    }

    /// A failed write: a store failure may be an object/prefix conflict (409).
    pub(super) async fn write_failed(&self, path: &str, e: S3Error) -> S3Error {
        if matches!(
            e.code(),
            S3ErrorCode::ServiceUnavailable | S3ErrorCode::InternalError | S3ErrorCode::NoSuchKey
        ) {
            self.conflict_or(path, e).await
        } else {
            e
        }
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
    pub(super) expected: Option<u64>,
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
        let cond = o.e_tag.clone().map(ETagCondition::ETag);
        let result = match super::keys::check_version_id(o.version_id.as_deref())
            .and_then(|()| key_path(&input.bucket, &o.key))
        {
            Ok(path) => gw.delete_key(path, cond.as_ref()).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) if !quiet => deleted.push(DeletedObject {
                key: Some(o.key),
                version_id: o.version_id,
                ..DeletedObject::default()
            }),
            Ok(()) => {}
            Err(e) => errors.push(s3s::dto::Error {
                code: Some(e.code().as_str().to_string()),
                key: Some(o.key),
                message: e.message().map(str::to_string),
                version_id: o.version_id,
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

/// The key of the logical path `/bucket/key` (the path itself if it has no key).
fn key_of(path: &str) -> &str {
    path.splitn(3, '/').nth(2).unwrap_or(path)
}
