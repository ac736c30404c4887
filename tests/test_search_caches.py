"""Caches as a dimension of the search, and the factory building or reusing them."""

from __future__ import annotations

import json
import warnings

import optuna
import pytest
import torch
from workloads import Megabytes, Noisy, Numbers, jitter

import autotune
from autotune._api import search_spec
from autotune.caches import CacheRebuildWarning, list_caches
from autotune.dataset._userfile import UserSpec
from autotune.tuner._study import SearchOptions

pytestmark = pytest.mark.timeout(240)


def spec_for(dataset, epochs=2, transform=None):
    return UserSpec(dataset=dataset, source=f"<python object: {type(dataset).__name__}>", batch_size=8,
                    epochs=epochs, transform=transform)


def opts(tmp_path, budget, **kw):
    # The tests name the trials they read (the priors come first, in _priors' order) as max_trials; the budget
    # is only a loaded machine's generous wall, so what they assert does not depend on the machine's speed
    # (an 8 s budget ended before the lmdb prior in some quiet runs, after it in others). Each trial stays the
    # size those small budgets gave it (budget / 50, at least 1 s), not the larger one a 120 s budget would.
    # Three finalist rounds: a cache 15x as fast as 30 epochs of slow reads is significant after two; the
    # eight rounds that narrowing its interval to +-5% took spent 48 s of a 56 s search.
    kw.setdefault("allocators", ("glibc",))
    kw.setdefault("trial_seconds", 1.0)
    kw.setdefault("max_rounds", 3)
    return SearchOptions(budget=budget, workdir=tmp_path / ".autotune", progress=False, **kw)


def cache_params(outcome):
    storage = outcome.study["storage"]
    study = optuna.load_study(study_name=outcome.study["name"], storage=storage)
    return {t.params.get("cache") for t in study.trials if t.state != optuna.trial.TrialState.WAITING}  # drawn


def test_random_samples_leave_every_cache_out(tmp_path):
    _, outcome = search_spec(spec_for(Noisy(24)), opts(tmp_path, 120, max_trials=3), None)
    assert outcome.is_default or outcome.config.cache is None
    (note,) = [n for n in outcome.notes if n.startswith("caches left out")]
    assert "dataset[0] drew from torch's random generator" in note and "transform" in note
    assert cache_params(outcome) == {None}


def test_a_memory_cache_that_does_not_fit_is_tried_partial(tmp_path):
    budget = 800 << 20  # room for a trial process and part of the 1000 MiB of samples, not all of them
    _, outcome = search_spec(spec_for(Megabytes(1000)), opts(tmp_path, 120, max_memory=budget, max_workers=0,
                                                             caches=("memory",), max_trials=2), None)
    (note,) = [n for n in outcome.notes if n.startswith("cache memory of the whole dataset left out: needs ~")]
    assert "--max-memory" in note and "of the samples is tried instead" in note
    storage = outcome.study["storage"]
    study = optuna.load_study(study_name=outcome.study["name"], storage=storage)
    drawn = [t.user_attrs["config"] for t in study.trials if "config" in t.user_attrs]
    cached = [c for c in drawn if c["cache"] == "memory"]
    assert cached and all(0 < c.get("cache_share", 1) < 1 for c in cached), drawn  # never the whole
    if outcome.config.cache == "memory":
        assert 0 < outcome.config.cache_share < 1
        assert outcome.figures.peak_memory_bytes <= budget


def test_restricting_the_caches(tmp_path):
    _, outcome = search_spec(spec_for(Numbers(24)), opts(tmp_path, 120, caches=("lmdb",), max_trials=3), None)
    assert cache_params(outcome) == {"none", "lmdb"}


def test_a_slow_dataset_read_for_many_epochs_gets_a_cache(tmp_path):
    out = tmp_path / "autotune.json"
    recipe, outcome = search_spec(spec_for(Numbers(64, delay=0.01), epochs=30), opts(tmp_path, 120, max_trials=4), out)
    assert recipe.config.cache is not None, outcome.finalists
    assert json.loads(out.read_text())["profiles"][recipe.profile.fingerprint]["config"]["cache"] == recipe.config.cache
    # The factory builds the full cache on first use, then reuses it.
    root = tmp_path / "caches"
    first = [s for b in recipe.dataloader(Numbers(64), cache_dir=root, shuffle=False) for s in b[1].tolist()]
    assert first == list(range(64))
    if recipe.config.cache != "memory":
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheRebuildWarning)
            recipe.dataloader(Numbers(64), cache_dir=root)
        assert [c["status"] for c in list_caches(root)] == ["valid"]


@pytest.fixture(scope="module")
def searched_recipe(tmp_path_factory):
    """One search's recipe (no cache, no workers) for the four backends' cells: each forces its backend on
    the same recipe, so one search serves them all (it was run once per cell, 6 s each: a budget that
    measured nothing on a loaded machine; the one search's one trial, the default, is the recipe they need)."""
    tmp = tmp_path_factory.mktemp("searched")
    with pytest.MonkeyPatch.context() as mp:  # the function-scoped private cache root is not set up yet
        mp.setenv("AUTOTUNE_CACHE_DIR", str(tmp / "autotune-cache"))
        search_spec(spec_for(Numbers(16), transform=jitter), opts(tmp, 60, caches=("none",), max_workers=0, max_trials=1),
                    tmp / "autotune.json")
    return tmp / "autotune.json"


@pytest.mark.parametrize("backend", ["memory", "pickle", "hdf5", "lmdb"])
def test_forcing_a_backend_keeps_samples_exact_and_transform_random(tmp_path, backend, searched_recipe):
    recipe_path = tmp_path / "autotune.json"
    recipe_path.write_bytes(searched_recipe.read_bytes())  # this cell's own copy, as its own search wrote it
    dataset = Numbers(16)
    plain = autotune.dataloader(dataset, recipe_path, cache=backend, cache_dir=tmp_path / "c", num_workers=2,
                                shuffle=False)
    assert plain.num_workers == 2
    labels = [i for _, b in plain for i in b.tolist()]
    assert labels == list(range(16))
    tensors = torch.cat([t for t, _ in plain])
    assert torch.equal(tensors, torch.stack([dataset[i][0] for i in range(16)]))
    noisy = autotune.dataloader(dataset, recipe_path, cache=backend, cache_dir=tmp_path / "c", transform=jitter,
                                shuffle=False)
    one, two = torch.cat([t for t, _ in noisy]), torch.cat([t for t, _ in noisy])
    assert not torch.equal(one, two), "the transform runs every epoch, after the cache"
    assert torch.all((one - tensors >= 0) & (one - tensors < 1))
