"""The memory cache filled while the first epoch trains: exactly dataset[i] every epoch, in and out of
workers, a partial first epoch never leaves a cache that claims to be whole, a transform after it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import autotune
from autotune.caches import FirstEpochCache
from autotune.caches._codec import samples_equal
from autotune.config import ConfigError, LoaderConfig
from autotune.loader import filling_source
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._space import Space

pytestmark = pytest.mark.timeout(120)


class Numeric(Dataset):
    """A column sample, a ragged one the schema overflows on (index 13), and per-index values."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        shape = (3, 5) if i == 13 else (3, 4)
        return torch.from_numpy(rng.random(shape, dtype=np.float32)), {"label": i, "w": i / 3}


class WithText(Numeric):
    def __getitem__(self, i: int):
        return super().__getitem__(i)[0], f"sample {i}"


def _epoch(loader) -> list:
    return [sample for batch in loader for sample in batch]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [Numeric, WithText])
def test_every_epoch_is_exactly_the_dataset(workers, kind):
    dataset = kind()
    cache = FirstEpochCache(dataset)
    data, collate = filling_source(cache, None, list)  # per sample, to compare each one exactly
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1)).tolist()
    loader = DataLoader(data, batch_size=5, sampler=order, num_workers=workers, collate_fn=collate,
                        **({"multiprocessing_context": "fork", "persistent_workers": True} if workers else {}))
    for _ in range(2):
        got = _epoch(loader)
        assert len(got) == len(dataset)
        assert all(samples_equal(sample, dataset[i]) for i, sample in zip(order, got))
    if kind is Numeric:
        assert cache.filled_count == len(dataset) - 1 and not cache.whole, "the overflowing sample is not kept"
    else:
        assert cache.filled_count == 0, "string leaves are read from the source every epoch"


@pytest.mark.parametrize("workers", [0, 2])
def test_whole_batches_after_the_first_epoch_equal_default_collate(workers):
    class Even(Numeric):
        def __getitem__(self, i):
            return super().__getitem__(0 if i == 13 else i)

    dataset = Even()
    cache = FirstEpochCache(dataset)
    data, collate = filling_source(cache, None, None)
    loader = DataLoader(data, batch_size=4, num_workers=workers, collate_fn=collate,
                        **({"multiprocessing_context": "fork"} if workers else {}))
    expected = [default_collate([dataset[i] for i in range(k, min(k + 4, 37))]) for k in range(0, 37, 4)]
    for _ in range(2):
        got = list(loader)
        assert len(got) == len(expected) and all(samples_equal(a, b) for a, b in zip(got, expected))
    assert cache.whole and cache.filled_count == 37


@pytest.mark.parametrize("workers", [0, 2])
def test_an_interrupted_first_epoch_leaves_no_whole_cache(workers):
    dataset = Numeric()
    cache = FirstEpochCache(dataset)
    data, collate = filling_source(cache, None, list)
    loader = DataLoader(data, batch_size=3, num_workers=workers, collate_fn=collate,
                        **({"multiprocessing_context": "fork", "prefetch_factor": 1} if workers else {}))
    for k, _ in enumerate(loader):
        if k == 1:
            break  # training stopped in its first epoch
    assert not cache.whole and 8 <= cache.filled_count < 36  # 8: the schema's head, read before the workers
    got = _epoch(loader)
    assert all(samples_equal(sample, dataset[i]) for i, sample in enumerate(got))
    assert cache.filled_count == 36  # all but the overflowing one, filled by the later epoch


def test_a_random_transform_runs_after_the_cache_every_epoch():
    dataset = Numeric()
    cache = FirstEpochCache(dataset)
    draws = iter(range(1000))

    def mark(sample):
        return sample, next(draws)  # a new draw for each sample, every epoch

    data, collate = filling_source(cache, mark, list)
    loader = DataLoader(data, batch_size=37, collate_fn=collate)
    first, second = _epoch(loader), _epoch(loader)
    assert [d for _, d in first] == list(range(37)) and [d for _, d in second] == list(range(37, 74))
    assert all(samples_equal(s, dataset[i]) for i, (s, _) in enumerate(first + second[:0]))
    assert all(samples_equal(s, dataset[i]) for i, (s, _) in enumerate(second))
    assert cache.filled_count == 36, "the cache holds the samples, not the transformed ones"


def test_loader_config_rule_4():
    assert LoaderConfig().cache_fill == "build"
    config = LoaderConfig(cache="memory", cache_fill="first_epoch")
    assert LoaderConfig.from_json(config.to_json()) == config
    assert "cache_fill=first_epoch" in config.describe() and "cache_fill" not in LoaderConfig(cache="memory").describe()
    with pytest.raises(ConfigError, match="cache_fill='first_epoch' needs a cache"):
        LoaderConfig(cache_fill="first_epoch")
    with pytest.raises(ConfigError, match="cache_fill must be one of build, first_epoch"):
        LoaderConfig(cache="memory", cache_fill="later")
    assert config.refit(cache=None).cache_fill == "build"  # fitted: dropped with the cache
    old = LoaderConfig(cache="memory").to_json()
    del old["cache_fill"]  # a recipe written before the field
    assert LoaderConfig.from_json(old).cache_fill == "build"
    assert "cache_fill" not in LoaderConfig(cache="memory").key()
    assert LoaderConfig(cache="memory").key() != config.key()


def test_the_search_space_draws_the_fill_only_with_a_memory_cache():
    space = Space(max_workers=0, caches=(None, "memory", "pickle"), cache_fills=("build", "first_epoch"))
    grid = space.grid()
    assert LoaderConfig(cache="memory", cache_fill="first_epoch") in grid
    assert [c for c in grid if c.cache_fill == "first_epoch"] == [LoaderConfig(cache="memory", cache_fill="first_epoch")]
    assert len(grid) == 4
    assert space.params_for(LoaderConfig(cache="memory", cache_fill="first_epoch"))["cache_fill"] == "first_epoch"


def test_the_factory_fills_while_the_first_epoch_trains(tmp_path):
    profile = Profile(hardware=hardware.collect(), dataset=DatasetRecord(source="<python object>", length=37),
                      settings=RunSettings(batch_size=4, epochs=2),
                      config=LoaderConfig(cache="memory", cache_fill="first_epoch"), measured=Measured())
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile)
    dataset = Numeric()
    loader = autotune.load(path).dataloader(dataset, collate_fn=list, progress=False)
    assert loader.autotune.settings["cache_fill"] == "first_epoch"
    for _ in range(2):
        assert all(samples_equal(s, dataset[i]) for i, s in enumerate(_epoch(loader)))
    plain = autotune.load(path).dataloader(dataset, cache="pickle", cache_dir=tmp_path / "c", progress=False)
    assert plain.autotune.settings["cache_fill"] == "build"


class Regular(Numeric):
    """Numeric without its ragged sample: every sample fits the columns, so a built cache gathers too."""

    def __getitem__(self, i: int):
        return super().__getitem__(0 if i == 13 else i)


@pytest.mark.parametrize("fill", ["build", "first_epoch"])
def test_a_loader_without_batches_hands_each_sample_as_a_plain_one_does(tmp_path, fill):
    """batch_size=None: each sample goes to the collate function alone, which a plain loader converts
    (default_convert); the gather path's collate took the sample for a batch (a TypeError here)."""
    config = LoaderConfig(cache="memory", cache_fill=fill)
    profile = Profile(hardware=hardware.collect(), dataset=DatasetRecord(source="<python object>", length=37),
                      settings=RunSettings(batch_size=4, epochs=2), config=config, measured=Measured())
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile)
    dataset = Regular()
    loader = autotune.load(path).dataloader(dataset, batch_size=None, progress=False)
    plain = list(DataLoader(dataset, batch_size=None))
    for _ in range(2):
        got = list(loader)
        assert len(got) == len(plain) and all(samples_equal(a, b) for a, b in zip(got, plain))


def test_the_fill_writes_memory_files_and_closes_their_descriptors():
    import gc

    def memory_files() -> int:  # this process's descriptors of the cache's memory files
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if _link(f"/proc/self/fd/{fd}").startswith("/memfd:autotune-memory-cache"))

    gc.collect()
    before = memory_files()
    dataset = Numeric()
    cache = FirstEpochCache(dataset)
    assert cache.files is not None and len(cache.files) == len(cache.schema.columns)
    assert memory_files() >= before + len(cache.files)
    loader = DataLoader(cache, batch_size=None, num_workers=2, multiprocessing_context="fork", collate_fn=_same)
    assert all(samples_equal(sample, dataset[i]) for i, sample in enumerate(loader))
    assert cache.filled_count == len(dataset) - 1  # written by the workers through the files
    assert all(samples_equal(cache[i], dataset[i]) for i in range(len(dataset)))
    del cache, loader
    gc.collect()
    assert memory_files() == before


class Rows(Dataset):
    """Rows of 1 MiB, each all its own index (a row written at another's position shows at once), returned
    permuted as a decoded HWC image returned CHW is: a strided view, which the write stages into a row."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        return np.full((1024, 256), i, dtype=np.float32).T


def test_threads_filling_one_cache_keep_every_sample_at_its_own_position():
    """The memory files are written through one staged row per writer: two threads of one process filling the
    same cache (a thread-pool loader, a second loader in another thread) must not stage over each other."""
    import threading

    dataset = Rows()
    for _ in range(3):
        cache = FirstEpochCache(dataset)
        assert cache.files is not None
        threads = [threading.Thread(target=lambda c=cache, s=s: [c[k] for k in range(s, len(dataset), 4)])
                   for s in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert cache.whole
        wrong = [k for k in range(len(dataset)) if not np.array_equal(cache[k], dataset[k])]
        assert not wrong, f"positions {wrong} hold another sample than dataset[i]"


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # the listing's own descriptor, closed by now
        return ""


def _same(sample):
    return sample


class Logged(Numeric):
    """Numeric without the ragged sample, logging each read's index and pid to a file (any process)."""

    def __init__(self, log):
        self.log = log

    def __getitem__(self, i: int):
        with open(self.log, "a") as f:
            f.write(f"{i} {os.getpid()}\n")
        return super().__getitem__(0 if i == 13 else i)

    def reads(self) -> list[tuple[int, int]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [tuple(map(int, line.split())) for line in lines]


def _gathering_loader(cache, workers, **extra):
    data, collate = filling_source(cache, None, None)
    order = torch.randperm(len(cache), generator=torch.Generator().manual_seed(2)).tolist()
    kwargs = {"multiprocessing_context": "fork", "persistent_workers": True, **extra} if workers else {}
    return DataLoader(data, batch_size=4, sampler=order, num_workers=workers, collate_fn=collate, **kwargs), order


@pytest.mark.parametrize("workers", [0, 2])
def test_workers_decode_into_the_cache_and_the_training_process_gathers_each_batch(tmp_path, workers):
    dataset = Logged(tmp_path / "reads.log")
    cache = FirstEpochCache(dataset)
    head = len(dataset.reads())  # the schema's head, read here before any worker
    loader, order = _gathering_loader(cache, workers)
    expected = [default_collate([dataset[i] for i in order[k:k + 4]]) for k in range(0, 37, 4)]
    (tmp_path / "reads.log").unlink()
    for epoch in range(2):
        got = list(loader)
        assert len(got) == len(expected) and all(samples_equal(a, b) for a, b in zip(got, expected)), epoch
        # gathered in this process from the cache, not sent through a worker's shared-memory batch
        assert not any(images.is_shared() or labels["label"].is_shared() for images, labels in got)
        if epoch == 0:
            reads = dataset.reads()
            assert sorted(i for i, _ in reads) == list(range(head, 37)), "each sample decoded once, the head never"
            pids = {pid for _, pid in reads}
            assert pids == {os.getpid()} if not workers else os.getpid() not in pids, "decoded in the workers"
            assert cache.whole
    assert len(dataset.reads()) == 37 - head, "the second epoch read nothing from the source"


def test_a_batch_the_cache_cannot_hold_whole_goes_as_its_samples_read_once(tmp_path):
    class Ragged(Logged):
        def __getitem__(self, i: int):
            with open(self.log, "a") as f:
                f.write(f"{i} {os.getpid()}\n")
            return Numeric.__getitem__(self, i)  # index 13 overflows the schema: never kept

    dataset = Ragged(tmp_path / "reads.log")
    cache = FirstEpochCache(dataset)
    data, _ = filling_source(cache, None, None)
    (tmp_path / "reads.log").unlink()
    batch = data.__getitems__([12, 13, 14])
    assert isinstance(batch, list) and all(samples_equal(s, dataset[i]) for s, i in zip(batch, [12, 13, 14]))
    assert [i for i, _ in dataset.reads()][:3] == [12, 13, 14], "each read once, none again for the fallback"
    assert cache.filled[12] and cache.filled[14] and not cache.filled[13]


def test_an_interrupted_fill_in_workers_never_becomes_a_cache(tmp_path):
    dataset = Logged(tmp_path / "reads.log")
    cache = FirstEpochCache(dataset)
    loader, order = _gathering_loader(cache, 2, prefetch_factor=1)
    for k, _ in enumerate(loader):
        if k == 1:
            break  # training stopped in its first epoch
    assert not cache.whole and cache.filled_count < 37
    expected = [default_collate([dataset[i] for i in order[k:k + 4]]) for k in range(0, 37, 4)]
    assert all(samples_equal(a, b) for a, b in zip(list(loader), expected, strict=True))
    assert cache.whole  # completed by the later epoch that read the missing samples


class Drawing(Numeric):
    """Samples past the schema's head draw from torch's generator: found by the workers, never a cache."""

    def __getitem__(self, i: int):
        return (torch.rand(3, 4) if i >= 20 else torch.zeros(3, 4)), {"label": i, "w": i / 3}


def test_a_fill_in_workers_that_draws_keeps_nothing():
    cache = FirstEpochCache(Drawing())
    assert not cache.random[0], "the head drew nothing"
    data, collate = filling_source(cache, None, None)
    loader = DataLoader(data, batch_size=4, num_workers=2, collate_fn=collate, multiprocessing_context="fork",
                        persistent_workers=True)
    first = torch.cat([images for images, _ in loader])
    second = torch.cat([images for images, _ in loader])
    assert cache.random[0] == 1 and not cache.whole
    assert not bool((first[20:] == second[20:]).any()), "the second epoch drew again: nothing came from a cache"
    assert bool((second[:20] == 0).all())


def test_a_forked_process_that_is_not_the_caches_owner_gathers_in_place():
    import multiprocessing

    dataset = Numeric()
    cache = FirstEpochCache(dataset)
    data, collate = filling_source(cache, None, None)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()

    def run():
        loader = DataLoader(data, batch_size=4, sampler=[0, 1, 2, 3], collate_fn=collate)
        child.send([batch[0].tolist() for batch in loader])

    process = ctx.Process(target=run)
    process.start()
    got = parent.recv()
    process.join()
    assert got == [default_collate([dataset[i] for i in range(4)])[0].tolist()]


def test_the_factory_s_fill_in_workers_gathers_every_batch_in_the_training_process(tmp_path):
    config = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork",
                          cache="memory", cache_fill="first_epoch")
    profile = Profile(hardware=hardware.collect(), dataset=DatasetRecord(source="<python object>", length=37),
                      settings=RunSettings(batch_size=4, epochs=2), config=config, measured=Measured())
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile)
    dataset = Logged(tmp_path / "reads.log")
    loader = autotune.load(path).dataloader(dataset, progress=False)
    expected = [default_collate([dataset[i] for i in range(k, min(k + 4, 37))]) for k in range(0, 37, 4)]
    (tmp_path / "reads.log").unlink()
    for _ in range(2):
        got = list(loader)
        assert all(samples_equal(a, b) for a, b in zip(got, expected, strict=True))
        assert not any(images.is_shared() for images, _ in got)
    assert os.getpid() not in {pid for _, pid in dataset.reads()}
    assert sorted(i for i, _ in dataset.reads()) == list(range(8, 37)), "each sample past the head decoded once"


def test_a_batch_that_draws_hands_its_samples_and_writes_none_of_them():
    """A fill batch that drew: its samples are handed as read, and none of them, also those that drew
    nothing themselves, is in the cache's columns or trusted."""
    dataset = Drawing()
    cache = FirstEpochCache(dataset)
    data, _ = filling_source(cache, None, None)
    positions = [16, 17, 18, 19, 20, 21]
    torch.manual_seed(5)
    batch = data.__getitems__(positions)
    torch.manual_seed(5)
    expected = [dataset[k] for k in positions]
    assert isinstance(batch, list) and all(samples_equal(a, b) for a, b in zip(batch, expected, strict=True))
    assert cache.random[0] and not cache.filled[positions].any()
    assert not any(column[positions].any() for column in cache.columns), "a drawing batch's bytes in the cache"


def test_a_drawing_batch_that_repeats_an_index_hands_each_occurrence_its_own_read():
    """A sampler with replacement (``WeightedRandomSampler``, a padding ``DistributedSampler``) repeats an index
    within a batch: each occurrence is a read of its own, the draws a plain loader's batch holds under the same
    seed. The reads were kept by index, so both occurrences were handed the second draw."""
    dataset = Drawing()
    data, _ = filling_source(FirstEpochCache(dataset), None, None)
    positions = [20, 20, 3, 21, 21, 3]
    torch.manual_seed(5)
    batch = data.__getitems__(positions)
    torch.manual_seed(5)
    expected = [dataset[k] for k in positions]
    assert isinstance(batch, list) and all(samples_equal(a, b) for a, b in zip(batch, expected, strict=True))
    assert not samples_equal(batch[0], batch[1]) and samples_equal(batch[2], batch[5])


class Failing(Numeric):
    def __getitem__(self, i: int):
        if i == 23:
            raise OSError("unreadable file 23")
        return super().__getitem__(i)


def test_a_fill_batch_whose_read_fails_leaves_the_columns_as_it_found_them():
    """A read that raises mid-batch: nothing of the batch is trusted or in the columns, and a later batch
    without the failing sample fills exactly."""
    cache = FirstEpochCache(Failing())
    data, _ = filling_source(cache, None, None)
    before = [column.copy() for column in cache.columns]
    with pytest.raises(OSError, match="unreadable file 23"):
        data.__getitems__([20, 21, 22, 23, 24])
    assert not cache.filled[[20, 21, 22, 23, 24]].any() and not cache.whole
    assert all(np.array_equal(a, b) for a, b in zip(before, cache.columns, strict=True))
    data.__getitems__([20, 21, 22])
    assert cache.filled[[20, 21, 22]].all() and all(samples_equal(cache[k], Numeric()[k]) for k in (20, 21, 22))
