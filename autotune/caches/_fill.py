"""The memory cache filled while the first epoch trains (``LoaderConfig.cache_fill="first_epoch"``).

The semantics of tf.data's ``cache()``: the first epoch reads the source as a loader without a cache
would, in the same workers, and each sample it decodes goes both to training and into the cache;
later epochs read the cache. There is no separate build pass before training starts.

Position k holds ``dataset[indices[k]]``. Its columns live in memory files (or, without
``memfd_create``, anonymous shared memory) created before the workers fork, written through their
descriptors as the built memory cache's are (``caches._memory``), with one ``filled`` byte per
sample: a worker writes a sample's columns, then sets its byte; every reader trusts a sample only
when its byte is set and reads the source otherwise. So every epoch yields exactly ``dataset[i]``,
a partial first epoch (interrupted, or a sampler that skips samples) leaves a partial cache that
says so (``whole`` is False) and is completed by whichever later epoch reads the missing samples,
and nothing is written to disk, so no cache can claim to be whole when it is not. A random
``transform`` runs after the cache, every epoch (``autotune.loader``).

What is not kept: a sample whose shape or type differs from the first samples' (the schema's
overflow) or that holds leaves the columns cannot hold (strings, objects: the schema's blob
leaves). Those are read from the source every epoch, exactly. A worker started by spawn or
forkserver receives a pickled copy, which does not share the columns: it reads the source and fills
nothing (exact, but no faster; a search measures that and chooses otherwise).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from autotune.caches._codec import decode, encode, infer_schema
from autotune.caches._gather import Gathered, _batch_leaf, _collated, _leaf_gatherable
from autotune.caches._memory import MemoryCache, _file_columns, _shared_array

_HEAD = 8  # samples read before the workers start, to fix the schema (the built cache reads as many)


class FirstEpochCache(Dataset[Any]):
    """A memory cache of ``dataset`` at ``indices`` (default: all of it), filled as its samples are read."""

    name = MemoryCache.name

    def __init__(self, dataset: Any, indices: Sequence[int] | None = None):
        self.dataset = dataset
        self.indices = [int(i) for i in (range(len(dataset)) if indices is None else indices)]
        n = len(self.indices)
        if n == 0:
            raise ValueError("A cache needs at least one sample, but got 0 indices.")
        head = [dataset[i] for i in self.indices[:_HEAD]]
        self.schema = infer_schema(head)
        # Memory files where the OS has them, written through their descriptors (no fault and no zeroing
        # per fresh page, as the built cache's: ``caches._memory``), else shared anonymous memory.
        self.files = _file_columns(self.schema, n)
        self.columns = ([f.array for f in self.files] if self.files is not None
                        else [_shared_array((n, *leaf.shape), leaf.np_dtype) for leaf in self.schema.columns])
        self.filled = _shared_array((n,), np.dtype(np.uint8))
        self.owner = os.getpid()
        self.attached = True  # False in a pickled copy: its columns are not shared, so it only reads
        for k, sample in enumerate(head):
            self._keep(k, sample)

    def __len__(self) -> int:
        return len(self.indices)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["columns"], state["filled"], state["attached"], state["files"] = None, None, False, None
        return state

    @property
    def filled_count(self) -> int:
        return int(self.filled.sum()) if self.attached else 0

    @property
    def whole(self) -> bool:
        """Every sample is in the cache (and no later read goes to the source)."""
        return self.attached and bool(self.filled.all())

    @property
    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self.columns) + self.filled.nbytes) if self.attached else 0

    def _keep(self, k: int, sample: Any) -> None:
        if not self.attached or self.schema.has_blob_leaves:
            return
        enc = encode(self.schema, sample)
        if enc.columns is None:  # overflow: not kept, read from the source every epoch
            return
        if self.files is not None:
            for file, value in zip(self.files, enc.columns):
                file.write(k, value)
        else:
            for column, value in zip(self.columns, enc.columns):
                column[k] = value
        self.filled[k] = 1  # after the columns: a reader that sees the byte sees the sample

    def __getitem__(self, k: int) -> Any:
        if k < 0:
            k += len(self.indices)
        if self.attached and self.filled[k]:
            return decode(self.schema, [c[k] for c in self.columns], None)
        sample = self.dataset[self.indices[k]]
        self._keep(k, sample)
        return sample


class GatheringFill(Dataset[Any]):
    """A first-epoch cache read a whole batch at a time once the batch's samples are all in it
    (``caches._gather``); before that, sample by sample (the collate function handles both)."""

    def __init__(self, cache: FirstEpochCache):
        self.cache = cache
        self.gatherable = all(_leaf_gatherable(leaf) for leaf in cache.schema.leaves)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, k: int) -> Any:
        return self.cache[k]

    def __getitems__(self, positions: list[int]) -> Any:
        cache = self.cache
        if self.gatherable and cache.attached:
            idx = np.asarray(positions, dtype=np.int64)
            if cache.filled[idx].all():
                values = iter([_batch_leaf(leaf, column[idx])
                               for leaf, column in zip(cache.schema.columns, cache.columns)])
                return Gathered(_collated(cache.schema.tree, values))
        return [cache[k] for k in positions]
