"""memory: samples in a few contiguous numpy buffers in the main process, shared by forked workers."""

from __future__ import annotations

import itertools
import mmap
import multiprocessing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotune.caches._base import Cache, read_source, stored_manifest
from autotune.caches._codec import decode, encode, infer_schema
from autotune.caches._draws import WatchedReads
from autotune.caches._family import register
from autotune.machine import FileColumn, populate

_HEAD = 8  # samples read in the calling process to fix the schema before workers start


def _shared_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array in anonymous shared memory: what a forked worker writes, its parent sees.

    Not a /dev/shm file, so a small /dev/shm (Docker) does not limit the cache."""
    count = int(np.prod(shape, dtype=np.int64))
    # Not populated: populating zeroes every page in this process, on one core, while the workers wait
    # (0.9 s of a 3.5 s build of 1.2 GB); left lazy, the workers fault in the pages they write, in
    # parallel, and the first epoch maps them (already filled) at a fraction of that.
    buffer = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=mmap.MAP_SHARED)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def _file_columns(schema: Any, n: int) -> list[FileColumn] | None:
    """The schema's columns as memory files, or None where the OS has no ``memfd_create``."""
    if not FileColumn.available():
        return None
    made: list[FileColumn] = []
    try:
        for leaf in schema.columns:
            made.append(FileColumn((n, *leaf.shape), leaf.np_dtype))
    except BaseException:
        for column in made:
            column.close()
        raise
    return made


def _store(schema: Any, columns: list[np.ndarray], overflow: np.ndarray, blobs: list[bytes], k: int,
           enc: Any) -> None:
    if enc.columns is None:
        overflow[k] = True
    else:
        for column, value in zip(columns, enc.columns):
            column[k] = value
    blobs[k] = enc.blob or b""


class _ColumnWriter(torch.utils.data.Dataset[Any]):
    """Position k: decode ``dataset[indices[k]]`` in a worker and write its columns in place; only the
    overflow flag and the blob (as a uint8 tensor, exact protocol-5 bytes) go back. ``files``: the same
    columns as memory files, written through their descriptors (``FileColumn``)."""

    def __init__(self, dataset: Any, indices: list[int], schema: Any, columns: list[np.ndarray],
                 files: list[FileColumn] | None = None):
        self.reads, self.indices, self.schema, self.columns = WatchedReads(dataset), indices, schema, columns
        self.files = files

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> tuple[int, bool, torch.Tensor | None]:
        return self._write(k, self.reads.read(self.indices[k]))

    def __getitems__(self, positions: list[int]) -> list[tuple[int, bool, torch.Tensor | None]]:
        samples = self.reads.read_all([self.indices[k] for k in positions])  # watched once per batch
        return [self._write(k, sample) for k, sample in zip(positions, samples)]

    def _write(self, k: int, sample: Any) -> tuple[int, bool, torch.Tensor | None]:
        enc = encode(self.schema, sample)
        if enc.columns is not None and self.files is not None:
            for file, value in zip(self.files, enc.columns):
                file.write(k, value)
        elif enc.columns is not None:
            for column, value in zip(self.columns, enc.columns):
                column[k] = value
        wire = torch.frombuffer(bytearray(enc.blob), dtype=torch.uint8) if enc.blob else None
        return k, enc.columns is None, wire


@register
class MemoryCache(Cache):
    """One ``(N, *shape)`` array per column leaf, one uint8 blob buffer with an offsets array, and an
    overflow flag per sample: a handful of Python objects whatever N is, so forked DataLoader workers
    share the pages instead of copying them as they touch refcounts (PyTorch issue 13246).

    Built in the calling process, before workers start; ``path`` is ignored.
    """

    name = "memory"
    in_memory = True
    order = 0

    @classmethod
    def estimate_need(cls, bytes_per_sample: float, n: int) -> tuple[int, int]:
        # the buffers, offsets, and the build's one-time copy of the blob bytes
        return int(float(bytes_per_sample) * n * 1.05 + 17 * n + (1 << 20)), 0

    def __init__(self, stored: dict[str, Any], columns: list[np.ndarray], blobs: np.ndarray, offsets: np.ndarray,
                 overflow: np.ndarray):
        super().__init__(None, stored)
        self.origin = "built"  # never opened from anywhere: always built by the process that holds it
        self.columns, self.blobs, self.offsets, self.overflow = columns, blobs, offsets, overflow

    @classmethod
    def build(cls, dataset: Any, indices: Sequence[int], path: Path | str | None = None, *, manifest: dict[str, Any],
              progress: bool = True, workers: int = 0,
              meanwhile: Callable[[list[int]], None] | None = None) -> MemoryCache:
        """``meanwhile``: called once in this process with the bytes of one sample's columns, while the build's
        workers decode and this process only waits for them (never where the build decodes here)."""
        indices = [int(i) for i in indices]
        n = len(indices)
        if n == 0:
            raise ValueError("A cache needs at least one sample, but got 0 indices.")
        if workers > 0 and "fork" in multiprocessing.get_all_start_methods() and n > _HEAD:
            return cls._build_in_workers(dataset, indices, manifest=manifest, progress=progress, workers=workers,
                                         meanwhile=meanwhile)
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
    def _build_in_workers(cls, dataset: Any, indices: list[int], *, manifest: dict[str, Any], progress: bool,
                          workers: int, meanwhile: Callable[[list[int]], None] | None = None) -> MemoryCache:
        """Forked workers decode and write each sample straight into the columns, which live in shared
        memory: nothing crosses a pipe or /dev/shm but the small blobs, and the main process, which would
        otherwise copy every sample three times while competing for the same cores, waits. The columns
        are memory files the workers write through (``FileColumn``: no fault per fresh page), or shared
        anonymous memory they store into where the OS has no ``memfd_create``. Once they are done, the
        columns' pages are mapped into this process (``machine.populate``), so the first epoch does not
        fault them in."""
        from tqdm.auto import tqdm

        n = len(indices)
        reads = WatchedReads(dataset)
        head = [reads.read(i) for i in indices[:_HEAD]]
        schema = infer_schema(head)
        files = _file_columns(schema, n)
        columns = ([f.array for f in files] if files is not None
                   else [_shared_array((n, *leaf.shape), leaf.np_dtype) for leaf in schema.columns])
        try:
            overflow = np.zeros(n, dtype=bool)
            blobs: list[bytes] = [b""] * n
            for k, sample in enumerate(head):
                _store(schema, columns, overflow, blobs, k, encode(schema, sample))
            writer = _ColumnWriter(dataset, indices, schema, columns, files)
            loader = torch.utils.data.DataLoader(
                writer, sampler=range(_HEAD, n), batch_size=32, num_workers=workers, collate_fn=list,
                multiprocessing_context="fork",
            )
            it = iter(loader)
            if meanwhile is not None:  # the workers decode; this process would only wait
                try:
                    meanwhile([int(column[0].nbytes) for column in columns])
                except BaseException:
                    it._shutdown_workers()  # type: ignore[attr-defined]
                    raise
            with tqdm(total=n, initial=_HEAD, desc="Building memory cache", unit="sample", disable=not progress,
                      leave=False) as bar:
                try:
                    for batch in it:
                        for k, is_overflow, wire in batch:
                            overflow[k] = is_overflow
                            blobs[k] = wire.numpy().tobytes() if wire is not None else b""
                        bar.update(len(batch))
                finally:
                    it._shutdown_workers()  # type: ignore[attr-defined]  # an interrupted build leaves no worker behind
        finally:
            for file in files or ():
                file.close()  # the mappings keep the columns; nothing writes them any more
        for column in columns:  # the workers wrote the pages; mapped here now, epoch 1 reads as epoch 2
            populate(column)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blobs], out=offsets[1:])
        blob_buffer = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        stored = stored_manifest(cls.name, manifest, indices, schema)
        return cls(stored, columns, blob_buffer, offsets, overflow)

    @classmethod
    def open(cls, path: Path | str, *, manifest: dict[str, Any]) -> MemoryCache:
        raise ValueError("The memory cache lives in the process that built it and cannot be opened from "
                         "a path; build it with MemoryCache.build() or open_or_build('memory', ...).")

    @property
    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self.columns) + self.blobs.nbytes + self.offsets.nbytes
                   + self.overflow.nbytes)

    def __getitem__(self, k: int) -> Any:
        k = self._position(k)
        blob = self.blobs[self.offsets[k] : self.offsets[k + 1]].data  # a view, no copy
        if self.overflow[k]:
            return decode(self.schema, None, blob)
        return decode(self.schema, [c[k] for c in self.columns], blob if self.schema.has_blob_leaves else None)
