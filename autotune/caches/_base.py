"""The cache interface, its errors, and the atomic build/open lifecycle shared by on-disk backends."""

from __future__ import annotations

import abc
import contextlib
import datetime as _dt
import errno
import glob
import hashlib
import inspect
import itertools
import json
import os
import pickle
import secrets
import socket
import stat
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from autotune.caches import _provenance
from autotune.caches._codec import Schema, infer_schema, sample_digest, unpack
from autotune.caches._draws import RandomSamples, WatchedReads, message
from autotune.caches._lease import LEASE, Lease, exclusive
from autotune.caches._own import MARKER, is_marked, make_own, mark, remove_own
from autotune.caches._provenance import Sources
from autotune.caches._trust import UntrustedCache, check_trusted, sign, signature_problem
from autotune.errors import AutotuneError
from autotune.machine import files_under

FORMAT_VERSION = 4  # 2: content-addressed directories, build facts, probe digests; 3: pickle's record index;
# 4: the sources every sample was read from (``_provenance``), a signed manifest
MANIFEST_NAME = "manifest.json"
_SCHEMA_PROBE = 8  # samples read before the schema is fixed


class StaleCache(AutotuneError):
    """A cache whose manifest differs from the expected one (another dataset, format or codec)."""


class CorruptCache(AutotuneError):
    """A cache whose files are partial, truncated or garbled."""


def _identity(x: Any) -> Any:
    return x


class _Indexed(torch.utils.data.Dataset[Any]):
    """Positions -> ``dataset[indices[k]]`` pickled with protocol 5, a chunk of them in one uint8 tensor:
    the reader a parallel build iterates. The worker queue pickles with protocol 4, which turns
    big-endian numpy arrays little-endian; protocol-5 bytes keep every sample exact. One tensor per
    chunk crosses to the main process through shared memory, not the queue's pipe, and once per chunk,
    with the source files the chunk's reads opened or the worker holds (``_provenance``) when
    ``record``, and each read watched for random draws (``_draws``)."""

    def __init__(self, dataset: Any, indices: Sequence[int], record: bool):
        self.reads, self.indices, self.record = WatchedReads(dataset), indices, record
        self._sources: Sources | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sources": None}

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> bytes:
        return pickle.dumps(self.reads.read(self.indices[k]), protocol=5)

    def _wires(self, positions: list[int]) -> list[bytes]:
        return [pickle.dumps(sample, protocol=5)  # watched once per chunk
                for sample in self.reads.read_all([self.indices[k] for k in positions])]

    def __getitems__(self, positions: list[int]) -> tuple[torch.Tensor, list[int], list[tuple[str, Any]]]:
        if not self.record:
            wires = self._wires(positions)
            return torch.frombuffer(bytearray(b"".join(wires)), dtype=torch.uint8), [len(w) for w in wires], []
        if self._sources is None:
            self._sources = Sources()
        with self._sources.recording():
            wires = self._wires(positions)
        self._sources.scan_process()
        new = self._sources.take_new()
        return torch.frombuffer(bytearray(b"".join(wires)), dtype=torch.uint8), [len(w) for w in wires], new


READ_CHUNK = 16  # samples a build's worker decodes and sends at once (the memory plan counts them in flight)


def read_source(dataset: Any, indices: Sequence[int], *, workers: int = 0, progress: bool = True,
                desc: str = "Building cache", sources: Sources | None = None) -> Generator[Any, None, None]:
    """Yield ``dataset[i]`` for i in ``indices`` in order, decoded by ``workers`` DataLoader workers.
    Every read is watched (RandomSamples when one drew from a random generator, ``_draws``); with
    ``sources``, every source file the reads opened or the reading processes hold goes into it."""
    from tqdm.auto import tqdm

    if sources is not None:
        sources.scan_process(maps=True)  # what the dataset holds since before the build (workers inherit it)
    with tqdm(total=len(indices), desc=desc, unit="sample", disable=not progress, leave=False) as bar:
        if workers > 0:
            loader = torch.utils.data.DataLoader(
                _Indexed(dataset, indices, sources is not None), batch_size=READ_CHUNK, shuffle=False,
                # the process's own start method (the user's: a trial takes its search's, tuner/_runner.py), which
                # the memory plan counts the build's workers by
                num_workers=workers, collate_fn=_identity,  # the chunk is already one tensor and its lengths
            )
            it = iter(loader)
            try:
                for wire, lengths, opened in it:
                    if sources is not None:
                        sources.update(dict(opened))
                    view = memoryview(wire.numpy())
                    start = 0
                    for length in lengths:
                        yield pickle.loads(view[start:start + length])
                        start += length
                        bar.update(1)
            finally:
                it._shutdown_workers()  # type: ignore[attr-defined]  # private, and the only way: an interrupted build leaves no worker behind
        else:
            reads = WatchedReads(dataset)
            for start in range(0, len(indices), READ_CHUNK):  # watched a chunk at a time, as in the workers
                chunk = indices[start:start + READ_CHUNK]
                with sources.recording() if sources is not None else contextlib.nullcontext():
                    samples = reads.read_all(chunk)
                for sample in samples:
                    yield sample
                    bar.update(1)
    if sources is not None:
        sources.scan_process(maps=True)


def checked_against_probes(samples: Iterator[Any], indices: Sequence[int],
                           probes: dict[str, str] | None) -> Generator[Any, None, None]:
    """``samples`` (position k is ``dataset[indices[k]]``), each probed one compared with the digest the
    live dataset gave for it when the key was taken: RandomSamples at the first that differs, before
    anything is stored as a cache (a sample random at a few indices, or one that changed meanwhile)."""
    wanted = {int(i): d for i, d in (probes or {}).items()}
    for k, sample in enumerate(samples):
        digest = wanted.get(int(indices[k])) if wanted else None
        if digest is not None and sample_digest(sample).hex()[:len(digest)] != digest:
            raise RandomSamples(message(int(indices[k]), "read differently twice within one build"))
        yield sample


def indices_digest(indices: Sequence[int]) -> str:
    return hashlib.blake2b(np.asarray(indices, dtype=np.int64).tobytes(), digest_size=16).hexdigest()


def as_json(obj: Any) -> Any:
    """``obj`` as it comes back from JSON, so stored and expected manifests compare fairly."""
    return json.loads(json.dumps(obj, sort_keys=True))


def manifest_difference(stored: dict[str, Any], expected: dict[str, Any]) -> str:
    keys = sorted(set(stored) | set(expected))
    diffs = [f"{k}: cached {stored.get(k)!r}, expected {expected.get(k)!r}"
             for k in keys if stored.get(k) != expected.get(k)]
    return "; ".join(diffs[:3])


def sources_for(manifest: dict[str, Any], root: Path) -> Sources:
    """A record of a build's sources, with every file under the key's ``data_dir`` in it when it names one
    (files read by native code are seen no other way); autotune's own cache folder under ``root`` is not
    a source."""
    sources = Sources(exclude=[root])
    data_dir = (manifest.get("facts") or {}).get("data_dir")
    if isinstance(data_dir, str) and os.path.isdir(data_dir):
        for f in sorted(files_under(data_dir)):
            sources.add(f)
    return sources


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def takes(fn: Any, keyword: str) -> bool:
    """Whether ``fn`` accepts ``keyword`` (named, or through ``**kwargs``): a plugin's method or a caller's
    site written before the keyword existed is called as it was written."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class Cache(torch.utils.data.Dataset[Any], abc.ABC):
    """A map-style source of exact samples: position k holds ``dataset[indices[k]]``.

    Picklable with no open handles: a subclass drops them in ``__getstate__`` and reopens lazily,
    so each DataLoader worker opens its own (never before fork).
    """

    name: ClassVar[str]  # the backend's name in recipes, folder names and manifests (``_family``)
    in_memory: ClassVar[bool] = False  # held by the process that built it: one per rank, never in a folder
    order: ClassVar[int] = 100  # where it is listed among the backends (lowest first; then as registered)

    def __init__(self, path: Path | None, stored: dict[str, Any]):
        self.path = None if path is None else Path(path)
        self.manifest = stored  # the stored manifest: expected part, schema, length, files
        self.schema = Schema.from_json(stored["schema"])
        self._length = int(stored["length"])
        self.origin = "opened"  # "built" here, "reused" from disk, "waited" for another process's build

    def __len__(self) -> int:
        return self._length

    def _position(self, k: int) -> int:
        k = int(k)
        if k < 0:
            k += self._length
        if not 0 <= k < self._length:
            raise IndexError(f"Cache position must be in [0, {self._length}), but got {k}.")
        return k

    @abc.abstractmethod
    def __getitem__(self, k: int) -> Any:
        """The exact sample at position ``k``."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes the cache holds (RAM for memory, disk for the others)."""

    @classmethod
    @abc.abstractmethod
    def build(cls, dataset: Any, indices: Sequence[int], path: Path | str | None, *, manifest: dict[str, Any],
              progress: bool = True, workers: int = 0) -> Cache:
        """Read ``dataset[i]`` for i in ``indices`` and store them; return the opened cache. A backend's
        build may also take ``meanwhile`` (``MemoryCache.build``): what its caller does in this process while the
        build's workers decode; it is passed only to a build that names it (``takes``), and only where given."""

    @classmethod
    @abc.abstractmethod
    def open(cls, path: Path | str, *, manifest: dict[str, Any]) -> Cache:
        """Open a built cache; StaleCache/CorruptCache when it is not the expected, whole one."""

    @classmethod
    @abc.abstractmethod
    def estimate_need(cls, bytes_per_sample: float, n: int) -> tuple[int, int]:
        """(RAM bytes, disk bytes) a cache of ``n`` samples of ``bytes_per_sample`` needs."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={str(self.path)!r}, samples={len(self)})"


def stored_manifest(backend: str, manifest: dict[str, Any], indices: Sequence[int], schema: Schema) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "backend": backend,
        "expected": as_json(manifest),
        "length": len(indices),
        "indices": indices_digest(indices),
        "schema": json.loads(schema.to_json()),
        "built": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "builder": {"pid": os.getpid(), "host": socket.gethostname(), "id": secrets.token_hex(8)},
    }


def is_manifest(stored: Any) -> bool:
    """Whether ``stored`` (parsed JSON) is an autotune cache manifest."""
    return isinstance(stored, dict) and {"format_version", "backend", "expected", "schema", "length"} <= set(stored)


def read_manifest(path: Path) -> dict[str, Any]:
    """The stored manifest of the cache directory ``path``; CorruptCache when absent or unreadable."""
    try:
        stored = json.loads((Path(path) / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        raise CorruptCache(f"Cache at {path} has no manifest: an unfinished or interrupted build.") from None
    except (OSError, ValueError) as exc:
        raise CorruptCache(f"Cache manifest at {path} is unreadable ({exc}).") from None
    if not is_manifest(stored):
        raise CorruptCache(f"Cache manifest at {path} is incomplete.")
    return dict(stored)


class DiskCache(Cache):
    """Shared lifecycle of on-disk backends: atomic build into a temp directory, manifest last, lazy handles."""

    def __init__(self, path: Path | None, stored: dict[str, Any]):
        super().__init__(path, stored)
        self.lease: Lease | None = None  # the shared lease ``open`` takes on the folder (``_lease``)
        self._handle: Any = None
        self._pid: int | None = None

    @property
    def folder(self) -> Path:
        """The cache's directory (a disk cache always has one)."""
        assert self.path is not None, "a disk cache lives in a directory"
        return self.path

    # -- handles --------------------------------------------------------------------------------------
    def _get_handle(self) -> Any:
        if self._handle is None or self._pid != os.getpid():
            self._handle = self._open_handle()  # a forked child never uses its parent's handle
            self._pid = os.getpid()
        return self._handle

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._close_handle(self._handle)
        self._handle, self._pid = None, None

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handle"], state["_pid"] = None, None
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @abc.abstractmethod
    def _open_handle(self) -> Any: ...

    @classmethod
    def load_library(cls) -> None:
        """Import the library the backend reads and writes with (h5py, lmdb), if it has one: a fill
        does so before it registers its exit hook, so the hook runs before the library's own."""

    def _close_handle(self, handle: Any) -> None:
        handle.close()

    # -- writing ----------------------------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def build_held(cls, sample_bytes: float, n: int | None) -> int:
        """What ``_write`` holds in the building process at its peak beside the samples it is handed (its
        buffers, its library's copies of them), for ``n`` samples of ``sample_bytes`` (None: not known, the
        backend's own cap bounds it): the memory plan counts it for a build (``tuner._memory_plan``)."""

    @classmethod
    @abc.abstractmethod
    def _write(cls, tmp: Path, schema: Schema, n: int, samples: Iterator[Any], head: list[Any]) -> dict[str, Any]:
        """Write all ``n`` samples into the directory ``tmp``; return backend facts for the manifest."""

    @property
    def nbytes(self) -> int:
        return int(sum(self.manifest.get("files", {}).values()))

    @classmethod
    def build(cls, dataset: Any, indices: Sequence[int], path: Path | str | None, *, manifest: dict[str, Any],
              progress: bool = True, workers: int = 0) -> DiskCache:
        if path is None:
            raise ValueError(f"The {cls.name} cache needs a directory path, but got path=None.")
        path = Path(path)
        indices = [int(i) for i in indices]
        if not indices:
            raise ValueError("A cache needs at least one sample, but got 0 indices.")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_own(path.parent / temp_name(path.name, "tmp"), "build")  # 0o700: see _trust
        sources = sources_for(manifest, path.parent)
        sources.add_named(dataset)  # stated before any read
        samples = read_source(dataset, indices, workers=workers, progress=progress,
                              desc=f"Building {cls.name} cache", sources=sources)
        checked = checked_against_probes(samples, indices, manifest.get("probes"))
        try:
            head = list(itertools.islice(checked, min(_SCHEMA_PROBE, len(indices))))
            schema = infer_schema(head)
            stored = stored_manifest(cls.name, manifest, indices, schema)
            stored["meta"] = cls._write(tmp, schema, len(indices), checked, head)
            stored["sources"] = _provenance.write(tmp, sources.kept())
            placed = cls.seal(tmp, path, stored)
        except BaseException:
            checked.close()
            samples.close()
            remove_own(tmp)
            raise
        cache = cls.open(path, manifest=manifest)
        cache.origin = "built" if placed else "reused"
        return cache

    @classmethod
    def seal(cls, tmp: Path, path: Path, stored: dict[str, Any]) -> bool:
        """Seal the written directory ``tmp`` (modes, fsync, the manifest last) and move it to ``path``
        unless a cache is already there; whether it moved. A build and a fill (``_disk_fill``) end here."""
        files = {}
        for f in sorted(tmp.rglob("*")):
            os.chmod(f, 0o700 if f.is_dir() else 0o600)
            if f.is_file() and f.name not in (MARKER, LEASE):  # the mark stays; neither is a cache file
                _fsync_path(f)
                files[str(f.relative_to(tmp))] = f.stat().st_size
        stored["files"] = files
        sign(stored, path.parent)
        with open(tmp / MANIFEST_NAME, "w") as fh:  # last: its presence marks a whole build
            json.dump(stored, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp / MANIFEST_NAME, 0o600)
        _fsync_path(tmp)
        return _place_dir(tmp, path)

    @classmethod
    def write_records(cls, tmp: Path, schema: Schema, records: Sequence[tuple[Path, int, int, int]]) -> dict[str, Any]:
        """Store the packed records (``codec.pack``) that a fill wrote, position k at ``records[k]`` =
        (file, offset, length, crc32), into ``tmp``; backend facts for the manifest. The default unpacks
        them into ``_write``; a backend that stores such records as they are overrides it."""
        def samples() -> Generator[Any, None, None]:
            fds: dict[Path, int] = {}
            try:
                for file, offset, length, _crc in records:
                    if file not in fds:
                        fds[file] = os.open(file, os.O_RDONLY)
                    yield unpack(schema, os.pread(fds[file], length, offset))
            finally:
                for fd in fds.values():
                    os.close(fd)

        it = samples()
        try:
            return cls._write(tmp, schema, len(records), it, [next(it)])
        finally:
            it.close()

    # -- opening ----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | str, *, manifest: dict[str, Any], verify: bool = False) -> DiskCache:
        """Open and check a cache. Quick by default (manifest, file sizes, a few samples' checksums);
        ``verify=True`` reads every sample's checksum."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"No cache directory at {path}.")
        # Before any byte of it is read (a payload is partly pickle): the folder holding it, then itself.
        check_trusted(path.parent, "Cache folder", follow=True)
        check_trusted(path)
        if os.path.lexists(path / MANIFEST_NAME):
            check_trusted(path / MANIFEST_NAME, "Cache manifest")
        stored = read_manifest(path)
        if stored["format_version"] != FORMAT_VERSION:
            raise StaleCache(f"Cache at {path} has format version {stored['format_version']}, "
                             f"but this autotune reads version {FORMAT_VERSION}.")
        problem = signature_problem(stored, path.parent)
        if problem is not None:
            raise CorruptCache(f"Cache at {path} is not used: {problem}.")
        if stored["backend"] != cls.name:
            raise CorruptCache(f"Cache at {path} holds a {stored['backend']!r} cache, not {cls.name!r}.")
        expected = as_json(manifest)
        if stored["expected"] != expected:
            raise StaleCache(f"Cache at {path} was built for another dataset "
                             f"({manifest_difference(stored['expected'], expected)}).")
        for name, size in stored.get("files", {}).items():
            f = path / name
            try:
                st = os.lstat(f)
            except OSError:
                st = None
            actual = st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None
            if actual != size:
                raise CorruptCache(f"Cache file {f} has {actual} bytes, but the manifest says {size}.")
            check_trusted(f, "Cache file")
        _check_sources(path, stored)
        try:
            cache = cls(path, stored)
        except (KeyError, ValueError) as exc:
            raise CorruptCache(f"Cache manifest at {path} is invalid ({exc}).") from None
        try:
            n = len(cache)
            probe = range(n) if verify else sorted({0, n // 2, n - 1})
            for k in probe:
                cache._check(k)
            _check_probes(cache, expected.get("probes"))
        except (CorruptCache, StaleCache):
            raise
        except Exception as exc:  # garbled bytes surface as any decoding error
            raise CorruptCache(f"Cache at {path} is corrupt ({type(exc).__name__}: {exc}).") from None
        finally:
            cache.close()  # never hold a handle in the parent: workers open their own
        cache.lease = Lease(path)  # for the cache's life; FileNotFoundError if it was set aside meanwhile
        return cache

    def _check(self, k: int) -> None:
        """Raise CorruptCache when sample ``k`` fails its checksum; the default decodes it."""
        self[k]


def _check_sources(path: Path, stored: dict[str, Any]) -> None:
    """Every source file the cache's samples were read from is as it was then (``_provenance``):
    StaleCache naming the changed ones when not, CorruptCache when the record is not the manifest's."""
    entry = stored.get("sources")
    if not isinstance(entry, dict):
        raise CorruptCache(f"Cache manifest at {path} records no sources.")
    try:
        changed = _provenance.changed(path, entry)
    except _provenance.BadRecord as exc:
        raise CorruptCache(f"Cache at {path} is corrupt ({exc}).") from None
    if changed:
        raise StaleCache(f"Cache at {path} is stale: {_provenance.describe(changed, int(entry['count']))}.")


def _check_probes(cache: Cache, probes: dict[str, Any] | None) -> None:
    """The cache's samples at the probed indices are those the live dataset returned when its key was
    taken (``_key.dataset_key``, just before this open); StaleCache naming the indices when not."""
    if not probes:
        return
    differ = [int(i) for i, digest in probes.items()
              if int(i) < len(cache) and sample_digest(cache[int(i)]).hex()[:len(digest)] != digest]
    if differ:
        shown = ", ".join(map(str, sorted(differ)[:8]))
        raise StaleCache(f"Cache at {cache.path} differs from the live dataset at sample"
                         f"{'s' if len(differ) > 1 else ''} {shown}.")


def _place_dir(tmp: Path, path: Path) -> bool:
    """Move the finished ``tmp`` to ``path`` unless a cache is already there (see NOTE [cache build
    lock] in ``_lock``: a directory a loader may have opened is never replaced). Whether it moved."""
    try:
        os.rename(tmp, path)  # replaces nothing but an empty directory
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        remove_own(tmp)  # another builder finished first: theirs stays
        return False
    _fsync_path(path.parent)
    return True


TEMP_KINDS = ("tmp", "old", "fill")  # a build's or a commit's folder, a cache set aside, a fill's staging


def temp_name(cache_name: str, kind: str) -> str:
    """``.<cache_name>.<kind>-<pid>-<hex>``: the name of a temporary folder of the cache ``cache_name``
    (``TEMP_KINDS``); ``_registry`` reads the cache and the process back from it."""
    assert kind in TEMP_KINDS, kind
    return f".{cache_name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _open_one(cls: type[Cache], path: Path, expected: dict[str, Any]) -> tuple[Cache | None, str]:
    if not os.path.lexists(path):
        return None, ""
    try:
        return cls.open(path, manifest=expected), ""
    except UntrustedCache:
        raise
    except (StaleCache, CorruptCache, OSError) as exc:
        return None, str(exc)


def try_open(cls: type[Cache], path: Path, expected: dict[str, Any]) -> tuple[Cache | None, str]:
    """The valid cache at ``path`` or beside it (``place_for``), or None and why the one at ``path`` is
    not ("" when there is none). Found beside it, the invalid one at ``path`` is removed once free."""
    cache, why = _open_one(cls, path, expected)
    if cache is not None:
        return cache, ""
    for other in sorted(path.parent.glob(glob.escape(path.name) + "~*")):
        found, _ = _open_one(cls, other, expected)
        if found is not None:
            if why:
                set_aside(path)  # kept while a loader still reads it
            return found, ""
    return None, why


def place_for(path: Path) -> Path:
    """Where a new cache of ``path``'s name is built: ``path`` itself, once whatever invalid cache is
    there is set aside, or beside it (``<name>~<hex>``, which ``try_open`` finds) while a loader still
    holds its lease: a rebuild never replaces a cache in use."""
    if set_aside(path):
        return path
    return path.parent / f"{path.name}~{secrets.token_hex(3)}"


def set_aside(path: Path) -> bool:
    """Remove the cache at ``path`` unless a loader holds its lease (``_lease``): renamed to a temp name
    first, under the lease taken exclusively, so nothing half-deleted ever sits under a cache's name
    and no reader locks it meanwhile. Whether it was removed (or was gone already)."""
    if not os.path.lexists(path):
        return True
    held = exclusive(path)
    if held is None:
        return False
    try:
        if not is_marked(path):  # a cache an older autotune built: its manifest was its only mark
            mark(path, "set aside")
        old = path.parent / temp_name(path.name, "old")
        os.rename(path, old)
    finally:
        os.close(held)
    remove_own(old)
    return True


__all__ = ["Cache", "CorruptCache", "DiskCache", "StaleCache", "FORMAT_VERSION", "MANIFEST_NAME"]
