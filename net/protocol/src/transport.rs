//! QUIC transport settings shared by shard endpoints and clients, tuned for 4 MiB pages.
//!
//! quinn's defaults suit small messages (1.25 MB stream window, 100 streams, 1200-byte packets).
//! A page response is 4 MiB and a client keeps many in flight per connection, so the windows
//! hold several pages, and path MTU discovery may grow packets to jumbo size where the path
//! allows it (loopback, jumbo-frame networks); each GSO batch stays under 64 KiB.

use std::{sync::Arc, time::Duration};

use quinn_proto::{
    congestion::CubicConfig, EndpointConfig, MtuDiscoveryConfig, TransportConfig, VarInt,
};

/// Largest UDP payload MTU discovery may reach.
pub const MTU_UPPER_BOUND: u16 = 8952;
/// Bytes one connection may have in flight from a peer (all streams together).
pub const CONNECTION_WINDOW: u32 = 64 << 20;
/// Bytes one stream may have in flight: a whole page and its header.
pub const STREAM_WINDOW: u32 = 8 << 20;
/// Concurrent requests (bidirectional streams) per connection.
pub const MAX_STREAMS: u32 = 512;
/// A shard endpoint's receive window for a connection that holds no request bytes: the request
/// bytes a peer may have in flight beyond those the shard has taken (and charged) for it. The
/// endpoint widens each connection's window by the bytes it holds for it, so a large write
/// opens the window as it is read, and a peer that stops mid-request holds at most this much
/// in quinn-proto's buffers.
pub const SERVER_BASE_WINDOW: u32 = 128 << 10;

/// The transport configuration of clients (and of servers other than shard endpoints).
///
/// Streams are sent in the order they were written, not round-robin: a client's requests then
/// reach a shard one after another, so a shard that holds a connection to a bounded number of
/// request bytes always receives the whole of its oldest request first.
pub fn transport_config() -> Arc<TransportConfig> {
    Arc::new(base_config(CONNECTION_WINDOW, false))
}

/// The transport configuration of shard endpoints (set by [`crate::endpoint::start`]): a
/// connection starts with a receive window of [`SERVER_BASE_WINDOW`], which the endpoint widens
/// by the request bytes it holds for that connection; replies are sent round-robin.
pub fn server_transport_config() -> Arc<TransportConfig> {
    Arc::new(base_config(SERVER_BASE_WINDOW, true))
}

fn base_config(receive_window: u32, fair: bool) -> TransportConfig {
    let mut t = TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(VarInt::from_u32(receive_window))
        .send_window(CONNECTION_WINDOW as u64)
        .send_fairness(fair)
        .max_concurrent_bidi_streams(VarInt::from_u32(MAX_STREAMS))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .keep_alive_interval(Some(Duration::from_secs(3)))
        .max_idle_timeout(Some(VarInt::from_u32(10_000).into()));
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(MTU_UPPER_BOUND);
    t.mtu_discovery_config(Some(mtu));
    // With large packets the default initial window (about 14 KB) would hold barely one.
    let mut cubic = CubicConfig::default();
    cubic.initial_window(10 * MTU_UPPER_BOUND as u64);
    t.congestion_controller_factory(Arc::new(cubic));
    t
}

/// Segments per GSO batch for a connection whose current MTU is `mtu`: at most 10, and the batch
/// stays under 64 KiB (the kernel refuses larger ones, and a refused batch looks like a path
/// that drops large packets).
pub fn gso_segments(mtu: u16, socket_max: usize) -> usize {
    (65_000 / mtu.max(1) as usize)
        .clamp(1, 10)
        .min(socket_max.max(1))
}

/// The endpoint configuration used on both sides. It advertises that this endpoint accepts UDP
/// payloads up to [`MTU_UPPER_BOUND`]: quinn's default (1472) would stop the peer's MTU
/// discovery at Ethernet size even on loopback or jumbo-frame networks.
pub fn endpoint_config() -> EndpointConfig {
    let mut c = EndpointConfig::default();
    // MTU_UPPER_BOUND is within the allowed range (1200..=65527), so this cannot fail.
    let _ = c.max_udp_payload_size(MTU_UPPER_BOUND);
    c
}
