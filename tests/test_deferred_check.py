"""The determinism check made by a first-epoch memory fill (caches/_fill.py ``defer_check``): no worker
is forked for it, and whatever a random dataset does, nothing is served from the cache that is not a
fresh ``dataset[i]`` before the comparison passes, and after it fails nothing is served from it at all."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

import autotune
from autotune.caches import FirstEpochCache, GatheringFill
from autotune.caches._codec import samples_equal
from autotune.config import LoaderConfig
from autotune.dataset import _determinism
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings

pytestmark = pytest.mark.timeout(120)
N = 37


class Plain(Dataset):
    """Per-index values, each read logged with its pid (any process), so a test sees who read what."""

    def __init__(self, log, offset: int = 0):
        self.log, self.offset = log, offset

    def __len__(self) -> int:
        return N

    def value(self, i: int) -> torch.Tensor:
        return torch.arange(4, dtype=torch.float32) + i + self.offset

    def __getitem__(self, i: int):
        with open(self.log, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
        return self.value(i), i

    def reads(self) -> list[tuple[int, int]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [tuple(map(int, line.split())) for line in lines]


class WorkerKeyed(Plain):
    """No draw: keyed on which worker reads it (get_worker_info)."""

    def __getitem__(self, i: int):
        value, i = super().__getitem__(i)
        info = get_worker_info()
        return value + (0 if info is None else 100 * (info.id + 1)), i


class WorkerSeeded(Plain):
    """No draw: keyed on the worker's seed."""

    def __getitem__(self, i: int):
        value, i = super().__getitem__(i)
        return value + float(torch.initial_seed() % 100_000), i


class Counting(Plain):
    """No draw: state kept between reads."""

    def __init__(self, log):
        super().__init__(log)
        self.count = 0

    def __getitem__(self, i: int):
        value, i = super().__getitem__(i)
        self.count += 1
        return value + self.count, i


class TorchRandom(Plain):
    def __getitem__(self, i: int):
        value, i = super().__getitem__(i)
        return value + torch.rand(1), i


class NumpyRandom(Plain):
    def __getitem__(self, i: int):
        value, i = super().__getitem__(i)
        return value + float(np.random.rand()), i


class PythonRandom(Plain):
    def __getitem__(self, i: int):
        value, i = super().__getitem__(i)
        return value + random.random(), i


class EpochSeeded(Plain):
    """Augmentation seeded by the epoch, drawing from a generator of its own made per read (no held one)."""

    def __init__(self, log):
        super().__init__(log)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, i: int):
        value, i = super().__getitem__(i)
        return value + float(np.random.default_rng([self.epoch, i]).random()), i


def _recipe(tmp_path, *, workers: int = 2, context: str | None = "fork") -> str:
    extra = {"prefetch_factor": 2, "persistent_workers": True, "multiprocessing_context": context} if workers else {}
    config = LoaderConfig(num_workers=workers, cache="memory", cache_fill="first_epoch", **extra)
    profile = Profile(hardware=hardware.collect(), dataset=DatasetRecord(source="<python object>", length=N),
                      settings=RunSettings(batch_size=4, epochs=3), config=config, measured=Measured())
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile)
    return str(path)


@pytest.fixture
def forks(monkeypatch):
    """The times the check forked a worker of its own."""
    calls: list[int] = []
    real = _determinism._in_a_worker

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_determinism, "_in_a_worker", counted)
    return calls


def _epochs(loader, n: int = 3) -> list[list]:
    return [list(loader) for _ in range(n)]


def _expected(dataset) -> list:
    return [default_collate([(dataset.value(i), i) for i in range(k, min(k + 4, N))]) for k in range(0, N, 4)]


@pytest.mark.parametrize("offset", [0, 1000], ids=["train", "val"])
def test_a_deterministic_fill_checks_itself_in_its_workers_and_stays_exact(tmp_path, forks, offset):
    dataset = Plain(tmp_path / "reads.log", offset)
    loader = autotune.load(_recipe(tmp_path)).dataloader(dataset, progress=False)
    before = len(dataset.reads())
    assert before == 1 + 8, "only the memory fit's sample and the schema's head are read before the first epoch"
    for got in _epochs(loader):
        assert all(samples_equal(a, b) for a, b in zip(got, _expected(dataset), strict=True))
    assert forks == []
    cache = loader.dataset.cache
    assert cache.whole and cache.deferred and cache.check_seconds > 0
    ours = [i for i, pid in dataset.reads()[before:] if pid == os.getpid()]
    assert len(ours) == 3 and len([i for i in ours if i < 8]) == 1, "the check's second reads: two a worker "\
        "stored, one this process stored (the head)"
    assert len(dataset.reads()) == 1 + N + 3, "later epochs are gathered from the cache"


@pytest.mark.parametrize("kind", [WorkerKeyed, WorkerSeeded, Counting])
def test_a_sample_that_differs_in_the_workers_is_dropped_before_the_second_epoch(tmp_path, forks, kind, caplog):
    dataset = kind(tmp_path / "reads.log")
    loader = autotune.load(_recipe(tmp_path)).dataloader(dataset, progress=False)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        list(loader)
    cache = loader.dataset.cache
    assert cache.random[0] and not cache.whole and forks == []
    said = [r.getMessage() for r in caplog.records if "differs between a DataLoader worker's read" in r.getMessage()]
    assert len(said) == 1 and "keeps no cache" in said[0]
    start = len(dataset.reads())
    for got in _epochs(loader, 2):
        assert sum(len(labels) for _, labels in got) == N
    assert len(dataset.reads()) - start == 2 * N, "every later sample is a fresh read of the source"


@pytest.mark.parametrize("kind", [TorchRandom, NumpyRandom, PythonRandom])
def test_a_dataset_that_draws_is_refused_before_any_worker_as_the_check_refuses_it(tmp_path, forks, kind):
    dataset = kind(tmp_path / "reads.log")
    with pytest.warns(UserWarning, match=r"cache is not used: dataset\[0\] drew from"):
        loader = autotune.load(_recipe(tmp_path)).dataloader(dataset, progress=False)
    assert loader.autotune.settings["cache"] is None
    start = len(dataset.reads())
    _epochs(loader, 2)
    assert len(dataset.reads()) - start == 2 * N


def test_augmentation_seeded_by_set_epoch_is_still_checked_up_front(tmp_path, forks):
    dataset = EpochSeeded(tmp_path / "reads.log")
    with pytest.warns(UserWarning, match="changes with set_epoch"):
        loader = autotune.load(_recipe(tmp_path)).dataloader(dataset, progress=False)
    assert forks == [1] and loader.autotune.settings["cache"] is None
    assert dataset.epoch == 0, "the check moved only its worker's copy"


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "spawn")])
def test_no_forked_workers_to_store_samples_the_check_stays_up_front(tmp_path, forks, workers, context):
    dataset = WorkerKeyed(tmp_path / "reads.log")
    with pytest.warns(UserWarning, match="cache is not used"):
        loader = autotune.load(_recipe(tmp_path, workers=workers, context=context)).dataloader(dataset,
                                                                                                progress=False)
    assert loader.autotune.settings["cache"] is None
    assert forks == [1], "the up-front check, with its worker"


def test_no_position_is_served_twice_before_the_comparison_in_the_training_process(tmp_path):
    """Read without workers (a loader moved to 0 workers): first serves from the columns, then, before any
    second one, the whole check, which drops the cache: the second serve is a fresh read."""
    dataset = Counting(tmp_path / "reads.log")
    cache = FirstEpochCache(dataset)
    ran: list[int] = []

    def fallback():
        ran.append(1)
        return False, "dataset[0] returned different samples on two reads, so no cache can store it"

    cache.defer_check(fallback)
    assert not cache.whole
    data = GatheringFill(cache)
    start = len(dataset.reads())
    first = data.__getitems__([0, 1, 2, 3])  # the head's positions, each read once by this process
    assert ran == [] and len(dataset.reads()) == start, "a first serve: the one read the column holds"
    again = data.__getitems__([0, 1, 2, 3])
    assert ran == [1] and cache.random[0] and not cache.whole
    assert len(dataset.reads()) - start == 4, "read from the source, not the columns"
    assert again.batch[1].tolist() == [0, 1, 2, 3]
    assert not torch.equal(first.batch[0], again.batch[0])


def test_a_worker_never_serves_a_column_while_the_comparison_is_pending(tmp_path):
    dataset = Plain(tmp_path / "reads.log")
    cache = FirstEpochCache(dataset)
    cache.defer_check(lambda: (True, ""))
    loader = DataLoader(cache, batch_size=None, sampler=list(range(8)), num_workers=1, multiprocessing_context="fork")
    start = len(dataset.reads())
    got = list(loader)  # sample by sample in a worker: the head is stored, but not served from it
    assert [label for _, label in got] == list(range(8))
    assert len(dataset.reads()) - start == 8 and cache.unchecked[0]


def test_after_a_drop_a_position_already_served_is_read_again_never_gathered(tmp_path):
    """A sampler with replacement: the same position twice, before and after the comparison failed."""
    dataset = Counting(tmp_path / "reads.log")
    cache = FirstEpochCache(dataset)
    idx = np.array([0, 1, 1], dtype=np.int64)
    first = cache.serve(idx[:2])
    cache.random[0] = 1  # dropped, as a failed comparison does
    start = len(dataset.reads())
    again = cache.serve(idx)
    assert len(dataset.reads()) - start == 3, "positions 0 and 1 were served, and 1 twice in the batch"
    assert not torch.equal(first[0][0], again[0][0])
