"""The fsspec file system for ``pagestore://`` URLs (registered through the ``fsspec.specs``
entry point), on the native client library.

``pagestore://data/train/x.bin`` is the logical path ``/data/train/x.bin``: the first component
is the first directory of the cluster's namespace (a mount prefix), as an S3 URL's first
component is its bucket.

Writes follow the mount's write policy (``?write=`` in its URL), as pagefs does:

- ``write=back`` / ``write=transient``: written through the cluster. ``open(path, "wb")``
  streams into a writer: each page goes to its write replicas as it fills (memory stays
  bounded); ``close()`` commits the file (durable on the write replicas, visible to every
  reader that opens it after); ``write=back`` files reach the store later
  (:func:`pagestore.sync` waits for that).
- ``write=through`` whose store this machine can write (credentials here): the file is
  buffered in a local temporary file and sent to the store whole at ``close()`` (one request,
  read into memory).
- anything else (no mount, or a store only the nodes can write): read-only,
  :class:`ReadOnlyError` (``PermissionError`` with ``errno.EROFS``).
"""

import errno
import io
import os
import tempfile
import time

from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

from . import _native

WRITE_HINT = (
    "read-only from here: its mount writes through to a store this machine has no credentials "
    "for, or no mount holds it; write through a write=back mount (see OPERATIONS.md)"
)


class ReadOnlyError(PermissionError, NotImplementedError):
    """A write through ``pagestore://`` (a ``PermissionError`` with ``errno.EROFS``, and a
    ``NotImplementedError`` for the fsspec callers that look for that)."""

    def __init__(self, what):
        super().__init__(errno.EROFS, f"{what}: {WRITE_HINT}")


class PagestoreFileSystem(AbstractFileSystem):
    """The cluster's namespace through the native client (no gateway hop); writes as the
    mount's write policy allows (see the module docs).

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
                d = {"name": full, "type": "directory", "size": 0}
                if mtime:
                    # A directory made through the cluster keeps its time.
                    d["mtime"] = mtime
                out.append(d)
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
        if "mtime" not in info:
            raise IsADirectoryError(
                errno.EISDIR, "a directory not made through the cluster has no modification time",
                path)
        return datetime.datetime.fromtimestamp(info["mtime"], tz=datetime.timezone.utc)

    def checksum(self, path):
        info = self.info(path)
        return int(info.get("file_id", "0"), 16)

    def ukey(self, path):
        return self.info(path).get("file_id") or self._strip_protocol(path)

    # -- reads

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        path = self._strip_protocol(path)
        if mode == "rb":
            return PagestoreFile(self, self.cluster.open(path))
        if mode not in ("wb", "xb"):
            raise NotImplementedError(
                f"open {path!r} with mode {mode!r}: pagestore:// opens files with rb, wb or xb")
        how = self._writes(path, f"write {path!r}")
        if mode == "xb" and self.exists(path):
            raise FileExistsError(errno.EEXIST, "the file exists", path)
        self.invalidate_cache(path)
        if how == "cluster":
            return PagestoreWriteFile(self, path, self.cluster.create(path), mode,
                                      block_size or self.cluster.page_size)
        return PagestoreStagedFile(self, path, mode)

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

    # -- writes (see the module docs)

    def _writes(self, path, what):
        """How `path` takes writes: "cluster" or "store"; ReadOnlyError otherwise."""
        how = self.cluster.write_mode(path)
        if how == "none":
            raise ReadOnlyError(what)
        return how

    def write_policy(self, path):
        """The write policy of the mount of ``path``: "through", "back" or "transient"."""
        return self.cluster.write_policy(self._strip_protocol(path))

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        with self.open(path, "xb" if mode == "create" else "wb") as f:
            f.write(value)

    def cp_file(self, path1, path2, **kwargs):
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        with self.open(path1, "rb") as src, self.open(path2, "wb") as dst:
            while True:
                chunk = src.read(4 << 20)
                if not chunk:
                    break
                dst.write(chunk)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Renames a file within a write=back or write=transient mount (atomic for readers,
        an existing ``path2`` replaced); otherwise (directories, across mounts, write=through
        mounts) copies and then deletes, as fsspec does."""
        p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if p1 == p2:
            return
        same = self.cluster.mount_prefix(p1) == self.cluster.mount_prefix(p2)
        if (same and self.cluster.write_mode(p1) == "cluster"
                and self.info(p1)["type"] == "file"):
            self._writes(p2, f"move to {p2!r}")
            try:
                self.cluster.rename(p1, p2, True)
            finally:
                self.invalidate_cache(p1)
                self.invalidate_cache(p2)
            return
        self._writes(p1, f"move {p1!r}")
        self._writes(p2, f"move to {p2!r}")
        super().mv(p1, p2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def rm_file(self, path):
        path = self._strip_protocol(path)
        self._writes(path, f"remove {path!r}")
        try:
            self.cluster.delete(path)
        finally:
            self.invalidate_cache(path)

    def _rm(self, path):
        self.rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        """Removes files, and with ``recursive`` directories and all under them (deepest
        first); a directory without ``recursive`` is ``IsADirectoryError``."""
        paths = path if isinstance(path, (list, tuple)) else [path]
        for p in paths:
            p = self._strip_protocol(p)
            self._writes(p, f"remove {p!r}")
            if self.isdir(p):
                if not recursive:
                    raise IsADirectoryError(errno.EISDIR, "a directory (rm needs recursive=True)",
                                            p)
                found = self.find(p, maxdepth=maxdepth, withdirs=True, detail=True)
                for q in sorted(found, key=lambda q: (-q.count("/"), q)):
                    if q == p:
                        continue
                    if found[q]["type"] == "directory":
                        self._rmdir_emptied(q)
                    else:
                        self.rm_file(q)
                if maxdepth is None:
                    self._rmdir_emptied(p)
            else:
                self.rm_file(p)

    def _rmdir_emptied(self, path):
        """Removes a directory whose contents were just removed: one that only the paths
        beneath it implied (no mkdir made it) went with the last of them."""
        try:
            self.rmdir(path)
        except FileNotFoundError:
            pass

    def rmdir(self, path):
        path = self._strip_protocol(path)
        how = self._writes(path, f"remove {path!r}")
        try:
            if how == "cluster":
                self.cluster.remove_dir(path)
            elif self.ls(path, detail=False):
                # A store's directories are the prefixes of its objects.
                raise OSError(errno.ENOTEMPTY, "the directory is not empty", path)
        finally:
            self.invalidate_cache(path)

    def mkdir(self, path, create_parents=True, **kwargs):
        """Makes a directory (write=back and write=transient mounts; on a write=through mount
        directories are the prefixes of objects and need no making). An existing one is
        ``FileExistsError``; with ``create_parents`` missing parents are made too."""
        path = self._strip_protocol(path)
        how = self._writes(path, f"mkdir {path!r}")
        if how != "cluster":
            return
        if create_parents:
            top = self.cluster.mount_prefix(path) or ""
            parent = path.rsplit("/", 1)[0]
            missing = []
            while parent and parent != top and not self.exists(parent):
                missing.append(parent)
                parent = parent.rsplit("/", 1)[0]
            for p in reversed(missing):
                try:
                    self.cluster.make_dir(p)
                except FileExistsError:
                    pass
        try:
            self.cluster.make_dir(path)
        finally:
            self.invalidate_cache(path)

    def makedirs(self, path, exist_ok=False):
        try:
            self.mkdir(path, create_parents=True)
        except FileExistsError:
            if not exist_ok:
                raise

    def touch(self, path, truncate=True, **kwargs):
        """Creates ``path`` empty (``truncate``, or where nothing is), else sets its modification
        time to now: kept for files and directories made through the cluster; a file or a
        directory only in the under storage has the store's time (or none), which cannot be set
        (``NotImplementedError``)."""
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self.pipe_file(path, b"")
        elif not self.cluster.set_mtime(path, time.time_ns()):
            raise NotImplementedError(
                f"{path}: only in the under storage, whose modification time cannot be set")

    def sync(self, path="/", timeout=None):
        """Waits until nothing under ``path`` waits for the store (see :func:`pagestore.sync`)."""
        return self.cluster.sync(self._strip_protocol(path), timeout)


def _reopen(fs, path, size, version, mtime, pos, closed):
    f = PagestoreFile(fs, fs.cluster.open_version(path, size, version, mtime))
    f.seek(pos)
    if closed:
        f.close()
    return f


class PagestoreFile(io.RawIOBase):
    """An open file: seekable, every read of the version that existed at ``open`` (a later
    change of the object is not seen; a read that cannot be served at that version raises
    ``OSError`` ESTALE), whole pages and read-ahead once read sequentially from the start or
    for more than a page. Pickles as the same pinned version at the same position (for
    ``spawn``ed workers); a forked child goes on reading it with its own connections."""

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


class _WriteFileBase(io.RawIOBase):
    """What both write files share: sequential writes, ``tell``, context manager."""

    def __init__(self, fs, path, mode):
        super().__init__()
        self.fs = fs
        self.path = path
        self.mode = mode
        self._pos = 0

    @property
    def name(self):
        return "pagestore://" + self.path.lstrip("/")

    def readable(self):
        return False

    def seekable(self):
        return False

    def writable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        if (whence == io.SEEK_SET and offset == self._pos) or (
                whence in (io.SEEK_CUR, io.SEEK_END) and offset == 0):
            return self._pos
        raise io.UnsupportedOperation("a file open for writing is written sequentially")

    def __repr__(self):
        return f"<{type(self).__name__} {self.path!r} mode {self.mode!r}>"


# A write this large (or a block) is handed to the writer, not buffered.
_HAND_OVER_MIN = 256 << 10


class PagestoreWriteFile(_WriteFileBase):
    """A file being written through the cluster (a write=back or write=transient mount):
    ``write`` buffers up to ``block_size`` bytes and hands full buffers to the writer, which
    sends each page to its write replicas as it fills (a write of 256 KiB or more goes to the
    writer at once, a ``bytes`` object as it is); ``flush`` hands over the buffer (it
    commits nothing); ``commit`` makes everything written so far durable and visible (fsync);
    ``close`` commits the file for good (errors as ``OSError`` with errno: ENOSPC when the
    cluster has no room for dirty data, EROFS, EIO). The file exists (empty) from ``open`` on."""

    def __init__(self, fs, path, writer, mode, block_size):
        super().__init__(fs, path, mode)
        self._w = writer
        self._buf = bytearray()
        self._sent = 0
        self._block = max(int(block_size), 1)

    def write(self, b):
        if self.closed:
            raise ValueError("write to a closed file")
        n = len(memoryview(b).cast("B"))
        self._pos += n
        if n >= min(self._block, _HAND_OVER_MIN):
            # A large write goes to the writer after what is buffered, a bytes object as it is
            # (anything else copied once into one, not twice, into the buffer and out of it):
            # the pages it covers whole are sent without a copy, the rest copied once into the
            # writer's pages.
            self._hand_over()
            self._w.write_at(self._sent, b if type(b) is bytes else bytes(b))
            self._sent += n
            return n
        self._buf += b
        if len(self._buf) >= self._block:
            self._hand_over(whole_blocks=True)
        return n

    def _hand_over(self, whole_blocks=False):
        """Hands the buffer to the writer; with ``whole_blocks``, only up to the last block
        boundary it reaches (the rest waits for more), so that what is handed over covers whole
        pages, which the writer sends without copying them again."""
        n = len(self._buf)
        if whole_blocks:
            n -= (self._sent + n) % self._block
        if n <= 0:
            return
        with memoryview(self._buf) as m:
            data = bytes(m[:n])
        del self._buf[:n]
        self._w.write_at(self._sent, data)
        self._sent += n

    def flush(self):
        if not self.closed:
            self._hand_over()

    def commit(self):
        """Makes what was written so far durable on the write replicas and visible to readers
        that open the file after (as fsync does); the file stays open."""
        self._hand_over()
        self._w.commit()
        self.fs.invalidate_cache(self.path)

    def discard(self):
        """Closes without committing what was not committed yet."""
        self._buf.clear()
        self._w.abort()
        super().close()

    def close(self):
        if self.closed:
            return
        try:
            self._hand_over()
            self._w.close()
        finally:
            self._w.abort()
            self.fs.invalidate_cache(self.path)
            super().close()


class PagestoreStagedFile(_WriteFileBase):
    """A file of a write=through mount: written to a local temporary file, sent to the store
    whole at ``close`` (``Client::put``: one request, the file read into memory; then the
    cluster forgets the old version). Nothing is visible before ``close``."""

    def __init__(self, fs, path, mode):
        super().__init__(fs, path, mode)
        self._tmp = tempfile.NamedTemporaryFile(prefix="pagestore-", delete=False)

    def write(self, b):
        if self.closed:
            raise ValueError("write to a closed file")
        n = self._tmp.write(b)
        self._pos += n
        return n

    def flush(self):
        if not self.closed and not self._tmp.closed:
            self._tmp.flush()

    def discard(self):
        self._tmp.close()
        os.unlink(self._tmp.name)
        super().close()

    def close(self):
        if self.closed:
            return
        try:
            self._tmp.close()
            self.fs.cluster.put_file(self.path, self._tmp.name)
        finally:
            try:
                os.unlink(self._tmp.name)
            except FileNotFoundError:
                pass
            self.fs.invalidate_cache(self.path)
            super().close()
