"""The Python side of `pagebench pycmp` (tools/pagebench/src/pycmp.rs): the same reads through
the native fsspec file system (pagestore://), s3fs over pages3 and plain files of a pagefs
mount, each by N worker processes (spawned), and the sample ranges checked on each.

Reads a JSON config on stdin (see pycmp.rs) and prints one JSON document on stdout.
"""

import json
import mmap
import multiprocessing as mp
import os
import random
import sys
import time
import zlib


def make_reader(target, cfg):
    """A function (file index, offset, length) -> bytes for `target`, and a per-run setup."""
    files = cfg["files"]
    if target == "native":
        from pagestore.fs import PagestoreFileSystem

        fs = PagestoreFileSystem(skip_instance_cache=True, **cfg["native"])
        return fs, [f["path"] for f in files]
    if target == "s3fs":
        import s3fs

        c = cfg["s3fs"]
        fs = s3fs.S3FileSystem(key=c["key"], secret=c["secret"], skip_instance_cache=True,
                               client_kwargs={"endpoint_url": c["endpoint"],
                                              "region_name": "us-east-1"},
                               config_kwargs={"s3": {"addressing_style": "path"}})
        return fs, [c["bucket"] + "/" + f["rel"] for f in files]
    if target == "pagefs":
        return None, [os.path.join(cfg["pagefs"]["root"], f["rel"]) for f in files]
    raise SystemExit(f"unknown target {target}")


def seq_worker(target, cfg, w, i, barrier, out):
    fs, paths = make_reader(target, cfg)
    block = w["block"]
    mine = list(range(i, len(paths), cfg["readers"]))
    if fs is not None and target == "native":
        fs.cluster.connect()
    barrier.wait()
    t0 = time.monotonic()
    deadline = t0 + cfg["seconds"]
    lat, total, ops = [], 0, 0
    for k in mine:
        if time.monotonic() >= deadline:
            break
        size = cfg["files"][k]["size"]
        got = 0
        if target == "pagefs":
            fd = os.open(paths[k], os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            f = None
        elif target == "s3fs":
            f = fs.open(paths[k], "rb", block_size=block)
        else:
            f = fs.open(paths[k], "rb")
        while True:
            s = time.monotonic()
            b = os.read(fd, block) if f is None else f.read(block)
            if not b:
                break
            lat.append(time.monotonic() - s)
            got += len(b)
            ops += 1
            if time.monotonic() >= deadline:
                break
        if f is None:
            os.close(fd)
        else:
            f.close()
        if got != size and time.monotonic() < deadline:
            out.put({"error": f"{paths[k]}: read {got} bytes of {size}"})
            return
        total += got
    out.put({"bytes": total, "ops": ops, "t0": t0, "t1": time.monotonic(), "lat": lat})


def rand_worker(target, cfg, w, i, barrier, out):
    fs, paths = make_reader(target, cfg)
    block, page = w["block"], cfg["page"]
    files = cfg["files"]
    # Every file open first (s3fs: one HEAD each), then one ranged read per operation.
    if target == "pagefs":
        fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in paths]
        buf = mmap.mmap(-1, block)
    elif target == "s3fs":
        handles = [fs.open(p, "rb", block_size=block, cache_type="none") for p in paths]
    else:
        handles = [fs.open(p, "rb") for p in paths]
    rng = random.Random(cfg["seed"] * 1000 + i)
    barrier.wait()
    t0 = time.monotonic()
    deadline = t0 + cfg["seconds"]
    lat, total, ops = [], 0, 0
    while True:
        s = time.monotonic()
        if s >= deadline:
            break
        k = rng.randrange(len(files))
        size = files[k]["size"]
        pages = max(1, -(-size // page))
        p = rng.randrange(pages)
        off = p * page + rng.randrange(max(1, page // block)) * block
        off = min(off, max(0, size - block))
        want = min(block, size - off)
        if target == "pagefs":
            n = os.preadv(fds[k], [buf], off)
        else:
            h = handles[k]
            h.seek(off)
            n = len(h.read(block))
        lat.append(time.monotonic() - s)
        if n != want:
            out.put({"error": f"{paths[k]}: {n} bytes at {off}, expected {want}"})
            return
        total += n
        ops += 1
    out.put({"bytes": total, "ops": ops, "t0": t0, "t1": time.monotonic(), "lat": lat})


def quantile(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(target, cfg, w):
    ctx = mp.get_context("spawn")
    n = cfg["readers"]
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    fn = seq_worker if w["name"] == "seq" else rand_worker
    procs = [ctx.Process(target=fn, args=(target, cfg, w, i, barrier, out)) for i in range(n)]
    [p.start() for p in procs]
    results = [out.get(timeout=cfg["seconds"] + 300) for _ in procs]
    [p.join() for p in procs]
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        return {"target": target, "workload": w["name"], "errors": errors}
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    lat = [x for r in results for x in r["lat"]]
    return {"target": target, "workload": w["name"], "readers": n, "block": w["block"],
            "bytes": sum(r["bytes"] for r in results), "ops": sum(r["ops"] for r in results),
            "secs": t1 - t0, "p50_us": quantile(lat, 0.5) * 1e6,
            "p99_us": quantile(lat, 0.99) * 1e6, "errors": []}


def check(target, cfg):
    """Mismatches of the sample ranges' crc32 read through `target`."""
    fs, paths = make_reader(target, cfg)
    bad = []
    for k, off, length, crc in cfg["checks"]:
        if fs is None:
            with open(paths[k], "rb") as f:
                f.seek(off)
                b = f.read(length)
        else:
            b = fs.cat_file(paths[k], start=off, end=off + length)
        if zlib.crc32(b) != crc or len(b) != length:
            bad.append([k, off, length])
    return bad


def main():
    cfg = json.load(sys.stdin)
    runs, checks = [], {}
    for w in cfg["workloads"]:
        for target in cfg["targets"]:
            runs.append(run(target, cfg, w))
            print(f"pycmp: {target} {w['name']} done", file=sys.stderr, flush=True)
    for target in cfg["targets"]:
        checks[target] = check(target, cfg)
    print(json.dumps({"runs": runs, "checks": checks}))


if __name__ == "__main__":
    main()
