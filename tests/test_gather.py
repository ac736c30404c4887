"""The memory cache's whole-batch path gives exactly what default_collate gives, in and out of workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from autotune.caches import MemoryCache, PickleCache
from autotune.caches._codec import samples_equal
from autotune.caches._gather import GatherDataset, can_gather, collate_gathered
from autotune.loader import cached_source

pytestmark = pytest.mark.timeout(120)


class Numeric(Dataset):
    """Every leaf kind that default_collate turns into a tensor."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        return (
            torch.from_numpy(rng.random((3, 4, 5), dtype=np.float32)),
            {"label": i % 7, "weight": i / 3, "flag": bool(i % 2), "half": torch.full((2,), i, dtype=torch.bfloat16)},
            [rng.integers(0, 255, (6,), dtype=np.uint8), torch.tensor(i, dtype=torch.int16),
             np.array(i * 1.5, dtype=np.float64)],
        )


class WithText(Numeric):
    def __getitem__(self, i: int):
        return super().__getitem__(i)[0], f"sample {i}"


def build(dataset):
    return MemoryCache.build(dataset, range(len(dataset)), manifest={"key": "t"}, progress=False)


def test_a_gathered_batch_equals_default_collate():
    cache = build(Numeric())
    fast = GatherDataset(cache)
    for positions in ([0, 1, 2], [22, 3, 3, 17], list(range(23))):
        got = collate_gathered(fast.__getitems__(positions))
        want = default_collate([cache[i] for i in positions])
        assert samples_equal(got, want)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_yields_the_plain_loaders_batches(workers):
    dataset = Numeric()
    data, collate = cached_source(build(dataset), None, None)
    assert isinstance(data, GatherDataset)
    fast = DataLoader(data, batch_size=5, collate_fn=collate, num_workers=workers,
                      shuffle=True, generator=torch.Generator().manual_seed(3))
    plain = DataLoader(dataset, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3))
    pairs = list(zip(fast, plain, strict=True))
    assert len(pairs) == 5
    for got, want in pairs:
        assert samples_equal(got, want)


def test_only_used_where_it_is_exact(tmp_path):
    cache = build(Numeric())
    assert can_gather(cache, None, None)
    assert not can_gather(cache, list, None), "a user's collate_fn gets per-sample data"
    assert not can_gather(cache, None, lambda s: s), "a transform runs per sample"
    assert not can_gather(build(WithText()), None, None), "strings are not column data"
    disk = PickleCache.build(Numeric(), range(23), tmp_path / "p", manifest={"key": "t"}, progress=False)
    assert not can_gather(disk, None, None)
    data, collate = cached_source(disk, None, None)
    assert not isinstance(data, GatherDataset) and collate is None
