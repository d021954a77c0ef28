"""Writes through ``pagestore://`` against the cluster python.rs starts: ``/ck`` is a
write=back mount flushed to PAGESTORE_TEST_STORE, ``/data`` a write=through one this machine
can write (PAGESTORE_TEST_DATA), ``/s3`` read-only from here (see test_pagestore.py for its
errors)."""

import errno
import os
import subprocess
import time
import zlib

import fsspec
import pytest

import pagestore

STORE = os.environ.get("PAGESTORE_TEST_STORE", "")
DATA = os.environ.get("PAGESTORE_TEST_DATA", "")
PAGE = int(os.environ.get("PAGESTORE_TEST_PAGE_SIZE", "0"))
PAGECTL = os.environ.get("PAGESTORE_TEST_PAGECTL", "pagectl")


def sizes():
    return {"empty": 0, "one": 1, "page-1": PAGE - 1, "page": PAGE, "page+1": PAGE + 1,
            "mib5+7": 5 * (1 << 20) + 7}


def content(seed, n):
    # Distinct bytes per file and per position: a misplaced page would not compare equal.
    out = bytearray()
    i = 0
    while len(out) < n:
        out += zlib.crc32(f"{seed}:{i}".encode()).to_bytes(4, "little") * 1024
        i += 1
    return bytes(out[:n])


def pagectl_cat(path):
    return subprocess.run([PAGECTL, "cat", path], check=True, capture_output=True,
                          timeout=60).stdout


@pytest.fixture(scope="module")
def fs():
    return fsspec.filesystem("pagestore")


def test_write_back_files_of_every_edge_size_read_back_before_and_after_sync(fs):
    want = {}
    for i, (name, n) in enumerate(sizes().items()):
        data = content(i, n)
        path = f"/ck/edge/{name}"
        with fs.open(f"pagestore:/{path}", "wb") as f:
            # Odd-sized writes, so that buffers and pages split anywhere.
            step = 100_003
            for at in range(0, n, step):
                assert f.write(data[at:at + step]) == len(data[at:at + step])
            assert f.tell() == n
        want[path] = data
    assert fs.write_policy("/ck/edge/one") == "back"
    for path, data in want.items():
        assert fs.cat_file(path) == data, path
        with fs.open(path, "rb") as f:
            assert f.read() == data
        assert fs.info(path)["size"] == len(data)
    # Another front end, another process: pagectl.
    assert pagectl_cat("/ck/edge/page+1") == want["/ck/edge/page+1"]
    state = pagestore.sync("pagestore://ck/edge", timeout=60)
    assert state["files_dirty"] == 0 and state["deletes_pending"] == 0
    for path, data in want.items():
        with open(os.path.join(STORE, path[len("/ck/"):]), "rb") as f:
            assert f.read() == data, f"{path} in the store"
        assert fs.cat_file(path) == data
    assert pagectl_cat("/ck/edge/mib5+7") == want["/ck/edge/mib5+7"]
    assert sorted(fs.ls("/ck/edge", detail=False)) == sorted(want)


def test_large_and_small_writes_of_every_type_interleave_in_order(fs):
    # Writes of 256 KiB or more go to the writer at once (bytes objects as they are, their
    # whole pages without a copy); smaller writes are buffered. Each lands where it was
    # written.
    k = 1 << 10
    pieces = [b"head", content(1, 2 * PAGE + 5), bytearray(content(2, PAGE + 3)),
              memoryview(content(3, PAGE)), content(4, 7), content(5, PAGE), b"", content(6, 3),
              content(7, 3 * PAGE - 1), content(8, 300 * k), content(9, 256 * k),
              content(10, 256 * k - 1), bytearray(content(11, 300 * k)), content(12, 700 * k),
              memoryview(content(13, 256 * k)), bytearray(content(14, 256 * k - 1)),
              memoryview(bytearray(content(15, 2 * PAGE + 1))), bytearray(b"tail")]
    want = b"".join(bytes(p) for p in pieces)
    with fs.open("/ck/mix/f.bin", "wb") as f:
        for p in pieces:
            assert f.write(p) == len(p)
        assert f.tell() == len(want)
    assert fs.cat_file("/ck/mix/f.bin") == want


def test_small_writes_are_copied_when_written_and_handed_over_by_flush_and_commit(fs):
    # Small writes wait in the file's buffer: a caller may reuse its buffer at once, any
    # buffer of bytes is taken (here an int array), and commit hands them over first.
    import array
    buf = bytearray(b"a" * 1000)
    ints = array.array("i", range(300))
    want = bytearray()
    with fs.open("/ck/small/f.bin", "wb") as f:
        for i in range(3 * PAGE // 1000):
            buf[:4] = i.to_bytes(4, "little")
            f.write(buf)
            want += buf
        buf[:] = b"z" * 1000
        f.write(ints)
        want += ints.tobytes()
        f.flush()
        f.commit()
        assert fs.cat_file("/ck/small/f.bin") == want, "every small write, once committed"
        f.write(b"1")
        f.write(content(3, 300 << 10))
        f.write(b"22")
        want += b"1" + content(3, 300 << 10) + b"22"
        assert f.tell() == len(want)
    assert fs.cat_file("/ck/small/f.bin") == want


def test_a_file_is_visible_from_open_and_whole_at_close(fs):
    with fs.open("/ck/vis/a.bin", "wb") as f:
        assert fs.exists("/ck/vis/a.bin") and fs.info("/ck/vis/a.bin")["size"] == 0
        f.write(b"x" * (PAGE + 5))
        f.flush()
        f.commit()
        assert fs.cat_file("/ck/vis/a.bin") == b"x" * (PAGE + 5)
        f.write(b"tail")
    assert fs.cat_file("/ck/vis/a.bin") == b"x" * (PAGE + 5) + b"tail"
    # Overwrite: a new version, the old one's bytes gone.
    fs.pipe_file("/ck/vis/a.bin", b"short")
    assert fs.cat_file("/ck/vis/a.bin") == b"short"
    with fs.open("/ck/vis/t.txt", "w") as f:
        f.write("line one\nline two\n")
    assert fs.cat_file("/ck/vis/t.txt") == b"line one\nline two\n"
    fs.touch("/ck/vis/touched")
    assert fs.cat_file("/ck/vis/touched") == b""


def test_touch_without_truncate_sets_the_time_of_a_file_written_here(fs):
    fs.pipe_file("/ck/times/f", b"kept")
    before = fs.info("/ck/times/f")
    # A time well apart from the write's: a second's resolution of "now" cannot hide it.
    assert fs.cluster.set_mtime("/ck/times/f", 1_400_000_000 * 10**9)
    assert fs.info("/ck/times/f")["mtime"] == 1_400_000_000
    fs.touch("/ck/times/f", truncate=False)
    after = fs.info("/ck/times/f")
    assert after["mtime"] >= before["mtime"] and after["version"] == before["version"]
    assert fs.cat_file("/ck/times/f") == b"kept"
    # Flushed, it keeps its time too.
    pagestore.sync("pagestore://ck/times", timeout=60)
    assert fs.info("/ck/times/f")["mtime"] == after["mtime"]
    # A file only in the under storage: its time is the store's.
    with open(os.path.join(DATA, "store-only"), "wb") as f:
        f.write(b"s")
    with pytest.raises(NotImplementedError):
        fs.touch("/data/store-only", truncate=False)


def test_exclusive_create(fs):
    fs.pipe_file("/ck/x/there", b"old")
    with pytest.raises(FileExistsError) as e:
        fs.open("/ck/x/there", "xb")
    assert e.value.errno == errno.EEXIST
    with pytest.raises(FileExistsError):
        fs.pipe_file("/ck/x/there", b"new", mode="create")
    assert fs.cat_file("/ck/x/there") == b"old"
    with fs.open("/ck/x/fresh", "xb") as f:
        f.write(b"fresh")
    assert fs.cat_file("/ck/x/fresh") == b"fresh"


def test_mv_rm_mkdir_rmdir(fs):
    fs.makedirs("/ck/ns/a/b", exist_ok=True)
    assert fs.isdir("/ck/ns/a") and fs.isdir("/ck/ns/a/b")
    # A directory made through the cluster keeps its time, and takes a new one; the mount's
    # own directory has none.
    assert fs.modified("/ck/ns/a").timestamp() == pytest.approx(time.time(), abs=120)
    fs.touch("/ck/ns/a", truncate=False)
    fs.cluster.set_mtime("/ck/ns/a/b", 1_500_000_000_250_000_000)
    assert fs.modified("/ck/ns/a/b").timestamp() == pytest.approx(1_500_000_000.25, abs=1e-3)
    [b] = [e for e in fs.ls("/ck/ns/a") if e["name"] == "/ck/ns/a/b"]
    assert b["type"] == "directory" and b["mtime"] == pytest.approx(1_500_000_000.25, abs=1e-3)
    with pytest.raises(IsADirectoryError):
        fs.modified("/ck")
    with pytest.raises(NotImplementedError):
        fs.touch("/ck", truncate=False)
    with pytest.raises(FileExistsError):
        fs.makedirs("/ck/ns/a/b")
    fs.makedirs("/ck/ns/a/b", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.mkdir("/ck/ns/a")
    fs.pipe_file("/ck/ns/a/b/f", b"f")
    with pytest.raises(OSError) as e:
        fs.rmdir("/ck/ns/a/b")
    assert e.value.errno == errno.ENOTEMPTY
    # rename within the mount: atomic, replacing the target.
    fs.pipe_file("/ck/ns/tmp", b"new checkpoint")
    fs.pipe_file("/ck/ns/ckpt", b"old checkpoint")
    fs.mv("/ck/ns/tmp", "/ck/ns/ckpt")
    assert fs.cat_file("/ck/ns/ckpt") == b"new checkpoint" and not fs.exists("/ck/ns/tmp")
    with pytest.raises(FileNotFoundError):
        fs.mv("/ck/ns/tmp", "/ck/ns/other")
    # across mounts: copy and delete (write=back to write=through and back).
    fs.mv("/ck/ns/ckpt", "/data/moved/ckpt")
    assert not fs.exists("/ck/ns/ckpt")
    with open(os.path.join(DATA, "moved", "ckpt"), "rb") as f:
        assert f.read() == b"new checkpoint"
    fs.mv("/data/moved/ckpt", "/ck/ns/back")
    assert fs.cat_file("/ck/ns/back") == b"new checkpoint"
    assert not os.path.exists(os.path.join(DATA, "moved", "ckpt"))
    # a directory: copy and delete, recursively.
    fs.mv("/ck/ns/a", "/ck/ns/z", recursive=True)
    assert fs.cat_file("/ck/ns/z/b/f") == b"f" and not fs.exists("/ck/ns/a")
    with pytest.raises(IsADirectoryError):
        fs.rm("/ck/ns/z")
    fs.rm_file("/ck/ns/back")
    assert not fs.exists("/ck/ns/back")
    with pytest.raises(FileNotFoundError):
        fs.rm_file("/ck/ns/back")
    fs.rm("/ck/ns/z", recursive=True)
    assert not fs.exists("/ck/ns/z")
    # Directories only their files imply (no mkdir): moved and removed recursively too, each
    # gone with its last file.
    fs.pipe_file("/ck/ns/imp/x/y/f", b"deep")
    fs.pipe_file("/ck/ns/imp/g", b"g")
    fs.mv("/ck/ns/imp", "/ck/ns/imp2", recursive=True)
    assert fs.cat_file("/ck/ns/imp2/x/y/f") == b"deep" and not fs.exists("/ck/ns/imp")
    fs.rm("/ck/ns/imp2", recursive=True)
    assert not fs.exists("/ck/ns/imp2")
    fs.rmdir("/ck/ns")
    assert not fs.exists("/ck/ns")
    # What the store holds once flushed: the deletions and renames applied too (no objects
    # left under ns/; a file:// store may keep empty directories, as object stores have none).
    pagestore.sync("/ck", timeout=60)
    left = [os.path.join(d, f) for d, _, fs_ in os.walk(os.path.join(STORE, "ns")) for f in fs_]
    assert left == []


def test_write_through_mount_is_staged_and_sent_at_close(fs):
    assert fs.write_policy("/data/put/x") == "through"
    data = content("through", 2 * PAGE + 3)
    with fs.open("/data/put/x", "wb") as f:
        f.write(data[:10])
        assert not fs.exists("/data/put/x"), "nothing visible before close"
        f.write(data[10:])
    with open(os.path.join(DATA, "put", "x"), "rb") as f:
        assert f.read() == data
    assert fs.cat_file("/data/put/x") == data
    fs.pipe_file("/data/put/x", b"second")
    assert fs.cat_file("/data/put/x") == b"second"
    fs.rm("/data/put/x")
    assert not os.path.exists(os.path.join(DATA, "put", "x"))
    assert not fs.exists("/data/put/x")


def test_parquet_round_trip_through_pandas(fs):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"i": range(50_000), "s": [f"row {i}" for i in range(50_000)]})
    df.to_parquet("pagestore://ck/pq/t.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet("pagestore://ck/pq/t.parquet"), df)
    pagestore.sync("/ck/pq", timeout=60)
    pd.testing.assert_frame_equal(pd.read_parquet(os.path.join(STORE, "pq", "t.parquet")), df)


def test_sync_times_out_with_what_waits_and_checks_its_argument():
    with pytest.raises(ValueError):
        pagestore.sync("/ck", timeout=-1)
    # Nothing waits under a prefix never written: at once.
    assert pagestore.sync("/ck/never", timeout=0)["files_dirty"] == 0
