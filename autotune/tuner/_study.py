"""The Optuna loop: ask a candidate, measure it in its own process, tell the figure; then re-measure the
finalists interleaved and check the winner against the plain default (docs/architecture.md §3)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from autotune._units import format_bytes, format_seconds
from autotune.caches import remove_leftovers
from autotune.config import LoaderConfig, cache_backend, usual_advice
from autotune.dataset import Probe, UserSpec
from autotune.errors import AutotuneError, MeasurementError, RecipeError
from autotune.machine import shm_rule
from autotune.machine._hardware import fingerprint as hardware_fingerprint
from autotune.process import get_allocator
from autotune.recipe._measured import NO_DIFFERENCE, Finalist, Interval
from autotune.tuner import _storage
from autotune.tuner._factory_costs import FactoryCosts
from autotune.tuner._lifecycle import stop_on_signals
from autotune.tuner._measure import Plan
from autotune.tuner._measurement import Measurement
from autotune.tuner._memory_plan import TrialMemory, memory_cache_bytes
from autotune.tuner._options import MIN_ROUNDS, Clock, SearchOptions
from autotune.tuner._preparation import Setup, prepare, with_subset
from autotune.tuner._runner import Runner, TrialFailed, TrialPruned, TrialRunner, TrialTimedOut, warm_forkserver
from autotune.tuner._significance import NARROW, Spread, choose, cpu_times, noise_since, ratio
from autotune.tuner._space import Space

SEARCH_SHARE = 0.7  # of the budget; the rest re-measures the finalists interleaved
MIN_TRIAL_S = 1.0  # the shortest limit a trial is started with
STOP_S = 4.0  # stopping a trial that overran: asking what it reads, SIGTERM and its grace (tuner/_runner.py)


@dataclass
class Outcome:
    """What a search found: the winner, its figures, the default's, and how the search went."""

    config: LoaderConfig
    figures: Measurement  # the winner's median run
    default_figures: Measurement  # the plain default's, which it was checked against
    is_default: bool
    note: str
    trials: int
    failed: list[str]
    pruned: int
    search_seconds: float
    plan: Plan
    probe: Probe
    hardware: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    finalists: list[Finalist] = field(default_factory=list)  # by median, then those that failed (no runs)
    study: dict[str, str] = field(default_factory=dict)  # name and storage URL, for report and optuna-dashboard
    interval: Interval | None = None  # the winner's speed-up; the default's best rival's when it is the default
    noisy: str = ""  # why the machine was too noisy to tell, when it was
    memory: TrialMemory | None = None  # the plan every trial was judged by before it started (None: not planned)


class HopelessPruner(optuna.pruners.BasePruner):
    """Stop a trial whose partial prediction is already far behind the best finished one.

    Step 0 is a lower bound (cache build and worker start-up alone), so a small margin for noise is
    enough; steps 1 and 2 extrapolate from part of an epoch and get a wider one.
    """

    def __init__(self, factors: dict[int, float] | None = None):
        self.factors = factors or {0: 1.2, 1: 1.6, 2: 1.4}

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        done = _completed_values(study)
        return bool(done) and trial.intermediate_values[step] > self.factors.get(step, 1.5) * min(done)


def _completed_values(study: optuna.Study) -> list[float]:
    """The figures of the completed trials (a completed trial always has one)."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return [float(t.value) for t in done if t.value is not None]


def _study_name(probe: Probe, hw: dict[str, Any], spec: UserSpec, space: Space) -> str:
    """Searches on the same dataset (fingerprint), hardware (fingerprint, ranks per node included), batch
    size, epochs and space share one study; the measured subset is the study's (``subset`` attribute)."""
    digest = hashlib.sha256(json.dumps([repr(space)]).encode()).hexdigest()[:8]
    return f"autotune-{probe.fingerprint}-{hw['fingerprint']}-b{spec.batch_size}-e{spec.epochs}-{digest}"


def _storage_url(opts: SearchOptions) -> str:
    if not opts.storage:
        opts.workdir.mkdir(parents=True, exist_ok=True)
    return _storage.storage_url(opts.storage, opts.workdir)


class _Progress:
    """A progress bar over the time budget (stderr), quiet when progress is off."""

    def __init__(self, enabled: bool, budget: float):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=round(budget), unit="s", desc="autotune search", file=sys.stderr,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s {postfix}")
        self.start = time.monotonic()

    def update(self, text: str) -> None:
        if self.bar is not None:
            self.bar.n = min(self.bar.total, round(time.monotonic() - self.start))
            self.bar.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.update("done")
            self.bar.close()


def search(spec: UserSpec, opts: SearchOptions, *, setup: Setup | None = None,
           runner: TrialRunner | None = None) -> Outcome:
    """Tune ``spec``. ``setup`` and ``runner`` default to the real preparation and trial processes;
    the search-core tests pass their own, to run the loop in memory. Optuna's log level and the warning
    filters are the caller's again when it returns.

    SIGTERM and SIGHUP stop it like Ctrl-C: the running trial's process tree is stopped and its folder
    removed, then ``Stopped`` (or KeyboardInterrupt) is raised."""
    verbosity = optuna.logging.get_verbosity()
    try:
        with warnings.catch_warnings(), stop_on_signals():
            return Search(spec, opts, setup, runner).run()
    finally:
        optuna.logging.set_verbosity(verbosity)


class Search:
    """One search and its state, as Optuna's Study holds a study's: the clock, the storage and study, the
    setup and runner, the factory's learned costs, and what the loop counted. Its steps read and write
    these instead of passing a dozen arguments and counters between functions."""

    def __init__(self, spec: UserSpec, opts: SearchOptions, setup: Setup | None = None,
                 runner: TrialRunner | None = None):
        self.spec, self.opts = spec, opts
        self.clock: Clock = opts.clock()
        self.url = _storage_url(opts)
        self.storage = _storage.open_storage(self.url)  # a bad URL fails before any time is spent
        self._setup, self._runner = setup, runner
        self.durations: list[float] = []  # of this search's measured trials, for the budget's arithmetic
        self.repeats = 0  # points drawn again in a row: the sampler has converged
        self.asked = 0  # trials asked by this search (a resumed study holds earlier ones)
        self.shm_limited: list[str] = []  # candidates /dev/shm ruled out
        self.memory_limited: list[str] = []  # candidates the memory plan did not start (tuner/_memory_plan.py)
        self.cpu_start = cpu_times()  # CPU steal is counted from here
        self.load_start: float | None = None
        with contextlib.suppress(OSError):
            self.load_start = os.getloadavg()[0]  # the minute before: other jobs, not this search's trials

    # -- preparation ------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        if self._runner is None:
            warm_forkserver()
        self.setup = self._setup or prepare(self.spec, self.opts, self.clock)
        setup = self.setup
        self.runner: TrialRunner = self._runner or Runner(setup.workload, self.spec.sys_path,
                                                          memory_limit=setup.limits.memory_budget, ranks=setup.ranks,
                                                          spool=Path(self.opts.workdir) / "workloads")
        if setup.plan.cache_root:
            removed = remove_leftovers(setup.plan.cache_root)
            if removed:
                setup.limits.notes.append(f"removed {len(removed)} trial folder(s) left by a search that was killed")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.study = _storage.create_study(
            self.storage, self.url,
            study_name=_study_name(setup.probe, setup.hardware, self.spec, setup.space),
            direction="minimize",
            sampler=self.opts.sampler or optuna.samplers.TPESampler(
                seed=self.opts.seed, multivariate=True, group=True, n_startup_trials=6, constant_liar=True),
            pruner=HopelessPruner(),
        )
        self.log_dir = Path(self.opts.workdir) / "logs" / self.study.study_name  # one folder per study
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _storage.fail_stale(self.study)  # only dead searches' trials: another live search keeps its own
        subset = self.study.user_attrs.get("subset")
        if subset is None:
            self.study.set_user_attr("subset", len(setup.plan.indices))
        elif subset != len(setup.plan.indices):
            self.setup = setup = with_subset(setup, self.spec, self.opts, subset)
        self.costs = _factory_costs(self.opts, setup.hardware, setup.probe, setup.plan, self.spec, setup.ranks)
        if self.opts.resume_only:
            return self.from_study()
        self._enqueue_priors()
        self.progress = _Progress(self.opts.progress, self.opts.budget)
        try:
            self.loop()
            return self.finish()
        finally:
            self.progress.close()

    @property
    def plan(self) -> Plan:
        return self.setup.plan

    def _enqueue_priors(self) -> None:
        space = self.setup.space
        default = space.default()
        seen = {t.user_attrs.get("config_key")
                for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))}
        for prior in _priors(space, default):
            if prior.key() in seen:
                continue
            try:
                params = space.params_for(prior)
            except ValueError:
                continue  # not in this space (a memory cache that fits only in part): the sampler explores it
            self.study.enqueue_trial(params, skip_if_exists=True)

    # -- the loop ---------------------------------------------------------------------------------------

    def loop(self) -> None:
        """Trials until the budget's search share is spent, the trial count is reached or the sampler only
        draws points already measured. The first trial runs whatever preparation cost (on a loaded machine a
        small budget could otherwise end the search with nothing measured but the finalists' default), but
        it too ends at the wall."""
        while True:
            typical = statistics.median(self.durations) if self.durations else self.setup.trial_seconds * 2
            over = self.asked > 0 and self.clock.elapsed() + typical > self.opts.budget * SEARCH_SHARE
            # A trial is started only with time to run: one whose limit is under MIN_TRIAL_S would overrun at
            # once, and stopping it takes STOP_S more, past the wall (a 5 s budget ended after 18 s).
            if over or self.repeats >= 20 or self.trial_timeout(self.asked + 1) < MIN_TRIAL_S:
                break
            if self.opts.max_trials is not None and self.asked >= self.opts.max_trials:
                break
            trial = _storage.ask(self.study)
            self.asked += 1
            with _storage.heartbeat(self.storage, self.study, trial):
                self.run_trial(trial)
            self.progress.update(_status(self.study))
        if self.memory_limited:
            memory = self.setup.limits.trial_memory
            self.setup.limits.notes.append(
                f"memory limits this job: {len(self.memory_limited)} candidate(s) not tried, e.g. "
                f"{self.memory_limited[0]} (over the budget of {format_bytes(self.setup.limits.memory_budget)}"
                f"{', ' + memory.limit_text if memory else ''})")
        if self.shm_limited:
            self.setup.limits.notes.append(
                f"/dev/shm limits this machine: {len(self.shm_limited)} candidate(s) ruled out, e.g. "
                f"{self.shm_limited[0]} ({format_bytes(self.setup.batch_bytes)} batches, "
                f"{format_bytes(self.setup.shm_free or 0)} of /dev/shm free)"
            )

    def over_memory(self, config: LoaderConfig) -> str | None:
        """Why ``config``'s trial is not started: its processes and its memory cache of the whole run would
        not fit the job's budget (``tuner/_memory_plan.py``); None when they would, or nothing was planned."""
        memory, probe = self.setup.limits.trial_memory, self.setup.probe
        if memory is None:
            return None
        return memory.over_budget(config, memory_cache_bytes(config, probe.sample_bytes, probe.length))

    def trial_timeout(self, number: int | None = None) -> float:
        """The limit of the ``number``-th trial asked (the current one by default): the plan's, capped by the
        budget left (the first trial's by the wall), less what stopping a trial that overruns takes."""
        number = self.asked if number is None else number
        until = self.clock.budget_end if number > 1 else self.clock.wall
        return max(0.0, min(self.plan.batch_timeout, self.clock.left(until) - STOP_S))

    def timed_out_by_budget(self, reason: str, timeout: float, spent: float) -> str:
        """A timeout that the budget, not the plan, set is said as such: the trial was not hung, the search
        had spent ``spent`` seconds before it (preparing, on a loaded machine, or a budget too small)."""
        generic = "a hung worker or a very slow candidate"
        if timeout >= self.plan.batch_timeout - STOP_S or not reason.endswith(generic):
            return reason  # the plan's own limit, or an index the trial is known to hang on
        return (reason[: -len(generic)] + f"the budget ran out ({format_seconds(spent)} spent before this "
                f"trial, {self.clock.promise()})")

    def run_trial(self, trial: optuna.Trial) -> None:
        """Suggest, measure and tell one trial. Every write to the trial is guarded: another search may have
        failed it meanwhile (it looked dead), which only ends this trial, not the search. The trial keeps what
        it measured; the study is told the figure learned from the factory's runs, so the sampler and the
        choice of finalists see what a candidate costs through the factory here (tuner/_factory_costs.py)."""
        study, setup, plan = self.study, self.setup, self.plan
        config = setup.space.suggest(trial)
        key = config.key()
        _storage.set_attr(trial, "config", config.to_json())
        _storage.set_attr(trial, "config_key", key)
        _storage.set_attr(trial, "search", _search_id())  # which search ran it, in a shared study
        if _measured_elsewhere_now(study, key, trial.number):
            # Another search sharing the study measures this point right now: its figure will do.
            _storage.set_attr(trial, "repeat", True)
            _storage.set_attr(trial, "reason", "measured at the same time by another search sharing the study")
            _storage.tell(study, trial, state=optuna.trial.TrialState.PRUNED)
            return
        earlier = _completed_value(study, key, trial.number)
        if earlier is not None:
            self.repeats += 1  # a point already measured: tell its figure, spend no time
            _storage.set_attr(trial, "repeat", True)
            _storage.tell(study, trial, earlier)
            return
        self.repeats = 0
        free = None if setup.shm_free is None else setup.shm_free // setup.ranks  # every rank's workers share it
        reason = shm_rule(config.num_workers, config.prefetch_factor, setup.batch_bytes, free)
        if reason is not None:
            self.shm_limited.append(config.describe())
            _storage.set_attr(trial, "reason", reason)
            _storage.tell(study, trial, state=optuna.trial.TrialState.FAIL)
            return
        reason = self.over_memory(config)
        if reason is not None:
            self.memory_limited.append(config.describe())
            _storage.set_attr(trial, "reason", reason)
            _storage.tell(study, trial, state=optuna.trial.TrialState.FAIL)
            return
        t0 = time.monotonic()

        def should_prune(step: int, value: float, trial: optuna.Trial = trial) -> bool:
            return _storage.report(trial, value, step)

        best = _best_value(study)
        # Everything a trial does scales with the subset, so a trial still running after the best
        # whole-run figure scaled down to the subset (with a margin) cannot win.
        give_up = None if best is None else 1.5 * best * len(plan.indices) / plan.length + 2.0
        log_path = str(self.log_dir / f"trial-{trial.number}.log")
        _storage.set_attr(trial, "log", log_path)
        timeout, spent = self.trial_timeout(), self.clock.elapsed()
        try:
            result = self.runner.run(config, plan, timeout=timeout, should_prune=should_prune,
                                     give_up_after=give_up, log_path=log_path)
        except TrialPruned as exc:
            _storage.set_attr(trial, "reason", str(exc))
            _storage.tell(study, trial, state=optuna.trial.TrialState.PRUNED)
        except TrialFailed as exc:
            _storage.set_attr(trial, "reason", self.timed_out_by_budget(str(exc), timeout, spent))
            _storage.tell(study, trial, state=optuna.trial.TrialState.FAIL)
        except Exception as exc:  # noqa: BLE001 - a broken trial never stops the search
            _storage.set_attr(trial, "reason", f"{type(exc).__name__}: {exc}")
            _storage.tell(study, trial, state=optuna.trial.TrialState.FAIL)
        except BaseException:
            with contextlib.suppress(Exception):  # stopping: the storage may be the reason
                _storage.set_attr(trial, "reason", "interrupted (the search was stopped)")
                _storage.tell(study, trial, state=optuna.trial.TrialState.FAIL)
            raise
        else:
            _record(trial, result)
            _storage.tell(study, trial, self.costs.learned(config, result)[0].total_seconds)
        self.durations.append(time.monotonic() - t0)

    # -- the finalists ----------------------------------------------------------------------------------

    def finish(self) -> Outcome:
        """Measure the finalists and the default again, interleaved (A B C, B C A, ...), until the leader's
        speed-up over the default is known to about +-5% (at least MIN_ROUNDS rounds), ``max_rounds``, or the
        wall; a run that would not end before the wall is not started.

        The invariant: a finalist leaves the choice only when its re-measurement shows it cannot run here, never
        because of when it ran. A run that fails is retried at once (a worker the kernel killed, a guard reading
        at a peak, a dead forkserver: a broken run never stops the search); the finalist is out when the retry
        fails too, when it failed with no run to its name, or when a run hung to the plan's own limit (not
        retried: that could take as long again from the others). A run the wall stopped (its limit was the time
        left, not the plan's) says only that the budget ended: that run is dropped and the finalist keeps its
        others. The 5x memory-limit search's best trial (two workers, 43.5 s against the default's 69.8 s) lost
        five good runs that way: its last one was started with the 0.2 s that a repeat of its trial had taken,
        not the 2.1 s its measurement had, and was stopped at the wall."""
        study, plan = self.study, self.plan
        default = self.setup.space.default()
        finalists = _best_distinct(study, self.opts.finalists)
        # the default first: it anchors every comparison, so the first round measures it whatever is left;
        # then the finalists by promise, so a short stage re-measures the best before the others
        configs = [default] + [c for c in (LoaderConfig.from_json(t.user_attrs["config"]) for t in finalists)
                               if c != default]
        figures: dict[LoaderConfig, list[Measurement]] = {c: [] for c in configs}
        failures: dict[LoaderConfig, list[str]] = {c: [] for c in configs}
        failed_finalists: dict[LoaderConfig, str] = {}
        stopped: dict[LoaderConfig, str] = {}  # a run the wall stopped, by finalist: the last one's reason
        cost = _measured_seconds(study)
        typical = statistics.median(cost.values()) if cost else plan.batch_timeout / 10
        for r in range(self.opts.max_rounds):
            order = configs[r % len(configs):] + configs[: r % len(configs)]  # rotate: A B C, B C A, ...
            ran = False
            for config in order:
                if config in failed_finalists:
                    continue
                measured, out = self._remeasure(config, figures[config], failures[config], stopped, cost, typical)
                ran = ran or measured
                if out is not None:
                    failed_finalists[config] = out
                self.progress.update(f"finalists round {r + 1}")
            if not ran or (r + 1 >= MIN_ROUNDS and _settled(figures, default)):
                break
        notes = self.setup.limits.notes
        for config in configs:
            kept = config not in failed_finalists and figures[config]
            if kept and failures[config]:
                notes.append(f"finalist {config.describe()}: {len(failures[config])} re-measurement(s) failed "
                             f"({failures[config][-1]}) and ran when retried; its {len(figures[config])} run(s) stand")
            if kept and config in stopped:
                notes.append(f"finalist {config.describe()}: a re-measurement was stopped at the wall "
                             f"({stopped[config]}); its {len(figures[config])} other run(s) stand")
        runs = _pool_runs(study, figures, failed_finalists, notes)
        unmeasured = [c for c in configs if c != default and c not in failed_finalists and not runs.get(c)]
        if unmeasured:
            unreadable: list[str] = []
            loop = _loop_results(study, unreadable)
            notes.extend(n for n in unreadable if n not in notes)
            for config in (c for c in unmeasured if loop.get(c)):
                # The wall came before its turn, or stopped its one run: its trial's figure stands, as the
                # default's does (``outcome``) and as an unmeasured finalist's does for --resume-only.
                runs[config] = loop[config]
                notes.append(f"finalist {config.describe()} was not re-measured before the wall; its figure comes "
                             "from the search's own trial")
        return self.outcome(runs, failed_finalists, "interleaved re-measurement")

    def _remeasure(self, config: LoaderConfig, runs: list[Measurement], failures: list[str],
                   stopped: dict[LoaderConfig, str], cost: dict[str, float], typical: float) -> tuple[bool, str | None]:
        """One turn of ``config`` in the finalists' stage: a run, and one retry at once when it fails. Appends the
        run to ``runs``, a failure's reason to ``failures``, a run the wall stopped to ``stopped``; returns whether
        a run was measured, and why the finalist is out of the choice (None: it is not). ``cost``: the longest
        run each configuration took (this turn's is added), which a run must have left before the wall.

        Not retried: a run still going at the plan's own limit (a hung read), whose retry could take that long
        again from the other finalists."""
        plan, key = self.plan, config.key()
        turn: list[str] = []
        for _attempt in range(2):
            left = self.clock.left() - STOP_S
            if left < min(cost.get(key, typical), plan.batch_timeout):
                break  # it would not end before the wall: its figures so far (or the loop's) stand
            timeout, spent = min(plan.batch_timeout, left), self.clock.elapsed()
            try:
                runs.append(self.runner.run(config, plan, timeout=timeout))
            except TrialTimedOut as exc:
                if timeout < plan.batch_timeout:  # the wall's limit, not the plan's: no evidence about the candidate
                    stopped[config] = self.timed_out_by_budget(str(exc), timeout, spent)
                    break
                failures.append(str(exc))
                return False, _failure_text([*turn, str(exc)])
            except TrialFailed as exc:
                turn.append(self.timed_out_by_budget(str(exc), timeout, spent))
            except Exception as exc:  # noqa: BLE001 - a broken run never stops the search (a dead forkserver)
                turn.append(f"{type(exc).__name__}: {exc}")
            else:
                cost[key] = max(cost.get(key, 0.0), self.clock.elapsed() - spent)
                failures.extend(turn)
                return True, None
        failures.extend(turn)
        # its retry failed too, or it failed with no run to its name (the wall too near for the retry)
        return False, _failure_text(turn) if len(turn) > 1 or (turn and not runs) else None

    def from_study(self) -> Outcome:
        """The recipe from what the study holds, without measuring anything: every search's finalist runs, and
        the trials' own figures for configurations no search re-measured (``--resume-only``)."""
        study = self.study
        runs = _pooled_runs(study)
        for config, results in _loop_results(study).items():
            runs.setdefault(config, results)
        if not runs:
            raise AutotuneError(
                f"The study {study.study_name} holds no measured trial yet; run `autotune search` without "
                "--resume-only first (on any node sharing this --storage)."
            )
        return self.outcome(runs, {}, "the shared study's figures")

    def outcome(self, runs: dict[LoaderConfig, list[Measurement]], failed_finalists: dict[LoaderConfig, str],
                how: str) -> Outcome:
        """The winner among the measured configurations (lowest median whole run, the default on a tie), each
        figure learned from the factory's validated runs where they stand for it (tuner/_factory_costs.py)."""
        study, setup, default = self.study, self.setup, self.setup.space.default()
        medians = {c: Measurement.median(v) for c, v in runs.items() if v}
        notes = list(setup.limits.notes)
        if default not in medians:
            # The default failed its re-measurement (a timeout on a loaded machine) but the loop measured it:
            # its figure from the loop still anchors the A/B check.
            loop = _loop_results(study, notes).get(default)
            if loop:
                medians[default] = Measurement.median(loop)
                why = failed_finalists.get(default, "the budget ran out")
                notes.append(f"the plain default failed its re-measurement ({why}); "
                             "its figure comes from the search's own trial")
        for config, why in failed_finalists.items():
            if config != default:  # out of the choice: the user must see why a leader of the loop is not the recipe
                notes.append(f"finalist {config.describe()} failed its re-measurement ({why}); it is not chosen")
        learned: dict[LoaderConfig, str] = {}
        for config, figure in medians.items():
            medians[config], note = self.costs.learned(config, figure)
            if note:
                learned[config] = note
        if default not in medians:
            loop_failure = next((str(t.user_attrs.get("reason", "")) for t in study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
                if t.user_attrs.get("config_key") == default.key() and t.user_attrs.get("reason")), None)
            reason = failed_finalists.get(default) or loop_failure or (
                f"the budget ran out before it was measured ({format_seconds(self.clock.elapsed())} spent, "
                f"{self.clock.promise()})")
            raise AutotuneError(
                f"Even the plain default (num_workers=0, no cache) could not be measured: {reason}. "
                "Fix that first (a larger --budget or --max-memory, a dataset that loads in the main process)."
            )
        counts = {c: max(1, len(runs.get(c) or ())) for c in medians}
        spread = Spread.pooled({c: [r.total_seconds for r in v] for c, v in runs.items()})
        winner, ratios = choose({c: m.total_seconds for c, m in medians.items()}, counts, default, spread)
        is_default = winner == default
        notes.extend(learned[c] for c in dict.fromkeys((winner, default)) if c in learned)
        rival = winner if not is_default else min(ratios, key=lambda c: medians[c].total_seconds, default=None)
        interval = None if rival is None else Interval(ratios[rival].speedup, ratios[rival].low, ratios[rival].high)
        note = f"fastest candidate in {how}, measurably faster than the default" if not is_default else ""
        if is_default and rival is not None and interval is not None:
            note = (f"{NO_DIFFERENCE}: the best candidate ({rival.describe()}) measured {interval.text()} the "
                    "default's speed, an interval that holds 1; a tie keeps the plain default")
        elif is_default:
            note = "the plain default is the only candidate that could be measured"
        noise = noise_since(self.cpu_start, setup.limits.usable_cpus, spread)
        if self.load_start is not None:
            noise = replace(noise, load=self.load_start / max(setup.limits.usable_cpus, 1))
        problems = noise.problems()
        unsure = ratios.get(rival) if rival is not None else None
        noisy = ""
        if problems and unsure is not None and (unsure.tied or unsure.half_width > 2 * NARROW):
            noisy = (f"the machine was too noisy to tell ({'; '.join(problems)}): the speed-up's interval is "
                     f"{interval.text() if interval else ''}; search again on a quiet machine")
        trials = study.get_trials(deepcopy=False)
        states = optuna.trial.TrialState
        return Outcome(
            config=winner,
            figures=medians[winner],
            default_figures=medians[default],
            is_default=is_default,
            note=note,
            trials=sum(1 for t in trials if not t.user_attrs.get("repeat") and t.state not in (states.RUNNING,
                                                                                                  states.WAITING)),
            failed=[t.user_attrs.get("reason", "") for t in trials if t.state == states.FAIL],
            pruned=sum(1 for t in trials if t.state == states.PRUNED),
            search_seconds=self.clock.elapsed(),
            plan=self.plan,
            probe=setup.probe,
            hardware=setup.hardware,
            notes=notes,
            finalists=[
                Finalist(c, tuple(f.total_seconds for f in runs.get(c, [])))
                for c in _shown(sorted((c for c in runs if runs[c]), key=lambda c: medians[c].total_seconds),
                                max(self.opts.finalists, 1) + 1, (winner, default))
            ] + [Finalist(c, ()) for c in failed_finalists],  # failed when measured again
            study={"name": study.study_name, "storage": self.url},
            interval=interval,
            noisy=noisy,
            memory=setup.limits.trial_memory,
        )


def _shown(ranked: list[LoaderConfig], count: int, always: tuple[LoaderConfig, ...]) -> list[LoaderConfig]:
    """The finalists a recipe lists: the ``count`` fastest, and the chosen one and the default wherever they
    rank (a road's companion or another search's pooled runs can push them past ``count``)."""
    return [c for i, c in enumerate(ranked) if i < count or c in always]


def _settled(figures: dict[LoaderConfig, list[Measurement]], default: LoaderConfig) -> bool:
    """Whether the leading finalist's speed-up over the default is known narrowly enough to stop."""
    measured = {c: v for c, v in figures.items() if v}
    if default not in measured or len(measured) < 2:
        return default in measured  # nothing to compare with: one round of the default is all there is
    medians = {c: Measurement.median(v).total_seconds for c, v in measured.items()}
    leader = min((c for c in medians if c != default), key=lambda c: medians[c])
    spread = Spread.pooled({c: [r.total_seconds for r in v] for c, v in measured.items()})

    r = ratio(medians[default], len(measured[default]), medians[leader], len(measured[leader]), spread)
    return r.half_width <= NARROW


def _failure_text(reasons: list[str]) -> str:
    """A finalist's failed turn in one phrase: its run's reason, and its retry's."""
    if len(reasons) == 1:
        return reasons[0]
    first, retry = reasons[0], reasons[1]
    return f"{first}, and again when retried" if first == retry else f"{first}; retried: {retry}"


def _measured_seconds(study: optuna.Study) -> dict[str, float]:
    """The longest trial each configuration's measurement took, by configuration key: a repeat was told an
    earlier figure and measured nothing (its 0.2 s stood for a 2.1 s trial and let a finalist's run start with
    a tenth of the time it needs)."""
    out: dict[str, float] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        key = t.user_attrs.get("config_key")
        if t.duration and key and not t.user_attrs.get("repeat"):
            out[key] = max(out.get(key, 0.0), t.duration.total_seconds())
    return out


def _loop_results(study: optuna.Study, unreadable: list[str] | None = None) -> dict[LoaderConfig, list[Measurement]]:
    """What the loop's completed trials measured, by configuration."""
    out: dict[LoaderConfig, list[Measurement]] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        result = _trial_result(study, t, unreadable)
        if result is None:
            continue
        config = _readable_config(t)
        if config is None:
            problem = f"trial {t.number} of the study {study.study_name}: its configuration cannot be read here"
            if unreadable is None:
                raise MeasurementError(problem)
            unreadable.append(f"ignored {problem}")
            continue
        out.setdefault(config, []).append(result)
    return out


def _priors(space: Space, default: LoaderConfig) -> list[LoaderConfig]:
    """Informed first points, measured before the sampler explores: the default every recipe is checked
    against, the usual advice (a worker per CPU, persistent), a cache read in the main process and, where
    the space has it, the memory cache filled by workers while the first epoch trains; where no cache is
    offered (a stream), the default with one main-process thread instead, since decoding in the main
    process competes with torch's own intra-op threads on a small machine."""
    priors = [default]
    if space.max_workers:
        priors.append(usual_advice(space.max_workers, persistent=True in space.persistent,
                                   context=space.contexts[0], main_threads=default.main_threads))
    caches = [c for c in space.caches if c is not None]
    if caches:
        # the first allocator that reuses large freed blocks at run time, without a fresh process
        allocator = next((a for a in space.allocators if a != default.allocator and not get_allocator(a).preloaded),
                         default.allocator)
        cache = next((c for c in caches if cache_backend(c).in_memory), caches[0])  # no disk needed
        share = (space.cache_shares[0] if cache_backend(cache).in_memory and space.cache_shares
                 else None)  # the most that fits
        priors.append(replace(default, cache=cache, allocator=allocator, cache_share=share))
        if ("first_epoch" in space.cache_fills and cache in space.filled_caches and space.max_workers
                and "fork" in space.contexts):
            # The same cache filled while the first epoch trains, its decode spread over the workers.
            priors.append(LoaderConfig(num_workers=space.max_workers, prefetch_factor=2,
                                       persistent_workers=True in space.persistent, multiprocessing_context="fork",
                                       main_threads=default.main_threads, cache=cache, cache_fill="first_epoch",
                                       allocator=allocator, cache_share=share))
    elif 1 in space.main_threads and default.main_threads != 1:
        priors.append(replace(default, main_threads=1))
    return priors


def _record(trial: optuna.Trial, result: Measurement) -> None:
    for key, value in result.to_json().items():
        _storage.set_attr(trial, key, value)


def _trial_result(study: optuna.Study, trial: optuna.trial.FrozenTrial,
                  unreadable: list[str] | None = None) -> Measurement | None:
    """What a completed trial measured (None: a repeat, or a trial that stored none). A result this version
    cannot read is a MeasurementError, or, given ``unreadable``, a note there and None."""
    if trial.user_attrs.get("repeat"):
        return None
    try:
        return Measurement.from_trial_attrs(trial.user_attrs)
    except MeasurementError as exc:
        problem = f"trial {trial.number} of the study {study.study_name}: {exc}"
        if unreadable is None:
            raise MeasurementError(problem) from None
        unreadable.append(f"ignored {problem}")
        return None


def _search_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _measured_elsewhere_now(study: optuna.Study, key: str, number: int) -> bool:
    return any(t.number < number and t.user_attrs.get("config_key") == key and not t.user_attrs.get("repeat")
               for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def _completed_value(study: optuna.Study, key: str, number: int) -> float | None:
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if t.number != number and t.user_attrs.get("config_key") == key:
            return t.value
    return None


def _best_value(study: optuna.Study) -> float | None:
    return min(_completed_values(study), default=None)


def _status(study: optuna.Study) -> str:
    best = _best_value(study)
    return f"trial {len(study.trials)}" + (f", best {best:.2f} s" if best is not None else "")


def _best_distinct(study: optuna.Study, count: int) -> list[optuna.trial.FrozenTrial]:
    """The ``count`` best distinct configurations, by trial figure; and, where one of them holds a cache, the
    best of each way of filling it (built first, filled by the first epoch) that a trial measured, though it
    ranked lower, placed right after the best so that a short stage re-measures it early. The invariant:
    whether a cache is built first or filled while training is decided by the interleaved re-measurement,
    never by the trials' figures alone, which come from two extrapolations of a short subset (a fill's first
    epoch from a few batches, a build from a probe scaled to the length) and so disagree by more than the two
    roads differ: the article's search at 8edf66a re-measured three builds and no fill, and its build first ran
    3.22 s, 1.38x the first-epoch fill the run before had chosen. A trial whose configuration this version
    cannot read (a study another version shares) is never a finalist: nothing could run it again."""
    best: dict[str, tuple[optuna.trial.FrozenTrial, LoaderConfig]] = {}
    for t in sorted(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)),
                    key=lambda t: t.value or 0.0):
        config = None if t.user_attrs.get("repeat") else _readable_config(t)
        if config is not None:
            best.setdefault(t.user_attrs["config_key"], (t, config))
    ranked = list(best.values())
    top, rest = ranked[:count], ranked[count:]
    roads = {_fill_road(c) for _, c in top}
    companions: list[optuna.trial.FrozenTrial] = []
    for road in ("build", "first_epoch") if roads != {None} else ():
        if road not in roads:
            companions += [t for t, c in rest if _fill_road(c) == road][:1]
    return [t for t, _ in top[:1]] + companions + [t for t, _ in top[1:]]


def _fill_road(config: LoaderConfig) -> str | None:
    """How a configuration's cache is filled ("build" or "first_epoch"); None without a cache."""
    return config.cache_fill if config.cache is not None else None


def _readable_config(trial: optuna.trial.FrozenTrial) -> LoaderConfig | None:
    """A trial's configuration; None where this version cannot read it (a study another version shares)."""
    try:
        return LoaderConfig.from_json(trial.user_attrs["config"])
    except (RecipeError, KeyError):
        return None


def _factory_costs(opts: SearchOptions, hw: dict[str, Any], probe: Probe, plan: Plan, spec: UserSpec,
                   ranks: int) -> FactoryCosts:
    """The factory runs validated on this machine that this search's figures can learn from: none for a
    stream or several ranks, which a validation does not run."""
    if probe.stream or ranks > 1:
        return FactoryCosts()
    return FactoryCosts(runs=opts.factory_runs.get(hardware_fingerprint(hw), ()), dataset=probe.fingerprint,
                        length=probe.length, batch_size=spec.batch_size, build_workers=plan.build_workers)


_RUNS_PREFIX = "finalist-runs:"  # a study attribute per search: its finalists' re-measurements


def _pool_runs(study: optuna.Study, figures: dict[LoaderConfig, list[Measurement]],
               failed: dict[LoaderConfig, str], notes: list[str]) -> dict[LoaderConfig, list[Measurement]]:
    """Store this search's finalist runs in the study and return every search's, pooled by configuration
    (minus the ones that failed here): searches sharing a study decide on the same evidence, and a recipe
    can be written later from the study alone (``resume_only``). Another search's runs that this version
    cannot read (another version's) are left out, with a note: the budget is spent by now."""
    own = {c.key(): [r.to_json() for r in v] for c, v in figures.items() if v and c not in failed}
    if own:
        with contextlib.suppress(Exception):  # sharing is a bonus; this search's own runs still decide
            study.set_user_attr(f"{_RUNS_PREFIX}{_search_id()}:{time.time():.0f}", own)
    return {c: v for c, v in _pooled_runs(study, extra=own, unreadable=notes).items() if c not in failed}


def _pooled_runs(study: optuna.Study, extra: dict[str, list[dict[str, Any]]] | None = None,
                 unreadable: list[str] | None = None) -> dict[LoaderConfig, list[Measurement]]:
    """Every search's finalist runs in the study, by configuration. A source this version cannot read is a
    MeasurementError, or, given ``unreadable``, a note there and left out whole."""
    pooled: dict[str, list[Measurement]] = {}
    sources = [(k, v) for k, v in study.user_attrs.items() if k.startswith(_RUNS_PREFIX)]
    if extra and not any(v == extra for _, v in sources):
        sources.append(("this search's runs", extra))
    for name, source in sources:
        try:
            if not isinstance(source, dict) or not all(isinstance(v, list) for v in source.values()):
                raise MeasurementError("finalist runs must be an object of lists, by configuration")
            read = {key: [Measurement.from_json(r) for r in results] for key, results in source.items()}
        except MeasurementError as exc:
            problem = f"{name!r} of the study {study.study_name}: {exc}"
            if unreadable is None:
                raise MeasurementError(problem) from None
            unreadable.append(f"ignored {problem}")
            continue
        for key, results in read.items():
            pooled.setdefault(key, []).extend(results)
    return {LoaderConfig.from_json(json.loads(k)): v for k, v in pooled.items()}
