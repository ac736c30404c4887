"""Ten million samples of 1 MiB each (about 9.5 TiB) that exist nowhere on disk.

``dataset[i]`` generates sample i from its index, deterministically (numpy's ``default_rng(i)``), at a
small fixed cost per sample (about a millisecond: generating 1 MiB of random bytes), labelled
``i % 10``.  No cache of it can fit on this machine's memory or disk: a search must measure a small
seeded subset, rule every cache out as not fitting, and extrapolate the figures to the whole length:

    autotune search examples/big_synthetic.py --budget 2m
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

SAMPLES = 10_000_000
SAMPLE_BYTES = 1 << 20

batch_size = 16
epochs = 2


class BigSynthetic(Dataset):
    """Sample i: 1 MiB of uint8 from ``default_rng(i)``, and its label ``i % 10``."""

    def __init__(self, length: int = SAMPLES, sample_bytes: int = SAMPLE_BYTES):
        self.length = length
        self.sample_bytes = sample_bytes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        if not 0 <= i < self.length:
            raise IndexError(f"index {i} out of range for {self.length} samples")
        data = np.frombuffer(np.random.default_rng(i).bytes(self.sample_bytes), dtype=np.uint8).copy()
        return torch.from_numpy(data), i % 10


dataset = BigSynthetic()
