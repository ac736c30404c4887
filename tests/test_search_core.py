"""The search core in memory: the study loop, the priors, the finalists and the A/B check, driven by a fake
runner that returns set figures (no trial processes), plus the Space's suggest/params_for/grid inverse
checked with optuna's FixedTrial. Seconds, not searches."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import optuna
import pytest

from autotune.config import DEFAULT, LOADER_KEYS, WORKER_LOADER_KEYS, LoaderConfig
from autotune.dataset._probe import Probe
from autotune.dataset._userfile import UserSpec
from autotune.errors import AutotuneError
from autotune.recipe._measured import Finalist
from autotune.tuner import _storage
from autotune.tuner._candidates import Limits
from autotune.tuner._measure import Plan, Workload
from autotune.tuner._measurement import Measurement
from autotune.tuner._predict import Prediction
from autotune.tuner._preparation import Setup
from autotune.tuner._runner import Runner, TrialFailed, TrialRunner, TrialTimedOut
from autotune.tuner._space import Space
from autotune.tuner._study import _RUNS_PREFIX, SearchOptions, _loop_results, _priors, _study_name, search

SPACE = Space(max_workers=2, contexts=("fork", "spawn"), prefetch_factors=(2, 4), worker_threads=(1, 2),
              main_threads=(None, 1, 2), caches=(None, "memory", "pickle"), allocators=("glibc", "glibc-tuned"))


def _result(total: float, memory: int = 1000) -> Measurement:
    prediction = Prediction(build_seconds=0.0, first_epoch_seconds=total / 3, epoch_seconds=total / 3,
                            total_seconds=total, epochs=3, extrapolated=True)
    return Measurement(prediction=prediction, epochs=(), measured_samples=64, peak_memory_bytes=memory)


class FakeRunner:
    """Figures by rule: the memory cache is fastest, then workers, then the default. ``fail`` lists
    configurations that fail, ``fail_after`` the number of good runs a configuration gets before it fails
    configurations that fail; with ``best_fails_again`` the best finalist passes in the loop and fails
    when measured again (a finalist that times out in the interleaved re-measurement)."""

    def __init__(self, fail=(), best_fails_again: bool = False, fails_again=()):
        self.fail = set(fail)
        self.best_fails_again = best_fails_again
        self.fails_again = set(fails_again)
        self.calls: list[LoaderConfig] = []

    def run(self, config, plan, *, timeout, should_prune=None, give_up_after=None, log_path=None):
        self.calls.append(config)
        runs = self.calls.count(config)
        if runs == 2 and self.best_fails_again and not (self.fail - {DEFAULT}) and config != DEFAULT:
            self.fail.add(config)  # the first configuration measured again is the best finalist
        if runs == 2 and config in self.fails_again:
            self.fail.add(config)
        if config in self.fail:
            raise TrialFailed(f"timed out after {timeout:.0f} s")
        return _result(self.figure(config, runs))

    @staticmethod
    def figure(config: LoaderConfig, runs: int) -> float:
        """The rule: 10 s, 4 less with the memory cache, 2 less with workers, plus 0.01 s a run so far."""
        return 10.0 - 4.0 * (config.cache == "memory") - 2.0 * bool(config.num_workers) + 0.01 * runs


def _setup(space: Space = SPACE) -> Setup:
    probe = Probe(length=1000, sample_seconds=0.001, sample_bytes=100, batch_bytes=6400, deterministic=True,
                  determinism_note="", fingerprint="f" * 16)
    plan = Plan(indices=list(range(256)), length=1000, batch_timeout=30.0)
    limits = Limits(usable_cpus=2, memory_budget=10**9, disk_free=10**12)
    workload = Workload(dataset=list(range(1000)), batch_size=64, epochs=3, fingerprint=probe.fingerprint)
    return Setup({"fingerprint": "h" * 12}, probe, limits, space, plan, workload, 6400, None, 0.5)


def _spec() -> UserSpec:
    return UserSpec(dataset=list(range(1000)), source="<test>", batch_size=64, epochs=3)


def _opts(tmp_path: Path, **kw) -> SearchOptions:
    """A trial count, not the clock, ends these searches: the budget is far beyond what they use, so a
    loaded machine runs exactly the same trials."""
    return SearchOptions(budget=3600.0, max_trials=kw.pop("max_trials", 16), workdir=tmp_path, progress=False, **kw)


def test_search_picks_the_fastest_and_checks_it_against_the_default(tmp_path):
    runner = FakeRunner()
    outcome = search(_spec(), _opts(tmp_path), setup=_setup(), runner=runner)
    assert 3 <= outcome.trials <= 16  # 16 asked; a point drawn again is told its figure, not measured again
    assert len(set(runner.calls[:outcome.trials])) == outcome.trials
    assert outcome.config.cache == "memory" and outcome.config.num_workers > 0
    assert not outcome.is_default
    # the fake gives the default 10 s plus 0.01 s per run of it: a loop trial and the re-measurements
    assert round(outcome.default_figures.total_seconds, 2) in {10.01, 10.02, 10.03, 10.04}
    assert DEFAULT in runner.calls  # the default is always measured, in the loop and in the A/B check
    priors = _priors(SPACE, DEFAULT)
    assert runner.calls[:len(priors)] == priors  # the informed priors come first, in order


def test_a_finalist_that_fails_when_measured_again_is_dropped_not_fatal(tmp_path):
    """On a7f5ea5 this raised AttributeError ('dict' object has no attribute 'add') after the whole budget."""
    runner = FakeRunner(best_fails_again=True)
    outcome = search(_spec(), _opts(tmp_path), setup=_setup(), runner=runner)
    (best,) = runner.fail
    assert outcome.finalists[-1] == Finalist(best, ())  # shown as failed
    # and said why: the loop's leader is not the recipe, which the user must not have to guess
    assert [n for n in outcome.notes if n.startswith("finalist ")] == [
        f"finalist {best.describe()} failed its re-measurement (timed out after 30 s, and again when retried); it is "
        "not chosen"]
    assert outcome.config != best and not outcome.is_default  # the next finalist, measured again, won
    assert outcome.config.cache == "memory" and outcome.config.num_workers
    # the finalists left are tied (the fake gives them one figure): the smallest change among them won
    assert outcome.config in [f.config for f in outcome.finalists if f.total_seconds]


def test_the_default_timing_out_when_measured_again_keeps_its_loop_figure(tmp_path):
    runner = FakeRunner(fails_again={DEFAULT})
    outcome = search(_spec(), _opts(tmp_path), setup=_setup(), runner=runner)
    assert not outcome.is_default and outcome.config.cache == "memory"
    assert outcome.default_figures.total_seconds == 10.01  # its one run, in the loop
    assert any("the plain default failed its re-measurement" in n for n in outcome.notes)


def test_the_default_failing_everywhere_is_one_clear_error(tmp_path):
    runner = FakeRunner(fail={DEFAULT})
    with pytest.raises(AutotuneError, match="Even the plain default .* could not be measured: timed out"):
        search(_spec(), _opts(tmp_path), setup=_setup(), runner=runner)


def test_every_trial_failing_but_the_default_gives_the_default(tmp_path):
    space = Space(max_workers=2, prefetch_factors=(2,), caches=(None, "memory"))
    others = {c for c in space.grid() if c != DEFAULT}
    outcome = search(_spec(), _opts(tmp_path), setup=_setup(space), runner=FakeRunner(fail=others))
    assert outcome.is_default and outcome.config == DEFAULT
    assert "only candidate" in outcome.note
    assert outcome.failed and all(r.startswith("timed out") for r in outcome.failed)


def test_another_versions_unreadable_finalist_runs_are_left_out_with_a_note_not_fatal(tmp_path):
    """A study shared with another autotune version: its pooled runs that this one cannot read must not cost
    the search it just spent its budget on."""
    setup, spec = _setup(), _spec()
    study = optuna.create_study(study_name=_study_name(setup.probe, setup.hardware, spec, setup.space),
                                storage=_storage.storage_url(None, tmp_path), direction="minimize")
    newer = _result(1.0).to_json()
    newer["prediction"]["new"] = 1  # a figure a later version added
    study.set_user_attr(f"{_RUNS_PREFIX}other:1", {DEFAULT.key(): [newer]})
    outcome = search(spec, _opts(tmp_path, max_trials=6), setup=setup, runner=FakeRunner())
    assert outcome.config.cache == "memory" and not outcome.is_default
    assert [n for n in outcome.notes if n.startswith("ignored ")] == [
        f"ignored '{_RUNS_PREFIX}other:1' of the study {study.study_name}: a trial result's prediction has unknown "
        "keys 'new'"]


# ---------------------------------------------------------------- the space: suggest and its inverse


def test_params_for_is_the_inverse_of_suggest_on_every_grid_point():
    grid = SPACE.grid()
    assert len(grid) == len(set(grid))
    for config in grid:
        assert SPACE.suggest(optuna.trial.FixedTrial(SPACE.params_for(config))) == config


def test_grid_holds_exactly_the_valid_points():
    grid = set(SPACE.grid())
    # no forked worker with more than one thread (rule 3), no worker knob without workers (rule 1)
    assert not [c for c in grid if c.multiprocessing_context == "fork" and c.worker_threads]
    assert not [c for c in grid if not c.num_workers and (c.prefetch_factor or c.multiprocessing_context)]
    assert LoaderConfig(num_workers=2, multiprocessing_context="spawn", worker_threads=2, prefetch_factor=4,
                        persistent_workers=True, main_threads=1, cache="pickle", allocator="glibc-tuned") in grid
    # workers 1..2 x prefetch 2 x persistent 2 x (fork: 1 thread, spawn: 2) = 2*2*2*3 = 24, plus 0 workers;
    # times main threads 3 x caches 3 x allocators 2
    assert len(grid) == (24 + 1) * 3 * 3 * 2


def test_the_dataloader_keywords_a_configuration_sets_are_listed_once():
    # what the factory lets a caller override and a loader without workers drops (config.LOADER_KEYS)
    with_workers = {tuple(sorted(c.loader_kwargs())) for c in SPACE.grid() if c.num_workers}
    assert with_workers == {tuple(sorted(LOADER_KEYS))}
    assert {tuple(sorted(c.loader_kwargs())) for c in SPACE.grid() if not c.num_workers} == {
        tuple(sorted(set(LOADER_KEYS) - set(WORKER_LOADER_KEYS)))}


def test_params_for_refuses_a_point_outside_the_space():
    with pytest.raises(ValueError, match="not in this search space"):
        SPACE.params_for(LoaderConfig(num_workers=8, prefetch_factor=2, multiprocessing_context="fork"))
    with pytest.raises(ValueError, match="not in this search space"):
        SPACE.params_for(LoaderConfig(cache="lmdb"))


def test_enqueued_priors_are_drawn_back_exactly_by_a_real_study():
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    priors = _priors(SPACE, DEFAULT)
    for prior in priors:
        study.enqueue_trial(SPACE.params_for(prior))
    drawn = []
    for _ in priors:
        trial = study.ask()
        drawn.append(SPACE.suggest(trial))
        study.tell(trial, 1.0)
    assert drawn == priors


def test_priors_fit_a_space_without_persistent_workers():
    space = Space(max_workers=2, persistent=(False,), caches=(None, "memory"), allocators=("glibc", "glibc-tuned"))
    priors = _priors(space, DEFAULT)
    assert [p.persistent_workers for p in priors] == [False, False, False]
    for prior in priors:  # each can be enqueued: it lies in the space
        assert space.suggest(optuna.trial.FixedTrial(space.params_for(prior))) == prior


def test_the_cache_filled_while_the_first_epoch_trains_is_a_prior_the_search_measures():
    space = Space(max_workers=2, caches=(None, "memory"), cache_fills=("build", "first_epoch"),
                  allocators=("glibc", "glibc-tuned"))
    priors = _priors(space, DEFAULT)
    assert priors[-1] == LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True,
                                      multiprocessing_context="fork", cache="memory", cache_fill="first_epoch",
                                      allocator="glibc-tuned")
    assert priors[-2].cache == "memory" and priors[-2].cache_fill == "build"  # against "build first"
    for prior in priors:
        assert space.suggest(optuna.trial.FixedTrial(space.params_for(prior))) == prior


class FillRunner(FakeRunner):
    """FakeRunner's figures, but a cache filled by the first epoch reads 9.5 s in its trial, below every
    build first, and 3.0 s in every run after: the trial's extrapolation of a short first epoch misjudged."""

    def run(self, config, plan, *, timeout, should_prune=None, give_up_after=None, log_path=None):
        if config.cache is None or config.cache_fill != "first_epoch":
            return super().run(config, plan, timeout=timeout)
        self.calls.append(config)
        return _result(9.5 if self.calls.count(config) == 1 else 3.0)


FILL_SPACE = Space(max_workers=2, prefetch_factors=(2, 4), main_threads=(None, 1), caches=(None, "memory"),
                   cache_fills=("build", "first_epoch"), allocators=("glibc", "glibc-tuned"))


def test_building_first_or_filling_by_the_first_epoch_is_decided_by_the_re_measurement(tmp_path):
    """Three builds first rank above the fill in the loop; the fill is re-measured beside them all the same,
    and chosen by what it measures there."""
    runner = FillRunner()
    outcome = search(_spec(), _opts(tmp_path, max_trials=12), setup=_setup(FILL_SPACE), runner=runner)
    fills = [c for c in runner.calls if c.cache and c.cache_fill == "first_epoch"]
    assert fills and runner.calls.count(fills[0]) > 1  # its trial, then the finalists' rounds
    assert outcome.config == fills[0] and outcome.config.cache_fill == "first_epoch"
    shown = [f.config for f in outcome.finalists]
    assert sum(1 for c in shown if c.cache and c.cache_fill == "build") == 3  # the loop's best three, all builds
    # the builds' figures are exactly FakeRunner's rule for their re-measured runs (the second run on); that they
    # ranked above the fill in the loop is the finalists' list above (the loop's best three, all builds)
    builds = [f for f in outcome.finalists if f.config.cache and f.config.cache_fill == "build"]
    for f in builds:
        runs = runner.calls.count(f.config)
        assert list(f.total_seconds) == [FakeRunner.figure(f.config, k) for k in range(2, runs + 1)]
    assert shown[-1] == DEFAULT  # the slowest re-measured, listed all the same: the recipe's comparison


def test_a_trial_another_version_wrote_is_never_a_finalist_and_its_figures_are_left_out_with_a_note(tmp_path):
    """A shared study holds the fastest trial of all, whose configuration this version cannot read: it is
    passed over as a finalist (nothing could run it again) and its figures are left out, said in a note."""
    setup, spec = _setup(FILL_SPACE), _spec()
    study = optuna.create_study(study_name=_study_name(setup.probe, setup.hardware, spec, setup.space),
                                storage=_storage.storage_url(None, tmp_path), direction="minimize")
    newer = {**DEFAULT.to_json(), "cache": "memory", "new": 1}  # a knob a later version added
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, value=0.5,
        user_attrs={**_result(0.5).to_json(), "config": newer, "config_key": "newer"}))
    outcome = search(spec, _opts(tmp_path, max_trials=12), setup=setup, runner=FillRunner())
    assert outcome.config.cache_fill == "first_epoch"
    notes: list[str] = []
    assert all(0.5 not in f.total_seconds for f in outcome.finalists)
    assert {c.cache_fill for c in _loop_results(study, notes) if c.cache} == {"build", "first_epoch"}
    assert notes == [f"ignored trial 0 of the study {study.study_name}: its configuration cannot be read here"]


def test_without_a_cache_among_the_best_no_fill_is_added_to_the_finalists(tmp_path):
    """The road of a cache is asked only where a cache is in contention: the loop's best three hold none."""
    runner = FakeRunner()
    runner.run = lambda config, plan, **kw: (runner.calls.append(config) or  # type: ignore[method-assign]
                                             _result(20.0 if config.cache else 10.0 - 2.0 * bool(config.num_workers)
                                                     + 0.01 * runner.calls.count(config)))
    outcome = search(_spec(), _opts(tmp_path, max_trials=12), setup=_setup(FILL_SPACE), runner=runner)
    assert all(f.config.cache is None for f in outcome.finalists)
    remeasured = {c for c in runner.calls if runner.calls.count(c) > 1}
    assert remeasured and all(c.cache is None for c in remeasured)


def test_without_caches_the_priors_try_one_main_thread():
    space = Space(max_workers=2, main_threads=(None, 1, 2))
    assert _priors(space, DEFAULT)[-1] == LoaderConfig(main_threads=1)
    assert LoaderConfig(main_threads=1) not in _priors(SPACE, DEFAULT)  # a cache prior there instead


def test_the_fake_runner_and_the_real_one_both_take_what_the_search_passes():
    """``TrialRunner`` is what ``search`` calls; a fake that drifted from it would test another search."""
    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(FakeRunner.run) == shape(Runner.run) == shape(TrialRunner.run)


class ClockedRunner(FakeRunner):
    """Records when each run started and the limit it was given."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.limits: list[tuple[float, float]] = []

    def run(self, config, plan, *, timeout, **kw):
        import time

        self.limits.append((time.monotonic(), timeout))
        return super().run(config, plan, timeout=timeout, **kw)


def test_no_trial_may_run_past_the_budget_and_no_finalist_past_the_wall(tmp_path, monkeypatch):
    """The plan allows 5000 s a trial; ~1100 s of the budget are left: every trial's limit ends with the
    budget (the first one's with the wall), every finalist run's with the wall, less what stopping an overrun
    takes. On 9eac6c3 each got 5000 s. The budget's clock is held still, so each limit is exact."""
    import dataclasses
    import types

    from autotune.tuner import _options
    from autotune.tuner._options import EXIT_S
    from autotune.tuner._study import STOP_S

    now = 10_000.0
    monkeypatch.setattr(_options, "time", types.SimpleNamespace(monotonic=lambda: now))
    runner = ClockedRunner()
    opts = _opts(tmp_path, max_trials=4)
    opts.started = now - 2500.0
    clock = opts.clock()
    setup = _setup()
    setup = dataclasses.replace(setup, plan=dataclasses.replace(setup.plan, batch_timeout=5000.0))
    outcome = search(_spec(), opts, setup=setup, runner=runner)
    loop, finals = [limit for _, limit in runner.limits[:4]], [limit for _, limit in runner.limits[4:]]
    assert finals and not outcome.is_default
    # the frozen clock 2500 s into a 3600 s budget: the budget ends 1100 s on, the wall the finalists' share
    # later, both before the plan's 5000 s, so every limit below is the clock's, not the plan's
    to_budget = 3600.0 - 2500.0 - STOP_S
    to_wall = to_budget + clock.finalists_seconds - EXIT_S
    assert (clock.budget_end - now - STOP_S, clock.wall - now - STOP_S) == (to_budget, to_wall)
    assert loop == [to_wall] + [to_budget] * 3  # the first trial may use the wall, the others end with the budget
    assert finals == [to_wall] * len(finals)


def test_a_budget_spent_before_any_trial_is_one_clear_error(tmp_path):
    import time

    opts = _opts(tmp_path)
    opts.started = time.monotonic() - 5000.0  # past the wall: preparation took it all
    with pytest.raises(AutotuneError, match="the budget ran out before it was measured"):
        search(_spec(), opts, setup=_setup(), runner=ClockedRunner())




def test_no_trial_is_started_that_could_not_run_before_the_wall(tmp_path):
    """A trial whose limit would be under a second overruns at once and takes STOP_S more to stop: on be07484
    a 5 s search on the JPEG example ended 18 s after its start (the promise: 10 s)."""
    import time

    from autotune.tuner._study import STOP_S

    runner = FakeRunner()
    opts = SearchOptions(budget=10.0, workdir=tmp_path, progress=False)
    opts.started = time.monotonic() - 15.0 + STOP_S + 0.5  # the wall (10 + 5 s) leaves STOP_S + 0.5 s
    with pytest.raises(AutotuneError, match="the budget ran out before it was measured"):
        search(_spec(), opts, setup=_setup(), runner=runner)
    assert runner.calls == []


def test_the_commands_budget_runs_from_the_process_start():
    """`time autotune search --budget 2m` sees the promise: the clock starts with the process, the
    interpreter's and torch's imports included; main() called from Python starts it at the call."""
    import subprocess
    import sys

    code = ("import time; time.sleep(1.5); from autotune.cli._main import process_started; "
            "print(time.monotonic() - process_started())")
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.5 <= age < 60.0, age

class TimesOut:
    """Every trial times out as the runner says it (no index to name): a default that its budget cut off."""

    def run(self, config, plan, *, timeout, should_prune=None, give_up_after=None, log_path=None):
        raise TrialTimedOut(f"timed out after {timeout:.0f} s: a hung worker or a very slow candidate")


def test_a_default_whose_trial_the_budget_cut_short_is_said_as_the_budget_not_a_hang(tmp_path):
    """On be07484 a 20 s search on a loaded machine said "a hung worker or a very slow candidate" for a
    default that had only the seconds its budget left."""
    import time

    opts = SearchOptions(budget=60.0, workdir=tmp_path, progress=False)
    opts.started = time.monotonic() - 62.0  # preparation took the budget; the wall leaves ~13 s
    with pytest.raises(AutotuneError) as caught:
        search(_spec(), opts, setup=_setup(), runner=TimesOut())
    assert re.fullmatch(r"Even the plain default \(num_workers=0, no cache\) could not be measured: timed out after "
                        r"\d+ s: the budget ran out \(6\d\.\d\d s spent before this trial, within 60\.00 s plus "
                        r"15\.00 s for the finalists\)\. Fix that first \(a larger --budget or --max-memory, a "
                        r"dataset that loads in the main process\)\.", str(caught.value)), str(caught.value)


def test_a_timeout_the_plan_set_still_says_hung(tmp_path):
    opts = _opts(tmp_path, max_trials=1)  # 3600 s: the plan's 30 s limit, not the budget, sets the timeout
    with pytest.raises(AutotuneError, match="timed out after 30 s: a hung worker or a very slow candidate"):
        search(_spec(), opts, setup=_setup(), runner=TimesOut())

# -- significance: synthetic measurements, the decisions they must lead to ------------------------------

from autotune.tuner._significance import Noise, Spread, choose, ratio  # noqa: E402

WORKERS = LoaderConfig(num_workers=2, prefetch_factor=2)
WORKERS_CACHED = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, cache="memory")


def test_a_candidate_inside_the_noise_loses_to_the_default():
    """The CPU-LSTM case: 0.69 vs 0.78 s, then 0.65 vs 0.51 s. On 9eac6c3 the lower median won (1.10x)."""
    runs = {DEFAULT: [0.69, 0.65, 0.72], WORKERS: [0.78, 0.51, 0.66]}
    spread = Spread.pooled(runs)
    totals = {c: sorted(v)[1] for c, v in runs.items()}
    winner, ratios = choose(totals, {c: 3 for c in runs}, DEFAULT, spread)
    assert winner == DEFAULT
    assert ratios[WORKERS].tied and ratios[WORKERS].speedup == pytest.approx(0.69 / 0.66)


def test_a_clear_speedup_wins_with_its_interval():
    runs = {DEFAULT: [10.0, 10.4, 9.8], WORKERS: [3.0, 2.9, 3.1]}
    winner, ratios = choose({c: sorted(v)[1] for c, v in runs.items()}, {c: 3 for c in runs}, DEFAULT,
                            Spread.pooled(runs))
    r = ratios[WORKERS]
    assert winner == WORKERS and r.faster and r.low < 10.0 / 3.0 < r.high
    assert r.low > 2.8 and r.high < 3.9


def test_tied_candidates_go_to_the_smaller_change():
    runs = {DEFAULT: [10.0, 10.2, 9.9], WORKERS: [5.0, 5.1, 4.9], WORKERS_CACHED: [4.9, 5.0, 5.05]}
    winner, _ = choose({c: sorted(v)[1] for c, v in runs.items()}, {c: 3 for c in runs}, DEFAULT,
                       Spread.pooled(runs))
    assert winner == WORKERS  # 4.9-5.05 s and 4.9-5.1 s: tied; two settings changed against four


def test_a_tie_between_winners_goes_to_the_smaller_change_only_when_it_costs_the_same():
    """The 10,000-JPEG search inside a 1.2 GiB limit: the default's runs 151.8 and 95.6 s widened every
    interval, so a 0-worker partial cache (62.5 s) was 'tied' with two workers filling it (48.8 s) and won
    for changing fewer settings; the run then took 64 s against the grid's 47 s."""
    zero_workers = LoaderConfig(cache="memory", cache_share=0.05)
    filled = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, cache="memory",
                          cache_share=0.05, cache_fill="first_epoch")
    runs = {DEFAULT: [151.8, 95.6], zero_workers: [64.1, 62.5, 62.5], filled: [46.9, 50.6]}
    totals = {DEFAULT: 123.7, zero_workers: 62.5, filled: 48.75}
    counts = {c: len(v) for c, v in runs.items()}
    spread = Spread.pooled(runs)
    assert ratio(62.5, 3, 48.75, 2, spread).tied  # the interval alone cannot tell them apart
    winner, ratios = choose(totals, counts, DEFAULT, spread)
    assert winner == filled and ratios[zero_workers].faster
    close = {**totals, zero_workers: 48.75 * 1.04}  # within 5%: the smaller change still wins the tie
    assert choose(close, counts, DEFAULT, spread)[0] == zero_workers


def test_one_run_each_uses_the_prior_spread():
    spread = Spread.pooled({DEFAULT: [1.0], WORKERS: [0.9]})
    assert spread.df == 4 and spread.sigma == pytest.approx(0.10)  # the prior alone
    assert ratio(1.0, 1, 0.9, 1, spread).tied  # 1.11x from one run each is inside a small VM's noise
    assert ratio(1.0, 1, 0.3, 1, spread).faster


def test_runs_that_agree_decide_once_they_have_the_priors_degrees_of_freedom():
    """The accelerator benchmark's 60 ms search (90 s): the finalists' runs agreed within 1-3%, the fill's two
    10% under the default's three; with the prior at full weight beside them the interval was 0.99-1.26x and
    the default kept at 88% AU, against 98% for the fill. Five degrees of freedom of their own decide."""
    fill = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, cache="memory",
                        cache_fill="first_epoch")
    build = LoaderConfig(cache="memory")
    runs = {DEFAULT: [34.43, 35.15, 35.42], fill: [31.29, 31.48], build: [31.60, 31.63, 31.85]}
    spread = Spread.pooled(runs)
    assert (spread.df, spread.measured_df) == (5, 5) and spread.sigma < 0.02
    totals = {DEFAULT: 35.15, fill: 31.385, build: 31.63}
    winner, ratios = choose(totals, {c: len(v) for c, v in runs.items()}, DEFAULT, spread)
    # both faster than the default; the build, within 1% of the fill and tied with it, is the smaller change
    assert winner == build and ratios[fill].low > 1.05 and ratios[build].low > 1.05
    one_pair = Spread.pooled({DEFAULT: [35.0], fill: [31.29, 31.48]})  # one degree of freedom: the prior fills 3
    assert (one_pair.df, one_pair.measured_df) == (4, 1) and one_pair.sigma > 0.08
    assert ratio(35.0, 1, 31.385, 2, one_pair).tied


def test_noise_problems_name_what_made_the_machine_noisy():
    assert Noise(steal=0.0, load=0.2, spread=0.04).problems() == []
    assert Noise(steal=0.12, load=3.0, spread=0.3).problems() == [
        "runs of one configuration varied by ~30%", "the hypervisor took 12% of the CPU time",
        "the load was 3.0 per CPU"]


class NoisyRunner(FakeRunner):
    """The default and every candidate within a few percent, varying run to run by ~20%."""

    def run(self, config, plan, *, timeout, **kw):
        self.calls.append(config)
        wobble = [1.0, 1.25, 0.8, 1.15, 0.9, 1.2, 0.85, 1.1][len(self.calls) % 8]
        return _result((10.0 - 0.3 * bool(config.num_workers)) * wobble)


def test_a_noisy_search_keeps_the_default_says_no_measurable_difference_and_warns(tmp_path):
    outcome = search(_spec(), _opts(tmp_path, max_trials=6), setup=_setup(), runner=NoisyRunner())
    assert outcome.is_default and outcome.config == DEFAULT
    assert outcome.note.startswith("no measurable difference: the best candidate")
    assert outcome.interval is not None and outcome.interval.low < 1.0 < outcome.interval.high
    assert "too noisy to tell" in outcome.noisy and "runs of one configuration varied" in outcome.noisy


def test_the_finalists_are_measured_until_the_interval_is_narrow(tmp_path):
    """Steady figures: two rounds settle it; a wobbling leader gets more rounds (up to the cap)."""
    steady = FakeRunner()
    search(_spec(), _opts(tmp_path / "a", max_trials=6), setup=_setup(), runner=steady)
    noisy = NoisyRunner()
    search(_spec(), _opts(tmp_path / "b", max_trials=6), setup=_setup(), runner=noisy)
    assert len(steady.calls) - 6 < len(noisy.calls) - 6


class FinalistsCounted(NoisyRunner):
    """NoisyRunner (never settled), counting the finalists' runs: the runs asked without a pruning hook."""

    def __init__(self):
        super().__init__()
        self.finalist_runs: list[LoaderConfig] = []

    def run(self, config, plan, *, timeout, should_prune=None, **kw):
        if should_prune is None:
            self.finalist_runs.append(config)
        return super().run(config, plan, timeout=timeout, **kw)


@pytest.mark.parametrize("max_rounds", [None, 2, 3])
def test_max_rounds_bounds_the_finalists_interleaved_rounds(tmp_path, max_rounds):
    """A search that never settles re-measures its finalists in exactly ``max_rounds`` rounds (8 by default),
    each configuration once a round; fewer than two rounds leave no interval, so 1 is refused."""
    runner = FinalistsCounted()
    kw = {} if max_rounds is None else {"max_rounds": max_rounds}
    search(_spec(), _opts(tmp_path, max_trials=6, **kw), setup=_setup(), runner=runner)
    configs = set(runner.finalist_runs)
    assert DEFAULT in configs and len(configs) >= 2
    assert len(runner.finalist_runs) == (max_rounds or 8) * len(configs)
    for config in configs:
        assert runner.finalist_runs.count(config) == (max_rounds or 8)
    with pytest.raises(AutotuneError, match="--max-rounds must be an integer of at least 2, but got 1"):
        _opts(tmp_path, max_rounds=1)


def test_the_recipe_shows_the_interval_and_never_one_point_zero_x():
    from autotune.recipe._measured import Interval, Measured, RunFigures

    tuned = Measured(chosen=RunFigures(total_seconds=3.0), default=RunFigures(total_seconds=10.2),
                     interval=Interval(3.4, 3.1, 3.8))
    assert tuned.speedup_text() == "3.4x (3.1\u20133.8x) as fast"
    assert Measured.from_json(tuned.to_json()).interval == tuned.interval
    tie = Measured(chosen=RunFigures(total_seconds=10.0), default=RunFigures(total_seconds=10.0), is_default=True,
                   interval=Interval(1.04, 0.93, 1.16))
    assert tie.speedup_text() == "no measurable difference (the best candidate: 1.04x (0.93\u20131.16x))"
    old = Measured(chosen=RunFigures(total_seconds=10.0), default=RunFigures(total_seconds=10.0))
    assert old.speedup_text() == "no measurable difference"  # a recipe of an older version: no "1.00x"


def test_one_lucky_pair_of_runs_does_not_decide_the_interval():
    """The 20 s jpeg_folder search here: the default's one run against a 4.4x candidate's, the only repeat a
    pair 8.6 / 9.9 s. With that pair's one degree of freedom alone (t = 12.7) the interval was 0.8-25x and
    the default kept; moderated by the prior it is clearly faster."""
    runs = {DEFAULT: [11.82], WORKERS_CACHED: [2.66], WORKERS: [8.60, 9.86]}
    spread = Spread.pooled(runs)
    winner, ratios = choose({c: sorted(v)[len(v) // 2] if len(v) % 2 else sum(v) / 2 for c, v in runs.items()},
                            {c: len(v) for c, v in runs.items()}, DEFAULT, spread)
    assert winner == WORKERS_CACHED and ratios[WORKERS_CACHED].low > 3.0


# -- the finalists' stage: what may drop a finalist ------------------------------------------------------

TWO_WORKERS = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork")
FIVE_X = Space(max_workers=2, contexts=("fork",), prefetch_factors=(2,), persistent=(True,))  # priors: D, then 2 workers


class SearchClock:
    """The budget's clock (``tuner._options``), moved only by the runs, so every limit and every start is exact."""

    def __init__(self, now: float = 10_000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now


class TimedRunner:
    """The 5x memory-limit search's two finalists on the search's clock: a run of the default takes 2.3 s and
    predicts 69.8 s, one of two workers 2.1 s and 43.5 s (its trial's figures, 2026-12-02). ``seconds`` sets
    the n-th run of a configuration to other seconds; a run longer than its limit is stopped at it, as the
    runner stops one (TrialTimedOut). ``raises`` makes the n-th run of a configuration raise that instead."""

    SECONDS = {DEFAULT: 2.3, TWO_WORKERS: 2.1}
    TOTALS = {DEFAULT: 69.8, TWO_WORKERS: 43.5}

    def __init__(self, clock: SearchClock, seconds=None, raises=None):
        self.clock = clock
        self.seconds = seconds or {}
        self.raises = raises or {}
        self.calls: list[tuple[LoaderConfig, float]] = []  # each run's configuration and limit

    def run(self, config, plan, *, timeout, should_prune=None, give_up_after=None, log_path=None):
        self.calls.append((config, timeout))
        n = sum(1 for c, _ in self.calls if c == config)
        if (config, n) in self.raises:
            raise self.raises[(config, n)]
        took = self.seconds.get((config, n), self.SECONDS[config])
        if took > timeout:
            self.clock.now += timeout
            raise TrialTimedOut(f"timed out after {timeout:.0f} s: a hung worker or a very slow candidate")
        self.clock.now += took
        # runs 10% apart, as the 5x search's default's were (151.8 and 95.6 s): the stage does not settle
        return _result(self.TOTALS[config] * (1 + 0.1 * (n % 3)))


def _five_x(tmp_path, monkeypatch, left: float, budget: float = 30.0, batch_timeout: float = 30.0, **runner):
    """The loop measures the default and two workers (4.4 s); the finalists' stage then starts ``left`` seconds
    before the wall less STOP_S. Its rounds alternate D W2, W2 D: with 13.2 s + x, three rounds leave x when two
    workers' turn comes. The search's clock is the runs' alone (the loop's trial durations too), so the loop
    asks its second trial whatever the machine's load: it starts 2.1 s before the stage, 2.3 s after the first,
    and ``budget`` must leave it that under the search's share."""
    import dataclasses
    import time
    import types

    from autotune.tuner import _options, _study
    from autotune.tuner._study import STOP_S

    clock = SearchClock()
    monkeypatch.setattr(_options, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(_study, "time", types.SimpleNamespace(monotonic=clock.monotonic, time=time.time))
    opts = SearchOptions(budget=budget, max_trials=2, workdir=tmp_path, progress=False)
    wall = budget + opts.finalists_seconds - _options.EXIT_S
    opts.started = clock.now - (wall - STOP_S - 4.4 - left)
    runner = TimedRunner(clock, **runner)
    setup = _setup(FIVE_X)
    setup = dataclasses.replace(setup, plan=dataclasses.replace(setup.plan, batch_timeout=batch_timeout))
    outcome = search(_spec(), opts, setup=setup, runner=runner)
    assert [c for c, _ in runner.calls[:2]] == [DEFAULT, TWO_WORKERS]  # the loop asked its second trial
    return outcome, runner


def test_a_finalists_run_is_started_only_with_the_seconds_its_measurement_took(tmp_path, monkeypatch):
    """The 5x search (trials 1 and 11 of its study): two workers measured in 2.1 s, then drawn again and told its
    figure in 0.2 s; the finalists' stage took that 0.2 s for its cost, started its last run with under 2.1 s
    before the wall, the wall stopped it and two workers left the choice with its five good runs: the plain
    default became the recipe (80.36 s against the grid's 48.72 s). With 1 s left when its turn comes, the
    run is not started: its three runs stand and it wins."""
    outcome, runner = _five_x(tmp_path, monkeypatch, left=13.2 + 1.0)
    finals = runner.calls[2:]
    assert [c for c, _ in finals] == [DEFAULT, TWO_WORKERS, TWO_WORKERS, DEFAULT, DEFAULT, TWO_WORKERS]
    assert all(limit >= TimedRunner.SECONDS[c] for c, limit in finals)  # each could end before the wall
    assert outcome.config == TWO_WORKERS and not outcome.is_default
    assert [len(f.total_seconds) for f in outcome.finalists] == [3, 3]
    assert not [n for n in outcome.notes if n.startswith("finalist ")]


def test_a_finalists_run_the_wall_stops_drops_that_run_not_the_finalist(tmp_path, monkeypatch):
    """Its fourth run is slower (3 s) than the 2.1 s it took before and 2.6 s are left: started, and stopped at
    the wall. That says the budget ended, nothing about two workers: its three runs stand and it wins, and the
    notes say what happened to the fourth."""
    outcome, runner = _five_x(tmp_path, monkeypatch, left=13.2 + 2.6,
                              seconds={(TWO_WORKERS, 5): 3.0})  # its 5th run: one in the loop, 4th here
    assert [c for c, _ in runner.calls[2:]] == [DEFAULT, TWO_WORKERS, TWO_WORKERS, DEFAULT, DEFAULT, TWO_WORKERS,
                                                   TWO_WORKERS]
    assert outcome.config == TWO_WORKERS and not outcome.is_default
    assert [f.total_seconds for f in outcome.finalists] == [(43.5 * 1.2, 43.5, 43.5 * 1.1),
                                                            (69.8 * 1.2, 69.8, 69.8 * 1.1)]
    (note,) = [n for n in outcome.notes if n.startswith("finalist ")]
    assert note == (f"finalist {TWO_WORKERS.describe()}: a re-measurement was stopped at the wall (timed out after 3 s: "
                    "the budget ran out (28.90 s spent before this trial, within 30.00 s plus 7.50 s for the "
                    "finalists)); its 3 other run(s) stand")  # the wall (35.5 s) less STOP_S less 2.6 s


def test_a_finalist_that_fails_once_is_retried_at_once_and_kept_when_the_retry_runs(tmp_path, monkeypatch):
    """A run that fails (a worker the kernel killed, a guard reading at a peak, a forkserver that died: an
    OSError from its start) is one run, not the finalist: on 3faddcc a TrialFailed put two workers out of the
    choice, and an OSError ended the search with a traceback."""
    for error in (TrialFailed("DataLoader worker (pid 7) is killed by signal: Killed"),
                  OSError("[Errno 32] Broken pipe")):
        outcome, runner = _five_x(tmp_path / type(error).__name__, monkeypatch, left=13.2 + 1.0,
                                  raises={(TWO_WORKERS, 3): error})
        assert [c for c, _ in runner.calls[2:5]] == [DEFAULT, TWO_WORKERS, TWO_WORKERS]  # failed, retried at once
        assert outcome.config == TWO_WORKERS and not outcome.is_default
        (note,) = [n for n in outcome.notes if n.startswith("finalist ")]
        assert note.startswith(f"finalist {TWO_WORKERS.describe()}: 1 re-measurement(s) failed (") and note.endswith(
            ") and ran when retried; its 3 run(s) stand"), note


def test_a_finalist_whose_retry_fails_too_or_whose_run_hangs_is_out(tmp_path, monkeypatch):
    """Failed twice in a row: it does not run here. Out, named with its reasons; the default is kept."""
    killed = TrialFailed("used 700.0 MiB, over the memory budget of 606.8 MiB")
    outcome, _ = _five_x(tmp_path / "twice", monkeypatch, left=13.2 + 1.0,
                         raises={(TWO_WORKERS, 2): killed, (TWO_WORKERS, 3): killed})
    assert outcome.is_default
    assert [n for n in outcome.notes if n.startswith("finalist ")] == [
        f"finalist {TWO_WORKERS.describe()} failed its re-measurement (used 700.0 MiB, over the memory budget of "
        "606.8 MiB, and again when retried); it is not chosen"]
    assert outcome.finalists[-1] == Finalist(TWO_WORKERS, ())
    # Its neighbour, not retried: a run still going at the plan's limit (5 s here, not the wall's) hangs (a read
    # that never returns), and its retry could take as long again from the other finalists.
    outcome, runner = _five_x(tmp_path / "hung", monkeypatch, left=13.2 + 1.0, batch_timeout=5.0,
                              seconds={(TWO_WORKERS, 3): 100.0})
    # rounds D W2, W2 (hangs: 5 s) D, D: the default's two runs after it have 4.8 and 2.5 s before the wall
    assert [c for c, _ in runner.calls[2:]] == [DEFAULT, TWO_WORKERS, TWO_WORKERS, DEFAULT, DEFAULT]
    assert runner.calls[4][1] == 5.0  # the plan's limit, not the wall's
    assert outcome.is_default
    assert [n for n in outcome.notes if n.startswith("finalist ")] == [
        f"finalist {TWO_WORKERS.describe()} failed its re-measurement (timed out after 5 s: a hung worker or a very "
        "slow candidate); it is not chosen"]


def test_the_finalists_cost_is_the_longest_measured_trial_not_a_repeat(tmp_path):
    """A repeat is told an earlier figure and measures nothing: its duration is not what a run costs."""
    import datetime

    from autotune.tuner._study import _measured_seconds

    study = optuna.create_study(storage=_storage.storage_url(None, tmp_path), direction="minimize")
    start = datetime.datetime(2026, 12, 2, 0, 2, 27)
    for seconds, repeat in ((2.1, False), (1.7, False), (0.2, True)):
        study.add_trial(optuna.trial.FrozenTrial(
            number=0, state=optuna.trial.TrialState.COMPLETE, value=43.5, values=None, datetime_start=start,
            datetime_complete=start + datetime.timedelta(seconds=seconds), params={}, distributions={},
            user_attrs={"config_key": TWO_WORKERS.key(), **({"repeat": True} if repeat else {})}, system_attrs={},
            intermediate_values={}, trial_id=0))
    assert _measured_seconds(study) == {TWO_WORKERS.key(): 2.1}


def test_a_finalist_the_wall_leaves_unmeasured_keeps_its_trials_figure(tmp_path, monkeypatch):
    """The stage has time for the default's run and 1 s more: two workers' run is stopped at the wall (or, where
    its trial's seconds are known, not started). Its trial's figure stands, as the default's does when the wall
    leaves it unmeasured, and it wins, with a note."""
    outcome, runner = _five_x(tmp_path, monkeypatch, left=2.3 + 1.0, budget=12.0)
    assert [c for c, _ in runner.calls[2:]] == [DEFAULT, TWO_WORKERS]
    assert outcome.config == TWO_WORKERS and not outcome.is_default
    assert outcome.figures.total_seconds == 43.5 * 1.1  # its trial's: the first run of it
    assert [n for n in outcome.notes if n.startswith("finalist ")] == [
        f"finalist {TWO_WORKERS.describe()} was not re-measured before the wall; its figure comes from the search's "
        "own trial"]
