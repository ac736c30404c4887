"""benchmarks/adapt.py's workload, importable by a search's trial processes: a CPU-decoded dataset with a
random augmentation, and a CPU-heavy training step that competes with the loader's workers for the cores."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Augmented(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i: ``work`` rounds of numpy arithmetic on a 64x64 array seeded by i (a decode's CPU), then a
    random flip and noise drawn from torch's generator (a training augmentation). The draw makes every read
    of a sample different, so autotune caches none of it (the search leaves caches out, the factory refuses
    one): every epoch decodes, and the worker count decides where that CPU is spent."""

    def __init__(self, n: int, work: int):
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        a = np.random.default_rng(i).random((64, 64), dtype=np.float32)
        for _ in range(self.work):
            a = np.tanh(a @ a.T * 0.01)
        x = torch.from_numpy(a)
        if torch.rand(()) < 0.5:
            x = x.flip(1)
        return x + 0.01 * torch.randn(64, 64), i


def step(batch: Any, rounds: int) -> float:
    """The training step: ``rounds`` 256x256 matmuls on torch's intra-op threads."""
    x = torch.ones(256, 256)
    for _ in range(rounds):
        x = torch.tanh(x @ x * 1e-3)
    return float(x[0, 0]) + float(batch[0].sum())


def cheap_step(batch: Any) -> float:
    """The proxy a recipe is searched with, a small model's worth of small ops (1-2 ms on one thread): each
    op on the batch's 65,536 values is split between torch's threads, so with two main threads every op
    waits for a second core that the decoding workers hold; one main thread does not wait."""
    x = batch[0]
    for _ in range(8):
        x = torch.tanh(x * 0.5)
    return float(x.sum())
