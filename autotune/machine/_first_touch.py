"""What new memory costs on this machine: writing a fresh shared buffer once, split over processes.

A memory cache must hold every sample in pages nobody has touched before, and each page costs a
fault (the kernel finds, zeroes and maps it) the first time it is written. On the machine the
design was measured on (a 2-vCPU VM) that is ~1 s of CPU per GiB in 4 KiB faults, against 0.06 s
to write the same bytes again; asking the kernel to populate the range up front, or for huge
pages, cost as much or more. A bare decode pass reuses one sample's buffer and pays none of it, so
this is what separates a cache build from decoding the same samples (``diagnose._build``), and it is
measured, not removed: it is the price of keeping the samples.
"""

from __future__ import annotations

import mmap
import os
import time

import numpy as np


def first_touch_seconds(nbytes: int, workers: int = 0) -> float:
    """Seconds to write ``nbytes`` of fresh shared anonymous memory once, split over ``workers`` forked
    processes as a cache build's workers split it (0: in this process)."""
    buffer = mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_SHARED)
    try:
        view = np.frombuffer(buffer, dtype=np.uint8)
        parts = max(1, workers)
        bounds = np.linspace(0, nbytes, parts + 1, dtype=np.int64)
        start = time.perf_counter()
        if workers == 0:
            view[:] = 1
        else:
            pids = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child exits at once, whatever happens
                    try:
                        view[lo:hi] = 1
                    finally:
                        os._exit(0)
                pids.append(pid)
            for pid in pids:
                os.waitpid(pid, 0)
        seconds = time.perf_counter() - start
        del view
    finally:
        buffer.close()
    return seconds
