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


def test_a_dataset_that_raises_in_workers_leaves_no_signal_behind():
    """The check's worker is killed once its read failed; on c9e4379 the DataLoader's SIGCHLD handler then
    raised "DataLoader worker (pid N) is killed by signal: Killed" in the main thread, later, wherever it
    was (a search ended with that traceback)."""
    import time

    from workloads import RaisesInWorkers

    from autotune.dataset._determinism import check_deterministic

    assert check_deterministic(RaisesInWorkers(8)) == (True, "")
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # the SIGCHLD arrives within milliseconds; its handler runs here
        time.sleep(0.05)
