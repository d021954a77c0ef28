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
use object_store::{Attributes, PutMode};
use pagestore_client::ufs::{written_version, PartUploads};
use s3s::{
    crypto::{Checksum as _, Md5},
    dto::{
        CompleteMultipartUploadInput, CompleteMultipartUploadOutput, ETag,
        ListMultipartUploadsInput, ListMultipartUploadsOutput, ListPartsInput, ListPartsOutput,
        MultipartUpload, Part, Timestamp,
    },
    S3Error, S3ErrorCode, S3Request, S3Response, S3Result, TrailingHeaders,
};
use tokio::io::AsyncWriteExt;

use super::{
    checks::{hex, Checksums, Digests},
    cond::WriteCondition,
    errors::{internal, invalid, io_failure, store_error, upload_error},
    write::{BodyReader, WRITE_CHUNK},
    Gateway, MAX_KEYS,
};

/// Completed uploads remembered for retries of their CompleteMultipartUpload.
const MAX_DONE: usize = 1000;

/// Store versions remembered with the S3 ETag of the write that made them.
const MAX_ALIASES: usize = 100_000;

/// S3's ETag of a multipart object: the MD5 of the parts' binary MD5s, `-` and the number of
/// parts.
pub(super) fn multipart_etag(part_tags: &[&str]) -> String {
    let mut h = Md5::new();
    for t in part_tags {
        let hex = t.trim_matches('"');
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .filter_map(|i| hex.get(2 * i..2 * i + 2))
            .filter_map(|b| u8::from_str_radix(b, 16).ok())
            .collect();
        h.update(&bytes);
    }
    format!("{}-{}", hex(h.finalize().as_ref()), part_tags.len())
}

/// The ETags this gateway gave objects it wrote (S3's: the MD5 of the bytes for a PutObject,
/// `md5-N` for a multipart upload), by logical path with the store version they name: HEAD,
/// GET and listings report that ETag while the object keeps that version, and while this
/// gateway runs.
#[derive(Default)]
pub(super) struct Aliases(Mutex<HashMap<String, Alias>>);

/// What [`Aliases`] keeps of an object: the version, its S3 ETag, and the checksums its
/// writer named.
struct Alias {
    version: String,
    etag: String,
    checksums: Checksums,
}

impl Aliases {
    /// The S3 ETag of version `version` of `path`, if this gateway wrote it.
    pub(super) fn get(&self, path: &str, version: &str) -> Option<String> {
        self.with(path, version, |a| a.etag.clone())
    }

    /// The checksums the writer of version `version` of `path` named, if this gateway wrote it.
    pub(super) fn checksums(&self, path: &str, version: &str) -> Option<Checksums> {
        self.with(path, version, |a| a.checksums.clone())
    }

    fn with<T>(&self, path: &str, version: &str, f: impl FnOnce(&Alias) -> T) -> Option<T> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(path).filter(|a| a.version == version).map(f)
    }

    pub(super) fn set(&self, path: &str, version: &str, etag: &str, checksums: Checksums) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_ALIASES && !m.contains_key(path) {
            // Forgetting only changes what later reads report (the store's tag, no checksum).
            m.clear();
        }
        let alias = Alias {
            version: version.to_string(),
            etag: etag.to_string(),
            checksums,
        };
        m.insert(path.to_string(), alias);
    }

    pub(super) fn forget(&self, path: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
    }
}

/// Parts of a multipart upload must be at least this large, except the last (as in S3).
const MIN_PART: u64 = 5 << 20;

/// Part numbers go from 1 to this (as in S3).
pub(super) const MAX_PART_NUMBER: i32 = 10_000;

/// 400 for a part number outside `1..=MAX_PART_NUMBER`.
pub(super) fn check_part_number(n: i32) -> S3Result<()> {
    if (1..=MAX_PART_NUMBER).contains(&n) {
        Ok(())
    } else {
        Err(invalid(format!(
            "part number {n} is not between 1 and {MAX_PART_NUMBER}"
        )))
    }
}

/// Names of upload directories under the staging directory.
const UPLOAD_DIR_PREFIX: &str = "upload-";

/// CompleteMultipartUpload: checks the part list, sends the staged parts (under the request's
/// If-Match / If-None-Match condition, done by the store), then invalidates the cluster's pages
/// of the object. The answer's ETag is S3's `md5-N` form. A retry of a completed upload with
/// the same parts answers the same again.
pub(super) async fn complete_multipart_upload(
    gw: &Gateway,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let input = req.input;
    let path = gw.write_path(&input.bucket, &input.key)?;
    gw.may_write(&path)?;
    let cond = WriteCondition::of(input.if_match.as_ref(), input.if_none_match.as_ref())?;
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
    let answer = |tag: String| {
        S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            e_tag: Some(ETag::Strong(tag)),
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            ..CompleteMultipartUploadOutput::default()
        })
    };
    let (files, tag, attributes) =
        match gw
            .uploads
            .begin_complete(&input.upload_id, &path, &wanted)?
        {
            Begun::Again(tag) => return Ok(answer(tag)),
            Begun::Started(files, tag, attributes) => (files, tag, attributes),
        };
    let sent = async {
        if gw.cached(&path) {
            // The condition is checked again, atomically, when the cluster commits the file.
            let expect = gw.cached_expect(&path, &cond).await?;
            let version =
                send_parts_through_cluster(gw, &path, &files, expect, &attributes).await?;
            return Ok::<_, S3Error>((None, Some(version)));
        }
        let ufs = gw.writable()?;
        let (mode, old) = gw.write_mode(&path, &cond).await?;
        let version = send_parts(ufs, &path, &files, mode, attributes).await?;
        Ok::<_, S3Error>((old, version))
    }
    .await;
    let (old, version) = match sent {
        Ok(old) => old,
        Err(e) => {
            gw.uploads.end_complete(&input.upload_id, None).await;
            return Err(gw.write_failed(&path, e).await);
        }
    };
    gw.uploads
        .end_complete(&input.upload_id, Some((&wanted, &tag)))
        .await;
    gw.client.invalidate(&path, old).await;
    // The version this upload wrote (not a stat's: another writer may have come since).
    match version {
        Some(v) => gw.aliases.set(&path, &v, &tag, Checksums::default()),
        None => gw.aliases.forget(&path),
    }
    Ok(answer(tag))
}

/// ListParts: the parts staged so far for an upload under way, in part number order.
pub(super) async fn list_parts(
    gw: &Gateway,
    req: S3Request<ListPartsInput>,
) -> S3Result<S3Response<ListPartsOutput>> {
    let input = req.input;
    let path = gw.write_path(&input.bucket, &input.key)?;
    let max = match input.max_parts {
        None => MAX_KEYS,
        Some(n) if n < 0 => return Err(invalid(format!("max-parts {n} is negative"))),
        Some(n) => (n as usize).min(MAX_KEYS),
    };
    let marker = input.part_number_marker.unwrap_or(0);
    let (parts, more) = gw.uploads.parts(&input.upload_id, &path, marker, max)?;
    let next = parts.last().map(|p| p.number).filter(|_| more);
    Ok(S3Response::new(ListPartsOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(input.upload_id),
        max_parts: Some(max as i32),
        part_number_marker: input.part_number_marker,
        next_part_number_marker: next,
        is_truncated: Some(more),
        storage_class: Some(s3s::dto::StorageClass::from_static(
            s3s::dto::StorageClass::STANDARD,
        )),
        parts: Some(
            parts
                .into_iter()
                .map(|p| Part {
                    part_number: Some(p.number),
                    e_tag: Some(ETag::Strong(p.etag)),
                    size: Some(p.size.try_into().unwrap_or(i64::MAX)),
                    last_modified: Some(Timestamp::from(p.staged)),
                    ..Part::default()
                })
                .collect(),
        ),
        ..ListPartsOutput::default()
    }))
}

/// ListMultipartUploads: the uploads under way in this gateway for keys of the bucket under
/// `prefix`, in key order (then by upload id), after the key and upload id markers.
pub(super) async fn list_multipart_uploads(
    gw: &Gateway,
    req: S3Request<ListMultipartUploadsInput>,
) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
    let input = req.input;
    gw.require_bucket(&input.bucket).await?;
    if input.delimiter.as_deref().is_some_and(|d| !d.is_empty()) {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "ListMultipartUploads with a delimiter",
        ));
    }
    let max = match input.max_uploads {
        None => MAX_KEYS,
        Some(n) if n < 0 => return Err(invalid(format!("max-uploads {n} is negative"))),
        Some(n) => (n as usize).min(MAX_KEYS),
    };
    let prefix = input.prefix.clone().unwrap_or_default();
    let key_marker = input.key_marker.clone().unwrap_or_default();
    let id_marker = input.upload_id_marker.clone().unwrap_or_default();
    let bucket_dir = format!("/{}/", input.bucket);
    let mut all: Vec<(String, String, SystemTime)> = gw
        .uploads
        .list()
        .into_iter()
        .filter_map(|(id, path, t)| {
            let key = path.strip_prefix(&bucket_dir)?.to_string();
            key.starts_with(&prefix).then_some((key, id, t))
        })
        .filter(|(key, id, _)| {
            key_marker.is_empty()
                || key.as_str() > key_marker.as_str()
                || (key == &key_marker && !id_marker.is_empty() && id.as_str() > id_marker.as_str())
        })
        .collect();
    all.sort();
    let truncated = all.len() > max;
    all.truncate(max);
    let last = all.last().cloned();
    let uploads = all
        .into_iter()
        .map(|(key, id, t)| MultipartUpload {
            initiated: Some(Timestamp::from(t)),
            key: Some(key),
            upload_id: Some(id),
            storage_class: Some(s3s::dto::StorageClass::from_static(
                s3s::dto::StorageClass::STANDARD,
            )),
            ..MultipartUpload::default()
        })
        .collect();
    Ok(S3Response::new(ListMultipartUploadsOutput {
        bucket: Some(input.bucket),
        prefix: input.prefix,
        key_marker: input.key_marker,
        upload_id_marker: input.upload_id_marker,
        max_uploads: Some(max as i32),
        is_truncated: Some(truncated),
        next_key_marker: last.as_ref().filter(|_| truncated).map(|l| l.0.clone()),
        next_upload_id_marker: last.filter(|_| truncated).map(|l| l.1),
        uploads: Some(uploads),
        encoding_type: input.encoding_type,
        ..ListMultipartUploadsOutput::default()
    }))
}

/// Writes staged part files, in order, as one file through the cluster (a `write=back` or
/// `write=transient` mount) with the upload's `attributes`, committed only if the path holds
/// what `expect` says. Returns the file's version.
async fn send_parts_through_cluster(
    gw: &Gateway,
    path: &str,
    files: &[PathBuf],
    expect: pagestore_protocol::frame::Expect,
    attributes: &Attributes,
) -> S3Result<String> {
    use tokio::io::AsyncReadExt;
    let options = pagestore_client::WriteOptions {
        expect,
        attrs: pagestore_client::ufs::wire_attrs(attributes),
        ..Default::default()
    };
    let mut w = gw
        .client
        .create(path, options)
        .await
        .map_err(super::errors::client_error)?;
    let mut at = 0u64;
    let mut buf = vec![0u8; 4 << 20];
    for f in files {
        let mut file = tokio::fs::File::open(f)
            .await
            .map_err(|e| internal(format!("staged part {}: {e}", f.display())))?;
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|e| internal(format!("staged part {}: {e}", f.display())))?;
            if n == 0 {
                break;
            }
            w.write_at(at, &buf[..n])
                .await
                .map_err(super::errors::client_error)?;
            at += n as u64;
        }
    }
    let info = w.close().await.map_err(super::errors::client_error)?;
    Ok(info.version)
}

/// Streams staged part files, in order, to a multipart upload of the under storage, re-cut
/// into [`WRITE_CHUNK`] parts (which meets every store's minimum part size).
async fn send_parts(
    ufs: &pagestore_client::ufs::MountTable,
    path: &str,
    files: &[PathBuf],
    mode: PutMode,
    attributes: Attributes,
) -> S3Result<Option<String>> {
    use tokio::io::AsyncReadExt;
    let fail = internal;
    let mut upload = ufs
        .put_multipart_if(path, mode, attributes)
        .await
        .map_err(store_error)?;
    let result: S3Result<Option<String>> = async {
        // Two parts upload at once, each on its own, while the next is read.
        let mut pending = PartUploads::new(2);
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
                    pending
                        .start(upload.put_part(part.into()))
                        .await
                        .map_err(|e| upload_error(path, e))?;
                    sent_any = true;
                }
            }
        }
        if !buf.is_empty() || !sent_any {
            pending
                .start(upload.put_part(buf.split().freeze().into()))
                .await
                .map_err(|e| upload_error(path, e))?;
        }
        pending.finish().await.map_err(|e| upload_error(path, e))?;
        let done = upload.complete().await.map_err(|e| upload_error(path, e))?;
        Ok(written_version(&done))
    }
    .await;
    if result.is_err() {
        let _ = upload.abort().await;
    }
    result
}

/// A staged part as ListParts shows it.
struct StagedPart {
    number: i32,
    etag: String,
    size: u64,
    staged: SystemTime,
}

struct PartFile {
    etag: String,
    size: u64,
    file: PathBuf,
    staged: SystemTime,
}

struct Upload {
    /// The logical path the upload writes.
    path: String,
    dir: PathBuf,
    parts: BTreeMap<i32, PartFile>,
    /// CompleteMultipartUpload is sending the parts.
    completing: bool,
    initiated: SystemTime,
    /// Content-Type and the like, given at CreateMultipartUpload.
    attributes: Attributes,
}

/// The part list of a CompleteMultipartUpload: part numbers with the ETags given.
type PartList = [(i32, Option<String>)];

/// A completed upload, for retries of its CompleteMultipartUpload.
struct Done {
    path: String,
    parts: Vec<(i32, Option<String>)>,
    etag: String,
}

/// What [`Uploads::begin_complete`] found.
enum Begun {
    /// The upload is completing now: its part files in order, the object's ETag, and the
    /// attributes to keep with it.
    Started(Vec<PathBuf>, String, Attributes),
    /// The upload was completed before with the same parts: its ETag.
    Again(String),
}

pub(super) struct Uploads {
    dir: PathBuf,
    open: Mutex<HashMap<String, Upload>>,
    done: Mutex<(HashMap<String, Done>, std::collections::VecDeque<String>)>,
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
            done: Mutex::new((HashMap::new(), std::collections::VecDeque::new())),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Upload>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) async fn create(&self, path: String, attributes: Attributes) -> S3Result<String> {
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
                initiated: SystemTime::now(),
                attributes,
            },
        );
        Ok(id)
    }

    /// The staged parts of upload `id` for `path` after part `marker`, at most `max`; and
    /// whether more follow.
    fn parts(
        &self,
        id: &str,
        path: &str,
        marker: i32,
        max: usize,
    ) -> S3Result<(Vec<StagedPart>, bool)> {
        let open = self.lock();
        let u = match open.get(id) {
            Some(u) if u.path == path => u,
            _ => return Err(no_such_upload(id)),
        };
        let mut v: Vec<_> = u
            .parts
            .range(marker.saturating_add(1)..)
            .map(|(n, p)| StagedPart {
                number: *n,
                etag: p.etag.clone(),
                size: p.size,
                staged: p.staged,
            })
            .take(max.saturating_add(1))
            .collect();
        let more = v.len() > max;
        v.truncate(max);
        Ok((v, more))
    }

    /// The uploads under way: id, logical path, start time.
    fn list(&self) -> Vec<(String, String, SystemTime)> {
        self.lock()
            .iter()
            .map(|(id, u)| (id.clone(), u.path.clone(), u.initiated))
            .collect()
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
        let mut size = 0u64;
        let written: S3Result<String> = async {
            while let Some(chunk) = body.next().await? {
                digests.update(&chunk);
                size += chunk.len() as u64;
                file.write_all(&chunk).await.map_err(fail)?;
            }
            file.flush().await.map_err(fail)?;
            // S3's part ETag: the MD5 of the part.
            digests
                .verify(trailers.and_then(TrailingHeaders::take).as_ref())
                .map(|(md5, _)| md5)
        }
        .await;
        drop(file);
        let etag = match written {
            Ok(md5) => md5,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                body.drain().await;
                return Err(e);
            }
        };
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
                        staged: SystemTime::now(),
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
    fn begin_complete(&self, id: &str, path: &str, wanted: &PartList) -> S3Result<Begun> {
        let mut open = self.lock();
        let u = match open.get_mut(id) {
            Some(u) if u.path == path && !u.completing => u,
            Some(u) if u.completing => {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidRequest,
                    "the upload is already being completed",
                ))
            }
            _ => {
                let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
                return match done.0.get(id) {
                    Some(d) if d.path == path && d.parts == wanted => {
                        Ok(Begun::Again(d.etag.clone()))
                    }
                    Some(_) => Err(S3Error::with_message(
                        S3ErrorCode::InvalidPart,
                        "the upload was completed with other parts",
                    )),
                    None => Err(no_such_upload(id)),
                };
            }
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
        let tags: Vec<&str> = wanted
            .iter()
            .filter_map(|(n, _)| u.parts.get(n).map(|p| p.etag.as_str()))
            .collect();
        let etag = multipart_etag(&tags);
        u.completing = true;
        Ok(Begun::Started(files, etag, u.attributes.clone()))
    }

    /// Ends a completion: on success (the parts and the ETag) the upload and its files go and
    /// the completion is remembered for retries; on failure it can be completed again.
    async fn end_complete(&self, id: &str, done: Option<(&PartList, &str)>) {
        let dir = {
            let mut open = self.lock();
            if let Some((parts, etag)) = done {
                let u = open.remove(id);
                if let Some(u) = &u {
                    let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
                    d.0.insert(
                        id.to_string(),
                        Done {
                            path: u.path.clone(),
                            parts: parts.to_vec(),
                            etag: etag.to_string(),
                        },
                    );
                    d.1.push_back(id.to_string());
                    while d.1.len() > MAX_DONE {
                        if let Some(old) = d.1.pop_front() {
                            d.0.remove(&old);
                        }
                    }
                }
                u.map(|u| u.dir)
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
