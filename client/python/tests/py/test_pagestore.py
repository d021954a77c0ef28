"""The pagestore package against a real cluster (started by tests/python.rs, which sets
PAGESTORE_CLUSTER, PAGESTORE_TLS_DIR, PAGESTORE_TEST_DATA: the directory mounted at /data, and
PAGESTORE_TEST_PAGE_SIZE)."""

import errno
import io
import multiprocessing
import os
import pickle
import threading
import time
import zlib

import fsspec
import pytest

import pagestore
from pagestore.fs import PagestoreFileSystem, ReadOnlyError

import workers

DATA = os.environ.get("PAGESTORE_TEST_DATA", "")
PAGE = int(os.environ.get("PAGESTORE_TEST_PAGE_SIZE", "0"))
EDGE = ["empty", "one", "page-1", "page", "page+1", "pages3+123"]
TREE = ["/data/tree/a/x.bin", "/data/tree/a/y.txt", "/data/tree/b/c/x.bin",
        "/data/tree/b/c/y.txt", "/data/tree/top.txt"]


def local(rel):
    with open(os.path.join(DATA, rel), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def fs():
    return fsspec.filesystem("pagestore")


def test_the_entry_point_gives_the_file_system():
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="fsspec.specs") if e.name == "pagestore"] == [
        "pagestore.fs:PagestoreFileSystem"]
    assert fsspec.get_filesystem_class("pagestore") is PagestoreFileSystem
    fs, path = fsspec.core.url_to_fs("pagestore://data/edge/one")
    assert isinstance(fs, PagestoreFileSystem) and path == "/data/edge/one"
    assert fs.unstrip_protocol(path) == "pagestore://data/edge/one"


def test_open_read_is_byte_exact_for_every_edge_size(fs):
    for name in EDGE:
        want = local("edge/" + name)
        with fs.open("pagestore://data/edge/" + name) as f:
            assert f.size == len(want)
            assert f.read() == want, name
            assert f.read() == b"" and f.read(10) == b""
        # Sequential reads of an odd size, crossing every page boundary (read-ahead serves them).
        with fs.open("/data/edge/" + name, "rb") as f:
            parts = []
            while True:
                b = f.read(333_333)
                if not b:
                    break
                assert len(b) == min(333_333, len(want) - sum(map(len, parts)))
                parts.append(b)
            assert b"".join(parts) == want, name
        with fsspec.open("pagestore://data/edge/" + name, "rb") as f:
            assert f.read() == want


def test_seek_and_read_at_the_page_boundaries(fs):
    for name in EDGE:
        want = local("edge/" + name)
        size = len(want)
        with fs.open("/data/edge/" + name) as f:
            for off in sorted({0, 1, PAGE - 1, PAGE, PAGE + 1, 2 * PAGE, max(size - 1, 0), size,
                               size + 10}):
                for n in (1, 2, 4096, PAGE, 2 * PAGE + 5):
                    assert f.seek(off) == off
                    got = f.read(n)
                    assert got == want[off:off + n], (name, off, n)
                    assert f.tell() == off + len(got)
            if size:
                assert f.seek(-1, io.SEEK_END) == size - 1
                assert f.read() == want[-1:]
            f.seek(0)
            assert f.seek(5, io.SEEK_CUR) == 5
            with pytest.raises(ValueError):
                f.seek(-1)
            with pytest.raises(ValueError):
                f.seek(0, 7)
            b = bytearray(7)
            f.seek(0)
            n = f.readinto(b)
            assert n == min(7, size) and bytes(b[:n]) == want[:n]
        assert f.closed
        with pytest.raises(ValueError):
            f.read()


def test_text_mode_lines_and_iteration(fs):
    with fs.open("/data/tree/a/y.txt", "r") as f:
        assert f.read() == "a/y.txt"
    lines = b"".join(b"line %d\n" % i for i in range(5000))
    os.makedirs(os.path.join(DATA, "lines"), exist_ok=True)
    with open(os.path.join(DATA, "lines", "lines.txt"), "wb") as f:
        f.write(lines)
    with fs.open("/data/lines/lines.txt") as f:
        assert f.readline() == b"line 0\n"
        rest = list(f)
    assert len(rest) == 4999 and rest[-1] == b"line 4999\n"


def test_cat_file_ranges_count_like_slices(fs):
    for name in EDGE:
        want = local("edge/" + name)
        p = "pagestore://data/edge/" + name
        assert fs.cat_file(p) == want
        assert fs.cat(p) == want
        for start, end in [(0, 1), (PAGE - 1, PAGE + 1), (-5, None), (None, -1), (1, 3 * PAGE),
                           (len(want), len(want) + 5), (7, 3)]:
            assert fs.cat_file(p, start, end) == want[start:end], (name, start, end)


def test_cat_ranges_in_parallel_with_errors_in_place(fs):
    paths, starts, ends, want = [], [], [], []
    for name in EDGE:
        data = local("edge/" + name)
        for s, e in [(0, None), (1, PAGE + 2), (PAGE - 3, 2 * PAGE + 3), (-100, None)]:
            paths.append("/data/edge/" + name)
            starts.append(s)
            ends.append(e)
            want.append(data[s:e])
    paths.append("/data/edge/missing")
    starts.append(0)
    ends.append(10)
    out = fs.cat_ranges(paths, starts, ends)
    assert out[:-1] == want
    assert isinstance(out[-1], FileNotFoundError) and out[-1].errno == errno.ENOENT
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges(paths, starts, ends, on_error="raise")
    # Scalars for starts and ends, as fsspec allows.
    assert fs.cat_ranges(["/data/edge/page+1"] * 3, 0, 2) == [local("edge/page+1")[:2]] * 3
    # fsspec's cat over several paths goes through cat_file.
    assert fs.cat(["/data/tree/top.txt", "/data/tree/a/y.txt"]) == {
        "/data/tree/top.txt": b"top", "/data/tree/a/y.txt": b"a/y.txt"}


def test_listings(fs):
    assert fs.ls("pagestore://data/tree", detail=False) == [
        "/data/tree/a", "/data/tree/b", "/data/tree/top.txt"]
    entries = {e["name"]: e for e in fs.ls("/data/tree/")}
    assert entries["/data/tree/a"]["type"] == "directory"
    assert entries["/data/tree/top.txt"]["type"] == "file"
    assert entries["/data/tree/top.txt"]["size"] == 3
    assert fs.ls("/data/tree/top.txt") == [fs.info("/data/tree/top.txt")]
    info = fs.info("pagestore://data/edge/page+1")
    assert info["type"] == "file" and info["size"] == PAGE + 1 and info["name"] == "/data/edge/page+1"
    assert info["version"] and info["mtime"] > 1e9
    assert fs.info("/data/tree")["type"] == "directory"
    assert fs.isdir("/data/tree/b") and not fs.isdir("/data/tree/top.txt")
    assert fs.isfile("/data/tree/top.txt") and not fs.isfile("/data/tree")
    assert fs.exists("/data/tree/a/x.bin") and not fs.exists("/data/tree/nope")
    assert fs.size("/data/edge/pages3+123") == 3 * PAGE + 123
    assert fs.find("/data/tree") == TREE
    assert fs.find("pagestore://data/tree/top.txt") == ["/data/tree/top.txt"]
    assert fs.find("/data/nope") == []
    detail = fs.find("/data/tree", detail=True)
    assert sorted(detail) == TREE and detail["/data/tree/top.txt"]["size"] == 3
    assert fs.find("/data/tree", withdirs=True) == sorted(
        TREE + ["/data/tree", "/data/tree/a", "/data/tree/b", "/data/tree/b/c"])
    assert fs.find("/data/tree", maxdepth=1) == ["/data/tree/top.txt"]
    assert fs.glob("pagestore://data/tree/*/x.bin") == ["/data/tree/a/x.bin"]
    assert fs.glob("/data/tree/**/*.txt") == [
        "/data/tree/a/y.txt", "/data/tree/b/c/y.txt", "/data/tree/top.txt"]
    assert [p for p in fs.ls("/", detail=False)] == ["/ck", "/data", "/s3"]
    assert fs.du("/data/tree") == sum(len(local(p[len("/data/"):])) for p in TREE)
    assert fs.modified("/data/tree/top.txt").timestamp() == pytest.approx(
        os.stat(os.path.join(DATA, "tree", "top.txt")).st_mtime, abs=1e-3)


def test_parquet_through_pandas_and_pyarrow(fs):
    pd = pytest.importorskip("pandas")
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = pd.DataFrame({"i": range(300_000), "s": [f"row {i}" for i in range(300_000)]})
    os.makedirs(os.path.join(DATA, "pq"), exist_ok=True)
    local_path = os.path.join(DATA, "pq", "t.parquet")
    # Several row groups, so that the reader seeks around the file.
    pq.write_table(pa.Table.from_pandas(df), local_path, row_group_size=50_000)
    back = pd.read_parquet("pagestore://data/pq/t.parquet")
    pd.testing.assert_frame_equal(back, df)
    t = pq.read_table("/data/pq/t.parquet", filesystem=fs, columns=["s"])
    assert t.column("s").to_pylist() == df["s"].tolist()
    ds = pq.ParquetDataset("/data/pq", filesystem=fs)
    assert ds.read().num_rows == 300_000
    with fs.open("/data/pq/t.parquet") as f:
        assert pq.ParquetFile(f).metadata.num_row_groups == 6


def test_reads_that_meet_by_chance_fetch_only_their_bytes_and_runs_read_ahead(fs):
    want = local("edge/pages3+123")

    def fetched():
        return fs.cluster.stats()["client"]["cluster_bytes"]

    # A random reader whose two reads happen to meet: only their bytes are fetched, not the
    # pages around them and a read-ahead.
    with fs.open("/data/edge/pages3+123") as f:
        before = fetched()
        f.seek(1000)
        assert f.read(4096) + f.read(4096) == want[1000:1000 + 8192]
        assert fetched() - before == 8192
    n = PAGE // 4
    # A run from the file's start is served from whole pages from its second read on, with
    # the pages ahead fetched meanwhile.
    with fs.open("/data/edge/pages3+123") as f:
        before = fetched()
        assert f.read(n) == want[:n]
        assert fetched() - before == n
        assert f.read(n) == want[n:2 * n]
        assert fetched() - before >= n + PAGE, fetched() - before
        assert b"".join(f.read(n) for _ in range(3)) == want[2 * n:5 * n]
        assert fetched() - before >= 2 * PAGE, fetched() - before
    # A run from elsewhere fetches its own bytes until it is longer than a page, then pages.
    with fs.open("/data/edge/pages3+123") as f:
        f.seek(1000)
        before = fetched()
        assert b"".join(f.read(n) for _ in range(4)) == want[1000:1000 + 4 * n]
        assert fetched() - before == 4 * n
        assert f.read(n) == want[1000 + 4 * n:1000 + 5 * n]
        assert fetched() - before >= 4 * n + PAGE, fetched() - before


def test_threads_share_one_file_system(fs):
    want = {n: local("edge/" + n) for n in EDGE}
    errors = []

    def reader(i):
        try:
            for k in range(5):
                n = EDGE[(i + k) % len(EDGE)]
                assert fs.cat_file("/data/edge/" + n) == want[n]
                with fs.open("/data/edge/" + n) as f:
                    f.seek(len(want[n]) // 2)
                    assert f.read() == want[n][len(want[n]) // 2:]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors, errors


def test_the_gil_is_released_while_waiting():
    # A "member" that receives and never answers: the client waits in connect for its timeout,
    # and meanwhile this thread keeps running Python.
    import socket

    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % sink.getsockname()[1]
    silent = PagestoreFileSystem(cluster=addr, timeout=1.5, skip_instance_cache=True)
    out = []

    def blocked():
        try:
            silent.ls("/")
        except OSError as e:
            out.append((time.monotonic(), e))

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.1)
    n, end = 0, time.monotonic() + 0.5
    while time.monotonic() < end:
        n += 1
    t.join()
    sink.close()
    assert len(out) == 1, out
    finished, e = out[0]
    assert finished > end, "the call returned before the counting ended"
    assert n > 10_000, n
    assert e.errno == errno.EIO and "no cluster member answered" in str(e), e


def test_errors_are_python_exceptions(fs):
    with pytest.raises(FileNotFoundError) as e:
        fs.open("/data/edge/missing")
    assert e.value.errno == errno.ENOENT and "/data/edge/missing" in str(e.value)
    with pytest.raises(FileNotFoundError):
        fs.info("pagestore://data/nope/deeper")
    with pytest.raises(FileNotFoundError):
        fs.ls("/data/nope")
    with pytest.raises(IsADirectoryError) as e:
        fs.cat_file("/data/tree")
    assert e.value.errno == errno.EISDIR
    with pytest.raises(IsADirectoryError):
        fs.open("/data/tree")
    with pytest.raises(OSError) as e:
        fs.cat_file("/data/../etc/passwd")
    assert e.value.errno == errno.EINVAL
    # /s3's store takes writes only with the nodes' credentials; /nomount is in no mount.
    assert fs.cat_file("/s3/obj") == b"in s3"
    for write in (lambda: fs.open("/s3/new.bin", "wb"), lambda: fs.open("/s3/new.bin", "xb"),
                  lambda: fs.pipe_file("/s3/n", b"x"), lambda: fs.pipe_file("/nomount/n", b"x"),
                  lambda: fs.rm("/s3/obj"), lambda: fs.rm_file("/s3/obj"),
                  lambda: fs.mkdir("/s3/d"), lambda: fs.makedirs("/s3/d/e", exist_ok=True),
                  lambda: fs.rmdir("/s3"), lambda: fs.touch("/s3/t"),
                  lambda: fs.mv("/s3/obj", "/s3/x"), lambda: fs.mv("/s3/obj", "/ck/x"),
                  lambda: fs.mv("/data/tree/top.txt", "/s3/x")):
        with pytest.raises(ReadOnlyError) as e:
            write()
        assert isinstance(e.value, PermissionError) and isinstance(e.value, NotImplementedError)
        assert e.value.errno == errno.EROFS and "write=back mount" in str(e.value)
    assert fs.cat_file("/s3/obj") == b"in s3" and not fs.exists("/s3/new.bin")
    assert fs.exists("/data/tree/top.txt") and not fs.exists("/ck/x")
    with pytest.raises(NotImplementedError):
        fs.open("/ck/a", "ab")
    with pytest.raises(ValueError):
        PagestoreFileSystem(timeout=-1, skip_instance_cache=True)
    with pytest.raises(OSError) as e:
        PagestoreFileSystem(cluster="/nonexistent/members", skip_instance_cache=True).ls("/")
    assert e.value.errno == errno.EINVAL and "member file" in str(e.value)


def test_open_files_keep_their_version(fs, tmp_path):
    os.makedirs(os.path.join(DATA, "pin"), exist_ok=True)
    old = os.urandom(2 * PAGE + 10)
    for name in ("cached", "uncached"):
        with open(os.path.join(DATA, "pin", name), "wb") as f:
            f.write(old)
    cached = fs.open("/data/pin/cached")
    uncached = fs.open("/data/pin/uncached")
    assert cached.read(10) == old[:10] and uncached.read(10) == old[:10]
    rep = pagestore.preload(["/data/pin/cached"])
    assert rep["failed"] == 0 and rep["pages_loaded"] + rep["pages_present"] == 3
    new = os.urandom(len(old))
    for name in ("cached", "uncached"):
        with open(os.path.join(DATA, "pin", name), "wb") as f:
            f.write(new)
    # Every page of the pinned version is cached: the open file reads it whole, unmixed.
    assert cached.read() == old[10:]
    cached.seek(0)
    assert cached.read() == old
    # Pages of the old version not cached are gone with it: an error, never new bytes.
    with pytest.raises(OSError) as e:
        uncached.seek(PAGE + 5)
        uncached.read(PAGE)
    assert e.value.errno == errno.ESTALE, e.value
    # A pickled open file is the same pinned version.
    cached.seek(3)
    again = pickle.loads(pickle.dumps(cached))
    assert again.tell() == 3 and again.version == cached.version and again.read() == old[3:]
    # Once the metadata TTL (1 s) has passed, a new open reads the new version; until then a
    # new read may still be told the old version, whose pages are gone: ESTALE, never a mix.
    deadline = time.monotonic() + 10
    while True:
        try:
            got = fs.cat_file("/data/pin/uncached")
        except OSError as e:
            assert e.errno == errno.ESTALE, e
            got = None
        if got == new:
            break
        assert got in (None, old), "mixed bytes"
        assert time.monotonic() < deadline, "the new version never became visible"
        time.sleep(0.2)
    with fs.open("/data/pin/uncached") as f:
        assert f.read() == new


def test_forked_workers_connect_afresh(fs):
    # The parent is connected and has a file open with pages fetched and read-ahead in flight.
    want = local("edge/pages3+123")
    f = fs.open("/data/edge/pages3+123")
    assert f.read(PAGE) == want[:PAGE]
    assert f.read(10) == want[PAGE:PAGE + 10]
    workers.FS, workers.FILE = fs, f
    names = ["/data/edge/" + n for n in EDGE]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        out = pool.map(workers.forked, names)
    for path, (pid, (crc, n), pos, rest_crc, rest_len, stats_pid) in zip(names, out):
        data = local(path[len("/data/"):])
        assert (crc, n) == (zlib.crc32(data), len(data)), path
        assert pid != os.getpid() and stats_pid == pid
        assert pos == PAGE + 10
        assert (rest_crc, rest_len) == (zlib.crc32(want[PAGE + 10:]), len(want) - PAGE - 10)
    # The parent goes on as before.
    assert f.read() == want[PAGE + 10:]
    assert fs.cat_file("/data/edge/page") == local("edge/page")
    assert pagestore.stats(fs)["pid"] == os.getpid()


def test_spawned_workers(fs):
    want = local("edge/page+1")
    f = fs.open("/data/edge/page+1")
    f.seek(PAGE - 2)
    args = [("/data/edge/" + n, pickle.dumps(fs), pickle.dumps(f)) for n in EDGE]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        out = pool.map(workers.spawned, args)
    for (path, _, _), (pid, (crc, n), (crc2, n2), pos, rest_crc, rest_len) in zip(args, out):
        data = local(path[len("/data/"):])
        assert (crc, n) == (crc2, n2) == (zlib.crc32(data), len(data)), path
        assert pid != os.getpid()
        assert pos == PAGE - 2 and (rest_crc, rest_len) == (zlib.crc32(want[PAGE - 2:]), 3)


def test_preload_by_prefix_manifest_and_job(fs, tmp_path):
    sizes = [len(local("edge/" + n)) for n in EDGE]
    pages = sum(-(-s // PAGE) for s in sizes)
    rep = pagestore.preload("pagestore://data/edge")
    assert rep["files"] == 6 and rep["failed"] == 0 and rep["failures"] == []
    assert rep["bytes_total"] == sum(sizes)
    assert rep["pages_loaded"] + rep["pages_present"] == pages
    assert rep["time_to_first_page"] is not None and 0 < rep["time_to_first_page"] <= rep["total_secs"]
    again = pagestore.preload(prefix="/data/edge", cluster=fs)
    assert (again["pages_loaded"], again["pages_present"]) == (0, pages)
    # A manifest: JSON and plain lines in a local file; a missing file fails alone.
    m = tmp_path / "manifest.jsonl"
    m.write_text('# the tree\n{"path": "/data/tree/top.txt"}\n/data/tree/a/x.bin\n/data/tree/nope\n')
    rep = pagestore.preload(m)
    assert rep["files"] == 3 and rep["failed"] == 1
    assert rep["failures"][0][0] == "/data/tree/nope" and "no such file" in rep["failures"][0][1]
    job = pagestore.preload(["/data/tree/a/y.txt", "pagestore://data/tree/b/c/y.txt"], wait=False)
    assert isinstance(job, pagestore.PreloadJob)
    rep = job.wait(timeout=30)
    assert job.done() and rep["files"] == 2 and rep["failed"] == 0 and rep["id"] == job.id
    assert job.wait() == rep
    ids = [r["id"] for r in fs.cluster.jobs()]
    assert job.id in ids
    rec = job.record()
    assert rec["state"] == "done" and rec["files_done"] == 2
    with pytest.raises(FileNotFoundError):
        pagestore.preload("/data/nope")
    bad = tmp_path / "bad.txt"
    bad.write_text("/data/ok\nrelative/path\n")
    with pytest.raises(ValueError) as e:
        pagestore.preload(manifest=bad)
    assert "line 2" in str(e.value)
    with pytest.raises(TypeError):
        pagestore.preload()


def test_stats_give_the_three_numbers(fs):
    fs.cat_file("/data/edge/page")
    s = pagestore.stats(fs)
    assert 0.0 < s["hit_ratio"] <= 1.0 and 0.0 < s["byte_hit_ratio"] <= 1.0
    assert s["cluster"]["shards"] == 6 and s["cluster"]["shards_answered"] == 6
    assert s["cluster"]["hits"] > 0
    assert s["read_bytes"] > 0 and s["reads"] > 0 and s["read_bandwidth"] > 0
    assert 0 < s["time_to_first_batch"] < 60
    assert s["preload_time_to_first_page"] is not None
    assert s["client"]["owner_reads"] > 0 and s["client"]["fallbacks"] == 0
    assert s["pid"] == os.getpid()


def test_certificate_refusal_is_permission_error():
    fs = PagestoreFileSystem(skip_instance_cache=True)
    with pytest.raises(PermissionError) as e:
        fs.ls("/data")
    assert e.value.errno == errno.EACCES
    assert "client certificate" in str(e.value), e.value
