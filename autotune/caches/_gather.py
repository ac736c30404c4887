"""Whole batches from the memory cache: one fancy-index per column instead of B decodes and a stack.

When the caller collates with PyTorch's default and has no per-sample transform, a batch is exactly
``default_collate([cache[i] for i in batch])``. That can be built directly from the cache's ``(N, ...)``
columns: each fancy-index is one contiguous copy, close to a plain memcpy. The DataLoader asks for it
through ``Dataset.__getitems__`` and ``collate_gathered`` passes it on untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from autotune.caches._codec import Leaf, _key_value, _torch_dtype
from autotune.caches._memory import MemoryCache

_GATHERABLE = {"ndarray", "tensor", "int", "float", "bool"}


class Gathered:
    """A batch that is already collated (so the collate function must not touch it)."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any):
        self.batch = batch


def collate_gathered(data: Any) -> Any:
    """default_collate, except for a batch the dataset already gathered."""
    return data.batch if isinstance(data, Gathered) else default_collate(data)


def _leaf_gatherable(leaf: Leaf) -> bool:
    if leaf.store != "column" or leaf.kind not in _GATHERABLE:
        return False
    dtype = leaf.np_dtype
    if leaf.kind == "ndarray":
        # default_collate goes through torch.as_tensor: only native-order dtypes torch has
        try:
            torch.from_numpy(np.empty(0, dtype=dtype))
        except TypeError:
            return False
        return dtype.isnative
    return True


def can_gather(cache: Any, collate_fn: Callable[..., Any] | None, transform: Callable[..., Any] | None) -> bool:
    if not isinstance(cache, MemoryCache) or collate_fn is not None or transform is not None:
        return False
    schema = cache.schema
    return (not schema.has_blob_leaves and not bool(cache.overflow.any())
            and all(_leaf_gatherable(leaf) for leaf in schema.leaves))


def _batch_leaf(leaf: Leaf, rows: np.ndarray) -> torch.Tensor:
    if leaf.kind == "int":
        return torch.from_numpy(rows.reshape(-1).astype(np.int64, copy=False))
    if leaf.kind == "float":
        return torch.from_numpy(rows.reshape(-1).astype(np.float64, copy=False))
    if leaf.kind == "bool":
        return torch.from_numpy(rows.reshape(-1).astype(np.bool_, copy=False))
    tensor = torch.from_numpy(rows)
    if leaf.kind == "tensor":
        dtype = _torch_dtype(leaf.torch_dtype)
        return tensor if tensor.dtype == dtype else tensor.view(dtype)
    return tensor


def _collated(tree: dict[str, Any], values: Any) -> Any:
    """The container shapes default_collate gives: tuples and lists become lists, dicts stay dicts."""
    kind = tree["t"]
    if kind == "leaf":
        return next(values)
    if kind in ("tuple", "list"):
        return [_collated(child, values) for child in tree["c"]]

    return {_key_value(k): _collated(child, values) for k, child in zip(tree["k"], tree["c"])}


class GatherDataset(Dataset[Any]):
    """The memory cache, read a whole batch at a time."""

    def __init__(self, cache: MemoryCache):
        self.cache = cache

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, i: int) -> Any:
        return self.cache[i]

    def __getitems__(self, positions: list[int]) -> Gathered:
        idx = np.asarray(positions, dtype=np.int64)
        schema = self.cache.schema
        values = iter([_batch_leaf(leaf, column[idx]) for leaf, column in zip(schema.columns, self.cache.columns)])
        return Gathered(_collated(schema.tree, values))
