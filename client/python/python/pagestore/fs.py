"""The fsspec file system for ``pagestore://`` URLs (registered through the ``fsspec.specs``
entry point), on the native client library.

``pagestore://data/train/x.bin`` is the logical path ``/data/train/x.bin``: the first component
is the first directory of the cluster's namespace (a mount prefix), as an S3 URL's first
component is its bucket. Reads only: see :data:`WRITE_HINT`.
"""

import errno
import io
import os

from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

from . import _native

WRITE_HINT = (
    "pagestore:// is read-only from Python: write to the under storage itself, or through a "
    "write-back mount of the cluster (see OPERATIONS.md); readers then see the new version"
)


class ReadOnlyError(PermissionError, NotImplementedError):
    """A write through ``pagestore://`` (a ``PermissionError`` with ``errno.EROFS``, and a
    ``NotImplementedError`` for the fsspec callers that look for that)."""

    def __init__(self, what):
        super().__init__(errno.EROFS, f"{what}: {WRITE_HINT}")


class PagestoreFileSystem(AbstractFileSystem):
    """The cluster's namespace, read-only, through the native client (no gateway hop).

    Arguments (all optional; unset ones come from the environment, as for ``pagectl``):
    ``cluster`` (a member's ``IP:PORT``, a member file, or ``etcd://``; ``PAGESTORE_CLUSTER``),
    ``tls_dir`` (``PAGESTORE_TLS_DIR``), ``timeout`` (seconds per request to a member),
    ``fallback`` (read the under storage directly when a member is down; default True),
    ``readahead`` (pages fetched ahead of a sequential reader), ``parallel`` (page requests in
    flight per read), and the etcd ones (``etcd_user``, ``etcd_password_file``, ``etcd_ca``,
    ``etcd_cert``, ``etcd_key``).
    """

    protocol = "pagestore"
    root_marker = "/"

    def __init__(self, cluster=None, tls_dir=None, timeout=None, fallback=True, readahead=None,
                 parallel=None, etcd_user=None, etcd_password_file=None, etcd_ca=None,
                 etcd_cert=None, etcd_key=None, **kwargs):
        super().__init__(**kwargs)
        self.cluster = _native.Cluster(
            cluster=cluster, tls_dir=None if tls_dir is None else os.fspath(tls_dir),
            timeout=timeout, fallback=fallback, readahead=readahead, parallel=parallel,
            etcd_user=etcd_user, etcd_password_file=etcd_password_file, etcd_ca=etcd_ca,
            etcd_cert=etcd_cert, etcd_key=etcd_key)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, (list, tuple)):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("pagestore://"):
            path = path[len("pagestore://"):]
        elif path.startswith("pagestore:"):
            path = path[len("pagestore:"):]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    def unstrip_protocol(self, name):
        return "pagestore://" + self._strip_protocol(name).lstrip("/")

    # -- metadata

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self.cluster.info(path)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        try:
            entries = self.cluster.list(path)
        except NotADirectoryError:
            info = self.info(path)
            return [info] if detail else [info["name"]]
        base = "" if path == "/" else path
        out = []
        for name, is_dir, size, version, mtime in entries:
            full = f"{base}/{name}"
            if not detail:
                out.append(full)
            elif is_dir:
                out.append({"name": full, "type": "directory", "size": 0})
            else:
                out.append({"name": full, "type": "file", "size": size, "version": version,
                            "mtime": mtime})
        return out

    def exists(self, path, **kwargs):
        # Only "not there" is False: an unreachable cluster raises, as any other read would.
        try:
            self.info(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        if maxdepth is not None or withdirs:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail,
                                **kwargs)
        path = self._strip_protocol(path)
        try:
            files = self.cluster.walk(path)
        except FileNotFoundError:
            files = []
        if detail:
            return {p: {"name": p, "type": "file", "size": size, "version": version,
                        "mtime": mtime} for p, size, version, mtime in files}
        return [p for p, _, _, _ in files]

    def modified(self, path):
        import datetime

        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, "a directory has no modification time", path)
        return datetime.datetime.fromtimestamp(info["mtime"], tz=datetime.timezone.utc)

    def checksum(self, path):
        info = self.info(path)
        return int(info.get("file_id", "0"), 16)

    def ukey(self, path):
        return self.info(path).get("file_id") or self._strip_protocol(path)

    # -- reads

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        if mode != "rb":
            raise ReadOnlyError(f"open {path!r} with mode {mode!r}")
        return PagestoreFile(self, self.cluster.open(self._strip_protocol(path)))

    def cat_file(self, path, start=None, end=None, **kwargs):
        return self.cluster.cat_file(self._strip_protocol(path), start, end)

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        n = len(paths)
        if not isinstance(starts, (list, tuple)):
            starts = [starts] * n
        if not isinstance(ends, (list, tuple)):
            ends = [ends] * n
        if len(starts) != n or len(ends) != n:
            raise ValueError("paths, starts and ends must have the same length")
        out = self.cluster.cat_ranges([self._strip_protocol(p) for p in paths],
                                      list(starts), list(ends))
        if on_error == "raise":
            for r in out:
                if isinstance(r, BaseException):
                    raise r
        return out

    # -- writes: not through this file system

    def _refuse(self, what, *args, **kwargs):
        raise ReadOnlyError(what)

    def pipe_file(self, path, value, **kwargs):
        self._refuse(f"write {path!r}")

    def put_file(self, lpath, rpath, **kwargs):
        self._refuse(f"upload to {rpath!r}")

    def cp_file(self, path1, path2, **kwargs):
        self._refuse(f"copy to {path2!r}")

    def mv(self, path1, path2, **kwargs):
        self._refuse(f"move {path1!r}")

    def rm_file(self, path):
        self._refuse(f"remove {path!r}")

    def rm(self, path, recursive=False, maxdepth=None):
        self._refuse(f"remove {path!r}")

    def rmdir(self, path):
        self._refuse(f"remove {path!r}")

    def mkdir(self, path, create_parents=True, **kwargs):
        self._refuse(f"mkdir {path!r}")

    def makedirs(self, path, exist_ok=False):
        self._refuse(f"mkdir {path!r}")

    def touch(self, path, truncate=True, **kwargs):
        self._refuse(f"touch {path!r}")


def _reopen(fs, path, size, version, mtime, pos, closed):
    f = PagestoreFile(fs, fs.cluster.open_version(path, size, version, mtime))
    f.seek(pos)
    if closed:
        f.close()
    return f


class PagestoreFile(io.RawIOBase):
    """An open file: seekable, every read of the version that existed at ``open`` (a later
    change of the object is not seen; a read that cannot be served at that version raises
    ``OSError`` ESTALE), read-ahead while read sequentially. Pickles as the same pinned version
    at the same position (for ``spawn``ed workers); a forked child goes on reading it with its
    own connections."""

    def __init__(self, fs, reader):
        super().__init__()
        self.fs = fs
        self._r = reader
        self.path = reader.path
        self.size = reader.size
        self.version = reader.version
        self._mtime = None
        self.mode = "rb"

    def __reduce__(self):
        return (_reopen, (self.fs, self.path, self.size, self.version, self._r.mtime,
                          0 if self.closed else self.tell(), self.closed))

    def __repr__(self):
        return f"<PagestoreFile {self.path!r} version {self.version!r}>"

    @property
    def name(self):
        return "pagestore://" + self.path.lstrip("/")

    def info(self):
        return {"name": self.path, "type": "file", "size": self.size, "version": self.version}

    def readable(self):
        return True

    def seekable(self):
        return True

    def writable(self):
        return False

    def read(self, size=-1):
        if size is None:
            size = -1
        return self._r.read(size)

    def readall(self):
        return self._r.read(-1)

    def readinto(self, b):
        view = memoryview(b).cast("B")
        data = self._r.read(len(view))
        view[:len(data)] = data
        return len(data)

    def seek(self, offset, whence=io.SEEK_SET):
        return self._r.seek(offset, whence)

    def tell(self):
        return self._r.tell()

    def close(self):
        if not self.closed:
            self._r.close()
        super().close()

    @property
    def closed(self):
        return self._r.closed
