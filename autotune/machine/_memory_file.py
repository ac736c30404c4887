"""A shared array in a memory file (``memfd_create``), written through the file: how autotune fills new
memory for a cache (``caches._memory``), and how ``machine._first_touch`` measures what that costs."""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np


class FileColumn:
    """A column in a memory file (``memfd_create``): mapped shared, as ``_shared_array``'s are, and written
    by ``write(k, value)`` through the file, not through the mapping. A store through the mapping faults
    in every fresh page, and the kernel zeroes each page before the store fills it; ``pwrite`` of whole
    pages fills them directly. Measured here: 2000 CHW 224x224 float samples took 1.05 s stored through a
    fresh mapping, 0.60 s staged into one reused buffer and written (docs/architecture.md §4). The file's
    descriptor lives until ``close()``: forked workers write through their inherited copy of it.
    Python's mmap keeps a descriptor of its own for the mapping, closed when the array is freed."""

    @staticmethod
    def available() -> bool:
        return hasattr(os, "memfd_create")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
        self.row_nbytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        size = max(1, shape[0] * self.row_nbytes)
        self.fd = os.memfd_create("autotune-memory-cache", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            buffer = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(buffer, dtype=dtype, count=int(np.prod(shape, dtype=np.int64))).reshape(shape)
        # One row per thread, reused: its pages fault once per thread. Never shared between threads: one
        # thread's row staged over another's before that one's pwrite would put a sample at another's position.
        self._stages = threading.local()
        # Closed when the column is dropped or at exit, while ``os`` is still whole: a ``__del__`` run at
        # interpreter shutdown finds module globals gone ("Exception ignored ... getpid").
        self._close = weakref.finalize(self, os.close, self.fd)

    def write(self, k: int, value: Any) -> None:
        """Row k = ``value``, with the assignment's own conversion (``column[k] = value``)."""
        row = self.array.shape[1:]
        if (isinstance(value, np.ndarray) and value.dtype == self.array.dtype and value.shape == row
                and value.flags.c_contiguous):
            source = value  # already the row's bytes: written from where they are, not copied once more
        else:
            stage: np.ndarray | None = getattr(self._stages, "row", None)
            if stage is None:
                stage = self._stages.row = np.empty(row, dtype=self.array.dtype)
            stage[...] = value
            source = stage
        data = source.reshape(-1).view(np.uint8).data
        offset = k * self.row_nbytes
        while len(data):
            written = os.pwrite(self.fd, data, offset)
            data, offset = data[written:], offset + written

    def close(self) -> None:
        """Close the file's descriptor (once, however often it is called); the mapping stays."""
        self._close()
