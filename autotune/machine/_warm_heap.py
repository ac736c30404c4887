"""Make the heap a loop's batches will take resident before the loop starts, while this process waits anyway.

Without workers, each batch a loader gathers is a new array in the training process (38 MB for 64 float
224x224 RGB images). An allocator that keeps what is freed (glibc with its thresholds raised, tcmalloc:
``process.Allocator.keeps_freed``) hands the second epoch the blocks the first one freed, but the first
epoch's first batches take memory the process never had, and each of its pages faults. On a VM whose
balloon hands free memory back to the host (``VIRTIO_BALLOON_F_REPORTING``), memory the guest freed more
than a moment ago faults on the host too: on the 2-vCPU VM this was found on, the first two batches of
epoch 1 after a memory cache's build took 70-180 ms each against 3 ms later, which was the whole of the
first epoch's excess over the second (0.28 s against 0.14 s). Touched while the build's workers decode,
when the training process only waits for them, the same blocks cost 10-65 ms, and epoch 1 ran as epoch 2.

``warm_heap`` allocates the blocks the way the loop will (numpy, the C allocator), writes one byte a page,
and frees them, last first, so the allocator keeps one free stretch at least as large as the loop needs.
It changes no setting: where the allocator returns freed memory, the blocks simply go back.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Sequence

import numpy as np

WARMED_BATCHES = 2  # the batch the training loop holds and the one gathered next


def warm_heap(sizes: Sequence[int], copies: int = WARMED_BATCHES) -> float:
    """Allocate ``copies`` of a block of each of ``sizes`` bytes, write one byte a page, free them; the
    seconds it took. ``copies``: the batches alive at once (the one the loop holds and the next)."""
    start = time.perf_counter()
    blocks = []
    for _ in range(max(0, copies)):
        for size in sizes:
            if size > 0:
                block = np.empty(int(size), dtype=np.uint8)
                block[:: mmap.PAGESIZE] = 0
                block[-1] = 0  # the last page, where the block does not start on a page
                blocks.append(block)
    while blocks:
        blocks.pop()  # last first: what is freed last is what it merges into
    return time.perf_counter() - start
