//! Multipart uploads kept in the staging directory so that they outlive the gateway: each
//! upload's directory holds `upload.meta` (the object's path, when it began, its attributes and
//! checksum algorithm) and, beside each part file `part-NNNNN`, `part-NNNNN.meta` (its ETag,
//! length, CRC32 and checksums). Both are written to a temporary name and renamed into place.
//! At start, [`recover`] takes back every upload whose files are whole and removes the rest.
//!
//! ```text
//! upload.meta:        "pagestore-upload 1" / "path P" / "initiated MS" / ["sum A C"] / "attr N V"* / "end"
//! part-NNNNN.meta:    "pagestore-part 1" / "etag E" / "size N" / "crc C" / "checksum A V"* / "end"
//! ```
//!
//! Strings are percent-encoded; a file without its `end` line (cut by a crash) is not taken. A part file renamed into place whose meta file was not (the
//! gateway stopped between the two) is removed: its UploadPart was never answered. A meta file
//! that names other bytes than its part file (a part uploaded again when the gateway stopped)
//! is caught at completion by the part's CRC32, like any damage to the staged bytes.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    path::Path,
    time::{Duration, SystemTime},
};

use object_store::Attributes;
use pagestore_client::ufs::{store_attributes, wire_attrs};
use pagestore_protocol::frame::Attr;
use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};

use super::{Checksums, PartFile, Upload, UploadSum, UPLOAD_DIR_PREFIX};

/// The file that describes an upload, in its directory.
pub(super) const UPLOAD_META: &str = "upload.meta";

/// Uploads begun longer ago than this are removed at start, not resumed, and when the gateway
/// has as many uploads under way as it takes (as a bucket's lifecycle rule would abort them).
pub(super) const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

fn enc(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

fn dec(s: &str) -> Option<String> {
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes `text` to `path` through a temporary name.
pub(super) fn write_whole(path: &Path, text: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// What `upload.meta` says.
pub(super) fn upload_meta(
    path: &str,
    initiated: SystemTime,
    attributes: &Attributes,
    sum: Option<UploadSum>,
) -> String {
    let mut out = format!(
        "pagestore-upload 1\npath {}\ninitiated {}\n",
        enc(path),
        unix_ms(initiated)
    );
    if let Some(s) = sum {
        out += &format!("sum {} {}\n", s.algorithm, u8::from(s.composite));
    }
    for a in wire_attrs(attributes) {
        out += &format!("attr {} {}\n", enc(&a.name), enc(&a.value));
    }
    out + "end\n"
}

/// What a part's meta file says.
pub(super) fn part_meta(etag: &str, size: u64, crc: u32, checksums: &Checksums) -> String {
    let mut out = format!(
        "pagestore-part 1\netag {}\nsize {size}\ncrc {crc}\n",
        enc(etag)
    );
    for (i, v) in checksums.values.iter().enumerate() {
        if let Some(v) = v {
            out += &format!("checksum {i} {}\n", enc(v));
        }
    }
    out + "end\n"
}

/// The lines of a meta file between its first, `head`, and its last, `end`, as (key, rest)
/// pairs; `None` if either is missing or a line has no value.
fn fields<'a>(text: &'a str, head: &str) -> Option<Vec<(&'a str, &'a str)>> {
    let mut lines: Vec<&str> = text.lines().collect();
    if lines.first() != Some(&head) || lines.last() != Some(&"end") {
        return None;
    }
    lines.pop();
    lines[1..].iter().map(|l| l.split_once(' ')).collect()
}

fn parse_upload(text: &str) -> Option<(String, SystemTime, Attributes, Option<UploadSum>)> {
    let (mut path, mut initiated, mut sum, mut attrs) = (None, None, None, Vec::new());
    for (k, v) in fields(text, "pagestore-upload 1")? {
        match k {
            "path" => path = Some(dec(v)?),
            "initiated" => {
                initiated = Some(SystemTime::UNIX_EPOCH + Duration::from_millis(v.parse().ok()?))
            }
            "sum" => {
                let (a, c) = v.split_once(' ')?;
                let algorithm: usize = a.parse().ok()?;
                (algorithm < 5).then_some(())?;
                sum = Some(UploadSum {
                    algorithm,
                    composite: c == "1",
                });
            }
            "attr" => {
                let (n, v) = v.split_once(' ')?;
                attrs.push(Attr {
                    name: dec(n)?,
                    value: dec(v)?,
                });
            }
            _ => return None,
        }
    }
    Some((path?, initiated?, store_attributes(&attrs), sum))
}

fn parse_part(text: &str) -> Option<(String, u64, u32, Checksums)> {
    let (mut etag, mut size, mut crc, mut sums) = (None, None, None, Checksums::default());
    for (k, v) in fields(text, "pagestore-part 1")? {
        match k {
            "etag" => etag = Some(dec(v)?),
            "size" => size = Some(v.parse().ok()?),
            "crc" => crc = Some(v.parse().ok()?),
            "checksum" => {
                let (i, v) = v.split_once(' ')?;
                *sums.values.get_mut(i.parse::<usize>().ok()?)? = Some(dec(v)?);
            }
            _ => return None,
        }
    }
    Some((etag?, size?, crc?, sums))
}

/// The part number of a part file's name (`part-00042`).
fn part_number(name: &str) -> Option<i32> {
    let digits = name.strip_prefix("part-")?;
    (digits.len() == 5 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
        .filter(|n| (1..=super::MAX_PART_NUMBER).contains(n))
}

/// An upload's directory as an upload, its unusable files removed; `None` if the directory
/// does not describe one (it is then removed whole).
fn recover_one(dir: &Path) -> Option<Upload> {
    let text = std::fs::read_to_string(dir.join(UPLOAD_META)).ok()?;
    let (path, initiated, attributes, sum) = parse_upload(&text)?;
    if initiated.elapsed().is_ok_and(|age| age > MAX_AGE) {
        tracing::info!(dir = %dir.display(), path, "a multipart upload older than 7 days is removed");
        return None;
    }
    let mut parts = BTreeMap::new();
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == UPLOAD_META || name.ends_with(".meta") {
            continue;
        }
        let file = e.path();
        let meta = std::fs::read_to_string(dir.join(format!("{name}.meta")))
            .ok()
            .and_then(|t| parse_part(&t));
        match (part_number(&name), meta) {
            (Some(number), Some((etag, size, crc, checksums))) => {
                let staged = e.metadata().and_then(|m| m.modified()).unwrap_or(initiated);
                parts.insert(
                    number,
                    PartFile {
                        etag,
                        size,
                        crc,
                        file,
                        staged,
                        checksums,
                    },
                );
            }
            // A temporary file, or a part whose UploadPart was never answered.
            _ => {
                let _ = std::fs::remove_file(&file);
                let _ = std::fs::remove_file(dir.join(format!("{name}.meta")));
            }
        }
    }
    Some(Upload {
        path,
        dir: dir.to_path_buf(),
        parts,
        completing: false,
        initiated,
        attributes,
        sum,
    })
}

/// The uploads an earlier run left in `staging`, by id; directories that describe none are
/// removed.
pub(super) fn recover(staging: &Path) -> io::Result<HashMap<String, Upload>> {
    let mut out = HashMap::new();
    for e in std::fs::read_dir(staging)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix(UPLOAD_DIR_PREFIX) else {
            continue;
        };
        let well_named = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
        match recover_one(&e.path()).filter(|_| well_named) {
            Some(u) => {
                out.insert(id.to_string(), u);
            }
            None => {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if !out.is_empty() {
        tracing::info!(
            uploads = out.len(),
            "multipart uploads of an earlier run taken back"
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn meta_files_read_back_what_was_written() {
        let mut attributes = Attributes::new();
        attributes.insert(
            object_store::Attribute::ContentType,
            "text/plain; charset=utf-8".into(),
        );
        attributes.insert(
            object_store::Attribute::Metadata("step".into()),
            "a b\tc %".into(),
        );
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_765_000_000_123);
        let sum = Some(UploadSum {
            algorithm: 3,
            composite: true,
        });
        let text = upload_meta("/b/dir/ké y", t, &attributes, sum);
        let (path, initiated, attrs, s) = parse_upload(&text).unwrap();
        assert_eq!((path.as_str(), initiated, s), ("/b/dir/ké y", t, sum));
        assert_eq!(wire_attrs(&attrs), wire_attrs(&attributes));

        let sums = Checksums::one(3, "abc+/=".into(), false);
        let text = part_meta("0123abcd", 5 << 20, 77, &sums);
        assert_eq!(
            parse_part(&text).unwrap(),
            ("0123abcd".to_string(), 5 << 20, 77, sums)
        );
        // Cut anywhere, or foreign, files are not taken.
        for cut in 0..text.len() - 1 {
            assert!(parse_part(&text[..cut]).is_none(), "cut at {cut}");
        }
        assert!(parse_part("something else\netag x\nend\n").is_none());
        assert!(parse_upload("pagestore-upload 1\npath %FF\ninitiated 1\nend\n").is_none());
        assert!(parse_upload("pagestore-upload 1\ninitiated 1\nend\n").is_none());
    }

    #[test]
    fn part_files_are_named_by_their_number() {
        assert_eq!(part_number("part-00001"), Some(1));
        assert_eq!(part_number("part-10000"), Some(10_000));
        for bad in [
            "part-00000",
            "part-1",
            "part-00001.tmp",
            "part-0000a",
            "upload.meta",
        ] {
            assert_eq!(part_number(bad), None, "{bad}");
        }
    }
}
