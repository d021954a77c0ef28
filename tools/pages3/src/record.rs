//! What the gateway records with an object it writes, so that it reads the same after a
//! restart of the gateway, or through another gateway: S3's ETag (the MD5 of a PutObject's
//! bytes, `md5-N` for a multipart upload), the checksums its writer named or the upload's
//! algorithm gave, and a multipart object's parts (numbers, sizes, checksums).
//!
//! The record is one attribute of the object, user metadata named [`KEY`] (never shown to
//! clients as metadata, and refused as a client's), kept by the store with the object's other
//! attributes or by the cluster for a write-back file and flushed with it. Its value is ASCII
//! (it is an HTTP header on S3 stores): space-separated fields, in this order, those in
//! brackets only when there is something to say:
//!
//! `1 size=N etag=E [sums=I:B64,...] [type=C] [parts=FIRST:SIZExCOUNT,...] [psums=I:B64,...]`
//!
//! - `size`: the object's length (a record of another length describes other bytes: ignored);
//! - `sums`: checksums by algorithm index (0 CRC32, 1 CRC32C, 2 SHA-1, 3 SHA-256,
//!   4 CRC64NVME), base64 as S3 gives them; `type=C` when they are COMPOSITE (of the parts'),
//!   else they are FULL_OBJECT;
//! - `parts`: runs of parts with consecutive numbers from `FIRST`, each run's parts of one size
//!   (the last run is often a single, shorter part);
//! - `psums`: one checksum per part, in part order, all of algorithm `I`.
//!
//! It fits what S3 lets user metadata hold (2 KB, with the object's own metadata and
//! attributes): part checksums are left out first, then the parts, then the whole record; what
//! is left out reads as before (the store's tag, no checksum, one part). A record that does
//! not parse or does not add up is ignored.

use object_store::{Attribute, Attributes};

use super::{aliases::PartInfo, checks::Checksums};

/// The record's user metadata name (letters and digits only: every store takes it).
pub(super) const KEY: &str = "pages3object";

/// What S3 lets an object's user metadata hold (names and values), which bounds the record
/// with the object's metadata and other attributes.
const ROOM: usize = 2048;

/// Most attributes a write-back file keeps (the record is one).
const MAX_ATTRS: usize = pagestore_protocol::frame::MAX_ATTRS;

/// Checksum algorithms ([`Checksums::values`]' length).
const ALGORITHMS: usize = 5;

/// Most parts a record describes (S3's most per upload).
const MAX_PARTS: usize = 10_000;

/// What the writer of an object knew of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) size: u64,
    pub(super) etag: String,
    pub(super) checksums: Checksums,
    /// Empty for an object written in one piece.
    pub(super) parts: Vec<PartInfo>,
}

impl Record {
    /// The record of an object written in one piece: `size` bytes, their MD5 and checksums.
    pub(super) fn of_put(size: u64, (md5, checksums): &(String, Checksums)) -> Record {
        Record {
            size,
            etag: md5.clone(),
            checksums: checksums.clone(),
            parts: Vec::new(),
        }
    }

    /// The record with the object's checksums `sums` (known once its bytes were sent).
    pub(super) fn with_checksums(self, sums: &Checksums) -> Record {
        Record {
            checksums: sums.clone(),
            ..self
        }
    }

    /// The record's value, with as much as fits in `room` bytes (`None`: not even its ETag).
    fn encode(&self, room: usize) -> Option<String> {
        let mut out = format!("1 size={} etag={}", self.size, self.etag);
        let sums: Vec<String> = (0..ALGORITHMS)
            .filter_map(|i| Some(format!("{i}:{}", self.checksums.values[i].as_ref()?)))
            .collect();
        if !sums.is_empty() {
            out.push_str(" sums=");
            out.push_str(&sums.join(","));
            if self.checksums.composite {
                out.push_str(" type=C");
            }
        }
        if out.len() > room {
            return None;
        }
        if self.parts.is_empty() {
            return Some(out);
        }
        let with_parts = format!("{out} parts={}", runs(&self.parts));
        if with_parts.len() > room {
            return Some(out);
        }
        match part_sums(&self.parts) {
            Some(p) if with_parts.len() + p.len() + 7 <= room => {
                Some(format!("{with_parts} psums={p}"))
            }
            _ => Some(with_parts),
        }
    }

    /// The record `value` says, if it parses and adds up.
    fn decode(value: &str) -> Option<Record> {
        let mut fields = value.split(' ');
        if fields.next()? != "1" {
            return None;
        }
        let mut r = Record::default();
        let mut etag = None;
        let mut psums = None;
        for f in fields {
            let (k, v) = f.split_once('=')?;
            match k {
                "size" => r.size = v.parse().ok()?,
                "etag" => etag = Some(v),
                "sums" => {
                    for s in v.split(',') {
                        let (i, b64) = sum_of(s)?;
                        r.checksums.values[i] = Some(b64.to_string());
                    }
                }
                "type" if v == "C" => r.checksums.composite = true,
                "parts" => r.parts = parse_runs(v)?,
                "psums" => psums = Some(v),
                _ => return None,
            }
        }
        let etag = etag?;
        if etag.is_empty()
            || etag.len() > 64
            || !etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return None;
        }
        r.etag = etag.to_string();
        if let Some(p) = psums {
            let (i, list) = p.split_once(':')?;
            let i: usize = i.parse().ok().filter(|i| *i < ALGORITHMS)?;
            let sums: Vec<&str> = list.split(',').collect();
            if sums.len() != r.parts.len() || !sums.iter().all(|s| is_base64(s)) {
                return None;
            }
            for (part, s) in r.parts.iter_mut().zip(sums) {
                part.checksums = Checksums::one(i, s.to_string(), false);
            }
        }
        let total = r.parts.iter().try_fold(0u64, |t, p| t.checked_add(p.size));
        if !r.parts.is_empty() && total != Some(r.size) {
            return None;
        }
        Some(r)
    }
}

/// `attrs` with `record` added, as far as it fits beside them (see the module's notes).
pub(super) fn with_record(mut attrs: Attributes, record: &Record) -> Attributes {
    let used: usize = attrs
        .iter()
        .map(|(k, v)| match k {
            Attribute::Metadata(name) => name.len() + v.len(),
            _ => v.len(),
        })
        .sum();
    if attrs.len() >= MAX_ATTRS {
        return attrs;
    }
    if let Some(value) = ROOM
        .checked_sub(used + KEY.len())
        .and_then(|room| record.encode(room))
    {
        attrs.insert(Attribute::Metadata(KEY.into()), value.into());
    }
    attrs
}

/// The record kept in `attrs`, if there is one that parses.
pub(super) fn of(attrs: &Attributes) -> Option<Record> {
    Record::decode(attrs.get(&Attribute::Metadata(KEY.into()))?.as_ref())
}

/// `attrs` without a record (those of an object copied: its record describes the source).
pub(super) fn without(mut attrs: Attributes) -> Attributes {
    attrs.remove(&Attribute::Metadata(KEY.into()));
    attrs
}

/// Whether a user metadata name is the record's.
pub(super) fn is_reserved(name: &str) -> bool {
    name.eq_ignore_ascii_case(KEY)
}

fn is_base64(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-'))
}

/// `I:B64` (a COMPOSITE checksum ends in `-N`).
fn sum_of(s: &str) -> Option<(usize, &str)> {
    let (i, b64) = s.split_once(':')?;
    let i: usize = i.parse().ok().filter(|i| *i < ALGORITHMS)?;
    is_base64(b64).then_some((i, b64))
}

/// The parts as runs `FIRST:SIZExCOUNT` of consecutive numbers and one size.
fn runs(parts: &[PartInfo]) -> String {
    let mut out: Vec<(i32, u64, usize)> = Vec::new();
    for p in parts {
        match out.last_mut() {
            Some((first, size, count))
                if *size == p.size && i64::from(*first) + *count as i64 == i64::from(p.number) =>
            {
                *count += 1
            }
            _ => out.push((p.number, p.size, 1)),
        }
    }
    out.iter()
        .map(|(first, size, count)| format!("{first}:{size}x{count}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_runs(v: &str) -> Option<Vec<PartInfo>> {
    let mut parts: Vec<PartInfo> = Vec::new();
    for run in v.split(',') {
        let (first, rest) = run.split_once(':')?;
        let (size, count) = rest.split_once('x')?;
        let (first, size, count): (i32, u64, usize) =
            (first.parse().ok()?, size.parse().ok()?, count.parse().ok()?);
        if count == 0 || count > MAX_PARTS - parts.len() {
            return None;
        }
        // Part numbers ascend.
        if first < 1 || parts.last().is_some_and(|p| p.number >= first) {
            return None;
        }
        for n in 0..count {
            parts.push(PartInfo {
                number: first.checked_add(i32::try_from(n).ok()?)?,
                size,
                checksums: Checksums::default(),
            });
        }
    }
    Some(parts)
}

/// `I:B64,B64,...` when every part has exactly one checksum, of one algorithm `I`.
fn part_sums(parts: &[PartInfo]) -> Option<String> {
    let alg = |p: &PartInfo| {
        let mut it = (0..ALGORITHMS).filter(|i| p.checksums.values[*i].is_some());
        let i = it.next()?;
        it.next().is_none().then_some(i)
    };
    let i = alg(parts.first()?)?;
    let mut out = format!("{i}:");
    for (n, p) in parts.iter().enumerate() {
        if alg(p) != Some(i) {
            return None;
        }
        if n > 0 {
            out.push(',');
        }
        out.push_str(p.checksums.values[i].as_deref()?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn multipart(sizes: &[(i32, u64)], sums: bool) -> Record {
        let parts: Vec<PartInfo> = sizes
            .iter()
            .map(|&(number, size)| PartInfo {
                number,
                size,
                checksums: if sums {
                    Checksums::one(0, format!("c{number}AA=="), false)
                } else {
                    Checksums::default()
                },
            })
            .collect();
        Record {
            size: parts.iter().map(|p| p.size).sum(),
            etag: format!("0123456789abcdef0123456789abcdef-{}", parts.len()),
            checksums: Checksums::one(0, "AAAAAA==-3".into(), true),
            parts,
        }
    }

    #[test]
    fn records_read_back_as_written() {
        let put = Record {
            size: 5,
            etag: "5d41402abc4b2a76b9719d911017c592".into(),
            checksums: Checksums {
                values: [
                    Some("NhCmhg==".into()),
                    None,
                    None,
                    Some("LPJNul+w==".into()),
                    None,
                ],
                composite: false,
            },
            parts: Vec::new(),
        };
        for r in [
            put,
            multipart(&[(1, 5 << 20), (2, 5 << 20), (3, 7)], true),
            multipart(&[(1, 5 << 20), (3, 6 << 20), (4, 6 << 20), (9, 1)], true),
            multipart(&[(2, 10)], false),
        ] {
            let v = r.encode(ROOM).unwrap();
            assert!(v.is_ascii() && !v.contains(['"', '\r', '\n']), "{v}");
            assert_eq!(Record::decode(&v), Some(r), "{v}");
        }
    }

    #[test]
    fn what_does_not_fit_is_left_out_parts_checksums_first() {
        // 10,000 parts of one size: the runs fit, their checksums do not.
        let sizes: Vec<(i32, u64)> = (1..=10_000).map(|n| (n, 5 << 20)).collect();
        let r = multipart(&sizes, true);
        let v = r.encode(ROOM).unwrap();
        assert!(v.len() <= ROOM && v.contains("parts=1:5242880x10000") && !v.contains("psums"));
        let back = Record::decode(&v).unwrap();
        assert_eq!((back.size, back.parts.len()), (r.size, 10_000));
        assert!(back
            .parts
            .iter()
            .all(|p| p.checksums == Checksums::default()));
        // Parts of every other number: too many runs, the parts are left out.
        let sparse: Vec<(i32, u64)> = (1..=1000).map(|n| (2 * n, 5 << 20)).collect();
        let v = multipart(&sparse, false).encode(ROOM).unwrap();
        assert!(!v.contains("parts="), "{v}");
        // No room for even the ETag: no record.
        assert_eq!(multipart(&sparse, false).encode(20), None);
        // Beside 2 KB of the writer's own metadata there is no room at all.
        let mut attrs = Attributes::new();
        attrs.insert(Attribute::Metadata("big".into()), "x".repeat(2045).into());
        assert!(of(&with_record(attrs.clone(), &r)).is_none());
        attrs.insert(Attribute::Metadata("big".into()), "x".repeat(1000).into());
        assert_eq!(of(&with_record(attrs.clone(), &r)).unwrap().etag, r.etag);
        assert!(of(&without(with_record(attrs, &r))).is_none());
    }

    #[test]
    fn records_that_do_not_parse_or_add_up_are_ignored() {
        let good = multipart(&[(1, 5 << 20), (2, 3)], true)
            .encode(ROOM)
            .unwrap();
        assert!(Record::decode(&good).is_some());
        let bad = [
            String::new(),
            "2 size=1 etag=ab".into(),
            "1 size=1".into(),
            "1 size=x etag=ab".into(),
            "1 size=1 etag=a\"b".into(),
            "1 size=1 etag=ab other=1".into(),
            "1 size=1 etag=ab sums=7:AAAA".into(),
            "1 size=1 etag=ab sums=0:AA*A".into(),
            // Parts that do not add up to the size, or do not ascend.
            good.replace("size=", "size=1"),
            "1 size=2 etag=ab parts=2:1x1,1:1x1".into(),
            "1 size=0 etag=ab parts=1:0x0".into(),
            "1 size=0 etag=ab parts=0:0x1".into(),
            "1 size=0 etag=ab parts=1:0x10001".into(),
            // Counts that add up only by wrapping around.
            format!("1 size=0 etag=ab parts=1:0x1,2:0x{}", usize::MAX),
            // Sizes that add up only by wrapping around.
            format!("1 size=0 etag=ab parts=1:{}x2", 1u64 << 63),
        ];
        for v in &bad {
            assert_eq!(Record::decode(v), None, "{v:?}");
        }
        let (head, psums) = good.split_once(" psums=").unwrap();
        let one_less = psums.rsplit_once(',').unwrap().0;
        assert_eq!(Record::decode(&format!("{head} psums={one_less}")), None);
    }

    #[test]
    fn any_record_cut_or_changed_decodes_without_a_panic() {
        let good = multipart(&[(1, 5 << 20), (2, 5 << 20), (3, 7)], true)
            .encode(ROOM)
            .unwrap();
        for i in 0..good.len() {
            let _ = Record::decode(&good[..i]);
            for c in ['9', 'x', ',', ':', '=', ' ', '-', '0'] {
                let mut v = good.clone().into_bytes();
                v[i] = c as u8;
                if let Ok(v) = String::from_utf8(v) {
                    if let Some(r) = Record::decode(&v) {
                        // What decodes adds up.
                        assert!(
                            r.parts.is_empty()
                                || r.parts.iter().map(|p| p.size).sum::<u64>() == r.size
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_records_name_is_reserved() {
        assert!(is_reserved("Pages3Object") && !is_reserved("pages3"));
    }
}
