//! The benchmark dataset, and `pagebench gen`, which writes it to a directory or to any under
//! storage (`--ufs URL`).
//!
//! Layout under the dataset root:
//!
//! - `pagebench.json`: the descriptor (seed, counts, sizes, the episode format); every target
//!   reads it through its own path, so a run needs nothing but the root;
//! - `files/fNNNNN`: `--size / --file-size` flat files, for scans and random reads;
//! - `episodes/eNNNNN.ep`: robot episodes (see [`EpisodeLayout`]);
//! - `small/sNNNNN`: many small files (only when asked for: the preload manifest).
//!
//! Every byte is a function of (seed, relative path, offset), so any read of any target can be
//! checked against the generator without a reference copy ([`check`]).

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use pagestore_client::ufs::MountTable;

/// The descriptor's file name at the dataset root.
pub const DESCRIPTOR: &str = "pagebench.json";

/// The logical prefix under which `gen --ufs` mounts the URL it writes to.
pub const GEN_PREFIX: &str = "/gen";

/// How an episode's chunks are ordered in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Topic-group chunking: all camera chunks (GOPs of every camera, in time order) in one
    /// group, then all proprioception/action chunks in another. A window of proprioception is
    /// one contiguous range.
    Grouped,
    /// One chunk group per second: that second's camera GOPs, then its proprioception. A window
    /// of proprioception is one range per second, spread over the file.
    Interleaved,
}

impl Layout {
    /// Parses `grouped` or `interleaved`.
    pub fn parse(s: &str) -> Result<Layout> {
        match s {
            "grouped" => Ok(Layout::Grouped),
            "interleaved" => Ok(Layout::Interleaved),
            _ => Err(anyhow!(
                "--layout {s:?}: expected grouped (topic-group chunking) or interleaved"
            )),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Grouped => "grouped",
            Layout::Interleaved => "interleaved",
        }
    }
}

/// The shape of the episode files.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeSpec {
    /// Episode files.
    pub count: u64,
    /// Seconds per episode (one GOP per camera per second).
    pub secs: u32,
    /// Cameras.
    pub cameras: u32,
    /// Frames per second (= frames per GOP).
    pub fps: u32,
    /// Mean encoded frame size in bytes (key frames are about 4x, the others smaller).
    pub frame_bytes: u32,
    /// Proprioception/action records per second.
    pub proprio_hz: u32,
    /// Bytes per record (joint states and actions).
    pub record_bytes: u32,
    /// Chunk order.
    pub layout: Layout,
}

impl Default for EpisodeSpec {
    fn default() -> Self {
        EpisodeSpec {
            count: 16,
            secs: 20,
            cameras: 3,
            fps: 30,
            frame_bytes: 16 << 10,
            proprio_hz: 200,
            record_bytes: 256,
            layout: Layout::Grouped,
        }
    }
}

/// What a dataset holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Seed of every byte.
    pub seed: u64,
    /// Flat files.
    pub files: u64,
    /// Bytes per flat file.
    pub file_size: u64,
    /// Episode files.
    pub episodes: EpisodeSpec,
    /// Small files (the preload manifest's).
    pub small_files: u64,
    /// Bytes per small file.
    pub small_size: u64,
}

/// One file of the dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the dataset root.
    pub rel: String,
    /// Size in bytes.
    pub size: u64,
    /// Content key (see [`fill`]).
    pub key: u64,
}

/// SplitMix64's output function: a good 64-bit mix.
pub fn splitmix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A non-zero xorshift state for stream `stream` of `seed`.
pub fn rng_state(seed: u64, stream: u64) -> u64 {
    splitmix(seed ^ splitmix(stream)) | 1
}

/// The content key of the file at `rel` (FNV-1a of the path, mixed with the seed).
pub fn key_of(seed: u64, rel: &str) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for b in rel.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    splitmix(h ^ seed.rotate_left(17))
}

fn word(key: u64, index: u64) -> [u8; 8] {
    splitmix(key ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes()
}

/// Fills `buf` with the bytes of the file with content key `key` at offset `off`.
pub fn fill(key: u64, off: u64, buf: &mut [u8]) {
    let mut pos = off;
    let mut i = 0;
    while i < buf.len() {
        let w = word(key, pos / 8);
        let skip = (pos % 8) as usize;
        let n = (8 - skip).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&w[skip..skip + n]);
        i += n;
        pos += n as u64;
    }
}

/// `Ok` if `buf` holds the bytes of `key` at `off`; else the offset of the first wrong byte.
pub fn check(key: u64, off: u64, buf: &[u8]) -> Result<(), u64> {
    let mut pos = off;
    let mut i = 0;
    while i < buf.len() {
        let w = word(key, pos / 8);
        let skip = (pos % 8) as usize;
        let n = (8 - skip).min(buf.len() - i);
        if buf[i..i + n] != w[skip..skip + n] {
            let bad = (0..n).find(|&k| buf[i + k] != w[skip + k]).unwrap_or(0);
            return Err(pos + bad as u64);
        }
        i += n;
        pos += n as u64;
    }
    Ok(())
}

/// A byte range of an episode file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset in the file.
    pub off: u64,
    /// Length.
    pub len: u64,
}

/// Where everything is in one episode file. The file starts with a 4 KiB header block, then
/// holds, per second `g` and camera `c`, one GOP (a key frame and `fps - 1` predicted frames),
/// and per second `g` that second's proprioception/action records (`proprio_hz` records of
/// `record_bytes`), in the order [`Layout`] names. Frame sizes vary (seeded) around the mean.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpisodeLayout {
    /// File size.
    pub size: u64,
    /// `[second][camera]`: the GOP's chunk and the end of each of its frames, relative to the
    /// chunk's start.
    pub video: Vec<Vec<(Chunk, Vec<u32>)>>,
    /// `[second]`: that second's records.
    pub proprio: Vec<Chunk>,
}

/// Episode header block size.
pub const EPISODE_HEADER: u64 = 4096;

fn frame_size(spec: &EpisodeSpec, key: u64, g: u32, c: u32, j: u32) -> u32 {
    let h = splitmix(key ^ (u64::from(g) << 40) ^ (u64::from(c) << 32) ^ u64::from(j));
    let u = 0.75 + 0.5 * ((h >> 11) as f64 / (1u64 << 53) as f64);
    let mean = f64::from(spec.frame_bytes);
    let gop = f64::from(spec.fps);
    let base = if j == 0 {
        4.0 * mean
    } else {
        mean * (gop - 4.0).max(1.0) / (gop - 1.0).max(1.0)
    };
    (base * u).max(64.0) as u32
}

impl EpisodeLayout {
    /// The layout of the episode file with content key `key`.
    pub fn new(spec: &EpisodeSpec, key: u64) -> EpisodeLayout {
        let mut off = EPISODE_HEADER;
        let mut video = Vec::with_capacity(spec.secs as usize);
        let mut proprio = Vec::with_capacity(spec.secs as usize);
        let second_bytes = u64::from(spec.proprio_hz) * u64::from(spec.record_bytes);
        for g in 0..spec.secs {
            let mut cams = Vec::with_capacity(spec.cameras as usize);
            for c in 0..spec.cameras {
                let mut ends = Vec::with_capacity(spec.fps as usize);
                let mut end = 0u32;
                for j in 0..spec.fps {
                    end += frame_size(spec, key, g, c, j);
                    ends.push(end);
                }
                cams.push((
                    Chunk {
                        off,
                        len: u64::from(end),
                    },
                    ends,
                ));
                off += u64::from(end);
            }
            video.push(cams);
            if spec.layout == Layout::Interleaved {
                proprio.push(Chunk {
                    off,
                    len: second_bytes,
                });
                off += second_bytes;
            }
        }
        if spec.layout == Layout::Grouped {
            for _ in 0..spec.secs {
                proprio.push(Chunk {
                    off,
                    len: second_bytes,
                });
                off += second_bytes;
            }
        }
        EpisodeLayout {
            size: off,
            video,
            proprio,
        }
    }

    /// The byte ranges one training sample reads, in order: `frames` frames at a random time
    /// (round-robin over the cameras, then later frames; each frame is read from its GOP's key
    /// frame, as a decoder must), then the `window_secs` of proprioception/action records
    /// that end at that time (merged where contiguous).
    pub fn sample(
        &self,
        spec: &EpisodeSpec,
        frames: u32,
        window_secs: f64,
        x: &mut u64,
    ) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        if self.video.is_empty() {
            return out;
        }
        let r = crate::local::rng_next(x);
        let g = (r % self.video.len() as u64) as usize;
        let j = ((r >> 32) % u64::from(spec.fps.max(1))) as u32;
        for k in 0..frames {
            let cams = &self.video[g];
            let (chunk, ends) = &cams[(k % spec.cameras.max(1)) as usize];
            let jj = (j + k / spec.cameras.max(1)).min(spec.fps.saturating_sub(1)) as usize;
            out.push((chunk.off, u64::from(ends[jj])));
        }
        let hz = u64::from(spec.proprio_hz);
        let rb = u64::from(spec.record_bytes);
        if hz == 0 || rb == 0 || window_secs <= 0.0 {
            return out;
        }
        let end = g as u64 * hz + u64::from(j) * hz / u64::from(spec.fps.max(1)) + 1;
        let start = end.saturating_sub((window_secs * hz as f64).ceil() as u64);
        let mut s = start / hz;
        while s * hz < end {
            let r0 = start.max(s * hz) - s * hz;
            let r1 = end.min((s + 1) * hz) - s * hz;
            let c = self.proprio[s as usize];
            let (off, len) = (c.off + r0 * rb, (r1 - r0) * rb);
            match out.last_mut() {
                Some(last) if last.0 + last.1 == off && s > start / hz => last.1 += len,
                _ => out.push((off, len)),
            }
            s += 1;
        }
        out
    }
}

impl Dataset {
    /// Path of flat file `i`.
    pub fn flat_rel(i: u64) -> String {
        format!("files/f{i:05}")
    }

    /// Path of episode `i`.
    pub fn episode_rel(i: u64) -> String {
        format!("episodes/e{i:05}.ep")
    }

    /// Path of small file `i`.
    pub fn small_rel(i: u64) -> String {
        format!("small/s{i:05}")
    }

    /// The flat files.
    pub fn flat(&self) -> Vec<Entry> {
        (0..self.files)
            .map(|i| {
                let rel = Self::flat_rel(i);
                Entry {
                    key: key_of(self.seed, &rel),
                    rel,
                    size: self.file_size,
                }
            })
            .collect()
    }

    /// The episode files with their layouts.
    pub fn episodes(&self) -> Vec<(Entry, EpisodeLayout)> {
        (0..self.episodes.count)
            .map(|i| {
                let rel = Self::episode_rel(i);
                let key = key_of(self.seed, &rel);
                let layout = EpisodeLayout::new(&self.episodes, key);
                (
                    Entry {
                        rel,
                        size: layout.size,
                        key,
                    },
                    layout,
                )
            })
            .collect()
    }

    /// The small files.
    pub fn small(&self) -> Vec<Entry> {
        (0..self.small_files)
            .map(|i| {
                let rel = Self::small_rel(i);
                Entry {
                    key: key_of(self.seed, &rel),
                    rel,
                    size: self.small_size,
                }
            })
            .collect()
    }

    /// Every file.
    pub fn entries(&self) -> Vec<Entry> {
        let mut v = self.flat();
        v.extend(self.episodes().into_iter().map(|(e, _)| e));
        v.extend(self.small());
        v
    }

    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        self.entries().iter().map(|e| e.size).sum()
    }

    /// The descriptor.
    pub fn to_json(&self) -> serde_json::Value {
        let e = &self.episodes;
        serde_json::json!({
            "format": "pagebench-dataset",
            "version": 1,
            "seed": self.seed,
            "files": {"count": self.files, "size": self.file_size},
            "episodes": {
                "count": e.count, "secs": e.secs, "cameras": e.cameras, "fps": e.fps,
                "frame_bytes": e.frame_bytes, "proprio_hz": e.proprio_hz,
                "record_bytes": e.record_bytes, "layout": e.layout.name(),
            },
            "small": {"count": self.small_files, "size": self.small_size},
        })
    }

    /// Reads a descriptor.
    pub fn from_json(bytes: &[u8]) -> Result<Dataset> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).with_context(|| format!("{DESCRIPTOR} is not JSON"))?;
        if v["format"] != "pagebench-dataset" || v["version"] != 1 {
            bail!("{DESCRIPTOR} is not a pagebench dataset descriptor of version 1");
        }
        let u = |p: &str| -> Result<u64> {
            v.pointer(p)
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| anyhow!("{DESCRIPTOR}: {p} missing or not a number"))
        };
        let u32_ = |p: &str| -> Result<u32> {
            u32::try_from(u(p)?).map_err(|_| anyhow!("{DESCRIPTOR}: {p} too large"))
        };
        let layout = v
            .pointer("/episodes/layout")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| anyhow!("{DESCRIPTOR}: /episodes/layout missing"))?;
        Ok(Dataset {
            seed: u("/seed")?,
            files: u("/files/count")?,
            file_size: u("/files/size")?,
            episodes: EpisodeSpec {
                count: u("/episodes/count")?,
                secs: u32_("/episodes/secs")?,
                cameras: u32_("/episodes/cameras")?,
                fps: u32_("/episodes/fps")?,
                frame_bytes: u32_("/episodes/frame_bytes")?,
                proprio_hz: u32_("/episodes/proprio_hz")?,
                record_bytes: u32_("/episodes/record_bytes")?,
                layout: Layout::parse(layout)?,
            },
            small_files: u("/small/count")?,
            small_size: u("/small/size")?,
        })
    }

    /// Checks that the shape makes sense.
    pub fn validate(&self) -> Result<()> {
        let e = &self.episodes;
        if self.files > 0 && self.file_size == 0 {
            bail!("--file-size must be at least 1 byte");
        }
        if e.count > 0 && (e.secs == 0 || e.cameras == 0 || e.fps == 0) {
            bail!("--episode-secs and --cameras must be at least 1");
        }
        if self.files + e.count + self.small_files == 0 {
            bail!("the dataset would be empty (no files, episodes or small files)");
        }
        Ok(())
    }
}

/// Where `gen` writes.
pub enum Dest {
    /// A local directory (the dataset root).
    Dir(PathBuf),
    /// An under storage URL, mounted at [`GEN_PREFIX`].
    Store(Arc<MountTable>),
}

impl Dest {
    /// `--ufs URL`.
    pub fn store(url: &str) -> Result<Dest> {
        if let Some(path) = url.strip_prefix("file://") {
            // A local directory may not exist yet.
            let path = path.split('?').next().unwrap_or(path);
            std::fs::create_dir_all(path).with_context(|| format!("--ufs {url}"))?;
        }
        let table =
            MountTable::new(&[(GEN_PREFIX.to_string(), url.to_string())]).context("--ufs")?;
        Ok(Dest::Store(Arc::new(table)))
    }

    fn describe(&self) -> String {
        match self {
            Dest::Dir(d) => d.display().to_string(),
            Dest::Store(t) => t
                .mounts()
                .map(|(_, u)| pagestore_client::ufs::redact(u))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// What `gen` did.
#[derive(Debug, Default)]
pub struct GenReport {
    /// Files written now.
    pub written: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files that were already there with the right size (and the same seed).
    pub kept: u64,
    /// Seconds.
    pub secs: f64,
}

async fn read_descriptor_store(table: &MountTable) -> Option<Dataset> {
    let path = format!("{GEN_PREFIX}/{DESCRIPTOR}");
    let info = table.stat(&path).await.ok()?;
    let b = table.read(&info, 0..info.size).await.ok()?;
    Dataset::from_json(&b).ok()
}

const PART: u64 = 16 << 20;

fn generate_bytes(e: &Entry, off: u64, len: u64) -> Bytes {
    let mut v = vec![0u8; len as usize];
    fill(e.key, off, &mut v);
    Bytes::from(v)
}

/// Writes the dataset (files already there with the right size, written with the same seed, are
/// kept), then the descriptor.
pub fn generate(ds: &Dataset, dest: &Dest, rt: &tokio::runtime::Runtime) -> Result<GenReport> {
    ds.validate()?;
    let start = Instant::now();
    let entries = ds.entries();
    let descriptor = serde_json::to_vec_pretty(&ds.to_json())?;
    let mut report = match dest {
        Dest::Dir(root) => generate_dir(ds, root, &entries)?,
        Dest::Store(table) => rt.block_on(generate_store(ds, table.clone(), &entries))?,
    };
    match dest {
        Dest::Dir(root) => std::fs::write(root.join(DESCRIPTOR), &descriptor)
            .with_context(|| root.join(DESCRIPTOR).display().to_string())?,
        Dest::Store(table) => rt
            .block_on(table.put(&format!("{GEN_PREFIX}/{DESCRIPTOR}"), descriptor.into()))
            .context("writing the descriptor")?,
    }
    report.secs = start.elapsed().as_secs_f64();
    Ok(report)
}

fn generate_dir(ds: &Dataset, root: &Path, entries: &[Entry]) -> Result<GenReport> {
    // Content depends only on the seed and the path, so files of the right size written under
    // the same seed are kept whatever else changed.
    let same = std::fs::read(root.join(DESCRIPTOR))
        .ok()
        .and_then(|b| Dataset::from_json(&b).ok())
        .is_some_and(|old| old.seed == ds.seed);
    if std::fs::metadata(root.join(DESCRIPTOR)).is_ok() {
        // No descriptor while files change: an interrupted run is never mistaken for a
        // finished one.
        match std::fs::remove_file(root.join(DESCRIPTOR)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(root.join(DESCRIPTOR).display().to_string())
                )
            }
        }
    }
    for sub in ["files", "episodes", "small"] {
        std::fs::create_dir_all(root.join(sub))
            .with_context(|| root.join(sub).display().to_string())?;
    }
    let next = AtomicUsize::new(0);
    let written = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut buf = vec![0u8; 1 << 20];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(e) = entries.get(i) else {
                            return Ok(());
                        };
                        let path = root.join(&e.rel);
                        if same && std::fs::metadata(&path).is_ok_and(|m| m.len() == e.size) {
                            continue;
                        }
                        write_file(&path, e, &mut buf)
                            .with_context(|| path.display().to_string())?;
                        written.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(e.size, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(anyhow!("generator panicked")))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    let written = written.into_inner();
    Ok(GenReport {
        written,
        bytes: bytes.into_inner(),
        kept: entries.len() as u64 - written,
        secs: 0.0,
    })
}

fn write_file(path: &Path, e: &Entry, buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("partial");
    let mut f = std::fs::File::create(&tmp)?;
    let mut off = 0u64;
    while off < e.size {
        let n = (e.size - off).min(buf.len() as u64) as usize;
        fill(e.key, off, &mut buf[..n]);
        f.write_all(&buf[..n])?;
        off += n as u64;
    }
    f.sync_data()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

async fn generate_store(
    ds: &Dataset,
    table: Arc<MountTable>,
    entries: &[Entry],
) -> Result<GenReport> {
    use futures_util::{stream, StreamExt};
    let same = read_descriptor_store(&table)
        .await
        .is_some_and(|old| old.seed == ds.seed);
    {
        // As for directories: no descriptor while the files change.
        let _ = table.delete(&format!("{GEN_PREFIX}/{DESCRIPTOR}")).await;
    }
    let written = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let results: Vec<Result<()>> = stream::iter(entries.iter().cloned())
        .map(|e| {
            let (table, written, bytes) = (table.clone(), written.clone(), bytes.clone());
            async move {
                let path = format!("{GEN_PREFIX}/{}", e.rel);
                if same && table.stat(&path).await.is_ok_and(|i| i.size == e.size) {
                    return Ok(());
                }
                if e.size <= PART {
                    let ent = e.clone();
                    let data =
                        tokio::task::spawn_blocking(move || generate_bytes(&ent, 0, ent.size))
                            .await?;
                    table.put(&path, data).await.with_context(|| path.clone())?;
                } else {
                    let mut up = table
                        .put_multipart(&path)
                        .await
                        .with_context(|| path.clone())?;
                    let mut off = 0;
                    while off < e.size {
                        let len = (e.size - off).min(PART);
                        let ent = e.clone();
                        let data =
                            tokio::task::spawn_blocking(move || generate_bytes(&ent, off, len))
                                .await?;
                        if let Err(err) = up.put_part(data.into()).await {
                            let _ = up.abort().await;
                            return Err(anyhow::Error::new(err).context(path));
                        }
                        off += len;
                    }
                    up.complete().await.with_context(|| path.clone())?;
                }
                written.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(e.size, Ordering::Relaxed);
                Ok(())
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    for r in results {
        r?;
    }
    let written = written.load(Ordering::Relaxed);
    Ok(GenReport {
        written,
        bytes: bytes.load(Ordering::Relaxed),
        kept: entries.len() as u64 - written,
        secs: 0.0,
    })
}

/// `pagebench gen`: writes the dataset and says what it did.
pub fn run_gen(o: &crate::Opts) -> Result<()> {
    let ds = o.dataset();
    let dest = match (&o.ufs, o.dir_given) {
        (Some(_), true) => bail!("gen takes --dir DIR or --ufs URL, not both"),
        (Some(url), false) => Dest::store(url)?,
        (None, _) => Dest::Dir(o.dir.clone()),
    };
    let rt = crate::bench::runtime(2)?;
    let r = generate(&ds, &dest, &rt)?;
    let total = ds.total_bytes();
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "mode": "gen", "dest": dest.describe(), "dataset": ds.to_json(),
                "files_written": r.written, "bytes_written": r.bytes, "files_kept": r.kept,
                "seconds": r.secs, "total_bytes": total,
            })
        );
    } else {
        println!(
            "gen: {} ({} flat files of {} MiB, {} episodes ({} layout), {} small files): {:.2} GB \
             in all; wrote {} files ({:.2} GB) in {:.1} s, kept {}",
            dest.describe(),
            ds.files,
            ds.file_size >> 20,
            ds.episodes.count,
            ds.episodes.layout.name(),
            ds.small_files,
            total as f64 / 1e9,
            r.written,
            r.bytes as f64 / 1e9,
            r.secs,
            r.kept
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_positional_and_checkable_at_any_offset() {
        let mut a = vec![0u8; 100];
        fill(7, 13, &mut a);
        let mut b = vec![0u8; 200];
        fill(7, 0, &mut b);
        assert_eq!(&a[..], &b[13..113]);
        assert_eq!(check(7, 13, &a), Ok(()));
        assert_eq!(check(8, 13, &a).map_err(|_| ()), Err(()));
        a[50] ^= 1;
        assert_eq!(check(7, 13, &a), Err(63));
    }

    #[test]
    fn episode_layouts_cover_the_file_and_samples_stay_inside() {
        for layout in [Layout::Grouped, Layout::Interleaved] {
            let spec = EpisodeSpec {
                secs: 12,
                layout,
                ..EpisodeSpec::default()
            };
            let l = EpisodeLayout::new(&spec, 99);
            // Chunks tile the file after the header, without gaps or overlaps.
            let mut chunks: Vec<Chunk> = l.video.iter().flatten().map(|(c, _)| *c).collect();
            chunks.extend(l.proprio.iter().copied());
            chunks.sort_by_key(|c| c.off);
            let mut at = EPISODE_HEADER;
            for c in &chunks {
                assert_eq!(c.off, at);
                at += c.len;
            }
            assert_eq!(at, l.size);
            let mut x = 5;
            for _ in 0..200 {
                let ranges = l.sample(&spec, 4, 10.0, &mut x);
                assert!(ranges.len() >= 5, "{ranges:?}");
                for (off, len) in &ranges {
                    assert!(*len > 0 && off + len <= l.size, "{off} {len} {}", l.size);
                }
                let proprio: u64 = ranges[4..].iter().map(|r| r.1).sum();
                assert!(proprio <= 10 * 200 * 256 + 256, "{proprio}");
                if layout == Layout::Grouped {
                    assert_eq!(ranges.len(), 5, "one proprio range when grouped");
                }
            }
        }
        // Interleaved: a 10 s window crosses up to 11 per-second chunks.
        let spec = EpisodeSpec {
            secs: 12,
            layout: Layout::Interleaved,
            ..EpisodeSpec::default()
        };
        let l = EpisodeLayout::new(&spec, 1);
        let mut x = 3;
        let most = (0..200)
            .map(|_| l.sample(&spec, 1, 10.0, &mut x).len())
            .max();
        assert_eq!(most, Some(12));
    }

    #[test]
    fn the_descriptor_round_trips() {
        let ds = Dataset {
            seed: 3,
            files: 2,
            file_size: 5,
            episodes: EpisodeSpec {
                layout: Layout::Interleaved,
                ..EpisodeSpec::default()
            },
            small_files: 7,
            small_size: 9,
        };
        let b = serde_json::to_vec(&ds.to_json()).unwrap();
        assert_eq!(Dataset::from_json(&b).unwrap(), ds);
        assert!(Dataset::from_json(b"{}").is_err());
    }
}
