"""What new memory costs on this machine: filling a fresh shared buffer once, split over processes.

A memory cache must hold every sample in pages nobody has touched before. Stored through a mapping,
each page costs a fault (the kernel finds, zeroes and maps it) the first time it is written: on the
machine the design was measured on (a 2-vCPU VM) ~1 s of CPU per GiB, against 0.06 s to write the
same bytes again; populating the range up front, or huge pages, cost as much or more. Written through
a memory file (``machine._memory_file``), as the cache's build now writes, whole pages are filled
without the fault and the zeroing: about half of it. A bare decode pass reuses one sample's buffer and
pays none of it, so this is what separates a cache build from decoding the same samples
(``diagnose._build``): the price of keeping the samples, measured here the way the build pays it.

On a VM whose balloon reports free memory to the host (virtio's ``VIRTIO_BALLOON_F_REPORTING``), memory
freed more than a few seconds earlier faults on the host again when touched: the figure moves with what
the machine freed just before (1.2 GB here: 0.66-0.92 s right after another process freed as much,
0.80-1.20 s six seconds later; docs/architecture.md §4). Compare it in interleaved, paired runs.
"""

from __future__ import annotations

import mmap
import os
import time

import numpy as np

from autotune.machine._memory_file import FileColumn

_ROW = 1 << 20  # bytes written per call, as a cache writes one sample


def first_touch_seconds(nbytes: int, workers: int = 0) -> float:
    """Seconds to fill ``nbytes`` (rounded up to whole MiB) of fresh shared memory once, the way a memory
    cache's build fills it: through a memory file, or stored through a fresh shared mapping where the OS
    has no ``memfd_create``, split over ``workers`` forked processes as the build's workers split it (0: in
    this process). Read back once the clock has stopped: RuntimeError if a row was not written."""
    rows = max(1, -(-nbytes // _ROW))
    column = FileColumn((rows, _ROW), np.dtype(np.uint8)) if FileColumn.available() else None
    array = column.array if column is not None else np.frombuffer(
        mmap.mmap(-1, rows * _ROW, flags=mmap.MAP_SHARED), dtype=np.uint8).reshape(rows, _ROW)
    fill = np.ones(_ROW, dtype=np.uint8)

    def write(lo: int, hi: int) -> None:
        for k in range(lo, hi):
            if column is not None:
                column.write(k, fill)
            else:
                array[k] = fill

    try:
        bounds = np.linspace(0, rows, max(1, workers) + 1, dtype=np.int64)
        start = time.perf_counter()
        if workers == 0:
            write(0, rows)
        else:
            pids = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child exits at once, whatever happens
                    try:
                        write(int(lo), int(hi))
                    finally:
                        os._exit(0)
                pids.append(pid)
            for pid in pids:
                os.waitpid(pid, 0)
        seconds = time.perf_counter() - start
    finally:
        if column is not None:
            column.close()
    unwritten = int(np.count_nonzero(array[:, ::4096] != 1))  # one byte a page
    if unwritten:
        raise RuntimeError(f"{unwritten} page(s) of the fresh memory were not written; the figure would be wrong")
    return seconds
