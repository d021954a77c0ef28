//! Ring lookups and frame encode/validate, each against a reference measured in the same run.

#[path = "timing.rs"]
mod timing;

use std::{collections::HashMap, hint::black_box};

use pagestore_protocol::{
    frame::{self, FileId, Key, Request, RequestBody},
    ring::{MemberId, Ring, RingConfig},
};
use timing::{ns_per_op, row, Rng};

fn main() {
    // Ring: 1,000 nodes x 16 shards, the sizing question.
    let members = (0..1000u128).flat_map(|n| {
        (0..16u16).map(move |shard| MemberId {
            node: n * 7919 + 1,
            shard,
        })
    });
    let ring = Ring::new(members, RingConfig::default(), 1).expect("valid ring");
    let mut rng = Rng(5);
    let keys: Vec<(u128, u64)> = (0..4096)
        .map(|_| (rng.next_u64() as u128, rng.next_u64() % 1_000_000))
        .collect();
    let map: HashMap<(u128, u64), u32> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, i as u32))
        .collect();
    let lookup = ns_per_op(keys.len() as u64, || {
        for (f, p) in &keys {
            black_box(ring.owner(black_box(*f), black_box(*p)));
        }
    });
    let reference = ns_per_op(keys.len() as u64, || {
        for k in &keys {
            black_box(map.get(black_box(k)));
        }
    });
    row(
        "ring owner, 1000 nodes x 16 shards",
        lookup,
        "HashMap::get",
        reference,
    );
    println!("{:<44} {:>9.2} M lookups/s", "  ring lookups", 1e3 / lookup);

    // Frames: encode a ReadRange request, then validate (bytecheck) and decode it.
    let req = Request {
        request_id: 7,
        body: RequestBody::ReadRange {
            key: Key {
                file_id: FileId::from_u128(0xABCD),
                page: 3,
            },
            offset: 0,
            len: 4 << 20,
            epoch: 9,
        },
    };
    let mut buf = Vec::with_capacity(256);
    let encode = ns_per_op(1000, || {
        for _ in 0..1000 {
            buf.clear();
            frame::encode_request(black_box(&req), 0, &mut buf).expect("encodes");
        }
    });
    let decode = ns_per_op(1000, || {
        for _ in 0..1000 {
            black_box(frame::decode_request_frame(black_box(&buf)).expect("decodes"));
        }
    });
    let copy_ref = ns_per_op(1000, || {
        for _ in 0..1000 {
            black_box(black_box(&buf).to_vec());
        }
    });
    row(
        "frame encode (ReadRange)",
        encode,
        "copy of the frame bytes",
        copy_ref,
    );
    row(
        "frame validate + decode (ReadRange)",
        decode,
        "copy of the frame bytes",
        copy_ref,
    );
}
