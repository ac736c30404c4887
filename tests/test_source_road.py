"""One road to a cache: the factory and a trial prepare a loader's source with the same function
(``autotune.loader.prepare_source``); a trial differs only in where its cache lives and which samples
it holds, so the search cannot measure a path the user's loader does not take."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from torch.utils.data import Dataset

from autotune.config import LoaderConfig
from autotune.loader import FactorySite, prepare_source
from autotune.recipe._factory import build_loader
from autotune.recipe._file import Profile
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._measure import Plan, TrialSite, Workload, measure

KINDS = [
    LoaderConfig(cache="memory"),
    LoaderConfig(cache="pickle"),
    LoaderConfig(cache="lmdb"),
    LoaderConfig(cache="memory", cache_fill="first_epoch"),
    LoaderConfig(cache="pickle", cache_fill="first_epoch"),
    LoaderConfig(cache="memory", cache_share=0.5),
    LoaderConfig(cache="memory", cache_share=0.5, cache_fill="first_epoch"),
]


class Rows(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i


class RandomRows(Rows):
    """dataset[i] differs on every read: no cache may hold it."""

    def __getitem__(self, i):
        return torch.full((4,), random.random()), i


def _double(sample):
    return sample[0] * 2, sample[1]


def _steps(site, dataset, config, transform=None, collate_fn=None):
    steps: list[str] = []
    prepared = prepare_source(dataset, config, site, transform=transform, collate_fn=collate_fn,
                              timer=lambda step, seconds: steps.append(step))
    return steps, prepared


def _sites(tmp_path, dataset):
    trial_root = tmp_path / "trial"
    trial_root.mkdir(mode=0o700)
    plan = Plan(indices=list(range(len(dataset))), length=len(dataset), cache_root=str(trial_root))
    return FactorySite(tmp_path / "caches", progress=False, workers=0), TrialSite(Workload(dataset, 8, 2), plan)


@pytest.mark.parametrize("config", KINDS, ids=lambda c: c.describe())
@pytest.mark.parametrize("transform", [None, _double], ids=["plain", "transform"])
def test_the_trial_and_the_factory_take_the_same_steps_to_the_same_kind_of_source(tmp_path, config, transform):
    dataset = Rows()
    factory, trial = _sites(tmp_path, dataset)
    factory_steps, made = _steps(factory, dataset, config, transform)
    trial_steps, measured = _steps(trial, dataset, config, transform)
    assert trial_steps == factory_steps
    assert factory_steps == (["check", "cache"] if config.cache == "memory" else ["check", "key", "cache"])
    assert type(measured.cache) is type(made.cache)
    assert type(measured.dataset) is type(made.dataset)
    assert measured.collate_fn is made.collate_fn
    for i in (0, 47, 95):  # both read exactly dataset[i], the transform after the cache
        expected = dataset[i] if transform is None else transform(dataset[i])
        for got in (made.dataset[i], measured.dataset[i]):
            assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


def test_without_a_cache_the_trial_reads_its_subset_and_the_factory_the_dataset(tmp_path):
    dataset = Rows()
    factory, trial = _sites(tmp_path, dataset)
    trial.indices = [5, 7, 9]
    steps, made = _steps(factory, dataset, LoaderConfig())
    trial_steps, measured = _steps(trial, dataset, LoaderConfig())
    assert steps == trial_steps == []
    assert made.dataset is dataset and made.cache is None and measured.cache is None
    assert [measured.dataset[k][1] for k in range(len(measured.dataset))] == [5, 7, 9]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", [KINDS[0], KINDS[1], KINDS[4], KINDS[5]], ids=lambda c: c.describe())
def test_a_random_dataset_gets_no_cache_in_the_trial_as_in_the_factory(tmp_path, config):
    """The factory refuses to cache samples that differ on two reads; a trial that cached them anyway
    measured a loader the user never gets."""
    dataset = RandomRows()
    profile = Profile(hardware={}, dataset=DatasetRecord(), settings=RunSettings(batch_size=8), config=config, measured=Measured())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = build_loader(profile, dataset, cache_dir=tmp_path / "caches", progress=False,
                              apply_process_settings=False)
    assert loader.autotune.settings["cache"] is None
    assert any("dataset[0] drew from Python's random" in str(w.message) for w in caught)
    (tmp_path / "trial").mkdir(mode=0o700)
    plan = Plan(indices=list(range(0, 96, 2)), length=96, epochs_measured=2, cache_root=str(tmp_path / "trial"))
    figures = measure(Workload(dataset=dataset, batch_size=8, epochs=2), config, plan)
    assert figures.cache_origins == ()
    assert figures.build_seconds_subset == 0.0
    assert not any((tmp_path / "trial").iterdir())  # nothing was built or filled for it
