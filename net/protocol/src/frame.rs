//! Wire frames of the pagestore client/shard protocol.
//!
//! Every request and every response travels as one *frame* on its own
//! bidirectional QUIC stream. A frame is three consecutive parts:
//!
//! ```text
//! +------------------+-------------------------------+----------------------+
//! | preamble (16 B)  | header (header_len B)          | payload (payload_len)|
//! | plain LE fields  | rkyv archive, front-padded to  | page bytes as they   |
//! |                  | a multiple of 16 bytes         | are, or a record     |
//! +------------------+-------------------------------+----------------------+
//! ```
//!
//! * The **preamble** ([`Preamble`]) is a fixed 16-byte little-endian record:
//!   magic `b"PSTF"`, protocol version (u16), frame kind (u16), header length
//!   (u32) and payload length (u32). A stream reader reads these 16 bytes,
//!   calls [`Preamble::decode`], and then knows exactly how many header and
//!   payload bytes follow. Both lengths are bounded ([`MAX_HEADER`],
//!   [`MAX_PAYLOAD`]) and are checked before anything is allocated.
//! * The **header** is an rkyv 0.8 archive of a [`Request`] or a
//!   [`Response`]. rkyv puts the root object at the *end* of its buffer, so
//!   the encoder pads at the *front*: it serializes into a buffer that
//!   already holds `P` zero bytes (`P` is 0 or 8 in this implementation),
//!   choosing `P` so that the total length is a multiple of 16. Because rkyv
//!   lays objects out relative to the start of the buffer, the padded buffer
//!   is itself a valid archive and the receiver hands the whole header,
//!   padding included, to rkyv's validator: no padding has to be stripped
//!   and no archive length has to be transmitted. Receivers must not rely on
//!   the value of `P` or on the padding being zero.
//! * The **payload** carries page bytes as they are, so a shard can send them
//!   straight from the buffer its disk read landed in. Two frames carry a
//!   record there instead, as a second rkyv archive of its own (not padded):
//!   `Counters` answers a [`ShardCounters`] ([`encode_counters`],
//!   [`decode_counters`]), and `Jobs` carries a [`JobRecord`]
//!   ([`encode_job_record`], [`decode_job_record`]) or, in the answer, a
//!   vector of them ([`encode_job_records`], [`decode_job_records`]), and
//!   `Hot` answers a [`HotReport`] ([`encode_hot_report`],
//!   [`decode_hot_report`]). Those decoders validate like the header's
//!   (bytecheck, then the limits).
//!
//! Decoding validates the header with bytecheck ([`rkyv::access`]), copies it
//! into a 16-byte aligned buffer first when the caller's slice is not
//! aligned, deserializes it to the owned type (headers are small) and then
//! checks the protocol's semantic rules ([`Request::validate`],
//! [`Response::validate`]). No input, however malformed, makes these
//! functions panic: every failure is a [`FrameError`].
//!
//! The byte-level specification is `docs/PROTOCOL.md`. The archived layout
//! depends on rkyv's format features: this module requires rkyv's defaults
//! (little-endian, aligned primitives, 32-bit relative pointers). If any
//! crate in the build enables `big_endian`, `unaligned` or another
//! `pointer_width_*` feature of rkyv, the wire format changes and the golden
//! vector tests fail.
//!
//! **Do not reorder, remove or insert enum variants or struct fields**: the
//! archived tag of an enum variant is its declaration index and struct fields
//! are laid out in declaration order. Any such change needs a new
//! [`PROTOCOL_VERSION`].

use std::fmt;
use std::ops::Range;

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Portable, Serialize};

/// Version of the wire protocol carried in every preamble. A receiver
/// rejects frames of any other version with [`FrameError::Version`].
///
/// Version 2: the payloads of `Jobs` (request and answer) and of the
/// `Counters` answer are rkyv archives of [`JobRecord`]s and of
/// [`ShardCounters`] instead of JSON. The headers are laid out as in
/// version 1, but the same frame means something else, so the two versions
/// must not talk.
///
/// Version 3: `PathKind::File` and [`DirEntry`] carry the object's
/// modification time (`mtime_ns`), and listing entries carry the version
/// tag, so listings are enough to open a file; every response root grows
/// from 56 to 64 bytes. The mount table of `ClusterInfo` may hold
/// [`MAX_MOUNTS`] = 256 entries within [`MAX_MOUNT_TABLE_BYTES`].
///
/// Version 4: write-back. New requests `WriteDirty`, `Change`, `Replicate`,
/// `PullRecords`, `FilePages` and `WriteBackState`, answers `Applied`,
/// `Records` and `WriteBack`, error codes `Exists`, `NotEmpty` and
/// `Unflushed`; `PathKind::File` carries the file's state and the under
/// storage's version of it, `ClusterInfo` the write replicas.
///
/// Version 5: hot-page replicas. `Fetch` says how the client routed it
/// ([`Route`]: the byte that was `replica`, 0 and 1 as before, 2 for a read
/// of a hot page spread to one of its replicas); a `Data` answer says over
/// how many members the owner spreads a hot page (`spread`); [`HotPage`]
/// carries the page's spread and [`ShardCounters`] the hot-page and replica
/// counters. Still in version 5 (not released before it): `LoadFiles` and its
/// answer `FilesLoaded` ([`LoadFile`], [`FileOutcome`]), appended after every
/// other request and answer, so no earlier layout moved.
///
/// Version 6: four error codes, `IsDir` and `NotDir` (a write-back change
/// that would put a file where a directory is, or beneath a file: `BadRequest`
/// before) and `Unverified` (a write-back page a member recovered after a
/// restart or a lapse of its membership, which may be older than the page's
/// other write members' copies), and a fourth [`Route`], `Recovered`, that
/// asks for such a page when no other member holds one; conditional commits
/// ([`Expect`], refused with `Precondition`). A version-5 peer would refuse
/// these bytes as malformed frames.
///
/// Version 7: object attributes of write-back files. `ChangeOp::Commit` and
/// `RecordEntry::File` carry the file's [`Attr`]s (Content-Type, user
/// metadata...), which the flusher writes with the object; a new request,
/// `Attributes`, and its answer, appended after every other, give a
/// version's attributes from the records. `ChangeOp::Delete` carries an
/// [`Expect`] (a conditional delete).
///
/// Version 8: `ChangeOp::Commit` carries `since`, the cluster time of the
/// version's first answered commit, so that a writer silent until its
/// flushed version's record was forgotten cannot bring that version back.
///
/// Version 9: `WriteDirty` carries the same `since`, so that such a writer's
/// pages are refused too (they were taken, and dropped only as orphans).
///
/// Version 10: a new request, `Discard`, appended after every other: a
/// writer gives up a version it never committed, and the member drops its
/// pages at once instead of after the orphan grace.
///
/// Version 11: a new change, `ChangeOp::SetTime`, after every other: the
/// modification time of a file written through the cluster is set (utimes,
/// `touch`, `cp -p`) without a new version.
///
/// Version 12: a new request, `Renew`, and its answer, `Held`, appended after
/// every other: a writer that has not committed its version yet says it is
/// still writing it, so that its pages are not dropped as a gone writer's,
/// and learns whether the member still holds them.
///
/// Version 13: `PathKind::Dir` carries the directory's modification time
/// (`mtime_ns`, 0 where none is known), and `ChangeOp::SetTime` with an
/// empty `version_tag` sets the time of a directory made through the
/// cluster.
///
/// Version 14: a new request, `RecordsOf`, appended after every other: a
/// node asks its peers for their records of the paths a change touches
/// before it judges the change, so a node that missed a record does not
/// judge a conditional change without it.
///
/// Version 15: a new request, `RecordsIn`, appended after every other: a
/// node asks its peers for their records of a directory's entries before it
/// answers a listing of it, so a node that missed a change lists what the
/// cluster acknowledged.
///
/// Version 16: a new answer, `Same`, appended after every other: a
/// `RecordsIn` whose digest matches is answered `Same`, not an empty
/// `Records`, so the asker tells a peer that holds what it holds from one
/// that holds nothing of the directory (and so may hold deletions beneath
/// it that the asker missed).
pub const PROTOCOL_VERSION: u16 = 16;

/// ALPN protocol identifier negotiated during the QUIC/TLS handshake: it
/// names [`PROTOCOL_VERSION`], so peers of different versions are refused at
/// the handshake.
pub const ALPN: &[u8] = b"pagestore/16";

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"PSTF";

/// Length of the fixed preamble in bytes.
pub const PREAMBLE_LEN: usize = 16;

/// The header length is always a multiple of this, and decoding accesses
/// the header in a buffer aligned to it.
pub const HEADER_ALIGN: usize = 16;

/// Largest header (padded rkyv archive) a receiver accepts: 64 KiB.
pub const MAX_HEADER: u32 = 64 << 10;

/// Largest page a frame can describe or carry: 64 MiB (the same bound as the
/// engine's largest page size).
pub const MAX_PAGE_LEN: u32 = 64 << 20;

/// Largest payload a receiver accepts: 64 MiB + 4 KiB.
pub const MAX_PAYLOAD: u32 = MAX_PAGE_LEN + (4 << 10);

/// Most pages one [`RequestBody::ReadPages`] may name, and most entries one
/// [`ResponseBody::Pages`] may carry.
pub const MAX_BATCH: usize = 256;

/// Most page indices one [`RequestBody::LoadPages`] may name.
pub const MAX_LOAD_PAGES: usize = 4096;

/// Most files one [`RequestBody::LoadFiles`] may name, and most outcomes one
/// [`ResponseBody::FilesLoaded`] may carry. The page indices of all its files
/// together are at most [`MAX_LOAD_PAGES`], so one request loads at most that
/// many pages (`MAX_LOAD_PAGES` × the page size bytes).
pub const MAX_LOAD_FILES: usize = 256;

/// Longest [`FileOutcome::Failed`] message in bytes (a [`ResponseBody::FilesLoaded`]
/// with [`MAX_LOAD_FILES`] failures stays well within [`MAX_HEADER`]).
pub const MAX_OUTCOME_MESSAGE_LEN: usize = 160;

/// Header bytes a client may fill with [`LoadFile`]s in one
/// [`RequestBody::LoadFiles`] (by [`LoadFile::header_cost`]): [`MAX_HEADER`]
/// less room for the root and the padding.
pub const LOAD_FILES_HEADER_BUDGET: usize = MAX_HEADER as usize - 1024;

/// Longest [`FileRef::path`] in bytes.
pub const MAX_PATH_LEN: usize = 4096;

/// Longest [`FileRef::mount`] in bytes.
pub const MAX_MOUNT_LEN: usize = 256;

/// Longest [`FileRef::version_tag`] in bytes.
pub const MAX_VERSION_TAG_LEN: usize = 256;

/// Longest [`ResponseBody::Error`] message in bytes.
pub const MAX_MESSAGE_LEN: usize = 1024;

/// Most entries one [`ResponseBody::Listing`] may carry.
pub const MAX_LIST_ENTRIES: usize = 1000;

/// Largest payload of a [`RequestBody::Jobs`] request: one job record.
pub const MAX_JOB_RECORD: u32 = 16 << 10;

/// Longest [`JobRecord::id`] in bytes (ids are never empty).
pub const MAX_JOB_ID: usize = 128;

/// Longest [`JobRecord::source`] in bytes.
pub const MAX_JOB_SOURCE_LEN: usize = 4352;

/// Longest [`JobRecord::client`] in bytes.
pub const MAX_JOB_CLIENT_LEN: usize = 256;

/// Most job records one [`ResponseBody::Jobs`] payload may carry (what a
/// node keeps).
pub const MAX_JOB_RECORDS: usize = 100;

/// Largest payload of a [`ResponseBody::Jobs`] answer: [`MAX_JOB_RECORDS`]
/// records of at most [`MAX_JOB_RECORD`] bytes each.
pub const MAX_JOB_RECORDS_PAYLOAD: u32 = MAX_JOB_RECORDS as u32 * MAX_JOB_RECORD;

/// Length of a [`ResponseBody::Counters`] payload: one archived
/// [`ShardCounters`].
pub const COUNTERS_PAYLOAD_LEN: u32 = 256;

/// Most files one [`HotReport`] names.
pub const MAX_HOT_FILES: usize = 32;

/// Most pages one [`HotReport`] names.
pub const MAX_HOT_PAGES: usize = 32;

/// Largest payload of a [`ResponseBody::Hot`] answer: one archived
/// [`HotReport`] at every limit (its files' paths of [`MAX_PATH_LEN`] bytes,
/// and [`MAX_MOUNTS`] mounts with [`MAX_MOUNT_TABLE_BYTES`] of prefixes)
/// fits.
pub const MAX_HOT_PAYLOAD: u32 = 256 << 10;

/// Longest name of a directory entry, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// Most nodes one [`ResponseBody::ClusterInfo`] may carry.
pub const MAX_NODES: usize = 1024;

/// Most mounts one [`ResponseBody::ClusterInfo`] may carry.
pub const MAX_MOUNTS: usize = 256;

/// Most bytes the prefixes and URLs of one [`ResponseBody::ClusterInfo`]'s
/// mounts may take together (with [`MAX_MOUNTS`] entries of 16 bytes, the
/// mount table needs at most 20 KiB of the header, leaving the rest of
/// [`MAX_HEADER`] to the members). [`check_mount_table`] checks both.
pub const MAX_MOUNT_TABLE_BYTES: usize = 16 << 10;

/// Longest node address or mount URL, in bytes.
pub const MAX_URL_LEN: usize = 1024;

/// Most [`FileRecord`]s one `Replicate` request or `Records` answer carries.
pub const MAX_RECORD_BATCH: usize = 1000;

/// Most paths one `RecordsOf` request names (a change's paths and their
/// ancestors).
pub const MAX_RECORDS_OF: usize = 64;

/// Most [`Attr`]s a write-back file keeps.
pub const MAX_ATTRS: usize = 32;

/// Most bytes of a write-back file's [`Attr`] names and values, all
/// together: S3's 2 KB of user metadata (with the `x-amz-meta-` prefix of
/// each name) and the content headers.
pub const MAX_ATTRS_BYTES: usize = 3072;

/// Largest payload of a `Replicate` request or a `Records` answer: 8 MiB
/// (1000 records with the longest paths, tags and attributes fit).
pub const MAX_RECORDS_PAYLOAD: u32 = 8 << 20;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The input ended before the frame did.
    Truncated {
        /// Bytes the frame (or the part being decoded) needs.
        needed: usize,
        /// Bytes that were available.
        got: usize,
    },
    /// The preamble does not start with [`MAGIC`].
    Magic {
        /// The four bytes found instead.
        got: [u8; 4],
    },
    /// The preamble carries a protocol version this code does not speak.
    Version {
        /// The version found.
        got: u16,
    },
    /// The frame kind is unknown, or is not the kind the caller decodes
    /// (a response handed to a request decoder or the other way round).
    Kind {
        /// The raw kind value found.
        got: u16,
    },
    /// The header length exceeds [`MAX_HEADER`].
    HeaderTooLarge {
        /// The length found (or, when encoding, produced).
        len: u64,
    },
    /// The payload length exceeds [`MAX_PAYLOAD`].
    PayloadTooLarge {
        /// The length found or asked for.
        len: u64,
    },
    /// The header length is zero or not a multiple of [`HEADER_ALIGN`].
    Misaligned {
        /// The length found.
        len: u32,
    },
    /// The header failed rkyv/bytecheck validation (the text says why), or
    /// could not be serialized. The text comes from rkyv and may contain
    /// memory addresses: log it, but send peers [`FrameError::peer_message`].
    Invalid(String),
    /// A semantic bound was exceeded (batch size, string length, page
    /// length, range).
    Limit(String),
    /// Two parts of the frame disagree (e.g. `WritePage.len` versus the
    /// payload length, or bytes after the end of the frame).
    Mismatch(String),
}

impl FrameError {
    /// The [`ErrorCode`] a receiver should answer with when it rejects a
    /// frame for this reason (if the stream still lets it answer).
    pub fn error_code(&self) -> ErrorCode {
        match self {
            FrameError::HeaderTooLarge { .. }
            | FrameError::PayloadTooLarge { .. }
            | FrameError::Limit(_) => ErrorCode::TooLarge,
            _ => ErrorCode::BadRequest,
        }
    }
}

impl FrameError {
    /// Text fit to send to the peer in a [`ResponseBody::Error`] message:
    /// the [`Display`](fmt::Display) text, except that the validator's
    /// detail of [`FrameError::Invalid`] (which can reveal memory addresses)
    /// is left out. At most [`MAX_MESSAGE_LEN`] bytes.
    pub fn peer_message(&self) -> String {
        let mut text = match self {
            FrameError::Invalid(_) => "invalid header: archive validation failed".to_string(),
            other => other.to_string(),
        };
        if text.len() > MAX_MESSAGE_LEN {
            let mut end = MAX_MESSAGE_LEN;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        text
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated { needed, got } => {
                write!(f, "truncated frame: need {needed} bytes, have {got}")
            }
            FrameError::Magic { got } => write!(f, "bad frame magic {got:02x?}"),
            FrameError::Version { got } => write!(
                f,
                "unsupported protocol version {got} (this side speaks {PROTOCOL_VERSION})"
            ),
            FrameError::Kind { got } => write!(f, "unexpected frame kind {got}"),
            FrameError::HeaderTooLarge { len } => {
                write!(f, "header of {len} bytes exceeds the limit of {MAX_HEADER}")
            }
            FrameError::PayloadTooLarge { len } => {
                write!(
                    f,
                    "payload of {len} bytes exceeds the limit of {MAX_PAYLOAD}"
                )
            }
            FrameError::Misaligned { len } => write!(
                f,
                "header length {len} is not a positive multiple of {HEADER_ALIGN}"
            ),
            FrameError::Invalid(why) => write!(f, "invalid header: {why}"),
            FrameError::Limit(why) => write!(f, "limit exceeded: {why}"),
            FrameError::Mismatch(why) => write!(f, "inconsistent frame: {why}"),
        }
    }
}

impl std::error::Error for FrameError {}

// ---------------------------------------------------------------------------
// Preamble
// ---------------------------------------------------------------------------

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FrameKind {
    /// A [`Request`], client to shard.
    Request = 1,
    /// A [`Response`], shard to client.
    Response = 2,
}

impl FrameKind {
    /// The kind for a raw preamble value, if it is known.
    pub fn from_u16(raw: u16) -> Option<FrameKind> {
        match raw {
            1 => Some(FrameKind::Request),
            2 => Some(FrameKind::Response),
            _ => None,
        }
    }
}

/// The fixed 16-byte record in front of every frame.
///
/// | offset | size | field         |
/// |-------:|-----:|---------------|
/// | 0      | 4    | magic `PSTF`  |
/// | 4      | 2    | version (LE)  |
/// | 6      | 2    | kind (LE)     |
/// | 8      | 4    | header_len    |
/// | 12     | 4    | payload_len   |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Preamble {
    /// Protocol version; [`PROTOCOL_VERSION`] for every frame this code
    /// produces or accepts.
    pub version: u16,
    /// Request or response.
    pub kind: FrameKind,
    /// Bytes of padded rkyv header that follow the preamble.
    pub header_len: u32,
    /// Raw payload bytes that follow the header.
    pub payload_len: u32,
}

impl Preamble {
    /// Parses and checks a preamble: magic, version, kind and both lengths
    /// (in that order). Nothing is allocated, so a peer announcing a huge
    /// frame costs nothing.
    pub fn decode(bytes: &[u8; PREAMBLE_LEN]) -> Result<Preamble, FrameError> {
        let [m0, m1, m2, m3, v0, v1, k0, k1, h0, h1, h2, h3, p0, p1, p2, p3] = *bytes;
        let magic = [m0, m1, m2, m3];
        if magic != MAGIC {
            return Err(FrameError::Magic { got: magic });
        }
        let version = u16::from_le_bytes([v0, v1]);
        if version != PROTOCOL_VERSION {
            return Err(FrameError::Version { got: version });
        }
        let raw_kind = u16::from_le_bytes([k0, k1]);
        let kind = FrameKind::from_u16(raw_kind).ok_or(FrameError::Kind { got: raw_kind })?;
        let preamble = Preamble {
            version,
            kind,
            header_len: u32::from_le_bytes([h0, h1, h2, h3]),
            payload_len: u32::from_le_bytes([p0, p1, p2, p3]),
        };
        preamble.check()?;
        Ok(preamble)
    }

    /// Parses the preamble at the start of `buf`, which may hold more bytes
    /// (the rest of the frame). Fails with [`FrameError::Truncated`] when
    /// `buf` is shorter than [`PREAMBLE_LEN`].
    pub fn decode_prefix(buf: &[u8]) -> Result<Preamble, FrameError> {
        match buf.get(..PREAMBLE_LEN) {
            Some(head) => {
                let mut fixed = [0u8; PREAMBLE_LEN];
                fixed.copy_from_slice(head);
                Preamble::decode(&fixed)
            }
            None => Err(FrameError::Truncated {
                needed: PREAMBLE_LEN,
                got: buf.len(),
            }),
        }
    }

    /// Checks the version and both lengths of an already built preamble
    /// (the magic and the kind are guaranteed by the type).
    pub fn check(&self) -> Result<(), FrameError> {
        if self.version != PROTOCOL_VERSION {
            return Err(FrameError::Version { got: self.version });
        }
        if self.header_len > MAX_HEADER {
            return Err(FrameError::HeaderTooLarge {
                len: u64::from(self.header_len),
            });
        }
        if self.header_len == 0 || self.header_len as usize % HEADER_ALIGN != 0 {
            return Err(FrameError::Misaligned {
                len: self.header_len,
            });
        }
        if self.payload_len > MAX_PAYLOAD {
            return Err(FrameError::PayloadTooLarge {
                len: u64::from(self.payload_len),
            });
        }
        Ok(())
    }

    /// The 16 wire bytes of this preamble.
    pub fn encode(&self) -> [u8; PREAMBLE_LEN] {
        let mut out = [0u8; PREAMBLE_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        out[8..12].copy_from_slice(&self.header_len.to_le_bytes());
        out[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }

    /// Byte range of the header within a whole frame buffer.
    pub fn header_range(&self) -> Range<usize> {
        PREAMBLE_LEN..PREAMBLE_LEN + self.header_len as usize
    }

    /// Byte range of the payload within a whole frame buffer.
    pub fn payload_range(&self) -> Range<usize> {
        let start = PREAMBLE_LEN + self.header_len as usize;
        start..start + self.payload_len as usize
    }

    /// Total frame length: preamble, header and payload.
    pub fn frame_len(&self) -> usize {
        self.payload_range().end
    }
}

// ---------------------------------------------------------------------------
// Message types
// ---------------------------------------------------------------------------

/// A 128-bit file identifier, carried as two 64-bit halves so that the
/// archived form needs only 8-byte alignment (and is easy to produce from
/// other languages).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FileId {
    /// Upper 64 bits.
    pub hi: u64,
    /// Lower 64 bits.
    pub lo: u64,
}

impl FileId {
    /// Splits a `u128` into halves.
    pub const fn from_u128(id: u128) -> FileId {
        FileId {
            hi: (id >> 64) as u64,
            lo: id as u64,
        }
    }

    /// Joins the halves into a `u128`.
    pub const fn as_u128(self) -> u128 {
        ((self.hi as u128) << 64) | self.lo as u128
    }
}

impl From<u128> for FileId {
    fn from(id: u128) -> FileId {
        FileId::from_u128(id)
    }
}

impl From<FileId> for u128 {
    fn from(id: FileId) -> u128 {
        id.as_u128()
    }
}

/// Names one cached page: a file and the page's index within it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Key {
    /// The file the page belongs to.
    pub file_id: FileId,
    /// Page index within the file (page `n` covers bytes
    /// `n * page_size .. (n + 1) * page_size`).
    pub page: u64,
}

/// Where a shard finds a file it is asked to load.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct FileRef {
    /// The file's identifier (the key space its pages are cached under).
    pub file_id: FileId,
    /// Name of the mount (storage backend) the path is relative to; at most
    /// [`MAX_MOUNT_LEN`] bytes.
    pub mount: String,
    /// Path of the file within the mount; at most [`MAX_PATH_LEN`] bytes.
    pub path: String,
    /// Opaque version of the file's content (etag, mtime, generation); at
    /// most [`MAX_VERSION_TAG_LEN`] bytes.
    pub version_tag: String,
    /// File size in bytes.
    pub size: u64,
}

/// A request frame's header: an id chosen by the client and the operation.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Chosen by the client, echoed in the [`Response`].
    pub request_id: u64,
    /// What is asked.
    pub body: RequestBody,
}

/// The operations a client can ask a shard for.
///
/// `epoch` fields carry the ring epoch the client routed the request with.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum RequestBody {
    /// Liveness check, answered with [`ResponseBody::Pong`] echoing `nonce`.
    Ping {
        /// Any value; echoed back.
        nonce: u64,
    },
    /// Asks for the shard's current ring epoch ([`ResponseBody::Epoch`]).
    RingEpoch,
    /// Asks for the shard's counters ([`ResponseBody::Stat`]).
    Stat,
    /// Reads `len` bytes at `offset` within one page
    /// ([`ResponseBody::Data`] + payload, [`ResponseBody::Miss`],
    /// [`ResponseBody::NotOwner`]). `offset + len` is at most
    /// [`MAX_PAGE_LEN`].
    ReadRange {
        /// The page.
        key: Key,
        /// First byte within the page.
        offset: u32,
        /// Bytes wanted.
        len: u32,
        /// Ring epoch the client routed with.
        epoch: u64,
    },
    /// Reads whole pages, at most [`MAX_BATCH`] ([`ResponseBody::Pages`]:
    /// one status per page, payload = the found pages concatenated).
    ReadPages {
        /// Pages wanted, in the order the payload returns them.
        pages: Vec<Key>,
        /// Ring epoch the client routed with.
        epoch: u64,
    },
    /// Stores one page; the payload is the page, exactly `len` bytes
    /// ([`ResponseBody::Written`]).
    WritePage {
        /// The page.
        key: Key,
        /// Version of the page's content.
        version: u64,
        /// Page length; must equal the preamble's payload length and be at
        /// most [`MAX_PAGE_LEN`].
        len: u32,
        /// Ring epoch the client routed with.
        epoch: u64,
    },
    /// Asks the shard to read pages of a file from its backing store into
    /// the cache ([`ResponseBody::Loaded`]).
    LoadPages {
        /// The file and where to find it.
        file: FileRef,
        /// Page indices to load, at most [`MAX_LOAD_PAGES`].
        pages: Vec<u64>,
        /// Ring epoch the client routed with.
        epoch: u64,
    },
    /// Drops every cached page of a file ([`ResponseBody::Removed`]).
    RemoveFile {
        /// The file.
        file_id: FileId,
        /// Ring epoch the client routed with.
        epoch: u64,
    },
    /// Reads `len` bytes at `offset` within page `page` of `file`, loading
    /// the page from the under storage on a miss (read-through):
    /// [`ResponseBody::Data`] + payload, [`ResponseBody::NotOwner`], or an
    /// error (`NotFound`, `Changed` when the object no longer has
    /// `file.version_tag`, `BadRange` past the end of the file).
    Fetch {
        /// The file and where to find it.
        file: FileRef,
        /// Page index within the file.
        page: u64,
        /// First byte within the page.
        offset: u32,
        /// Bytes wanted.
        len: u32,
        /// Ring epoch the client routed with.
        epoch: u64,
        /// Whom the client sent it to, and why.
        route: Route,
    },
    /// Asks what a logical path is ([`ResponseBody::PathInfo`], or an error
    /// `NotFound`). Routed to the path's ring owner, which caches the answer
    /// for the metadata TTL; any shard answers it.
    StatPath {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        path: String,
    },
    /// Lists a logical directory in name order, starting after `start_after`
    /// ([`ResponseBody::Listing`]). Routed like `StatPath`.
    List {
        /// Absolute logical path of the directory; at most [`MAX_PATH_LEN`]
        /// bytes.
        path: String,
        /// Name of the last entry already received ("" for the first page).
        start_after: String,
    },
    /// Asks for the cluster's layout: members, page size, mounts
    /// ([`ResponseBody::ClusterInfo`]).
    Cluster,
    /// The object at `path` was written or deleted: drop the pages of its
    /// old version `file_id` and any cached metadata of `path` and of its
    /// directory ([`ResponseBody::Removed`]). Sent to every shard.
    Invalidate {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        path: String,
        /// File id of the version to drop (0: none known).
        file_id: FileId,
    },
    /// Preload job records ([`ResponseBody::Jobs`]). The payload is empty
    /// (only ask) or one job's progress record, a [`JobRecord`] archived by
    /// [`encode_job_record`], at most [`MAX_JOB_RECORD`] bytes, which the
    /// node keeps.
    Jobs,
    /// The shard's monotonic counters ([`ResponseBody::Counters`], payload:
    /// a [`ShardCounters`]): what `Stat` reports and more (bytes served from
    /// the cache and from the under storage, requests), so that tools can
    /// compute rates.
    Counters,
    /// Stores one page of a write-back version (a file written through the
    /// cluster on a `back` or `transient` mount, not in the under storage
    /// yet). The payload is the page, exactly `len` bytes. The shard keeps
    /// it dirty (never evicted) and answers [`ResponseBody::Written`] only
    /// once it is durable on its disk. Sent to each of the page's write
    /// members (the owner and the next members on distinct nodes).
    WriteDirty {
        /// The page: `key.file_id` must be the file id of `version_tag`.
        key: Key,
        /// The write-back version the page belongs to (see
        /// [`crate::writeback::is_wb_tag`]); at most [`MAX_VERSION_TAG_LEN`]
        /// bytes.
        version_tag: String,
        /// Page length; must equal the preamble's payload length and be at
        /// most [`MAX_PAGE_LEN`].
        len: u32,
        /// Ring epoch the client routed with.
        epoch: u64,
        /// As `ChangeOp::Commit`'s `since`: 0 until a commit of the version
        /// has been answered, then the position of the first answered one.
        /// A page of a version no record names whose `since` is the node's
        /// `--write-records-keep` old or more is refused with `Changed`.
        since: u64,
    },
    /// A change of the namespace of a `back` or `transient` mount
    /// ([`ResponseBody::Applied`]): the node records it durably, hands it
    /// to every other node and answers once the cluster's write replicas
    /// hold it.
    Change {
        /// What changes.
        op: ChangeOp,
    },
    /// Node to node: the payload is an archived vector of [`FileRecord`]s
    /// ([`encode_file_records`]) the receiver applies and keeps durably
    /// before it answers [`ResponseBody::Applied`].
    Replicate,
    /// Node to node: the write-back records whose paths sort after `after`
    /// ("" for the first page), as many as fit one answer
    /// ([`ResponseBody::Records`] + payload).
    PullRecords {
        /// The last path already received; at most [`MAX_PATH_LEN`] bytes.
        after: String,
    },
    /// Node to node: what the shard does with the cached pages of a
    /// write-back version ([`ResponseBody::Removed`]: the pages affected).
    FilePages {
        /// The version's file id.
        file_id: FileId,
        /// Clean, drop or seal.
        action: PageAction,
    },
    /// The write-back state of the files under `prefix`
    /// ([`ResponseBody::WriteBack`]): what is waiting to reach the under
    /// storage, as this node knows it.
    WriteBackState {
        /// Absolute logical path of a file or directory; at most
        /// [`MAX_PATH_LEN`] bytes.
        prefix: String,
    },
    /// The shard's hottest files and pages and its bytes per mount
    /// ([`ResponseBody::Hot`], payload: a [`HotReport`]).
    Hot,
    /// Preloading many files at once: like one `LoadPages` per entry, in one
    /// request ([`ResponseBody::FilesLoaded`]: one [`FileOutcome`] per entry,
    /// in order). At most [`MAX_LOAD_FILES`] entries and [`MAX_LOAD_PAGES`]
    /// page indices over all of them; every page named must be the shard's
    /// (else [`ResponseBody::NotOwner`] and nothing is loaded).
    LoadFiles {
        /// The files and the pages of each to load.
        files: Vec<LoadFile>,
        /// Ring epoch the client routed with.
        epoch: u64,
    },
    /// The attributes of write-back version `version_tag` of the file at
    /// `path`, from the node's records ([`ResponseBody::Attributes`];
    /// `NotFound` when the records name another version there, or none).
    Attributes {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        path: String,
        /// The version; at most [`MAX_VERSION_TAG_LEN`] bytes.
        version_tag: String,
    },
    /// A writer gives up write-back version `version_tag`, which it never
    /// committed ([`ResponseBody::Removed`]: the pages the shard dropped).
    /// The shard takes no more pages of it and drops the ones it holds;
    /// `Changed` when a record names the version (a committed file is
    /// deleted, not discarded).
    Discard {
        /// A write-back version tag ([`crate::writeback::is_wb_tag`]); at
        /// most [`MAX_VERSION_TAG_LEN`] bytes.
        version_tag: String,
    },
    /// The writer of write-back version `version_tag`, which it has not
    /// committed yet, is still writing it ([`ResponseBody::Held`]): the
    /// shard's dirty pages of it count as written now, so they are not
    /// dropped as a gone writer's for another orphan grace. Nothing is noted
    /// when the shard holds none. `Changed` when a record names the version
    /// (its commits keep it alive).
    Renew {
        /// A write-back version tag ([`crate::writeback::is_wb_tag`]); at
        /// most [`MAX_VERSION_TAG_LEN`] bytes.
        version_tag: String,
    },
    /// Node to node: the write-back records of `paths` the receiver holds
    /// (none for a path it has no record of) and, for each path, the first
    /// live record beneath it (what makes it a directory), as
    /// [`ResponseBody::Records`] (`more` false) + payload. Asked before a
    /// node judges a change, so it judges it on what its peers hold of the
    /// paths too.
    RecordsOf {
        /// One to [`MAX_RECORDS_OF`] absolute logical paths, each at most
        /// [`MAX_PATH_LEN`] bytes.
        paths: Vec<String>,
    },
    /// Node to node: the write-back records the receiver holds of the
    /// entries of directory `dir` whose names sort after `after`, in name
    /// order: each entry's own record, if any, and, for an entry that records
    /// beneath it make a directory, the first live record beneath it; as
    /// [`ResponseBody::Records`] + payload, at most [`MAX_RECORD_BATCH`]
    /// records, `more` when entries were left out (ask again with `after` =
    /// the name of the last entry answered). [`ResponseBody::Same`] when
    /// `digest` is the digest of exactly those records, all pages together
    /// ([`crate::writeback::records_digest`]): the asker holds the same.
    /// Asked before a node answers a listing of `dir`, so it lists what its
    /// peers hold there too.
    RecordsIn {
        /// Absolute logical path of a directory; at most [`MAX_PATH_LEN`]
        /// bytes.
        dir: String,
        /// The last entry name already received ("" for the first page); at
        /// most [`MAX_NAME_LEN`] bytes.
        after: String,
        /// The digest of the asker's records of the same entries; 0 for none.
        digest: u64,
    },
}

/// One file of a [`RequestBody::LoadFiles`]: where to find it and which of
/// its pages this shard is asked to load.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LoadFile {
    /// The file and where to find it (checked like `LoadPages`' `file`).
    pub file: FileRef,
    /// Page indices to load.
    pub pages: Vec<u64>,
}

impl LoadFile {
    /// At least the bytes this entry adds to a [`RequestBody::LoadFiles`]
    /// header: the 56-byte record, its page indices, and its strings that do
    /// not fit inline (with alignment slack). Clients fill a request up to
    /// [`LOAD_FILES_HEADER_BUDGET`] by this.
    pub fn header_cost(&self) -> usize {
        let out_of_line = |s: &str| if s.len() > 8 { s.len() + 8 } else { 0 };
        56 + 8 * self.pages.len()
            + out_of_line(&self.file.mount)
            + out_of_line(&self.file.path)
            + out_of_line(&self.file.version_tag)
            + 8
    }
}

/// What a shard did with one file of a [`RequestBody::LoadFiles`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    /// Every page named is cached now: `pages` of them were loaded from the
    /// under storage by this request (`bytes` in all); the others were cached
    /// already.
    Loaded {
        /// Pages loaded now.
        pages: u32,
        /// Their bytes.
        bytes: u64,
    },
    /// The file could not be loaded (`NotFound`, `Changed`, `Io`, ...;
    /// `BadRequest` when its file id does not match its path and version).
    /// `loaded` pages of it were loaded before the failure and are kept.
    Failed {
        /// Category.
        code: ErrorCode,
        /// Pages loaded and kept before the failure.
        loaded: u32,
        /// Human-readable detail, at most [`MAX_OUTCOME_MESSAGE_LEN`] bytes.
        message: String,
    },
}

/// How a client routed a [`RequestBody::Fetch`]. Archived as one byte: 0 and
/// 1 are the `false` and `true` of the `replica` flag of versions 1 to 4.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Route {
    /// To the page's owner under the client's ring.
    #[default]
    Owner,
    /// To one of the page's fallback replicas (`--replicas`) or write
    /// members, because the members before it failed: the shard serves it if
    /// it is one, loading a miss from the under storage.
    Fallback,
    /// To one of the first `spread` members of a page the owner reported hot
    /// (`Data::spread`): the shard serves it if it is one, and copies a miss
    /// from the owner (peer to peer), never from the under storage.
    Hot,
    /// To a write member that answered `Unverified`, because no other write
    /// member holds the page: the shard serves its recovered copy.
    Recovered,
}

/// One attribute of a write-back file's object, as the under storage keeps
/// it: `name` is a lowercase HTTP header name, one of `content-type`,
/// `cache-control`, `content-disposition`, `content-encoding` and
/// `content-language`, or `x-amz-meta-` and a user metadata key.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Attr {
    /// The attribute's name.
    pub name: String,
    /// Its value.
    pub value: String,
}

/// Checks a list of [`Attr`]s against [`MAX_ATTRS`] and [`MAX_ATTRS_BYTES`].
pub fn check_attrs(what: &str, attrs: &[Attr]) -> Result<(), FrameError> {
    bounded_count(what, attrs.len(), MAX_ATTRS)?;
    let bytes: usize = attrs.iter().map(|a| a.name.len() + a.value.len()).sum();
    if bytes > MAX_ATTRS_BYTES {
        return Err(FrameError::Limit(format!(
            "{what} take {bytes} bytes, at most {MAX_ATTRS_BYTES} allowed"
        )));
    }
    Ok(())
}

/// What a conditional commit requires of its path ([`ChangeOp::Commit`]):
/// the metadata owner checks it and makes the commit in one step, so of two
/// writers racing to create a path exactly one succeeds.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub enum Expect {
    /// Nothing: the commit replaces whatever the path holds.
    #[default]
    Any,
    /// The path holds no file (S3 `If-None-Match: *`).
    Absent,
    /// The path holds this version of a file (its version tag, as a stat
    /// gives it; S3 `If-Match`); at most [`MAX_VERSION_TAG_LEN`] bytes.
    Version(String),
}

/// A namespace change of [`RequestBody::Change`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ChangeOp {
    /// Makes `path` name write-back version `version_tag` of `size` bytes
    /// (its pages written with `WriteDirty` before): the file is visible
    /// to every reader from then on. `last` is the writer's final commit
    /// (its close): the version takes no more pages and may be flushed.
    /// A commit of a version that a rename moved updates the file where it
    /// is now; one of a version that was deleted changes nothing.
    Commit {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        path: String,
        /// The version; at most [`MAX_VERSION_TAG_LEN`] bytes.
        version_tag: String,
        /// Size in bytes.
        size: u64,
        /// Modification time, nanoseconds since the Unix epoch.
        mtime_ns: i64,
        /// The writer's last commit of this version.
        last: bool,
        /// What the path must hold for the version's first commit to take it
        /// (a conditional write; later commits of the version are not checked).
        expect: Expect,
        /// The object's attributes, kept with the version and written with
        /// it to the under storage (each commit's replace the last's); at
        /// most [`MAX_ATTRS`] within [`MAX_ATTRS_BYTES`].
        attrs: Vec<Attr>,
        /// 0 until a commit of the version has been answered; from then on
        /// the position (`Applied`'s `hlc`) of the first answered one. A
        /// later commit of a version no record names, first answered at
        /// least the node's `--write-records-keep` before, is refused with
        /// `Changed`: its record may have been forgotten once flushed.
        since: u64,
    },
    /// Renames the file (not a directory) `from` to `to` within one mount.
    /// With `replace` false an existing `to` is an `Exists` error.
    Rename {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        from: String,
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        to: String,
        /// Whether an existing `to` is replaced.
        replace: bool,
    },
    /// Deletes the file `path` (`dir` false) or the empty directory
    /// `path` (`dir` true; `NotEmpty` when it holds anything).
    Delete {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        path: String,
        /// A directory (rmdir) rather than a file (unlink).
        dir: bool,
        /// What the path must hold for the deletion to be made (a conditional
        /// delete: [`Expect::Version`] of the file there; [`Expect::Any`] for
        /// a directory).
        expect: Expect,
    },
    /// Makes the directory `path` (`Exists` when there is one already).
    MakeDir {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        path: String,
        /// Modification time, nanoseconds since the Unix epoch.
        mtime_ns: i64,
    },
    /// Sets the modification time of the file `path` holds, which must be
    /// write-back version `version_tag` (`Changed` otherwise; `NotFound`
    /// where no record names the path: a file only in the under storage
    /// has the store's time). Nothing else of the file changes, whatever
    /// its state: a closed or flushed version stays so. With an empty
    /// `version_tag` it sets the time of the directory made through the
    /// cluster at `path` instead (`IsDir` for a non-empty tag there,
    /// `Changed` for an empty one where a file is; `NotFound` where no
    /// record makes a directory: one of the store, or implied by the paths
    /// beneath it, has no time to set).
    SetTime {
        /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
        path: String,
        /// The version the path must hold ("" for a directory); at most
        /// [`MAX_VERSION_TAG_LEN`] bytes.
        version_tag: String,
        /// Modification time, nanoseconds since the Unix epoch.
        mtime_ns: i64,
    },
}

/// What [`RequestBody::FilePages`] does with a version's pages.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageAction {
    /// The version is in the under storage now: its pages become ordinary
    /// cached pages (evictable).
    Clean,
    /// The version is gone (replaced, deleted, abandoned): drop its pages,
    /// dirty or not.
    Drop,
    /// The version takes no more pages: refuse later `WriteDirty` of it and
    /// answer once the ones in progress are done.
    Seal,
}

/// What a logical path names.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum PathKind {
    /// An object.
    File {
        /// Size in bytes.
        size: u64,
        /// Version tag of its content (etag, or mtime and size).
        version_tag: String,
        /// The file id of the path at this version.
        file_id: FileId,
        /// The object's modification time in the store, nanoseconds since
        /// the Unix epoch (negative before it).
        mtime_ns: i64,
        /// Where the bytes are: only in the under storage, or written
        /// through the cluster and flushed or not yet.
        state: FileState,
        /// The version of the object in the under storage that holds these
        /// bytes ("" while none does: a write-back file not flushed yet, or
        /// a transient one). Equal to `version_tag` for [`FileState::Stored`].
        store_tag: String,
    },
    /// A directory (a common prefix, a mount point or one of its parents).
    Dir {
        /// Its modification time, nanoseconds since the Unix epoch, where one
        /// is known: a directory made through the cluster (`MakeDir`, set
        /// later by `SetTime`). 0: none is known (object stores keep no
        /// directories; a common prefix or a mount point has no time).
        mtime_ns: i64,
    },
}

impl PathKind {
    /// A directory with no known time.
    pub const DIR: PathKind = PathKind::Dir { mtime_ns: 0 };
}

/// Where a file's bytes are ([`PathKind::File`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FileState {
    /// An object of the under storage (read through the cache).
    #[default]
    Stored,
    /// Written through the cluster and still open by its writer: visible,
    /// durable on the cluster, not in the under storage yet.
    Writing,
    /// Written through the cluster, closed, waiting to be flushed to the
    /// under storage.
    Dirty,
    /// Written through the cluster and flushed: the under storage holds it
    /// (at `store_tag`).
    Clean,
    /// Written to a `transient` mount: kept on the cluster only, never
    /// flushed.
    Transient,
}

/// One entry of a [`ResponseBody::Listing`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name within the directory (no slash); at most [`MAX_NAME_LEN`] bytes.
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Version tag of a file's content, as [`PathKind::File`] carries it
    /// ("" for directories); at most [`MAX_VERSION_TAG_LEN`] bytes.
    pub version_tag: String,
    /// A file's modification time in the store, nanoseconds since the Unix
    /// epoch; a directory's as [`PathKind::Dir`] has it (0: none known).
    pub mtime_ns: i64,
}

impl DirEntry {
    /// The entry of a subdirectory named `name`.
    pub fn dir(name: String) -> DirEntry {
        DirEntry {
            name,
            is_dir: true,
            size: 0,
            version_tag: String::new(),
            mtime_ns: 0,
        }
    }
}

/// One node of a [`ResponseBody::ClusterInfo`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    /// The node's UUID.
    pub id: FileId,
    /// Base address (`IP:PORT`, shard `i` at port + `i`); at most
    /// [`MAX_URL_LEN`] bytes.
    pub addr: String,
    /// Number of shards.
    pub shards: u16,
}

/// One mount of a [`ResponseBody::ClusterInfo`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Logical prefix ("" for the root).
    pub prefix: String,
    /// Store URL with credentials removed; at most [`MAX_URL_LEN`] bytes.
    pub url: String,
}

/// Outcome for one page of a [`RequestBody::ReadPages`] batch.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageStatus {
    /// The page was found; its `len` bytes are the next part of the payload.
    Data {
        /// Page length in bytes.
        len: u32,
    },
    /// The page is not cached; it contributes no payload bytes.
    Miss,
    /// This shard does not own the page under its current ring; it
    /// contributes no payload bytes.
    NotOwner,
}

/// Error categories of [`ResponseBody::Error`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The frame was malformed or broke a protocol rule.
    BadRequest,
    /// The requested byte range lies outside the page.
    BadRange,
    /// A size limit was exceeded (frame, batch, response payload).
    TooLarge,
    /// The file or object named does not exist.
    NotFound,
    /// The shard's storage failed.
    Io,
    /// The cache is full and cannot take the data.
    Full,
    /// The shard cannot serve now (starting, draining, overloaded).
    Unavailable,
    /// The peer is not allowed to do this.
    Forbidden,
    /// A bug or unexpected condition on the shard.
    Internal,
    /// The object's content changed: it no longer has the version tag the
    /// request named. Stat the path again.
    Changed,
    /// The path exists already (a `MakeDir`, or a `Rename` without
    /// `replace`).
    Exists,
    /// The directory is not empty (a `Delete` with `dir`).
    NotEmpty,
    /// The page belongs to a write-back version that is not in the under
    /// storage yet and this member does not hold it: ask the page's other
    /// write members.
    Unflushed,
    /// A write-back change would make a directory a file (the path is a
    /// directory).
    IsDir,
    /// A write-back change would put a path beneath a file (an ancestor is a
    /// file).
    NotDir,
    /// This member holds the write-back page only as it recovered it (after a
    /// restart, or after etcd counted it down): the page's other write members
    /// may hold newer bytes. Ask them; ask this one again with
    /// [`Route::Recovered`] only if none holds the page.
    Unverified,
    /// A conditional write-back commit found its path holding something else
    /// than it expected ([`Expect`]); nothing was changed.
    Precondition,
}

/// A response frame's header: the echoed request id and the outcome.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The `request_id` of the request answered.
    pub request_id: u64,
    /// The outcome.
    pub body: ResponseBody,
}

/// The answers a shard can give.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ResponseBody {
    /// Answer to `ReadRange`: the payload holds the requested bytes, which
    /// are at most `page_len` (the range clipped to the page's end).
    Data {
        /// Full length of the stored page.
        page_len: u32,
        /// Version of the page's content.
        version: u64,
        /// Set by a page's owner on a `Fetch` of a hot page: the members
        /// (the owner and the next ring members on distinct nodes) readers
        /// may spread their reads of it over, sending them with
        /// [`Route::Hot`]. 0: not hot (and in every other answer).
        spread: u8,
    },
    /// Answer to `ReadPages`: one entry per requested page, in request
    /// order; the payload is the `Data` pages concatenated in that order.
    Pages {
        /// Per-page outcome, at most [`MAX_BATCH`].
        entries: Vec<PageStatus>,
    },
    /// The page is not cached.
    Miss,
    /// This shard does not own (all of) the request's keys under its ring
    /// epoch `epoch`; the client should refresh its ring and retry.
    NotOwner {
        /// The shard's current ring epoch.
        epoch: u64,
    },
    /// Answer to `WritePage`: the page is stored.
    Written,
    /// Answer to `LoadPages`.
    Loaded {
        /// Pages now cached as a result.
        pages: u32,
        /// Bytes those pages hold.
        bytes: u64,
    },
    /// Answer to `RemoveFile`.
    Removed {
        /// Pages dropped.
        pages: u32,
    },
    /// Answer to `Ping`.
    Pong {
        /// The request's nonce.
        nonce: u64,
    },
    /// Answer to `RingEpoch`.
    Epoch {
        /// The shard's current ring epoch.
        epoch: u64,
    },
    /// Answer to `Stat`.
    Stat {
        /// Shard index within its node.
        shard: u16,
        /// Pages cached.
        pages: u64,
        /// Bytes cached.
        bytes: u64,
        /// Capacity in bytes.
        capacity_bytes: u64,
        /// Read hits since start.
        hits: u64,
        /// Read misses since start.
        misses: u64,
    },
    /// The request failed.
    Error {
        /// Category.
        code: ErrorCode,
        /// Human-readable detail, at most [`MAX_MESSAGE_LEN`] bytes.
        message: String,
    },
    /// Answer to `StatPath`.
    PathInfo {
        /// What the path names.
        kind: PathKind,
    },
    /// Answer to `List`: entries in name order, at most
    /// [`MAX_LIST_ENTRIES`].
    Listing {
        /// The entries.
        entries: Vec<DirEntry>,
        /// Whether more entries follow (ask again with `start_after` = the
        /// last name).
        more: bool,
    },
    /// Answer to `Cluster`.
    ClusterInfo {
        /// Page size of the cluster, in bytes.
        page_size: u32,
        /// Ring epoch.
        epoch: u64,
        /// Replicas a client may try before the under storage.
        replicas: u8,
        /// The members, at most [`MAX_NODES`].
        nodes: Vec<NodeEntry>,
        /// The mount table, at most [`MAX_MOUNTS`].
        mounts: Vec<MountEntry>,
        /// Members (on distinct nodes) that keep each page and record of a
        /// write-back file before a write is acknowledged, as the node is
        /// configured (`--write-replicas`; 0 is taken as 1): clients clamp it
        /// to the ring's nodes as the ring changes
        /// ([`effective_replicas`](crate::writeback::effective_replicas)).
        write_replicas: u8,
    },
    /// Answer to `Jobs`: the payload is the job records the node keeps, most
    /// recently updated first ([`encode_job_records`]: an archived vector of
    /// [`JobRecord`], at most [`MAX_JOB_RECORDS`]).
    Jobs,
    /// Answer to `Counters`: the payload is one archived [`ShardCounters`]
    /// ([`encode_counters`]), exactly [`COUNTERS_PAYLOAD_LEN`] bytes.
    Counters,
    /// Answer to `Change` and `Replicate`: the change is kept durably (by
    /// the cluster's write replicas, for `Change`).
    Applied {
        /// The change's position in the cluster's order of changes (a
        /// hybrid logical clock: milliseconds << 16 | a counter); for
        /// `Replicate`, the largest one applied.
        hlc: u64,
    },
    /// Answer to `PullRecords`, `RecordsOf` and `RecordsIn`: the payload is
    /// an archived vector of [`FileRecord`]s ([`encode_file_records`]; in
    /// path order for `PullRecords`).
    Records {
        /// Whether more records follow (ask again with `after` = the last
        /// path received).
        more: bool,
    },
    /// Answer to `WriteBackState`.
    WriteBack {
        /// The state.
        summary: WriteBackSummary,
    },
    /// Answer to `Hot`: the payload is one archived [`HotReport`]
    /// ([`encode_hot_report`]), at most [`MAX_HOT_PAYLOAD`] bytes.
    Hot,
    /// Answer to `LoadFiles`: one outcome per file named, in request order.
    FilesLoaded {
        /// Per-file outcome, at most [`MAX_LOAD_FILES`].
        outcomes: Vec<FileOutcome>,
    },
    /// Answer to `Attributes`.
    Attributes {
        /// The version's attributes, at most [`MAX_ATTRS`] within
        /// [`MAX_ATTRS_BYTES`].
        attrs: Vec<Attr>,
    },
    /// Answer to `Renew`.
    Held {
        /// The version's dirty pages the shard holds (0: none; the writer
        /// knows whether it sent it any).
        pages: u32,
        /// The node's orphan grace in milliseconds: how long after the
        /// newest page or renewal it drops the pages of a version no record
        /// names. A writer renews well within it.
        grace_ms: u64,
    },
    /// Answer to `RecordsIn` whose digest is that of the receiver's records
    /// of the entries asked for: it holds the same.
    Same,
}

/// The write-back state under a prefix ([`ResponseBody::WriteBack`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct WriteBackSummary {
    /// Files written through the cluster and not in the under storage yet
    /// (open, dirty or sealed; transient files not counted).
    pub files_dirty: u64,
    /// Their bytes.
    pub bytes_dirty: u64,
    /// Deletions and renames not applied to the under storage yet.
    pub deletes_pending: u64,
    /// Files this node is flushing now.
    pub files_flushing: u64,
    /// Age of the oldest dirty file's last change, milliseconds (0: none).
    pub oldest_dirty_ms: u64,
    /// Flush attempts of this node that failed, since it started.
    pub flush_errors: u64,
    /// Bytes this node flushed since it started.
    pub bytes_flushed: u64,
    /// The last flush error of this node under the prefix ("" if none); at
    /// most [`MAX_MESSAGE_LEN`] bytes.
    pub last_error: String,
}

// ---------------------------------------------------------------------------
// Payload records
// ---------------------------------------------------------------------------

/// One shard's monotonic counters: the payload of [`ResponseBody::Counters`].
/// Everything `Stat` reports, and what tools need to compute rates.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ShardCounters {
    /// Shard index within its node.
    pub shard: u16,
    /// Pages cached.
    pub pages: u64,
    /// Bytes cached.
    pub bytes: u64,
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Read hits since start.
    pub hits: u64,
    /// Read misses since start.
    pub misses: u64,
    /// Bytes served from the cache since start.
    pub hit_bytes: u64,
    /// Pages read from the under storage since start.
    pub ufs_reads: u64,
    /// Bytes read from the under storage since start.
    pub ufs_bytes: u64,
    /// Under-storage reads that failed since start.
    pub ufs_errors: u64,
    /// Pages evicted since start.
    pub evictions: u64,
    /// Pages dropped because a checksum did not match, since start.
    pub checksum_failures: u64,
    /// `Fetch` requests served as a replica (a client's owner failed it).
    pub replica_reads: u64,
    /// `NotOwner` answers (a client routed with another ring).
    pub not_owner: u64,
    /// Requests refused because the peer's role does not allow them.
    pub forbidden: u64,
    /// The shard's ring epoch.
    pub epoch: u64,
    /// Misses that joined a load of the same page already in flight (the
    /// single flight: served without a store read of their own).
    pub coalesced: u64,
    /// Page loads of a page this shard had read from the under storage
    /// recently already (a second store read of the same page).
    pub ufs_repeat_reads: u64,
    /// Page bytes sent to clients (`Fetch`, `ReadRange`, `ReadPages`), from
    /// wherever they came.
    pub served_bytes: u64,
    /// `Fetch` requests answered from the memory tier (no disk read).
    pub memory_hits: u64,
    /// Bytes sent from the memory tier.
    pub memory_hit_bytes: u64,
    /// Bytes the memory tier holds now.
    pub memory_bytes: u64,
    /// The memory tier's capacity on this shard (0: off).
    pub memory_capacity: u64,
    /// Pages admitted into the memory tier.
    pub memory_admissions: u64,
    /// Pages evicted from the memory tier.
    pub memory_evictions: u64,
    /// Pages this shard owns that turned hot (spread to replicas) since start.
    pub hot_turned: u64,
    /// Pages this shard owns that are hot now.
    pub hot_now: u64,
    /// Copies of other owners' hot pages this shard made since start.
    pub replica_copies: u64,
    /// Copies the owner could not give (the reader was answered
    /// `Unavailable` and asked the owner itself; never a store read).
    pub replica_copy_failures: u64,
    /// Copies of hot pages this shard holds now.
    pub replicas_held: u64,
    /// Copies dropped because nobody read them for the cooling time.
    pub replicas_dropped: u64,
    /// `Fetch` requests this shard served as a hot page's replica.
    pub replica_hot_reads: u64,
}

/// One of a shard's hottest files, by bytes served (space-saving counts:
/// `bytes` over-counts the file by at most `bytes_error`).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct HotFile {
    /// The file (path and version).
    pub file_id: FileId,
    /// Its logical path; at most [`MAX_PATH_LEN`] bytes.
    pub path: String,
    /// Bytes served, estimated (at most `bytes_error` too many).
    pub bytes: u64,
    /// How much of `bytes` may belong to files it displaced in the table
    /// (the count it started from).
    pub bytes_error: u64,
    /// Reads counted since the file entered the table (exact).
    pub reads: u64,
}

/// One of a shard's hottest pages, by reads (space-saving counts, like
/// [`HotFile`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HotPage {
    /// The page.
    pub key: Key,
    /// Reads, estimated (at most `reads_error` too many).
    pub reads: u64,
    /// The count the page started from in the table.
    pub reads_error: u64,
    /// The members the page is spread over now, as its owner answers it
    /// (0: not hot).
    pub spread: u8,
}

/// One mount's bytes on a shard: what it served from the cache and what it
/// read from the under storage, and the price of the store's egress.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct MountBytes {
    /// The mount's logical prefix; at most [`MAX_PATH_LEN`] bytes.
    pub prefix: String,
    /// The egress price of its store in US dollars per TB (10^12 bytes),
    /// from the mount URL's `egress_usd_per_tb` (0: not priced). Finite, not
    /// negative.
    pub usd_per_tb: f64,
    /// Bytes served to `Fetch` requests without a store read of their own:
    /// from the memory tier, from disk, or from a load another request
    /// started (kept off the store).
    pub cache_bytes: u64,
    /// Bytes read from the under storage for this mount (misses and
    /// preloads).
    pub store_bytes: u64,
}

/// The payload of a [`ResponseBody::Hot`] answer: a shard's hottest files
/// and pages since it started, and its bytes per mount.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct HotReport {
    /// Shard index within its node.
    pub shard: u16,
    /// Hottest files first, at most [`MAX_HOT_FILES`].
    pub files: Vec<HotFile>,
    /// Hottest pages first, at most [`MAX_HOT_PAGES`].
    pub pages: Vec<HotPage>,
    /// One entry per mount of the shard's table, at most [`MAX_MOUNTS`],
    /// their prefixes together at most [`MAX_MOUNT_TABLE_BYTES`] (as in
    /// `ClusterInfo`).
    pub mounts: Vec<MountBytes>,
}

impl HotReport {
    /// Checks the report's limits ([`FrameError::Limit`]) and that prices
    /// are finite and not negative ([`FrameError::Mismatch`]).
    pub fn validate(&self) -> Result<(), FrameError> {
        bounded_count("HotReport files", self.files.len(), MAX_HOT_FILES)?;
        bounded_count("HotReport pages", self.pages.len(), MAX_HOT_PAGES)?;
        bounded_count("HotReport mounts", self.mounts.len(), MAX_MOUNTS)?;
        for f in &self.files {
            bounded_str("HotFile path", &f.path, MAX_PATH_LEN)?;
        }
        let mut prefixes = 0usize;
        for m in &self.mounts {
            bounded_str("MountBytes prefix", &m.prefix, MAX_PATH_LEN)?;
            prefixes += m.prefix.len();
            if !(m.usd_per_tb.is_finite() && m.usd_per_tb >= 0.0) {
                return Err(FrameError::Mismatch(format!(
                    "MountBytes usd_per_tb {} is not a finite price of at least 0",
                    m.usd_per_tb
                )));
            }
        }
        if prefixes > MAX_MOUNT_TABLE_BYTES {
            return Err(FrameError::Limit(format!(
                "HotReport mount prefixes take {prefixes} bytes, at most \
                 MAX_MOUNT_TABLE_BYTES = {MAX_MOUNT_TABLE_BYTES} allowed"
            )));
        }
        Ok(())
    }
}

/// The state of a preload job as its CLI reports it.
#[derive(
    Archive,
    Serialize,
    Deserialize,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Loading.
    #[default]
    Running,
    /// Finished, every file loaded.
    Done,
    /// Finished, some files failed.
    Failed,
}

impl JobState {
    /// `running`, `done` or `failed`: the name operators see (and the JSON
    /// of `/v1/jobs` carries).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A preload job's progress record (`pagectl load` reports it to every
/// node, which keep it): the payload of a [`RequestBody::Jobs`] request,
/// and the element of a [`ResponseBody::Jobs`] payload. Times are seconds
/// (Unix seconds for `submitted` and `updated`). `/v1/jobs` shows it as JSON
/// with these field names.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct JobRecord {
    /// The job's id: 1 to [`MAX_JOB_ID`] bytes.
    pub id: String,
    /// What the job loads (`manifest FILE` or `prefix PATH`); at most
    /// [`MAX_JOB_SOURCE_LEN`] bytes.
    pub source: String,
    /// Who runs it (`host:pid`); at most [`MAX_JOB_CLIENT_LEN`] bytes.
    pub client: String,
    /// Running, done or failed.
    pub state: JobState,
    /// Whether the job also checks every page against the under storage.
    pub verify: bool,
    /// When the job was submitted (Unix seconds).
    pub submitted: f64,
    /// When this record was made (Unix seconds).
    pub updated: f64,
    /// Seconds from submission to `updated`.
    pub elapsed_secs: f64,
    /// Seconds spent resolving the manifest or prefix to files.
    pub resolve_secs: f64,
    /// Seconds from submission to the first page cached, once there is one.
    pub first_page_secs: Option<f64>,
    /// Files in the job.
    pub files_total: u64,
    /// Files finished (loaded or failed).
    pub files_done: u64,
    /// Files that failed.
    pub files_failed: u64,
    /// Bytes of the finished files.
    pub bytes_done: u64,
    /// Bytes loaded from the under storage.
    pub bytes_loaded: u64,
    /// Pages loaded from the under storage.
    pub pages_loaded: u64,
    /// Pages that were cached already.
    pub pages_present: u64,
}

impl JobRecord {
    /// Checks the record's limits: an id of 1 to [`MAX_JOB_ID`] bytes, and
    /// the other strings within theirs ([`FrameError::Limit`]). The payload
    /// encoders and decoders call this.
    pub fn validate(&self) -> Result<(), FrameError> {
        if self.id.is_empty() {
            return Err(FrameError::Limit("JobRecord id is empty".to_string()));
        }
        bounded_str("JobRecord id", &self.id, MAX_JOB_ID)?;
        bounded_str("JobRecord source", &self.source, MAX_JOB_SOURCE_LEN)?;
        bounded_str("JobRecord client", &self.client, MAX_JOB_CLIENT_LEN)
    }
}

/// What a write-back record says of its path ([`FileRecord`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum RecordEntry {
    /// A file written through the cluster.
    File {
        /// Its write-back version; at most [`MAX_VERSION_TAG_LEN`] bytes.
        version_tag: String,
        /// Size in bytes.
        size: u64,
        /// Modification time, nanoseconds since the Unix epoch.
        mtime_ns: i64,
        /// Where it is in its life.
        state: RecordState,
        /// The under storage's version of the flushed object ("" until
        /// [`RecordState::Clean`]); at most [`MAX_VERSION_TAG_LEN`] bytes.
        store_tag: String,
        /// Written to a `transient` mount (never flushed).
        transient: bool,
        /// The object's attributes (the last commit's); at most
        /// [`MAX_ATTRS`] within [`MAX_ATTRS_BYTES`].
        attrs: Vec<Attr>,
    },
    /// A directory made through the cluster.
    Dir {
        /// Modification time, nanoseconds since the Unix epoch.
        mtime_ns: i64,
    },
    /// The path was deleted (or renamed away) through the cluster.
    Deleted {
        /// The write-back version it named, if any ("": none, or an object
        /// of the under storage); at most [`MAX_VERSION_TAG_LEN`] bytes.
        prev_tag: String,
        /// The under storage may still hold an object at the path that the
        /// flusher must delete.
        pending: bool,
    },
}

/// The life of a write-back file ([`RecordEntry::File`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// Committed by a writer that still has it open: it may write more
    /// pages of the version and commit again.
    Open,
    /// The writer's last commit: no more pages; waits for the flush.
    Final,
    /// An open version whose writer went silent: sealed (no more pages
    /// accepted) so that it can be flushed.
    Sealed,
    /// In the under storage at `store_tag`.
    Clean,
}

/// One path's write-back record: what the cluster's nodes keep, each a
/// full copy, of the files, directories and deletions made through the
/// cluster on `back` and `transient` mounts. The payload element of
/// `Replicate` and `Records`.
///
/// Of two records of one path, the one with the larger
/// [`FileRecord::order`] wins (last writer wins in the cluster's order).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    /// Absolute logical path; at most [`MAX_PATH_LEN`] bytes.
    pub path: String,
    /// Position in the cluster's order of changes (hybrid logical clock of
    /// the node that made the change).
    pub hlc: u64,
    /// The node that made the change (breaks ties of `hlc`).
    pub origin: FileId,
    /// What the path is.
    pub entry: RecordEntry,
}

impl FileRecord {
    /// The record's rank among records of its path: `(hlc, origin, stage)`,
    /// where the stage orders the steps that keep a change's identity
    /// (`hlc`, `origin`): a seal (1) and a flush (2) after the commit (0), a
    /// deletion applied to the under storage (1) after the deletion (0).
    pub fn order(&self) -> (u64, u128, u8) {
        let stage = match &self.entry {
            RecordEntry::File { state, .. } => match state {
                RecordState::Open | RecordState::Final => 0,
                RecordState::Sealed => 1,
                RecordState::Clean => 2,
            },
            RecordEntry::Dir { .. } => 0,
            RecordEntry::Deleted { pending, .. } => u8::from(!*pending),
        };
        (self.hlc, self.origin.as_u128(), stage)
    }

    /// Checks the record's limits ([`FrameError::Limit`]): the path is
    /// absolute and at most [`MAX_PATH_LEN`] bytes, tags at most
    /// [`MAX_VERSION_TAG_LEN`].
    pub fn validate(&self) -> Result<(), FrameError> {
        bounded_str("FileRecord path", &self.path, MAX_PATH_LEN)?;
        if !self.path.starts_with('/') {
            return Err(FrameError::Limit(format!(
                "FileRecord path {:?} is not absolute",
                self.path
            )));
        }
        match &self.entry {
            RecordEntry::File {
                version_tag,
                store_tag,
                attrs,
                ..
            } => {
                bounded_str("FileRecord version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                bounded_str("FileRecord store_tag", store_tag, MAX_VERSION_TAG_LEN)?;
                check_attrs("FileRecord attrs", attrs)
            }
            RecordEntry::Dir { .. } => Ok(()),
            RecordEntry::Deleted { prev_tag, .. } => {
                bounded_str("FileRecord prev_tag", prev_tag, MAX_VERSION_TAG_LEN)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Semantic validation
// ---------------------------------------------------------------------------

fn no_payload(what: &str, payload_len: u32) -> Result<(), FrameError> {
    if payload_len == 0 {
        Ok(())
    } else {
        Err(FrameError::Mismatch(format!(
            "{what} carries no payload but the preamble announces {payload_len} bytes"
        )))
    }
}

fn bounded_str(field: &str, value: &str, max: usize) -> Result<(), FrameError> {
    if value.len() <= max {
        Ok(())
    } else {
        Err(FrameError::Limit(format!(
            "{field} is {} bytes, at most {max} allowed",
            value.len()
        )))
    }
}

fn bounded_page(field: &str, len: u32) -> Result<(), FrameError> {
    if len <= MAX_PAGE_LEN {
        Ok(())
    } else {
        Err(FrameError::Limit(format!(
            "{field} {len} exceeds the page limit of {MAX_PAGE_LEN}"
        )))
    }
}

fn bounded_payload(payload_len: u32) -> Result<(), FrameError> {
    if payload_len <= MAX_PAYLOAD {
        Ok(())
    } else {
        Err(FrameError::PayloadTooLarge {
            len: u64::from(payload_len),
        })
    }
}

impl Request {
    /// Checks the protocol rules a request must meet beyond being a valid
    /// archive, given the payload length that travels with it. Encoding and
    /// decoding both call this.
    pub fn validate(&self, payload_len: u32) -> Result<(), FrameError> {
        bounded_payload(payload_len)?;
        match &self.body {
            RequestBody::Ping { .. } => no_payload("Ping", payload_len),
            RequestBody::RingEpoch => no_payload("RingEpoch", payload_len),
            RequestBody::Stat => no_payload("Stat", payload_len),
            RequestBody::ReadRange { offset, len, .. } => {
                let end = u64::from(*offset) + u64::from(*len);
                if end > u64::from(MAX_PAGE_LEN) {
                    return Err(FrameError::Limit(format!(
                        "ReadRange offset {offset} + len {len} exceeds the page limit of {MAX_PAGE_LEN}"
                    )));
                }
                no_payload("ReadRange", payload_len)
            }
            RequestBody::ReadPages { pages, .. } => {
                if pages.len() > MAX_BATCH {
                    return Err(FrameError::Limit(format!(
                        "ReadPages names {} pages, at most {MAX_BATCH} allowed",
                        pages.len()
                    )));
                }
                no_payload("ReadPages", payload_len)
            }
            RequestBody::WritePage { len, .. } => {
                bounded_page("WritePage len", *len)?;
                if *len != payload_len {
                    return Err(FrameError::Mismatch(format!(
                        "WritePage len {len} differs from payload length {payload_len}"
                    )));
                }
                Ok(())
            }
            RequestBody::LoadPages { file, pages, .. } => {
                bounded_file_ref(file)?;
                if pages.len() > MAX_LOAD_PAGES {
                    return Err(FrameError::Limit(format!(
                        "LoadPages names {} pages, at most {MAX_LOAD_PAGES} allowed",
                        pages.len()
                    )));
                }
                no_payload("LoadPages", payload_len)
            }
            RequestBody::RemoveFile { .. } => no_payload("RemoveFile", payload_len),
            RequestBody::Fetch {
                file, offset, len, ..
            } => {
                bounded_file_ref(file)?;
                let end = u64::from(*offset) + u64::from(*len);
                if end > u64::from(MAX_PAGE_LEN) {
                    return Err(FrameError::Limit(format!(
                        "Fetch offset {offset} + len {len} exceeds the page limit of {MAX_PAGE_LEN}"
                    )));
                }
                no_payload("Fetch", payload_len)
            }
            RequestBody::StatPath { path } => {
                bounded_str("StatPath path", path, MAX_PATH_LEN)?;
                no_payload("StatPath", payload_len)
            }
            RequestBody::List { path, start_after } => {
                bounded_str("List path", path, MAX_PATH_LEN)?;
                bounded_str("List start_after", start_after, MAX_NAME_LEN)?;
                no_payload("List", payload_len)
            }
            RequestBody::Cluster => no_payload("Cluster", payload_len),
            RequestBody::Invalidate { path, .. } => {
                bounded_str("Invalidate path", path, MAX_PATH_LEN)?;
                no_payload("Invalidate", payload_len)
            }
            RequestBody::Counters => no_payload("Counters", payload_len),
            RequestBody::Hot => no_payload("Hot", payload_len),
            RequestBody::Jobs => {
                if payload_len > MAX_JOB_RECORD {
                    return Err(FrameError::Limit(format!(
                        "a job record of {payload_len} bytes exceeds {MAX_JOB_RECORD}"
                    )));
                }
                Ok(())
            }
            RequestBody::WriteDirty {
                version_tag, len, ..
            } => {
                bounded_str("WriteDirty version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                bounded_page("WriteDirty len", *len)?;
                if *len != payload_len {
                    return Err(FrameError::Mismatch(format!(
                        "WriteDirty len {len} differs from payload length {payload_len}"
                    )));
                }
                Ok(())
            }
            RequestBody::Change { op } => {
                match op {
                    ChangeOp::Commit {
                        path,
                        version_tag,
                        expect,
                        attrs,
                        ..
                    } => {
                        bounded_str("Commit path", path, MAX_PATH_LEN)?;
                        bounded_str("Commit version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                        check_attrs("Commit attrs", attrs)?;
                        if let Expect::Version(v) = expect {
                            bounded_str("Commit expect", v, MAX_VERSION_TAG_LEN)?;
                        }
                    }
                    ChangeOp::Rename { from, to, .. } => {
                        bounded_str("Rename from", from, MAX_PATH_LEN)?;
                        bounded_str("Rename to", to, MAX_PATH_LEN)?;
                    }
                    ChangeOp::Delete { path, expect, .. } => {
                        bounded_str("Delete path", path, MAX_PATH_LEN)?;
                        if let Expect::Version(v) = expect {
                            bounded_str("Delete expect", v, MAX_VERSION_TAG_LEN)?;
                        }
                    }
                    ChangeOp::MakeDir { path, .. } => {
                        bounded_str("MakeDir path", path, MAX_PATH_LEN)?
                    }
                    ChangeOp::SetTime {
                        path, version_tag, ..
                    } => {
                        bounded_str("SetTime path", path, MAX_PATH_LEN)?;
                        bounded_str("SetTime version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                    }
                }
                no_payload("Change", payload_len)
            }
            RequestBody::Replicate => bounded_records_payload("Replicate", payload_len),
            RequestBody::PullRecords { after } => {
                bounded_str("PullRecords after", after, MAX_PATH_LEN)?;
                no_payload("PullRecords", payload_len)
            }
            RequestBody::FilePages { .. } => no_payload("FilePages", payload_len),
            RequestBody::Discard { version_tag } => {
                bounded_str("Discard version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                no_payload("Discard", payload_len)
            }
            RequestBody::Renew { version_tag } => {
                bounded_str("Renew version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                no_payload("Renew", payload_len)
            }
            RequestBody::RecordsOf { paths } => {
                if paths.is_empty() || paths.len() > MAX_RECORDS_OF {
                    return Err(FrameError::Limit(format!(
                        "RecordsOf names {} paths, 1 to {MAX_RECORDS_OF} allowed",
                        paths.len()
                    )));
                }
                for p in paths {
                    bounded_str("RecordsOf path", p, MAX_PATH_LEN)?;
                }
                no_payload("RecordsOf", payload_len)
            }
            RequestBody::RecordsIn { dir, after, .. } => {
                bounded_str("RecordsIn dir", dir, MAX_PATH_LEN)?;
                bounded_str("RecordsIn after", after, MAX_NAME_LEN)?;
                no_payload("RecordsIn", payload_len)
            }
            RequestBody::WriteBackState { prefix } => {
                bounded_str("WriteBackState prefix", prefix, MAX_PATH_LEN)?;
                no_payload("WriteBackState", payload_len)
            }
            RequestBody::LoadFiles { files, .. } => {
                bounded_count("LoadFiles files", files.len(), MAX_LOAD_FILES)?;
                let mut pages = 0usize;
                for f in files {
                    bounded_file_ref(&f.file)?;
                    pages += f.pages.len();
                }
                if pages > MAX_LOAD_PAGES {
                    return Err(FrameError::Limit(format!(
                        "LoadFiles names {pages} pages, at most {MAX_LOAD_PAGES} allowed"
                    )));
                }
                no_payload("LoadFiles", payload_len)
            }
            RequestBody::Attributes { path, version_tag } => {
                bounded_str("Attributes path", path, MAX_PATH_LEN)?;
                bounded_str("Attributes version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                no_payload("Attributes", payload_len)
            }
        }
    }
}

fn bounded_records_payload(what: &str, payload_len: u32) -> Result<(), FrameError> {
    if payload_len > MAX_RECORDS_PAYLOAD {
        return Err(FrameError::Limit(format!(
            "{what} payload of {payload_len} bytes exceeds {MAX_RECORDS_PAYLOAD}"
        )));
    }
    Ok(())
}

fn bounded_file_ref(file: &FileRef) -> Result<(), FrameError> {
    bounded_str("FileRef mount", &file.mount, MAX_MOUNT_LEN)?;
    bounded_str("FileRef path", &file.path, MAX_PATH_LEN)?;
    bounded_str(
        "FileRef version_tag",
        &file.version_tag,
        MAX_VERSION_TAG_LEN,
    )
}

/// Checks that `mounts` fits a [`ResponseBody::ClusterInfo`]: at most
/// [`MAX_MOUNTS`] entries, each prefix at most [`MAX_PATH_LEN`] and each URL
/// at most [`MAX_URL_LEN`] bytes, and all prefixes and URLs together at most
/// [`MAX_MOUNT_TABLE_BYTES`] ([`FrameError::Limit`], naming the limit).
/// Nodes check their mount table with this before they serve it, so that a
/// table clients could not receive is refused at start, not answered with
/// an encoding error later.
pub fn check_mount_table(mounts: &[MountEntry]) -> Result<(), FrameError> {
    if mounts.len() > MAX_MOUNTS {
        return Err(FrameError::Limit(format!(
            "the mount table has {} mounts, at most MAX_MOUNTS = {MAX_MOUNTS} allowed",
            mounts.len()
        )));
    }
    let mut bytes = 0usize;
    for m in mounts {
        bounded_str("MountEntry prefix", &m.prefix, MAX_PATH_LEN)?;
        bounded_str("MountEntry url", &m.url, MAX_URL_LEN)?;
        bytes += m.prefix.len() + m.url.len();
    }
    if bytes > MAX_MOUNT_TABLE_BYTES {
        return Err(FrameError::Limit(format!(
            "the mount table's prefixes and URLs take {bytes} bytes, at most \
             MAX_MOUNT_TABLE_BYTES = {MAX_MOUNT_TABLE_BYTES} allowed"
        )));
    }
    Ok(())
}

fn bounded_count(field: &str, n: usize, max: usize) -> Result<(), FrameError> {
    if n <= max {
        Ok(())
    } else {
        Err(FrameError::Limit(format!(
            "{field} has {n} entries, at most {max} allowed"
        )))
    }
}

impl Response {
    /// Checks the protocol rules a response must meet beyond being a valid
    /// archive, given the payload length that travels with it. Encoding and
    /// decoding both call this.
    pub fn validate(&self, payload_len: u32) -> Result<(), FrameError> {
        bounded_payload(payload_len)?;
        match &self.body {
            ResponseBody::Data { page_len, .. } => {
                bounded_page("Data page_len", *page_len)?;
                if payload_len > *page_len {
                    return Err(FrameError::Mismatch(format!(
                        "Data payload of {payload_len} bytes exceeds page_len {page_len}"
                    )));
                }
                Ok(())
            }
            ResponseBody::Pages { entries } => {
                if entries.len() > MAX_BATCH {
                    return Err(FrameError::Limit(format!(
                        "Pages carries {} entries, at most {MAX_BATCH} allowed",
                        entries.len()
                    )));
                }
                let mut total: u64 = 0;
                for entry in entries {
                    if let PageStatus::Data { len } = entry {
                        bounded_page("Pages entry len", *len)?;
                        total += u64::from(*len);
                    }
                }
                if total != u64::from(payload_len) {
                    return Err(FrameError::Mismatch(format!(
                        "Pages entries add up to {total} bytes but the payload is {payload_len}"
                    )));
                }
                Ok(())
            }
            ResponseBody::Error { message, .. } => {
                bounded_str("Error message", message, MAX_MESSAGE_LEN)?;
                no_payload("Error", payload_len)
            }
            ResponseBody::Miss => no_payload("Miss", payload_len),
            ResponseBody::NotOwner { .. } => no_payload("NotOwner", payload_len),
            ResponseBody::Written => no_payload("Written", payload_len),
            ResponseBody::Loaded { .. } => no_payload("Loaded", payload_len),
            ResponseBody::Removed { .. } => no_payload("Removed", payload_len),
            ResponseBody::Held { .. } => no_payload("Held", payload_len),
            ResponseBody::Pong { .. } => no_payload("Pong", payload_len),
            ResponseBody::Epoch { .. } => no_payload("Epoch", payload_len),
            ResponseBody::Stat { .. } => no_payload("Stat", payload_len),
            ResponseBody::PathInfo { kind } => {
                if let PathKind::File {
                    version_tag,
                    store_tag,
                    ..
                } = kind
                {
                    bounded_str("PathInfo version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                    bounded_str("PathInfo store_tag", store_tag, MAX_VERSION_TAG_LEN)?;
                }
                no_payload("PathInfo", payload_len)
            }
            ResponseBody::Listing { entries, .. } => {
                bounded_count("Listing", entries.len(), MAX_LIST_ENTRIES)?;
                for e in entries {
                    bounded_str("Listing name", &e.name, MAX_NAME_LEN)?;
                    bounded_str("Listing version_tag", &e.version_tag, MAX_VERSION_TAG_LEN)?;
                    if e.name.is_empty() || e.name.contains('/') || e.name.contains('\0') {
                        return Err(FrameError::Mismatch(format!(
                            "Listing name {:?} is empty or holds a slash or NUL",
                            e.name
                        )));
                    }
                }
                no_payload("Listing", payload_len)
            }
            ResponseBody::ClusterInfo {
                page_size,
                nodes,
                mounts,
                ..
            } => {
                bounded_page("ClusterInfo page_size", *page_size)?;
                bounded_count("ClusterInfo nodes", nodes.len(), MAX_NODES)?;
                for n in nodes {
                    bounded_str("NodeEntry addr", &n.addr, MAX_URL_LEN)?;
                }
                check_mount_table(mounts)?;
                no_payload("ClusterInfo", payload_len)
            }
            ResponseBody::Jobs => {
                if payload_len > MAX_JOB_RECORDS_PAYLOAD {
                    return Err(FrameError::Limit(format!(
                        "Jobs payload of {payload_len} bytes exceeds {MAX_JOB_RECORDS_PAYLOAD}"
                    )));
                }
                Ok(())
            }
            ResponseBody::Hot => {
                if payload_len > MAX_HOT_PAYLOAD {
                    return Err(FrameError::Limit(format!(
                        "Hot payload of {payload_len} bytes exceeds {MAX_HOT_PAYLOAD}"
                    )));
                }
                Ok(())
            }
            ResponseBody::Counters => {
                if payload_len != COUNTERS_PAYLOAD_LEN {
                    return Err(FrameError::Mismatch(format!(
                        "Counters payload is {payload_len} bytes, not {COUNTERS_PAYLOAD_LEN}"
                    )));
                }
                Ok(())
            }
            ResponseBody::Applied { .. } => no_payload("Applied", payload_len),
            ResponseBody::Records { .. } => bounded_records_payload("Records", payload_len),
            ResponseBody::Same => no_payload("Same", payload_len),
            ResponseBody::WriteBack { summary } => {
                bounded_str("WriteBack last_error", &summary.last_error, MAX_MESSAGE_LEN)?;
                no_payload("WriteBack", payload_len)
            }
            ResponseBody::FilesLoaded { outcomes } => {
                bounded_count("FilesLoaded outcomes", outcomes.len(), MAX_LOAD_FILES)?;
                for o in outcomes {
                    if let FileOutcome::Failed { message, .. } = o {
                        bounded_str("FileOutcome message", message, MAX_OUTCOME_MESSAGE_LEN)?;
                    }
                }
                no_payload("FilesLoaded", payload_len)
            }
            ResponseBody::Attributes { attrs } => {
                check_attrs("Attributes attrs", attrs)?;
                no_payload("Attributes", payload_len)
            }
        }
    }
}

impl ResponseBody {
    /// Whether this is an answer the protocol allows for `request`:
    /// `Error` answers anything; `NotOwner` answers every request that
    /// carries an epoch; otherwise each request has its own answer(s)
    /// (`ReadRange` also allows `Miss`). `Pong` must echo the nonce.
    pub fn answers(&self, request: &RequestBody) -> bool {
        match (request, self) {
            (_, ResponseBody::Error { .. }) => true,
            (RequestBody::Ping { nonce }, ResponseBody::Pong { nonce: echoed }) => nonce == echoed,
            (RequestBody::RingEpoch, ResponseBody::Epoch { .. }) => true,
            (RequestBody::Stat, ResponseBody::Stat { .. }) => true,
            (
                RequestBody::ReadRange { .. },
                ResponseBody::Data { .. } | ResponseBody::Miss | ResponseBody::NotOwner { .. },
            ) => true,
            (RequestBody::ReadPages { pages, .. }, ResponseBody::Pages { entries }) => {
                pages.len() == entries.len()
            }
            (RequestBody::WritePage { .. }, ResponseBody::Written) => true,
            (RequestBody::LoadPages { .. }, ResponseBody::Loaded { .. }) => true,
            (RequestBody::RemoveFile { .. }, ResponseBody::Removed { .. }) => true,
            (
                RequestBody::Fetch { .. },
                ResponseBody::Data { .. } | ResponseBody::NotOwner { .. },
            ) => true,
            (RequestBody::StatPath { .. }, ResponseBody::PathInfo { .. }) => true,
            (RequestBody::List { .. }, ResponseBody::Listing { .. }) => true,
            (RequestBody::Cluster, ResponseBody::ClusterInfo { .. }) => true,
            (RequestBody::Invalidate { .. }, ResponseBody::Removed { .. }) => true,
            (RequestBody::Jobs, ResponseBody::Jobs) => true,
            (RequestBody::Counters, ResponseBody::Counters) => true,
            (RequestBody::WriteDirty { .. }, ResponseBody::Written) => true,
            (RequestBody::Change { .. } | RequestBody::Replicate, ResponseBody::Applied { .. }) => {
                true
            }
            (
                RequestBody::PullRecords { .. }
                | RequestBody::RecordsOf { .. }
                | RequestBody::RecordsIn { .. },
                ResponseBody::Records { .. },
            ) => true,
            (RequestBody::RecordsIn { .. }, ResponseBody::Same) => true,
            (
                RequestBody::FilePages { .. } | RequestBody::Discard { .. },
                ResponseBody::Removed { .. },
            ) => true,
            (RequestBody::WriteBackState { .. }, ResponseBody::WriteBack { .. }) => true,
            (RequestBody::Hot, ResponseBody::Hot) => true,
            (RequestBody::LoadFiles { files, .. }, ResponseBody::FilesLoaded { outcomes }) => {
                files.len() == outcomes.len()
            }
            (RequestBody::Attributes { .. }, ResponseBody::Attributes { .. }) => true,
            (RequestBody::Renew { .. }, ResponseBody::Held { .. }) => true,
            (
                RequestBody::ReadPages { .. }
                | RequestBody::LoadFiles { .. }
                | RequestBody::WritePage { .. }
                | RequestBody::WriteDirty { .. }
                | RequestBody::LoadPages { .. }
                | RequestBody::RemoveFile { .. },
                ResponseBody::NotOwner { .. },
            ) => true,
            _ => false,
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

type HeaderSerializer<'a> =
    HighSerializer<AlignedVec<HEADER_ALIGN>, ArenaHandle<'a>, rancor::Error>;

/// Serializes `value` into a header whose length is a multiple of
/// [`HEADER_ALIGN`], padding at the front (see the module docs).
fn encode_header<T>(value: &T) -> Result<AlignedVec<HEADER_ALIGN>, FrameError>
where
    T: for<'a> Serialize<HeaderSerializer<'a>>,
{
    // Every archived type in this module has an alignment of at most 8, so
    // shifting the whole archive by 8 bytes keeps it valid: one of the two
    // front paddings yields a multiple of 16.
    for pad in [0usize, 8] {
        let mut buf = AlignedVec::<HEADER_ALIGN>::with_capacity(256);
        buf.resize(pad, 0);
        let buf = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, buf)
            .map_err(|e| FrameError::Invalid(e.to_string()))?;
        if buf.len() % HEADER_ALIGN == 0 {
            if buf.len() > MAX_HEADER as usize {
                return Err(FrameError::HeaderTooLarge {
                    len: buf.len() as u64,
                });
            }
            return Ok(buf);
        }
    }
    Err(FrameError::Invalid(
        "archive cannot be padded to a multiple of 16 bytes".to_string(),
    ))
}

fn encode_frame<T>(
    kind: FrameKind,
    value: &T,
    payload_len: u32,
    out: &mut Vec<u8>,
) -> Result<(), FrameError>
where
    T: for<'a> Serialize<HeaderSerializer<'a>>,
{
    let header = encode_header(value)?;
    let header_len = u32::try_from(header.len()).map_err(|_| FrameError::HeaderTooLarge {
        len: header.len() as u64,
    })?;
    let preamble = Preamble {
        version: PROTOCOL_VERSION,
        kind,
        header_len,
        payload_len,
    };
    preamble.check()?;
    out.reserve(PREAMBLE_LEN + header.len());
    out.extend_from_slice(&preamble.encode());
    out.extend_from_slice(&header);
    Ok(())
}

/// Appends the preamble and padded header of `req` to `out`. The caller
/// sends `payload_len` payload bytes after them (only `WritePage` has a
/// payload; its `len` must equal `payload_len`). On error `out` is left
/// unchanged.
pub fn encode_request(
    req: &Request,
    payload_len: u32,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    req.validate(payload_len)?;
    encode_frame(FrameKind::Request, req, payload_len, out)
}

/// Appends the preamble and padded header of `resp` to `out`. The caller
/// sends `payload_len` payload bytes after them. On error `out` is left
/// unchanged.
pub fn encode_response(
    resp: &Response,
    payload_len: u32,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    resp.validate(payload_len)?;
    encode_frame(FrameKind::Response, resp, payload_len, out)
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// Validates `header` (or a payload) as an archive of `T` (copying it to an
/// aligned buffer first if needed) and deserializes it.
fn decode_header<T>(header: &[u8]) -> Result<T, FrameError>
where
    T: Archive,
    T::Archived: Portable
        + for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    fn access_and_deserialize<T>(bytes: &[u8]) -> Result<T, FrameError>
    where
        T: Archive,
        T::Archived: Portable
            + for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<T, HighDeserializer<rancor::Error>>,
    {
        let archived = rkyv::access::<T::Archived, rancor::Error>(bytes)
            .map_err(|e| FrameError::Invalid(e.to_string()))?;
        rkyv::deserialize::<T, rancor::Error>(archived)
            .map_err(|e| FrameError::Invalid(e.to_string()))
    }

    if header.as_ptr().addr() % HEADER_ALIGN == 0 {
        access_and_deserialize(header)
    } else {
        let mut aligned = AlignedVec::<HEADER_ALIGN>::with_capacity(header.len());
        aligned.extend_from_slice(header);
        access_and_deserialize(&aligned)
    }
}

/// Checks that `preamble` announces `kind` and that `header` is exactly the
/// announced header.
fn check_header_input(
    preamble: &Preamble,
    kind: FrameKind,
    header: &[u8],
) -> Result<(), FrameError> {
    if preamble.kind != kind {
        return Err(FrameError::Kind {
            got: preamble.kind as u16,
        });
    }
    preamble.check()?;
    let want = preamble.header_len as usize;
    if header.len() < want {
        return Err(FrameError::Truncated {
            needed: want,
            got: header.len(),
        });
    }
    if header.len() > want {
        return Err(FrameError::Mismatch(format!(
            "header slice of {} bytes but the preamble announces {want}",
            header.len()
        )));
    }
    Ok(())
}

/// Decodes a request header: `header` must be exactly the
/// `preamble.header_len` bytes that followed the preamble (any alignment).
/// Checks the frame kind, validates the archive and then the request's
/// semantic rules against `preamble.payload_len`.
pub fn decode_request(preamble: &Preamble, header: &[u8]) -> Result<Request, FrameError> {
    check_header_input(preamble, FrameKind::Request, header)?;
    let req: Request = decode_header(header)?;
    req.validate(preamble.payload_len)?;
    Ok(req)
}

/// Decodes a response header; see [`decode_request`].
pub fn decode_response(preamble: &Preamble, header: &[u8]) -> Result<Response, FrameError> {
    check_header_input(preamble, FrameKind::Response, header)?;
    let resp: Response = decode_header(header)?;
    resp.validate(preamble.payload_len)?;
    Ok(resp)
}

/// Splits a buffer that must hold exactly one whole frame.
fn split_frame(buf: &[u8]) -> Result<(Preamble, &[u8], Range<usize>), FrameError> {
    let preamble = Preamble::decode_prefix(buf)?;
    let frame_len = preamble.frame_len();
    if buf.len() < frame_len {
        return Err(FrameError::Truncated {
            needed: frame_len,
            got: buf.len(),
        });
    }
    if buf.len() > frame_len {
        return Err(FrameError::Mismatch(format!(
            "{} bytes follow the end of the frame",
            buf.len() - frame_len
        )));
    }
    let header = buf
        .get(preamble.header_range())
        .ok_or(FrameError::Truncated {
            needed: frame_len,
            got: buf.len(),
        })?;
    Ok((preamble, header, preamble.payload_range()))
}

/// Decodes a buffer holding exactly one whole request frame (preamble,
/// header, payload). Returns the request and the payload's byte range
/// within `buf`.
pub fn decode_request_frame(buf: &[u8]) -> Result<(Request, Range<usize>), FrameError> {
    let (preamble, header, payload) = split_frame(buf)?;
    Ok((decode_request(&preamble, header)?, payload))
}

/// Decodes a request whose payload was received apart from its head (into
/// a buffer of its own, as a shard receives a page to write into memory
/// aligned for the disk): `head` holds exactly the preamble and the header,
/// and `payload_len` payload bytes arrived after them. Fails as
/// [`decode_request_frame`] would on the same bytes laid end to end.
pub fn decode_request_head(head: &[u8], payload_len: usize) -> Result<Request, FrameError> {
    let preamble = Preamble::decode_prefix(head)?;
    let head_len = preamble.payload_range().start;
    let got = head.len() + payload_len;
    if head.len() != head_len || got < preamble.frame_len() {
        return Err(FrameError::Truncated {
            needed: preamble.frame_len(),
            got,
        });
    }
    if got > preamble.frame_len() {
        return Err(FrameError::Mismatch(format!(
            "{} bytes follow the end of the frame",
            got - preamble.frame_len()
        )));
    }
    decode_request(&preamble, &head[preamble.header_range()])
}

/// Decodes a buffer holding exactly one whole response frame; see
/// [`decode_request_frame`].
pub fn decode_response_frame(buf: &[u8]) -> Result<(Response, Range<usize>), FrameError> {
    let (preamble, header, payload) = split_frame(buf)?;
    Ok((decode_response(&preamble, header)?, payload))
}

// ---------------------------------------------------------------------------
// Payloads of `Counters`, `Jobs` and `Hot`
// ---------------------------------------------------------------------------

type PayloadSerializer<'a> = HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>;

/// An rkyv archive of `value`, root last, not padded.
fn encode_archive<T>(value: &T) -> Result<Vec<u8>, FrameError>
where
    T: for<'a> Serialize<PayloadSerializer<'a>>,
{
    rkyv::to_bytes::<rancor::Error>(value)
        .map(|bytes| bytes.to_vec())
        .map_err(|e| FrameError::Invalid(e.to_string()))
}

/// The payload of a [`ResponseBody::Counters`] answer: `counters` archived,
/// exactly [`COUNTERS_PAYLOAD_LEN`] bytes.
pub fn encode_counters(counters: &ShardCounters) -> Result<Vec<u8>, FrameError> {
    let bytes = encode_archive(counters)?;
    check_counters_len(bytes.len())?;
    Ok(bytes)
}

fn check_counters_len(len: usize) -> Result<(), FrameError> {
    if len == COUNTERS_PAYLOAD_LEN as usize {
        Ok(())
    } else {
        Err(FrameError::Mismatch(format!(
            "a Counters payload is {COUNTERS_PAYLOAD_LEN} bytes, not {len}"
        )))
    }
}

/// Reads the payload of a [`ResponseBody::Counters`] answer (any
/// alignment). A payload of another length, or one that fails validation, is
/// an error; nothing panics.
pub fn decode_counters(payload: &[u8]) -> Result<ShardCounters, FrameError> {
    check_counters_len(payload.len())?;
    decode_header(payload)
}

/// The payload of a [`RequestBody::Jobs`] request that reports `record`:
/// the record archived, after [`JobRecord::validate`]. At most
/// [`MAX_JOB_RECORD`] bytes.
pub fn encode_job_record(record: &JobRecord) -> Result<Vec<u8>, FrameError> {
    record.validate()?;
    let bytes = encode_archive(record)?;
    if bytes.len() > MAX_JOB_RECORD as usize {
        return Err(FrameError::Limit(format!(
            "a job record of {} bytes exceeds {MAX_JOB_RECORD}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Reads the payload of a [`RequestBody::Jobs`] request that reports a
/// record (any alignment): an archived [`JobRecord`] that meets
/// [`JobRecord::validate`].
pub fn decode_job_record(payload: &[u8]) -> Result<JobRecord, FrameError> {
    if payload.len() > MAX_JOB_RECORD as usize {
        return Err(FrameError::Limit(format!(
            "a job record of {} bytes exceeds {MAX_JOB_RECORD}",
            payload.len()
        )));
    }
    let record: JobRecord = decode_header(payload)?;
    record.validate()?;
    Ok(record)
}

/// The payload of a [`ResponseBody::Jobs`] answer: `records` (at most
/// [`MAX_JOB_RECORDS`], each valid) archived as one vector.
pub fn encode_job_records(records: &[JobRecord]) -> Result<Vec<u8>, FrameError> {
    check_job_records(records)?;
    let bytes = encode_archive(&records.to_vec())?;
    if bytes.len() > MAX_JOB_RECORDS_PAYLOAD as usize {
        return Err(FrameError::Limit(format!(
            "a Jobs payload of {} bytes exceeds {MAX_JOB_RECORDS_PAYLOAD}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Reads the payload of a [`ResponseBody::Jobs`] answer (any alignment).
pub fn decode_job_records(payload: &[u8]) -> Result<Vec<JobRecord>, FrameError> {
    if payload.len() > MAX_JOB_RECORDS_PAYLOAD as usize {
        return Err(FrameError::Limit(format!(
            "a Jobs payload of {} bytes exceeds {MAX_JOB_RECORDS_PAYLOAD}",
            payload.len()
        )));
    }
    let records: Vec<JobRecord> = decode_header(payload)?;
    check_job_records(&records)?;
    Ok(records)
}

/// The payload of a [`ResponseBody::Hot`] answer: `report` archived, after
/// [`HotReport::validate`]; at most [`MAX_HOT_PAYLOAD`] bytes.
pub fn encode_hot_report(report: &HotReport) -> Result<Vec<u8>, FrameError> {
    report.validate()?;
    let bytes = encode_archive(report)?;
    if bytes.len() > MAX_HOT_PAYLOAD as usize {
        return Err(FrameError::Limit(format!(
            "a Hot payload of {} bytes exceeds {MAX_HOT_PAYLOAD}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Reads the payload of a [`ResponseBody::Hot`] answer (any alignment): an
/// archived [`HotReport`] that meets [`HotReport::validate`].
pub fn decode_hot_report(payload: &[u8]) -> Result<HotReport, FrameError> {
    if payload.len() > MAX_HOT_PAYLOAD as usize {
        return Err(FrameError::Limit(format!(
            "a Hot payload of {} bytes exceeds {MAX_HOT_PAYLOAD}",
            payload.len()
        )));
    }
    let report: HotReport = decode_header(payload)?;
    report.validate()?;
    Ok(report)
}

fn check_job_records(records: &[JobRecord]) -> Result<(), FrameError> {
    bounded_count("Jobs records", records.len(), MAX_JOB_RECORDS)?;
    records.iter().try_for_each(JobRecord::validate)
}

/// The payload of a `Replicate` request or a `Records` answer: `records`
/// (at most [`MAX_RECORD_BATCH`], each valid) archived as one vector, at
/// most [`MAX_RECORDS_PAYLOAD`] bytes.
pub fn encode_file_records(records: &[FileRecord]) -> Result<Vec<u8>, FrameError> {
    check_file_records(records)?;
    let bytes = encode_archive(&records.to_vec())?;
    if bytes.len() > MAX_RECORDS_PAYLOAD as usize {
        return Err(FrameError::Limit(format!(
            "a records payload of {} bytes exceeds {MAX_RECORDS_PAYLOAD}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Reads the payload of a `Replicate` request or a `Records` answer (any
/// alignment): an archived vector of valid [`FileRecord`]s.
pub fn decode_file_records(payload: &[u8]) -> Result<Vec<FileRecord>, FrameError> {
    if payload.len() > MAX_RECORDS_PAYLOAD as usize {
        return Err(FrameError::Limit(format!(
            "a records payload of {} bytes exceeds {MAX_RECORDS_PAYLOAD}",
            payload.len()
        )));
    }
    if payload.is_empty() {
        return Ok(Vec::new());
    }
    let records: Vec<FileRecord> = decode_header(payload)?;
    check_file_records(&records)?;
    Ok(records)
}

fn check_file_records(records: &[FileRecord]) -> Result<(), FrameError> {
    bounded_count("records", records.len(), MAX_RECORD_BATCH)?;
    records.iter().try_for_each(FileRecord::validate)
}

/// One record archived on its own (the write-back journal's entry; see
/// docs/FORMAT.md).
pub fn encode_file_record(record: &FileRecord) -> Result<Vec<u8>, FrameError> {
    record.validate()?;
    encode_archive(record)
}

/// Reads one record archived by [`encode_file_record`] (any alignment).
pub fn decode_file_record(bytes: &[u8]) -> Result<FileRecord, FrameError> {
    let record: FileRecord = decode_header(bytes)?;
    record.validate()?;
    Ok(record)
}

const _: () = {
    // The front-padding scheme relies on these alignments (see
    // `encode_header`).
    assert!(std::mem::align_of::<ArchivedRequest>() <= 8);
    assert!(std::mem::align_of::<ArchivedResponse>() <= 8);
    // A Counters payload is exactly one archived record (no out-of-line
    // data).
    assert!(std::mem::size_of::<ArchivedShardCounters>() == COUNTERS_PAYLOAD_LEN as usize);
};

mod legacy;
pub use legacy::{decode_file_records_v1, encode_file_records_v1};

#[cfg(test)]
mod tests;
