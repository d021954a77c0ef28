//! The page service a shard runs behind its QUIC endpoint: decodes request frames, checks ring
//! ownership, runs the request on the shard's engine (local API, same core) and encodes the reply.

use std::{cell::RefCell, future::Future, pin::Pin, rc::Rc, sync::Arc};

use pagestore_engine::{EngineError, PageKey, Shard};

use crate::{
    endpoint::{Body, Reply, Service},
    frame::{self, ErrorCode, FrameError, Key, PageStatus, RequestBody, Response, ResponseBody},
    ring::{MemberId, Ring},
};

/// One shard's view of the ring: which member it is, and the ring it believes in.
pub struct RingView {
    /// This shard's ring identity.
    pub me: MemberId,
    /// The current ring; replaced when membership changes.
    pub ring: RefCell<Arc<Ring>>,
}

impl RingView {
    /// Whether this shard owns `key` under its view. An empty ring owns nothing and everything:
    /// a stand-alone node serves every key.
    pub fn owns(&self, key: &Key) -> bool {
        let ring = self.ring.borrow();
        match ring.owner(key.file_id.as_u128(), key.page) {
            Some(m) => m == self.me,
            None => true,
        }
    }

    /// The ring epoch this shard believes in.
    pub fn epoch(&self) -> u64 {
        self.ring.borrow().epoch()
    }
}

/// The service: one per shard.
pub struct ShardService {
    shard: Rc<Shard>,
    view: Rc<RingView>,
}

impl ShardService {
    /// A service for `shard` with ring view `view`.
    pub fn new(shard: Rc<Shard>, view: Rc<RingView>) -> Rc<ShardService> {
        Rc::new(ShardService { shard, view })
    }
}

fn reply(request_id: u64, body: ResponseBody, payload: Body) -> Reply {
    let len = match &payload {
        Body::Empty => 0,
        Body::Bytes(b) => b.len(),
        Body::Page(p) => p.len(),
    };
    let response = Response { request_id, body };
    let mut head = Vec::with_capacity(128);
    match frame::encode_response(&response, len as u32, &mut head) {
        Ok(()) => Reply {
            head,
            body: payload,
        },
        Err(e) => {
            // Only a bug can get here (our own response breaking a limit): say so, send nothing.
            tracing::error!(error = %e, "encoding a response failed");
            let mut head = Vec::new();
            let err = Response {
                request_id,
                body: ResponseBody::Error {
                    code: ErrorCode::Internal,
                    message: "response encoding failed".into(),
                },
            };
            let _ = frame::encode_response(&err, 0, &mut head);
            Reply {
                head,
                body: Body::Empty,
            }
        }
    }
}

fn error(request_id: u64, code: ErrorCode, message: impl Into<String>) -> Reply {
    let mut message = message.into();
    if message.len() > frame::MAX_MESSAGE_LEN {
        let mut end = frame::MAX_MESSAGE_LEN;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    reply(
        request_id,
        ResponseBody::Error { code, message },
        Body::Empty,
    )
}

fn engine_error(request_id: u64, e: &EngineError) -> Reply {
    let code = match e {
        EngineError::BadRange { .. } => ErrorCode::BadRange,
        EngineError::PageTooLarge { .. } | EngineError::BufferTooShort { .. } => {
            ErrorCode::TooLarge
        }
        EngineError::CacheFull => ErrorCode::Full,
        EngineError::ShardGone => ErrorCode::Unavailable,
        EngineError::Io { .. } => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    error(request_id, code, e.to_string())
}

fn page_key(k: &Key) -> PageKey {
    PageKey::new(k.file_id.as_u128(), k.page)
}

impl Service for ShardService {
    fn call(self: Rc<Self>, request: Vec<u8>) -> Pin<Box<dyn Future<Output = Reply>>> {
        Box::pin(async move { self.handle(&request).await })
    }
}

impl ShardService {
    async fn handle(&self, raw: &[u8]) -> Reply {
        let (req, payload) = match frame::decode_request_frame(raw) {
            Ok(x) => x,
            Err(e) => return bad_frame(&e),
        };
        let id = req.request_id;
        let payload = &raw[payload];
        let not_owner = || {
            reply(
                id,
                ResponseBody::NotOwner {
                    epoch: self.view.epoch(),
                },
                Body::Empty,
            )
        };
        match req.body {
            RequestBody::Ping { nonce } => reply(id, ResponseBody::Pong { nonce }, Body::Empty),
            RequestBody::RingEpoch => reply(
                id,
                ResponseBody::Epoch {
                    epoch: self.view.epoch(),
                },
                Body::Empty,
            ),
            RequestBody::Stat => {
                let s = self.shard.stats();
                let body = ResponseBody::Stat {
                    shard: s.shard as u16,
                    pages: s.pages,
                    bytes: s.bytes,
                    capacity_bytes: s.capacity_bytes,
                    hits: s.hits,
                    misses: s.misses,
                };
                reply(id, body, Body::Empty)
            }
            RequestBody::ReadRange {
                key, offset, len, ..
            } => {
                if !self.view.owns(&key) {
                    return not_owner();
                }
                match self.shard.read(&page_key(&key), offset, len).await {
                    Ok(Some((data, info))) => reply(
                        id,
                        ResponseBody::Data {
                            page_len: info.len,
                            version: info.version,
                        },
                        Body::Page(data),
                    ),
                    Ok(None) => reply(id, ResponseBody::Miss, Body::Empty),
                    Err(e) => engine_error(id, &e),
                }
            }
            RequestBody::ReadPages { pages, .. } => {
                let mut entries = Vec::with_capacity(pages.len());
                let mut body = Vec::new();
                for key in &pages {
                    if !self.view.owns(key) {
                        entries.push(PageStatus::NotOwner);
                        continue;
                    }
                    match self.shard.get(&page_key(key), 0, u32::MAX).await {
                        Ok(Some(data)) => {
                            if body.len() + data.len() > frame::MAX_PAYLOAD as usize {
                                return error(
                                    id,
                                    ErrorCode::TooLarge,
                                    "the pages asked for exceed one response; ask for fewer",
                                );
                            }
                            entries.push(PageStatus::Data {
                                len: data.len() as u32,
                            });
                            body.extend_from_slice(&data);
                        }
                        Ok(None) => entries.push(PageStatus::Miss),
                        Err(e) => return engine_error(id, &e),
                    }
                }
                reply(id, ResponseBody::Pages { entries }, Body::Bytes(body))
            }
            RequestBody::WritePage { key, version, .. } => {
                if !self.view.owns(&key) {
                    return not_owner();
                }
                match self.shard.put(&page_key(&key), payload, version).await {
                    Ok(_) => reply(id, ResponseBody::Written, Body::Empty),
                    Err(e) => engine_error(id, &e),
                }
            }
            RequestBody::RemoveFile { file_id, .. } => {
                match self.shard.remove_file(file_id.as_u128()).await {
                    Ok(n) => reply(id, ResponseBody::Removed { pages: n as u32 }, Body::Empty),
                    Err(e) => engine_error(id, &e),
                }
            }
            RequestBody::LoadPages { .. } => error(
                id,
                ErrorCode::Unavailable,
                "this node has no under storage configured",
            ),
        }
    }
}

fn bad_frame(e: &FrameError) -> Reply {
    error(0, e.error_code(), e.peer_message())
}
