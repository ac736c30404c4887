"""Shared machinery of the issue-5 benchmarks: one timed configuration in a fresh process, honestly.

How every configuration is measured (docs/architecture.md §3):

- a fresh Python process per run (``run_fresh``): allocator state, thread pools and worker start-up
  never carry over; a preloaded allocator is put in the environment it starts with (``launch_env``);
- the dataset's source files are evicted from the page cache (``autotune.machine._evict``) before the one-time
  setup reads them (cache build, in-memory load) and again just before epoch 1;
- the setup (cache build, load, recipe factory) is timed apart from the epochs; each epoch is timed
  from ``iter(loader)`` to the last batch consumed, the consumer included; shuffle with a fixed seed;
- no memory is read while epochs are timed: peak PSS of the main process and its workers comes from a
  separate run of the same configuration (``memory=True``), sampled about ten times an epoch;
- configurations are interleaved (A B C A B C ...) and summarised by median with the min-max spread.

A benchmark script defines its cells: ``name -> function(params) -> Setup``. The parent calls
``run_fresh(script, name, params)``; the child (``script --cell JSON``) calls ``child_main``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
RESULTS = REPO / "benchmarks" / "results"
for _folder in (REPO, EXAMPLES):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

SEED = 0


# ------------------------------------------------------------------------------------------ machine


def machine_facts() -> dict[str, Any]:
    """The facts a result is quoted with: CPU model, usable CPUs, memory, torch version, load."""
    from autotune.recipe import _allocator as allocator
    from autotune.machine import _hardware as hardware

    hw = hardware.collect()
    return {
        "cpu_model": hw.get("cpu_model"),
        "usable_cpus": hw.get("usable_cpus"),
        "logical_cpus": hw.get("logical_cpus"),
        "memory_bytes": hw.get("memory_bytes"),
        "gpus": hw.get("gpus"),
        "torch": hw.get("torch"),
        "cuda": hw.get("cuda"),
        "python": platform.python_version(),
        "platform": hw.get("platform"),
        "fingerprint": hw.get("fingerprint"),
        "described": hardware.describe(hw),
        "allocators": allocator.availability(),
        "load_average_1_5_15": list(os.getloadavg()),
    }


# ------------------------------------------------------------------------------------------ child side


@dataclass
class Setup:
    """What a cell hands back: the source files to evict, and how to build its loader.

    ``prepare()`` is the one-time work of the run (cache build, in-memory load, the factory), timed as
    "setup"; it returns the loader and the consumer of each batch. ``parts`` may be filled by
    ``prepare`` with named sub-timings (seconds) kept in the JSON.
    """

    files: set[str]
    prepare: Callable[[], tuple[Iterable, Callable[[Any], Any]]]
    parts: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def evict_files(paths: Iterable[str]) -> dict[str, Any]:
    """Drop ``paths`` from the page cache and say how well it worked."""
    paths = list(paths)
    if not paths:
        return {"files": 0, "effective": None, "note": "no files to evict (data generated in memory)"}
    from autotune.machine._evict import evict

    return evict(paths).to_dict()


def _consume_epoch(loader: Iterable, consume: Callable[[Any], Any], memory: bool) -> tuple[float, int, int]:
    """(seconds, batches, peak PSS) of one epoch; PSS only read in the memory pass."""
    from autotune.machine._memory import tree_pss

    every = 0
    if memory:
        try:
            every = max(1, len(loader) // 10)  # type: ignore[arg-type]
        except TypeError:
            every = 10
    peak = 0
    batches = 0
    start = time.perf_counter()
    for batch in loader:
        consume(batch)
        batches += 1
        if every and batches % every == 0:
            peak = max(peak, tree_pss())
    seconds = time.perf_counter() - start
    return seconds, batches, peak


def run_setup(setup: Setup, epochs: int, memory: bool = False) -> dict[str, Any]:
    """Evict, prepare (timed), evict again, then time ``epochs`` epochs (or sample memory)."""
    from autotune.machine._memory import tree_pss

    warnings.filterwarnings("ignore", message="This DataLoader will create")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    before_setup = evict_files(setup.files)
    t0 = time.perf_counter()
    loader, consume = setup.prepare()
    setup_seconds = time.perf_counter() - t0
    peak = tree_pss() if memory else 0
    gc.collect()
    before_epoch1 = evict_files(setup.files)
    epoch_s: list[float] = []
    batches: list[int] = []
    for _ in range(epochs):
        seconds, n, epoch_peak = _consume_epoch(loader, consume, memory)
        epoch_s.append(seconds)
        batches.append(n)
        peak = max(peak, epoch_peak)
    return {
        "setup_s": setup_seconds,
        "parts_s": dict(setup.parts),
        "epoch_s": epoch_s,
        "total_s": setup_seconds + sum(epoch_s),
        "batches": batches,
        "peak_pss_bytes": peak if memory else None,
        "eviction": {"before_setup": before_setup, "before_epoch1": before_epoch1},
        "info": dict(setup.info),
    }


def child_main(cells: dict[str, Callable[[dict], Setup]], payload: str) -> int:
    """The child's entry point: build the cell, run it, print one JSON line."""
    spec = json.loads(payload)
    setup = cells[spec["cell"]](spec["params"])
    result = run_setup(setup, spec["epochs"], spec["memory"])
    sys.stdout.flush()
    print("\n" + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of workers/threads: the result is out


# ------------------------------------------------------------------------------------------ parent side


def base_env() -> dict[str, str]:
    """This environment without allocator settings, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def env_for_allocator(allocator: str) -> dict[str, str]:
    """The environment a run with ``allocator`` starts with (a preload only exists from the start)."""
    from autotune.recipe._process import PRELOAD_ALLOCATORS, ProcessSettings, launch_env

    if allocator not in PRELOAD_ALLOCATORS:
        return base_env()
    env, notes = launch_env(ProcessSettings(allocator=allocator), base_env())
    if notes:
        print(f"note: {'; '.join(notes)}", file=sys.stderr)
    return env


class RunFailed(RuntimeError):
    pass


def run_fresh(script: str | Path, cell: str, params: dict, *, epochs: int, memory: bool = False,
              env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    """Run one cell of ``script`` in a fresh Python process and return what it measured."""
    payload = json.dumps({"cell": cell, "params": params, "epochs": epochs, "memory": memory})
    out = subprocess.run([sys.executable, str(script), "--cell", payload], env=env or base_env(),
                         capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    lines = [line for line in out.stdout.strip().splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RunFailed(f"{cell} failed (exit {out.returncode}):\n{tail}")
    return json.loads(lines[-1])


def interleaved(runs: dict[str, Callable[[], dict]], repeats: int, log: Callable[[str], None] | None = None
                ) -> dict[str, list[dict]]:
    """Call each run ``repeats`` times, interleaved: A B C A B C ...; failures are recorded, not raised."""
    out: dict[str, list[dict]] = {name: [] for name in runs}
    for rep in range(repeats):
        for name, fn in runs.items():
            try:
                result = fn()
            except (RunFailed, subprocess.TimeoutExpired) as exc:
                result = {"failed": str(exc)}
            out[name].append(result)
            if log:
                log(f"{name} #{rep + 1}: " + describe_run(result))
    return out


def describe_run(result: dict) -> str:
    if "failed" in result:
        return "FAILED " + result["failed"].splitlines()[0]
    epochs = " ".join(f"{s:.2f}" for s in result["epoch_s"])
    return f"setup {result['setup_s']:.2f} s, epochs {epochs} s, total {result['total_s']:.2f} s"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ summaries


def spread(values: list[float]) -> dict[str, Any] | None:
    """Median with min and max, or None without values."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def summarise_runs(runs: list[dict], memory_run: dict | None = None) -> dict[str, Any]:
    """Per-column median (min-max) over the repeats of one configuration."""
    ok = [r for r in runs if "failed" not in r]
    out: dict[str, Any] = {"repeats": len(runs), "failed": [r["failed"] for r in runs if "failed" in r]}
    if not ok:
        return out
    epochs = len(ok[0]["epoch_s"])
    out["epoch_s"] = [spread([r["epoch_s"][e] for r in ok]) for e in range(epochs)]
    out["setup_s"] = spread([r["setup_s"] for r in ok])
    out["total_s"] = spread([r["total_s"] for r in ok])
    steady = [statistics.median(r["epoch_s"][1:]) for r in ok] if epochs > 1 else []
    out["first_over_steady"] = spread([r["epoch_s"][0] / s for r, s in zip(ok, steady) if s > 0])
    out["runs"] = runs
    if memory_run is not None:
        out["peak_pss_bytes"] = memory_run.get("peak_pss_bytes")
        out["memory_run"] = memory_run
    return out


def fmt(s: dict | None, digits: int = 2) -> str:
    """"median (min–max)", or "–"."""
    if not s:
        return "–"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def fmt_bytes(n: float | None) -> str:
    if not n:
        return "–"
    return f"{n / 2**20:,.0f} MiB"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(name: str, payload: dict[str, Any], output: str | Path | None = None) -> Path:
    """Write ``payload`` (plus date and machine facts) atomically to benchmarks/results/<name>.json."""
    path = Path(output) if output else RESULTS / f"{name}.json"
    data = {"benchmark": name, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_facts(), **payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def parser(doc: str, name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script, not a result")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats of each configuration")
    p.add_argument("--output", default=None, help=f"JSON path (default benchmarks/results/{name}.json)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--cell", help=argparse.SUPPRESS)
    return p


def workdir(path: str | None, name: str) -> Path:
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))


# ------------------------------------------------------------------------------------------ recipes


def profile_for(config: Any, *, batch_size: int, epochs: int, source: str) -> Any:
    """A recipe Profile for an arbitrary LoaderConfig (the oracle's point), so it runs through the same factory."""
    from autotune.machine import _hardware as hardware
    from autotune.recipe._file import Profile

    return Profile(hardware=hardware.collect(), dataset={"source": source},
                   settings={"batch_size": batch_size, "epochs": epochs}, config=config, measured={})


def recipe_setup(profile_dict: dict, dataset_fn: Callable[[], Any], files_fn: Callable[[Any], set[str]], *,
                 cache_dir: str, collate_fn: Callable | None = None,
                 consumer: Callable[[Any], Callable[[Any], Any]] | None = None) -> Setup:
    """A cell that builds its loader with ``Recipe.dataloader`` (cache built on first use, timed).

    ``consumer(config)`` gives the consumer of each batch (default: autotune's own, a device copy).
    """
    from autotune._api import Recipe
    from autotune.recipe._file import Profile

    profile = Profile.from_dict(profile_dict)
    dataset = dataset_fn()

    def prepare():
        import torch
        from autotune._loader import DeviceConsumer

        recipe = Recipe(profile)
        kwargs: dict[str, Any] = {"shuffle": True, "generator": torch.Generator().manual_seed(SEED)}
        if collate_fn is not None:
            kwargs["collate_fn"] = collate_fn
        loader = recipe.dataloader(dataset, cache_dir=cache_dir, progress=False, **kwargs)
        consume = consumer(recipe.config) if consumer is not None else DeviceConsumer(recipe.config.pin_memory)
        return loader, consume

    return Setup(files=files_fn(dataset), prepare=prepare,
                 info={"config": Recipe(profile).config.describe(), "allocator": profile.config.allocator})



# ------------------------------------------------------------------------------------------ search, grid


def autotune_search(spec: Any, *, budget: float, workdir: Path, **options: Any) -> tuple[Any, Any, dict]:
    """Run autotune's own search in-process; return (recipe, outcome, timing) with the wall time."""
    from autotune._api import search_spec
    from autotune.tuner._study import SearchOptions

    opts = SearchOptions(budget=budget, workdir=workdir / ".autotune", progress=False, **options)
    started_wall = time.time()
    t0 = time.perf_counter()
    recipe, outcome = search_spec(spec, opts, workdir / "autotune.json")
    wall = time.perf_counter() - t0
    return recipe, outcome, {"wall_s": wall, "started_epoch_s": started_wall, "budget_s": budget}


def reduced_space(max_workers: int, *, has_train_step: bool = False) -> Any:
    """The oracle's grid: workers 0..max_workers x persistent x prefetch {2, 4} x every cache backend x
    allocator {glibc, glibc-tuned}; fork workers with one thread (main threads 1..CPUs with a train_step)."""
    from autotune.machine._cpus import usable_cpus
    from autotune.tuner._space import Space

    cpus = usable_cpus()
    return Space(max_workers=max_workers, contexts=("fork",), prefetch_factors=(2, 4), worker_threads=(1,),
                 main_threads=tuple(range(1, cpus + 1)) if has_train_step and cpus > 1 else (),
                 caches=(None, "memory", "pickle", "hdf5", "lmdb"), allocators=("glibc", "glibc-tuned"))


def workload_for(spec: Any, outcome: Any) -> Any:
    from autotune.tuner._measure import Workload

    return Workload(dataset=spec.dataset, batch_size=spec.batch_size, epochs=spec.epochs,
                    collate_fn=spec.collate_fn, transform=spec.transform, train_step=spec.train_step,
                    fingerprint=outcome.probe.fingerprint)


def evaluate_points(spec: Any, outcome: Any, configs: list[Any], log: Callable[[str], None] | None = None,
                    label: str = "grid") -> list[dict]:
    """Measure each LoaderConfig with ``Runner.run`` on the search's own plan (the measurement autotune uses)."""
    from autotune.machine._memory import default_budget
    from autotune.tuner._runner import Runner, TrialFailed

    runner = Runner(workload_for(spec, outcome), spec.sys_path, memory_limit=default_budget())
    plan = outcome.plan
    out = []
    for i, config in enumerate(configs):
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"config": config.to_json(), "describe": config.describe()}
        try:
            result = runner.run(config, plan, timeout=plan.batch_timeout)
            entry["value"] = result["prediction"]["total_seconds"]
            entry["prediction"] = result["prediction"]
        except TrialFailed as exc:
            entry["failed"] = str(exc)
        entry["duration_s"] = time.perf_counter() - t0
        out.append(entry)
        if log:
            figure = f"{entry['value']:.2f} s" if "value" in entry else entry["failed"]
            log(f"{label} {i + 1}/{len(configs)}: {config.describe()} -> {figure} ({entry['duration_s']:.1f} s)")
    return out


def grid_points(space: Any, quick: bool) -> list[Any]:
    """Every point of ``space``; in --quick mode the first and the last (a smoke test, not an oracle)."""
    points = space.grid()
    if quick:
        points = [points[0], points[-1]]
    return points


def best_point(evaluated: list[dict]) -> dict | None:
    done = [e for e in evaluated if "value" in e]
    return min(done, key=lambda e: e["value"]) if done else None


def study_trials(outcome: Any) -> list[dict]:
    """The search's trials, in order: state, value, start/complete times (epoch seconds), duration, config."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=outcome.study["name"], storage=outcome.study["storage"])
    rows = []
    for t in study.trials:
        rows.append({
            "number": t.number, "state": t.state.name, "value": t.value,
            "start": t.datetime_start.timestamp() if t.datetime_start else None,
            "complete": t.datetime_complete.timestamp() if t.datetime_complete else None,
            "duration_s": t.duration.total_seconds() if t.duration else None,
            "repeat": bool(t.user_attrs.get("repeat")), "config": t.user_attrs.get("config"),
        })
    return rows


class SleepConsumer:
    """An accelerator's step emulated as a fixed compute time per batch (the MLPerf Storage method).

    Defined here, at module level, so it pickles into autotune's trial processes as a ``train_step``.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch: Any) -> None:
        time.sleep(self.seconds)
