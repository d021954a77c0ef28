"""pagestore from Python, on the native client library (no gateway in between).

- ``fsspec.filesystem("pagestore")`` / ``fsspec.open("pagestore://data/x.bin")`` /
  ``pandas.read_parquet("pagestore://data/t.parquet")``: the cluster's namespace as an fsspec
  file system (:class:`pagestore.fs.PagestoreFileSystem`); writes as the path's mount allows
  (``write=back``/``transient``: through the cluster; ``write=through``: to the store at close).
- :func:`sync`: wait until what was written under a path is in the store.
- :func:`preload`: load a manifest's files or a prefix into the cache, and wait for it.
- :func:`stats`: the hit ratio, this process's read bandwidth and time to first batch.

Where the cluster is: the ``cluster``, ``tls_dir``, ``timeout`` and ``fallback`` arguments, or
the environment variables ``pagectl`` reads (``PAGESTORE_CLUSTER``, ``PAGESTORE_TLS_DIR``,
``PAGESTORE_HOME``, ``PAGESTORE_ETCD_*``). Each process connects on its first call; a forked
worker connects again on its own.
"""

import os

from . import _native
from ._native import Cluster, PreloadJob, Reader
from .fs import PagestoreFileSystem, PagestoreFile

__all__ = [
    "Cluster",
    "PagestoreFileSystem",
    "PagestoreFile",
    "PreloadJob",
    "Reader",
    "connect",
    "preload",
    "stats",
    "sync",
]

__version__ = _native.__version__

_default = None


def connect(**options):
    """The :class:`Cluster` these options name (see the module docs); with no options, the one
    from the environment, shared by every call."""
    global _default
    if options:
        return Cluster(**options)
    if _default is None:
        _default = Cluster()
    return _default


def _cluster(cluster):
    if cluster is None:
        return connect()
    if isinstance(cluster, PagestoreFileSystem):
        return cluster.cluster
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, dict):
        return Cluster(**cluster)
    return Cluster(cluster=str(cluster))


def _logical(path):
    path = str(path)
    if path.startswith("pagestore://"):
        path = path[len("pagestore://"):]
    return "/" + path.lstrip("/")


def preload(manifest_or_prefix=None, wait=True, *, manifest=None, prefix=None, parallel=16,
            verify=False, timeout=None, cluster=None):
    """Loads files into the cache: the job ``pagectl load`` runs, from this process.

    ``manifest_or_prefix`` is one of: a list of logical paths; a local manifest file (one path
    per line, or JSON lines with a ``path`` field; ``#`` comments); a prefix in the cluster
    (``/data/train`` or ``pagestore://data/train``: every file under it). ``manifest=`` reads a
    manifest (a local file, else a file in the cluster), ``prefix=`` names a prefix explicitly.

    With ``wait`` (the default) returns the job's report when it is done: ``files``,
    ``failed``, ``bytes_total``, ``bytes_loaded``, ``pages_loaded``, ``pages_present``,
    ``time_to_first_page`` (seconds from submission), ``total_secs``, ``failures`` (a list of
    (path, why)) and ``id``; ``timeout`` seconds at most (``TimeoutError``). Without, returns the
    :class:`PreloadJob` (``wait()``, ``done()``, ``record()``). The nodes keep the job's record
    (``pagectl jobs``) when this client's certificate has the writer role.
    """
    c = _cluster(cluster)
    given = [v is not None for v in (manifest_or_prefix, manifest, prefix)]
    if sum(given) != 1:
        raise TypeError("preload needs exactly one of manifest_or_prefix, manifest=, prefix=")
    paths = None
    if manifest_or_prefix is not None:
        v = manifest_or_prefix
        if isinstance(v, (list, tuple)):
            paths, source = [_logical(p) for p in v], f"manifest ({len(v)} paths)"
        elif isinstance(v, os.PathLike) or (isinstance(v, str) and os.path.isfile(v)
                                             and not v.startswith("pagestore://")):
            manifest = os.fspath(v)
        else:
            prefix = _logical(v)
    if manifest is not None:
        m = os.fspath(manifest)
        if os.path.isfile(m) or not m.startswith(("/", "pagestore://")):
            with open(m, encoding="utf-8") as f:
                text = f.read()
        else:
            text = c.cat_file(_logical(m)).decode("utf-8")
        paths, source = _native.parse_manifest(text), f"manifest {m}"
    if prefix is not None:
        prefix = _logical(prefix)
        source = f"prefix {prefix}"
    job = c.preload(paths=paths, prefix=None if paths is not None else prefix, source=source,
                    parallel=parallel, verify=verify)
    if not wait:
        return job
    return job.wait(timeout)


def stats(cluster=None):
    """The three numbers, as far as this process can know them:

    - ``hit_ratio`` (and ``byte_hit_ratio``): every shard's hits over lookups since the nodes
      started (``cluster`` has the sums);
    - ``read_bandwidth``: bytes per second this process read through pagestore, from the start
      of its first read to the end of its last (``read_bytes``, ``read_secs``, ``reads``);
    - ``time_to_first_batch``: seconds from this process's first connection to the end of its
      first read; ``preload_time_to_first_page``: the last preload job's first page.

    ``client`` has the client's counters (owner and replica reads, fallbacks, ...). Each
    process counts its own reads: a data loader's workers each have theirs.
    """
    return _cluster(cluster).stats()


def sync(path="/", timeout=None, cluster=None):
    """Waits until nothing written under ``path`` (a file or a directory, ``/data/x`` or
    ``pagestore://data/x``) through a ``write=back`` mount waits for the store: files closed
    and flushed, deletions and renames applied. ``close()`` already made the bytes durable on
    the cluster and visible to every reader; ``sync`` is for when the store itself must hold
    them (before the cluster goes away, before another system reads the store).

    ``timeout`` seconds at most: ``TimeoutError`` saying what still waits and the last flush
    error. Returns the last state seen (``files_dirty``, ``bytes_dirty``, ``deletes_pending``,
    ``flush_errors``, ``last_error``, ``secs``).
    """
    return _cluster(cluster).sync(_logical(path), timeout)
