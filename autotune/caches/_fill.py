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

Read a batch at a time (``GatheringFill``, the default collate and no transform), a forked worker
decodes each sample of its batch straight into the cache and hands the training process only which
positions are ready (``_Ready``, a few bytes through the DataLoader's queue); the training process
gathers the batch from the cache's columns as it arrives, as every later epoch does. So the first
epoch is the build: one decode pass on the workers' cores, and no sample crosses the DataLoader's
pickling and shared-memory path to be written into the cache a second time. A batch holding a sample
the cache does not keep (overflow, blob leaves) or read while a draw was seen goes as the samples
themselves, as before; every batch is exactly ``default_collate`` of ``dataset[i]``.

What is not kept: a sample whose shape or type differs from the first samples' (the schema's
overflow) or that holds leaves the columns cannot hold (strings, objects: the schema's blob
leaves). Those are read from the source every epoch, exactly. A worker started by spawn or
forkserver receives a pickled copy, which does not share the columns: it reads the source and fills
nothing (exact, but no faster; a search measures that and chooses otherwise).
"""

from __future__ import annotations

import itertools
import logging
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, get_worker_info

from autotune.caches._codec import decode, encode, infer_schema
from autotune.caches._draws import WatchedReads, message
from autotune.caches._gather import Gathered, _batch_leaf, _collated, _leaf_gatherable
from autotune.caches._memory import MemoryCache, _file_columns, _shared_array

log = logging.getLogger("autotune")

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
        self._reads = WatchedReads(dataset)
        self.random = _shared_array((1,), np.dtype(np.uint8))  # a read drew randomness: nothing is trusted
        head = [self._read(k) for k in range(min(_HEAD, n))]
        self.schema = infer_schema(head)
        # Memory files where the OS has them, written through their descriptors (no fault and no zeroing
        # per fresh page, as the built cache's: ``caches._memory``), else shared anonymous memory.
        self.files = _file_columns(self.schema, n)
        self.columns = ([f.array for f in self.files] if self.files is not None
                        else [_shared_array((n, *leaf.shape), leaf.np_dtype) for leaf in self.schema.columns])
        self.filled = _shared_array((n,), np.dtype(np.uint8))
        self.owner = os.getpid()
        self.attached = True  # False in a pickled copy: its columns are not shared, so it only reads
        self.token = f"{self.owner}-{next(_TOKENS)}"  # how a worker's ``_Ready`` names this cache
        _FILLS[self.token] = self
        for k, sample in enumerate(head):
            self._keep(k, sample)

    def __len__(self) -> int:
        return len(self.indices)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["columns"], state["filled"], state["attached"], state["files"] = None, None, False, None
        state["random"] = None
        return state

    @property
    def filled_count(self) -> int:
        return int(self.filled.sum()) if self.attached else 0

    @property
    def whole(self) -> bool:
        """Every sample is in the cache (and no later read goes to the source)."""
        return self.attached and bool(self.filled.all()) and not self.random[0]

    @property
    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self.columns) + self.filled.nbytes) if self.attached else 0

    def _read(self, k: int) -> Any:
        """``dataset[indices[k]]`` from the source; a read that drew randomness ends the fill (warned)."""
        sample, drawn = self._reads.read_noting(self.indices[k])
        if drawn is not None and self.random is not None and not self.random[0]:
            self.random[0] = 1
            log.warning("autotune: %s; this run reads the source every epoch and keeps no cache.",
                        message(self.indices[k], f"drew from {drawn}"))
        return sample

    def _read_all(self, ks: Sequence[int]) -> list[Any]:
        """``_read`` of each position of ``ks``, the generators watched once around them all."""
        samples, drawn = self._reads.read_all_noting([self.indices[k] for k in ks])
        if drawn is not None and self.random is not None and not self.random[0]:
            self.random[0] = 1
            log.warning("autotune: %s; this run reads the source every epoch and keeps no cache.", message(*drawn))
        return samples

    def _keep(self, k: int, sample: Any) -> None:
        if not self.attached or self.schema.has_blob_leaves or self.random[0]:
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
        if self.attached and self.filled[k] and not self.random[0]:
            return decode(self.schema, [c[k] for c in self.columns], None)
        sample = self._read(k)
        self._keep(k, sample)
        return sample


# The fills this process made, by token: where a worker's ``_Ready`` finds its cache on arrival.
_FILLS: weakref.WeakValueDictionary[str, FirstEpochCache] = weakref.WeakValueDictionary()
_TOKENS = itertools.count()


def _gather(cache: FirstEpochCache, idx: np.ndarray) -> Any:
    """The batch at positions ``idx``, all in the cache, as ``default_collate`` of its samples."""
    values = iter([_batch_leaf(leaf, column[idx]) for leaf, column in zip(cache.schema.columns, cache.columns)])
    return _collated(cache.schema.tree, values)


class _Ready:
    """Which positions of a fill a worker has in the cache: pickled, a token and the positions; unpickled
    in the training process (the DataLoader's queue does it as the batch arrives), the gathered batch."""

    __slots__ = ("positions", "token")

    def __init__(self, token: str, positions: np.ndarray):
        self.token, self.positions = token, positions

    def __reduce__(self) -> tuple[Any, tuple[str, np.ndarray]]:
        return _arrive, (self.token, self.positions)


def _arrive(token: str, positions: np.ndarray) -> Any:
    cache = _FILLS.get(token)
    if cache is None or not cache.attached or cache.owner != os.getpid():
        raise RuntimeError(f"A batch of the first-epoch cache {token} reached process {os.getpid()}, which does "
                           "not hold that cache; it can only be read by the process that made the loader.")
    return _gather(cache, positions)


class GatheringFill(Dataset[Any]):
    """A first-epoch cache read a whole batch at a time: the batch's missing samples are decoded into
    the cache, then the batch is gathered from it, in this process or, from a forked worker, in the
    training process (``_Ready``); a batch the cache cannot hold whole goes sample by sample (the
    collate function handles both)."""

    def __init__(self, cache: FirstEpochCache):
        self.cache = cache
        self.gatherable = all(_leaf_gatherable(leaf) for leaf in cache.schema.leaves)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, k: int) -> Any:
        return self.cache[k]

    def __getitems__(self, positions: list[int]) -> Any:
        cache = self.cache
        if not (self.gatherable and cache.attached):
            return [cache[k] for k in positions]
        idx = np.asarray(positions, dtype=np.int64)
        # Each missing sample read once, from the source into the cache; kept in hand in case the batch
        # cannot be gathered (a sample the cache does not keep, a draw), so none is read twice. Kept by
        # its place in the batch, not its index: a sampler with replacement repeats an index, and each
        # occurrence is a read of its own, as a plain loader's is (two draws where the dataset draws).
        places = [j for j in range(len(positions)) if cache.filled[idx[j]] == 0]
        read = dict(zip(places, cache._read_all([int(idx[j]) for j in places])))
        for j, sample in read.items():
            cache._keep(int(idx[j]), sample)
        if not (cache.filled[idx].all() and not cache.random[0]):
            return [read[j] if j in read else cache[k] for j, k in enumerate(positions)]
        if get_worker_info() is not None and os.getppid() == cache.owner:  # the training process unpickles it
            return Gathered(_Ready(cache.token, idx))
        return Gathered(_gather(cache, idx))
