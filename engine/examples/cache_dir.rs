//! A single-node page cache over a local directory, serving reads.
//!
//! ```text
//! cargo run --release -p pagestore-engine --example cache_dir -- [SOURCE_DIR] [CACHE_DIR]
//! ```
//!
//! Without arguments it makes a small sample dataset under `./pagestore-data/source` and caches
//! it in `./pagestore-data/cache`. Every file is read twice, page by page, through the engine:
//! the first pass misses, reads the page from the source directory (standing in for the object
//! store) and stores it; the second pass is served from the cache. Both passes are checked
//! byte for byte against the source. Run it again and the first pass is already warm: the index
//! survives restarts.

use std::{
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    time::Instant,
};

use pagestore_engine::{Engine, EngineConfig, PageKey, ShardStats};

fn sample_dataset(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let sizes: [(&str, usize); 5] = [
        ("episode-0000.mp4", 48 << 20),
        ("episode-0001.mp4", 33 << 20),
        ("episode-0001.proprio", 5 << 20),
        ("manifest.json", 1234),
        ("empty", 0),
    ];
    for (name, size) in sizes {
        let p = dir.join(name);
        if p.metadata().is_ok_and(|m| m.len() as usize == size) {
            continue;
        }
        let mut x = size as u64 ^ 0x9E37_79B9_7F4A_7C15;
        let mut data = Vec::with_capacity(size + 8);
        while data.len() < size {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.extend_from_slice(&x.to_le_bytes());
        }
        data.truncate(size);
        std::fs::write(p, data)?;
    }
    Ok(())
}

/// A file id from the path, size and modification time: a changed file gets new page keys.
fn file_id(path: &Path, meta: &std::fs::Metadata) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut a = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    (meta.len(), meta.modified().ok()).hash(&mut b);
    ((a.finish() as u128) << 64) | b.finish() as u128
}

struct Pass {
    bytes: u64,
    hits: u64,
    misses: u64,
}

fn read_through(engine: &Engine, files: &[PathBuf]) -> Result<Pass, Box<dyn std::error::Error>> {
    let page = engine.page_size() as u64;
    let mut pass = Pass {
        bytes: 0,
        hits: 0,
        misses: 0,
    };
    for path in files {
        let meta = std::fs::metadata(path)?;
        let id = file_id(path, &meta);
        let mut src = std::fs::File::open(path)?;
        for index in 0..meta.len().div_ceil(page) {
            let key = PageKey::new(id, index);
            let shard = engine.shard_of(&key);
            let len = page.min(meta.len() - index * page) as usize;
            let mut from_source = vec![0u8; len];
            src.seek(SeekFrom::Start(index * page))?;
            src.read_exact(&mut from_source)?;
            let served = match futures_lite::future::block_on(shard.get(key, 0, u32::MAX))? {
                Some(bytes) => {
                    pass.hits += 1;
                    bytes
                }
                None => {
                    pass.misses += 1;
                    let version = meta.len();
                    futures_lite::future::block_on(shard.put(key, from_source.clone(), version))?;
                    from_source.clone()
                }
            };
            if served != from_source {
                return Err(format!(
                    "{} page {index}: cache returned wrong bytes",
                    path.display()
                )
                .into());
            }
            pass.bytes += len as u64;
        }
    }
    Ok(pass)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let base = PathBuf::from("pagestore-data");
    let source = match args.first() {
        Some(s) => PathBuf::from(s),
        None => {
            let d = base.join("source");
            sample_dataset(&d)?;
            d
        }
    };
    let cache = args.get(1).map_or(base.join("cache"), PathBuf::from);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&source)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    println!("source directory: {}", source.display());
    println!("cache directory:  {}", cache.display());

    let engine = Engine::start(EngineConfig::new(&cache, 1 << 30))?;
    println!(
        "engine: {} shards, page size {} KiB",
        engine.shards().len(),
        engine.page_size() >> 10
    );
    for (name, pass) in ["first read", "second read"].iter().enumerate() {
        let t = Instant::now();
        let p = read_through(&engine, &files)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{pass}: {} files, {:.1} MiB in {:.3} s ({:.0} MiB/s): {} pages from cache, {} from the source{}",
            files.len(),
            p.bytes as f64 / (1 << 20) as f64,
            secs,
            p.bytes as f64 / (1 << 20) as f64 / secs.max(1e-9),
            p.hits,
            p.misses,
            if name == 1 && p.misses == 0 { " (all hits)" } else { "" },
        );
    }
    let stats = futures_lite::future::block_on(engine.stats())?;
    let t = ShardStats::total(&stats);
    println!(
        "cache: {} pages, {:.1} MiB used of {:.1} MiB; {} hits, {} misses, {} checksum failures; every byte matched the source",
        t.pages,
        t.bytes as f64 / (1 << 20) as f64,
        t.capacity_bytes as f64 / (1 << 20) as f64,
        t.hits,
        t.misses,
        t.checksum_failures
    );
    engine.shutdown()?;
    Ok(())
}
