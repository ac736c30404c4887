"""pickle: packed records in data files plus a record index; one pread per sample."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autotune.caches._base import CorruptCache, DiskCache
from autotune.caches._codec import Schema, pack, unpack
from autotune.caches._family import register

DATA, INDEX = "data.bin", "index.npy"
FILE, OFFSET, LENGTH, CRC = range(4)  # the index's columns
_WRITE_BUFFER = 1 << 20


@register
class PickleCache(DiskCache):
    """Records (codec.pack: columns raw, the rest pickled) in data files, ``meta["data_files"]``;
    ``index.npy`` holds (file number, offset, length, crc32) per sample. A build writes one file in
    order; a fill (``_disk_fill``) keeps the files its processes appended to, records in any order.
    Each access reads one record with ``os.pread``."""

    name = "pickle"
    order = 1

    @classmethod
    def estimate_need(cls, bytes_per_sample: float, n: int) -> tuple[int, int]:
        return 0, int(float(bytes_per_sample) * n * 1.02 + 16 * n + (1 << 20))

    @classmethod
    def build_held(cls, sample_bytes: float, n: int | None) -> int:
        # One record at a time into a file buffered by _WRITE_BUFFER, and the index (4 int64 a sample); measured
        # with 96 samples of 1 MiB made as they are written (a process's peak RSS over its start): 4-5 MiB under
        # tcmalloc and jemalloc, 13 under glibc (with the samples made); the other backends' are stated over it.
        return _WRITE_BUFFER + int(sample_bytes) + 32 * (n or 0)

    @classmethod
    def _write(cls, tmp: Path, schema: Schema, n: int, samples: Iterator[Any], head: list[Any]) -> dict[str, Any]:
        index = np.zeros((n, 4), dtype=np.int64)
        pos = 0
        count = 0
        with open(tmp / DATA, "wb", buffering=_WRITE_BUFFER) as fh:
            for k, sample in enumerate(_chain(head, samples)):
                if k >= n:
                    raise RuntimeError(f"The dataset gave more than the {n} samples expected.")
                record = pack(schema, sample)
                fh.write(record)
                index[k] = (0, pos, len(record), zlib.crc32(record))
                pos += len(record)
                count += 1
            fh.flush()
            os.fsync(fh.fileno())
        if count != n:
            raise RuntimeError(f"The dataset gave {count} samples, but {n} were expected.")
        np.save(tmp / INDEX, index)
        return {"data_files": [DATA]}

    @classmethod
    def write_records(cls, tmp: Path, schema: Schema, records: Sequence[tuple[Path, int, int, int]]) -> dict[str, Any]:
        """The fill's own files, linked in as they are (copied where the file system has no hard links):
        no record is read or written again."""
        import shutil

        names: dict[Path, int] = {}
        index = np.zeros((len(records), 4), dtype=np.int64)
        for k, (file, offset, length, crc) in enumerate(records):
            if file not in names:
                names[file] = len(names)
                target = tmp / f"data-{names[file]}.bin"
                try:
                    os.link(file, target)
                except OSError:
                    shutil.copyfile(file, target)
            index[k] = (names[file], offset, length, crc)
        np.save(tmp / INDEX, index)
        return {"data_files": [f"data-{j}.bin" for j in range(len(names))]}

    def _open_handle(self) -> Any:
        names = self.manifest.get("meta", {}).get("data_files")
        if not isinstance(names, list) or not names or not all(isinstance(x, str) and "/" not in x for x in names):
            raise CorruptCache(f"Cache manifest at {self.path} does not list its data files.")
        index = np.load(self.folder / INDEX, mmap_mode="r")
        if index.shape != (self._length, 4) or index.dtype != np.int64:
            raise CorruptCache(f"Cache index {self.folder / INDEX} has shape {index.shape}, "
                               f"but ({len(self)}, 4) was expected.")
        fds: list[int] = []
        try:
            for name in names:
                fds.append(os.open(self.folder / name, os.O_RDONLY))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds, index

    def _close_handle(self, handle: Any) -> None:
        for fd in handle[0]:
            os.close(fd)

    def _record(self, k: int) -> bytes:
        fds, index = self._get_handle()
        file, start, length, crc = (int(x) for x in index[k])
        record = os.pread(fds[file], length, start) if 0 <= file < len(fds) and length > 0 else b""
        if len(record) != length or length == 0 or zlib.crc32(record) != crc:
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
