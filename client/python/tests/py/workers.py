"""What the forked and spawned workers of test_pagestore.py run (a module of its own, so that
spawned children import it by name)."""

import os
import zlib

import fsspec

# Set by the parent before it forks: a file system and an open file the children inherit.
FS = None
FILE = None


def crc_of(fs, path):
    with fs.open(path) as f:
        data = f.read()
    return zlib.crc32(data), len(data)


def forked(path):
    """In a forked child: read through the file system object created by the parent, go on
    reading the file the parent had open, and report this process's own stats."""
    import pagestore

    crc = crc_of(FS, path)
    pos = FILE.tell()
    rest = FILE.read()
    # A child may run several tasks: each starts where the parent was.
    FILE.seek(pos)
    return os.getpid(), crc, pos, zlib.crc32(rest), len(rest), pagestore.stats(FS)["pid"]


def spawned(args):
    """In a spawned child: a file system from the environment (the entry point), one unpickled
    from the parent, and an unpickled open file."""
    path, pickled_fs, pickled_file = args
    import pickle

    fs = fsspec.filesystem("pagestore")
    crc = crc_of(fs, path)
    fs2 = pickle.loads(pickled_fs)
    crc2 = crc_of(fs2, path)
    f = pickle.loads(pickled_file)
    pos = f.tell()
    rest = f.read()
    return os.getpid(), crc, crc2, pos, zlib.crc32(rest), len(rest)
