"""A memory cache of the first samples, the rest from the source (``LoaderConfig.cache_share``, rule 5).

For data larger than the memory a job may use. CoorDL's MinIO policy (Mohan et al., "Analyzing and
Mitigating Data Stalls in DNN Training", VLDB 2021): the samples that fit stay in memory for the whole run
and are never evicted; every other sample is read from the source every epoch. The page cache's LRU does
worse on such data: a random order over a dataset larger than the cache evicts each page before its next
use, so nearly every read misses, while MinIO hits on the cached share of every epoch's reads.

Position p holds ``dataset[indices[p]]``; the first ``len(head)`` positions are the head's (a memory cache
built before training, or filled by the first epoch), the others read the source. So every sample is
exactly ``dataset[i]``. A batch all of whose samples are in the head is gathered from its columns in one
fancy-index per column (``caches._gather``), a head the first epoch fills as ``caches._fill`` reads it
(its workers decode into it, the training process gathers); a batch that mixes cached and uncached positions is read
sample by sample and collated by the caller's collate function (default_collate for a gathered loader),
which gives the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from autotune.caches._fill import FirstEpochCache, GatheringFill
from autotune.caches._gather import Gathered, _batch_leaf, _collated, _leaf_gatherable, can_gather
from autotune.caches._memory import MemoryCache


class PartialCache(Dataset[Any]):
    """``dataset`` at ``indices`` (default: all of it), the first ``len(head)`` of them from ``head``."""

    name = MemoryCache.name

    def __init__(self, head: MemoryCache | FirstEpochCache, dataset: Any, indices: Sequence[int] | None = None):
        self.head, self.dataset = head, dataset
        self.indices = [int(i) for i in (range(len(dataset)) if indices is None else indices)]
        self.cached = len(head)
        if self.cached > len(self.indices):
            raise ValueError(f"a partial cache's head holds {self.cached} samples, more than its "
                             f"{len(self.indices)} indices")

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def nbytes(self) -> int:
        return int(self.head.nbytes)

    @property
    def origin(self) -> str:
        return "built"

    @property
    def share(self) -> float:
        return self.cached / max(1, len(self.indices))

    def __getitem__(self, p: int) -> Any:
        if p < 0:
            p += len(self.indices)
        if p < self.cached:
            return self.head[p]
        return self.dataset[self.indices[p]]


class GatheringPartial(Dataset[Any]):
    """A partial cache read a whole batch at a time where the batch is all in the head's columns."""

    def __init__(self, cache: PartialCache):
        self.cache = cache
        head = cache.head
        if isinstance(head, MemoryCache):
            self.gatherable = can_gather(head, None, None)
        else:
            self.gatherable = not head.schema.has_blob_leaves and all(
                _leaf_gatherable(leaf) for leaf in head.schema.leaves)
            self._fill = GatheringFill(head)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, p: int) -> Any:
        return self.cache[p]

    def __getitems__(self, positions: list[int]) -> Any:
        cache = self.cache
        idx = np.asarray(positions, dtype=np.int64)
        if self.gatherable and len(idx) and int(idx.max()) < cache.cached and int(idx.min()) >= 0:
            head = cache.head
            if isinstance(head, FirstEpochCache):  # the head's positions are the cache's: read as a fill is
                return self._fill.__getitems__(positions)
            values = iter([_batch_leaf(leaf, column[idx]) for leaf, column in zip(head.schema.columns,
                                                                                   head.columns)])
            return Gathered(_collated(head.schema.tree, values))
        return [cache[p] for p in positions]


def build_partial(dataset: Any, count: int, *, fill: str = "build", indices: Sequence[int] | None = None,
                  progress: bool = True, workers: int = 0) -> PartialCache:
    """A partial cache of ``dataset`` at ``indices`` (default: all) whose head holds the first ``count``
    positions: built now (``fill="build"``) or filled by the first epoch (``"first_epoch"``)."""
    indices = [int(i) for i in (range(len(dataset)) if indices is None else indices)]
    count = max(1, min(int(count), len(indices)))
    head_indices = indices[:count]
    head: MemoryCache | FirstEpochCache
    if fill == "first_epoch":
        head = FirstEpochCache(dataset, head_indices)
    else:
        head = MemoryCache.build(dataset, head_indices, None, manifest={"partial": True}, progress=progress,
                                 workers=workers)
    return PartialCache(head, dataset, indices)
