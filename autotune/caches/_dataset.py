"""CachedDataset: the cache, then the user's ``transform`` on every access."""

from __future__ import annotations

from typing import Any, Callable

import torch

from autotune.caches._base import Cache


class CachedDataset(torch.utils.data.Dataset):
    """``transform(source[i])``: the cache gives the exact sample, the transform runs every epoch
    (so random augmentation stays random)."""

    def __init__(self, source: Cache, transform: Callable[[Any], Any] | None = None):
        self.source, self.transform = source, transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Any:
        sample = self.source[i]
        return sample if self.transform is None else self.transform(sample)
