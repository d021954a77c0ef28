//! Wire frames of the pagestore client/shard protocol.
//!
//! Every request and every response travels as one *frame* on its own
//! bidirectional QUIC stream. A frame is three consecutive parts:
//!
//! ```text
//! +------------------+-------------------------------+----------------------+
//! | preamble (16 B)  | header (header_len B)          | payload (payload_len)|
//! | plain LE fields  | rkyv archive, front-padded to  | raw bytes, never     |
//! |                  | a multiple of 16 bytes         | rkyv-encoded         |
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
//!   straight from the buffer its disk read landed in.
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
pub const PROTOCOL_VERSION: u16 = 1;

/// ALPN protocol identifier negotiated during the QUIC/TLS handshake.
pub const ALPN: &[u8] = b"pagestore/1";

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

/// Longest name of a directory entry, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// Most nodes one [`ResponseBody::ClusterInfo`] may carry.
pub const MAX_NODES: usize = 1024;

/// Most mounts one [`ResponseBody::ClusterInfo`] may carry.
pub const MAX_MOUNTS: usize = 64;

/// Longest node address or mount URL, in bytes.
pub const MAX_URL_LEN: usize = 1024;

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
        /// Sent to a replica rather than the owner: the shard serves it if it
        /// is one of the key's replicas under its ring.
        replica: bool,
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
    /// (only ask) or one job's progress record, a JSON object with a string
    /// `id`, at most [`MAX_JOB_RECORD`] bytes, which the node keeps.
    Jobs,
    /// The shard's monotonic counters as a JSON object
    /// ([`ResponseBody::Counters`]): what `Stat` reports and more (bytes
    /// served from the cache and from the under storage, requests), so that
    /// tools can compute rates. Fields may be added; readers ignore unknown
    /// ones.
    Counters,
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
    },
    /// A directory (a common prefix, a mount point or one of its parents).
    Dir,
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
    },
    /// Answer to `Jobs`: the payload is a JSON array of the job records the
    /// node keeps, most recently updated first.
    Jobs,
    /// Answer to `Counters`: the payload is a JSON object of counters.
    Counters,
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
            RequestBody::Jobs => {
                if payload_len > MAX_JOB_RECORD {
                    return Err(FrameError::Limit(format!(
                        "a job record of {payload_len} bytes exceeds {MAX_JOB_RECORD}"
                    )));
                }
                Ok(())
            }
        }
    }
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
            ResponseBody::Pong { .. } => no_payload("Pong", payload_len),
            ResponseBody::Epoch { .. } => no_payload("Epoch", payload_len),
            ResponseBody::Stat { .. } => no_payload("Stat", payload_len),
            ResponseBody::PathInfo { kind } => {
                if let PathKind::File { version_tag, .. } = kind {
                    bounded_str("PathInfo version_tag", version_tag, MAX_VERSION_TAG_LEN)?;
                }
                no_payload("PathInfo", payload_len)
            }
            ResponseBody::Listing { entries, .. } => {
                bounded_count("Listing", entries.len(), MAX_LIST_ENTRIES)?;
                for e in entries {
                    bounded_str("Listing name", &e.name, MAX_NAME_LEN)?;
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
                bounded_count("ClusterInfo mounts", mounts.len(), MAX_MOUNTS)?;
                for n in nodes {
                    bounded_str("NodeEntry addr", &n.addr, MAX_URL_LEN)?;
                }
                for m in mounts {
                    bounded_str("MountEntry prefix", &m.prefix, MAX_PATH_LEN)?;
                    bounded_str("MountEntry url", &m.url, MAX_URL_LEN)?;
                }
                no_payload("ClusterInfo", payload_len)
            }
            ResponseBody::Jobs | ResponseBody::Counters => Ok(()),
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
            (
                RequestBody::ReadPages { .. }
                | RequestBody::WritePage { .. }
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

/// Validates `header` as an archive of `T` (copying it to an aligned buffer
/// first if needed) and deserializes it.
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

/// Decodes a buffer holding exactly one whole response frame; see
/// [`decode_request_frame`].
pub fn decode_response_frame(buf: &[u8]) -> Result<(Response, Range<usize>), FrameError> {
    let (preamble, header, payload) = split_frame(buf)?;
    Ok((decode_response(&preamble, header)?, payload))
}

const _: () = {
    // The front-padding scheme relies on these alignments (see
    // `encode_header`).
    assert!(std::mem::align_of::<ArchivedRequest>() <= 8);
    assert!(std::mem::align_of::<ArchivedResponse>() <= 8);
};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // -- helpers ------------------------------------------------------------

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(text: &str) -> Vec<u8> {
        let clean: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        clean
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    const FILE_A: FileId = FileId {
        hi: 0x1112_1314_1516_1718,
        lo: 0x2122_2324_2526_2728,
    };

    fn key(page: u64) -> Key {
        Key {
            file_id: FILE_A,
            page,
        }
    }

    fn file_ref() -> FileRef {
        FileRef {
            file_id: FILE_A,
            mount: "s3-train".to_string(),
            path: "datasets/imagenet/train/shard-00042.tar".to_string(),
            version_tag: "\"etag-9f8e\"".to_string(),
            size: 1 << 30,
        }
    }

    /// Payload length that makes `req` valid.
    fn request_payload_len(req: &Request) -> u32 {
        match req.body {
            RequestBody::WritePage { len, .. } => len,
            _ => 0,
        }
    }

    /// Payload length that makes `resp` valid.
    fn response_payload_len(resp: &Response) -> u32 {
        match &resp.body {
            ResponseBody::Data { page_len, .. } => (*page_len).min(100),
            ResponseBody::Pages { entries } => entries
                .iter()
                .map(|e| match e {
                    PageStatus::Data { len } => *len,
                    _ => 0,
                })
                .sum(),
            _ => 0,
        }
    }

    /// One request of every variant (plus a few edge cases).
    fn sample_requests() -> Vec<Request> {
        let bodies = vec![
            RequestBody::Ping { nonce: 42 },
            RequestBody::RingEpoch,
            RequestBody::Stat,
            RequestBody::ReadRange {
                key: key(7),
                offset: 4096,
                len: 65536,
                epoch: 9,
            },
            RequestBody::ReadRange {
                key: key(0),
                offset: 0,
                len: MAX_PAGE_LEN,
                epoch: 0,
            },
            RequestBody::ReadPages {
                pages: (0..5).map(key).collect(),
                epoch: 3,
            },
            RequestBody::ReadPages {
                pages: vec![],
                epoch: 3,
            },
            RequestBody::ReadPages {
                pages: (0..MAX_BATCH as u64).map(key).collect(),
                epoch: u64::MAX,
            },
            RequestBody::WritePage {
                key: key(1),
                version: 17,
                len: 33,
                epoch: 4,
            },
            RequestBody::WritePage {
                key: key(1),
                version: 17,
                len: 0,
                epoch: 4,
            },
            RequestBody::LoadPages {
                file: file_ref(),
                pages: vec![0, 1, 2, 1000],
                epoch: 5,
            },
            RequestBody::LoadPages {
                file: FileRef::default(),
                pages: vec![],
                epoch: 5,
            },
            RequestBody::RemoveFile {
                file_id: FileId::from_u128(u128::MAX),
                epoch: 6,
            },
            RequestBody::Fetch {
                file: file_ref(),
                page: 3,
                offset: 4096,
                len: 8192,
                epoch: 7,
                replica: true,
            },
            RequestBody::StatPath {
                path: "/data/a/b.bin".into(),
            },
            RequestBody::List {
                path: "/data".into(),
                start_after: "b.bin".into(),
            },
            RequestBody::Cluster,
            RequestBody::Invalidate {
                path: "/data/a/b.bin".into(),
                file_id: FileId::from_u128(99),
            },
            RequestBody::Jobs,
            RequestBody::Counters,
        ];
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Request {
                request_id: i as u64 * 0x0101_0101,
                body,
            })
            .collect()
    }

    /// One response of every variant (plus a few edge cases).
    fn sample_responses() -> Vec<Response> {
        let bodies = vec![
            ResponseBody::Data {
                page_len: 4 << 20,
                version: 3,
            },
            ResponseBody::Data {
                page_len: 0,
                version: 0,
            },
            ResponseBody::Pages {
                entries: vec![
                    PageStatus::Data { len: 10 },
                    PageStatus::Miss,
                    PageStatus::NotOwner,
                    PageStatus::Data { len: 5 },
                ],
            },
            ResponseBody::Pages { entries: vec![] },
            ResponseBody::Miss,
            ResponseBody::NotOwner { epoch: 12 },
            ResponseBody::Written,
            ResponseBody::Loaded {
                pages: 4,
                bytes: 16 << 20,
            },
            ResponseBody::Removed { pages: 99 },
            ResponseBody::Pong { nonce: 42 },
            ResponseBody::Epoch { epoch: 77 },
            ResponseBody::Stat {
                shard: 3,
                pages: 1000,
                bytes: 4 << 30,
                capacity_bytes: 8 << 30,
                hits: 123_456,
                misses: 789,
            },
            ResponseBody::Error {
                code: ErrorCode::BadRange,
                message: "offset beyond the page".to_string(),
            },
            ResponseBody::Error {
                code: ErrorCode::Internal,
                message: String::new(),
            },
            ResponseBody::PathInfo {
                kind: PathKind::File {
                    size: 5 << 20,
                    version_tag: "9b2cf535f27731c974343645a3985328".into(),
                    file_id: FileId::from_u128(0x1234_5678_9abc_def0_0fed_cba9_8765_4321),
                },
            },
            ResponseBody::PathInfo {
                kind: PathKind::Dir,
            },
            ResponseBody::Listing {
                entries: vec![
                    DirEntry {
                        name: "a".into(),
                        is_dir: true,
                        size: 0,
                    },
                    DirEntry {
                        name: "b.bin".into(),
                        is_dir: false,
                        size: 12345,
                    },
                ],
                more: true,
            },
            ResponseBody::ClusterInfo {
                page_size: 4 << 20,
                epoch: 1,
                replicas: 1,
                nodes: vec![NodeEntry {
                    id: FileId::from_u128(7),
                    addr: "127.0.0.1:7400".into(),
                    shards: 2,
                }],
                mounts: vec![MountEntry {
                    prefix: "/data".into(),
                    url: "file:///srv/data".into(),
                }],
            },
            ResponseBody::Jobs,
            ResponseBody::Counters,
        ];
        let mut out: Vec<Response> = bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Response {
                request_id: i as u64 + 1000,
                body,
            })
            .collect();
        for code in [
            ErrorCode::BadRequest,
            ErrorCode::BadRange,
            ErrorCode::TooLarge,
            ErrorCode::NotFound,
            ErrorCode::Io,
            ErrorCode::Full,
            ErrorCode::Unavailable,
            ErrorCode::Forbidden,
            ErrorCode::Internal,
            ErrorCode::Changed,
        ] {
            out.push(Response {
                request_id: 1,
                body: ResponseBody::Error {
                    code,
                    message: format!("{code:?} happened"),
                },
            });
        }
        out
    }

    /// A whole frame: preamble, header and a payload of `payload_len`
    /// recognisable bytes.
    fn request_frame(req: &Request) -> Vec<u8> {
        let payload_len = request_payload_len(req);
        let mut buf = Vec::new();
        encode_request(req, payload_len, &mut buf).unwrap();
        buf.extend((0..payload_len).map(|i| i as u8));
        buf
    }

    fn response_frame(resp: &Response) -> Vec<u8> {
        let payload_len = response_payload_len(resp);
        let mut buf = Vec::new();
        encode_response(resp, payload_len, &mut buf).unwrap();
        buf.extend((0..payload_len).map(|i| (i as u8) ^ 0x5a));
        buf
    }

    /// Builds a frame without the semantic checks of `encode_*`, to test
    /// that decoders enforce them.
    fn raw_request_frame(req: &Request, payload_len: u32) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_frame(FrameKind::Request, req, payload_len, &mut buf).unwrap();
        buf.resize(buf.len() + payload_len as usize, 0);
        buf
    }

    fn raw_response_frame(resp: &Response, payload_len: u32) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_frame(FrameKind::Response, resp, payload_len, &mut buf).unwrap();
        buf.resize(buf.len() + payload_len as usize, 0);
        buf
    }

    fn preamble_bytes(version: u16, kind: u16, header_len: u32, payload_len: u32) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&version.to_le_bytes());
        out[6..8].copy_from_slice(&kind.to_le_bytes());
        out[8..12].copy_from_slice(&header_len.to_le_bytes());
        out[12..16].copy_from_slice(&payload_len.to_le_bytes());
        out
    }

    // -- round trips --------------------------------------------------------

    #[test]
    fn every_request_round_trips() {
        for req in sample_requests() {
            let frame = request_frame(&req);
            let preamble = Preamble::decode_prefix(&frame).unwrap();
            assert_eq!(preamble.kind, FrameKind::Request);
            assert_eq!(preamble.header_len as usize % HEADER_ALIGN, 0);
            assert_eq!(preamble.frame_len(), frame.len());
            let (decoded, payload) = decode_request_frame(&frame).unwrap();
            assert_eq!(decoded, req);
            assert_eq!(payload.len() as u32, request_payload_len(&req));
            assert_eq!(payload.end, frame.len());
            // Two-step decoding, as a stream reader does it.
            let two_step = decode_request(&preamble, &frame[preamble.header_range()]).unwrap();
            assert_eq!(two_step, req);
        }
    }

    #[test]
    fn every_response_round_trips() {
        for resp in sample_responses() {
            let frame = response_frame(&resp);
            let preamble = Preamble::decode_prefix(&frame).unwrap();
            assert_eq!(preamble.kind, FrameKind::Response);
            assert_eq!(preamble.header_len as usize % HEADER_ALIGN, 0);
            let (decoded, payload) = decode_response_frame(&frame).unwrap();
            assert_eq!(decoded, resp);
            assert_eq!(payload.len() as u32, response_payload_len(&resp));
            let two_step = decode_response(&preamble, &frame[preamble.header_range()]).unwrap();
            assert_eq!(two_step, resp);
        }
    }

    #[test]
    fn misaligned_input_is_copied_and_decodes() {
        let frames: Vec<Vec<u8>> = sample_requests().iter().map(request_frame).collect();
        for frame in &frames {
            for shift in 1..HEADER_ALIGN {
                let mut storage = AlignedVec::<16>::new();
                storage.resize(shift, 0xee);
                storage.extend_from_slice(frame);
                let slice = &storage[shift..];
                assert_ne!(slice.as_ptr().addr() % HEADER_ALIGN, 0);
                let (req, _) = decode_request_frame(slice).unwrap();
                assert_eq!(request_frame(&req), *frame);
            }
        }
    }

    #[test]
    fn both_front_paddings_occur_and_decode() {
        // The samples must exercise the 8-byte front padding as well as none.
        let mut saw_pad = [false; 2];
        for resp in sample_responses() {
            let frame = response_frame(&resp);
            let preamble = Preamble::decode_prefix(&frame).unwrap();
            let root = std::mem::size_of::<ArchivedResponse>();
            let header = &frame[preamble.header_range()];
            // With no out-of-line data the archive is exactly the root, so
            // the padding is header_len - root.
            if matches!(resp.body, ResponseBody::Pong { .. } | ResponseBody::Miss) {
                let pad = header.len() - root;
                assert!(pad == 0 || pad == 8, "pad {pad}");
                assert!(header[..pad].iter().all(|b| *b == 0));
                saw_pad[usize::from(pad == 8)] = true;
            }
        }
        for req in sample_requests() {
            let frame = request_frame(&req);
            let preamble = Preamble::decode_prefix(&frame).unwrap();
            if matches!(req.body, RequestBody::Ping { .. }) {
                assert_eq!(
                    preamble.header_len as usize,
                    std::mem::size_of::<ArchivedRequest>()
                );
                saw_pad[0] = true;
            }
        }
        assert_eq!(saw_pad, [true, true]);
    }

    #[test]
    fn encode_appends_and_leaves_out_unchanged_on_error() {
        let mut out = b"xyz".to_vec();
        let req = Request {
            request_id: 1,
            body: RequestBody::Ping { nonce: 1 },
        };
        encode_request(&req, 0, &mut out).unwrap();
        assert_eq!(&out[..3], b"xyz");
        assert_eq!(&out[3..7], &MAGIC);
        let before = out.clone();
        assert!(encode_request(&req, 5, &mut out).is_err());
        assert_eq!(out, before);
    }

    #[test]
    fn largest_valid_headers_fit() {
        let req = Request {
            request_id: u64::MAX,
            body: RequestBody::LoadPages {
                file: FileRef {
                    file_id: FILE_A,
                    mount: "m".repeat(MAX_MOUNT_LEN),
                    path: "p".repeat(MAX_PATH_LEN),
                    version_tag: "v".repeat(MAX_VERSION_TAG_LEN),
                    size: u64::MAX,
                },
                pages: (0..MAX_LOAD_PAGES as u64).collect(),
                epoch: u64::MAX,
            },
        };
        let frame = request_frame(&req);
        assert!(frame.len() - PREAMBLE_LEN <= MAX_HEADER as usize);
        assert_eq!(decode_request_frame(&frame).unwrap().0, req);

        let resp = Response {
            request_id: 1,
            body: ResponseBody::Error {
                code: ErrorCode::Io,
                message: "é".repeat(MAX_MESSAGE_LEN / 2),
            },
        };
        assert_eq!(
            decode_response_frame(&response_frame(&resp)).unwrap().0,
            resp
        );
    }

    // -- truncation ---------------------------------------------------------

    #[test]
    fn every_truncation_is_an_error() {
        let mut frames: Vec<(bool, Vec<u8>)> = Vec::new();
        frames.extend(sample_requests().iter().map(|r| (true, request_frame(r))));
        frames.extend(
            sample_responses()
                .iter()
                .map(|r| (false, response_frame(r))),
        );
        for (is_request, frame) in &frames {
            for cut in 0..frame.len() {
                let prefix = &frame[..cut];
                let err = if *is_request {
                    decode_request_frame(prefix).map(|_| ()).unwrap_err()
                } else {
                    decode_response_frame(prefix).map(|_| ()).unwrap_err()
                };
                assert!(
                    matches!(err, FrameError::Truncated { .. }),
                    "cut {cut}: {err}"
                );
            }
            // Two-step decoding with a short header.
            let preamble = Preamble::decode_prefix(frame).unwrap();
            let header = &frame[preamble.header_range()];
            for cut in 0..header.len() {
                let res = if *is_request {
                    decode_request(&preamble, &header[..cut]).map(|_| ())
                } else {
                    decode_response(&preamble, &header[..cut]).map(|_| ())
                };
                assert!(matches!(res, Err(FrameError::Truncated { .. })));
            }
            // A short header that claims to be whole (preamble rewritten):
            // the archive validator must refuse it (or, rarely, the
            // remaining bytes are still a valid archive) without panicking.
            for cut in (HEADER_ALIGN..header.len()).step_by(HEADER_ALIGN) {
                let p = Preamble {
                    header_len: cut as u32,
                    ..preamble
                };
                let tail = &header[header.len() - cut..];
                let head = &header[..cut];
                if *is_request {
                    let _ = decode_request(&p, tail);
                    let _ = decode_request(&p, head);
                } else {
                    let _ = decode_response(&p, tail);
                    let _ = decode_response(&p, head);
                }
            }
        }
    }

    #[test]
    fn trailing_bytes_are_a_mismatch() {
        let mut frame = request_frame(&sample_requests()[0]);
        frame.push(0);
        assert!(matches!(
            decode_request_frame(&frame),
            Err(FrameError::Mismatch(_))
        ));
        let preamble = Preamble::decode_prefix(&frame).unwrap();
        let long_header = &frame[PREAMBLE_LEN..PREAMBLE_LEN + preamble.header_len as usize + 1];
        assert!(matches!(
            decode_request(&preamble, long_header),
            Err(FrameError::Mismatch(_))
        ));
    }

    // -- preamble -----------------------------------------------------------

    #[test]
    fn preamble_round_trips() {
        let p = Preamble {
            version: PROTOCOL_VERSION,
            kind: FrameKind::Response,
            header_len: 4096,
            payload_len: MAX_PAYLOAD,
        };
        assert_eq!(Preamble::decode(&p.encode()).unwrap(), p);
        assert_eq!(p.encode(), preamble_bytes(1, 2, 4096, MAX_PAYLOAD));
        assert_eq!(p.header_range(), 16..4112);
        assert_eq!(p.payload_range(), 4112..4112 + MAX_PAYLOAD as usize);
    }

    #[test]
    fn preamble_rejections() {
        let mut bad_magic = preamble_bytes(1, 1, 16, 0);
        bad_magic[0] = b'X';
        assert_eq!(
            Preamble::decode(&bad_magic),
            Err(FrameError::Magic { got: *b"XSTF" })
        );
        assert_eq!(
            Preamble::decode(&preamble_bytes(2, 1, 16, 0)),
            Err(FrameError::Version { got: 2 })
        );
        assert_eq!(
            Preamble::decode(&preamble_bytes(0, 1, 16, 0)),
            Err(FrameError::Version { got: 0 })
        );
        for kind in [0u16, 3, 0xffff] {
            assert_eq!(
                Preamble::decode(&preamble_bytes(1, kind, 16, 0)),
                Err(FrameError::Kind { got: kind })
            );
        }
        for len in [0u32, 1, 8, 17, MAX_HEADER - 1] {
            assert_eq!(
                Preamble::decode(&preamble_bytes(1, 1, len, 0)),
                Err(FrameError::Misaligned { len })
            );
        }
        assert!(Preamble::decode(&preamble_bytes(1, 1, MAX_HEADER, MAX_PAYLOAD)).is_ok());
        assert!(Preamble::decode_prefix(&[0u8; 15]).is_err());
    }

    #[test]
    fn oversized_lengths_are_rejected_before_reading_on() {
        for len in [MAX_HEADER + 16, u32::MAX - 15, u32::MAX] {
            let p = preamble_bytes(1, 1, len, 0);
            assert_eq!(
                Preamble::decode(&p),
                Err(FrameError::HeaderTooLarge {
                    len: u64::from(len)
                })
            );
            // The whole-frame decoder reports the bound, not a truncation,
            // when handed only the 16 bytes: it never sizes anything by the
            // announced length.
            assert_eq!(
                decode_request_frame(&p).map(|_| ()),
                Err(FrameError::HeaderTooLarge {
                    len: u64::from(len)
                })
            );
        }
        for len in [MAX_PAYLOAD + 1, u32::MAX] {
            let p = preamble_bytes(1, 2, 64, len);
            assert_eq!(
                Preamble::decode(&p),
                Err(FrameError::PayloadTooLarge {
                    len: u64::from(len)
                })
            );
            assert_eq!(
                decode_response_frame(&p).map(|_| ()),
                Err(FrameError::PayloadTooLarge {
                    len: u64::from(len)
                })
            );
        }
        // Hand-built preambles are checked by the header decoders too.
        let huge = Preamble {
            version: 1,
            kind: FrameKind::Request,
            header_len: u32::MAX,
            payload_len: 0,
        };
        assert!(matches!(
            decode_request(&huge, &[]),
            Err(FrameError::HeaderTooLarge { .. })
        ));
        assert!(matches!(
            encode_request(&sample_requests()[0], MAX_PAYLOAD + 1, &mut Vec::new()),
            Err(FrameError::PayloadTooLarge { .. })
        ));
    }

    #[test]
    fn kind_must_match_the_decoder() {
        let req_frame = request_frame(&sample_requests()[0]);
        let resp_frame = response_frame(&sample_responses()[0]);
        assert_eq!(
            decode_response_frame(&req_frame).map(|_| ()),
            Err(FrameError::Kind { got: 1 })
        );
        assert_eq!(
            decode_request_frame(&resp_frame).map(|_| ()),
            Err(FrameError::Kind { got: 2 })
        );
        // A response header behind a request preamble fails validation.
        let mut swapped = resp_frame.clone();
        swapped[6] = 1;
        assert!(decode_request_frame(&swapped).is_err());
    }

    #[test]
    fn garbage_headers_are_invalid() {
        let frame = request_frame(&sample_requests()[0]);
        let preamble = Preamble::decode_prefix(&frame).unwrap();
        let zeros = vec![0u8; preamble.header_len as usize];
        // All zeros is a Request { request_id: 0, body: Ping { nonce: 0 } }.
        assert!(decode_request(&preamble, &zeros).is_ok());
        let ones = vec![0xffu8; preamble.header_len as usize];
        assert!(matches!(
            decode_request(&preamble, &ones),
            Err(FrameError::Invalid(_))
        ));
        // An unknown variant tag (the byte after request_id at the root).
        let mut bad_tag = frame.clone();
        let root = frame.len() - std::mem::size_of::<ArchivedRequest>();
        bad_tag[root + 8] = 200;
        assert!(matches!(
            decode_request_frame(&bad_tag),
            Err(FrameError::Invalid(_))
        ));
        // An unknown error code.
        let resp = Response {
            request_id: 1,
            body: ResponseBody::Error {
                code: ErrorCode::Io,
                message: String::new(),
            },
        };
        let mut frame = response_frame(&resp);
        let root = frame.len() - std::mem::size_of::<ArchivedResponse>();
        assert_eq!(frame[root + 8], 10, "Error is variant 10");
        assert_eq!(frame[root + 9], 4, "Io is code 4");
        frame[root + 9] = 10;
        assert!(matches!(
            decode_response_frame(&frame),
            Err(FrameError::Invalid(_))
        ));
    }

    // -- semantic limits ----------------------------------------------------

    #[test]
    fn request_limits_are_enforced_on_both_sides() {
        let long = |n: usize| "x".repeat(n);
        type Case = (Request, u32, fn(&FrameError) -> bool);
        let cases: Vec<Case> = vec![
            (
                Request {
                    request_id: 1,
                    body: RequestBody::ReadPages {
                        pages: (0..MAX_BATCH as u64 + 1).map(key).collect(),
                        epoch: 0,
                    },
                },
                0,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::LoadPages {
                        file: FileRef {
                            path: long(MAX_PATH_LEN + 1),
                            ..file_ref()
                        },
                        pages: vec![1],
                        epoch: 0,
                    },
                },
                0,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::LoadPages {
                        file: FileRef {
                            mount: long(MAX_MOUNT_LEN + 1),
                            ..file_ref()
                        },
                        pages: vec![1],
                        epoch: 0,
                    },
                },
                0,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::LoadPages {
                        file: FileRef {
                            version_tag: long(MAX_VERSION_TAG_LEN + 1),
                            ..file_ref()
                        },
                        pages: vec![1],
                        epoch: 0,
                    },
                },
                0,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::LoadPages {
                        file: file_ref(),
                        pages: vec![0; MAX_LOAD_PAGES + 1],
                        epoch: 0,
                    },
                },
                0,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::WritePage {
                        key: key(0),
                        version: 0,
                        len: 10,
                        epoch: 0,
                    },
                },
                11,
                |e| matches!(e, FrameError::Mismatch(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::WritePage {
                        key: key(0),
                        version: 0,
                        len: MAX_PAGE_LEN + 1,
                        epoch: 0,
                    },
                },
                MAX_PAGE_LEN + 1,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::ReadRange {
                        key: key(0),
                        offset: MAX_PAGE_LEN,
                        len: 1,
                        epoch: 0,
                    },
                },
                0,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::ReadRange {
                        key: key(0),
                        offset: u32::MAX,
                        len: u32::MAX,
                        epoch: 0,
                    },
                },
                0,
                |e| matches!(e, FrameError::Limit(_)),
            ),
            (
                Request {
                    request_id: 1,
                    body: RequestBody::Ping { nonce: 0 },
                },
                1,
                |e| matches!(e, FrameError::Mismatch(_)),
            ),
        ];
        for (req, payload_len, want) in cases {
            let err = encode_request(&req, payload_len, &mut Vec::new()).unwrap_err();
            assert!(want(&err), "encode {req:?}: {err}");
            let frame = raw_request_frame(&req, payload_len);
            let err = decode_request_frame(&frame).map(|_| ()).unwrap_err();
            assert!(want(&err), "decode {req:?}: {err}");
            assert_eq!(
                err.error_code() == ErrorCode::TooLarge,
                matches!(err, FrameError::Limit(_))
            );
        }
    }

    #[test]
    fn response_limits_are_enforced_on_both_sides() {
        let cases: Vec<(ResponseBody, u32)> = vec![
            (
                ResponseBody::Pages {
                    entries: vec![PageStatus::Miss; MAX_BATCH + 1],
                },
                0,
            ),
            (
                ResponseBody::Pages {
                    entries: vec![PageStatus::Data { len: 4 }, PageStatus::Data { len: 4 }],
                },
                7,
            ),
            (
                ResponseBody::Pages {
                    entries: vec![PageStatus::Data {
                        len: MAX_PAGE_LEN + 1,
                    }],
                },
                0,
            ),
            (
                ResponseBody::Data {
                    page_len: 10,
                    version: 0,
                },
                11,
            ),
            (
                ResponseBody::Data {
                    page_len: MAX_PAGE_LEN + 1,
                    version: 0,
                },
                0,
            ),
            (
                ResponseBody::Error {
                    code: ErrorCode::Io,
                    message: "m".repeat(MAX_MESSAGE_LEN + 1),
                },
                0,
            ),
            (ResponseBody::Written, 3),
            (ResponseBody::Pong { nonce: 3 }, 1),
        ];
        for (body, payload_len) in cases {
            let resp = Response {
                request_id: 5,
                body,
            };
            assert!(
                encode_response(&resp, payload_len, &mut Vec::new()).is_err(),
                "{resp:?}"
            );
            let frame = raw_response_frame(&resp, payload_len);
            let err = decode_response_frame(&frame).map(|_| ()).unwrap_err();
            assert!(
                matches!(err, FrameError::Limit(_) | FrameError::Mismatch(_)),
                "{resp:?}: {err}"
            );
        }
    }

    #[test]
    fn answers_table() {
        let ping = RequestBody::Ping { nonce: 5 };
        assert!(ResponseBody::Pong { nonce: 5 }.answers(&ping));
        assert!(!ResponseBody::Pong { nonce: 6 }.answers(&ping));
        assert!(!ResponseBody::NotOwner { epoch: 1 }.answers(&ping));
        assert!(!ResponseBody::NotOwner { epoch: 1 }.answers(&RequestBody::Stat));
        let err = ResponseBody::Error {
            code: ErrorCode::Internal,
            message: String::new(),
        };
        let requests = sample_requests();
        for req in &requests {
            assert!(err.answers(&req.body));
        }
        let read = RequestBody::ReadRange {
            key: key(1),
            offset: 0,
            len: 1,
            epoch: 1,
        };
        assert!(ResponseBody::Miss.answers(&read));
        assert!(ResponseBody::NotOwner { epoch: 2 }.answers(&read));
        assert!(!ResponseBody::Written.answers(&read));
        let batch = RequestBody::ReadPages {
            pages: vec![key(1), key(2)],
            epoch: 1,
        };
        assert!(ResponseBody::Pages {
            entries: vec![PageStatus::Miss, PageStatus::NotOwner]
        }
        .answers(&batch));
        assert!(!ResponseBody::Pages {
            entries: vec![PageStatus::Miss]
        }
        .answers(&batch));
    }

    #[test]
    fn file_id_halves() {
        let id: u128 = 0x1112_1314_1516_1718_2122_2324_2526_2728;
        assert_eq!(FileId::from(id), FILE_A);
        assert_eq!(u128::from(FILE_A), id);
    }

    #[test]
    fn errors_display() {
        let errors = [
            FrameError::Truncated { needed: 16, got: 3 },
            FrameError::Magic { got: *b"HTTP" },
            FrameError::Version { got: 9 },
            FrameError::Kind { got: 7 },
            FrameError::HeaderTooLarge { len: 1 << 20 },
            FrameError::PayloadTooLarge { len: 1 << 30 },
            FrameError::Misaligned { len: 17 },
            FrameError::Invalid("x".into()),
            FrameError::Limit("y".into()),
            FrameError::Mismatch("z".into()),
        ];
        for e in errors {
            let boxed: Box<dyn std::error::Error> = Box::new(e.clone());
            assert!(!boxed.to_string().is_empty());
            assert!(e.peer_message().len() <= MAX_MESSAGE_LEN);
        }
        let long = FrameError::Limit("é".repeat(MAX_MESSAGE_LEN));
        assert!(long.peer_message().len() <= MAX_MESSAGE_LEN);
        assert!(!FrameError::Invalid("ptr 0x7f00".into())
            .peer_message()
            .contains("0x7f00"));
        // Every peer message fits an Error response.
        let resp = Response {
            request_id: 0,
            body: ResponseBody::Error {
                code: long.error_code(),
                message: long.peer_message(),
            },
        };
        assert!(encode_response(&resp, 0, &mut Vec::new()).is_ok());
    }

    // -- golden vectors -----------------------------------------------------

    /// `Request { request_id: 1, body: Ping { nonce: 0x0123456789abcdef } }`,
    /// no payload. 16-byte preamble + 96-byte header (no front padding).
    const GOLDEN_PING: &str = "\
        50535446010001006000000000000000\
        01000000000000000000000000000000\
        efcdab89674523010000000000000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000";

    /// `Request { request_id: 2, body: ReadRange { key: Key { file_id:
    /// FileId { hi: 0x1112131415161718, lo: 0x2122232425262728 }, page: 3 },
    /// offset: 4096, len: 8192, epoch: 7 } }`, no payload.
    const GOLDEN_READ_RANGE: &str = "\
        50535446010001006000000000000000\
        02000000000000000300000000000000\
        18171615141312112827262524232221\
        03000000000000000010000000200000\
        07000000000000000000000000000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000";

    /// `Request { request_id: 4, body: Fetch { file: FileRef { file_id: FILE_A,
    /// mount: "", path: "/d/x", version_tag: "v1", size: 5 MiB }, page: 1,
    /// offset: 16, len: 32, epoch: 7, replica: true } }`: strings of at most 8
    /// bytes are stored inline, padded with 0xff.
    const GOLDEN_FETCH: &str = "\
        50535446010001006000000000000000\
        04000000000000000800000000000000\
        18171615141312112827262524232221\
        ffffffffffffffff2f642f78ffffffff\
        7631ffffffffffff0000500000000000\
        01000000000000001000000020000000\
        07000000000000000100000000000000";

    #[test]
    fn golden_fetch() {
        let req = Request {
            request_id: 4,
            body: RequestBody::Fetch {
                file: FileRef {
                    file_id: FILE_A,
                    mount: String::new(),
                    path: "/d/x".into(),
                    version_tag: "v1".into(),
                    size: 5 << 20,
                },
                page: 1,
                offset: 16,
                len: 32,
                epoch: 7,
                replica: true,
            },
        };
        let mut out = Vec::new();
        encode_request(&req, 0, &mut out).unwrap();
        assert_eq!(hex(&out), hex(&unhex(GOLDEN_FETCH)));
        assert_eq!(decode_request_frame(&unhex(GOLDEN_FETCH)).unwrap().0, req);
    }

    /// `Response { request_id: 1, body: Pong { nonce: 0x0123456789abcdef } }`,
    /// no payload. 16-byte preamble + 64-byte header, of which the first 8
    /// bytes are front padding.
    const GOLDEN_PONG: &str = "\
        50535446010002004000000000000000\
        00000000000000000100000000000000\
        0700000000000000efcdab8967452301\
        00000000000000000000000000000000\
        00000000000000000000000000000000";

    /// `Request { request_id: 3, body: ReadPages { pages: [Key { file_id:
    /// FILE_A, page: 3 }, Key { file_id: FILE_A, page: 4 }], epoch: 7 } }`,
    /// no payload: the two keys (48 bytes) precede the 80-byte root.
    const GOLDEN_READ_PAGES: &str = "\
        50535446010001009000000000000000\
        18171615141312112827262524232221\
        03000000000000001817161514131211\
        28272625242322210400000000000000\
        030000000000000004000000c4ffffff\
        02000000000000000700000000000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000";

    /// `Response { request_id: 2, body: Error { code: BadRange, message:
    /// "offset past end" } }`, no payload: 8 bytes of front padding, the 15
    /// message bytes (out of line), 1 byte of alignment, the 56-byte root.
    const GOLDEN_ERROR: &str = "\
        50535446010002005000000000000000\
        00000000000000006f66667365742070\
        61737420656e64000200000000000000\
        0a0100008f000000e4ffffff00000000\
        00000000000000000000000000000000\
        00000000000000000000000000000000";

    #[test]
    fn golden_vectors_with_out_of_line_data() {
        let read_pages = Request {
            request_id: 3,
            body: RequestBody::ReadPages {
                pages: vec![key(3), key(4)],
                epoch: 7,
            },
        };
        let mut out = Vec::new();
        encode_request(&read_pages, 0, &mut out).unwrap();
        assert_eq!(hex(&out), hex(&unhex(GOLDEN_READ_PAGES)));
        assert_eq!(
            decode_request_frame(&unhex(GOLDEN_READ_PAGES)).unwrap().0,
            read_pages
        );
        let error = Response {
            request_id: 2,
            body: ResponseBody::Error {
                code: ErrorCode::BadRange,
                message: "offset past end".to_string(),
            },
        };
        let mut out = Vec::new();
        encode_response(&error, 0, &mut out).unwrap();
        assert_eq!(hex(&out), hex(&unhex(GOLDEN_ERROR)));
        assert_eq!(
            decode_response_frame(&unhex(GOLDEN_ERROR)).unwrap().0,
            error
        );
    }

    /// Sizes and alignments stated in docs/PROTOCOL.md.
    #[test]
    fn documented_sizes() {
        use std::mem::{align_of, size_of};
        assert_eq!(
            (size_of::<ArchivedFileId>(), align_of::<ArchivedFileId>()),
            (16, 8)
        );
        assert_eq!(
            (size_of::<ArchivedKey>(), align_of::<ArchivedKey>()),
            (24, 8)
        );
        assert_eq!(
            (size_of::<ArchivedFileRef>(), align_of::<ArchivedFileRef>()),
            (48, 8)
        );
        assert_eq!(
            (
                size_of::<ArchivedRequestBody>(),
                align_of::<ArchivedRequestBody>()
            ),
            (88, 8)
        );
        assert_eq!(
            (size_of::<ArchivedRequest>(), align_of::<ArchivedRequest>()),
            (96, 8)
        );
        assert_eq!(
            (
                size_of::<ArchivedResponseBody>(),
                align_of::<ArchivedResponseBody>()
            ),
            (48, 8)
        );
        assert_eq!(
            (
                size_of::<ArchivedResponse>(),
                align_of::<ArchivedResponse>()
            ),
            (56, 8)
        );
        assert_eq!(
            (
                size_of::<ArchivedPageStatus>(),
                align_of::<ArchivedPageStatus>()
            ),
            (8, 4)
        );
        assert_eq!(
            (
                size_of::<ArchivedErrorCode>(),
                align_of::<ArchivedErrorCode>()
            ),
            (1, 1)
        );
        assert_eq!(
            (
                size_of::<rkyv::string::ArchivedString>(),
                align_of::<rkyv::string::ArchivedString>()
            ),
            (8, 4)
        );
        assert_eq!(
            (
                size_of::<rkyv::vec::ArchivedVec<ArchivedKey>>(),
                align_of::<rkyv::vec::ArchivedVec<ArchivedKey>>()
            ),
            (8, 4)
        );
    }

    fn le(bytes: &[u8], at: usize, n: usize) -> u64 {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(v)
    }

    /// Field offsets within the root stated in docs/PROTOCOL.md (offsets
    /// relative to the root; the body starts at root offset 8).
    #[test]
    fn documented_field_offsets() {
        type Fields = Vec<(usize, usize, u64)>;
        // (body, [(offset in root, width, value)])
        let requests: Vec<(RequestBody, Fields)> = vec![
            (
                RequestBody::Ping { nonce: 0xAA },
                vec![(8, 1, 0), (16, 8, 0xAA)],
            ),
            (RequestBody::RingEpoch, vec![(8, 1, 1)]),
            (RequestBody::Stat, vec![(8, 1, 2)]),
            (
                RequestBody::ReadRange {
                    key: key(5),
                    offset: 6,
                    len: 7,
                    epoch: 8,
                },
                vec![
                    (8, 1, 3),
                    (16, 8, FILE_A.hi),
                    (24, 8, FILE_A.lo),
                    (32, 8, 5),
                    (40, 4, 6),
                    (44, 4, 7),
                    (48, 8, 8),
                ],
            ),
            (
                RequestBody::ReadPages {
                    pages: vec![key(1)],
                    epoch: 9,
                },
                vec![(8, 1, 4), (16, 4, 1), (24, 8, 9)],
            ),
            (
                RequestBody::WritePage {
                    key: key(5),
                    version: 6,
                    len: 7,
                    epoch: 8,
                },
                vec![
                    (8, 1, 5),
                    (16, 8, FILE_A.hi),
                    (24, 8, FILE_A.lo),
                    (32, 8, 5),
                    (40, 8, 6),
                    (48, 4, 7),
                    (56, 8, 8),
                ],
            ),
            (
                RequestBody::LoadPages {
                    file: FileRef {
                        size: 77,
                        ..file_ref()
                    },
                    pages: vec![1, 2, 3],
                    epoch: 9,
                },
                vec![
                    (8, 1, 6),
                    (16, 8, FILE_A.hi),
                    (24, 8, FILE_A.lo),
                    (56, 8, 77),
                    (68, 4, 3),
                    (72, 8, 9),
                ],
            ),
            (
                RequestBody::RemoveFile {
                    file_id: FILE_A,
                    epoch: 9,
                },
                vec![
                    (8, 1, 7),
                    (16, 8, FILE_A.hi),
                    (24, 8, FILE_A.lo),
                    (32, 8, 9),
                ],
            ),
        ];
        for (body, fields) in requests {
            let req = Request {
                request_id: 0x1234,
                body,
            };
            let frame = request_frame(&req);
            let payload = request_payload_len(&req) as usize;
            let root =
                &frame[frame.len() - payload - size_of::<ArchivedRequest>()..frame.len() - payload];
            assert_eq!(le(root, 0, 8), 0x1234);
            for (at, width, value) in fields {
                assert_eq!(le(root, at, width), value, "{req:?} at {at}");
            }
        }
        let responses: Vec<(ResponseBody, Fields)> = vec![
            (
                ResponseBody::Data {
                    page_len: 100,
                    version: 6,
                },
                vec![(8, 1, 0), (12, 4, 100), (16, 8, 6)],
            ),
            (
                ResponseBody::Pages {
                    entries: vec![PageStatus::Miss],
                },
                vec![(8, 1, 1), (16, 4, 1)],
            ),
            (ResponseBody::Miss, vec![(8, 1, 2)]),
            (
                ResponseBody::NotOwner { epoch: 5 },
                vec![(8, 1, 3), (16, 8, 5)],
            ),
            (ResponseBody::Written, vec![(8, 1, 4)]),
            (
                ResponseBody::Loaded { pages: 3, bytes: 4 },
                vec![(8, 1, 5), (12, 4, 3), (16, 8, 4)],
            ),
            (
                ResponseBody::Removed { pages: 3 },
                vec![(8, 1, 6), (12, 4, 3)],
            ),
            (ResponseBody::Pong { nonce: 3 }, vec![(8, 1, 7), (16, 8, 3)]),
            (
                ResponseBody::Epoch { epoch: 3 },
                vec![(8, 1, 8), (16, 8, 3)],
            ),
            (
                ResponseBody::Stat {
                    shard: 2,
                    pages: 3,
                    bytes: 4,
                    capacity_bytes: 5,
                    hits: 6,
                    misses: 7,
                },
                vec![
                    (8, 1, 9),
                    (10, 2, 2),
                    (16, 8, 3),
                    (24, 8, 4),
                    (32, 8, 5),
                    (40, 8, 6),
                    (48, 8, 7),
                ],
            ),
            (
                ResponseBody::Error {
                    code: ErrorCode::Forbidden,
                    message: "no".into(),
                },
                // Inline string: the bytes, then 0xff fill.
                vec![
                    (8, 1, 10),
                    (9, 1, 7),
                    (12, 2, u64::from(u16::from_le_bytes(*b"no"))),
                    (14, 1, 0xff),
                ],
            ),
        ];
        for (body, fields) in responses {
            let resp = Response {
                request_id: 0x4321,
                body,
            };
            let frame = response_frame(&resp);
            let payload = response_payload_len(&resp) as usize;
            let root = &frame
                [frame.len() - payload - size_of::<ArchivedResponse>()..frame.len() - payload];
            assert_eq!(le(root, 0, 8), 0x4321);
            for (at, width, value) in fields {
                assert_eq!(le(root, at, width), value, "{resp:?} at {at}");
            }
        }
        // PageStatus: tag at 0, Data's len at 4.
        let resp = Response {
            request_id: 0,
            body: ResponseBody::Pages {
                entries: vec![PageStatus::Data { len: 9 }, PageStatus::NotOwner],
            },
        };
        let frame = response_frame(&resp);
        let header_end = frame.len() - 9;
        let root = header_end - size_of::<ArchivedResponse>();
        let entries = root - 16;
        assert_eq!(
            &frame[entries..root],
            &[0, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn golden_vectors() {
        let ping = Request {
            request_id: 1,
            body: RequestBody::Ping {
                nonce: 0x0123_4567_89ab_cdef,
            },
        };
        let read = Request {
            request_id: 2,
            body: RequestBody::ReadRange {
                key: Key {
                    file_id: FILE_A,
                    page: 3,
                },
                offset: 4096,
                len: 8192,
                epoch: 7,
            },
        };
        let pong = Response {
            request_id: 1,
            body: ResponseBody::Pong {
                nonce: 0x0123_4567_89ab_cdef,
            },
        };
        for (req, golden) in [(&ping, GOLDEN_PING), (&read, GOLDEN_READ_RANGE)] {
            let mut out = Vec::new();
            encode_request(req, 0, &mut out).unwrap();
            assert_eq!(hex(&out), hex(&unhex(golden)), "{req:?}");
            assert_eq!(decode_request_frame(&unhex(golden)).unwrap().0, *req);
        }
        let mut out = Vec::new();
        encode_response(&pong, 0, &mut out).unwrap();
        assert_eq!(hex(&out), hex(&unhex(GOLDEN_PONG)));
        assert_eq!(decode_response_frame(&unhex(GOLDEN_PONG)).unwrap().0, pong);
    }

    // -- property tests -----------------------------------------------------

    fn arb_file_id() -> impl Strategy<Value = FileId> {
        (any::<u64>(), any::<u64>()).prop_map(|(hi, lo)| FileId { hi, lo })
    }

    fn arb_key() -> impl Strategy<Value = Key> {
        (arb_file_id(), any::<u64>()).prop_map(|(file_id, page)| Key { file_id, page })
    }

    fn arb_string(max: usize) -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::string::string_regex(&format!("[a-z0-9/._-]{{0,{max}}}")).unwrap(),
            proptest::string::string_regex(&format!("\\PC{{0,{}}}", max / 4)).unwrap(),
        ]
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        let body = prop_oneof![
            any::<u64>().prop_map(|nonce| RequestBody::Ping { nonce }),
            Just(RequestBody::RingEpoch),
            Just(RequestBody::Stat),
            (arb_key(), 0..=MAX_PAGE_LEN, any::<u64>()).prop_flat_map(|(key, offset, epoch)| {
                (0..=MAX_PAGE_LEN - offset).prop_map(move |len| RequestBody::ReadRange {
                    key,
                    offset,
                    len,
                    epoch,
                })
            }),
            (proptest::collection::vec(arb_key(), 0..=20), any::<u64>())
                .prop_map(|(pages, epoch)| RequestBody::ReadPages { pages, epoch }),
            (arb_key(), any::<u64>(), 0u32..64, any::<u64>()).prop_map(
                |(key, version, len, epoch)| {
                    RequestBody::WritePage {
                        key,
                        version,
                        len,
                        epoch,
                    }
                }
            ),
            (
                arb_file_id(),
                arb_string(40),
                arb_string(120),
                arb_string(40),
                any::<u64>(),
                proptest::collection::vec(any::<u64>(), 0..=20),
                any::<u64>()
            )
                .prop_map(|(file_id, mount, path, version_tag, size, pages, epoch)| {
                    RequestBody::LoadPages {
                        file: FileRef {
                            file_id,
                            mount,
                            path,
                            version_tag,
                            size,
                        },
                        pages,
                        epoch,
                    }
                }),
            (arb_file_id(), any::<u64>())
                .prop_map(|(file_id, epoch)| RequestBody::RemoveFile { file_id, epoch }),
            (
                arb_file_id(),
                arb_string(120),
                any::<u64>(),
                0..=MAX_PAGE_LEN,
                any::<bool>()
            )
                .prop_flat_map(|(file_id, path, page, offset, replica)| {
                    (0..=MAX_PAGE_LEN - offset).prop_map(move |len| RequestBody::Fetch {
                        file: FileRef {
                            file_id,
                            path: path.clone(),
                            ..FileRef::default()
                        },
                        page,
                        offset,
                        len,
                        epoch: page ^ 7,
                        replica,
                    })
                }),
            arb_string(120).prop_map(|path| RequestBody::StatPath { path }),
            (arb_string(120), arb_string(40))
                .prop_map(|(path, start_after)| RequestBody::List { path, start_after }),
            Just(RequestBody::Cluster),
            (arb_string(120), arb_file_id())
                .prop_map(|(path, file_id)| RequestBody::Invalidate { path, file_id }),
            Just(RequestBody::Jobs),
            Just(RequestBody::Counters),
        ];
        (any::<u64>(), body).prop_map(|(request_id, body)| Request { request_id, body })
    }

    fn arb_error_code() -> impl Strategy<Value = ErrorCode> {
        prop_oneof![
            Just(ErrorCode::BadRequest),
            Just(ErrorCode::BadRange),
            Just(ErrorCode::TooLarge),
            Just(ErrorCode::NotFound),
            Just(ErrorCode::Io),
            Just(ErrorCode::Full),
            Just(ErrorCode::Unavailable),
            Just(ErrorCode::Forbidden),
            Just(ErrorCode::Internal),
            Just(ErrorCode::Changed),
        ]
    }

    fn arb_page_status() -> impl Strategy<Value = PageStatus> {
        prop_oneof![
            (0u32..32).prop_map(|len| PageStatus::Data { len }),
            Just(PageStatus::Miss),
            Just(PageStatus::NotOwner),
        ]
    }

    fn arb_response() -> impl Strategy<Value = Response> {
        let body = prop_oneof![
            (0..=MAX_PAGE_LEN, any::<u64>())
                .prop_map(|(page_len, version)| ResponseBody::Data { page_len, version }),
            proptest::collection::vec(arb_page_status(), 0..=20)
                .prop_map(|entries| ResponseBody::Pages { entries }),
            Just(ResponseBody::Miss),
            any::<u64>().prop_map(|epoch| ResponseBody::NotOwner { epoch }),
            Just(ResponseBody::Written),
            (any::<u32>(), any::<u64>())
                .prop_map(|(pages, bytes)| ResponseBody::Loaded { pages, bytes }),
            any::<u32>().prop_map(|pages| ResponseBody::Removed { pages }),
            any::<u64>().prop_map(|nonce| ResponseBody::Pong { nonce }),
            any::<u64>().prop_map(|epoch| ResponseBody::Epoch { epoch }),
            (
                any::<u16>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(|(shard, pages, bytes, capacity_bytes, hits, misses)| {
                    ResponseBody::Stat {
                        shard,
                        pages,
                        bytes,
                        capacity_bytes,
                        hits,
                        misses,
                    }
                }),
            (arb_error_code(), arb_string(200))
                .prop_map(|(code, message)| ResponseBody::Error { code, message }),
            (any::<u64>(), arb_string(40), arb_file_id()).prop_map(
                |(size, version_tag, file_id)| ResponseBody::PathInfo {
                    kind: PathKind::File {
                        size,
                        version_tag,
                        file_id,
                    },
                }
            ),
            Just(ResponseBody::PathInfo {
                kind: PathKind::Dir
            }),
            (
                proptest::collection::vec(
                    ("[a-z0-9._-]{1,20}", any::<bool>(), any::<u64>())
                        .prop_map(|(name, is_dir, size)| DirEntry { name, is_dir, size }),
                    0..=20
                ),
                any::<bool>()
            )
                .prop_map(|(entries, more)| ResponseBody::Listing { entries, more }),
            (
                1..=MAX_PAGE_LEN,
                any::<u64>(),
                any::<u8>(),
                proptest::collection::vec(
                    (arb_file_id(), arb_string(30), any::<u16>())
                        .prop_map(|(id, addr, shards)| NodeEntry { id, addr, shards }),
                    0..=8
                ),
                proptest::collection::vec(
                    (arb_string(30), arb_string(60))
                        .prop_map(|(prefix, url)| MountEntry { prefix, url }),
                    0..=4
                )
            )
                .prop_map(|(page_size, epoch, replicas, nodes, mounts)| {
                    ResponseBody::ClusterInfo {
                        page_size,
                        epoch,
                        replicas,
                        nodes,
                        mounts,
                    }
                }),
            Just(ResponseBody::Jobs),
            Just(ResponseBody::Counters),
        ];
        (any::<u64>(), body).prop_map(|(request_id, body)| Response { request_id, body })
    }

    /// Decodes `buf` both ways; whatever decodes must be a valid value that
    /// encodes again.
    fn decode_anything(buf: &[u8]) {
        if let Ok((req, payload)) = decode_request_frame(buf) {
            let payload_len = payload.len() as u32;
            req.validate(payload_len).unwrap();
            encode_request(&req, payload_len, &mut Vec::new()).unwrap();
        }
        if let Ok((resp, payload)) = decode_response_frame(buf) {
            let payload_len = payload.len() as u32;
            resp.validate(payload_len).unwrap();
            encode_response(&resp, payload_len, &mut Vec::new()).unwrap();
        }
        if let Ok(preamble) = Preamble::decode_prefix(buf) {
            let header = buf.get(PREAMBLE_LEN..).unwrap_or(&[]);
            let header = &header[..header.len().min(preamble.header_len as usize)];
            let _ = decode_request(&preamble, header);
            let _ = decode_response(&preamble, header);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn prop_requests_round_trip(req in arb_request()) {
            let frame = request_frame(&req);
            let (decoded, payload) = decode_request_frame(&frame).unwrap();
            prop_assert_eq!(&decoded, &req);
            prop_assert_eq!(payload.len() as u32, request_payload_len(&req));
            prop_assert_eq!((frame.len() - payload.len() - PREAMBLE_LEN) % HEADER_ALIGN, 0);
        }

        #[test]
        fn prop_responses_round_trip(resp in arb_response()) {
            let frame = response_frame(&resp);
            let (decoded, payload) = decode_response_frame(&frame).unwrap();
            prop_assert_eq!(&decoded, &resp);
            prop_assert_eq!(payload.len() as u32, response_payload_len(&resp));
        }

        #[test]
        fn prop_random_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
            decode_anything(&buf);
        }

        #[test]
        fn prop_random_headers_never_panic(
            kind in 1u16..=2,
            blocks in 1u32..=12,
            payload_len in 0u32..64,
            seed in proptest::collection::vec(any::<u8>(), 16 * 12 + 64),
        ) {
            let header_len = blocks * 16;
            let mut buf = preamble_bytes(PROTOCOL_VERSION, kind, header_len, payload_len).to_vec();
            buf.extend_from_slice(&seed[..(header_len + payload_len) as usize]);
            decode_anything(&buf);
        }

        #[test]
        fn prop_mutated_requests_never_panic(
            req in arb_request(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), 0u8..8), 1..8),
            cut in any::<proptest::sample::Index>(),
        ) {
            let frame = request_frame(&req);
            let mut mutated = frame.clone();
            for (at, bit) in &flips {
                let i = at.index(mutated.len());
                mutated[i] ^= 1 << bit;
            }
            decode_anything(&mutated);
            // Mutated and then truncated.
            decode_anything(&mutated[..cut.index(mutated.len())]);
        }

        #[test]
        fn prop_mutated_responses_never_panic(
            resp in arb_response(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let frame = response_frame(&resp);
            let mut mutated = frame.clone();
            // Byte-wise corruption concentrated on the header.
            let header_len = mutated.len() - response_payload_len(&resp) as usize - PREAMBLE_LEN;
            for (at, value) in &flips {
                let i = PREAMBLE_LEN + at.index(header_len);
                mutated[i] = *value;
            }
            decode_anything(&mutated);
        }
    }
}
