"""adapt=True against the fixed recipe and the best point of a small grid, under the real step.

Four scenarios, each on a synthetic CPU-decoded dataset (each sample a few ms of numpy work in the
loader) and a CPU-heavy training step (torch matmuls on the main process's threads, competing with the
workers for the cores):

1. ``mismatch``: the recipe was searched with a cheap step (a real ``autotune.search`` with a 1 ms step;
   ``--quick``: the usual advice stands for it); the training runs the heavy step.
2. ``competitor``: a busy process per half of the usable CPUs starts at the middle epoch.
3. ``phase``: the step is three times heavier from epoch 5 (``--quick``: from the middle epoch).
4. ``no_regret``: the recipe is the grid's best for the real step.

Rows per scenario: the fixed recipe, ``adapt=True`` starting from it, and the grid's best (each grid
point measured once, in a fresh process, under the scenario; the best then re-measured). Every run is a
fresh process; the rows are interleaved (A B C A B C ...); the figure is the whole run's wall time
(loader built, every epoch, the step). Regret: adapt's total over the grid best's and over the recipe's.
``no_regret`` runs under ``mismatch``'s conditions (the same steady step), so it takes that grid; its
recipe is the grid's best, so its "grid best" row is its "fixed recipe" runs (one configuration).

The full run on 2 CPUs: a 60 s search, then 3 grid points x 3 scenarios and 3 rows x 3 repeats x 3
scenarios plus 2 x 3 for ``no_regret``: 42 fresh runs of 8 epochs of 60 batches (a step of 25-37 ms on a
quiet 2-CPU machine, estimated: 12-18 s a run), 11-15 minutes in all; it says its plan as it starts.

    python benchmarks/adapt.py [--quick] [--scenarios mismatch phase ...] [--repeats 3] [--epochs 8]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from harness import BENCHMARKS, SEED, machine, output
from harness.adapt_workload import Decoded, cheap_step, step
from harness.fresh import RunFailed, run_fresh
from harness.recipes import autotune_search, profile_for
from harness.stats import interleaved, ok, spread

from autotune._api import Recipe
from autotune.config import LoaderConfig, usual_advice
from autotune.machine import usable_cpus
from autotune.recipe._file import Profile

NAME = "adapt"
SCENARIOS = ("mismatch", "competitor", "phase", "no_regret")
BATCH = 16


def competitors(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


# ---------------------------------------------------------------------------- the fresh process

def cell(params: dict[str, Any]) -> dict[str, Any]:
    """One run: the loader through the factory (adapting or not), ``epochs`` epochs of the scenario's step."""
    p = params
    profile = Profile.from_dict(profile_for(LoaderConfig.from_json(p["config"]), batch_size=BATCH,
                                            epochs=p["epochs"], source="benchmarks/adapt.py").to_dict())
    folder = Path(tempfile.mkdtemp(prefix="adapt-run-"))
    recipe = Recipe(profile, folder / "autotune.json")  # a run's own file: what it learns is not the next run's
    dataset = Decoded(p["samples"], p["work"])
    started = time.perf_counter()
    loader = recipe.dataloader(dataset, adapt=bool(p["adapt"]), shuffle=True,
                               generator=torch.Generator().manual_seed(SEED), progress=False)
    setup = time.perf_counter() - started
    busy: list[subprocess.Popen[bytes]] = []
    epoch_s, configs = [], []
    try:
        for epoch in range(p["epochs"]):
            if p["scenario"] == "competitor" and epoch == p["epochs"] // 2:
                busy = competitors(max(1, usable_cpus() // 2))
            heavy = p["scenario"] == "phase" and epoch >= p["phase_epoch"]
            rounds = p["step_rounds"] * (3 if heavy else 1)
            configs.append(getattr(loader, "config", None) and loader.config.describe())
            t0 = time.perf_counter()
            for batch in loader:
                step(batch, rounds)
            epoch_s.append(time.perf_counter() - t0)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    history = [{"epoch": e.epoch, "decision": e.decision, "line": e.line, "seconds_per_batch": e.seconds_per_batch,
                "stall": e.stall} for e in getattr(loader, "history", None).events] if p["adapt"] else []
    return {"setup_s": setup, "epoch_s": epoch_s, "total_s": setup + sum(epoch_s), "configs": configs,
            "history": history}


# ---------------------------------------------------------------------------- the parent

def grid(max_workers: int, quick: bool) -> list[LoaderConfig]:
    """The small grid: workers 0, 1, half and all the usable CPUs (persistent); beyond 2 CPUs, prefetch 4 at
    the most workers too."""
    counts = sorted({0, 1, max_workers // 2, max_workers}) if not quick else sorted({0, max_workers})
    points = [usual_advice(n, context="fork") for n in counts]
    if max_workers > 2 and not quick:
        points.append(usual_advice(max_workers, context="fork").refit(prefetch_factor=4))
    return points


def measure_grid(run: Any, scenario: str, max_workers: int, quick: bool) -> list[dict[str, Any]]:
    """Each grid point once under ``scenario`` (a failed point: None)."""
    evaluated = []
    for point in grid(max_workers, quick):
        try:
            total = run(point, False)["total_s"]
        except (RunFailed, subprocess.TimeoutExpired) as exc:
            total = None
            output.say(f"{scenario} grid {point.describe()} failed: {exc}")
        evaluated.append({"config": point.to_json(), "total_s": total})
        output.say(f"{scenario} grid {point.describe()}: {total}")
    return evaluated


GRID_OF = {"no_regret": "mismatch"}  # a scenario run under another's conditions takes its grid


def searched_recipe(args: Any, work: Path, max_workers: int) -> tuple[LoaderConfig, dict[str, Any]]:
    """The recipe of scenario 1: a real search under a cheap step (``--quick``: the usual advice)."""
    if args.quick:
        return usual_advice(max_workers, context="fork"), {"note": "--quick: the usual advice, no search"}
    from autotune.dataset import UserSpec

    spec = UserSpec(dataset=Decoded(args.samples, args.work), source=str(BENCHMARKS / "harness/adapt_workload.py"),
                    batch_size=BATCH, epochs=args.epochs, train_step=cheap_step, sys_path=[str(BENCHMARKS)])
    recipe, _, timing = autotune_search(spec, budget=args.budget, workdir=work / "search")
    return recipe.config, {**timing, "config": recipe.config.to_json(), "describe": recipe.config.describe()}


def scenario_result(run: Any, scenario: str, recipe: LoaderConfig, evaluated: list[dict[str, Any]],
                    repeats: int) -> dict[str, Any]:
    """The fixed recipe, adapt=True from it and the best of the grid ``evaluated`` (under ``scenario``'s
    conditions), interleaved; ``run(config, adapt)`` is one fresh-process run. Where the recipe is the grid's
    best (``no_regret``), its runs are the grid best's row too."""
    best = min((e for e in evaluated if e["total_s"] is not None), key=lambda e: e["total_s"])
    best_config = LoaderConfig.from_json(best["config"])
    fixed = best_config if scenario == "no_regret" else recipe
    rows = {"fixed recipe": partial(run, fixed, False), "adapt=True": partial(run, fixed, True)}
    if fixed != best_config:
        rows["grid best"] = partial(run, best_config, False)
    measured = interleaved(rows, repeats, output.say)
    measured.setdefault("grid best", measured["fixed recipe"])  # one configuration, measured once
    totals = {name: spread([r["total_s"] for r in ok(rs)]) for name, rs in measured.items()}

    def ratio(a: str, b: str) -> float | None:
        ta, tb = totals[a], totals[b]
        return ta["median"] / tb["median"] if ta and tb else None

    return {"fixed": fixed.to_json(), "grid": {"points": len(evaluated), "evaluated": evaluated, "best": best},
            "rows": measured, "totals": totals, "adapt_over_best": ratio("adapt=True", "grid best"),
            "adapt_over_fixed": ratio("adapt=True", "fixed recipe")}


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--samples", type=int, default=960)
    p.add_argument("--work", type=int, default=6, help="rounds of numpy work per sample")
    p.add_argument("--step-rounds", type=int, default=40, help="matmuls per training step")
    p.add_argument("--budget", type=float, default=60.0, help="scenario 1's search, seconds")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(cell(json.loads(args.cell)["params"])))
        sys.stdout.flush()
        os._exit(0)  # no exit hooks: the run is measured, not its teardown
    if args.quick:
        args.epochs, args.samples, args.work, args.step_rounds = 4, 64, 1, 2
    repeats = args.repeats or (1 if args.quick else 3)
    started = time.perf_counter()
    work = output.workdir(args.workdir, NAME)
    max_workers = usable_cpus()
    # the phase: the step three times heavier from the 5th epoch (0-based 4) where there are enough after it
    base = {"epochs": args.epochs, "samples": args.samples, "work": args.work, "step_rounds": args.step_rounds,
            "phase_epoch": 4 if args.epochs >= 7 else args.epochs // 2}

    def run(scenario: str, config: LoaderConfig, adapt: bool) -> dict[str, Any]:
        params = {**base, "scenario": scenario, "config": config.to_json(), "adapt": adapt}
        return run_fresh(__file__, scenario, params, epochs=args.epochs, timeout=900)

    conditions_run = {GRID_OF.get(s, s) for s in args.scenarios}
    planned = len(conditions_run) * len(grid(max_workers, args.quick)) + sum(
        repeats * (2 if s == "no_regret" else 3) for s in args.scenarios)
    searching = not args.quick and any(s != "no_regret" for s in args.scenarios)  # no_regret's recipe is the grid's
    output.say(f"adapt: {planned} fresh runs of {args.epochs} epochs of {args.samples} samples"
               + (f", after a {args.budget:g} s search" if searching else ""))
    recipe, search = (searched_recipe(args, work, max_workers) if searching or args.quick
                      else (usual_advice(max_workers, context="fork"), {"note": "no_regret alone: no search"}))
    grids: dict[str, list[dict[str, Any]]] = {}
    results: dict[str, Any] = {}
    rows = []
    for scenario in args.scenarios:
        conditions = GRID_OF.get(scenario, scenario)
        if conditions not in grids:
            grids[conditions] = measure_grid(partial(run, conditions), conditions, max_workers, args.quick)
        results[scenario] = r = scenario_result(partial(run, conditions), scenario, recipe, grids[conditions],
                                                repeats)
        r["conditions"] = conditions
        totals = r["totals"]
        rows.append([scenario, LoaderConfig.from_json(r["fixed"]).describe(),
                     LoaderConfig.from_json(r["grid"]["best"]["config"]).describe(),
                     output.fmt(totals["fixed recipe"]), output.fmt(totals["adapt=True"]),
                     output.fmt(totals["grid best"]),
                     f"{r['adapt_over_best']:.3f}" if r["adapt_over_best"] else "–",
                     f"{r['adapt_over_fixed']:.3f}" if r["adapt_over_fixed"] else "–"])
    table = output.markdown_table(["scenario", "fixed recipe", "grid best", "fixed s", "adapt=True s", "grid best s",
                                   "adapt ÷ best", "adapt ÷ fixed"], rows)
    notes = [f"{args.samples} samples of {args.work} numpy rounds, batch {BATCH}, {args.epochs} epochs, a step of "
             f"{args.step_rounds} 256x256 matmuls; whole-run wall seconds, median (min–max) of {repeats} "
             "interleaved fresh processes; the goal: adapt ÷ best ≤ 1.10, and ≤ 1.03 of the fixed run in no_regret.",
             "no_regret runs under mismatch's conditions and takes its grid; its recipe is the grid's best, so its "
             "grid best row is its fixed recipe runs."]
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": repeats, "epochs": args.epochs, "samples": args.samples, "batch_size": BATCH,
        "search": search, "scenarios": results}, machine=machine.facts())


if __name__ == "__main__":
    sys.exit(main())
