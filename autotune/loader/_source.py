"""What a loader reads: the user's dataset, or a cache of it, with the per-sample ``transform`` after it.

A memory cache (built, or filled during the first epoch) is read a whole batch at a time when the
caller collates with PyTorch's default and has no transform (``caches._gather``); everything else is
read sample by sample through ``Transformed``, so ``transform`` runs after the cache, every epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from autotune.caches import (
    FirstEpochCache,
    GatherDataset,
    GatheringFill,
    GatheringPartial,
    PartialCache,
    can_gather,
    collate_gathered,
)
from autotune.loader._dataloader import Transformed

Collate = Callable[..., Any] | None


def cached_source(cache: Any, transform: Callable[..., Any] | None,
                  collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a built ``cache`` (or a disk fill), and the collate function to pass."""
    if can_gather(cache, collate_fn, transform):
        return GatherDataset(cache), collate_gathered
    return Transformed(cache, transform), collate_fn


def filling_source(cache: FirstEpochCache, transform: Callable[..., Any] | None,
                   collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a memory cache the first epoch fills, and the collate function."""
    if transform is None and collate_fn is None and not cache.schema.has_blob_leaves:
        return GatheringFill(cache), collate_gathered
    return Transformed(cache, transform), collate_fn


def partial_source(cache: PartialCache, transform: Callable[..., Any] | None,
                   collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a partial memory cache, and the collate function to pass with it."""
    if transform is None and collate_fn is None:
        return GatheringPartial(cache), collate_gathered
    return Transformed(cache, transform), collate_fn


def reading(source: Any, transform: Callable[..., Any] | None, collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a cache or a fill, and the collate function to pass with it."""
    if isinstance(source, PartialCache):
        return partial_source(source, transform, collate_fn)
    if isinstance(source, FirstEpochCache):
        return filling_source(source, transform, collate_fn)
    return cached_source(source, transform, collate_fn)  # a disk fill reads as a disk cache does
