"""Datasets with per-epoch state: persistent_workers=True is never chosen for them silently."""

from __future__ import annotations

import numpy as np
from torch.utils.data import Subset

from autotune.dataset._statefulness import epoch_state_warning


class Pure:
    def __init__(self, n=10):
        self.n = n
        self.table = [i * i for i in range(n)]
        self.weights = np.arange(n, dtype=np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.table[i] + float(self.weights[i])


class WithSetEpoch(Pure):
    def set_epoch(self, epoch):
        self.epoch = epoch


class Counts(Pure):
    def __init__(self, n=10):
        super().__init__(n)
        self.calls = 0

    def __getitem__(self, i):
        self.calls += 1
        return super().__getitem__(i)


class GrowsAList(Pure):
    def __init__(self, n=10):
        super().__init__(n)
        self.seen = []

    def __getitem__(self, i):
        self.seen.append(i)
        return super().__getitem__(i)


class ChangesAnArray(Pure):
    def __getitem__(self, i):
        self.weights[i] += 1  # in place: same object, new contents
        return super().__getitem__(i)


class LazyHandle(Pure):
    """Opens its 'file' on first use, as HDF5 datasets do: not per-epoch state."""

    def __init__(self, n=10):
        super().__init__(n)
        self.handle = None
        self.memo = {}

    def __getitem__(self, i):
        if self.handle is None:
            self.handle = object()
        self.memo.setdefault(i, super().__getitem__(i))
        return self.memo[i]


class WithRng(Pure):
    def __init__(self, n=10):
        super().__init__(n)
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i):
        return super().__getitem__(i) + self.rng.random()


class EpochSampler:
    def set_epoch(self, epoch):
        self.epoch = epoch


class Slotted:
    __slots__ = ("n", "calls")

    def __init__(self):
        self.n, self.calls = 4, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        return i


def test_pure_dataset_has_no_warning():
    assert epoch_state_warning(Pure()) is None


def test_set_epoch_warns():
    text = epoch_state_warning(WithSetEpoch())
    assert "WithSetEpoch.set_epoch()" in text
    assert "persistent_workers=True" in text and "will not choose" in text
    assert "never sees what the main process changes between epochs" in text


def test_sampler_with_set_epoch_warns():
    assert "its sampler EpochSampler.set_epoch()" in epoch_state_warning(Pure(), sampler=EpochSampler())
    ds = Pure()
    ds.sampler = EpochSampler()
    assert "Pure.sampler.set_epoch()" in epoch_state_warning(ds)


def test_attribute_mutated_in_getitem_warns():
    assert "changes its attribute(s) calls" in epoch_state_warning(Counts())
    assert "changes its attribute(s) seen" in epoch_state_warning(GrowsAList())
    assert "changes its attribute(s) weights" in epoch_state_warning(ChangesAnArray())
    assert "changes its attribute(s) calls" in epoch_state_warning(Slotted())


def test_wrapped_dataset_is_looked_into():
    text = epoch_state_warning(Subset(Counts(), [1, 2, 3]))
    assert "dataset.calls" in text
    assert epoch_state_warning(Subset(Pure(), [1, 2, 3])) is None


def test_lazy_setup_and_generators_are_not_epoch_state():
    assert epoch_state_warning(LazyHandle()) is None
    assert epoch_state_warning(WithRng()) is None


class Broken(Pure):
    def __getitem__(self, i):
        raise OSError("unreadable")


def test_a_failing_getitem_is_left_to_the_probe():
    assert epoch_state_warning(Broken()) is None
