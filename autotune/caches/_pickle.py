"""pickle: one data file of packed records plus an offset/checksum index; one pread per sample."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from autotune.caches._base import CorruptCache, DiskCache
from autotune.caches._codec import Schema, pack, unpack

DATA, INDEX = "data.bin", "index.npy"


class PickleCache(DiskCache):
    """Records (codec.pack: columns raw, the rest pickled) in ``data.bin``; ``index.npy`` holds
    (offset, crc32) per sample. Each access reads one record with ``os.pread``."""

    name = "pickle"

    @classmethod
    def _write(cls, tmp: Path, schema: Schema, n: int, samples: Iterator[Any], head: list[Any]) -> dict[str, Any]:
        index = np.zeros((n + 1, 2), dtype=np.int64)
        pos = 0
        count = 0
        with open(tmp / DATA, "wb", buffering=1 << 20) as fh:
            for k, sample in enumerate(_chain(head, samples)):
                record = pack(schema, sample)
                fh.write(record)
                index[k, 1] = zlib.crc32(record)
                pos += len(record)
                index[k + 1, 0] = pos
                count += 1
            fh.flush()
            os.fsync(fh.fileno())
        if count != n:
            raise RuntimeError(f"The dataset gave {count} samples, but {n} were expected.")
        np.save(tmp / INDEX, index)
        return {}

    def _open_handle(self) -> Any:
        fd = os.open(self.folder / DATA, os.O_RDONLY)
        index = np.load(self.folder / INDEX, mmap_mode="r")
        if index.shape != (self._length + 1, 2):
            os.close(fd)
            raise CorruptCache(f"Cache index {self.folder / INDEX} has shape {index.shape}, "
                               f"but {len(self) + 1} rows were expected.")
        return fd, index

    def _close_handle(self, handle: Any) -> None:
        os.close(handle[0])

    def _record(self, k: int) -> bytes:
        fd, index = self._get_handle()
        start, crc = int(index[k, 0]), int(index[k, 1])
        end = int(index[k + 1, 0])
        record = os.pread(fd, end - start, start)
        if len(record) != end - start or zlib.crc32(record) != crc:
            raise CorruptCache(f"Sample {k} of the cache at {self.path} fails its checksum; "
                               "clear it with `autotune cache clear` and it will be rebuilt.")
        return record

    def __getitem__(self, k: int) -> Any:
        return unpack(self.schema, self._record(self._position(k)))

    def _check(self, k: int) -> None:
        self._record(k)


def _chain(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest
