//! crc32 of page chunks (what every read verifies and every put computes) against copying the same
//! bytes, the cheapest thing that touches every byte.

#[path = "timing.rs"]
mod timing;

use std::hint::black_box;

use timing::{ns_per_op, row};

fn main() {
    println!("checksum: crc32fast over a buffer vs memcpy of the same buffer (ns per buffer)");
    for size in [4096usize, 64 << 10, 4 << 20] {
        let src: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; size];
        let crc = ns_per_op(1, || {
            black_box(crc32fast::hash(black_box(&src)));
        });
        let copy = ns_per_op(1, || {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        });
        row(&format!("crc32 of {} KiB", size >> 10), crc, "memcpy", copy);
        println!(
            "{:<44} {:>9.2} GB/s",
            "  crc32 throughput",
            size as f64 / crc
        );
    }
}
