"""The partial memory cache (``LoaderConfig.cache_share``): the first samples in memory, the rest from the
source, every sample exactly ``dataset[i]``, batches that mix both exactly default_collate's; the search
space offers it when the whole cache does not fit; the factory fits a recipe to the memory it finds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import autotune
from autotune.caches import GatheringPartial as _GatheringPartial
from autotune.caches import PartialCache, build_partial
from autotune.caches._codec import samples_equal
from autotune.caches._gather import Gathered
from autotune.config import ConfigError, LoaderConfig, partial_count
from autotune.loader import partial_source
from autotune.machine import _hardware as hardware
from autotune.machine._memory_limit import JobMemory
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured
from autotune.recipe._memory_fit import fit_memory
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._candidates import Limits, build_space, partial_shares
from autotune.tuner._space import Space

pytestmark = pytest.mark.timeout(120)
GIB = 1 << 30
MIB = 1 << 20


class Numeric(Dataset):
    """Per-index float columns and a label; the source counts its reads (per process)."""

    def __init__(self, n: int = 37):
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.reads += 1
        rng = np.random.default_rng(i)
        return torch.from_numpy(rng.random((3, 4), dtype=np.float32)), {"label": i, "w": i / 3}


class Ragged(Numeric):
    def __getitem__(self, i: int):
        sample = super().__getitem__(i)
        return (sample[0][:, :2] if i == 3 else sample[0]), sample[1]  # the schema overflows on index 3


# ------------------------------------------------------------------------------------------ the rule


def test_loader_config_rule_5():
    config = LoaderConfig(cache="memory", cache_share=0.4)
    assert LoaderConfig.from_json(config.to_json()) == config
    assert config.to_json()["cache_share"] == 0.4
    assert "cache_share=0.4" in config.describe()
    assert "first 40%" in config.describe_cache() and "first 40%" in config.describe_cache(ranks=2)
    assert LoaderConfig(cache="memory", cache_share=1.0).cache_share is None  # the whole: one spelling
    assert "cache_share" not in LoaderConfig(cache="memory").key()  # keys written before the field stay
    assert LoaderConfig(cache="memory").key() != config.key()
    for bad in (0, 0.0, -0.1, 1.5, True, "half"):
        with pytest.raises(ConfigError, match="cache_share must be a number above 0 and at most 1"):
            LoaderConfig(cache="memory", cache_share=bad)
    with pytest.raises(ConfigError, match="cache_share=0.5 needs cache='memory', but cache='pickle'"):
        LoaderConfig(cache="pickle", cache_share=0.5)
    assert config.refit(cache=None).cache_share is None and config.refit(cache="lmdb").cache_share is None
    assert "cache_share" not in LoaderConfig(cache="memory").to_json()  # readable by a version before it
    assert LoaderConfig.from_json(LoaderConfig(cache="memory").to_json()) == LoaderConfig(cache="memory")
    assert partial_count(0.4, 37) == 14 and partial_count(None, 37) == 37 and partial_count(0.001, 37) == 1
    assert all(partial_count(k / n, n) == k for n in (7, 37, 1000, 1281167) for k in range(1, n, max(1, n // 97)))


# ------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("fill", ["build", "first_epoch"])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_is_exactly_the_dataset(fill, workers):
    dataset = Numeric()
    cache = build_partial(dataset, 14, fill=fill, progress=False, workers=workers)
    assert cache.cached == 14 and len(cache) == 37 and 0 < cache.share < 1
    data, collate = partial_source(cache, None, list)  # per sample, to compare each one exactly
    order = torch.randperm(37, generator=torch.Generator().manual_seed(3)).tolist()
    loader = DataLoader(data, batch_size=5, sampler=order, num_workers=workers, collate_fn=collate,
                        **({"multiprocessing_context": "fork", "persistent_workers": True} if workers else {}))
    for _ in range(2):
        got = [s for batch in loader for s in batch]
        assert len(got) == 37 and all(samples_equal(s, dataset[i]) for i, s in zip(order, got))
    assert samples_equal(cache[-1], dataset[36]) and samples_equal(cache[13], dataset[13])


@pytest.mark.parametrize("fill", ["build", "first_epoch"])
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_mixing_cached_and_uncached_are_default_collate(fill, workers):
    dataset = Numeric()
    cache = build_partial(dataset, 14, fill=fill, progress=False)
    data, collate = partial_source(cache, None, None)
    batches = [[0, 5, 13], [12, 13, 14, 20], [30, 31, 36], [1, 36, 2, 35], list(range(14))]
    loader = DataLoader(data, batch_sampler=batches, num_workers=workers, collate_fn=collate,
                        **({"multiprocessing_context": "fork", "persistent_workers": True} if workers else {}))
    for _ in range(2):
        got = list(loader)
        assert len(got) == len(batches)
        for batch, indices in zip(got, batches):
            assert samples_equal(batch, default_collate([dataset[i] for i in indices])), indices


def test_a_batch_all_in_memory_is_gathered_and_a_mixed_one_is_not():
    dataset = Numeric()
    cache = build_partial(dataset, 14, progress=False)
    reader = _GatheringPartial(cache)
    assert isinstance(reader.__getitems__([0, 13, 4]), Gathered)
    mixed = reader.__getitems__([0, 14, 4])
    assert isinstance(mixed, list) and len(mixed) == 3
    before = dataset.reads
    assert samples_equal(reader.__getitems__([2, 3]).batch, default_collate([Numeric()[2], Numeric()[3]]))
    assert dataset.reads == before, "cached samples are not read from the source"
    cache[20]
    assert dataset.reads == before + 1, "the others are"


def test_a_ragged_head_is_exact_and_never_gathered():
    dataset = Ragged()
    cache = build_partial(dataset, 10, progress=False)
    data, collate = partial_source(cache, None, list)
    got = [s for batch in DataLoader(data, batch_size=4, collate_fn=collate) for s in batch]
    assert all(samples_equal(s, dataset[i]) for i, s in enumerate(got))
    assert not _GatheringPartial(cache).gatherable


def test_a_subset_partial_cache_maps_positions_to_indices():
    dataset = Numeric()
    indices = [2, 5, 9, 20, 33]
    cache = build_partial(dataset, 3, indices=indices, progress=False)
    assert [samples_equal(cache[p], dataset[i]) for p, i in enumerate(indices)] == [True] * 5
    with pytest.raises(ValueError, match="more than its"):
        PartialCache(cache.head, dataset, [1, 2])


# ------------------------------------------------------------------------------------------ the search space


def test_partial_shares_fit_the_budget_with_the_process():
    limits = Limits(usable_cpus=2, memory_budget=600 * MIB, disk_free=GIB, process_memory=300 * MIB)
    assert partial_shares(1200 * MIB, limits) == (0.25, 0.12)  # 300 MiB of room: a quarter, and half of it
    assert partial_shares(1200 * MIB, Limits(2, 600 * MIB, GIB, process_memory=590 * MIB)) == ()  # < 1%
    assert partial_shares(1200 * MIB, Limits(2, 600 * MIB, GIB, process_memory=585 * MIB)) == (0.01,)
    assert partial_shares(1200 * MIB, Limits(2, 600 * MIB, GIB, process_memory=600 * MIB)) == ()
    two = Limits(2, 1200 * MIB, GIB, ranks=2, process_memory=300 * MIB)
    assert partial_shares(1200 * MIB, two) == (0.25, 0.12)  # each rank holds its own


def test_the_space_offers_a_partial_memory_cache_when_the_whole_does_not_fit():
    from autotune.dataset._probe import Probe

    fields = {f: None for f in Probe.__dataclass_fields__}
    probe = Probe(**{**fields, "length": 2000, "sample_bytes": 570_000.0, "deterministic": True,
                     "determinism_note": ""})
    tight = Limits(usable_cpus=1, memory_budget=600 * MIB, disk_free=100 * GIB, process_memory=300 * MIB,
                   caches=("memory",), allocators=("glibc",))
    space = build_space(probe, tight)
    assert space.caches == (None, "memory") and space.cache_shares == (0.26, 0.13)
    assert any("first 26% or 13% of the samples is tried instead" in n for n in tight.notes)
    grid = space.grid()
    assert LoaderConfig(cache="memory", cache_share=0.26) in grid and LoaderConfig(cache="memory") not in grid
    assert space.params_for(LoaderConfig(cache="memory", cache_share=0.13))["cache_share"] == 0.13
    roomy = Limits(usable_cpus=1, memory_budget=8 * GIB, disk_free=100 * GIB, caches=("memory",),
                   allocators=("glibc",))
    whole = build_space(probe, roomy)
    assert whole.cache_shares == () and LoaderConfig(cache="memory") in whole.grid()
    with pytest.raises(ValueError, match="not in this search space"):
        whole.params_for(LoaderConfig(cache="memory", cache_share=0.25))


@pytest.mark.parametrize("shares", [(0.3,), (0.3, 0.15)])
def test_the_searchs_first_points_lie_in_a_space_with_a_partial_cache(shares):
    from autotune.tuner._study import _priors

    space = Space(max_workers=2, caches=(None, "memory", "pickle"), cache_shares=shares,
                  cache_fills=("build", "first_epoch"), allocators=("glibc", "glibc-tuned"))
    priors = _priors(space, space.default())
    assert [p.cache_share for p in priors if p.cache == "memory"] == [0.3, 0.3]  # the most that fits
    for prior in priors:
        assert space.suggest(_replay(space, prior)) == prior


def _replay(space, config):
    from autotune.tuner._space import _Replay

    space.params_for(config)  # raises where the point is outside the space
    return _Replay(config)


def test_a_memory_cache_is_left_out_when_not_even_one_percent_fits():
    from autotune.dataset._probe import Probe

    fields = {f: None for f in Probe.__dataclass_fields__}
    probe = Probe(**{**fields, "length": 2000, "sample_bytes": 570_000.0, "deterministic": True,
                     "determinism_note": ""})
    limits = Limits(usable_cpus=1, memory_budget=600 * MIB, disk_free=100 * GIB, process_memory=595 * MIB,
                    caches=("memory",), allocators=("glibc",))
    space = build_space(probe, limits)
    assert space.caches == (None,) and space.cache_shares == ()
    assert any(n.startswith("cache memory left out: needs ~") and "--max-memory" in n for n in limits.notes)


def test_the_search_names_the_limit_its_budget_comes_from():
    from autotune.tuner._preparation import _note_limit

    limits = Limits(usable_cpus=1, memory_budget=677 * MIB, disk_free=GIB)
    _note_limit(limits, job(967 * MIB))
    assert limits.notes == ["memory budget: 677.0 MiB, 70% of the 967.0 MiB the cgroup memory limit of 1.2 GiB "
                            "(/sys/fs/cgroup/memory/job/memory.limit_in_bytes) leaves this job once the search and "
                            "its trial server hold their imports"]
    _note_limit(limits, job(967 * MIB, limit=None))
    assert len(limits.notes) == 1  # the host's memory: nothing to say


def test_one_share_is_fixed_not_asked():
    space = Space(max_workers=0, caches=(None, "memory"), cache_shares=(0.3,))
    assert "cache_share" not in space.params_for(LoaderConfig(cache="memory", cache_share=0.3))
    assert set(space.grid()) == {LoaderConfig(), LoaderConfig(cache="memory", cache_share=0.3)}


# ------------------------------------------------------------------------------------------ the factory's fit


def job(available: int, limit: int | None = int(1.2 * GIB)) -> JobMemory:
    return JobMemory(host_total=64 * GIB, host_available=60 * GIB, limit=limit,
                     limit_source="/sys/fs/cgroup/memory/job/memory.limit_in_bytes" if limit else None,
                     available=available, available_source="x")


def measured(peak: int | None, plain: int | None) -> Measured:
    return Measured(peak_memory_bytes=peak, default_peak_memory_bytes=plain)


class Big(Dataset):
    def __len__(self) -> int:
        return 2000

    def __getitem__(self, i: int):
        return torch.zeros(600_000, dtype=torch.uint8)


def test_a_recipe_that_fits_is_left_alone():
    config = LoaderConfig(num_workers=2, cache="memory")
    fit = fit_memory(config, measured(1500 * MIB, 300 * MIB), Big(), memory=job(4 * GIB, limit=None))
    assert fit.config == config and fit.line is None


def test_a_whole_memory_cache_over_the_budget_becomes_the_first_samples_that_fit():
    config = LoaderConfig(num_workers=2, cache="memory", cache_fill="first_epoch")
    # tuned outside the limit: a 1.1 GiB cache and 100 MiB of workers over the plain default
    whole = int(600_000 * 2000 * 1.05 + 17 * 2000 + MIB)
    fit = fit_memory(config, measured(300 * MIB + whole + 100 * MIB, 300 * MIB), Big(), memory=job(900 * MIB),
                     batch_size=32)
    budget = int(900 * MIB * 0.7)
    assert fit.budget == budget
    count = partial_count(fit.config.cache_share, 2000)
    need = 600_000 * count * 1.05 + 17 * count + MIB
    assert need + 100 * MIB <= budget < need + 100 * MIB + 600_000 * 1.05 + 17  # the most that fit
    assert fit.config.refit(cache_share=None) == config  # nothing else changed
    assert fit.line.count("\n") == 0
    assert "cgroup memory limit of 1.2 GiB (/sys/fs/cgroup/memory/job/memory.limit_in_bytes)" in fit.line
    assert f"caching the first {count} of 2000 samples in memory" in fit.line


def test_a_partial_recipe_shrinks_further_and_never_grows():
    config = LoaderConfig(cache="memory", cache_share=0.1)
    assert fit_memory(config, measured(None, None), Big(), memory=job(GIB)).config == config  # 200 samples fit
    small = fit_memory(config, measured(None, None), Big(), memory=job(100 * MIB)).config
    assert small.cache == "memory" and 0 < small.cache_share < 0.1


def test_no_memory_cache_when_not_even_a_batch_fits():
    fit = fit_memory(LoaderConfig(cache="memory"), measured(None, None), Big(), memory=job(30 * MIB), batch_size=64)
    assert fit.config == LoaderConfig() and "no memory cache" in fit.line


def test_workers_over_the_budget_are_fewer():
    config = LoaderConfig(num_workers=8, persistent_workers=True)
    fit = fit_memory(config, measured(1100 * MIB, 300 * MIB), Big(), memory=job(600 * MIB))  # 100 MiB a worker
    assert fit.config.num_workers == 4 and fit.config.persistent_workers  # 420 MiB of budget
    assert "4 workers instead of 8" in fit.line
    none = fit_memory(config, measured(1100 * MIB, 300 * MIB), Big(), memory=job(100 * MIB)).config
    assert none.num_workers == 0 and not none.persistent_workers


def test_ranks_on_the_node_share_the_budget():
    config = LoaderConfig(cache="memory")
    alone = fit_memory(config, measured(None, None), Big(), memory=job(GIB))
    four = fit_memory(config, measured(None, None), Big(), memory=job(GIB), ranks=4)
    assert four.budget == alone.budget // 4 and "a share of 4 ranks" in four.line
    assert four.config.cache_share < alone.config.cache_share


def _profile(config: LoaderConfig, peak: int | None = None, plain: int | None = None) -> Profile:
    return Profile(hardware=hardware.collect(), dataset=DatasetRecord(source="<python object>", length=37),
                   settings=RunSettings(batch_size=4, epochs=2), config=config, measured=measured(peak, plain))


def test_the_factory_reads_a_partial_recipe_exactly(tmp_path):
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, _profile(LoaderConfig(cache="memory", cache_share=0.4)))
    dataset = Numeric()
    loader = autotune.load(path).dataloader(dataset, progress=False)
    assert loader.autotune.settings["cache_share"] == 0.4
    assert isinstance(loader.dataset, _GatheringPartial) and loader.dataset.cache.cached == 14
    expected = [default_collate([dataset[i] for i in range(k, min(k + 4, 37))]) for k in range(0, 37, 4)]
    for _ in range(2):
        assert all(samples_equal(a, b) for a, b in zip(list(loader), expected, strict=True))


def test_the_factory_reports_every_setting_the_fit_changed(tmp_path, recwarn):
    # Workers whose memory (a TiB over the plain default, as recorded) cannot fit: none, and the settings
    # the loader reports are the ones it was built with.
    path = tmp_path / "autotune.json"
    config = LoaderConfig(num_workers=2, prefetch_factor=4, persistent_workers=True, multiprocessing_context="fork")
    RecipeFile.merge_write(path, _profile(config, peak=(1 << 40) + GIB, plain=GIB))
    loader = autotune.load(path).dataloader(Numeric(), progress=False)
    assert loader.num_workers == 0
    res = loader.autotune
    assert res.settings["num_workers"] == 0 and res.sources["num_workers"] == "fitted to the memory limit"
    assert res.settings["prefetch_factor"] is None and res.settings["persistent_workers"] is False
    assert sum("0 workers instead of 2" in str(w.message) for w in recwarn) == 1
    chosen = autotune.load(path).dataloader(Numeric(), progress=False, num_workers=2)  # the caller's: kept
    assert chosen.num_workers == 2 and chosen.autotune.sources["num_workers"] == "caller"


def test_the_factory_fits_a_recipe_tuned_with_more_memory(tmp_path, recwarn):
    # The whole dataset's cache (recorded peak: 1 TiB over the plain default) cannot fit any machine this
    # test runs on: the factory caches what fits and says so in one line.
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, _profile(LoaderConfig(cache="memory"), peak=(1 << 40) + GIB, plain=GIB))

    class Many(Dataset):
        def __len__(self):
            return 1 << 22  # 4M samples of 4 MiB: 16 TiB

        def __getitem__(self, i):
            return torch.full((1 << 20,), float(i % 7))

    loader = autotune.load(path).dataloader(Many(), progress=False, batch_size=1)
    assert loader.autotune.sources["cache"] == "fitted to the memory limit"
    lines = [str(w.message) for w in recwarn if "autotune could not apply" in str(w.message)]
    assert len(lines) == 1 and "the recipe adds ~" in lines[0] and "leaves" in lines[0]
    share = loader.autotune.settings["cache_share"]
    assert loader.autotune.settings["cache"] is None or share * (1 << 22) * 4 * MIB < hardware.collect_memory_bytes()


def test_a_head_the_first_epoch_fills_is_decoded_into_by_the_workers_and_gathered_here():
    dataset = Numeric()
    cache = build_partial(dataset, 14, fill="first_epoch", progress=False)
    data, collate = partial_source(cache, None, None)
    batches = [[9, 10, 11, 12], [12, 13, 14, 20], list(range(9))]  # all in the head, mixed, all in the head
    loader = DataLoader(data, batch_sampler=batches, num_workers=2, collate_fn=collate,
                        multiprocessing_context="fork", persistent_workers=True)
    for _ in range(2):
        got = list(loader)
        for batch, indices in zip(got, batches, strict=True):
            assert samples_equal(batch, default_collate([dataset[i] for i in indices])), indices
        in_head = [got[0], got[2]]
        assert not any(images.is_shared() for images, _ in in_head), "gathered here, not sent as a batch"
        assert got[1][0].is_shared(), "a mixed batch still comes from a worker's collate"
    assert cache.head.filled.all(), "the workers decoded the head's samples into it"
