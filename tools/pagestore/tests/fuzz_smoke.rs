//! A bounded smoke run of every fuzz target on stable Rust (CI has no nightly for
//! cargo-fuzz): each target's body (`fuzz/bodies.rs`) gets its seeds, then pseudo-random
//! mutations of them and random bytes, for about a second. A panic fails the test and prints
//! the input. The full fuzzers are in `fuzz/` (see fuzz/README.md).
#![allow(clippy::unwrap_used)]

#[path = "../../../fuzz/bodies.rs"]
mod bodies;

use std::time::{Duration, Instant};

use pagestore_protocol::frame::{
    encode_counters, encode_hot_report, encode_job_record, encode_job_records, encode_request,
    encode_response, FileId, HotFile, HotPage, HotReport, JobRecord, JobState, Key, MountBytes,
    Request, RequestBody, Response, ResponseBody, ShardCounters,
};

/// xorshift64*: deterministic, so that a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Fragments worth inserting: separators and the tokens the parsers look for.
const TOKENS: &[&[u8]] = &[
    b"\n",
    b"\n\n",
    b"\r\n",
    b":",
    b"/",
    b"%2e%2e",
    b"%25",
    b"..",
    b"#",
    b"{",
    b"}",
    b"\"path\":",
    b"bytes=",
    b"-",
    b",",
    b";chunk-signature=",
    b"0\r\n\r\n",
    b"AWS ",
    b"Signature=",
    b"X-Amz-Expires=",
    b"x-amz-checksum-sha256:",
    b"content-md5:",
    b"x-amz-trailer:",
    b"=",
    b"\0",
    b"\xff\xfe",
    b"18446744073709551615",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(6) {
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(i..i, t.iter().copied());
            }
            3 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = (a + rng.below(16)).min(v.len());
                v.drain(a..b);
            }
            4 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = (a + rng.below(64)).min(v.len());
                let piece: Vec<u8> = v[a..b].to_vec();
                let i = rng.below(v.len() + 1);
                v.splice(i..i, piece);
            }
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(v.len() + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            _ => {
                let n = rng.below(32);
                let i = rng.below(v.len() + 1);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(i..i, bytes);
            }
        }
    }
    v.truncate(1 << 16);
    v
}

/// Runs `target` on the seeds, then on mutations for `budget`; returns the inputs tried.
fn smoke(name: &str, target: fn(&[u8]), seeds: &[Vec<u8>], budget: Duration) -> usize {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
    let run = |input: &[u8]| {
        if let Err(p) = std::panic::catch_unwind(|| target(input)) {
            eprintln!(
                "{name}: panic on input ({} bytes): {:?}",
                input.len(),
                String::from_utf8_lossy(input)
            );
            std::panic::resume_unwind(p);
        }
    };
    for s in seeds {
        run(s);
    }
    let t0 = Instant::now();
    let mut n = seeds.len();
    while t0.elapsed() < budget {
        let input = if rng.below(8) == 0 {
            (0..rng.below(256)).map(|_| rng.next() as u8).collect()
        } else {
            mutate(&mut rng, seeds)
        };
        run(&input);
        n += 1;
    }
    eprintln!("{name}: {n} inputs in {:.1} s", t0.elapsed().as_secs_f64());
    n
}

const BUDGET: Duration = Duration::from_millis(1200);

#[test]
fn decode_frame_survives_mutated_frames() {
    let mut seeds = vec![Vec::new(), vec![0; 64]];
    for (i, body) in [
        RequestBody::Ping { nonce: 7 },
        RequestBody::RingEpoch,
        RequestBody::Stat,
    ]
    .into_iter()
    .enumerate()
    {
        let mut out = Vec::new();
        encode_request(
            &Request {
                request_id: i as u64,
                body,
            },
            0,
            &mut out,
        )
        .unwrap();
        seeds.push(out);
    }
    // Frames with a record as their payload.
    let (counters, record, records) = payload_seeds();
    let mut out = Vec::new();
    encode_request(
        &Request {
            request_id: 3,
            body: RequestBody::Jobs,
        },
        record.len() as u32,
        &mut out,
    )
    .unwrap();
    out.extend_from_slice(&record);
    seeds.push(out);
    let hot = hot_seed();
    for (body, payload) in [
        (ResponseBody::Counters, &counters),
        (ResponseBody::Jobs, &records),
        (ResponseBody::Hot, &hot),
    ] {
        let mut out = Vec::new();
        encode_response(
            &Response {
                request_id: 4,
                body,
            },
            payload.len() as u32,
            &mut out,
        )
        .unwrap();
        out.extend_from_slice(payload);
        seeds.push(out);
    }
    assert!(smoke("decode_frame", bodies::decode_frame, &seeds, BUDGET) > 100);
}

/// Payloads of a `Counters` answer, a `Jobs` request and a `Jobs` answer.
fn payload_seeds() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let counters = encode_counters(&ShardCounters {
        shard: 3,
        hits: 10,
        hit_bytes: 1 << 30,
        epoch: 7,
        ..ShardCounters::default()
    })
    .unwrap();
    let job = JobRecord {
        id: "load-1700000000-123-4567".into(),
        source: "manifest /data/manifest.jsonl".into(),
        client: "host-a:4567".into(),
        state: JobState::Failed,
        first_page_secs: Some(0.125),
        files_total: 12,
        files_failed: 1,
        ..JobRecord::default()
    };
    let record = encode_job_record(&job).unwrap();
    let short = JobRecord {
        id: "b".into(),
        ..JobRecord::default()
    };
    let records = encode_job_records(&[job, short]).unwrap();
    (counters, record, records)
}

/// The payload of a `Hot` answer: a file, a page and a priced mount.
fn hot_seed() -> Vec<u8> {
    encode_hot_report(&HotReport {
        shard: 1,
        files: vec![HotFile {
            file_id: FileId::from_u128(5),
            path: "/data/weights.bin".into(),
            bytes: 1 << 30,
            bytes_error: 4 << 20,
            reads: 256,
        }],
        pages: vec![HotPage {
            key: Key {
                file_id: FileId::from_u128(5),
                page: 3,
            },
            reads: 64,
            reads_error: 2,
            spread: 3,
        }],
        mounts: vec![MountBytes {
            prefix: "/data".into(),
            usd_per_tb: 90.0,
            cache_bytes: 1 << 30,
            store_bytes: 4 << 20,
        }],
    })
    .unwrap()
}

#[test]
fn decode_payload_survives_mutated_payloads() {
    let (counters, record, records) = payload_seeds();
    let seeds = vec![
        Vec::new(),
        vec![0; 128],
        counters,
        record,
        records,
        encode_job_records(&[]).unwrap(),
        hot_seed(),
        encode_hot_report(&HotReport::default()).unwrap(),
    ];
    assert!(smoke("decode_payload", bodies::decode_payload, &seeds, BUDGET) > 100);
}

#[test]
fn s3_request_checks_survive_mutated_requests() {
    let seeds: Vec<Vec<u8>> = [
        "GET /data/objs/a.bin\nrange: bytes=0-99\nauthorization: AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/s3/aws4_request\n\n",
        "GET /data/objs/a.bin?X-Amz-Expires=604801&X-Amz-Signature=00\n\n",
        "PUT /data/k\nauthorization: AWS key:c2ln\ndate: Sun, 06 Nov 1994 08:49:37 GMT\nx-amz-date: Sun, 06 Nov 1994 08:49:37 GMT\n\nbody",
        "GET /data/k?Signature=x&Expires=99999999999&AWSAccessKeyId=k\n\n",
        "PUT /data/%2e%2e/x\ncontent-md5: XUFAKrxLKna5cZ2REBfFkg==\nx-amz-checksum-sha256: LCa0a2j/xo/5m0U8HTBBNBNCLXBkg7+g+YpeiGJm564=\nx-amz-checksum-crc32: AAAAAA==\n\nhello",
        "PUT /data/c\nx-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD\nx-amz-decoded-content-length: 5\nx-amz-trailer: x-amz-checksum-crc32\n\n5;chunk-signature=ab\r\nhello\r\n0;chunk-signature=cd\r\n\r\n",
        "GET /data/big?list-type=2&continuation-token=k6162\nrange: bytes=-3\n\n",
        "HEAD /d/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\nrange: bytes=5-3,0-1\n\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    assert!(smoke("s3_request", bodies::s3_request, &seeds, BUDGET) > 100);
}

#[test]
fn manifest_parser_survives_mutated_manifests() {
    let seeds: Vec<Vec<u8>> = [
        "/data/a.bin\n/data/b.bin\n",
        "# comment\n\n  /data/x  \n",
        "{\"path\": \"/data/j.bin\", \"size\": 3}\n{\"path\":\"/data/k\"}\n",
        "{\"path\": 5}\n",
        "relative/path\n",
        "{\"path\": \"/data/\\u00e9\\n\"}\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    assert!(smoke("manifest", bodies::manifest, &seeds, BUDGET) > 100);
}
