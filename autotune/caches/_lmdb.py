"""lmdb: one environment, key = sample position (8 bytes big-endian), value = crc32 + packed record."""

from __future__ import annotations

import math
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.caches._base import CorruptCache, DiskCache
from autotune.caches._codec import Schema, pack, unpack
from autotune.caches._family import register

# Imported by the first lmdb cache built or opened, so a process that uses no such cache never loads it.
lmdb: Any = None

DB = "db"
_PAGE = 4096
_TXN_BYTES = 64 << 20


def _key(k: int) -> bytes:
    return struct.pack(">Q", k)


def record_disk_bytes(nbytes: float) -> float:
    """LMDB bytes for one value: inline on a leaf page when small, else whole overflow pages."""
    if nbytes + 16 <= _PAGE // 2:
        return 1.5 * (nbytes + 24)
    return (math.ceil((nbytes + 16) / _PAGE) + 0.1) * _PAGE


def _require_lmdb() -> None:
    global lmdb
    if lmdb is None:
        try:
            import lmdb as module
        except ImportError:  # pragma: no cover - lmdb is a dependency of the project
            raise ImportError("The lmdb cache needs the lmdb package: pip install lmdb") from None
        lmdb = module


# py-lmdb refuses to open one environment twice in a process, so caches on the same path share it.
_ENVS: dict[str, list[Any]] = {}  # path -> [env, users]
_ENVS_PID: list[int] = [os.getpid()]


def _acquire(path: str) -> Any:
    _require_lmdb()
    if _ENVS_PID[0] != os.getpid():
        # A forked child must not use its parent's environments; closing the inherited objects here
        # unmaps only the child's copy (lock=False: no shared locks) and lifts py-lmdb's
        # "already open in this process" guard, which the child inherited too.
        for env, _ in _ENVS.values():
            try:
                env.close()
            except Exception:
                pass
        _ENVS.clear()
        _ENVS_PID[0] = os.getpid()
    entry = _ENVS.get(path)
    if entry is None:
        env = lmdb.open(path, subdir=True, readonly=True, lock=False, readahead=False, max_dbs=0)
        entry = _ENVS[path] = [env, 0]
    entry[1] += 1
    return entry[0]


def _release(path: str) -> None:
    entry = _ENVS.get(path)
    if entry is not None:
        entry[1] -= 1
        if entry[1] <= 0:
            del _ENVS[path]
            entry[0].close()


@register
class LmdbCache(DiskCache):
    """An LMDB environment opened ``readonly=True, lock=False, readahead=False`` lazily per process."""

    name = "lmdb"
    order = 3

    @classmethod
    def estimate_need(cls, bytes_per_sample: float, n: int) -> tuple[int, int]:
        return 0, int(record_disk_bytes(float(bytes_per_sample) + 32) * n * 1.1 + (4 << 20))

    @classmethod
    def load_library(cls) -> None:
        _require_lmdb()

    @classmethod
    def build_held(cls, sample_bytes: float, n: int | None) -> int:
        # The records _write keeps for one transaction (up to _TXN_BYTES), and the transaction's own copy of them
        # (its dirty pages, malloc'd until the commit writes them): measured with 96 samples of 1 MiB, 125, 130
        # and 129 MiB over the pickle backend's peak RSS under glibc, jemalloc and tcmalloc (2 x 64 = 128); 40
        # samples: 76 (2 x 40 = 80).
        records = _TXN_BYTES if n is None else min(_TXN_BYTES, n * int(sample_bytes))
        return 2 * records

    @classmethod
    def _write(cls, tmp: Path, schema: Schema, n: int, samples: Iterator[Any], head: list[Any]) -> dict[str, Any]:
        _require_lmdb()
        per = max(len(pack(schema, s)) for s in head) + 4
        map_size = int(record_disk_bytes(per) * n * 1.25) + (32 << 20)
        env = lmdb.open(str(tmp / DB), subdir=True, map_size=map_size, readahead=False, meminit=False,
                        sync=False, metasync=False, max_dbs=0)
        count = 0
        try:
            batch: list[tuple[bytes, bytes]] = []
            size = 0

            def flush() -> None:
                nonlocal map_size
                while True:
                    try:
                        with env.begin(write=True) as txn:
                            for key, value in batch:
                                txn.put(key, value, append=True)
                        return
                    except lmdb.MapFullError:  # a later sample was bigger than the first ones
                        map_size *= 2
                        env.set_mapsize(map_size)

            for sample in _chain(head, samples):
                record = pack(schema, sample)
                batch.append((_key(count), struct.pack(">I", zlib.crc32(record)) + record))
                size += len(record)
                count += 1
                if size >= _TXN_BYTES:
                    flush()
                    batch, size = [], 0
            if batch:
                flush()
            env.sync(True)
        finally:
            env.close()
        if count != n:
            raise RuntimeError(f"The dataset gave {count} samples, but {n} were expected.")
        lock = tmp / DB / "lock.mdb"
        if lock.exists():
            lock.unlink()  # readers use lock=False
        return {"map_size": map_size}

    def _open_handle(self) -> Any:
        return _acquire(str(self.folder / DB))

    def _close_handle(self, handle: Any) -> None:
        _release(str(self.folder / DB))

    def _record(self, k: int) -> bytes:
        with self._get_handle().begin(buffers=False) as txn:
            value = txn.get(_key(k))
        if value is None or len(value) < 4 or struct.unpack(">I", value[:4])[0] != zlib.crc32(value[4:]):
            raise CorruptCache(f"Sample {k} of the cache at {self.path} is missing or fails its checksum; "
                               "clear it with `autotune cache clear` and it will be rebuilt.")
        return bytes(value)

    def __getitem__(self, k: int) -> Any:
        return unpack(self.schema, memoryview(self._record(self._position(k)))[4:])

    def _check(self, k: int) -> None:
        self._record(k)


def _chain(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest
