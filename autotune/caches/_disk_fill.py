"""A disk cache (pickle, hdf5, lmdb) filled while the first epoch trains (``cache_fill="first_epoch"``).

The semantics of tf.data's ``cache(filename)``, as the memory cache's fill has them (``_fill``): the
first epoch reads the source in the loader's own workers, each sample goes to training and into the
cache, and later epochs read the cache. Position k holds ``dataset[indices[k]]``.

While it fills, everything lives in a staging folder beside the cache, ``ROOT/.<name>.fill-<pid>-<hex>``
(mode 0o700, like a build's temp folder):

- ``spool-<pid>.bin``: the packed records (``codec.pack``, the pickle cache's records) one process
  appended, each opened ``O_APPEND`` by its only writer;
- ``fill.idx``: per position (writer pid, offset, length, crc32) as int64, then one filled byte per
  position, mapped shared by every process that opens it, so workers of any start method see it;
- ``fill.lock``: held (``flock``) by the filling process while it lives, so a builder or
  ``cache clear`` elsewhere can tell a live fill from a dead one's leftovers.

A worker writes a record, then its row, then the filled byte. A reader trusts a record only when its
byte is set and its length and checksum match, and reads the source otherwise, so every epoch yields
exactly ``dataset[i]`` even when two workers raced on one position (a sampler that repeats indices).

Nothing claims to be a cache until the fill is whole. A thread of the filling process waits for the
last filled byte, checks every record's checksum (re-reading any that fails from the source), then,
holding the cache's build lock (NOTE [cache build lock] in ``_lock``), writes the cache through the
backend (``DiskCache.write_records``: the pickle cache links the spool files in as they are; hdf5 and
lmdb convert the records) and seals it with the manifest last (``DiskCache.seal``). A whole fill
not committed yet when the process exits is committed then; a partial one (Ctrl-C, a sampler that
skips samples, a single epoch of a shard) leaves nothing: the staging folder is removed at exit, or
by the next builder of that cache if the process was killed. The next run opens the committed cache.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from autotune.caches import _provenance
from autotune.caches._base import DiskCache, place_for, sources_for, stored_manifest, temp_name, try_open
from autotune.caches._codec import infer_schema, pack, sample_digest, unpack
from autotune.caches._draws import WatchedReads, message
from autotune.caches._family import backend as get_backend
from autotune.caches._lock import BuildLock, lock_path
from autotune.caches._own import make_own, remove_own
from autotune.caches._provenance import Sources

log = logging.getLogger("autotune")

_HEAD = 8  # samples read before the workers start, to fix the schema (a build reads as many)
_POLL = 0.25  # seconds between the commit thread's looks at the filled bytes
INDEX, LOCK = "fill.idx", "fill.lock"
_active: dict[str, DiskFill] = {}  # cache path -> this process's fill of it: two loaders share one


class _Local:
    """One process's view of a fill: the shared index, its own spool for writing, others' for reading."""

    def __init__(self, staging: Path, n: int, writer: int | None = None):
        self.pid = os.getpid()
        self.writer = self.pid if writer is None else writer  # names the spool this view appends to
        self.staging = staging
        raw = np.memmap(staging / INDEX, dtype=np.uint8, mode="r+", shape=(n * 33 + 1,))
        self.where = raw[: n * 32].view(np.int64).reshape(n, 4)
        self.filled = raw[n * 32:n * 33]
        self.random = raw[n * 33:]  # set by the first read that drew randomness: no record is trusted then
        self.write_fd: int | None = None
        self.write_offset = 0
        self.broken = False
        self.read_fds: dict[int, int] = {}

    def record(self, k: int) -> bytes | None:
        """The record at position ``k`` when it is there and whole, else None."""
        if not self.filled[k] or self.random[0]:
            return None
        pid, offset, length, crc = (int(x) for x in self.where[k])
        if length <= 0:
            return None
        try:
            fd = self.read_fds.get(pid)
            if fd is None:
                fd = self.read_fds[pid] = os.open(self.staging / f"spool-{pid}.bin", os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(fd, length, offset)
        except OSError:
            return None
        return data if len(data) == length and zlib.crc32(data) == crc else None

    def append(self, k: int, record: bytes) -> None:
        if self.broken or self.random[0]:
            return
        try:
            if self.write_fd is None:
                self.write_fd = os.open(self.staging / f"spool-{self.writer}.bin",
                                        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
                self.write_offset = os.fstat(self.write_fd).st_size
            view = memoryview(record)
            while view:
                view = view[os.write(self.write_fd, view):]
        except OSError as exc:  # a full disk, or the staging folder removed: keep training from the source
            self.broken = True
            log.warning("autotune: the cache fill stopped writing (%s); this run reads the source", exc)
            return
        self.where[k] = (self.writer, self.write_offset, len(record), zlib.crc32(record))
        self.filled[k] = 1  # after the row: a reader that sees the byte sees the record
        self.write_offset += len(record)

    def close(self) -> None:
        for fd in [*self.read_fds.values(), *([self.write_fd] if self.write_fd is not None else [])]:
            os.close(fd)
        self.read_fds, self.write_fd = {}, None


class DiskFill(Dataset[Any]):
    """The ``backend`` cache of ``dataset`` at ``indices`` that will live at ``path``, checked against
    ``expected`` (``_registry.expected_manifest``), filled as its samples are read."""

    def __init__(self, backend: str, dataset: Any, path: Path | str, expected: dict[str, Any],
                 indices: Sequence[int] | None = None):
        self.name = backend
        cls = get_backend(backend)
        if cls.in_memory or not issubclass(cls, DiskCache):
            raise ValueError(f"The {backend} cache's first-epoch fill is autotune.caches._fill.FirstEpochCache.")
        self.backend: type[DiskCache] = cls
        cls.load_library()  # before the exit hook is registered (``_register_exit``)
        self.origin = "filled"  # as a Cache's origin says how it came to be (``_base.Cache``)
        self.dataset = dataset
        self.indices = [int(i) for i in (range(len(dataset)) if indices is None else indices)]
        n = len(self.indices)
        if n == 0:
            raise ValueError("A cache needs at least one sample, but got 0 indices.")
        self.path, self.expected = Path(path), expected
        self.staging = self.path.parent / temp_name(self.path.name, "fill")
        make_own(self.staging, "fill")  # 0o700 whatever the umask (see _trust)
        self._alive = BuildLock(self.staging / LOCK)
        self._alive.acquire()
        with open(self.staging / INDEX, "wb") as fh:
            fh.truncate(n * 33 + 1)
        self.owner = os.getpid()
        self._local: _Local | None = None
        self._reads = WatchedReads(dataset)
        # this process's record of what its reads opened (``_provenance``); the files the dataset's attributes
        # name first, stated before any read and sent with the head's record
        self._sources: Sources | None = Sources()
        self._sources.add_named(dataset)
        self._sources_pid = os.getpid()
        head = [self._read(k) for k in range(min(_HEAD, n))]
        self.schema = infer_schema(head)
        for k, sample in enumerate(head):
            self._keep(k, sample)
        self.committed: bool | None = None  # None until the commit thread ends: then whether it wrote the cache
        self.result = "filling"
        self._closed = False
        self._commit_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="autotune-cache-fill", daemon=True)
        self._thread.start()
        _active[str(self.path)] = self
        _register_exit()

    def __len__(self) -> int:
        return len(self.indices)

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_local", "_alive", "_commit_lock", "_stop", "_thread")}
        state["_local"], state["_sources"], state["_sources_pid"] = None, None, 0
        return state

    def _view(self) -> _Local | None:
        local = self._local
        if local is None or local.pid != os.getpid():
            try:
                local = self._local = _Local(self.staging, len(self.indices))
            except (OSError, ValueError):  # the fill was closed: read the source
                return None
        return local

    @property
    def filled_count(self) -> int:
        local = self._view()
        return int(np.count_nonzero(local.filled)) if local is not None else 0

    @property
    def whole(self) -> bool:
        local = self._view()
        return local is not None and bool(local.filled.all()) and not local.random[0]

    def _read(self, k: int) -> Any:
        """``dataset[indices[k]]`` from the source, its opens recorded in the staging folder, and the
        fill given up (no record trusted, nothing committed) when the read drew randomness."""
        sources = self._sources
        if sources is None or self._sources_pid != os.getpid():
            sources, self._sources_pid = Sources(), os.getpid()
            self._sources = sources
        with sources.recording():
            sample, drawn = self._reads.read_noting(self.indices[k])
        sources.scan_process()
        local = self._view()
        if drawn is not None and local is not None and not local.random[0]:
            local.random[0] = 1
            log.warning("autotune: %s; this run reads the source every epoch and keeps no cache.",
                        message(self.indices[k], f"drew from {drawn}"))
        new = sources.take_new()
        if new:
            try:
                with open(self.staging / f"sources-{os.getpid()}.jsonl", "a") as fh:
                    fh.write("".join(json.dumps([p, st]) + "\n" for p, st in new))
            except OSError as exc:
                # What this read opened is not on record, so neither this sample nor any later one of this
                # process may be kept: a cache committed without them could not see those files change.
                if local is not None and not local.broken:
                    local.broken = True
                    log.warning("autotune: the cache fill stopped writing (its record of the source files "
                                "failed: %s); this run reads the source", exc)
        return sample

    def _keep(self, k: int, sample: Any) -> None:
        local = self._view()
        if local is not None:
            local.append(k, pack(self.schema, sample))

    def __getitem__(self, k: int) -> Any:
        if k < 0:
            k += len(self.indices)
        local = self._view()
        if local is not None:
            record = local.record(k)
            if record is not None:
                return unpack(self.schema, record)
        sample = self._read(k)
        if local is not None and not local.filled[k]:
            self._keep(k, sample)
        return sample

    # ------------------------------------------------------------------ commit (the filling process only)

    def _whole_now(self) -> bool:
        """``whole``, through a view of its own: the commit thread must not share the training thread's."""
        try:
            local = _Local(self.staging, len(self.indices))
        except (OSError, ValueError):
            return False
        return bool(local.filled.all()) and not local.random[0]

    def _watch(self) -> None:
        try:  # a view of the thread's own: the training thread creates and uses the process's view
            filled = _Local(self.staging, len(self.indices)).filled
        except (OSError, ValueError):
            return
        while not self._stop.wait(_POLL):
            if filled.all():
                self.commit()
                return

    def commit(self) -> bool:
        """Write the cache at ``path`` if the fill is whole and nobody wrote it yet; whether this call or
        an earlier one did. Never raises: a failed commit is logged and leaves no cache."""
        with self._commit_lock:
            if self.committed is not None or os.getpid() != self.owner or not self._whole_now():
                return bool(self.committed)
            try:
                self.committed = self._commit()
            except Exception as exc:
                self.committed, self.result = False, f"not written ({type(exc).__name__}: {exc})"
                log.warning("autotune: the %s cache filled by the first epoch was not written: %s", self.name, exc)
            return self.committed

    def _commit(self) -> bool:
        # A view of its own, appending to a spool of its own: the training thread may be reading and
        # keeping samples through the process's view meanwhile.
        local = _Local(self.staging, len(self.indices), writer=-os.getpid())
        sources = sources_for(self.expected, self.path.parent)
        if self._sources is not None and self._sources_pid == os.getpid():
            sources.trees.update(self._sources.trees)  # the folders the dataset names, stated before its reads
            sources.named.update(self._sources.named)
        probes = {int(i): d for i, d in (self.expected.get("probes") or {}).items()}
        try:
            records: list[tuple[Path, int, int, int]] = []
            for k in range(len(self.indices)):
                if local.record(k) is None:  # torn by a race, or unreadable: the source again, exactly
                    with sources.recording():
                        local.append(k, pack(self.schema, self._reads.read(self.indices[k])))
                    if local.record(k) is None:
                        raise OSError(f"sample {k} could not be written to {self.staging}")
                digest = probes.get(self.indices[k])
                if digest is not None:
                    record = local.record(k)
                    assert record is not None
                    if sample_digest(unpack(self.schema, record)).hex()[:len(digest)] != digest:
                        raise ValueError(message(self.indices[k], "read differently twice within one fill"))
                writer, offset, length, crc = (int(x) for x in local.where[k])
                records.append((self.staging / f"spool-{writer}.bin", offset, length, crc))
        finally:
            local.close()
        sources.update(_recorded_sources(self.staging))
        cls = self.backend
        root = self.path.parent
        lock = BuildLock(lock_path(root, self.path.name))
        lock.acquire()
        try:
            cache, why = try_open(cls, self.path, self.expected)
            if cache is not None:
                self.result = "already there (another process wrote it)"
                return False
            target = place_for(self.path) if why else self.path
            tmp = make_own(root / temp_name(self.path.name, "tmp"), "commit")
            try:
                stored = stored_manifest(self.name, self.expected, self.indices, self.schema)
                stored["meta"] = cls.write_records(tmp, self.schema, records)
                stored["sources"] = _provenance.write(tmp, sources.kept())
                placed = cls.seal(tmp, target, stored)
            except BaseException:
                remove_own(tmp)
                raise
        finally:
            lock.release()
        self.result = "written" if placed else "already there (another process wrote it)"
        return placed

    def close(self) -> None:
        """Commit a whole fill not committed yet, then remove the staging folder (the filling process;
        in any other it only drops its handles)."""
        if os.getpid() != self.owner or self._closed:
            if self._local is not None:
                self._local.close()
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.commit()
        self._closed = True
        if self.committed is None:
            self.result = f"partial ({self.filled_count} of {len(self.indices)} samples): nothing written"
        if self._local is not None:
            self._local.close()
            self._local = None
        _active.pop(str(self.path), None)
        remove_own(self.staging)
        self._alive.release()


def _recorded_sources(staging: Path) -> dict[str, _provenance.Stat | None]:
    """What every process's reads of a fill opened, as their ``sources-<pid>.jsonl`` files say; a torn
    last line (a worker killed while it wrote) is skipped: its read's record is re-read or rejected."""
    found: dict[str, _provenance.Stat | None] = {}
    for f in sorted(staging.glob("sources-*.jsonl")):
        for line in f.read_text(errors="surrogateescape").splitlines():
            try:
                path, st = json.loads(line)
            except ValueError:
                continue
            if isinstance(path, str) and isinstance(st, list) and len(st) == 4:
                found.setdefault(path, (int(st[0]), int(st[1]), int(st[2]), int(st[3])))
            elif isinstance(path, str):
                found.setdefault(path, None)
    return found


def active_fill(path: Path | str) -> DiskFill | None:
    """This process's unfinished fill of the cache at ``path``, if any."""
    fill = _active.get(str(path))
    return fill if fill is not None and fill.owner == os.getpid() else None


def _register_exit() -> None:
    """Make ``close_all`` the exit hook that runs first. atexit runs the last registered first, and
    each fill registers it again after importing its backend's library: h5py's own exit hook
    unregisters the type converters a commit writes with ("Operation not defined for data type
    class"), so it must run after the commit, never before."""
    atexit.unregister(close_all)
    atexit.register(close_all)


def close_all() -> None:
    """Close every fill of this process (at exit: a whole one is committed, a partial one removed)."""
    for fill in list(_active.values()):
        if fill.owner == os.getpid():
            fill.close()
