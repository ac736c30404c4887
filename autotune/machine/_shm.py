"""Will the batches in flight fit in /dev/shm? (the classic Docker "bus error")

DataLoader workers hand batches to the main process through shared memory: on Linux torch puts each
shared tensor in a file on the ``/dev/shm`` tmpfs, with the default ``file_descriptor`` strategy as
well as ``file_system`` (the descriptor strategy only passes an fd to an unlinked file there).  When
that tmpfs is full, writing the batch faults and the worker dies of SIGBUS.  Docker gives containers
64 MiB by default, less than two batches of 64 images at 224x224 in float32.
"""

from __future__ import annotations

import os
from typing import Any

from autotune._units import format_bytes

__all__ = ["batch_bytes", "shm_free", "shm_need", "shm_rule"]

DEFAULT_PREFETCH = 2  # torch's prefetch_factor when workers are used and none is given
# Batches alive in /dev/shm beyond the workers x prefetch in flight: the one the loop variable still
# holds while the next arrives, and the one just received (its task is refilled on receipt).
EXTRA_BATCHES = 2
# tmpfs rounds every shared tensor (its own file) up to whole pages, and the kernel keeps a little of
# the tmpfs for its own bookkeeping: 1/16 more, and 16 MiB for other users of /dev/shm.
SLACK_FRACTION = 1 / 16
SLACK_BYTES = 16 << 20


def shm_free(path: str | os.PathLike[str] = "/dev/shm") -> int | None:
    """Bytes free for an unprivileged writer in the shared-memory tmpfs; None where there is none."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def batch_bytes(batch: Any) -> int:
    """Bytes of tensor (and numpy array) data in a nested batch; a storage shared by views counts once."""
    import numpy as np
    import torch

    seen: set[int] = set()
    total = 0
    stack = [batch]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            key = storage.data_ptr()
            if key not in seen or key == 0:
                seen.add(key)
                total += max(storage.nbytes(), item.nbytes) if key else item.nbytes
        elif isinstance(item, np.ndarray):
            total += item.nbytes  # default_collate turns it into a tensor of the same size
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def shm_need(num_workers: int, prefetch_factor: int | None, batch_bytes: int) -> int:
    """Shared memory the loader's batches may occupy at once; 0 without workers.

    ``num_workers x prefetch_factor`` batches are in flight (being collated in a worker, which writes
    them straight into shared memory, or waiting in the queue), plus ``EXTRA_BATCHES`` held by the main
    process, plus page-rounding slack.
    """
    if not num_workers:
        return 0
    prefetch = prefetch_factor if prefetch_factor is not None else DEFAULT_PREFETCH
    raw = (num_workers * prefetch + EXTRA_BATCHES) * batch_bytes
    return int(raw * (1 + SLACK_FRACTION)) + SLACK_BYTES


def shm_rule(num_workers: int, prefetch_factor: int | None, batch_bytes: int, free: int | None) -> str | None:
    """None when the batches fit in the free shared memory (or it cannot be known), else the reason."""
    need = shm_need(num_workers, prefetch_factor, batch_bytes)
    if not need or free is None or need <= free:
        return None
    prefetch = prefetch_factor if prefetch_factor is not None else DEFAULT_PREFETCH
    return (
        f"needs ~{format_bytes(need)} of /dev/shm for {num_workers} workers x prefetch {prefetch} x "
        f"{format_bytes(batch_bytes)} batches, only {format_bytes(free)} free: the classic Docker 'bus error'; "
        "raise it with --shm-size or use fewer workers/prefetch"
    )
