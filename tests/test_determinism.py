"""The determinism check accepts a pure dataset and names the index and the fix for a random one."""

from __future__ import annotations

import numpy as np
import torch
from test_codec import ZooDataset

from autotune.dataset._determinism import check_deterministic


class RandomCrop(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.full((2,), float(i)) + torch.rand(2)


class RandomOnlySometimes(torch.utils.data.Dataset):
    """Random only at the last index: the check must probe the end too."""

    def __len__(self):
        return 50

    def __getitem__(self, i):
        return np.random.rand() if i == 49 else float(i)


def test_deterministic_dataset_passes():
    assert check_deterministic(ZooDataset(5)) == (True, "")


def test_random_getitem_fails_with_index_and_fix():
    ok, reason = check_deterministic(RandomCrop())
    assert not ok
    assert "dataset[0]" in reason and "`transform`" in reason and "\n" not in reason


def test_probes_last_index():
    ok, reason = check_deterministic(RandomOnlySometimes(), probe=2)
    assert not ok and "dataset[49]" in reason
