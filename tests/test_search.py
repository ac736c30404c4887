"""The search end to end on real trial processes: failures, hangs, budget, resume, recipe written."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import optuna
import pytest
from workloads import (
    BusErrorAfterFirstBatch,
    BusErrorInWorkers,
    HangsInWorkers,
    Numbers,
    RaisesInWorkers,
    step_that_logs_and_goes_on,
)

from autotune._api import search_spec
from autotune.config import LoaderConfig
from autotune.dataset._userfile import UserSpec
from autotune.tuner._measure import Plan, Workload
from autotune.tuner._runner import Runner, TrialFailed, failure_reason, worker_death_in_log
from autotune.tuner._study import SearchOptions

pytestmark = pytest.mark.timeout(240)


def spec_for(dataset, batch_size: int = 8, epochs: int = 2) -> UserSpec:
    return UserSpec(dataset=dataset, source=f"<python object: {type(dataset).__name__}>",
                    batch_size=batch_size, epochs=epochs)


def options(tmp_path, budget: float, **kw) -> SearchOptions:
    kw.setdefault("caches", ("none",))
    kw.setdefault("max_rounds", 2)  # the fewest finalist rounds: no test here reads the interval they narrow
    kw.setdefault("allocators", ("glibc",))
    return SearchOptions(budget=budget, workdir=tmp_path / ".autotune", progress=False, **kw)


@pytest.mark.parametrize("dataset_cls,reason", [
    (RaisesInWorkers, "this dataset only works in the main process"),
    (BusErrorInWorkers, "bus error"),
])
def test_failing_candidates_do_not_stop_the_search(tmp_path, dataset_cls, reason):
    out = tmp_path / "autotune.json"
    # The default's run takes about 2 s (a read costs 30 ms in the main process), so a worker candidate is
    # given up on after 1.5 x that + 2 s: time enough to die of its workers even on a loaded machine, where
    # a default run of milliseconds had the candidate pruned while its workers started, before it failed.
    recipe, outcome = search_spec(spec_for(dataset_cls(32, delay=0.03)),
                                  options(tmp_path, 300, trial_timeout=30, max_trials=2), out)
    assert outcome.failed, ("the worker candidates should have failed", outcome.trials, outcome.pruned,
                            outcome.notes)
    # A dying worker is detected by the DataLoader or, where it misses it, by the trial timeout.
    assert all(reason in r or "timed out" in r for r in outcome.failed), outcome.failed
    assert any(reason in r for r in outcome.failed), outcome.failed
    assert outcome.is_default and recipe.config.num_workers == 0
    data = json.loads(out.read_text())
    (profile,) = data["profiles"].values()
    assert profile["config"]["num_workers"] == 0
    assert profile["measured"]["is_default"] is True
    assert profile["measured"]["failed_trials"] == len(outcome.failed)


@pytest.mark.timeout(120)
def test_a_worker_death_swallowed_by_the_step_fails_the_trial_with_its_cause(tmp_path):
    # torch raises "worker killed by signal" from its SIGCHLD handler in whatever the main thread runs;
    # the step swallows it (printing it), and the loader would notice the dead worker only at its next
    # liveness check, 5 s later. A trial given up on before that read as slow ("pruned: still
    # running"), not as failed; CI met this once, with torch's own profiler import as the swallower.
    workload = Workload(dataset=BusErrorAfterFirstBatch(32), batch_size=8, epochs=1,
                        train_step=step_that_logs_and_goes_on)
    runner = Runner(workload, [str(Path(__file__).parent)])
    config = LoaderConfig(num_workers=2, prefetch_factor=1, multiprocessing_context="fork")
    log = tmp_path / "trial.log"
    with pytest.raises(TrialFailed) as failed:
        runner.run(config, Plan(indices=list(range(32)), length=32), timeout=60, give_up_after=1.5,
                   log_path=str(log))
    assert str(failed.value) == failure_reason(RuntimeError("killed by signal: Bus error"))
    assert "is killed by signal: Bus error" in log.read_text()


def test_a_trial_that_cannot_start_reports_why():
    # A plan that cannot be sent to the trial process: its start fails, and that error is the one raised
    # (the clean-up used to join the never-started process and raise "can only join a started process").
    runner = Runner(Workload(dataset=Numbers(8), batch_size=4, epochs=1), [str(Path(__file__).parent)])
    plan = Plan(indices=list(range(8)), length=8, files=(lambda: None,))  # type: ignore[arg-type]
    with pytest.raises((AttributeError, pickle.PicklingError, TypeError)) as raised:
        runner.run(LoaderConfig(), plan, timeout=30)
    assert "pickle" in str(raised.value).lower()


def test_a_worker_death_is_read_from_the_last_lines_of_a_log(tmp_path):
    log = tmp_path / "trial.log"
    assert worker_death_in_log(str(log)) is None  # no log yet
    log.write_text("W1130 profiler.py:858] Unexpected error importing torch.profiler._cupti_monitor\n"
                   "RuntimeError: DataLoader worker (pid 21089) is killed by signal: Segmentation fault. "
                   "It is possible that dataloader's workers are out of shared memory.\n")
    assert worker_death_in_log(str(log)) == failure_reason(
        RuntimeError("DataLoader worker (pid 21089) is killed by signal: Segmentation fault"))
    log.write_text("x" * (1 << 20) + "\nRuntimeError: DataLoader worker (pid(s) 12, 13) exited unexpectedly\n")
    assert worker_death_in_log(str(log)) == failure_reason(
        RuntimeError("DataLoader worker (pid(s) 12, 13) exited unexpectedly"))
    log.write_text("epoch 1: 32 batches\n")
    assert worker_death_in_log(str(log)) is None
    assert worker_death_in_log(None) is None


def test_a_hung_worker_cannot_hang_the_search(tmp_path):
    # Two trials, the default then the usual workers prior, whatever the machine's load: a 12 s budget
    # beside another suite ran only the default, and nothing hung.
    opts = options(tmp_path, 120, trial_timeout=4, max_trials=2)
    recipe, outcome = search_spec(spec_for(HangsInWorkers(16)), opts, None)
    study = optuna.load_study(study_name=outcome.study["name"], storage=outcome.study["storage"])
    stopped = [t.user_attrs.get("reason", "") for t in study.trials if t.params.get("num_workers")]
    # Each hung candidate is stopped: pruned once it outlasts the default's whole run, else timed out.
    assert stopped and all("still running after" in r or "timed out after 4 s" in r for r in stopped), stopped
    assert outcome.is_default


def test_a_budget_spent_before_the_first_trial_still_measures_the_default(tmp_path, monkeypatch):
    # 1 s: preparing (the probe, the determinism check, the storage) uses up the budget before any trial, as
    # a small budget on a loaded machine does; the default must still be measured, as the one trial, in the
    # finalists' share after it (made long here, so that a loaded machine fits preparation and the default in).
    from autotune.tuner import _options

    monkeypatch.setattr(_options, "FINALISTS_MIN_S", 120.0)
    recipe, outcome = search_spec(spec_for(Numbers(16)), options(tmp_path, 1), None)
    study = optuna.load_study(study_name=outcome.study["name"], storage=outcome.study["storage"])
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert [t.user_attrs["config"] for t in complete] == [LoaderConfig().to_json()]
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
    # two trials each, the budget too large to end either search first: a second search that spent a small
    # budget preparing (an 8 s one did, on a quiet machine, beside the other test worker) asked none
    opts = options(tmp_path, 300, max_trials=2)
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
    recipe, outcome = search_spec(spec_for(Numbers(40), batch_size=8, epochs=3), options(tmp_path, 10, max_trials=2), out)
    profile = json.loads(out.read_text())["profiles"][outcome.hardware["fingerprint"]]
    m = profile["measured"]
    assert profile["settings"] == {"batch_size": 8, "epochs": 3}
    assert profile["dataset"]["length"] == 40
    assert m["subset"] == {"measured": 40, "length": 40, "extrapolated": False}
    assert m["speedup"] == pytest.approx(m["default_total_seconds"] / m["total_seconds"])
    assert m["peak_memory_bytes"] > 0
    assert m["trials"] >= 1
    assert recipe.config == LoaderConfig.from_json(profile["config"])
