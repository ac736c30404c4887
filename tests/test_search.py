"""The search end to end on real trial processes: failures, hangs, budget, resume, recipe written."""

from __future__ import annotations

import json

import optuna
import pytest
from workloads import BusErrorInWorkers, HangsInWorkers, Numbers, RaisesInWorkers

from autotune._api import search_spec
from autotune.config import LoaderConfig
from autotune.dataset._userfile import UserSpec
from autotune.tuner._study import SearchOptions

pytestmark = pytest.mark.timeout(240)


def spec_for(dataset, batch_size: int = 8, epochs: int = 2) -> UserSpec:
    return UserSpec(dataset=dataset, source=f"<python object: {type(dataset).__name__}>",
                    batch_size=batch_size, epochs=epochs)


def options(tmp_path, budget: float, **kw) -> SearchOptions:
    kw.setdefault("caches", ("none",))
    kw.setdefault("allocators", ("glibc",))
    return SearchOptions(budget=budget, workdir=tmp_path / ".autotune", progress=False, **kw)


@pytest.mark.parametrize("dataset_cls,reason", [
    (RaisesInWorkers, "this dataset only works in the main process"),
    (BusErrorInWorkers, "bus error"),
])
def test_failing_candidates_do_not_stop_the_search(tmp_path, dataset_cls, reason):
    out = tmp_path / "autotune.json"
    recipe, outcome = search_spec(spec_for(dataset_cls(32)), options(tmp_path, 300, trial_timeout=30, max_trials=2), out)
    assert outcome.failed, "the worker candidates should have failed"
    # A dying worker is detected by the DataLoader or, where it misses it, by the trial timeout.
    assert all(reason in r or "timed out" in r for r in outcome.failed), outcome.failed
    assert any(reason in r for r in outcome.failed), outcome.failed
    assert outcome.is_default and recipe.config.num_workers == 0
    data = json.loads(out.read_text())
    (profile,) = data["profiles"].values()
    assert profile["config"]["num_workers"] == 0
    assert profile["measured"]["is_default"] is True
    assert profile["measured"]["failed_trials"] == len(outcome.failed)


def test_a_hung_worker_cannot_hang_the_search(tmp_path):
    recipe, outcome = search_spec(spec_for(HangsInWorkers(16)), options(tmp_path, 12, trial_timeout=4), None)
    study = optuna.load_study(study_name=outcome.study["name"], storage=outcome.study["storage"])
    stopped = [t.user_attrs.get("reason", "") for t in study.trials if t.params.get("num_workers")]
    # Each hung candidate is stopped: pruned once it outlasts the default's whole run, else timed out.
    assert stopped and all("still running after" in r or "timed out after 4 s" in r for r in stopped), stopped
    assert outcome.is_default


def test_budget_bounds_the_number_of_trials(tmp_path):
    delay = 0.004
    dataset = Numbers(64, delay=delay)
    budget = 10.0
    _, outcome = search_spec(spec_for(dataset), options(tmp_path, budget, max_workers=2), None)
    # A measured trial reads the 64 samples twice; two workers at most share the sleeping.
    least_per_trial = 2 * 64 * delay / 2
    assert 1 <= outcome.trials <= budget / least_per_trial


def test_resume_uses_the_same_study(tmp_path):
    dataset = Numbers(32)
    opts = options(tmp_path, 8)
    search_spec(spec_for(dataset), opts, None)
    storage = f"sqlite:///{(tmp_path / '.autotune' / 'studies.db').resolve()}"
    (name,) = optuna.get_all_study_names(storage)
    first = len(optuna.load_study(study_name=name, storage=storage).trials)
    search_spec(spec_for(dataset), opts, None)
    assert optuna.get_all_study_names(storage) == [name]
    study = optuna.load_study(study_name=name, storage=storage)
    assert len(study.trials) > first
    defaults = [t for t in study.trials if t.user_attrs.get("config") == LoaderConfig().to_json()
                and not t.user_attrs.get("repeat")]
    assert len(defaults) == 1, "the default is measured once, not enqueued again on resume"


def test_recipe_records_what_was_measured(tmp_path):
    out = tmp_path / "autotune.json"
    recipe, outcome = search_spec(spec_for(Numbers(40), batch_size=8, epochs=3), options(tmp_path, 10), out)
    profile = json.loads(out.read_text())["profiles"][outcome.hardware["fingerprint"]]
    m = profile["measured"]
    assert profile["settings"] == {"batch_size": 8, "epochs": 3}
    assert profile["dataset"]["length"] == 40
    assert m["subset"] == {"measured": 40, "length": 40, "extrapolated": False}
    assert m["speedup"] == pytest.approx(m["default_total_seconds"] / m["total_seconds"])
    assert m["peak_memory_bytes"] > 0
    assert m["trials"] >= 1
    assert recipe.config == LoaderConfig.from_json(profile["config"])
