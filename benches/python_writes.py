"""Python writers through ``pagestore://``: CPU seconds per GB of the writing process (Python
and the client library under it) and throughput, for files written in writes of one size.

    python benches/python_writes.py SIZE_MIB WRITE_KIB [PATH_PREFIX [KIND]]

KIND is what each write hands over: ``bytes`` (the default), ``bytearray`` or ``memoryview``
(of a bytearray).

Needs the ``pagestore`` package (``maturin develop --release`` in client/python) and a cluster
with a ``write=back`` mount (PAGESTORE_CLUSTER, PAGESTORE_TLS_DIR; docs/BENCHMARKS.md, "Python
writers"). Writes three files one after another, reads each back and compares, then removes
it. The first file warms the process up; compare the later ones.
"""

import os
import sys
import time

import fsspec


def main():
    size = int(sys.argv[1]) << 20
    chunk = int(sys.argv[2]) << 10
    prefix = sys.argv[3] if len(sys.argv) > 3 else "/ck"
    kind = sys.argv[4] if len(sys.argv) > 4 else "bytes"
    fs = fsspec.filesystem("pagestore")
    block = os.urandom(chunk)
    piece = {
        "bytes": block,
        "bytearray": bytearray(block),
        "memoryview": memoryview(bytearray(block)),
    }[kind]
    want = (block * (size // chunk + 1))[:size]
    for run in range(3):
        path = f"{prefix}/python-writes-{run}.bin"
        c0, t0 = time.process_time(), time.monotonic()
        with fs.open(path, "wb") as f:
            left = size
            while left > 0:
                n = min(chunk, left)
                f.write(piece[:n] if n < chunk else piece)
                left -= n
        c1, t1 = time.process_time(), time.monotonic()
        gb = size / 1e9
        print(f"run {run}: {size >> 20} MiB in {chunk >> 10} KiB writes of {kind}: "
              f"{gb / (t1 - t0):.2f} GB/s, {(c1 - c0) / gb:.2f} CPU-s/GB (this process)",
              flush=True)
        if fs.cat_file(path) != want:
            sys.exit(f"{path}: read back differs")
        fs.rm(path)


if __name__ == "__main__":
    main()
