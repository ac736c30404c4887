"""memory: samples in a few contiguous numpy buffers in the main process, shared by forked workers."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from autotune.caches._base import Cache, read_source, stored_manifest
from autotune.codec import encode, decode, infer_schema


class MemoryCache(Cache):
    """One ``(N, *shape)`` array per column leaf, one uint8 blob buffer with an offsets array, and an
    overflow flag per sample: a handful of Python objects whatever N is, so forked DataLoader workers
    share the pages instead of copying them as they touch refcounts (PyTorch issue 13246).

    Built in the calling process, before workers start; ``path`` is ignored.
    """

    name = "memory"

    def __init__(self, stored: dict, columns: list[np.ndarray], blobs: np.ndarray, offsets: np.ndarray,
                 overflow: np.ndarray):
        super().__init__(None, stored)
        self.columns, self.blobs, self.offsets, self.overflow = columns, blobs, offsets, overflow

    @classmethod
    def build(cls, dataset: Any, indices: Sequence[int], path: Path | str | None = None, *, manifest: dict,
              progress: bool = True, workers: int = 0) -> "MemoryCache":
        indices = [int(i) for i in indices]
        n = len(indices)
        if n == 0:
            raise ValueError("A cache needs at least one sample, but got 0 indices.")
        samples = read_source(dataset, indices, workers=workers, progress=progress, desc="Building memory cache")
        try:
            head = list(itertools.islice(samples, min(8, n)))
            schema = infer_schema(head)
            columns = [np.empty((n, *leaf.shape), dtype=leaf.np_dtype) for leaf in schema.columns]
            overflow = np.zeros(n, dtype=bool)
            offsets = np.zeros(n + 1, dtype=np.int64)
            buf = bytearray()
            count = 0
            for k, sample in enumerate(itertools.chain(head, samples)):
                enc = encode(schema, sample)
                if enc.columns is None:
                    overflow[k] = True
                    for c in columns:
                        c[k] = 0
                else:
                    for c, a in zip(columns, enc.columns):
                        c[k] = a
                buf += enc.blob or b""
                offsets[k + 1] = len(buf)
                count += 1
        except BaseException:
            samples.close()
            raise
        if count != n:
            raise RuntimeError(f"The dataset gave {count} samples, but {n} were expected.")
        blobs = np.frombuffer(bytes(buf), dtype=np.uint8)
        stored = stored_manifest(cls.name, manifest, indices, schema)
        return cls(stored, columns, blobs, offsets, overflow)

    @classmethod
    def open(cls, path: Path | str, *, manifest: dict) -> "MemoryCache":
        raise ValueError("The memory cache lives in the process that built it and cannot be opened from "
                         "a path; build it with MemoryCache.build() or open_or_build('memory', ...).")

    @property
    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self.columns) + self.blobs.nbytes + self.offsets.nbytes
                   + self.overflow.nbytes)

    def __getitem__(self, k: int) -> Any:
        k = self._position(k)
        blob = self.blobs[self.offsets[k] : self.offsets[k + 1]]
        if self.overflow[k]:
            return decode(self.schema, None, blob)
        return decode(self.schema, [c[k] for c in self.columns], blob if self.schema.has_blob_leaves else None)
