//! CopyObject and UploadPartCopy (through the store's own copy where source and destination
//! share a mount, else read through the cluster and written), and GetObjectAttributes.

use hyper::HeaderMap;
use pagestore_client::ufs::{ObjectInfo, UfsError};
use s3s::{
    dto::{
        CopyObjectInput, CopyObjectOutput, CopyObjectResult, CopyPartResult, CopySource, ETag,
        GetObjectAttributesInput, GetObjectAttributesOutput, GetObjectAttributesParts,
        MetadataDirective, ObjectAttributes, ObjectPart, StorageClass, Timestamp,
        UploadPartCopyInput, UploadPartCopyOutput,
    },
    S3Error, S3ErrorCode, S3Request, S3Response, S3Result,
};

use super::{
    attrs::Asked,
    checks::{self, Digests},
    cond::{check_copy_source, ReadConditions, WriteCondition},
    errors::{invalid, store_error},
    keys::{key_path, KeyPath},
    multipart::check_part_number,
    read::object_blob,
    record,
    write::BodyReader,
    Gateway, SourceBucket, MAX_KEYS, SOURCE_STAND_IN,
};

/// The bucket and key of `x-amz-copy-source` (versions and access points are refused);
/// `real`: the bucket that [`SOURCE_STAND_IN`] stands for in a copy the gateway's route
/// forwarded (a mount name S3 would refuse as a bucket).
fn source(src: &CopySource, real: Option<&SourceBucket>) -> S3Result<(String, String)> {
    match src {
        CopySource::Bucket {
            bucket,
            key,
            version_id,
        } if version_id.as_deref().is_none_or(|v| v == "null") => {
            let bucket = match real {
                Some(SourceBucket(real)) if &**bucket == SOURCE_STAND_IN => real.clone(),
                _ => bucket.to_string(),
            };
            Ok((bucket, key.to_string()))
        }
        CopySource::Bucket { .. } => Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "a copy of a given versionId: pagestore keeps no object versions",
        )),
        _ => Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "a copy from an access point",
        )),
    }
}

impl Gateway {
    /// The copy's source, stat-ed, with the `x-amz-copy-source-if-*` conditions checked.
    async fn copy_source(
        &self,
        (src, real): (&CopySource, Option<&SourceBucket>),
        conds: &ReadConditions<'_>,
    ) -> S3Result<ObjectInfo> {
        let (bucket, key) = source(src, real)?;
        let info = self.stat_object(&bucket, &key).await?;
        check_copy_source(conds, &self.tags_of(&info), self.modified(&info))?;
        Ok(info)
    }
}

/// CopyObject: the store copies the object where both keys share a mount (a copy between
/// mounts is read through the cluster and written); then the destination's cached pages are
/// invalidated; the store's copy keeps the source's attributes. With `x-amz-metadata-directive:
/// REPLACE` the object is read and written with the request's attributes instead. A copy of
/// an object onto itself without REPLACE is answered without writing.
pub(super) async fn copy_object(
    gw: &Gateway,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
    let real = req.extensions.get::<SourceBucket>().cloned();
    let src = (&req.input.copy_source, real.as_ref());
    let input = &req.input;
    let conds = ReadConditions {
        if_match: input.copy_source_if_match.as_ref(),
        if_none_match: input.copy_source_if_none_match.as_ref(),
        if_modified_since: input.copy_source_if_modified_since.as_ref(),
        if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
    };
    // A directory marker copied (s3fs-fuse renames a directory, or changes its mode, that
    // way): the destination marker is remembered, as a PutObject of it would be.
    if let KeyPath::Marker(dir) = key_path(&input.bucket, &input.key)? {
        checks::check_written_key_len(&input.key)?;
        gw.may_write(&dir)?;
        gw.require_bucket(&input.bucket).await?;
        let info = gw.copy_source(src, &conds).await?;
        if info.size != 0 {
            return Err(invalid(format!(
                "{:?}: a key ending in / is a directory marker and takes only an empty object",
                input.key
            )));
        }
        gw.remember_marker(&dir)?;
        return Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(super::write::EMPTY_MD5.into())),
                last_modified: Some(Timestamp::from(std::time::SystemTime::now())),
                ..CopyObjectResult::default()
            }),
            ..CopyObjectOutput::default()
        }));
    }
    let dst = gw.write_path(&input.bucket, &input.key)?;
    gw.may_write(&dst)?;
    gw.require_bucket(&input.bucket).await?;
    let info = gw.copy_source(src, &conds).await?;
    let result = |info: &ObjectInfo| {
        S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(gw.tags_of(info).reported),
                last_modified: Some(Timestamp::from(gw.modified(info))),
                ..CopyObjectResult::default()
            }),
            ..CopyObjectOutput::default()
        })
    };
    let replace = input
        .metadata_directive
        .as_ref()
        .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
    if info.path == dst && !replace {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "This copy request is illegal because it is trying to copy an object to itself \
             without changing the object's metadata; send x-amz-metadata-directive: REPLACE",
        ));
    }
    // New attributes: the object is read through the cluster and written with them, as a
    // PutObject would be (the store's copy keeps the source's).
    let replaced = if replace {
        Some(
            Asked {
                content_type: input.content_type.as_deref(),
                cache_control: input.cache_control.as_deref(),
                content_disposition: input.content_disposition.as_deref(),
                content_encoding: input.content_encoding.as_deref(),
                content_language: input.content_language.as_deref(),
                metadata: input.metadata.as_ref(),
                expires: input.expires.as_ref(),
            }
            .attributes()?,
        )
    } else {
        None
    };
    if gw.cached(&dst) {
        // Written through the cluster, as a PutObject would be, with the source's attributes
        // or the new ones.
        let body = object_blob(gw.client.clone(), info.clone(), 0, info.size);
        let attributes = match replaced {
            Some(a) => a,
            // The source's record describes the source: the write records its own.
            None => record::without(gw.attributes_of(&info).await),
        };
        let new = gw
            .write_object(
                &dst,
                Some(body),
                &HeaderMap::new(),
                None,
                &WriteCondition::None,
                attributes,
            )
            .await?;
        return Ok(result(&new));
    }
    let ufs = gw.writable()?;
    let old = ufs.stat(&dst).await.ok().map(|i| i.file_id);
    let copied = match replaced {
        Some(_) => Err(UfsError::Store(
            dst.clone(),
            object_store::Error::NotImplemented {
                operation: "a copy with new attributes".into(),
                implementer: "pages3".into(),
            },
        )),
        None => ufs.copy(&info.path, &dst).await,
    };
    match copied {
        Ok(()) => {
            gw.client.invalidate(&dst, old).await;
        }
        Err(UfsError::Store(_, object_store::Error::NotImplemented { .. })) => {
            // Between two mounts, or with new attributes: read through the cluster, written
            // as a PutObject would be.
            let attributes = match replaced {
                Some(a) => a,
                None => record::without(gw.attributes_of(&info).await),
            };
            let body = object_blob(gw.client.clone(), info.clone(), 0, info.size);
            gw.write_object(
                &dst,
                Some(body),
                &HeaderMap::new(),
                None,
                &WriteCondition::None,
                attributes,
            )
            .await?;
        }
        Err(e) => return Err(gw.write_failed(&dst, store_error(e)).await),
    }
    gw.aliases.forget(&dst);
    let new = ufs.stat(&dst).await.map_err(store_error)?;
    // A copy in the store keeps the source's record (same bytes); one written here, its own.
    gw.recall(&new).await;
    Ok(result(&new))
}

/// `bytes=FIRST-LAST` of `x-amz-copy-source-range`, checked against `size`: `start..end`.
fn copy_range(range: Option<&str>, size: u64) -> S3Result<(u64, u64)> {
    let Some(r) = range else {
        return Ok((0, size));
    };
    let bad = || {
        invalid(format!(
            "x-amz-copy-source-range {r:?} is not bytes=FIRST-LAST within the source's {size} \
             bytes"
        ))
    };
    let (a, b) = r
        .strip_prefix("bytes=")
        .and_then(|x| x.split_once('-'))
        .ok_or_else(bad)?;
    let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a > b {
        return Err(bad());
    }
    if b >= size {
        // A well-formed range past the source's end: S3's InvalidRange (416).
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidRange,
            format!("x-amz-copy-source-range {r:?} ends past the source's {size} bytes"),
        ));
    }
    Ok((a, b + 1))
}

/// UploadPartCopy: the part is read from the source object (or its range) through the cluster
/// and staged as an UploadPart's body would be.
pub(super) async fn upload_part_copy(
    gw: &Gateway,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    let real = req.extensions.get::<SourceBucket>().cloned();
    let input = req.input;
    let dst = gw.write_path(&input.bucket, &input.key)?;
    check_part_number(input.part_number)?;
    let info = gw
        .copy_source(
            (&input.copy_source, real.as_ref()),
            &ReadConditions {
                if_match: input.copy_source_if_match.as_ref(),
                if_none_match: input.copy_source_if_none_match.as_ref(),
                if_modified_since: input.copy_source_if_modified_since.as_ref(),
                if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
            },
        )
        .await?;
    let (start, end) = copy_range(input.copy_source_range.as_deref(), info.size)?;
    let mut headers = HeaderMap::new();
    headers.insert(hyper::header::CONTENT_LENGTH, (end - start).into());
    let body = object_blob(gw.client.clone(), info, start, end);
    let (tag, sums) = gw
        .uploads
        .put_part(
            &input.upload_id,
            &dst,
            input.part_number,
            BodyReader::new(Some(body), &headers),
            Digests::from_headers(&HeaderMap::new())?,
            None,
        )
        .await?;
    let [crc32, crc32c, sha1, sha256, crc64nvme] = sums.values;
    Ok(S3Response::new(UploadPartCopyOutput {
        copy_part_result: Some(CopyPartResult {
            e_tag: Some(ETag::Strong(tag)),
            last_modified: Some(Timestamp::from(std::time::SystemTime::now())),
            checksum_crc32: crc32,
            checksum_crc32c: crc32c,
            checksum_sha1: sha1,
            checksum_sha256: sha256,
            checksum_crc64nvme: crc64nvme,
        }),
        ..UploadPartCopyOutput::default()
    }))
}

/// GetObjectAttributes: the ETag, the size, the storage class, the checksum (of an object this
/// gateway wrote with one) and the parts (of a multipart object this gateway completed, a page
/// of `MaxParts` after `PartNumberMarker`), as asked.
pub(super) async fn get_object_attributes(
    gw: &Gateway,
    req: S3Request<GetObjectAttributesInput>,
) -> S3Result<S3Response<GetObjectAttributesOutput>> {
    let input = &req.input;
    super::keys::check_version_id(input.version_id.as_deref())?;
    let info = gw.stat_object(&input.bucket, &input.key).await?;
    // One header may list several attributes (`ETag,ObjectSize`).
    let asked = |a: &str| {
        input
            .object_attributes
            .iter()
            .flat_map(|x| x.as_str().split(','))
            .any(|x| x.trim() == a)
    };
    Ok(S3Response::new(GetObjectAttributesOutput {
        e_tag: asked(ObjectAttributes::ETAG).then(|| gw.tags_of(&info).reported),
        object_size: asked(ObjectAttributes::OBJECT_SIZE)
            .then(|| info.size.try_into().unwrap_or(i64::MAX)),
        storage_class: asked(ObjectAttributes::STORAGE_CLASS)
            .then(|| StorageClass::from_static(StorageClass::STANDARD)),
        checksum: asked(ObjectAttributes::CHECKSUM)
            .then(|| gw.checksums_of(&info)?.to_checksum())
            .flatten(),
        object_parts: asked(ObjectAttributes::OBJECT_PARTS)
            .then(|| object_parts(gw, &info, input))
            .transpose()?
            .flatten(),
        last_modified: Some(Timestamp::from(gw.modified(&info))),
        ..GetObjectAttributesOutput::default()
    }))
}

/// A page of the parts of `info` (`None`: not a multipart object this gateway knows).
fn object_parts(
    gw: &Gateway,
    info: &ObjectInfo,
    input: &GetObjectAttributesInput,
) -> S3Result<Option<GetObjectAttributesParts>> {
    let max = match input.max_parts {
        None => MAX_KEYS,
        Some(n) if n < 0 => return Err(invalid(format!("max-parts {n} is negative"))),
        Some(n) => (n as usize).min(MAX_KEYS),
    };
    let marker = input.part_number_marker.unwrap_or(0);
    if marker < 0 {
        return Err(invalid(format!("part-number-marker {marker} is negative")));
    }
    let Some(page) = gw
        .aliases
        .parts_page(&info.path, &info.version, marker, max)
    else {
        return Ok(None);
    };
    let next = page
        .parts
        .last()
        .map(|p| p.number)
        .filter(|_| page.truncated);
    let parts = page
        .parts
        .into_iter()
        .map(|p| {
            let [crc32, crc32c, sha1, sha256, crc64nvme] = p.checksums.values;
            ObjectPart {
                part_number: Some(p.number),
                size: Some(p.size.try_into().unwrap_or(i64::MAX)),
                checksum_crc32: crc32,
                checksum_crc32c: crc32c,
                checksum_sha1: sha1,
                checksum_sha256: sha256,
                checksum_crc64nvme: crc64nvme,
            }
        })
        .collect();
    Ok(Some(GetObjectAttributesParts {
        total_parts_count: Some(i32::try_from(page.total).unwrap_or(i32::MAX)),
        part_number_marker: Some(marker),
        next_part_number_marker: next,
        max_parts: Some(max as i32),
        is_truncated: Some(page.truncated),
        parts: Some(parts),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::copy_range;

    #[test]
    fn copy_ranges_are_checked() {
        assert_eq!(copy_range(None, 10).unwrap(), (0, 10));
        assert_eq!(copy_range(Some("bytes=0-9"), 10).unwrap(), (0, 10));
        assert_eq!(copy_range(Some("bytes=3-3"), 10).unwrap(), (3, 4));
        for bad in ["bytes=0-10", "bytes=5-4", "0-3", "bytes=-3", "bytes=1-"] {
            assert!(copy_range(Some(bad), 10).is_err(), "{bad}");
        }
    }
}
