"""hdf5: fixed-shape numeric leaves as chunked (fletcher32-checked) datasets, the rest as vlen bytes."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from autotune.caches._base import CorruptCache, DiskCache
from autotune.caches._codec import Schema, decode, encode
from autotune.caches._family import register

# Imported by the first hdf5 cache built or opened, so a process that uses no such cache never loads it.
h5py: Any = None

FILE = "data.h5"
_CHUNK_BYTES = 256 << 10  # a chunk holds one sample, or a few small ones
_WRITE_BYTES = 16 << 20  # rows buffered before one slice write


def _require_h5py() -> None:
    global h5py
    if h5py is None:
        try:
            import h5py as module
        except ImportError:  # pragma: no cover - h5py is a dependency of the project
            raise ImportError("The hdf5 cache needs the h5py package: pip install h5py") from None
        h5py = module


@register
class Hdf5Cache(DiskCache):
    """``data.h5``: ``col{j}`` of shape (N, *shape) per column leaf, ``blob`` (vlen uint8) with ``crc``
    (crc32 per blob), and ``overflow`` (1 where the whole sample is the blob). Opened lazily per process."""

    name = "hdf5"
    order = 2

    @classmethod
    def estimate_need(cls, bytes_per_sample: float, n: int) -> tuple[int, int]:
        return 0, int(float(bytes_per_sample) * n * 1.1 + 64 * n + (4 << 20))

    @classmethod
    def load_library(cls) -> None:
        _require_h5py()

    @classmethod
    def build_held(cls, sample_bytes: float, n: int | None) -> int:
        # The rows _write buffers (up to _WRITE_BYTES) and h5py's copy of them as it writes the slice: measured
        # with 96 samples of 1 MiB (16 buffered), 26 MiB over the pickle backend's peak RSS (glibc).
        rows = max(1, min(n or 1024, 1024, _WRITE_BYTES // max(1, int(sample_bytes))))
        return 2 * rows * int(sample_bytes)

    @classmethod
    def _write(cls, tmp: Path, schema: Schema, n: int, samples: Iterator[Any], head: list[Any]) -> dict[str, Any]:
        _require_h5py()
        cols = schema.columns
        rows = max(1, min(n, 1024, _WRITE_BYTES // max(1, schema.row_nbytes)))
        with h5py.File(tmp / FILE, "w") as f:
            dsets = []
            for j, leaf in enumerate(cols):
                kw: dict[str, Any] = {}
                if leaf.row_nbytes > 0:
                    per_chunk = max(1, min(n, _CHUNK_BYTES // leaf.row_nbytes))
                    kw = {"chunks": (per_chunk, *leaf.shape), "fletcher32": True}
                dsets.append(f.create_dataset(f"col{j}", shape=(n, *leaf.shape), dtype=leaf.np_dtype, **kw))
            blob = f.create_dataset("blob", shape=(n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(min(n, 256),))
            crc = np.zeros(n, dtype=np.uint32)
            overflow = np.zeros(n, dtype=np.uint8)
            bufs = [np.zeros((rows, *leaf.shape), dtype=leaf.np_dtype) for leaf in cols]
            blobs = np.empty(rows, dtype=object)
            start = count = 0

            def flush(m: int) -> None:
                for d, b in zip(dsets, bufs):
                    d[start : start + m] = b[:m]
                for r in range(m):  # one by one: h5py reads equal-length rows as a 2-D array
                    blob[start + r] = blobs[r]

            for sample in _chain(head, samples):
                r = count - start
                enc = encode(schema, sample)
                if enc.columns is None:
                    overflow[count] = 1
                    for b in bufs:
                        b[r] = 0
                else:
                    for b, a in zip(bufs, enc.columns):
                        b[r] = a
                data = enc.blob or b""
                blobs[r] = np.frombuffer(data, dtype=np.uint8)
                crc[count] = zlib.crc32(data)
                count += 1
                if count - start == rows:
                    flush(rows)
                    start = count
            if count != n:
                raise RuntimeError(f"The dataset gave {count} samples, but {n} were expected.")
            if count > start:
                flush(count - start)
            f.create_dataset("crc", data=crc)
            f.create_dataset("overflow", data=overflow)
        return {}

    def _open_handle(self) -> Any:
        _require_h5py()
        f = h5py.File(self.folder / FILE, "r")
        try:
            cols = [f[f"col{j}"] for j in range(len(self.schema.columns))]
            return f, cols, f["blob"], f["crc"][:], f["overflow"][:]
        except Exception:
            f.close()
            raise

    def _close_handle(self, handle: Any) -> None:
        handle[0].close()

    def _blob(self, k: int) -> bytes:
        _, _, blob, crc, _ = self._get_handle()
        data = blob[k].tobytes()
        if zlib.crc32(data) != int(crc[k]):
            raise CorruptCache(f"Sample {k} of the cache at {self.path} fails its checksum; "
                               "clear it with `autotune cache clear` and it will be rebuilt.")
        return bytes(data)

    def __getitem__(self, k: int) -> Any:
        k = self._position(k)
        _, cols, _, _, overflow = self._get_handle()
        data = self._blob(k)
        if overflow[k]:
            return decode(self.schema, None, data)
        try:
            columns = [np.asarray(d[k]) for d in cols]  # fletcher32 checks each chunk read
        except OSError as exc:
            raise CorruptCache(f"Sample {k} of the cache at {self.path} is unreadable ({exc}).") from None
        return decode(self.schema, columns, data if self.schema.has_blob_leaves else None)


def _chain(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest
