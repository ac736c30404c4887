"""The grid oracle: every point of a reduced space (``Space.grid()``), each measured the way autotune measures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna

from autotune.config import LoaderConfig
from autotune.machine._cpus import usable_cpus
from autotune.machine._memory import default_budget
from autotune.tuner._measure import Workload
from autotune.tuner._memory_plan import memory_cache_bytes
from autotune.tuner._runner import Runner, TrialFailed
from autotune.tuner._space import Space


def reduced_space(max_workers: int, *, has_train_step: bool = False) -> Space:
    """The oracle's grid: workers 0..max_workers x persistent x prefetch {2, 4} x every cache backend x
    allocator {glibc, glibc-tuned}; fork workers with one thread (main threads 1..CPUs with a train_step)."""
    cpus = usable_cpus()
    return Space(max_workers=max_workers, contexts=("fork",), prefetch_factors=(2, 4), worker_threads=(1,),
                 main_threads=tuple(range(1, cpus + 1)) if has_train_step and cpus > 1 else (),
                 caches=(None, "memory", "pickle", "hdf5", "lmdb"), allocators=("glibc", "glibc-tuned"))


def grid_points(space: Space, quick: bool) -> list[LoaderConfig]:
    """Every point of ``space``; in --quick mode the first and the last (a smoke test, not an oracle)."""
    points = space.grid()
    return [points[0], points[-1]] if quick else points


def workload_for(spec: Any, outcome: Any) -> Workload:
    return Workload(dataset=spec.dataset, batch_size=spec.batch_size, epochs=spec.epochs,
                    collate_fn=spec.collate_fn, transform=spec.transform, train_step=spec.train_step,
                    fingerprint=outcome.probe.fingerprint)


def evaluate_points(spec: Any, outcome: Any, configs: list[LoaderConfig], log: Callable[[str], None] | None = None,
                    label: str = "grid") -> list[dict]:
    """Measure each LoaderConfig with ``Runner.run`` on the search's own plan (the measurement autotune uses) and
    judged by the search's memory plan (``outcome.memory``): a point the plan would not start is "not tried" with the
    search's reason, and the runner's guard stops a running one at the search's budget, so a grid point is what the
    search could have chosen in the same job. Without a plan (a search that planned nothing), the budget read now."""
    memory = getattr(outcome, "memory", None)
    runner = Runner(workload_for(spec, outcome), spec.sys_path,
                    memory_limit=memory.budget if memory is not None else default_budget())
    plan = outcome.plan
    out = []
    for i, config in enumerate(configs):
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"config": config.to_json(), "describe": config.describe()}
        cache = memory_cache_bytes(config, outcome.probe.sample_bytes, outcome.probe.length)
        refused = memory.over_budget(config, cache) if memory is not None else None
        try:
            if refused:
                raise TrialFailed(refused)
            result = runner.run(config, plan, timeout=plan.batch_timeout)
            entry["value"] = result.total_seconds
            entry["prediction"] = result.prediction.to_dict()
        except TrialFailed as exc:
            entry["failed"] = str(exc)
        entry["duration_s"] = time.perf_counter() - t0
        out.append(entry)
        if log:
            figure = f"{entry['value']:.2f} s" if "value" in entry else entry["failed"]
            log(f"{label} {i + 1}/{len(configs)}: {config.describe()} -> {figure} ({entry['duration_s']:.1f} s)")
    return out


def best_point(evaluated: list[dict]) -> dict | None:
    done = [e for e in evaluated if "value" in e]
    return min(done, key=lambda e: e["value"]) if done else None


def study_trials(outcome: Any) -> list[dict]:
    """The search's trials, in order: state, value, start/complete times (epoch seconds), duration, config."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=outcome.study["name"], storage=outcome.study["storage"])
    return [{"number": t.number, "state": t.state.name, "value": t.value,
             "start": t.datetime_start.timestamp() if t.datetime_start else None,
             "complete": t.datetime_complete.timestamp() if t.datetime_complete else None,
             "duration_s": t.duration.total_seconds() if t.duration else None,
             "repeat": bool(t.user_attrs.get("repeat")), "config": t.user_attrs.get("config")}
            for t in study.trials]
