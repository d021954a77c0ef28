//! Tests of `frame.rs` (a child module, kept apart so the code reads without them).

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
        RequestBody::WritePage { len, .. } | RequestBody::WriteDirty { len, .. } => len,
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
        ResponseBody::Counters => COUNTERS_PAYLOAD_LEN,
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
            route: Route::Fallback,
        },
        RequestBody::Fetch {
            file: file_ref(),
            page: 4,
            offset: 0,
            len: 4096,
            epoch: 7,
            route: Route::Hot,
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
        RequestBody::WriteDirty {
            key: key(2),
            version_tag: crate::writeback::new_tag(7),
            len: 33,
            epoch: 4,
            since: 0x1234_5678_9abc_0002,
        },
        RequestBody::Change {
            op: ChangeOp::Commit {
                path: "/ckpt/step-100/model.pt".into(),
                version_tag: crate::writeback::new_tag(7),
                size: 5 << 30,
                mtime_ns: 1_700_000_000_000_000_000,
                last: true,
                expect: Expect::Absent,
                attrs: vec![
                    Attr {
                        name: "content-type".into(),
                        value: "application/octet-stream".into(),
                    },
                    Attr {
                        name: "x-amz-meta-step".into(),
                        value: "100".into(),
                    },
                ],
                since: 0x1234_5678_9abc_0001,
            },
        },
        RequestBody::Change {
            op: ChangeOp::Rename {
                from: "/ckpt/.tmp.model.pt".into(),
                to: "/ckpt/model.pt".into(),
                replace: true,
            },
        },
        RequestBody::Change {
            op: ChangeOp::Delete {
                path: "/ckpt/old".into(),
                dir: false,
                expect: Expect::Version(crate::writeback::new_tag(9)),
            },
        },
        RequestBody::Change {
            op: ChangeOp::MakeDir {
                path: "/ckpt/step-200".into(),
                mtime_ns: -5,
            },
        },
        RequestBody::Change {
            op: ChangeOp::SetTime {
                path: "/ckpt/step-200/model.pt".into(),
                version_tag: crate::writeback::new_tag(11),
                mtime_ns: -1_500_000_000_123_456_789,
            },
        },
        RequestBody::Replicate,
        RequestBody::PullRecords {
            after: "/ckpt/a".into(),
        },
        RequestBody::FilePages {
            file_id: FileId::from_u128(5),
            action: PageAction::Clean,
        },
        RequestBody::FilePages {
            file_id: FileId::from_u128(5),
            action: PageAction::Drop,
        },
        RequestBody::FilePages {
            file_id: FileId::from_u128(5),
            action: PageAction::Seal,
        },
        RequestBody::WriteBackState {
            prefix: "/ckpt".into(),
        },
        RequestBody::Hot,
        RequestBody::LoadFiles {
            files: vec![
                LoadFile {
                    file: file_ref(),
                    pages: vec![0, 3],
                },
                LoadFile {
                    file: FileRef::default(),
                    pages: vec![],
                },
            ],
            epoch: 8,
        },
        RequestBody::LoadFiles {
            files: vec![],
            epoch: 0,
        },
        RequestBody::Attributes {
            path: "/ckpt/model.pt".into(),
            version_tag: crate::writeback::new_tag(7),
        },
        RequestBody::Discard {
            version_tag: crate::writeback::new_tag(8),
        },
        RequestBody::Renew {
            version_tag: crate::writeback::new_tag(9),
        },
        RequestBody::RecordsOf {
            paths: vec!["/ckpt/model.pt".into(), "/ckpt".into(), "/".into()],
        },
        RequestBody::RecordsIn {
            dir: "/ckpt".into(),
            after: "model.pt".into(),
            digest: 0x0123_4567_89ab_cdef,
        },
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
            spread: 0,
        },
        ResponseBody::Data {
            page_len: 0,
            version: 0,
            spread: 0,
        },
        ResponseBody::Data {
            page_len: 4 << 20,
            version: 9,
            spread: 3,
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
                mtime_ns: 1_700_000_000_123_456_789,
                state: FileState::Stored,
                store_tag: "9b2cf535f27731c974343645a3985328".into(),
            },
        },
        ResponseBody::PathInfo {
            kind: PathKind::File {
                size: 1,
                version_tag: crate::writeback::new_tag(9),
                file_id: FileId::from_u128(9),
                mtime_ns: 0,
                state: FileState::Dirty,
                store_tag: String::new(),
            },
        },
        ResponseBody::PathInfo {
            kind: PathKind::Dir { mtime_ns: -5 },
        },
        ResponseBody::Listing {
            entries: vec![
                DirEntry {
                    name: "a".into(),
                    is_dir: true,
                    size: 0,
                    version_tag: String::new(),
                    mtime_ns: 0,
                },
                DirEntry {
                    name: "b.bin".into(),
                    is_dir: false,
                    size: 12345,
                    version_tag: "9b2cf535f27731c974343645a3985328".into(),
                    mtime_ns: -1_000_000_000,
                },
            ],
            more: true,
        },
        ResponseBody::Listing {
            entries: vec![DirEntry {
                name: "c".into(),
                is_dir: false,
                size: 1,
                version_tag: "v".into(),
                mtime_ns: 1,
            }],
            more: false,
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
            write_replicas: 2,
        },
        ResponseBody::Jobs,
        ResponseBody::Counters,
        ResponseBody::Applied { hlc: 1 << 40 },
        ResponseBody::Records { more: true },
        ResponseBody::WriteBack {
            summary: WriteBackSummary {
                files_dirty: 3,
                bytes_dirty: 4 << 30,
                deletes_pending: 1,
                files_flushing: 1,
                oldest_dirty_ms: 2500,
                flush_errors: 2,
                bytes_flushed: 40 << 30,
                last_error: "store unreachable".into(),
            },
        },
        ResponseBody::Hot,
        ResponseBody::FilesLoaded {
            outcomes: vec![
                FileOutcome::Loaded {
                    pages: 2,
                    bytes: 128 << 10,
                },
                FileOutcome::Failed {
                    code: ErrorCode::NotFound,
                    loaded: 0,
                    message: "/data/gone.bin not found".into(),
                },
                FileOutcome::Loaded { pages: 0, bytes: 0 },
            ],
        },
        ResponseBody::FilesLoaded { outcomes: vec![] },
        ResponseBody::Attributes {
            attrs: vec![Attr {
                name: "content-type".into(),
                value: "text/csv".into(),
            }],
        },
        ResponseBody::Attributes { attrs: vec![] },
        ResponseBody::Held {
            pages: 12,
            grace_ms: 120_000,
        },
        ResponseBody::Same,
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
        ErrorCode::Exists,
        ErrorCode::NotEmpty,
        ErrorCode::Unflushed,
        ErrorCode::IsDir,
        ErrorCode::NotDir,
        ErrorCode::Unverified,
        ErrorCode::Precondition,
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
        // The head alone, its payload received apart.
        let head = &frame[..payload.start];
        assert_eq!(decode_request_head(head, payload.len()).unwrap(), req);
    }
}

#[test]
fn a_head_decoded_apart_from_its_payload_needs_exactly_the_announced_payload() {
    let req = Request {
        request_id: 9,
        body: RequestBody::WriteDirty {
            key: Key {
                file_id: FileId::from_u128(3),
                page: 1,
            },
            version_tag: "wb:1".into(),
            len: 8192,
            epoch: 2,
            since: 5,
        },
    };
    let mut frame = Vec::new();
    encode_request(&req, 8192, &mut frame).unwrap();
    let head_len = frame.len();
    assert_eq!(decode_request_head(&frame, 8192).unwrap(), req);
    // Fewer payload bytes than announced, or more.
    assert!(matches!(
        decode_request_head(&frame, 8191),
        Err(FrameError::Truncated { needed, got }) if needed == head_len + 8192 && got == needed - 1
    ));
    assert!(matches!(
        decode_request_head(&frame, 8193),
        Err(FrameError::Mismatch(m)) if m.contains("1 bytes follow")
    ));
    // A head cut short, or with bytes of the payload in it.
    assert!(matches!(
        decode_request_head(&frame[..head_len - 1], 8193),
        Err(FrameError::Truncated { .. })
    ));
    let mut long = frame.clone();
    long.push(0);
    assert!(matches!(
        decode_request_head(&long, 8191),
        Err(FrameError::Truncated { .. })
    ));
    assert!(matches!(
        decode_request_head(&frame[..10], 8192),
        Err(FrameError::Truncated {
            needed: PREAMBLE_LEN,
            got: 10
        })
    ));
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
        // With no out-of-line data the archive is exactly the root (a
        // multiple of 16 bytes), so there is no padding; a listing of one
        // entry with inline strings adds 40 bytes, padded by 8.
        let archive = match &resp.body {
            ResponseBody::Pong { .. } | ResponseBody::Miss => root,
            ResponseBody::Listing { entries, .. }
                if entries.len() == 1
                    && entries[0].name.len() <= 8
                    && entries[0].version_tag.len() <= 8 =>
            {
                root + 40
            }
            _ => continue,
        };
        let pad = header.len() - archive;
        assert!(pad == 0 || pad == 8, "pad {pad}");
        assert!(header[..pad].iter().all(|b| *b == 0));
        saw_pad[usize::from(pad == 8)] = true;
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
    assert_eq!(p.encode(), preamble_bytes(16, 2, 4096, MAX_PAYLOAD));
    assert_eq!(p.header_range(), 16..4112);
    assert_eq!(p.payload_range(), 4112..4112 + MAX_PAYLOAD as usize);
}

#[test]
fn preamble_rejections() {
    let mut bad_magic = preamble_bytes(PROTOCOL_VERSION, 1, 16, 0);
    bad_magic[0] = b'X';
    assert_eq!(
        Preamble::decode(&bad_magic),
        Err(FrameError::Magic { got: *b"XSTF" })
    );
    // The versions before this one (1: JSON payloads in `Jobs` and
    // `Counters`; 2: no modification times, 56-byte response roots; 3: no
    // write-back, 64-byte response roots; 4: no hot-page replicas; 5: no
    // `IsDir`, `NotDir`, `Unverified` or `Recovered`; 6: no attributes of
    // write-back files; 7: no `since` in commits; 8: none in `WriteDirty`;
    // 9: no `Discard`; 10: no `SetTime`; 11: no `Renew`; 12: no directory
    // times; 13: no `RecordsOf`; 14: no `RecordsIn`; 15: no `Same`) and the
    // next are refused.
    for version in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17] {
        assert_eq!(
            Preamble::decode(&preamble_bytes(version, 1, 16, 0)),
            Err(FrameError::Version { got: version })
        );
    }
    assert_eq!(
        Preamble::decode(&preamble_bytes(0, 1, 16, 0)),
        Err(FrameError::Version { got: 0 })
    );
    for kind in [0u16, 3, 0xffff] {
        assert_eq!(
            Preamble::decode(&preamble_bytes(PROTOCOL_VERSION, kind, 16, 0)),
            Err(FrameError::Kind { got: kind })
        );
    }
    for len in [0u32, 1, 8, 17, MAX_HEADER - 1] {
        assert_eq!(
            Preamble::decode(&preamble_bytes(PROTOCOL_VERSION, 1, len, 0)),
            Err(FrameError::Misaligned { len })
        );
    }
    assert!(Preamble::decode(&preamble_bytes(
        PROTOCOL_VERSION,
        1,
        MAX_HEADER,
        MAX_PAYLOAD
    ))
    .is_ok());
    assert!(Preamble::decode_prefix(&[0u8; 15]).is_err());
}

#[test]
fn oversized_lengths_are_rejected_before_reading_on() {
    for len in [MAX_HEADER + 16, u32::MAX - 15, u32::MAX] {
        let p = preamble_bytes(PROTOCOL_VERSION, 1, len, 0);
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
        let p = preamble_bytes(PROTOCOL_VERSION, 2, 64, len);
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
        version: PROTOCOL_VERSION,
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
    // The numbers docs/PROTOCOL.md gives the codes version 6 added.
    for (code, n) in [
        (ErrorCode::IsDir, 13),
        (ErrorCode::NotDir, 14),
        (ErrorCode::Unverified, 15),
        (ErrorCode::Precondition, 16),
    ] {
        let r = Response {
            request_id: 1,
            body: ResponseBody::Error {
                code,
                message: String::new(),
            },
        };
        let f = response_frame(&r);
        assert_eq!(f[f.len() - std::mem::size_of::<ArchivedResponse>() + 9], n);
    }
    frame[root + 9] = 17;
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
                spread: 0,
            },
            11,
        ),
        (
            ResponseBody::Data {
                page_len: MAX_PAGE_LEN + 1,
                version: 0,
                spread: 0,
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
        (
            ResponseBody::Listing {
                entries: vec![DirEntry {
                    name: "x".into(),
                    is_dir: false,
                    size: 1,
                    version_tag: "v".repeat(MAX_VERSION_TAG_LEN + 1),
                    mtime_ns: 0,
                }],
                more: false,
            },
            0,
        ),
        (cluster_with_mounts(MAX_MOUNTS + 1, 16, 0), 0),
        (
            cluster_with_mounts(16, MAX_MOUNT_TABLE_BYTES / 16 + 1, 0),
            0,
        ),
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

/// A `ClusterInfo` with `mounts` mounts whose prefix and URL take
/// `bytes_each` bytes together, and `nodes` members with IPv4 addresses of
/// the longest form.
fn cluster_with_mounts(mounts: usize, bytes_each: usize, nodes: usize) -> ResponseBody {
    ResponseBody::ClusterInfo {
        page_size: 4 << 20,
        epoch: 1,
        replicas: 1,
        nodes: (0..nodes)
            .map(|i| NodeEntry {
                id: FileId::from_u128(i as u128),
                addr: "255.255.255.255:65535".into(),
                shards: 8,
            })
            .collect(),
        mounts: (0..mounts)
            .map(|i| {
                let prefix = format!("/{i:08}");
                let url = format!("s3://{}", "b".repeat(bytes_each - prefix.len() - 5));
                MountEntry { prefix, url }
            })
            .collect(),
        write_replicas: 2,
    }
}

#[test]
fn mount_table_limits_leave_room_for_members() {
    // A mount table at both limits, with 700 members, still fits one header.
    let body = cluster_with_mounts(MAX_MOUNTS, MAX_MOUNT_TABLE_BYTES / MAX_MOUNTS, 700);
    let ResponseBody::ClusterInfo { mounts, .. } = &body else {
        unreachable!()
    };
    let mounts = mounts.clone();
    let bytes: usize = mounts.iter().map(|m| m.prefix.len() + m.url.len()).sum();
    assert_eq!((mounts.len(), bytes), (MAX_MOUNTS, MAX_MOUNT_TABLE_BYTES));
    check_mount_table(&mounts).unwrap();
    let resp = Response {
        request_id: 1,
        body,
    };
    assert_eq!(
        decode_response_frame(&response_frame(&resp)).unwrap().0,
        resp
    );
    // One more mount, or one more byte, is refused by name.
    let mut more = mounts.clone();
    more.push(MountEntry {
        prefix: "/x".into(),
        url: String::new(),
    });
    let e = check_mount_table(&more).unwrap_err();
    assert!(e.to_string().contains("MAX_MOUNTS = 256"), "{e}");
    let mut longer = mounts.clone();
    longer[0].url.push('b');
    let e = check_mount_table(&longer).unwrap_err();
    assert!(
        e.to_string().contains("MAX_MOUNT_TABLE_BYTES = 16384"),
        "{e}"
    );
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
    // `Same` answers a `RecordsIn` only.
    let records_in = RequestBody::RecordsIn {
        dir: "/ck".into(),
        after: String::new(),
        digest: 7,
    };
    assert!(ResponseBody::Same.answers(&records_in));
    assert!(ResponseBody::Records { more: false }.answers(&records_in));
    let records_of = RequestBody::RecordsOf {
        paths: vec!["/ck".into()],
    };
    assert!(!ResponseBody::Same.answers(&records_of));
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
    50535446100001006000000000000000\
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
    50535446100001006000000000000000\
    02000000000000000300000000000000\
    18171615141312112827262524232221\
    03000000000000000010000000200000\
    07000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000";

/// `Request { request_id: 4, body: Fetch { file: FileRef { file_id: FILE_A,
/// mount: "", path: "/d/x", version_tag: "v1", size: 5 MiB }, page: 1,
/// offset: 16, len: 32, epoch: 7, route: Fallback } }`: strings of at most 8
/// bytes are stored inline, padded with 0xff.
const GOLDEN_FETCH: &str = "\
    50535446100001006000000000000000\
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
            route: Route::Fallback,
        },
    };
    let mut out = Vec::new();
    encode_request(&req, 0, &mut out).unwrap();
    assert_eq!(hex(&out), hex(&unhex(GOLDEN_FETCH)));
    assert_eq!(decode_request_frame(&unhex(GOLDEN_FETCH)).unwrap().0, req);
    // Route `Recovered` (version 6) is byte 3 where `Fallback` is 1, nothing else changed.
    let mut recovered = req.clone();
    if let RequestBody::Fetch { route, .. } = &mut recovered.body {
        *route = Route::Recovered;
    }
    let mut out3 = Vec::new();
    encode_request(&recovered, 0, &mut out3).unwrap();
    let diff: Vec<(u8, u8)> = out
        .iter()
        .zip(&out3)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| (*a, *b))
        .collect();
    assert_eq!(diff, [(1, 3)]);
}

/// `Response { request_id: 1, body: Pong { nonce: 0x0123456789abcdef } }`,
/// no payload. 16-byte preamble + 64-byte header: the root alone, no
/// padding.
const GOLDEN_PONG: &str = "\
    50535446100002005000000000000000\
    01000000000000000700000000000000\
    efcdab89674523010000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000";

/// `Request { request_id: 3, body: ReadPages { pages: [Key { file_id:
/// FILE_A, page: 3 }, Key { file_id: FILE_A, page: 4 }], epoch: 7 } }`,
/// no payload: the two keys (48 bytes) precede the 80-byte root.
const GOLDEN_READ_PAGES: &str = "\
    50535446100001009000000000000000\
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
/// "offset past end" } }`, no payload: the 15 message bytes (out of line),
/// 1 byte of alignment, the 64-byte root; no front padding.
const GOLDEN_ERROR: &str = "\
    50535446100002006000000000000000\
    6f6666736574207061737420656e6400\
    02000000000000000a0100008f000000\
    e4ffffff000000000000000000000000\
    00000000000000000000000000000000\
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

/// 2020-09-13T12:26:40Z in nanoseconds: the modification time of the
/// metadata golden vectors.
const GOLDEN_MTIME_NS: i64 = 1_600_000_000_000_000_000;

/// `Response { request_id: 5, body: PathInfo { kind: File { size: 1024,
/// version_tag: "v1", file_id: FILE_A, mtime_ns: GOLDEN_MTIME_NS } } }`:
/// the 64-byte root alone.
const GOLDEN_PATH_INFO: &str = "\
    50535446100002005000000000000000\
    05000000000000000b00000000000000\
    00000000000000000004000000000000\
    7631ffffffffffff1817161514131211\
    28272625242322210000a0d885573416\
    000000007631ffffffffffff00000000";

/// `Response { request_id: 6, body: Listing { entries: [DirEntry { name:
/// "a.bin", is_dir: false, size: 3, version_tag: "v1", mtime_ns:
/// GOLDEN_MTIME_NS }], more: false } }`: 8 bytes of front padding, the
/// 40-byte entry, then the root, whose pointer (-52) leads from its field
/// (header 60) back to the entry (header 8).
const GOLDEN_LISTING: &str = "\
    50535446100002008000000000000000\
    0000000000000000612e62696effffff\
    00000000000000000300000000000000\
    7631ffffffffffff0000a0d885573416\
    06000000000000000c000000ccffffff\
    01000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000";

#[test]
fn golden_metadata() {
    let info = Response {
        request_id: 5,
        body: ResponseBody::PathInfo {
            kind: PathKind::File {
                size: 1024,
                version_tag: "v1".into(),
                file_id: FILE_A,
                mtime_ns: GOLDEN_MTIME_NS,
                state: FileState::Stored,
                store_tag: "v1".into(),
            },
        },
    };
    let listing = Response {
        request_id: 6,
        body: ResponseBody::Listing {
            entries: vec![DirEntry {
                name: "a.bin".into(),
                is_dir: false,
                size: 3,
                version_tag: "v1".into(),
                mtime_ns: GOLDEN_MTIME_NS,
            }],
            more: false,
        },
    };
    for (resp, golden) in [(&info, GOLDEN_PATH_INFO), (&listing, GOLDEN_LISTING)] {
        let mut out = Vec::new();
        encode_response(resp, 0, &mut out).unwrap();
        assert_eq!(hex(&out), hex(&unhex(golden)), "{resp:?}");
        assert_eq!(decode_response_frame(&unhex(golden)).unwrap().0, *resp);
    }
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
        (72, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedResponse>(),
            align_of::<ArchivedResponse>()
        ),
        (80, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedPathKind>(),
            align_of::<ArchivedPathKind>()
        ),
        (64, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedFileRecord>(),
            align_of::<ArchivedFileRecord>()
        ),
        (88, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedRecordEntry>(),
            align_of::<ArchivedRecordEntry>()
        ),
        (56, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedChangeOp>(),
            align_of::<ArchivedChangeOp>()
        ),
        (72, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedDirEntry>(),
            align_of::<ArchivedDirEntry>()
        ),
        (40, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedNodeEntry>(),
            align_of::<ArchivedNodeEntry>()
        ),
        (32, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedMountEntry>(),
            align_of::<ArchivedMountEntry>()
        ),
        (16, 4)
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
        (
            RequestBody::WriteDirty {
                key: key(5),
                version_tag: "t".into(),
                len: 7,
                epoch: 8,
                since: 11,
            },
            vec![
                (8, 1, 15),
                (16, 8, FILE_A.hi),
                (24, 8, FILE_A.lo),
                (32, 8, 5),
                (40, 1, u64::from(b't')),
                (48, 4, 7),
                (56, 8, 8),
                (64, 8, 11),
            ],
        ),
        (
            RequestBody::Change {
                op: ChangeOp::Commit {
                    path: "p".into(),
                    version_tag: "t".into(),
                    size: 9,
                    mtime_ns: -3,
                    last: true,
                    expect: Expect::Version("e".into()),
                    attrs: Vec::new(),
                    since: 5,
                },
            },
            vec![
                (8, 1, 16),
                (16, 1, 0),
                (20, 1, u64::from(b'p')),
                (28, 1, u64::from(b't')),
                (40, 8, 9),
                (48, 8, (-3i64) as u64),
                (56, 1, 1),
                (60, 1, 2),
                (64, 1, u64::from(b'e')),
                (76, 4, 0),
                (80, 8, 5),
            ],
        ),
        (
            RequestBody::Change {
                op: ChangeOp::Rename {
                    from: "a".into(),
                    to: "b".into(),
                    replace: true,
                },
            },
            vec![
                (16, 1, 1),
                (20, 1, u64::from(b'a')),
                (28, 1, u64::from(b'b')),
                (36, 1, 1),
            ],
        ),
        (
            RequestBody::Change {
                op: ChangeOp::Delete {
                    path: "d".into(),
                    dir: true,
                    expect: Expect::Version("e".into()),
                },
            },
            vec![
                (16, 1, 2),
                (20, 1, u64::from(b'd')),
                (28, 1, 1),
                (32, 1, 2),
                (36, 1, u64::from(b'e')),
            ],
        ),
        (
            RequestBody::Change {
                op: ChangeOp::MakeDir {
                    path: "m".into(),
                    mtime_ns: 4,
                },
            },
            vec![(16, 1, 3), (20, 1, u64::from(b'm')), (32, 8, 4)],
        ),
        (
            RequestBody::Change {
                op: ChangeOp::SetTime {
                    path: "m".into(),
                    version_tag: "v".into(),
                    mtime_ns: 6,
                },
            },
            vec![
                (16, 1, 4),
                (20, 1, u64::from(b'm')),
                (28, 1, u64::from(b'v')),
                (40, 8, 6),
            ],
        ),
        (RequestBody::Replicate, vec![(8, 1, 17)]),
        (
            RequestBody::PullRecords { after: "z".into() },
            vec![(8, 1, 18), (12, 1, u64::from(b'z'))],
        ),
        (
            RequestBody::FilePages {
                file_id: FILE_A,
                action: PageAction::Seal,
            },
            vec![
                (8, 1, 19),
                (16, 8, FILE_A.hi),
                (24, 8, FILE_A.lo),
                (32, 1, 2),
            ],
        ),
        (
            RequestBody::WriteBackState { prefix: "q".into() },
            vec![(8, 1, 20), (12, 1, u64::from(b'q'))],
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
                spread: 3,
            },
            vec![(8, 1, 0), (12, 4, 100), (16, 8, 6), (24, 1, 3)],
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
            ResponseBody::PathInfo {
                kind: PathKind::File {
                    size: 3,
                    version_tag: "v".into(),
                    file_id: FILE_A,
                    mtime_ns: -2,
                    state: FileState::Clean,
                    store_tag: "s".into(),
                },
            },
            vec![
                (8, 1, 11),
                (16, 1, 0),
                (24, 8, 3),
                (32, 1, u64::from(b'v')),
                (40, 8, FILE_A.hi),
                (48, 8, FILE_A.lo),
                (56, 8, (-2i64) as u64),
                (64, 1, 3),
                (68, 1, u64::from(b's')),
            ],
        ),
        (
            ResponseBody::PathInfo {
                kind: PathKind::Dir {
                    mtime_ns: 1_700_000_000_123_456_789,
                },
            },
            vec![(8, 1, 11), (16, 1, 1), (24, 8, 1_700_000_000_123_456_789)],
        ),
        (
            ResponseBody::Listing {
                entries: Vec::new(),
                more: true,
            },
            vec![(8, 1, 12), (16, 4, 0), (20, 1, 1)],
        ),
        (
            ResponseBody::ClusterInfo {
                page_size: 4,
                epoch: 5,
                replicas: 6,
                nodes: Vec::new(),
                mounts: Vec::new(),
                write_replicas: 2,
            },
            vec![
                (8, 1, 13),
                (12, 4, 4),
                (16, 8, 5),
                (24, 1, 6),
                (32, 4, 0),
                (40, 4, 0),
                (44, 1, 2),
            ],
        ),
        (
            ResponseBody::Applied { hlc: 77 },
            vec![(8, 1, 16), (16, 8, 77)],
        ),
        (
            ResponseBody::Records { more: true },
            vec![(8, 1, 17), (9, 1, 1)],
        ),
        (
            ResponseBody::WriteBack {
                summary: WriteBackSummary {
                    files_dirty: 1,
                    bytes_dirty: 2,
                    deletes_pending: 3,
                    files_flushing: 4,
                    oldest_dirty_ms: 5,
                    flush_errors: 6,
                    bytes_flushed: 7,
                    last_error: "e".into(),
                },
            },
            vec![
                (8, 1, 18),
                (16, 8, 1),
                (24, 8, 2),
                (32, 8, 3),
                (40, 8, 4),
                (48, 8, 5),
                (56, 8, 6),
                (64, 8, 7),
                (72, 1, u64::from(b'e')),
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
        let root =
            &frame[frame.len() - payload - size_of::<ArchivedResponse>()..frame.len() - payload];
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
        (arb_key(), any::<u64>(), 0u32..64, any::<u64>()).prop_map(|(key, version, len, epoch)| {
            RequestBody::WritePage {
                key,
                version,
                len,
                epoch,
            }
        }),
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
            prop_oneof![
                Just(Route::Owner),
                Just(Route::Fallback),
                Just(Route::Hot),
                Just(Route::Recovered)
            ]
        )
            .prop_flat_map(|(file_id, path, page, offset, route)| {
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
                    route,
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
        (
            arb_key(),
            arb_string(40),
            0u32..64,
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(
                |(key, version_tag, len, epoch, since)| RequestBody::WriteDirty {
                    key,
                    version_tag,
                    len,
                    epoch,
                    since,
                }
            ),
        arb_change_op().prop_map(|op| RequestBody::Change { op }),
        Just(RequestBody::Replicate),
        arb_string(120).prop_map(|after| RequestBody::PullRecords { after }),
        (
            arb_file_id(),
            prop_oneof![
                Just(PageAction::Clean),
                Just(PageAction::Drop),
                Just(PageAction::Seal)
            ]
        )
            .prop_map(|(file_id, action)| RequestBody::FilePages { file_id, action }),
        arb_string(120).prop_map(|prefix| RequestBody::WriteBackState { prefix }),
        Just(RequestBody::Hot),
        (
            proptest::collection::vec(
                (
                    arb_file_id(),
                    arb_string(20),
                    arb_string(60),
                    arb_string(40),
                    any::<u64>(),
                    proptest::collection::vec(any::<u64>(), 0..=4),
                ),
                0..=6
            ),
            any::<u64>()
        )
            .prop_map(|(files, epoch)| RequestBody::LoadFiles {
                files: files
                    .into_iter()
                    .map(
                        |(file_id, mount, path, version_tag, size, pages)| LoadFile {
                            file: FileRef {
                                file_id,
                                mount,
                                path,
                                version_tag,
                                size,
                            },
                            pages,
                        }
                    )
                    .collect(),
                epoch,
            }),
        (arb_string(120), arb_string(40))
            .prop_map(|(path, version_tag)| { RequestBody::Attributes { path, version_tag } }),
        arb_string(40).prop_map(|version_tag| RequestBody::Discard { version_tag }),
        arb_string(40).prop_map(|version_tag| RequestBody::Renew { version_tag }),
        prop::collection::vec(arb_string(60), 1..=4)
            .prop_map(|paths| RequestBody::RecordsOf { paths }),
        (arb_string(60), arb_string(20), any::<u64>())
            .prop_map(|(dir, after, digest)| RequestBody::RecordsIn { dir, after, digest }),
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
        Just(ErrorCode::Exists),
        Just(ErrorCode::NotEmpty),
        Just(ErrorCode::Unflushed),
        Just(ErrorCode::IsDir),
        Just(ErrorCode::NotDir),
        Just(ErrorCode::Unverified),
        Just(ErrorCode::Precondition),
    ]
}

fn arb_file_state() -> impl Strategy<Value = FileState> {
    prop_oneof![
        Just(FileState::Stored),
        Just(FileState::Writing),
        Just(FileState::Dirty),
        Just(FileState::Clean),
        Just(FileState::Transient),
    ]
}

fn arb_change_op() -> impl Strategy<Value = ChangeOp> {
    prop_oneof![
        (
            arb_string(120),
            arb_string(40),
            any::<u64>(),
            any::<i64>(),
            any::<bool>(),
            prop_oneof![
                Just(Expect::Any),
                Just(Expect::Absent),
                arb_string(40).prop_map(Expect::Version)
            ],
            proptest::collection::vec(
                (arb_string(20), arb_string(40)).prop_map(|(name, value)| Attr { name, value }),
                0..4
            ),
            any::<u64>(),
        )
            .prop_map(
                |(path, version_tag, size, mtime_ns, last, expect, attrs, since)| {
                    ChangeOp::Commit {
                        path,
                        version_tag,
                        size,
                        mtime_ns,
                        last,
                        expect,
                        attrs,
                        since,
                    }
                }
            ),
        (arb_string(120), arb_string(120), any::<bool>())
            .prop_map(|(from, to, replace)| ChangeOp::Rename { from, to, replace }),
        (
            arb_string(120),
            any::<bool>(),
            prop_oneof![Just(Expect::Any), arb_string(40).prop_map(Expect::Version)]
        )
            .prop_map(|(path, dir, expect)| ChangeOp::Delete { path, dir, expect }),
        (arb_string(120), any::<i64>())
            .prop_map(|(path, mtime_ns)| ChangeOp::MakeDir { path, mtime_ns }),
        (arb_string(120), arb_string(40), any::<i64>()).prop_map(
            |(path, version_tag, mtime_ns)| ChangeOp::SetTime {
                path,
                version_tag,
                mtime_ns
            }
        ),
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
        (0..=MAX_PAGE_LEN, any::<u64>(), any::<u8>()).prop_map(|(page_len, version, spread)| {
            ResponseBody::Data {
                page_len,
                version,
                spread,
            }
        }),
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
        (
            any::<u64>(),
            arb_string(40),
            arb_file_id(),
            any::<i64>(),
            arb_file_state(),
            arb_string(40)
        )
            .prop_map(|(size, version_tag, file_id, mtime_ns, state, store_tag)| {
                ResponseBody::PathInfo {
                    kind: PathKind::File {
                        size,
                        version_tag,
                        file_id,
                        mtime_ns,
                        state,
                        store_tag,
                    },
                }
            }),
        any::<i64>().prop_map(|mtime_ns| ResponseBody::PathInfo {
            kind: PathKind::Dir { mtime_ns }
        }),
        (
            proptest::collection::vec(
                (
                    "[a-z0-9._-]{1,20}",
                    any::<bool>(),
                    any::<u64>(),
                    arb_string(40),
                    any::<i64>()
                )
                    .prop_map(|(name, is_dir, size, version_tag, mtime_ns)| {
                        DirEntry {
                            name,
                            is_dir,
                            size,
                            version_tag,
                            mtime_ns,
                        }
                    }),
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
                    write_replicas: replicas ^ 1,
                }
            }),
        Just(ResponseBody::Jobs),
        Just(ResponseBody::Counters),
        any::<u64>().prop_map(|hlc| ResponseBody::Applied { hlc }),
        any::<bool>().prop_map(|more| ResponseBody::Records { more }),
        (proptest::collection::vec(any::<u64>(), 7), arb_string(200)).prop_map(
            |(n, last_error)| ResponseBody::WriteBack {
                summary: WriteBackSummary {
                    files_dirty: n[0],
                    bytes_dirty: n[1],
                    deletes_pending: n[2],
                    files_flushing: n[3],
                    oldest_dirty_ms: n[4],
                    flush_errors: n[5],
                    bytes_flushed: n[6],
                    last_error,
                },
            }
        ),
        Just(ResponseBody::Hot),
        proptest::collection::vec(
            prop_oneof![
                (any::<u32>(), any::<u64>())
                    .prop_map(|(pages, bytes)| FileOutcome::Loaded { pages, bytes }),
                (arb_error_code(), any::<u32>(), arb_string(100)).prop_map(
                    |(code, loaded, message)| FileOutcome::Failed {
                        code,
                        loaded,
                        message
                    }
                ),
            ],
            0..=8
        )
        .prop_map(|outcomes| ResponseBody::FilesLoaded { outcomes }),
        proptest::collection::vec(
            (arb_string(20), arb_string(40)).prop_map(|(name, value)| Attr { name, value }),
            0..4
        )
        .prop_map(|attrs| ResponseBody::Attributes { attrs }),
        (any::<u32>(), any::<u64>())
            .prop_map(|(pages, grace_ms)| ResponseBody::Held { pages, grace_ms }),
        Just(ResponseBody::Same),
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

// -- payload records: Counters and Jobs ----------------------------------

fn counters() -> ShardCounters {
    ShardCounters {
        shard: 3,
        pages: 1,
        bytes: 2,
        capacity_bytes: 3,
        hits: 4,
        misses: 5,
        hit_bytes: 6,
        ufs_reads: 7,
        ufs_bytes: 8,
        ufs_errors: 9,
        evictions: 10,
        checksum_failures: 11,
        replica_reads: 12,
        not_owner: 13,
        forbidden: 14,
        epoch: 15,
        coalesced: 16,
        ufs_repeat_reads: 17,
        served_bytes: 18,
        memory_hits: 19,
        memory_hit_bytes: 20,
        memory_bytes: 21,
        memory_capacity: 22,
        memory_admissions: 23,
        memory_evictions: 24,
        hot_turned: 25,
        hot_now: 26,
        replica_copies: 27,
        replica_copy_failures: 28,
        replicas_held: 29,
        replicas_dropped: 30,
        replica_hot_reads: 31,
    }
}

/// A record at every limit.
fn largest_job_record() -> JobRecord {
    JobRecord {
        id: "i".repeat(MAX_JOB_ID),
        source: "s".repeat(MAX_JOB_SOURCE_LEN),
        client: "c".repeat(MAX_JOB_CLIENT_LEN),
        state: JobState::Failed,
        verify: true,
        submitted: f64::MAX,
        updated: f64::MIN,
        elapsed_secs: f64::INFINITY,
        resolve_secs: -0.0,
        first_page_secs: Some(f64::EPSILON),
        files_total: u64::MAX,
        files_done: u64::MAX,
        files_failed: u64::MAX,
        bytes_done: u64::MAX,
        bytes_loaded: u64::MAX,
        pages_loaded: u64::MAX,
        pages_present: u64::MAX,
    }
}

/// `ShardCounters { shard: 3, pages: 1, bytes: 2, ..., replica_hot_reads: 31
/// }` (each counter after `shard` one more than the one before): the
/// 256-byte payload of a `Counters` answer.
const GOLDEN_COUNTERS: &str = "\
    03000000000000000100000000000000\
    02000000000000000300000000000000\
    04000000000000000500000000000000\
    06000000000000000700000000000000\
    08000000000000000900000000000000\
    0a000000000000000b00000000000000\
    0c000000000000000d00000000000000\
    0e000000000000000f00000000000000\
    10000000000000001100000000000000\
    12000000000000001300000000000000\
    14000000000000001500000000000000\
    16000000000000001700000000000000\
    18000000000000001900000000000000\
    1a000000000000001b00000000000000\
    1c000000000000001d00000000000000\
    1e000000000000001f00000000000000";

/// `JobRecord { id: "job-1", source: "prefix /data", client: "h:42",
/// state: Done, verify: true, submitted: 1.5, updated: 2.0, elapsed_secs:
/// 0.5, resolve_secs: 0.25, first_page_secs: Some(0.25), files_total: 1,
/// files_done: 2, files_failed: 3, bytes_done: 4, bytes_loaded: 5,
/// pages_loaded: 6, pages_present: 7 }`: the payload of a `Jobs` request.
/// The 12 source bytes (out of line), 4 bytes of alignment, the 136-byte
/// root.
const GOLDEN_JOB_RECORD: &str = "\
    707265666978202f6461746100000000\
    6a6f622d31ffffff8c000000e8ffffff\
    683a3432ffffffff0101000000000000\
    000000000000f83f0000000000000040\
    000000000000e03f000000000000d03f\
    0100000000000000000000000000d03f\
    01000000000000000200000000000000\
    03000000000000000400000000000000\
    05000000000000000600000000000000\
    0700000000000000";

/// `[JobRecord { id: "b", ..Default::default() }]`: the payload of a `Jobs`
/// answer with one record (every string inline): the 136-byte element, then
/// the vector (pointer -136, length 1).
const GOLDEN_JOB_RECORDS: &str = "\
    62ffffffffffffffffffffffffffffff\
    ffffffffffffffff0000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    000000000000000078ffffff01000000";

fn golden_job_record() -> JobRecord {
    JobRecord {
        id: "job-1".into(),
        source: "prefix /data".into(),
        client: "h:42".into(),
        state: JobState::Done,
        verify: true,
        submitted: 1.5,
        updated: 2.0,
        elapsed_secs: 0.5,
        resolve_secs: 0.25,
        first_page_secs: Some(0.25),
        files_total: 1,
        files_done: 2,
        files_failed: 3,
        bytes_done: 4,
        bytes_loaded: 5,
        pages_loaded: 6,
        pages_present: 7,
    }
}

#[test]
fn golden_payloads() {
    let bytes = encode_counters(&counters()).unwrap();
    assert_eq!(hex(&bytes), hex(&unhex(GOLDEN_COUNTERS)));
    assert_eq!(
        decode_counters(&unhex(GOLDEN_COUNTERS)).unwrap(),
        counters()
    );

    let record = golden_job_record();
    let bytes = encode_job_record(&record).unwrap();
    assert_eq!(hex(&bytes), hex(&unhex(GOLDEN_JOB_RECORD)));
    assert_eq!(
        decode_job_record(&unhex(GOLDEN_JOB_RECORD)).unwrap(),
        record
    );

    let short = JobRecord {
        id: "b".into(),
        ..JobRecord::default()
    };
    let bytes = encode_job_records(std::slice::from_ref(&short)).unwrap();
    assert_eq!(hex(&bytes), hex(&unhex(GOLDEN_JOB_RECORDS)));
    assert_eq!(
        decode_job_records(&unhex(GOLDEN_JOB_RECORDS)).unwrap(),
        [short]
    );
    // No records: the vector alone, pointing at itself.
    let empty = encode_job_records(&[]).unwrap();
    assert_eq!(hex(&empty), "0000000000000000");
    assert!(decode_job_records(&empty).unwrap().is_empty());
}

/// Sizes, alignments and offsets of the payload records stated in
/// docs/PROTOCOL.md.
#[test]
fn documented_payload_layouts() {
    use std::mem::{align_of, size_of};
    assert_eq!(
        (
            size_of::<ArchivedShardCounters>(),
            align_of::<ArchivedShardCounters>()
        ),
        (256, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedHotReport>(),
            align_of::<ArchivedHotReport>()
        ),
        (28, 4)
    );
    assert_eq!(
        (size_of::<ArchivedHotFile>(), align_of::<ArchivedHotFile>()),
        (48, 8)
    );
    assert_eq!(
        (size_of::<ArchivedHotPage>(), align_of::<ArchivedHotPage>()),
        (48, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedMountBytes>(),
            align_of::<ArchivedMountBytes>()
        ),
        (32, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedJobRecord>(),
            align_of::<ArchivedJobRecord>()
        ),
        (136, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedJobState>(),
            align_of::<ArchivedJobState>()
        ),
        (1, 1)
    );
    // Offsets within the JobRecord root, from a record whose fields are all
    // different.
    let record = golden_job_record();
    let bytes = encode_job_record(&record).unwrap();
    let root = &bytes[bytes.len() - size_of::<ArchivedJobRecord>()..];
    for (at, width, value) in [
        (24, 1, 1), // state Done
        (25, 1, 1), // verify
        (32, 8, 1.5f64.to_bits()),
        (40, 8, 2.0f64.to_bits()),
        (48, 8, 0.5f64.to_bits()),
        (56, 8, 0.25f64.to_bits()),
        (64, 1, 1), // first_page_secs: Some
        (72, 8, 0.25f64.to_bits()),
        (80, 8, 1),
        (88, 8, 2),
        (96, 8, 3),
        (104, 8, 4),
        (112, 8, 5),
        (120, 8, 6),
        (128, 8, 7),
    ] {
        assert_eq!(le(root, at, width), value, "at {at}");
    }
    let none = JobRecord {
        first_page_secs: None,
        state: JobState::Failed,
        ..record
    };
    let bytes = encode_job_record(&none).unwrap();
    let root = &bytes[bytes.len() - size_of::<ArchivedJobRecord>()..];
    assert_eq!(le(root, 24, 1), 2);
    assert_eq!(le(root, 64, 8), 0);
    assert_eq!(le(root, 72, 8), 0);
}

#[test]
fn payload_records_round_trip_at_any_alignment() {
    let records = vec![
        golden_job_record(),
        largest_job_record(),
        JobRecord {
            id: "ü".repeat(MAX_JOB_ID / 2),
            first_page_secs: None,
            ..JobRecord::default()
        },
    ];
    for shift in 0..16 {
        let mut buf = vec![0xEEu8; shift];
        buf.extend_from_slice(&encode_counters(&counters()).unwrap());
        assert_eq!(decode_counters(&buf[shift..]).unwrap(), counters());
        for r in [golden_hot_report(), largest_hot_report()] {
            let mut buf = vec![0xEEu8; shift];
            buf.extend_from_slice(&encode_hot_report(&r).unwrap());
            assert_eq!(decode_hot_report(&buf[shift..]).unwrap(), r);
        }
        for r in &records {
            let mut buf = vec![0xEEu8; shift];
            buf.extend_from_slice(&encode_job_record(r).unwrap());
            assert_eq!(&decode_job_record(&buf[shift..]).unwrap(), r);
        }
        let mut buf = vec![0xEEu8; shift];
        buf.extend_from_slice(&encode_job_records(&records).unwrap());
        assert_eq!(decode_job_records(&buf[shift..]).unwrap(), records);
    }
    // NaN survives too (compared by bits).
    let nan = JobRecord {
        updated: f64::NAN,
        ..golden_job_record()
    };
    let back = decode_job_record(&encode_job_record(&nan).unwrap()).unwrap();
    assert!(back.updated.is_nan());
}

#[test]
fn payload_limits_hold_on_both_sides() {
    // The largest record fits a Jobs request, and a node's whole board fits
    // a Jobs answer.
    let largest = largest_job_record();
    let bytes = encode_job_record(&largest).unwrap();
    assert!(bytes.len() <= MAX_JOB_RECORD as usize, "{}", bytes.len());
    let board = vec![largest.clone(); MAX_JOB_RECORDS];
    let bytes = encode_job_records(&board).unwrap();
    assert!(bytes.len() <= MAX_JOB_RECORDS_PAYLOAD as usize);
    assert_eq!(decode_job_records(&bytes).unwrap().len(), MAX_JOB_RECORDS);
    let req = Request {
        request_id: 1,
        body: RequestBody::Jobs,
    };
    assert!(encode_request(&req, MAX_JOB_RECORD, &mut Vec::new()).is_ok());
    let resp = Response {
        request_id: 1,
        body: ResponseBody::Jobs,
    };
    assert!(encode_response(&resp, bytes.len() as u32, &mut Vec::new()).is_ok());

    // One past each limit: refused by the encoder, and by the decoder when a
    // peer archives it anyway.
    let over = [
        JobRecord {
            id: String::new(),
            ..largest.clone()
        },
        JobRecord {
            id: "i".repeat(MAX_JOB_ID + 1),
            ..largest.clone()
        },
        JobRecord {
            source: "s".repeat(MAX_JOB_SOURCE_LEN + 1),
            ..largest.clone()
        },
        JobRecord {
            client: "c".repeat(MAX_JOB_CLIENT_LEN + 1),
            ..largest.clone()
        },
    ];
    for r in &over {
        let err = encode_job_record(r).unwrap_err();
        assert!(matches!(err, FrameError::Limit(_)), "{err}");
        let raw = encode_archive(r).unwrap();
        let err = decode_job_record(&raw).unwrap_err();
        assert!(matches!(err, FrameError::Limit(_)), "{err}");
        assert!(encode_job_records(std::slice::from_ref(r)).is_err());
        let raw = encode_archive(&vec![r.clone()]).unwrap();
        assert!(decode_job_records(&raw).is_err());
    }
    let too_many = vec![golden_job_record(); MAX_JOB_RECORDS + 1];
    assert!(matches!(
        encode_job_records(&too_many).unwrap_err(),
        FrameError::Limit(_)
    ));
    let raw = encode_archive(&too_many).unwrap();
    assert!(matches!(
        decode_job_records(&raw).unwrap_err(),
        FrameError::Limit(_)
    ));
    // A record too large for a request, however valid its archive: refused
    // before validation.
    let huge = vec![0u8; MAX_JOB_RECORD as usize + 1];
    assert!(matches!(
        decode_job_record(&huge).unwrap_err(),
        FrameError::Limit(_)
    ));
    let huge = vec![0u8; MAX_JOB_RECORDS_PAYLOAD as usize + 1];
    assert!(matches!(
        decode_job_records(&huge).unwrap_err(),
        FrameError::Limit(_)
    ));

    // The frame checks: a Counters answer carries exactly one record, a Jobs
    // answer at most a board's worth, a Jobs request at most one record.
    for len in [0, COUNTERS_PAYLOAD_LEN - 8, COUNTERS_PAYLOAD_LEN + 8] {
        let resp = Response {
            request_id: 2,
            body: ResponseBody::Counters,
        };
        assert!(encode_response(&resp, len, &mut Vec::new()).is_err());
        let err = decode_response_frame(&raw_response_frame(&resp, len))
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, FrameError::Mismatch(_)), "{err}");
    }
    let resp = Response {
        request_id: 2,
        body: ResponseBody::Jobs,
    };
    let err = decode_response_frame(&raw_response_frame(&resp, MAX_JOB_RECORDS_PAYLOAD + 1))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, FrameError::Limit(_)), "{err}");
    let err = decode_request_frame(&raw_request_frame(&req, MAX_JOB_RECORD + 1))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, FrameError::Limit(_)), "{err}");
}

#[test]
fn malformed_payloads_are_errors() {
    // Wrong lengths.
    for len in [0, 1, 127, 128, 199, 200, 201, 255, 257, 512] {
        let err = decode_counters(&vec![0u8; len]).unwrap_err();
        assert!(matches!(err, FrameError::Mismatch(_)), "{len}: {err}");
    }
    for bad in [&[][..], &[0u8; 7][..], b"{\"id\":\"json\"}", b"[]"] {
        assert!(decode_job_record(bad).is_err(), "{bad:?}");
        assert!(decode_job_records(bad).is_err(), "{bad:?}");
    }
    // Every truncation of a valid payload.
    let record = encode_job_record(&golden_job_record()).unwrap();
    for end in 0..record.len() {
        assert!(decode_job_record(&record[..end]).is_err(), "cut at {end}");
    }
    let records = encode_job_records(&[golden_job_record(), largest_job_record()]).unwrap();
    for end in 0..records.len() {
        assert!(decode_job_records(&records[..end]).is_err(), "cut at {end}");
    }
    // Bad enum tags: the state, and the option's tag.
    let root = record.len() - std::mem::size_of::<ArchivedJobRecord>();
    for (at, value) in [(24, 3u8), (24, 0xff), (64, 2)] {
        let mut bad = record.clone();
        bad[root + at] = value;
        let err = decode_job_record(&bad).unwrap_err();
        assert!(matches!(err, FrameError::Invalid(_)), "{at}: {err}");
    }
    // A bool that is neither 0 nor 1.
    let mut bad = record.clone();
    bad[root + 25] = 2;
    assert!(decode_job_record(&bad).is_err());
    // A string pointer out of the payload, and one into invalid UTF-8.
    let mut bad = record.clone();
    bad[root + 12..root + 16].copy_from_slice(&(-4096i32).to_le_bytes());
    assert!(decode_job_record(&bad).is_err());
    let mut bad = record.clone();
    bad[0] = 0xff;
    assert!(decode_job_record(&bad).is_err());
    // A vector that claims more elements than the payload holds.
    let mut bad = records.clone();
    let at = bad.len() - 4;
    bad[at..].copy_from_slice(&1000u32.to_le_bytes());
    assert!(decode_job_records(&bad).is_err());
}

fn arb_job_record() -> impl Strategy<Value = JobRecord> {
    (
        (
            arb_string(MAX_JOB_ID).prop_filter("ids are not empty", |s| !s.is_empty()),
            arb_string(64),
            arb_string(32),
            prop_oneof![
                Just(JobState::Running),
                Just(JobState::Done),
                Just(JobState::Failed)
            ],
            any::<bool>(),
        ),
        proptest::array::uniform4(-1e12f64..1e12),
        proptest::option::of(0f64..1e6),
        proptest::array::uniform7(any::<u64>()),
    )
        .prop_map(
            |((id, source, client, state, verify), t, first, n)| JobRecord {
                id,
                source,
                client,
                state,
                verify,
                submitted: t[0],
                updated: t[1],
                elapsed_secs: t[2],
                resolve_secs: t[3],
                first_page_secs: first,
                files_total: n[0],
                files_done: n[1],
                files_failed: n[2],
                bytes_done: n[3],
                bytes_loaded: n[4],
                pages_loaded: n[5],
                pages_present: n[6],
            },
        )
}

/// Decodes `buf` as every payload record; whatever decodes must encode
/// again.
fn decode_any_payload(buf: &[u8]) {
    if let Ok(c) = decode_counters(buf) {
        encode_counters(&c).unwrap();
    }
    if let Ok(r) = decode_job_record(buf) {
        encode_job_record(&r).unwrap();
    }
    if let Ok(r) = decode_job_records(buf) {
        encode_job_records(&r).unwrap();
    }
    if let Ok(r) = decode_hot_report(buf) {
        encode_hot_report(&r).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prop_job_records_round_trip(
        records in proptest::collection::vec(arb_job_record(), 0..6),
    ) {
        let bytes = encode_job_records(&records).unwrap();
        prop_assert_eq!(&decode_job_records(&bytes).unwrap(), &records);
        for r in &records {
            let bytes = encode_job_record(r).unwrap();
            prop_assert_eq!(&decode_job_record(&bytes).unwrap(), r);
        }
    }

    #[test]
    fn prop_counters_round_trip(shard in any::<u16>(), n in proptest::array::uniform31(any::<u64>())) {
        let c = ShardCounters {
            shard,
            pages: n[0],
            bytes: n[1],
            capacity_bytes: n[2],
            hits: n[3],
            misses: n[4],
            hit_bytes: n[5],
            ufs_reads: n[6],
            ufs_bytes: n[7],
            ufs_errors: n[8],
            evictions: n[9],
            checksum_failures: n[10],
            replica_reads: n[11],
            not_owner: n[12],
            forbidden: n[13],
            epoch: n[14],
            coalesced: n[15],
            ufs_repeat_reads: n[16],
            served_bytes: n[17],
            memory_hits: n[18],
            memory_hit_bytes: n[19],
            memory_bytes: n[20],
            memory_capacity: n[21],
            memory_admissions: n[22],
            memory_evictions: n[23],
            hot_turned: n[24],
            hot_now: n[25],
            replica_copies: n[26],
            replica_copy_failures: n[27],
            replicas_held: n[28],
            replicas_dropped: n[29],
            replica_hot_reads: n[30],
        };
        prop_assert_eq!(decode_counters(&encode_counters(&c).unwrap()).unwrap(), c);
    }

    #[test]
    fn prop_hot_reports_round_trip(report in arb_hot_report()) {
        let bytes = encode_hot_report(&report).unwrap();
        prop_assert!(bytes.len() <= MAX_HOT_PAYLOAD as usize);
        prop_assert_eq!(decode_hot_report(&bytes).unwrap(), report);
    }

    #[test]
    fn prop_mutated_hot_reports_never_panic(
        report in arb_hot_report(),
        flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<proptest::sample::Index>(),
    ) {
        let mut bytes = encode_hot_report(&report).unwrap();
        for (at, value) in &flips {
            let i = at.index(bytes.len());
            bytes[i] = *value;
        }
        decode_any_payload(&bytes);
        decode_any_payload(&bytes[..cut.index(bytes.len())]);
    }

    #[test]
    fn prop_random_payloads_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..400)) {
        decode_any_payload(&buf);
    }

    #[test]
    fn prop_mutated_payloads_never_panic(
        records in proptest::collection::vec(arb_job_record(), 1..4),
        flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<proptest::sample::Index>(),
    ) {
        for mut bytes in [
            encode_job_records(&records).unwrap(),
            encode_job_record(&records[0]).unwrap(),
        ] {
            for (at, value) in &flips {
                let i = at.index(bytes.len());
                bytes[i] = *value;
            }
            decode_any_payload(&bytes);
            decode_any_payload(&bytes[..cut.index(bytes.len())]);
        }
    }
}

// -- write-back records ---------------------------------------------------

/// The most attributes a record keeps, with the most bytes.
fn longest_attrs() -> Vec<Attr> {
    let each = MAX_ATTRS_BYTES / MAX_ATTRS;
    (0..MAX_ATTRS)
        .map(|i| {
            let name = format!("x-amz-meta-k{i:02}");
            let value = "v".repeat(each - name.len());
            Attr { name, value }
        })
        .collect()
}

fn sample_file_records() -> Vec<FileRecord> {
    let tag = crate::writeback::new_tag(0x77);
    vec![
        FileRecord {
            path: "/ckpt/model.pt".into(),
            hlc: 5 << 16,
            origin: FileId::from_u128(1),
            entry: RecordEntry::File {
                version_tag: tag.clone(),
                size: 3 << 30,
                mtime_ns: 1_700_000_000_000_000_000,
                state: RecordState::Final,
                store_tag: String::new(),
                transient: false,
                attrs: vec![Attr {
                    name: "content-type".into(),
                    value: "application/x-ckpt".into(),
                }],
            },
        },
        FileRecord {
            path: "/ckpt/dir".into(),
            hlc: 6 << 16,
            origin: FileId::from_u128(2),
            entry: RecordEntry::Dir { mtime_ns: -1 },
        },
        FileRecord {
            path: "/ckpt/gone".into(),
            hlc: 7 << 16,
            origin: FileId::from_u128(3),
            entry: RecordEntry::Deleted {
                prev_tag: tag,
                pending: true,
            },
        },
        FileRecord {
            path: format!("/{}", "p".repeat(MAX_PATH_LEN - 1)),
            hlc: u64::MAX,
            origin: FileId::from_u128(u128::MAX),
            entry: RecordEntry::File {
                version_tag: "t".repeat(MAX_VERSION_TAG_LEN),
                size: u64::MAX,
                mtime_ns: i64::MIN,
                state: RecordState::Clean,
                store_tag: "s".repeat(MAX_VERSION_TAG_LEN),
                transient: true,
                attrs: longest_attrs(),
            },
        },
    ]
}

#[test]
fn file_records_round_trip_at_any_alignment() {
    let records = sample_file_records();
    let bytes = encode_file_records(&records).unwrap();
    for shift in 0..16 {
        let mut buf = vec![0u8; shift];
        buf.extend_from_slice(&bytes);
        assert_eq!(decode_file_records(&buf[shift..]).unwrap(), records);
    }
    assert_eq!(decode_file_records(&[]).unwrap(), Vec::new());
    for r in &records {
        let one = encode_file_record(r).unwrap();
        assert_eq!(&decode_file_record(&one).unwrap(), r);
    }
    // The largest batch with the longest paths and tags fits the payload limit.
    let largest = vec![records[3].clone(); MAX_RECORD_BATCH];
    let bytes = encode_file_records(&largest).unwrap();
    assert!(
        bytes.len() <= MAX_RECORDS_PAYLOAD as usize,
        "{}",
        bytes.len()
    );
}

#[test]
fn file_record_limits_hold_on_both_sides() {
    let good = sample_file_records();
    let too_many = vec![good[1].clone(); MAX_RECORD_BATCH + 1];
    assert!(matches!(
        encode_file_records(&too_many),
        Err(FrameError::Limit(_))
    ));
    let relative = FileRecord {
        path: "ckpt/x".into(),
        ..good[1].clone()
    };
    let long_tag = FileRecord {
        entry: RecordEntry::Deleted {
            prev_tag: "t".repeat(MAX_VERSION_TAG_LEN + 1),
            pending: false,
        },
        ..good[1].clone()
    };
    for bad in [relative, long_tag] {
        assert!(encode_file_records(std::slice::from_ref(&bad)).is_err());
        assert!(encode_file_record(&bad).is_err());
        // Encoded past the checks, the decoder refuses it too.
        let raw = encode_archive(&vec![bad.clone()]).unwrap();
        assert!(matches!(
            decode_file_records(&raw),
            Err(FrameError::Limit(_))
        ));
    }
    let oversized = vec![0u8; MAX_RECORDS_PAYLOAD as usize + 1];
    assert!(matches!(
        decode_file_records(&oversized),
        Err(FrameError::Limit(_))
    ));
}

// -- payload record: Hot ---------------------------------------------------

/// `HotReport { shard: 2, files: [HotFile { file_id: 5, path: "/m/w", bytes:
/// 6, bytes_error: 7, reads: 8 }], pages: [HotPage { key: (5, 9), reads: 10,
/// reads_error: 11, spread: 3 }], mounts: [MountBytes { prefix: "/m", usd_per_tb: 1.5,
/// cache_bytes: 12, store_bytes: 13 }] }`.
fn golden_hot_report() -> HotReport {
    HotReport {
        shard: 2,
        files: vec![HotFile {
            file_id: FileId::from_u128(5),
            path: "/m/w".into(),
            bytes: 6,
            bytes_error: 7,
            reads: 8,
        }],
        pages: vec![HotPage {
            key: Key {
                file_id: FileId::from_u128(5),
                page: 9,
            },
            reads: 10,
            reads_error: 11,
            spread: 3,
        }],
        mounts: vec![MountBytes {
            prefix: "/m".into(),
            usd_per_tb: 1.5,
            cache_bytes: 12,
            store_bytes: 13,
        }],
    }
}

/// A report at every limit: the most files (each with the longest path), pages
/// and mounts (their prefixes taking the whole mount table allowance).
fn largest_hot_report() -> HotReport {
    HotReport {
        shard: u16::MAX,
        files: (0..MAX_HOT_FILES as u128)
            .map(|i| HotFile {
                file_id: FileId::from_u128(i),
                path: "p".repeat(MAX_PATH_LEN),
                bytes: u64::MAX,
                bytes_error: u64::MAX,
                reads: u64::MAX,
            })
            .collect(),
        pages: (0..MAX_HOT_PAGES as u64)
            .map(|i| HotPage {
                key: key(i),
                reads: u64::MAX,
                reads_error: u64::MAX,
                spread: u8::MAX,
            })
            .collect(),
        mounts: (0..MAX_MOUNTS)
            .map(|i| MountBytes {
                prefix: format!(
                    "/{i:03}{}",
                    "m".repeat(MAX_MOUNT_TABLE_BYTES / MAX_MOUNTS - 4)
                ),
                usd_per_tb: f64::MAX,
                cache_bytes: u64::MAX,
                store_bytes: u64::MAX,
            })
            .collect(),
    }
}

/// The archive of [`golden_hot_report`]: the file (48 bytes: file id hi, lo,
/// the inline path, bytes, bytes_error, reads), the page (48 bytes: key,
/// reads, reads_error, spread and 7 bytes of padding), the mount (32 bytes:
/// the inline prefix, the price as an f64, cache_bytes, store_bytes), then
/// the 28-byte root at 128: shard, 2 bytes of padding, and the three vectors
/// (relative pointer -132, -92, -52 to offsets 0, 48, 96; one element each).
const GOLDEN_HOT_REPORT: &str = "\
    00000000000000000500000000000000\
    2f6d2f77ffffffff0600000000000000\
    07000000000000000800000000000000\
    00000000000000000500000000000000\
    09000000000000000a00000000000000\
    0b000000000000000300000000000000\
    2f6dffffffffffff000000000000f83f\
    0c000000000000000d00000000000000\
    020000007cffffff01000000a4ffffff\
    01000000ccffffff01000000";

#[test]
fn golden_hot_payload() {
    let bytes = encode_hot_report(&golden_hot_report()).unwrap();
    assert_eq!(hex(&bytes), hex(&unhex(GOLDEN_HOT_REPORT)));
    assert_eq!(
        decode_hot_report(&unhex(GOLDEN_HOT_REPORT)).unwrap(),
        golden_hot_report()
    );
    // An empty report: the root alone, its vectors pointing at themselves.
    let empty = encode_hot_report(&HotReport::default()).unwrap();
    assert_eq!(empty.len(), 28);
    assert!(decode_hot_report(&empty).unwrap().files.is_empty());
}

#[test]
fn hot_report_limits_hold_on_both_sides() {
    // The largest report fits the payload limit, and a Hot answer carries it.
    let largest = largest_hot_report();
    let bytes = encode_hot_report(&largest).unwrap();
    assert!(bytes.len() <= MAX_HOT_PAYLOAD as usize, "{}", bytes.len());
    // "about 160 KB" in docs/PROTOCOL.md.
    assert!((150_000..170_000).contains(&bytes.len()), "{}", bytes.len());
    assert_eq!(decode_hot_report(&bytes).unwrap(), largest);
    let resp = Response {
        request_id: 1,
        body: ResponseBody::Hot,
    };
    assert!(encode_response(&resp, bytes.len() as u32, &mut Vec::new()).is_ok());
    let err = decode_response_frame(&raw_response_frame(&resp, MAX_HOT_PAYLOAD + 1))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, FrameError::Limit(_)), "{err}");
    // A Hot request carries nothing.
    let req = Request {
        request_id: 1,
        body: RequestBody::Hot,
    };
    assert!(encode_request(&req, 1, &mut Vec::new()).is_err());

    // One past each limit: refused by the encoder, and by the decoder when a
    // peer archives it anyway.
    let mut over = Vec::new();
    let mut r = golden_hot_report();
    r.files = vec![r.files[0].clone(); MAX_HOT_FILES + 1];
    over.push(r);
    let mut r = golden_hot_report();
    r.pages = vec![r.pages[0]; MAX_HOT_PAGES + 1];
    over.push(r);
    let mut r = golden_hot_report();
    r.mounts = vec![r.mounts[0].clone(); MAX_MOUNTS + 1];
    over.push(r);
    let mut r = golden_hot_report();
    r.files[0].path = "p".repeat(MAX_PATH_LEN + 1);
    over.push(r);
    let mut r = golden_hot_report();
    r.mounts[0].prefix = "m".repeat(MAX_PATH_LEN + 1);
    over.push(r);
    let mut r = largest_hot_report();
    r.mounts[0].prefix.push('m');
    over.push(r);
    for r in &over {
        let err = encode_hot_report(r).unwrap_err();
        assert!(matches!(err, FrameError::Limit(_)), "{err}");
        let raw = encode_archive(r).unwrap();
        let err = decode_hot_report(&raw).unwrap_err();
        assert!(matches!(err, FrameError::Limit(_)), "{err}");
    }
    // Prices must be finite and not negative.
    for price in [f64::NAN, f64::INFINITY, -1.0] {
        let mut r = golden_hot_report();
        r.mounts[0].usd_per_tb = price;
        assert!(matches!(
            encode_hot_report(&r).unwrap_err(),
            FrameError::Mismatch(_)
        ));
        let raw = encode_archive(&r).unwrap();
        assert!(matches!(
            decode_hot_report(&raw).unwrap_err(),
            FrameError::Mismatch(_)
        ));
    }
    // Too large to be a report, however valid: refused before validation.
    let huge = vec![0u8; MAX_HOT_PAYLOAD as usize + 1];
    assert!(matches!(
        decode_hot_report(&huge).unwrap_err(),
        FrameError::Limit(_)
    ));
}

#[test]
fn malformed_file_records_are_errors() {
    let bytes = encode_file_records(&sample_file_records()).unwrap();
    for cut in [1, 7, bytes.len() / 2, bytes.len() - 1] {
        assert!(decode_file_records(&bytes[..cut]).is_err(), "cut {cut}");
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        let mut b = bytes.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % b.len();
            b[i] ^= 1 << (x >> 61);
        }
        // Never a panic; what decodes is valid.
        if let Ok(records) = decode_file_records(&b) {
            for r in &records {
                r.validate().unwrap();
            }
        }
    }
}

#[test]
fn record_order_ranks_commits_seals_and_flushes() {
    let base = sample_file_records()[0].clone();
    let with_state = |state| FileRecord {
        entry: match &base.entry {
            RecordEntry::File {
                version_tag,
                size,
                mtime_ns,
                store_tag,
                transient,
                ..
            } => RecordEntry::File {
                version_tag: version_tag.clone(),
                size: *size,
                mtime_ns: *mtime_ns,
                state,
                store_tag: store_tag.clone(),
                transient: *transient,
                attrs: Vec::new(),
            },
            _ => unreachable!(),
        },
        ..base.clone()
    };
    let open = with_state(RecordState::Open).order();
    let last = with_state(RecordState::Final).order();
    let sealed = with_state(RecordState::Sealed).order();
    let clean = with_state(RecordState::Clean).order();
    assert_eq!(open, last);
    assert!(last < sealed && sealed < clean);
    // A later change beats every step of an earlier one; the origin breaks ties.
    let later = FileRecord {
        hlc: base.hlc + 1,
        ..with_state(RecordState::Open)
    };
    assert!(later.order() > clean);
    let other_origin = FileRecord {
        origin: FileId::from_u128(9),
        ..base.clone()
    };
    assert!(other_origin.order() > base.order());
    let deleted = |pending| FileRecord {
        entry: RecordEntry::Deleted {
            prev_tag: String::new(),
            pending,
        },
        ..base.clone()
    };
    assert!(deleted(false).order() > deleted(true).order());
}

#[test]
fn write_back_requests_keep_their_limits() {
    let long_path = "p".repeat(MAX_PATH_LEN + 1);
    let cases: Vec<(RequestBody, u32)> = vec![
        (
            RequestBody::WriteDirty {
                key: key(0),
                version_tag: "v".into(),
                len: 10,
                epoch: 0,
                since: 0,
            },
            9,
        ),
        (
            RequestBody::WriteDirty {
                key: key(0),
                version_tag: "v".repeat(MAX_VERSION_TAG_LEN + 1),
                len: 0,
                epoch: 0,
                since: 0,
            },
            0,
        ),
        (
            RequestBody::Discard {
                version_tag: "v".repeat(MAX_VERSION_TAG_LEN + 1),
            },
            0,
        ),
        (
            RequestBody::Discard {
                version_tag: "v".into(),
            },
            4,
        ),
        (
            RequestBody::Renew {
                version_tag: "v".repeat(MAX_VERSION_TAG_LEN + 1),
            },
            0,
        ),
        (
            RequestBody::Renew {
                version_tag: "v".into(),
            },
            4,
        ),
        (
            RequestBody::Change {
                op: ChangeOp::Rename {
                    from: "/a".into(),
                    to: long_path.clone(),
                    replace: false,
                },
            },
            0,
        ),
        (
            RequestBody::Change {
                op: ChangeOp::Delete {
                    path: "/a".into(),
                    dir: false,
                    expect: Expect::Any,
                },
            },
            1,
        ),
        (RequestBody::Replicate, MAX_RECORDS_PAYLOAD + 1),
        (
            RequestBody::PullRecords {
                after: long_path.clone(),
            },
            0,
        ),
        (RequestBody::RecordsOf { paths: vec![] }, 0),
        (
            RequestBody::RecordsOf {
                paths: vec!["/a".into(); MAX_RECORDS_OF + 1],
            },
            0,
        ),
        (
            RequestBody::RecordsOf {
                paths: vec!["/a".into(), long_path.clone()],
            },
            0,
        ),
        (
            RequestBody::RecordsOf {
                paths: vec!["/a".into()],
            },
            1,
        ),
        (
            RequestBody::RecordsIn {
                dir: long_path.clone(),
                after: String::new(),
                digest: 0,
            },
            0,
        ),
        (
            RequestBody::RecordsIn {
                dir: "/a".into(),
                after: "n".repeat(MAX_NAME_LEN + 1),
                digest: 0,
            },
            0,
        ),
        (
            RequestBody::RecordsIn {
                dir: "/a".into(),
                after: String::new(),
                digest: 0,
            },
            1,
        ),
        (
            RequestBody::FilePages {
                file_id: FILE_A,
                action: PageAction::Seal,
            },
            4,
        ),
    ];
    for (body, payload_len) in cases {
        let req = Request {
            request_id: 1,
            body,
        };
        assert!(
            encode_request(&req, payload_len, &mut Vec::new()).is_err(),
            "{req:?}"
        );
        if payload_len <= MAX_PAYLOAD {
            let frame = raw_request_frame(&req, payload_len);
            let err = decode_request_frame(&frame).map(|_| ()).unwrap_err();
            assert!(
                matches!(err, FrameError::Limit(_) | FrameError::Mismatch(_)),
                "{req:?}: {err}"
            );
        }
    }
}

/// The layout of a `FileRecord` stated in docs/PROTOCOL.md: its root is the last 88 bytes of
/// its archive.
#[test]
fn documented_file_record_layout() {
    let rec = |entry| FileRecord {
        path: "/p".into(),
        hlc: 0x0102_0304,
        origin: FILE_A,
        entry,
    };
    // (offset in the root, width, value)
    type Fields = Vec<(usize, usize, u64)>;
    let cases: Vec<(FileRecord, Fields)> = vec![
        (
            rec(RecordEntry::File {
                version_tag: "v".into(),
                size: 9,
                mtime_ns: -1,
                state: RecordState::Sealed,
                store_tag: "s".into(),
                transient: true,
                attrs: Vec::new(),
            }),
            vec![
                (0, 2, u64::from(u16::from_le_bytes(*b"/p"))),
                (8, 8, 0x0102_0304),
                (16, 8, FILE_A.hi),
                (24, 8, FILE_A.lo),
                (32, 1, 0),
                (36, 1, u64::from(b'v')),
                (48, 8, 9),
                (56, 8, u64::MAX),
                (64, 1, 2),
                (68, 1, u64::from(b's')),
                (76, 1, 1),
                (84, 4, 0),
            ],
        ),
        (
            rec(RecordEntry::Dir { mtime_ns: 5 }),
            vec![(32, 1, 1), (40, 8, 5)],
        ),
        (
            rec(RecordEntry::Deleted {
                prev_tag: "t".into(),
                pending: true,
            }),
            vec![(32, 1, 2), (36, 1, u64::from(b't')), (44, 1, 1)],
        ),
    ];
    for (r, fields) in cases {
        let bytes = encode_file_record(&r).unwrap();
        let root = &bytes[bytes.len() - 88..];
        for (at, width, value) in fields {
            assert_eq!(le(root, at, width), value, "{r:?} at {at}");
        }
    }
}

#[test]
fn malformed_hot_reports_are_errors() {
    let bytes = encode_hot_report(&golden_hot_report()).unwrap();
    for end in 0..bytes.len() {
        assert!(decode_hot_report(&bytes[..end]).is_err(), "cut at {end}");
    }
    // A vector that claims more elements than the payload holds.
    let root = bytes.len() - std::mem::size_of::<ArchivedHotReport>();
    for at in [8, 16, 24] {
        let mut bad = bytes.clone();
        bad[root + at..root + at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decode_hot_report(&bad).is_err(), "at {at}");
    }
    // A path pointing out of the payload.
    let mut bad = bytes.clone();
    bad[16..20].copy_from_slice(&0x8000_0000u32.to_le_bytes());
    assert!(decode_hot_report(&bad).is_err());
    for bad in [&[][..], &[0u8; 7][..], b"{\"shard\":1}"] {
        assert!(decode_hot_report(bad).is_err(), "{bad:?}");
    }
}

fn arb_hot_report() -> impl Strategy<Value = HotReport> {
    (
        any::<u16>(),
        proptest::collection::vec(
            (
                arb_file_id(),
                arb_string(120),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
            )
                .prop_map(|(file_id, path, bytes, bytes_error, reads)| HotFile {
                    file_id,
                    path,
                    bytes,
                    bytes_error,
                    reads,
                }),
            0..=MAX_HOT_FILES,
        ),
        proptest::collection::vec(
            (arb_key(), any::<u64>(), any::<u64>(), any::<u8>()).prop_map(
                |(key, reads, reads_error, spread)| HotPage {
                    key,
                    reads,
                    reads_error,
                    spread,
                },
            ),
            0..=MAX_HOT_PAGES,
        ),
        proptest::collection::vec(
            (arb_string(40), 0f64..1e6, any::<u64>(), any::<u64>()).prop_map(
                |(prefix, usd_per_tb, cache_bytes, store_bytes)| MountBytes {
                    prefix,
                    usd_per_tb,
                    cache_bytes,
                    store_bytes,
                },
            ),
            0..=8,
        ),
    )
        .prop_map(|(shard, files, pages, mounts)| HotReport {
            shard,
            files,
            pages,
            mounts,
        })
}

// -- LoadFiles ----------------------------------------------------------

/// A file of `LoadFiles` with strings of the given lengths and `pages` page
/// indices.
fn load_file(path_len: usize, tag_len: usize, mount_len: usize, pages: usize) -> LoadFile {
    LoadFile {
        file: FileRef {
            file_id: FILE_A,
            mount: "m".repeat(mount_len),
            path: "p".repeat(path_len),
            version_tag: "v".repeat(tag_len),
            size: u64::MAX,
        },
        pages: (0..pages as u64).collect(),
    }
}

#[test]
fn load_files_limits_hold_on_both_sides() {
    let limit = |e: &FrameError| matches!(e, FrameError::Limit(_));
    let too_many_files = RequestBody::LoadFiles {
        files: vec![load_file(4, 4, 0, 1); MAX_LOAD_FILES + 1],
        epoch: 0,
    };
    let too_many_pages = RequestBody::LoadFiles {
        files: vec![
            load_file(4, 4, 0, MAX_LOAD_PAGES / 2),
            load_file(4, 4, 0, MAX_LOAD_PAGES / 2 + 1),
        ],
        epoch: 0,
    };
    let long_path = RequestBody::LoadFiles {
        files: vec![load_file(4, 4, 0, 1), load_file(MAX_PATH_LEN + 1, 4, 0, 1)],
        epoch: 0,
    };
    let long_tag = RequestBody::LoadFiles {
        files: vec![load_file(4, MAX_VERSION_TAG_LEN + 1, 0, 1)],
        epoch: 0,
    };
    let long_mount = RequestBody::LoadFiles {
        files: vec![load_file(4, 4, MAX_MOUNT_LEN + 1, 1)],
        epoch: 0,
    };
    for body in [
        too_many_files,
        too_many_pages,
        long_path,
        long_tag,
        long_mount,
    ] {
        let req = Request {
            request_id: 1,
            body,
        };
        let err = encode_request(&req, 0, &mut Vec::new()).unwrap_err();
        assert!(limit(&err), "encode: {err}");
        assert_eq!(err.error_code(), ErrorCode::TooLarge);
        let err = decode_request_frame(&raw_request_frame(&req, 0))
            .map(|_| ())
            .unwrap_err();
        assert!(limit(&err), "decode: {err}");
    }
    // A payload is never allowed.
    let req = Request {
        request_id: 1,
        body: RequestBody::LoadFiles {
            files: vec![load_file(4, 4, 0, 1)],
            epoch: 0,
        },
    };
    let err = encode_request(&req, 1, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, FrameError::Mismatch(_)), "{err}");
    // At the limits it is fine: MAX_LOAD_FILES files, MAX_LOAD_PAGES pages.
    let mut files = vec![load_file(4, 4, 0, 0); MAX_LOAD_FILES];
    files[0].pages = (0..MAX_LOAD_PAGES as u64).collect();
    let req = Request {
        request_id: 1,
        body: RequestBody::LoadFiles { files, epoch: 0 },
    };
    assert_eq!(decode_request_frame(&request_frame(&req)).unwrap().0, req);

    let failed = |message: String| FileOutcome::Failed {
        code: ErrorCode::Io,
        loaded: 1,
        message,
    };
    for outcomes in [
        vec![FileOutcome::Loaded { pages: 1, bytes: 1 }; MAX_LOAD_FILES + 1],
        vec![failed("x".repeat(MAX_OUTCOME_MESSAGE_LEN + 1))],
    ] {
        let resp = Response {
            request_id: 1,
            body: ResponseBody::FilesLoaded { outcomes },
        };
        let err = encode_response(&resp, 0, &mut Vec::new()).unwrap_err();
        assert!(limit(&err), "encode: {err}");
        let err = decode_response_frame(&raw_response_frame(&resp, 0))
            .map(|_| ())
            .unwrap_err();
        assert!(limit(&err), "decode: {err}");
    }
    // The largest answer fits one header: every file failed with the longest message.
    let resp = Response {
        request_id: u64::MAX,
        body: ResponseBody::FilesLoaded {
            outcomes: vec![failed("é".repeat(MAX_OUTCOME_MESSAGE_LEN / 2)); MAX_LOAD_FILES],
        },
    };
    let frame = response_frame(&resp);
    assert!(frame.len() - PREAMBLE_LEN <= MAX_HEADER as usize);
    assert_eq!(decode_response_frame(&frame).unwrap().0, resp);
}

#[test]
fn load_files_filled_to_the_header_budget_encode() {
    // Whatever the strings and page counts, a request filled by `header_cost` up to the
    // budget (and within the count limits) encodes: the cost never underestimates.
    let shapes = [
        (MAX_PATH_LEN, MAX_VERSION_TAG_LEN, MAX_MOUNT_LEN, 0),
        (9, 9, 9, 1),
        (8, 8, 8, 1),
        (40, 44, 0, 1),
        (100, 20, 0, 16),
        (12, 3, 0, 300),
        (1, 1, 1, 0),
    ];
    for (path, tag, mount, pages) in shapes {
        let one = load_file(path, tag, mount, pages);
        let mut files = Vec::new();
        let (mut cost, mut n_pages) = (0, 0);
        while files.len() < MAX_LOAD_FILES
            && cost + one.header_cost() <= LOAD_FILES_HEADER_BUDGET
            && n_pages + one.pages.len() <= MAX_LOAD_PAGES
        {
            cost += one.header_cost();
            n_pages += one.pages.len();
            files.push(one.clone());
        }
        let req = Request {
            request_id: u64::MAX,
            body: RequestBody::LoadFiles {
                files,
                epoch: u64::MAX,
            },
        };
        let mut out = Vec::new();
        encode_request(&req, 0, &mut out)
            .unwrap_or_else(|e| panic!("{path}/{tag}/{mount}/{pages}: {e}"));
        let header = out.len() - PREAMBLE_LEN;
        assert!(header <= MAX_HEADER as usize);
        assert!(
            header <= cost + 1024,
            "{path}/{tag}/{mount}/{pages}: header {header}, estimated {cost}"
        );
    }
}

#[test]
fn load_files_answers() {
    let req = RequestBody::LoadFiles {
        files: vec![load_file(4, 4, 0, 1), load_file(5, 4, 0, 2)],
        epoch: 1,
    };
    let two = ResponseBody::FilesLoaded {
        outcomes: vec![FileOutcome::Loaded { pages: 1, bytes: 1 }; 2],
    };
    let one = ResponseBody::FilesLoaded {
        outcomes: vec![FileOutcome::Loaded { pages: 1, bytes: 1 }],
    };
    assert!(two.answers(&req));
    assert!(!one.answers(&req));
    assert!(ResponseBody::NotOwner { epoch: 3 }.answers(&req));
    assert!(!ResponseBody::Loaded { pages: 1, bytes: 1 }.answers(&req));
    assert!(!two.answers(&RequestBody::LoadPages {
        file: file_ref(),
        pages: vec![0],
        epoch: 1
    }));
}

#[test]
fn load_files_layouts_are_as_documented() {
    use std::mem::{align_of, size_of};
    assert_eq!(
        (
            size_of::<ArchivedLoadFile>(),
            align_of::<ArchivedLoadFile>()
        ),
        (56, 8)
    );
    assert_eq!(
        (
            size_of::<ArchivedFileOutcome>(),
            align_of::<ArchivedFileOutcome>()
        ),
        (16, 8)
    );
    // The request and answer roots keep their sizes: nothing earlier moved.
    assert_eq!(size_of::<ArchivedRequest>(), 96);
    assert_eq!(size_of::<ArchivedResponse>(), 80);
}

/// `Request { request_id: 9, body: LoadFiles { files: [LoadFile { file:
/// FileRef { file_id: FILE_A, mount: "", path: "/d/x", version_tag: "v1",
/// size: 3 }, pages: [0] }], epoch: 7 } }`. header_len 160, no front
/// padding: the page index (header 0-7), the 56-byte `LoadFile` (8-63, its
/// pages pointer -56 leads from header 56 to 0), the root (64-159, its files
/// pointer -68 from header 76 to 8).
const GOLDEN_LOAD_FILES: &str = "\
    5053544610000100a000000000000000\
    00000000000000001817161514131211\
    2827262524232221ffffffffffffffff\
    2f642f78ffffffff7631ffffffffffff\
    0300000000000000c8ffffff01000000\
    090000000000000016000000bcffffff\
    01000000000000000700000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000";

/// `Response { request_id: 9, body: FilesLoaded { outcomes: [Loaded {
/// pages: 1, bytes: 3 }, Failed { code: NotFound, loaded: 0, message:
/// "gone" }] } }`. header_len 112: the two 16-byte outcomes (header 0-31),
/// then the root (32-111), whose pointer -44 leads from header 44 to 0.
const GOLDEN_FILES_LOADED: &str = "\
    50535446100002007000000000000000\
    00000000010000000300000000000000\
    0103000000000000676f6e65ffffffff\
    090000000000000014000000d4ffffff\
    02000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000\
    00000000000000000000000000000000";

#[test]
fn golden_load_files() {
    let req = Request {
        request_id: 9,
        body: RequestBody::LoadFiles {
            files: vec![LoadFile {
                file: FileRef {
                    file_id: FILE_A,
                    mount: String::new(),
                    path: "/d/x".into(),
                    version_tag: "v1".into(),
                    size: 3,
                },
                pages: vec![0],
            }],
            epoch: 7,
        },
    };
    let mut out = Vec::new();
    encode_request(&req, 0, &mut out).unwrap();
    assert_eq!(hex(&out), hex(&unhex(GOLDEN_LOAD_FILES)));
    assert_eq!(
        decode_request_frame(&unhex(GOLDEN_LOAD_FILES)).unwrap().0,
        req
    );
    let resp = Response {
        request_id: 9,
        body: ResponseBody::FilesLoaded {
            outcomes: vec![
                FileOutcome::Loaded { pages: 1, bytes: 3 },
                FileOutcome::Failed {
                    code: ErrorCode::NotFound,
                    loaded: 0,
                    message: "gone".into(),
                },
            ],
        },
    };
    let mut out = Vec::new();
    encode_response(&resp, 0, &mut out).unwrap();
    assert_eq!(hex(&out), hex(&unhex(GOLDEN_FILES_LOADED)));
    assert_eq!(
        decode_response_frame(&unhex(GOLDEN_FILES_LOADED))
            .unwrap()
            .0,
        resp
    );
}
