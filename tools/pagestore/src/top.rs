//! `pagectl top` and the egress lines of `pagectl stat`: two samples of every shard's
//! `Counters` and `Hot` reports, an interval apart, turned into rates (the [`View`]), shown as a
//! live terminal view (plain ANSI) or as JSON.
//!
//! Hot files and pages are space-saving counts ([`pagestore_client::HotReport`]): an entry
//! that was in the previous sample with the same `bytes_error` stayed in its table, so its rate
//! is exact; one that entered since counts from when it entered (at most the interval).

use std::{collections::HashMap, fmt::Write as _, time::Instant};

use pagestore_client::{Client, HotReport, ShardCounters};
use pagestore_protocol::{members::NodeInfo, node_id::format_uuid};
use serde::Serialize;

/// A node whose share of the bytes the cluster served in the interval is at least this many
/// times its fair share (1 / nodes) is marked hot: it is where the cluster's bandwidth runs out
/// first.
pub const SATURATION_FACTOR: f64 = 1.5;

/// Rows of hot files and pages a view keeps.
pub const TOP_ROWS: usize = 10;

/// One sample of every shard's counters and hot reports.
pub struct Sample {
    at: Instant,
    counters: Vec<(NodeInfo, u16, Option<ShardCounters>)>,
    hot: Vec<(NodeInfo, u16, Option<HotReport>)>,
}

impl Sample {
    /// Asks every shard of the cluster (at once) for its counters and its hot report.
    pub async fn take(client: &Client) -> Sample {
        let (counters, hot) = tokio::join!(client.shard_counters(), client.hot_reports());
        Sample {
            at: Instant::now(),
            counters,
            hot,
        }
    }

    /// Seconds from `earlier` to this sample.
    pub fn secs_since(&self, earlier: &Sample) -> f64 {
        self.at.saturating_duration_since(earlier.at).as_secs_f64()
    }

    /// Reads node `node`'s memory tiers answered, over its shards that answered.
    pub fn memory_hits(&self, node: u128) -> u64 {
        self.counters
            .iter()
            .filter(|(n, _, _)| n.id == node)
            .filter_map(|(_, _, c)| c.as_ref())
            .map(|c| c.memory_hits)
            .sum()
    }

    fn counters(&self, node: u128, shard: u16) -> Option<&ShardCounters> {
        self.counters
            .iter()
            .find(|(n, s, _)| n.id == node && *s == shard)
            .and_then(|(_, _, c)| c.as_ref())
    }

    fn hot(&self, node: u128, shard: u16) -> Option<&HotReport> {
        self.hot
            .iter()
            .find(|(n, s, _)| n.id == node && *s == shard)
            .and_then(|(_, _, h)| h.as_ref())
    }
}

/// What `pagectl top` shows (and `--json` prints): rates over the interval between two samples.
#[derive(Clone, Debug, Default, Serialize)]
pub struct View {
    /// Seconds between the samples.
    pub interval_secs: f64,
    /// Bytes per second the cluster served (memory, disk and store).
    pub served_bytes_per_sec: f64,
    /// The busiest node's bytes served over the mean node's (1.0: even; nodes that answered).
    pub node_max_over_mean: f64,
    /// Whether one node's share is at least [`SATURATION_FACTOR`] times its fair share.
    pub saturated: bool,
    /// Per node.
    pub nodes: Vec<NodeView>,
    /// Per shard of every node.
    pub shards: Vec<ShardView>,
    /// The hottest files over the interval (summed over shards), at most [`TOP_ROWS`].
    pub files: Vec<FileView>,
    /// The hottest pages over the interval, at most [`TOP_ROWS`].
    pub pages: Vec<PageView>,
    /// Egress per mount.
    pub mounts: Vec<MountView>,
}

/// One node's line.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeView {
    /// The node's UUID.
    pub id: String,
    /// Its base address.
    pub addr: String,
    /// Shards that answered both samples, and shards it has.
    pub shards_answered: usize,
    /// Shards it has.
    pub shards: u16,
    /// Bytes per second served (memory, disk and store).
    pub served_bytes_per_sec: f64,
    /// Of those, from the memory tier.
    pub memory_bytes_per_sec: f64,
    /// Bytes per second read from the under storage.
    pub store_bytes_per_sec: f64,
    /// Hits (disk and memory) over lookups in the interval (`None`: no lookups).
    pub hit_ratio: Option<f64>,
    /// Its share of the bytes the cluster served in the interval.
    pub share: f64,
    /// Its share is at least [`SATURATION_FACTOR`] times the fair share.
    pub hot: bool,
    /// Bytes its memory tiers hold, and may hold.
    pub memory_bytes: u64,
    /// Capacity of its memory tiers.
    pub memory_capacity: u64,
    /// Pages it owns that are hot now (spread to replicas).
    pub hot_pages: u64,
    /// Copies of other nodes' hot pages it holds now.
    pub replicas: u64,
    /// Reads per second it served as a hot page's replica.
    pub replica_reads_per_sec: f64,
}

/// One shard's line.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ShardView {
    /// The node's UUID.
    pub node: String,
    /// The shard's index.
    pub shard: u16,
    /// Bytes per second served.
    pub served_bytes_per_sec: f64,
    /// Of those, from the memory tier.
    pub memory_bytes_per_sec: f64,
    /// Hits over lookups in the interval.
    pub hit_ratio: Option<f64>,
    /// Bytes its memory tier holds.
    pub memory_bytes: u64,
}

/// A hot file.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FileView {
    /// Its logical path.
    pub path: String,
    /// Its file id (hex).
    pub file_id: String,
    /// Bytes per second served over the interval (estimated; see the module docs).
    pub bytes_per_sec: f64,
    /// Reads per second over the interval.
    pub reads_per_sec: f64,
    /// Bytes served since the nodes started (space-saving estimate, summed over shards).
    pub bytes: u64,
    /// Shards that count it among their hottest.
    pub shards: usize,
}

/// A hot page.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PageView {
    /// Its file's path, if that file is among the hot files.
    pub path: Option<String>,
    /// Its file id (hex).
    pub file_id: String,
    /// Page index.
    pub page: u64,
    /// Reads per second over the interval.
    pub reads_per_sec: f64,
    /// Reads since the nodes started (estimate).
    pub reads: u64,
    /// The members its owner spreads it over now (0: not hot).
    pub spread: u8,
}

/// A mount's egress: bytes served from the cache (kept off the store) and read from the store.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct MountView {
    /// The mount's prefix.
    pub prefix: String,
    /// Its store's egress price, US dollars per TB (0: not priced).
    pub usd_per_tb: f64,
    /// Bytes kept off the store since the nodes started.
    pub kept_off_bytes: u64,
    /// Bytes read from the store since the nodes started.
    pub store_bytes: u64,
    /// Bytes kept off the store in the interval.
    pub kept_off_bytes_interval: u64,
    /// Bytes read from the store in the interval.
    pub store_bytes_interval: u64,
}

impl MountView {
    /// Dollars kept off the store since start.
    pub fn kept_off_usd(&self) -> f64 {
        self.kept_off_bytes as f64 / 1e12 * self.usd_per_tb
    }

    /// Dollars kept off the store in the interval.
    pub fn kept_off_usd_interval(&self) -> f64 {
        self.kept_off_bytes_interval as f64 / 1e12 * self.usd_per_tb
    }
}

fn ratio(hits: u64, lookups: u64) -> Option<f64> {
    (lookups > 0).then(|| hits as f64 / lookups as f64)
}

/// Bytes per mount from two samples, summed over every node and shard that answered both (a
/// mount of the later sample only counts from zero).
pub fn egress(before: &Sample, after: &Sample) -> Vec<MountView> {
    let mut out: Vec<MountView> = Vec::new();
    for (n, s, h) in &after.hot {
        let Some(h) = h else { continue };
        let prev = before.hot(n.id, *s);
        for m in &h.mounts {
            let p = prev.and_then(|p| p.mounts.iter().find(|x| x.prefix == m.prefix));
            let (c0, s0) = p.map_or((0, 0), |p| (p.cache_bytes, p.store_bytes));
            let row = match out.iter_mut().find(|o| o.prefix == m.prefix) {
                Some(o) => o,
                None => {
                    out.push(MountView {
                        prefix: m.prefix.clone(),
                        usd_per_tb: m.usd_per_tb,
                        ..MountView::default()
                    });
                    out.last_mut().unwrap_or_else(|| unreachable!())
                }
            };
            row.kept_off_bytes += m.cache_bytes;
            row.store_bytes += m.store_bytes;
            row.kept_off_bytes_interval += m.cache_bytes.saturating_sub(c0);
            row.store_bytes_interval += m.store_bytes.saturating_sub(s0);
        }
    }
    out.sort_by(|a, b| a.prefix.cmp(&b.prefix));
    out
}

/// The view between two samples of the cluster whose nodes are `nodes`.
pub fn view<'a>(
    nodes: impl Iterator<Item = &'a NodeInfo>,
    before: &Sample,
    after: &Sample,
) -> View {
    let secs = after
        .at
        .saturating_duration_since(before.at)
        .as_secs_f64()
        .max(1e-3);
    let per_sec = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    let mut v = View {
        interval_secs: secs,
        ..View::default()
    };
    for n in nodes {
        let mut nv = NodeView {
            id: format_uuid(n.id),
            addr: n.addr.to_string(),
            shards: n.shards,
            ..NodeView::default()
        };
        let (mut hits, mut lookups) = (0, 0);
        for s in 0..n.shards {
            let (Some(a), Some(b)) = (before.counters(n.id, s), after.counters(n.id, s)) else {
                continue;
            };
            nv.shards_answered += 1;
            let served = per_sec(a.served_bytes, b.served_bytes);
            let memory = per_sec(a.memory_hit_bytes, b.memory_hit_bytes);
            let h = (b.hits + b.memory_hits).saturating_sub(a.hits + a.memory_hits);
            let l = h + b.misses.saturating_sub(a.misses);
            nv.served_bytes_per_sec += served;
            nv.memory_bytes_per_sec += memory;
            nv.store_bytes_per_sec += per_sec(a.ufs_bytes, b.ufs_bytes);
            nv.memory_bytes += b.memory_bytes;
            nv.memory_capacity += b.memory_capacity;
            nv.hot_pages += b.hot_now;
            nv.replicas += b.replicas_held;
            nv.replica_reads_per_sec += per_sec(a.replica_hot_reads, b.replica_hot_reads);
            hits += h;
            lookups += l;
            v.shards.push(ShardView {
                node: nv.id.clone(),
                shard: s,
                served_bytes_per_sec: served,
                memory_bytes_per_sec: memory,
                hit_ratio: ratio(h, l),
                memory_bytes: b.memory_bytes,
            });
        }
        nv.hit_ratio = ratio(hits, lookups);
        v.served_bytes_per_sec += nv.served_bytes_per_sec;
        v.nodes.push(nv);
    }
    let up = || v.nodes.iter().filter(|n| n.shards_answered > 0);
    let answered = up().count();
    let fair = 1.0 / answered.max(1) as f64;
    let mean = v.served_bytes_per_sec / answered.max(1) as f64;
    let max = up().map(|n| n.served_bytes_per_sec).fold(0.0, f64::max);
    v.node_max_over_mean = if mean > 0.0 { max / mean } else { 1.0 };
    for n in &mut v.nodes {
        if v.served_bytes_per_sec > 0.0 {
            n.share = n.served_bytes_per_sec / v.served_bytes_per_sec;
        }
        n.hot = answered > 1 && n.share >= SATURATION_FACTOR * fair;
        v.saturated |= n.hot;
    }
    hot_rows(&mut v, before, after, secs);
    v.mounts = egress(before, after);
    v
}

/// A hot file's counts summed over shards.
#[derive(Default)]
struct FileSum {
    path: String,
    /// Bytes and reads in the interval.
    bytes: u64,
    reads: u64,
    /// Bytes since start.
    total: u64,
    shards: usize,
}

/// The hot files and pages over the interval, summed over shards.
fn hot_rows(v: &mut View, before: &Sample, after: &Sample, secs: f64) {
    let mut files: HashMap<u128, FileSum> = HashMap::new();
    // (file id, page) -> (reads in the interval, reads since start, spread)
    let mut pages: HashMap<(u128, u64), (u64, u64, u8)> = HashMap::new();
    for (n, s, h) in &after.hot {
        let Some(h) = h else { continue };
        let prev = before.hot(n.id, *s);
        for f in &h.files {
            let stayed = prev
                .and_then(|p| p.files.iter().find(|x| x.file_id == f.file_id))
                .filter(|x| x.bytes_error == f.bytes_error);
            let (db, dr) = match stayed {
                Some(p) => (
                    f.bytes.saturating_sub(p.bytes),
                    f.reads.saturating_sub(p.reads),
                ),
                None => (f.bytes.saturating_sub(f.bytes_error), f.reads),
            };
            let e = files.entry(f.file_id.as_u128()).or_insert_with(|| FileSum {
                path: f.path.clone(),
                ..FileSum::default()
            });
            e.bytes += db;
            e.reads += dr;
            e.total += f.bytes;
            e.shards += 1;
        }
        for p in &h.pages {
            let stayed = prev
                .and_then(|x| x.pages.iter().find(|y| y.key == p.key))
                .filter(|y| y.reads_error == p.reads_error);
            let d = match stayed {
                Some(y) => p.reads.saturating_sub(y.reads),
                None => p.reads.saturating_sub(p.reads_error),
            };
            let e = pages
                .entry((p.key.file_id.as_u128(), p.key.page))
                .or_default();
            e.0 += d;
            e.1 += p.reads;
            e.2 = e.2.max(p.spread);
        }
    }
    let mut fv: Vec<(u128, FileSum)> = files.into_iter().collect();
    fv.sort_by_key(|(id, f)| (std::cmp::Reverse((f.bytes, f.total)), *id));
    let paths: HashMap<u128, String> = fv.iter().map(|(id, f)| (*id, f.path.clone())).collect();
    v.files = fv
        .into_iter()
        .take(TOP_ROWS)
        .map(|(id, f)| FileView {
            path: f.path,
            file_id: format!("{id:032x}"),
            bytes_per_sec: f.bytes as f64 / secs,
            reads_per_sec: f.reads as f64 / secs,
            bytes: f.total,
            shards: f.shards,
        })
        .collect();
    let mut pv: Vec<_> = pages.into_iter().collect();
    pv.sort_by_key(|(k, (d, total, _))| (std::cmp::Reverse((*d, *total)), *k));
    v.pages = pv
        .into_iter()
        .take(TOP_ROWS)
        .map(|((id, page), (d, total, spread))| PageView {
            path: paths.get(&id).cloned(),
            file_id: format!("{id:032x}"),
            page,
            reads_per_sec: d as f64 / secs,
            reads: total,
            spread,
        })
        .collect();
}

/// `1.23 GB/s`-style figures (decimal units).
pub fn bytes(b: f64) -> String {
    let (v, unit) = if b >= 1e12 {
        (b / 1e12, "TB")
    } else if b >= 1e9 {
        (b / 1e9, "GB")
    } else if b >= 1e6 {
        (b / 1e6, "MB")
    } else if b >= 1e3 {
        (b / 1e3, "kB")
    } else {
        (b, "B")
    };
    format!("{v:.2} {unit}")
}

/// Dollars: cents above a dollar, four decimals below.
pub fn dollars(d: f64) -> String {
    if d >= 1.0 {
        format!("${d:.2}")
    } else {
        format!("${d:.4}")
    }
}

/// The egress lines of `pagectl stat` and `pagectl top`: per mount and, with more than one,
/// in total.
pub fn egress_lines(mounts: &[MountView], secs: f64) -> String {
    let mut out = String::new();
    let line = |out: &mut String, what: &str, m: &MountView| {
        let price = if m.usd_per_tb > 0.0 {
            format!(" (egress priced at ${}/TB)", m.usd_per_tb)
        } else {
            " (no egress_usd_per_tb on the mount)".to_string()
        };
        let _ = writeln!(
            out,
            "{what}: kept off the store: {}, about {} since start; {}, about {} over the last \
             {secs:.1} s; read from the store: {} since start{price}",
            bytes(m.kept_off_bytes as f64),
            dollars(m.kept_off_usd()),
            bytes(m.kept_off_bytes_interval as f64),
            dollars(m.kept_off_usd_interval()),
            bytes(m.store_bytes as f64),
        );
    };
    for m in mounts {
        // The root mount's prefix is empty; it is shown as "/".
        let shown = if m.prefix.is_empty() { "/" } else { &m.prefix };
        line(&mut out, &format!("mount {shown}"), m);
    }
    if mounts.len() > 1 {
        let usd: f64 = mounts.iter().map(MountView::kept_off_usd).sum();
        let usd_i: f64 = mounts.iter().map(MountView::kept_off_usd_interval).sum();
        let sum = |f: fn(&MountView) -> u64| mounts.iter().map(f).sum::<u64>() as f64;
        let _ = writeln!(
            out,
            "all mounts: kept off the store: {}, about {} since start; {}, about {} over the \
             last {secs:.1} s",
            bytes(sum(|m| m.kept_off_bytes)),
            dollars(usd),
            bytes(sum(|m| m.kept_off_bytes_interval)),
            dollars(usd_i),
        );
    }
    out
}

const BOLD: &str = "\x1b[1m";
const RED: &str = "\x1b[1;31m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// A bar of `width` cells filled to `share` (0 to 1).
fn bar(share: f64, width: usize) -> String {
    let filled = ((share.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "#".repeat(filled), ".".repeat(width - filled))
}

fn pct(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{:.1}%", 100.0 * r))
}

/// The view as text; `color` adds ANSI bold and red (a terminal).
pub fn render(v: &View, color: bool) -> String {
    let (bold, red, dim, reset) = if color {
        (BOLD, RED, DIM, RESET)
    } else {
        ("", "", "", "")
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{bold}pagectl top{reset}  every {:.1} s  cluster serves {}/s  node max/mean {:.2}x{}",
        v.interval_secs,
        bytes(v.served_bytes_per_sec),
        v.node_max_over_mean,
        if v.saturated {
            format!("  {red}ONE NODE CARRIES THE LOAD (hot: see share){reset}")
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        o,
        "\n{bold}{:<36} {:>10} {:>10} {:>10} {:>7} {:>6}  {:<22} {:>15} {:>5} {:>7}{reset}",
        "node",
        "served/s",
        "memory/s",
        "store/s",
        "hit",
        "share",
        "",
        "memory tier",
        "hot",
        "copies"
    );
    for n in &v.nodes {
        if n.shards_answered == 0 {
            let _ = writeln!(o, "{red}{:<36} DOWN ({}){reset}", n.id, n.addr);
            continue;
        }
        let mark = if n.hot {
            format!("{red}HOT{reset}")
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "{:<36} {:>10} {:>10} {:>10} {:>7} {:>5.1}%  {} {:<3} {:>15} {:>5} {:>7}",
            n.id,
            bytes(n.served_bytes_per_sec),
            bytes(n.memory_bytes_per_sec),
            bytes(n.store_bytes_per_sec),
            pct(n.hit_ratio),
            100.0 * n.share,
            bar(n.share, 16),
            mark,
            format!(
                "{} / {}",
                bytes(n.memory_bytes as f64),
                bytes(n.memory_capacity as f64)
            ),
            n.hot_pages,
            n.replicas,
        );
    }
    let _ = writeln!(
        o,
        "\n{bold}{:<36} {:>5} {:>10} {:>10} {:>7} {:>12}{reset}",
        "shard", "", "served/s", "memory/s", "hit", "in memory"
    );
    for s in &v.shards {
        let _ = writeln!(
            o,
            "{dim}{:<36}{reset} {:>5} {:>10} {:>10} {:>7} {:>12}",
            s.node,
            s.shard,
            bytes(s.served_bytes_per_sec),
            bytes(s.memory_bytes_per_sec),
            pct(s.hit_ratio),
            bytes(s.memory_bytes as f64),
        );
    }
    let _ = writeln!(
        o,
        "\n{bold}{:>10} {:>9} {:>10} {:>6}  hot files{reset}",
        "bytes/s", "reads/s", "total", "shards"
    );
    for f in &v.files {
        let _ = writeln!(
            o,
            "{:>10} {:>9.1} {:>10} {:>6}  {}",
            bytes(f.bytes_per_sec),
            f.reads_per_sec,
            bytes(f.bytes as f64),
            f.shards,
            f.path
        );
    }
    let _ = writeln!(
        o,
        "\n{bold}{:>9} {:>10} {:>6}  hot pages{reset}",
        "reads/s", "reads", "spread"
    );
    for p in &v.pages {
        let name = p
            .path
            .clone()
            .unwrap_or_else(|| format!("file {}", p.file_id));
        let spread = if p.spread > 1 {
            format!("x{}", p.spread)
        } else {
            "-".to_string()
        };
        let _ = writeln!(
            o,
            "{:>9.1} {:>10} {:>6}  {name} page {}",
            p.reads_per_sec, p.reads, spread, p.page
        );
    }
    if !v.mounts.is_empty() {
        let _ = writeln!(o);
        o.push_str(&egress_lines(&v.mounts, v.interval_secs));
    }
    o
}

/// Runs `pagectl top`: a view every `interval` until `count` views (none: until interrupted),
/// as text (a live screen on a terminal) or as one JSON object per line.
pub async fn run(
    client: &Client,
    interval: std::time::Duration,
    count: Option<u64>,
    json: bool,
) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal() && !json;
    let mut before = Sample::take(client).await;
    let mut shown = 0u64;
    loop {
        tokio::time::sleep(interval).await;
        let after = Sample::take(client).await;
        let membership = client.membership();
        let v = view(membership.nodes(), &before, &after);
        let mut out = std::io::stdout().lock();
        if json {
            writeln!(out, "{}", serde_json::to_string(&v)?)?;
        } else if tty {
            // Home, clear, the view.
            write!(out, "\x1b[H\x1b[2J{}", render(&v, true))?;
        } else {
            writeln!(out, "{}", render(&v, false))?;
        }
        out.flush()?;
        shown += 1;
        if count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        before = after;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pagestore_client::{HotFile, MountBytes};
    use pagestore_protocol::frame::FileId;
    use std::time::Duration;

    fn node(id: u128, shards: u16) -> NodeInfo {
        NodeInfo {
            id,
            addr: format!("127.0.0.1:{}", 7400 + id as u16 * 10)
                .parse()
                .unwrap(),
            shards,
        }
    }

    fn counters(served: u64, hits: u64, misses: u64) -> Option<ShardCounters> {
        Some(ShardCounters {
            served_bytes: served,
            hits,
            misses,
            ..ShardCounters::default()
        })
    }

    fn report(file_bytes: u64, error: u64, cache: u64) -> Option<HotReport> {
        Some(HotReport {
            files: vec![HotFile {
                file_id: FileId::from_u128(9),
                path: "/m/weights".into(),
                bytes: file_bytes,
                bytes_error: error,
                reads: file_bytes / 100,
            }],
            mounts: vec![MountBytes {
                prefix: "/m".into(),
                usd_per_tb: 100.0,
                cache_bytes: cache,
                store_bytes: 10,
            }],
            ..HotReport::default()
        })
    }

    #[test]
    fn one_node_serving_most_bytes_is_marked_and_rates_come_from_the_deltas() {
        let nodes = [node(1, 1), node(2, 1), node(3, 1)];
        let t0 = Instant::now();
        let before = Sample {
            at: t0,
            counters: nodes.iter().map(|n| (*n, 0, counters(0, 0, 0))).collect(),
            hot: nodes.iter().map(|n| (*n, 0, report(1000, 0, 0))).collect(),
        };
        // Over 2 s node 1 served 8 MB, the others 1 MB each; node 2's file entry re-entered its
        // table (another bytes_error), node 3's stayed.
        let after = Sample {
            at: t0 + Duration::from_secs(2),
            counters: vec![
                (nodes[0], 0, counters(8_000_000, 30, 10)),
                (nodes[1], 0, counters(1_000_000, 5, 0)),
                (nodes[2], 0, counters(1_000_000, 0, 0)),
            ],
            hot: vec![
                (nodes[0], 0, report(1000 + 8_000_000, 0, 5_000_000_000_000)),
                (nodes[1], 0, report(50_000 + 1_000_000, 50_000, 0)),
                (nodes[2], 0, report(1000 + 1_000_000, 0, 0)),
            ],
        };
        let v = view(nodes.iter(), &before, &after);
        assert!((v.interval_secs - 2.0).abs() < 1e-9);
        assert_eq!(v.served_bytes_per_sec, 5_000_000.0);
        assert!(v.saturated);
        assert!(v.nodes[0].hot && !v.nodes[1].hot && !v.nodes[2].hot);
        assert_eq!(v.nodes[0].share, 0.8);
        assert!((v.node_max_over_mean - 2.4).abs() < 1e-9);
        assert_eq!(v.nodes[0].hit_ratio, Some(0.75));
        assert_eq!(v.nodes[2].hit_ratio, None);
        // The file's bytes over the interval: 8 MB + 1 MB (since it re-entered) + 1 MB.
        assert_eq!(v.files.len(), 1);
        assert_eq!(v.files[0].bytes_per_sec, 5_000_000.0);
        assert_eq!(v.files[0].shards, 3);
        // Egress: 5 TB kept off at $100/TB, all of it in the interval.
        assert_eq!(v.mounts.len(), 1);
        let m = &v.mounts[0];
        assert_eq!(
            (m.kept_off_bytes, m.kept_off_bytes_interval),
            (5e12 as u64, 5e12 as u64)
        );
        assert_eq!((m.store_bytes, m.store_bytes_interval), (30, 0));
        assert_eq!(m.kept_off_usd(), 500.0);
        let text = render(&v, false);
        assert!(text.contains("ONE NODE CARRIES THE LOAD"), "{text}");
        assert!(text.contains("HOT"), "{text}");
        assert!(
            text.contains("kept off the store: 5.00 TB, about $500.00 since start"),
            "{text}"
        );
        assert!(text.contains("/m/weights"), "{text}");
        // JSON carries the same.
        let json: serde_json::Value = serde_json::to_value(&v).unwrap();
        assert_eq!(json["nodes"][0]["hot"], true);
        assert_eq!(json["mounts"][0]["kept_off_bytes"], 5_000_000_000_000u64);
    }

    #[test]
    fn the_root_mount_is_named_by_its_slash() {
        let m = |prefix: &str| MountView {
            prefix: prefix.into(),
            usd_per_tb: 0.0,
            kept_off_bytes: 0,
            store_bytes: 0,
            kept_off_bytes_interval: 0,
            store_bytes_interval: 0,
        };
        let text = egress_lines(&[m(""), m("/data")], 1.0);
        let names: Vec<&str> = text.lines().filter_map(|l| l.split(':').next()).collect();
        assert_eq!(names, ["mount /", "mount /data", "all mounts"], "{text}");
    }

    #[test]
    fn an_even_cluster_is_not_marked_and_a_down_node_is_shown() {
        let nodes = [node(1, 1), node(2, 1), node(3, 1)];
        let t0 = Instant::now();
        let before = Sample {
            at: t0,
            counters: nodes.iter().map(|n| (*n, 0, counters(0, 0, 0))).collect(),
            hot: Vec::new(),
        };
        let after = Sample {
            at: t0 + Duration::from_secs(1),
            counters: vec![
                (nodes[0], 0, counters(1_100_000, 1, 0)),
                (nodes[1], 0, counters(900_000, 1, 0)),
                (nodes[2], 0, None),
            ],
            hot: Vec::new(),
        };
        let v = view(nodes.iter(), &before, &after);
        assert!(!v.saturated, "{v:?}");
        assert!((v.node_max_over_mean - 1.1).abs() < 1e-9);
        assert_eq!(v.nodes[2].shards_answered, 0);
        let text = render(&v, false);
        assert!(text.contains("DOWN"), "{text}");
        assert!(!text.contains("CARRIES"), "{text}");
    }
}
