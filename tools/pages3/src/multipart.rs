//! Multipart uploads staged on local disk: parts wait in the staging directory until
//! CompleteMultipartUpload sends them, in order, to a multipart upload of the under storage.
//! Uploads outlive the gateway (`staging.rs`).

mod staging;

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
    checksum::ChecksumHasher,
    crypto::{Checksum as _, Md5},
    dto::{
        ChecksumAlgorithm, ChecksumType, CompleteMultipartUploadInput,
        CompleteMultipartUploadOutput, ETag, ListMultipartUploadsInput, ListMultipartUploadsOutput,
        ListPartsInput, ListPartsOutput, MultipartUpload, Part, Timestamp,
    },
    S3Error, S3ErrorCode, S3Request, S3Response, S3Result, TrailingHeaders,
};
use tokio::io::AsyncWriteExt;

use super::{
    aliases::PartInfo,
    checks::{
        algorithm_index, algorithm_name, bad_checksum, base64_decode, composite, hasher_of, hex,
        same_object_checksum, value_at, Checksums, Digests,
    },
    cond::WriteCondition,
    errors::{internal, invalid, io_failure, store_error, upload_error},
    record::{self, Record},
    write::{BodyReader, WRITE_CHUNK},
    Gateway, MAX_KEYS,
};

/// Completed uploads remembered for retries of their CompleteMultipartUpload.
const MAX_DONE: usize = 1000;

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

/// CompleteMultipartUpload: checks the part list (ETags, and the part checksums it names),
/// sends the staged parts (under the request's If-Match / If-None-Match condition, done by the
/// store), then invalidates the cluster's pages of the object. The answer's ETag is S3's
/// `md5-N` form; an upload created with a checksum algorithm answers the object's checksum
/// (COMPOSITE: of the parts' checksums, checked before anything is sent; FULL_OBJECT: of the
/// bytes, computed while they are sent and checked before the object is committed). A retry
/// of a completed upload with the same parts answers the same again.
pub(super) async fn complete_multipart_upload(
    gw: &Gateway,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let input = req.input;
    let path = gw.write_path(&input.bucket, &input.key)?;
    gw.may_write(&path)?;
    let cond = WriteCondition::of(input.if_match.as_ref(), input.if_none_match.as_ref())?;
    let wanted: Vec<Wanted> = input
        .multipart_upload
        .and_then(|m| m.parts)
        .unwrap_or_default()
        .into_iter()
        .map(|p| Wanted {
            number: p.part_number.unwrap_or(0),
            etag: p.e_tag.map(|t| t.value().trim_matches('"').to_string()),
            checksums: [
                p.checksum_crc32,
                p.checksum_crc32c,
                p.checksum_sha1,
                p.checksum_sha256,
                p.checksum_crc64nvme,
            ],
        })
        .collect();
    let whole = WholeSum {
        values: [
            input.checksum_crc32.clone(),
            input.checksum_crc32c.clone(),
            input.checksum_sha1.clone(),
            input.checksum_sha256.clone(),
            input.checksum_crc64nvme.clone(),
        ],
        composite: match input.checksum_type.as_ref().map(|t| t.as_str()) {
            None => None,
            Some(t) if t.eq_ignore_ascii_case(ChecksumType::COMPOSITE) => Some(true),
            Some(t) if t.eq_ignore_ascii_case(ChecksumType::FULL_OBJECT) => Some(false),
            Some(t) => return Err(invalid(format!("x-amz-checksum-type {t:?} is not one"))),
        },
    };
    let answer = |tag: String, sums: &Checksums| {
        let [crc32, crc32c, sha1, sha256, crc64nvme] = sums.values.clone();
        S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            e_tag: Some(ETag::Strong(tag)),
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            checksum_crc32: crc32,
            checksum_crc32c: crc32c,
            checksum_sha1: sha1,
            checksum_sha256: sha256,
            checksum_crc64nvme: crc64nvme,
            checksum_type: sums.checksum_type(),
            ..CompleteMultipartUploadOutput::default()
        })
    };
    let c = match gw
        .uploads
        .begin_complete(&input.upload_id, &path, &wanted, &whole)?
    {
        Begun::Again(tag, sums) => return Ok(answer(tag, &sums)),
        Begun::Started(c) => c,
    };
    let Completing {
        files,
        etag: tag,
        attributes,
        parts,
        sum,
    } = *c;
    // What the object is recorded with (its checksum too, once known).
    let recorded = Record {
        size: parts.iter().map(|p| p.size).sum(),
        etag: tag.clone(),
        checksums: sum.known(),
        parts: parts.clone(),
    };
    let sent = async {
        let to_send = ToSend {
            files: &files,
            attributes,
            recorded,
            sum,
        };
        if gw.cached(&path) {
            // The condition is checked again, atomically, when the cluster commits the file.
            let expect = gw.cached_expect(&path, &cond).await?;
            let (version, sums) = send_parts_through_cluster(gw, &path, to_send, expect).await?;
            return Ok::<_, S3Error>((None, Some(version), sums));
        }
        let ufs = gw.writable()?;
        let (mode, old) = gw.write_mode(&path, &cond).await?;
        let (version, sums) = send_parts(ufs, &path, to_send, mode).await?;
        Ok::<_, S3Error>((old, version, sums))
    }
    .await;
    let (old, version, sums) = match sent {
        Ok(sent) => sent,
        Err(e) => {
            gw.uploads.end_complete(&input.upload_id, None).await;
            return Err(gw.write_failed(&path, e).await);
        }
    };
    gw.uploads
        .end_complete(&input.upload_id, Some((&wanted, &tag, &sums)))
        .await;
    gw.client.invalidate(&path, old).await;
    // The version this upload wrote (not a stat's: another writer may have come since).
    match version {
        Some(v) => gw.aliases.set(&path, &v, &tag, sums.clone(), parts),
        None => gw.aliases.forget(&path),
    }
    Ok(answer(tag, &sums))
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
                .map(|p| {
                    let [crc32, crc32c, sha1, sha256, crc64nvme] = p.checksums.values;
                    Part {
                        part_number: Some(p.number),
                        e_tag: Some(ETag::Strong(p.etag)),
                        size: Some(p.size.try_into().unwrap_or(i64::MAX)),
                        last_modified: Some(Timestamp::from(p.staged)),
                        checksum_crc32: crc32,
                        checksum_crc32c: crc32c,
                        checksum_sha1: sha1,
                        checksum_sha256: sha256,
                        checksum_crc64nvme: crc64nvme,
                    }
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
/// what `expect` says and its checksum is `sum`'s. Returns the file's version and checksums.
async fn send_parts_through_cluster(
    gw: &Gateway,
    path: &str,
    mut to_send: ToSend<'_>,
    expect: pagestore_protocol::frame::Expect,
) -> S3Result<(String, Checksums)> {
    use tokio::io::AsyncReadExt;
    let files = to_send.files;
    let options = pagestore_client::WriteOptions {
        expect,
        attrs: pagestore_client::ufs::wire_attrs(&to_send.attributes),
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
        let mut file = f.open().await?;
        let mut check = ReadBack::default();
        loop {
            let n = file.read(&mut buf).await.map_err(|e| f.io_error(&e))?;
            if n == 0 {
                break;
            }
            check.update(&buf[..n]);
            to_send.sum.update(&buf[..n]);
            w.write_at(at, &buf[..n])
                .await
                .map_err(super::errors::client_error)?;
            at += n as u64;
        }
        f.verify(check)?;
    }
    // A wrong checksum drops the writer uncommitted: the file never appears.
    let (sums, kept) = to_send.done()?;
    w.set_attrs(pagestore_client::ufs::wire_attrs(&kept))
        .map_err(super::errors::client_error)?;
    let info = w.close().await.map_err(super::errors::client_error)?;
    Ok((info.version, sums))
}

/// Streams staged part files, in order, to a multipart upload of the under storage, re-cut
/// into [`WRITE_CHUNK`] parts (which meets every store's minimum part size), completed only if
/// the object's checksum is `sum`'s (else aborted). Returns the version written (if the store
/// tells) and the object's checksums.
async fn send_parts(
    ufs: &pagestore_client::ufs::MountTable,
    path: &str,
    mut to_send: ToSend<'_>,
    mode: PutMode,
) -> S3Result<(Option<String>, Checksums)> {
    use tokio::io::AsyncReadExt;
    let files = to_send.files;
    // A `file://` mount takes the attributes at the end, with the object's checksum recorded;
    // another store those recorded before the bytes are sent (a FULL_OBJECT checksum is not).
    let late = ufs
        .is_local(path)
        .then(pagestore_client::localfs::LateAttributes::default);
    let first = record::with_record(to_send.attributes.clone(), &to_send.recorded);
    let mut upload = ufs
        .put_multipart_late(path, mode, first, late.as_ref())
        .await
        .map_err(store_error)?;
    let result: S3Result<(Option<String>, Checksums)> = async {
        // Two parts upload at once, each on its own, while the next is read.
        let mut pending = PartUploads::new(2);
        let mut buf = BytesMut::with_capacity(WRITE_CHUNK);
        let mut sent_any = false;
        for f in files {
            let mut file = f.open().await?;
            let mut check = ReadBack::default();
            loop {
                if buf.capacity() - buf.len() == 0 {
                    buf.reserve(WRITE_CHUNK - buf.len());
                }
                let n = file.read_buf(&mut buf).await.map_err(|e| f.io_error(&e))?;
                if n == 0 {
                    break;
                }
                let len = buf.len();
                check.update(&buf[len - n..]);
                to_send.sum.update(&buf[len - n..]);
                if buf.len() >= WRITE_CHUNK {
                    let part = buf.split_to(WRITE_CHUNK).freeze();
                    pending
                        .start(upload.put_part(part.into()))
                        .await
                        .map_err(|e| upload_error(path, e))?;
                    sent_any = true;
                }
            }
            // Before the store's upload completes: a damaged part aborts it.
            f.verify(check)?;
        }
        if !buf.is_empty() || !sent_any {
            pending
                .start(upload.put_part(buf.split().freeze().into()))
                .await
                .map_err(|e| upload_error(path, e))?;
        }
        pending.finish().await.map_err(|e| upload_error(path, e))?;
        let (sums, kept) = to_send.done()?;
        if let Some(late) = &late {
            late.set(kept);
        }
        let done = upload.complete().await.map_err(|e| upload_error(path, e))?;
        Ok((written_version(&done), sums))
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
    checksums: Checksums,
}

struct PartFile {
    etag: String,
    size: u64,
    /// The CRC32 of the bytes written to `file`, checked when they are read back.
    crc: u32,
    file: PathBuf,
    staged: SystemTime,
    /// The checksums the part's request named, and the upload's algorithm's.
    checksums: Checksums,
}

/// A staged part as a completion sends it: its file, and the length and CRC32 of the bytes
/// UploadPart wrote there, checked as the file is read back (a staging disk that damaged or
/// cut them must not send them to the store).
struct Staged {
    number: i32,
    file: PathBuf,
    size: u64,
    crc: u32,
}

/// What was read back of a staged part.
#[derive(Default)]
struct ReadBack {
    len: u64,
    crc: crc32fast::Hasher,
}

impl ReadBack {
    fn update(&mut self, data: &[u8]) {
        self.len += data.len() as u64;
        self.crc.update(data);
    }
}

impl Staged {
    async fn open(&self) -> S3Result<tokio::fs::File> {
        tokio::fs::File::open(&self.file)
            .await
            .map_err(|e| self.io_error(&e))
    }

    fn io_error(&self, e: &io::Error) -> S3Error {
        internal(format!("staged part {}: {e}", self.file.display()))
    }

    /// 400 InvalidPart unless the bytes read back are the ones written: the part must be
    /// uploaded again (the completion can then be retried).
    fn verify(&self, read: ReadBack) -> S3Result<()> {
        let crc = read.crc.finalize();
        if read.len == self.size && crc == self.crc {
            return Ok(());
        }
        tracing::error!(
            part = self.number,
            file = %self.file.display(),
            bytes = read.len,
            expected = self.size,
            "a staged part changed on disk after it was uploaded; the completion is refused"
        );
        Err(S3Error::with_message(
            S3ErrorCode::InvalidPart,
            format!(
                "part {}: its copy in the gateway's staging directory changed after it was \
                 uploaded ({} bytes read back of {}, or other bytes); upload the part again",
                self.number, read.len, self.size
            ),
        ))
    }
}

/// The checksum an upload was created with (`x-amz-checksum-algorithm` and `-type`): every
/// part's is computed by its algorithm, and the object's is of the parts' checksums
/// (`composite`, S3's COMPOSITE) or of its bytes (FULL_OBJECT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct UploadSum {
    pub(super) algorithm: usize,
    pub(super) composite: bool,
}

impl UploadSum {
    /// S3's name of the object checksum's type.
    pub(super) fn checksum_type(self) -> ChecksumType {
        ChecksumType::from_static(if self.composite {
            ChecksumType::COMPOSITE
        } else {
            ChecksumType::FULL_OBJECT
        })
    }
}

/// The checksum CreateMultipartUpload asks for: S3's defaults (COMPOSITE, but FULL_OBJECT for
/// CRC64NVME, which has no composite form) and its refusals (no FULL_OBJECT of SHA-1 or
/// SHA-256, no type without an algorithm) apply.
pub(super) fn upload_sum(
    algorithm: Option<&ChecksumAlgorithm>,
    kind: Option<&ChecksumType>,
) -> S3Result<Option<UploadSum>> {
    let Some(a) = algorithm else {
        return match kind {
            None => Ok(None),
            Some(k) => Err(invalid(format!(
                "x-amz-checksum-type {} needs an x-amz-checksum-algorithm",
                k.as_str()
            ))),
        };
    };
    let algorithm = algorithm_index(a.as_str())
        .ok_or_else(|| invalid(format!("checksum algorithm {:?} is not one", a.as_str())))?;
    let crc64 = algorithm == algorithm_index(ChecksumAlgorithm::CRC64NVME).unwrap_or(4);
    let sha = algorithm_name(algorithm).starts_with("SHA");
    let composite = match kind.map(|k| k.as_str().to_ascii_uppercase()) {
        None => !crc64,
        Some(k) if k == ChecksumType::COMPOSITE && !crc64 => true,
        Some(k) if k == ChecksumType::FULL_OBJECT && !sha => false,
        Some(k) => {
            return Err(invalid(format!(
                "checksum type {k} is not available for {}",
                algorithm_name(algorithm)
            )))
        }
    };
    Ok(Some(UploadSum {
        algorithm,
        composite,
    }))
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
    sum: Option<UploadSum>,
}

/// A part of a CompleteMultipartUpload's list: its number, ETag and the checksums given.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wanted {
    number: i32,
    etag: Option<String>,
    checksums: [Option<String>; 5],
}

/// A digest of a CompleteMultipartUpload's part list: two lists have the same one only if they
/// name the same parts with the same ETags and checksums.
fn list_digest(parts: &[Wanted]) -> [u8; 16] {
    let mut h = Md5::new();
    for p in parts {
        h.update(&p.number.to_le_bytes());
        for field in std::iter::once(&p.etag).chain(&p.checksums) {
            // Each field as its length (or none) and its bytes, so that no two lists run
            // together into the same bytes.
            match field {
                Some(v) => {
                    h.update(&(v.len() as u64).to_le_bytes());
                    h.update(v.as_bytes());
                }
                None => h.update(&u64::MAX.to_le_bytes()),
            }
        }
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(h.finalize().as_ref());
    out
}

/// The whole object's checksum a CompleteMultipartUpload names (by algorithm) and the type.
struct WholeSum {
    values: [Option<String>; 5],
    /// `x-amz-checksum-type`: COMPOSITE (true) or FULL_OBJECT.
    composite: Option<bool>,
}

/// A completed upload, for retries of its CompleteMultipartUpload.
struct Done {
    path: String,
    /// The MD5 of the part list it was completed with ([`list_digest`]): 16 bytes, however
    /// many parts.
    parts: [u8; 16],
    etag: String,
    checksums: Checksums,
}

/// What a completion sends: the part files in order, the attributes to keep with the object,
/// what to record with it ([`record`]) and its checksum, known or to compute.
struct ToSend<'a> {
    files: &'a [Staged],
    attributes: Attributes,
    recorded: Record,
    sum: ObjectSum,
}

impl ToSend<'_> {
    /// Once every byte went through `sum`: the object's checksums (400 BadDigest if the client
    /// named another) and the attributes to keep, with the record and those checksums.
    fn done(self) -> S3Result<(Checksums, Attributes)> {
        let sums = self.sum.finish()?;
        let kept = record::with_record(self.attributes, &self.recorded.with_checksums(&sums));
        Ok((sums, kept))
    }
}

/// An upload whose parts are being sent.
struct Completing {
    /// The part files in order.
    files: Vec<Staged>,
    /// The object's ETag.
    etag: String,
    /// The attributes to keep with the object.
    attributes: Attributes,
    parts: Vec<PartInfo>,
    sum: ObjectSum,
}

/// What [`Uploads::begin_complete`] found.
enum Begun {
    Started(Box<Completing>),
    /// The upload was completed before with the same parts: its ETag and checksums.
    Again(String, Checksums),
}

/// A multipart object's checksum: known before its bytes are sent (none, or COMPOSITE), or of
/// its bytes, computed while they are sent (FULL_OBJECT) and compared with the one the client
/// named before the object is committed.
enum ObjectSum {
    Known(Checksums),
    Full {
        algorithm: usize,
        hasher: Box<ChecksumHasher>,
        given: Option<String>,
    },
}

impl ObjectSum {
    /// The checksums known before the bytes are sent (none for FULL_OBJECT).
    fn known(&self) -> Checksums {
        match self {
            ObjectSum::Known(c) => c.clone(),
            ObjectSum::Full { .. } => Checksums::default(),
        }
    }

    fn update(&mut self, data: &[u8]) {
        if let ObjectSum::Full { hasher, .. } = self {
            hasher.update(data);
        }
    }

    /// The object's checksums once every byte went through [`ObjectSum::update`]: 400
    /// BadDigest if the client named another.
    fn finish(self) -> S3Result<Checksums> {
        match self {
            ObjectSum::Known(c) => Ok(c),
            ObjectSum::Full {
                algorithm,
                hasher,
                given,
            } => {
                let value = value_at(hasher.finalize(), algorithm).unwrap_or_default();
                // A full-object checksum has no `-N`: compared as the digests they encode.
                let want = given.map(|g| base64_decode(&g));
                if want.is_some_and(|w| w.is_none() || w != base64_decode(&value)) {
                    return Err(bad_checksum(&algorithm_name(algorithm)));
                }
                Ok(Checksums::one(algorithm, value, false))
            }
        }
    }
}

/// The object's checksum for an upload created with `sum`, given the parts to complete it
/// with and what the CompleteMultipartUpload names: COMPOSITE computed (and compared) here,
/// FULL_OBJECT left to compute while the bytes are sent. 400 InvalidRequest for a checksum
/// of another algorithm or type than the upload's, BadDigest for one that does not match.
fn object_sum(sum: Option<UploadSum>, whole: &WholeSum, parts: &[PartInfo]) -> S3Result<ObjectSum> {
    let named: Vec<usize> = (0..whole.values.len())
        .filter(|&a| whole.values[a].is_some())
        .collect();
    let Some(sum) = sum else {
        if let Some(&a) = named.first() {
            return Err(invalid(format!(
                "the upload was created without a checksum algorithm: a {} checksum of the \
                 object cannot be checked",
                algorithm_name(a)
            )));
        }
        return Ok(ObjectSum::Known(Checksums::default()));
    };
    let a = sum.algorithm;
    if let Some(&other) = named.iter().find(|&&n| n != a) {
        return Err(invalid(format!(
            "the upload was created with {}, not {}",
            algorithm_name(a),
            algorithm_name(other)
        )));
    }
    if whole.composite.is_some_and(|c| c != sum.composite) {
        return Err(invalid(format!(
            "the upload was created with checksum type {}",
            sum.checksum_type().as_str()
        )));
    }
    let given = whole.values[a].clone();
    if !sum.composite {
        return Ok(ObjectSum::Full {
            algorithm: a,
            hasher: Box::new(hasher_of(a)),
            given,
        });
    }
    let values: Option<Vec<&str>> = parts
        .iter()
        .map(|p| p.checksums.values[a].as_deref())
        .collect();
    let value = values
        .and_then(|v| composite(a, &v))
        .ok_or_else(|| internal(format!("a part has no {} checksum", algorithm_name(a))))?;
    if given.is_some_and(|g| !same_object_checksum(&g, &value, parts.len())) {
        return Err(bad_checksum(&algorithm_name(a)));
    }
    Ok(ObjectSum::Known(Checksums::one(a, value, true)))
}

/// Multipart uploads under way at once in one gateway (each holds memory and a staging
/// directory until it is completed or aborted).
const MAX_OPEN_UPLOADS: usize = 10_000;

pub(super) struct Uploads {
    dir: PathBuf,
    /// At most this many uploads under way ([`MAX_OPEN_UPLOADS`]).
    max_open: usize,
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
        // The uploads an earlier run left go on.
        let open = staging::recover(dir)
            .map_err(|e| format!("staging directory {}: {e}", dir.display()))?;
        Ok(Uploads {
            dir: dir.to_path_buf(),
            max_open: MAX_OPEN_UPLOADS,
            open: Mutex::new(open),
            done: Mutex::new((HashMap::new(), std::collections::VecDeque::new())),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Upload>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) async fn create(
        &self,
        path: String,
        attributes: Attributes,
        sum: Option<UploadSum>,
    ) -> S3Result<String> {
        let full = || {
            S3Error::with_message(
                S3ErrorCode::SlowDown,
                format!(
                    "this gateway has {} multipart uploads under way, as many as it takes: \
                     complete or abort some (ListMultipartUploads lists them)",
                    self.max_open
                ),
            )
        };
        if self.lock().len() >= self.max_open && self.expire().await == 0 {
            return Err(full());
        }
        let id = random_id();
        let dir = self.dir.join(format!("{UPLOAD_DIR_PREFIX}{id}"));
        let initiated = SystemTime::now();
        let meta = staging::upload_meta(&path, initiated, &attributes, sum);
        let made = async {
            tokio::fs::create_dir_all(&dir).await?;
            staging::write_whole(&dir.join(staging::UPLOAD_META), &meta)
        }
        .await;
        if let Err(e) = made {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            return Err(io_failure(
                &format!("staging directory {}", dir.display()),
                e,
            ));
        }
        // Others may have begun meanwhile.
        let taken = {
            let mut open = self.lock();
            let room = open.len() < self.max_open;
            if room {
                open.insert(
                    id.clone(),
                    Upload {
                        path,
                        dir: dir.clone(),
                        parts: BTreeMap::new(),
                        completing: false,
                        initiated,
                        attributes,
                        sum,
                    },
                );
            }
            room
        };
        if !taken {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            return Err(full());
        }
        Ok(id)
    }

    /// Removes the uploads begun more than [`staging::MAX_AGE`] ago (and not completing);
    /// returns how many.
    async fn expire(&self) -> usize {
        let old: Vec<(String, PathBuf)> = {
            let mut open = self.lock();
            let ids: Vec<String> = open
                .iter()
                .filter(|(_, u)| {
                    !u.completing
                        && u.initiated
                            .elapsed()
                            .is_ok_and(|age| age > staging::MAX_AGE)
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| open.remove(&id).map(|u| (id, u.dir)))
                .collect()
        };
        for (id, dir) in &old {
            tracing::info!(upload = %id, "a multipart upload older than 7 days is removed");
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
        old.len()
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
                checksums: p.checksums.clone(),
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

    /// The upload's directory and checksum, if `id` is open for `path` and not completing.
    fn dir_of(&self, id: &str, path: &str) -> S3Result<(PathBuf, Option<UploadSum>)> {
        let open = self.lock();
        match open.get(id) {
            Some(u) if u.path == path && !u.completing => Ok((u.dir.clone(), u.sum)),
            Some(u) if u.completing => Err(S3Error::with_message(
                S3ErrorCode::InvalidRequest,
                "the upload is being completed",
            )),
            _ => Err(no_such_upload(id)),
        }
    }

    /// Stages one part (checked as PutObject checks a body; the upload's checksum algorithm
    /// computed too); returns its ETag (without quotes) and checksums.
    pub(super) async fn put_part(
        &self,
        id: &str,
        path: &str,
        number: i32,
        mut body: BodyReader,
        mut digests: Digests,
        trailers: Option<&TrailingHeaders>,
    ) -> S3Result<(String, Checksums)> {
        let (dir, sum) = self.dir_of(id, path)?;
        if let Some(sum) = sum {
            digests.also_compute(sum.algorithm);
        }
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
        let mut crc = crc32fast::Hasher::new();
        let written: S3Result<(String, Checksums)> = async {
            while let Some(chunk) = body.next().await? {
                digests.update(&chunk);
                crc.update(&chunk);
                size += chunk.len() as u64;
                file.write_all(&chunk).await.map_err(fail)?;
            }
            file.flush().await.map_err(fail)?;
            // S3's part ETag: the MD5 of the part.
            digests.verify(trailers.and_then(TrailingHeaders::take).as_ref())
        }
        .await;
        drop(file);
        let (etag, checksums) = match written {
            Ok(written) => written,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                body.drain().await;
                return Err(e);
            }
        };
        let dest = dir.join(format!("part-{number:05}"));
        let crc = crc.finalize();
        let meta = staging::part_meta(&etag, size, crc, &checksums);
        let mut open = self.lock();
        // Aborted or completed while the body was arriving: drop the part.
        match open.get_mut(id) {
            Some(u) if !u.completing => {
                // The part, then what describes it: a part without its meta file is removed at
                // the next start (this request was not answered).
                std::fs::rename(&tmp, &dest).map_err(fail)?;
                let mut meta_path = dest.as_os_str().to_owned();
                meta_path.push(".meta");
                if let Err(e) = staging::write_whole(Path::new(&meta_path), &meta) {
                    let _ = std::fs::remove_file(&dest);
                    u.parts.remove(&number);
                    return Err(fail(e));
                }
                u.parts.insert(
                    number,
                    PartFile {
                        etag: etag.clone(),
                        size,
                        crc,
                        file: dest,
                        staged: SystemTime::now(),
                        checksums: checksums.clone(),
                    },
                );
                Ok((etag, checksums))
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
        wanted: &[Wanted],
        whole: &WholeSum,
    ) -> S3Result<Begun> {
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
                    Some(d) if d.path == path && d.parts == list_digest(wanted) => {
                        Ok(Begun::Again(d.etag.clone(), d.checksums.clone()))
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
        let mut parts = Vec::with_capacity(wanted.len());
        let mut prev = 0;
        for (i, w) in wanted.iter().enumerate() {
            let number = w.number;
            if number <= prev {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidPartOrder,
                    "parts must be listed in ascending order of part number",
                ));
            }
            prev = number;
            let part = u.parts.get(&number).ok_or_else(|| {
                S3Error::with_message(
                    S3ErrorCode::InvalidPart,
                    format!("part {number} was not uploaded"),
                )
            })?;
            if w.etag.as_deref() != Some(part.etag.as_str()) {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidPart,
                    format!("part {number}: the ETag does not match the uploaded part's"),
                ));
            }
            for (a, given) in w.checksums.iter().enumerate() {
                let Some(given) = given else { continue };
                let kept = part.checksums.values[a].as_deref().and_then(base64_decode);
                if kept.is_none() || base64_decode(given) != kept {
                    return Err(S3Error::with_message(
                        S3ErrorCode::InvalidPart,
                        format!(
                            "part {number}: the {} checksum does not match the uploaded part's",
                            algorithm_name(a)
                        ),
                    ));
                }
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
            files.push(Staged {
                number,
                file: part.file.clone(),
                size: part.size,
                crc: part.crc,
            });
            parts.push(PartInfo {
                number,
                size: part.size,
                checksums: match u.sum {
                    Some(s) => Checksums {
                        values: std::array::from_fn(|a| {
                            (a == s.algorithm)
                                .then(|| part.checksums.values[a].clone())
                                .flatten()
                        }),
                        composite: false,
                    },
                    None => Checksums::default(),
                },
            });
        }
        let sum = object_sum(u.sum, whole, &parts)?;
        let tags: Vec<&str> = wanted
            .iter()
            .filter_map(|w| u.parts.get(&w.number).map(|p| p.etag.as_str()))
            .collect();
        let etag = multipart_etag(&tags);
        u.completing = true;
        Ok(Begun::Started(Box::new(Completing {
            files,
            etag,
            attributes: u.attributes.clone(),
            parts,
            sum,
        })))
    }

    /// Ends a completion: on success (the parts, the ETag and the checksums) the upload and
    /// its files go and the completion is remembered for retries; on failure it can be
    /// completed again.
    async fn end_complete(&self, id: &str, done: Option<(&[Wanted], &str, &Checksums)>) {
        let dir = {
            let mut open = self.lock();
            if let Some((parts, etag, checksums)) = done {
                let u = open.remove(id);
                if let Some(u) = &u {
                    let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
                    d.0.insert(
                        id.to_string(),
                        Done {
                            path: u.path.clone(),
                            parts: list_digest(parts),
                            etag: etag.to_string(),
                            checksums: checksums.clone(),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn wanted(number: i32, etag: &str, sha256: Option<&str>) -> Wanted {
        let mut checksums: [Option<String>; 5] = Default::default();
        checksums[3] = sha256.map(str::to_string);
        Wanted {
            number,
            etag: Some(etag.to_string()),
            checksums,
        }
    }

    #[test]
    fn a_part_lists_digest_changes_with_any_field_and_not_otherwise() {
        let a = [wanted(1, "ab", None), wanted(2, "c", Some("x"))];
        assert_eq!(list_digest(&a), list_digest(&a.clone()));
        let others = [
            vec![wanted(1, "ab", None)],
            vec![wanted(1, "a", None), wanted(2, "bc", Some("x"))],
            vec![wanted(1, "ab", None), wanted(3, "c", Some("x"))],
            vec![wanted(1, "ab", None), wanted(2, "c", Some("y"))],
            vec![wanted(1, "ab", None), wanted(2, "c", None)],
        ];
        for o in others {
            assert_ne!(list_digest(&a), list_digest(&o), "{o:?}");
        }
    }

    #[test]
    fn upload_checksums_follow_s3s_defaults_and_refusals() {
        let alg = |a: &'static str| ChecksumAlgorithm::from_static(a);
        let kind = |k: &'static str| ChecksumType::from_static(k);
        let sum = |a: Option<&'static str>, k: Option<&'static str>| {
            upload_sum(a.map(alg).as_ref(), k.map(kind).as_ref())
        };
        assert_eq!(sum(None, None).unwrap(), None);
        let s = sum(Some("SHA256"), None).unwrap().unwrap();
        assert!(s.composite && algorithm_name(s.algorithm) == "SHA256");
        assert!(!sum(Some("CRC64NVME"), None).unwrap().unwrap().composite);
        assert!(
            !sum(Some("CRC32"), Some("FULL_OBJECT"))
                .unwrap()
                .unwrap()
                .composite
        );
        assert!(
            sum(Some("CRC32C"), Some("COMPOSITE"))
                .unwrap()
                .unwrap()
                .composite
        );
        for (a, k) in [
            (Some("SHA256"), Some("FULL_OBJECT")),
            (Some("SHA1"), Some("FULL_OBJECT")),
            (Some("CRC64NVME"), Some("COMPOSITE")),
            (None, Some("COMPOSITE")),
            (Some("MD5"), None),
            (Some("CRC32"), Some("PARTIAL")),
        ] {
            assert!(sum(a, k).is_err(), "{a:?} {k:?}");
        }
    }

    #[tokio::test]
    async fn uploads_under_way_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut u = Uploads::open(dir.path()).unwrap();
        u.max_open = 2;
        let new = || u.create("/b/k".into(), Attributes::new(), None);
        let a = new().await.unwrap();
        new().await.unwrap();
        let e = new().await.unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::SlowDown);
        let staged = || std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(staged(), 2, "a refused upload leaves no directory");
        u.abort(&a, "/b/k").await.unwrap();
        let b = new().await.unwrap();
        // Full again: an upload begun more than 7 days ago makes room.
        assert!(new().await.is_err());
        {
            let mut open = u.lock();
            let old = open.get_mut(&b).unwrap();
            old.initiated -= staging::MAX_AGE + std::time::Duration::from_secs(60);
        }
        new().await.unwrap();
        assert!(
            !dir.path().join(format!("upload-{b}")).exists(),
            "its files are gone"
        );
        assert_eq!(staged(), 2);
    }

    #[test]
    fn a_composite_checksum_is_the_digest_of_the_parts_digests() {
        // SHA-256 of three 5 MiB parts of 'A', 'B' and 'C', and their composite, as the Ceph
        // conformance suite has them.
        let parts = [
            "275VF5loJr1YYawit0XSHREhkFXYkkPKGuoK0x9VKxI=",
            "mrHwOfjTL5Zwfj74F05HOQGLdUb7E5szdCbxgUSq6NM=",
            "Vw7oB/nKQ5xWb3hNgbyfkvDiivl+U+/Dft48nfJfDow=",
        ];
        let sha256 = algorithm_index("SHA256").unwrap();
        let c = composite(sha256, &parts).unwrap();
        assert_eq!(c, "uWBwpe1dxI4Vw8Gf0X9ynOdw/SS6VBzfWm9giiv1sf4=-3");
        assert!(same_object_checksum(&c, &c, 3));
        assert!(same_object_checksum(
            "uWBwpe1dxI4Vw8Gf0X9ynOdw/SS6VBzfWm9giiv1sf4=",
            &c,
            3
        ));
        assert!(!same_object_checksum(&c, &c, 2), "another part count");
        assert!(!same_object_checksum("bad", &c, 3));
        assert_eq!(composite(sha256, &["not base64!"]), None);
    }
}
