"""adapt=True against the fixed recipe and the best point of a small grid, under the real step.

The workload: a CPU-decoded dataset with a random augmentation per sample (each sample ~0.6-0.8 ms of numpy
work in the loader, estimated, then a flip and noise drawn from torch's generator) and a CPU-heavy training step
(torch matmuls on the main process's threads, competing with the workers for the cores). The augmentation
makes the samples uncachable (autotune refuses to cache a sample that draws randomness): a memory cache of
deterministic samples would make every worker count alike after the first epoch, and no worker count or
thread split could then be a mismatch. Four scenarios:

1. ``mismatch``: the recipe was searched under a proxy: no training step at all (a dataset file that
   declares none, the common case, measures the loader alone); the training runs the heavy step. Under
   the proxy decoding is all there is (10-13 ms of CPU a batch, estimated), so all the usable CPUs' workers
   win (~2x on 2 CPUs, estimated); the proxy gives the thread split nothing to measure, so torch's threads
   stay. The heavy step's two main threads then share both cores with two decoding workers, and each of
   its parallel matmuls waits for the thread a worker pre-empted: the last quiet grid (2026-12-02, the
   same workload) had 2 workers with torch's threads at 1.24x the best (2 workers, one main thread; or
   no workers, decoding between the steps on the step's cores): fewer workers, or fewer main threads,
   win. The proxy's recipe is measured here, not guessed: workers 0, 1 and all the usable CPUs
   (persistent), each once in a fresh process under the proxy, the fastest taken, the rest of the
   searched recipe kept (``proxy`` in the JSON). Whether the mismatch holds on the machine is the grid's
   to say: ``recipe_is_best`` in the JSON, "the recipe" in the table's grid best column.
2. ``competitor``: a busy process per half of the usable CPUs starts at the middle epoch.
3. ``phase``: the step is three times heavier from epoch 5 (``--quick``: from the middle epoch).
4. ``no_regret``: the recipe is the grid's best for the real step (under ``mismatch``'s conditions, so it
   takes that grid; its "grid best" row is its "fixed recipe" runs: one configuration).

Scenarios 2 and 3 start from the recipe of a real ``autotune.search`` under a cheap step (16 small ops,
1-2 ms; ``--quick``: the usual advice stands for it).

The grid is what adapt=True can move between from the recipe: workers 0, 1, half and all the usable CPUs
(and the recipe's own count) x the main process's threads as the recipe sets them and the other split
(one thread, or torch's own where the recipe sets one); beyond 2 CPUs also the most workers with prefetch
doubled. What adapt cannot change (cache, allocator, cache fill) and the rest of the recipe (prefetch,
persistence, start method, worker threads) are held at the recipe's, so the recipe's own point is always in
it and "grid best" is the best fixed configuration adapt could have reached. ``--quick``: the cross
through the recipe's point (workers 0 and all, the other split at the recipe's workers), not the product.
Every run takes the recipe's profile with the configuration replaced and applies the configuration's process
settings (main threads, allocator) as the factory does for a recipe with a measured gain, so each point runs
as it reads and the adapting run starts where the fixed recipe runs (without a gain, ``--quick``, the factory
would leave torch's threads). Every timing figure here, the estimates above included, needs a quiet machine.

Rows per scenario: the fixed recipe, ``adapt=True`` starting from it, and the grid's best (each grid point
measured once, in a fresh process, under the scenario; the best then re-measured). Every run is a fresh
process; the rows are interleaved (A B C A B C ...); the figure is the whole run's wall time (loader built,
every epoch, the step). Regret (``regret``): adapt ÷ grid best and adapt ÷ fixed over the interleaved
pairs, median (min–max), and the issue's bound: where the recipe is the grid's best (``no_regret``, or a
scenario whose grid found nothing faster), adapt within 3% of the fixed run; otherwise within 10% of the
grid best. The verdict is "met" when every pair is within the bound, "not met" when none is, and "tie
within noise" when the pairs fall on both sides.

How many epochs: adaptation pays only over a run long enough to amortise what finding the better
configuration costs. Reaching it takes the warm-up, one epoch of the incumbent and about one epoch a kept
move (a rejected one costs a quarter of an epoch, its probe), so ~2.5 epochs run at the recipe's speed: a
recipe 1.4x the best's time gives adapt 1 + 2.5 x 0.4 / E of it, within 10% from E = 10; the competitor,
from the middle epoch, costs one more epoch to see the drift. Hence 12 epochs (the phase change at the
5th, the competitor at the 7th).

How long: by time, not by a sample count. A try is afforded only while the exploration ledger stays
within 2% of the run so far (the policy's rule 5), and a move to another pool is priced at two switches
and a start-up at least (tenths of a second on 2 CPUs: the last quiet run measured 0.28-0.31 s for its
first, before the price left out the restart a non-persistent pool pays anyway; the loaded AMD EPYC VM,
0.19 s a start-up and the switches assumed at 0.1 s each): a run of 6-12 s, 2% = 0.12-0.24 s, never
afforded one. ``--seconds`` (default 60) is each run's length under its scenario's step as the run starts
(the recipe's rate before a competitor or a phase change, which then lengthen it): a calibration run of the
scenario's recipe (2 epochs, a fresh process) measures its seconds per sample, and the epochs take the
samples that make 12 of them ``--seconds``. At 60 s, 5 s an epoch, a 0.4 s pool move and its probe fit 2%
of the run from the end of its 5th epoch, a thread move (its probe alone) from the 2nd; once a switch is
measured (the assumed 0.1 s each is on the high side), a pool move at an epoch's end from a non-persistent
recipe (~0.25 s) from the 4th. A pool move after the first epoch or two would take ~150 s runs: hours.
``--samples`` states the epoch's samples instead (no calibration).

The full run on 2 CPUs at the default: a 60 s search and 3 proxy runs (the loader alone, 512 samples), 2
calibration runs, then 6-7 grid points x 3 conditions and 3 rows x 3 repeats x 3 scenarios plus 2 x 3 for
``no_regret``: ~55 fresh runs of ~60 s (the phase's and the competitor's longer), about 75-90 minutes on a
quiet 2-CPU machine (estimated; it says its plan and the estimate after the calibration). ``--seconds 15``
fits ~20 minutes and is the old size again: no pool move affordable. ``--scenarios`` runs only some
(``no_regret`` reuses ``mismatch``'s grid).

    python benchmarks/adapt.py [--quick] [--scenarios mismatch phase ...] [--repeats 3] [--epochs 12]
                               [--seconds 60 | --samples 512] [--start '{"num_workers": 0}']
"""

from __future__ import annotations

import dataclasses
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
from harness.adapt_workload import Augmented, cheap_step, step
from harness.fresh import RunFailed, run_fresh
from harness.recipes import autotune_search, profile_for, search_record
from harness.stats import interleaved, ok, paired_ratio, spread, verdict

from autotune._api import Recipe
from autotune.config import LoaderConfig, usual_advice
from autotune.errors import RecipeError
from autotune.machine import usable_cpus
from autotune.process import apply_at_runtime
from autotune.recipe._adapt_policy import MIN_BATCHES
from autotune.recipe._file import Profile

NAME = "adapt"
SCENARIOS = ("mismatch", "competitor", "phase", "no_regret")
BATCH = 16
NO_REGRET, NEAR_BEST = 1.03, 1.10  # the bounds on adapt's whole run
FIXED_SAMPLES = 512  # the proxy's runs, the search's dataset and a calibration's (32 batches an epoch)
LEAST_SAMPLES = 512  # a calibrated epoch's least: a probe of 8 batches, a chunk of 4


def competitors(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


# ---------------------------------------------------------------------------- the fresh process

def cell(params: dict[str, Any]) -> dict[str, Any]:
    """One run: the loader through the factory (adapting or not), ``epochs`` epochs of the scenario's step."""
    p = params
    config = LoaderConfig.from_json(p["config"])
    profile = dataclasses.replace(Profile.from_dict(p["profile"]), config=config)
    folder = Path(tempfile.mkdtemp(prefix="adapt-run-"))
    recipe = Recipe(profile, folder / "autotune.json")  # a run's own file: what it learns is not the next run's
    dataset = Augmented(p["samples"], p["work"])
    # The configuration's process settings (main threads, allocator at run time) as the factory applies them
    # for a recipe with a measured gain (then this changes nothing): without one (--quick) the factory would
    # leave them, and a grid point or an adapting start with main_threads=1 would run torch's threads. Applied
    # as autotune's own, so an adapting loader may still move the split.
    applied = apply_at_runtime(dataclasses.replace(config.process_settings(), worker_threads=None))
    started = time.perf_counter()
    loader = recipe.dataloader(dataset, adapt=bool(p["adapt"]), shuffle=True,
                               generator=torch.Generator().manual_seed(SEED), progress=False)
    setup = time.perf_counter() - started
    busy: list[subprocess.Popen[bytes]] = []
    epoch_s, configs, threads = [], [], []
    try:
        for epoch in range(p["epochs"]):
            if p["scenario"] == "competitor" and epoch == p["epochs"] // 2:
                busy = competitors(max(1, usable_cpus() // 2))
            heavy = p["scenario"] == "phase" and epoch >= p["phase_epoch"]
            rounds = 0 if p["scenario"] == "proxy" else p["step_rounds"] * (3 if heavy else 1)
            configs.append(loader.config.describe() if p["adapt"] else None)
            t0 = time.perf_counter()
            for k, batch in enumerate(loader):
                if k == 0:  # the split this epoch runs under (adapt's moves set it as the epoch starts)
                    threads.append(torch.get_num_threads())
                step(batch, rounds)
            epoch_s.append(time.perf_counter() - t0)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    history = [{"epoch": e.epoch, "decision": e.decision, "line": e.line, "seconds_per_batch": e.seconds_per_batch,
                "stall": e.stall} for e in loader.history.events] if p["adapt"] else []
    # the adapting loader's own ledger (its rule 5): the run's wall over the incumbent's, as it measured it
    ledger = {"spent_s": loader.policy.spent_seconds, "seen_s": loader.policy.seen_seconds,
              "try_costs_s": loader.policy.try_costs, "start_up_s": loader.policy.start_up,
              "switch_s": loader.policy.switch_seconds} if p["adapt"] else None
    return {"setup_s": setup, "epoch_s": epoch_s, "total_s": setup + sum(epoch_s), "configs": configs,
            "main_threads": threads, "applied_before": applied.applied, "history": history, "ledger": ledger}


# ---------------------------------------------------------------------------- the parent

def grid(recipe: LoaderConfig, max_workers: int, quick: bool) -> list[LoaderConfig]:
    """The fixed configurations adapt=True can move between from ``recipe`` (module docstring), the recipe's
    own point first. A point with workers where the recipe has none takes them as adapt's move does
    (persistent)."""
    counts = sorted({0, 1, max_workers // 2, max_workers, recipe.num_workers} if not quick
                    else {0, max_workers, recipe.num_workers})
    other = 1 if recipe.main_threads != 1 else None
    splits = [recipe.main_threads] + ([other] if max_workers > 1 else [])

    def point(workers: int, main: int | None) -> LoaderConfig:
        return recipe.refit(num_workers=workers, main_threads=main,
                            persistent_workers=recipe.persistent_workers or not recipe.num_workers)

    pairs = ([(n, m) for m in splits for n in counts] if not quick
             else [(n, recipe.main_threads) for n in counts] + [(recipe.num_workers, m) for m in splits[1:]])
    points = [recipe] + [point(n, m) for n, m in pairs]
    if max_workers > 2 and not quick:
        points.append(point(max_workers, recipe.main_threads).refit(
            prefetch_factor=2 * (recipe.prefetch_factor or 2)))
    return list(dict.fromkeys(points))  # the recipe's point once, first


def measure_grid(run: Any, scenario: str, points: list[LoaderConfig]) -> list[dict[str, Any]]:
    """Each grid point once under ``scenario`` (a failed point: None)."""
    evaluated = []
    for point in points:
        try:
            total = run(point, False)["total_s"]
        except (RunFailed, subprocess.TimeoutExpired) as exc:
            total = None
            output.say(f"{scenario} grid {point.describe()} failed: {exc}")
        evaluated.append({"config": point.to_json(), "total_s": total})
        output.say(f"{scenario} grid {point.describe()}: {total}")
    return evaluated


GRID_OF = {"no_regret": "mismatch"}  # a scenario run under another's conditions takes its grid
PROXIED = ("mismatch", "no_regret")  # the scenarios that start from the proxy's recipe (no_regret: its grid's best)


def proxy_recipe(run: Any, recipe: LoaderConfig, max_workers: int) -> tuple[LoaderConfig, dict[str, Any]]:
    """Scenario 1's recipe (module docstring): the fastest of workers 0, 1 and ``max_workers`` (persistent),
    torch's threads and the rest of ``recipe``, each run once in a fresh process by ``run(config)`` under
    the proxy (no step)."""
    evaluated = []
    for n in sorted({0, 1, max_workers}):
        point = recipe.refit(num_workers=n, main_threads=None, persistent_workers=bool(n),
                             prefetch_factor=(recipe.prefetch_factor or 2) if n else None)
        try:
            total = run(point)["total_s"]
        except (RunFailed, subprocess.TimeoutExpired) as exc:
            total = None
            output.say(f"proxy {point.describe()} failed: {exc}")
        output.say(f"proxy {point.describe()}: {total}")
        evaluated.append({"config": point.to_json(), "total_s": total})
    timed = [e for e in evaluated if e["total_s"] is not None]
    if not timed:
        raise SystemExit("adapt: every proxy run failed: no recipe for the mismatch scenario")
    best = min(timed, key=lambda e: e["total_s"])
    return LoaderConfig.from_json(best["config"]), {"evaluated": evaluated, "best": best}


def searched_recipe(args: Any, work: Path, max_workers: int) -> tuple[Profile, dict[str, Any]]:
    """The recipe of scenario 1: a real search under a cheap step (``--quick``: the usual advice)."""
    if args.start:  # a stated recipe: the same starting point for runs to be compared (before/after a change)
        try:
            config = LoaderConfig.from_json(json.loads(args.start))
        except (ValueError, TypeError, RecipeError) as exc:
            output.say(f"adapt: --start is not a LoaderConfig's JSON ({exc}): pass e.g. "
                       '\'{"num_workers": 0}\'')
            raise SystemExit(2) from None
        return profile_for(config, batch_size=BATCH, epochs=args.epochs, source="benchmarks/adapt.py"), {
            "note": f"--start: {config.describe()}, no search"}
    if args.quick:
        advice = profile_for(usual_advice(max_workers, context="fork"), batch_size=BATCH, epochs=args.epochs,
                             source="benchmarks/adapt.py")
        return advice, {"note": "--quick: the usual advice, no search"}
    from autotune.dataset import UserSpec

    spec = UserSpec(dataset=Augmented(args.samples or FIXED_SAMPLES, args.work),
                    source=str(BENCHMARKS / "harness/adapt_workload.py"), batch_size=BATCH, epochs=args.epochs,
                    train_step=cheap_step, sys_path=[str(BENCHMARKS)])
    recipe, outcome, timing = autotune_search(spec, budget=args.budget, workdir=work / "search")
    return recipe.profile, search_record(recipe, outcome, timing)


def sized(seconds_per_sample: float, seconds: float, epochs: int) -> int:
    """The samples of an epoch that make ``epochs`` of them ``seconds`` at ``seconds_per_sample``: whole
    batches, at least ``LEAST_SAMPLES``."""
    batches = round(seconds / epochs / (seconds_per_sample * BATCH))
    return max(LEAST_SAMPLES, BATCH * batches)


def calibrate(run: Any, recipe: LoaderConfig, seconds: float, epochs: int) -> tuple[int, dict[str, Any]]:
    """The samples of an epoch that make ``epochs`` of them ``seconds`` for ``recipe`` under the step as the run
    starts: ``run(config, samples)`` runs 2 epochs of ``FIXED_SAMPLES`` in a fresh process, and the second's
    seconds per sample (the first warms up) sets it."""
    measured = run(recipe, FIXED_SAMPLES)
    per_sample = measured["epoch_s"][-1] / FIXED_SAMPLES
    samples = sized(per_sample, seconds, epochs)
    return samples, {"config": recipe.to_json(), "epoch_s": measured["epoch_s"], "seconds_per_sample": per_sample,
                     "samples": samples}


def regret(totals: dict[str, list[float | None]], recipe_is_best: bool) -> dict[str, Any]:
    """adapt ÷ grid best and adapt ÷ fixed over the interleaved pairs of ``totals`` (each row's whole-run
    seconds per repeat, None for a failed run), and the issue's goal with the verdict the pairs support:
    within 3% of the fixed run where the recipe is the grid's best, else within 10% of the grid best."""
    over_best = paired_ratio(totals["adapt=True"], totals["grid best"])
    over_fixed = paired_ratio(totals["adapt=True"], totals["fixed recipe"])
    name, ratio, bound = (("adapt ÷ fixed", over_fixed, NO_REGRET) if recipe_is_best
                          else ("adapt ÷ grid best", over_best, NEAR_BEST))
    return {"adapt_over_best": over_best, "adapt_over_fixed": over_fixed,
            "goal": {"ratio": name, "bound": bound, "verdict": verdict(ratio, bound)}}


def scenario_result(run: Any, scenario: str, recipe: LoaderConfig, evaluated: list[dict[str, Any]],
                    repeats: int) -> dict[str, Any]:
    """The fixed recipe, adapt=True from it and the best of the grid ``evaluated`` (under ``scenario``'s
    conditions), interleaved; ``run(config, adapt)`` is one fresh-process run. Where the recipe is the grid's
    best (``no_regret`` by construction), its runs are the grid best's row too."""
    # evaluated[0] is the recipe's point: where every point failed, the rows still run (and say so)
    best = min((e for e in evaluated if e["total_s"] is not None), key=lambda e: e["total_s"], default=evaluated[0])
    best_config = LoaderConfig.from_json(best["config"])
    fixed = best_config if scenario == "no_regret" else recipe
    rows = {"fixed recipe": partial(run, fixed, False), "adapt=True": partial(run, fixed, True)}
    if fixed != best_config:
        rows["grid best"] = partial(run, best_config, False)
    measured = interleaved(rows, repeats, output.say)
    measured.setdefault("grid best", measured["fixed recipe"])  # one configuration, measured once
    totals = {name: spread([r["total_s"] for r in ok(rs)]) for name, rs in measured.items()}
    per_repeat = {name: [r.get("total_s") for r in rs] for name, rs in measured.items()}
    return {"fixed": fixed.to_json(), "recipe_is_best": fixed == best_config,
            "grid": {"points": len(evaluated), "evaluated": evaluated, "best": best},
            "rows": measured, "totals": totals, **regret(per_repeat, fixed == best_config)}


def ratio_text(ratio: dict[str, Any] | None) -> str:
    return output.fmt(ratio, 3)


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--seconds", type=float, default=60.0, help="each run's length under its step as it starts, "
                   "seconds: sets the samples of an epoch from a calibration run (module docstring)")
    p.add_argument("--samples", type=int, default=None, help="an epoch's samples instead of --seconds")
    p.add_argument("--work", type=int, default=16, help="rounds of numpy work per sample")
    p.add_argument("--step-rounds", type=int, default=40, help="matmuls per training step")
    p.add_argument("--budget", type=float, default=60.0, help="scenario 1's search, seconds")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--start", default=None, help="the recipe's configuration as a LoaderConfig's JSON instead of "
                   "a search (competitor, phase; mismatch's proxy runs from it)")
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(cell(json.loads(args.cell)["params"])))
        sys.stdout.flush()
        os._exit(0)  # no exit hooks: the run is measured, not its teardown
    if args.quick:
        args.epochs, args.samples, args.work, args.step_rounds = 4, 64, 1, 2
    if args.samples is not None and args.samples < BATCH * MIN_BATCHES:
        raise SystemExit(f"adapt: --samples below {BATCH * MIN_BATCHES}: an epoch of {MIN_BATCHES} batches at least")
    repeats = args.repeats or (1 if args.quick else 3)
    started = time.perf_counter()
    work = output.workdir(args.workdir, NAME)
    max_workers = usable_cpus()
    # the phase: the step three times heavier from the 5th epoch (0-based 4) where there are enough after it
    base = {"work": args.work, "step_rounds": args.step_rounds,
            "phase_epoch": 4 if args.epochs >= 7 else args.epochs // 2}
    sizes: dict[str, int] = {}  # an epoch's samples under each scenario's conditions (``calibrate``)
    # no_regret's recipe is the grid's; --start states the recipe
    searching = not args.quick and not args.start and any(s != "no_regret" for s in args.scenarios)
    if searching:
        output.say(f"adapt: a {args.budget:g} s search under the cheap step first")
    profile, search = (searched_recipe(args, work, max_workers) if searching or args.quick or args.start else (
        profile_for(usual_advice(max_workers, context="fork"), batch_size=BATCH, epochs=args.epochs,
                    source="benchmarks/adapt.py"), {"note": "no_regret alone: no search"}))
    searched = profile.config

    def run(scenario: str, config: LoaderConfig, adapt: bool, *, samples: int | None = None,
            epochs: int | None = None) -> dict[str, Any]:
        epochs = epochs or args.epochs
        params = {**base, "scenario": scenario, "profile": profile.to_dict(), "config": config.to_json(),
                  "adapt": adapt, "epochs": epochs,
                  "samples": samples or sizes.get(scenario) or args.samples or FIXED_SAMPLES}
        return run_fresh(__file__, scenario, params, epochs=epochs, timeout=900)

    recipes = {s: searched for s in args.scenarios}
    proxy: dict[str, Any] = {"note": "not run: no scenario starts from it"}
    if any(s in PROXIED for s in args.scenarios):
        proxied, proxy = proxy_recipe(lambda config: run("proxy", config, False), searched, max_workers)
        recipes.update({s: proxied for s in args.scenarios if s in PROXIED})
    points = {s: grid(recipes[s], max_workers, args.quick) for s in args.scenarios}
    conditions_run = {GRID_OF.get(s, s): points[s] for s in args.scenarios}
    calibration: dict[str, Any] = {"note": f"--samples {args.samples}: no calibration"}
    if args.samples is None:  # sized by time: each conditions' recipe calibrated once (the step as it starts)
        calibration = {}
        for s in args.scenarios:
            conditions = GRID_OF.get(s, s)
            if conditions in sizes:
                continue
            recipe = recipes[s]
            done = next((c for c in calibration.values() if c["config"] == recipe.to_json()), None)
            if done is None:
                _, done = calibrate(lambda config, samples: run("mismatch", config, False, samples=samples, epochs=2),
                                    recipe, args.seconds, args.epochs)
            calibration[conditions], sizes[conditions] = done, done["samples"]
            output.say(f"adapt: {conditions}: {recipe.describe()} at {done['seconds_per_sample'] * 1e3:.2f} ms a "
                       f"sample: {done['samples']} samples an epoch for {args.seconds:g} s a run")
    planned = (sum(len(p) for p in conditions_run.values())
               + sum(repeats * (2 if s == "no_regret" else 3) for s in args.scenarios))
    epoch_text = ", ".join(f"{c}: {n}" for c, n in sizes.items()) or str(args.samples or FIXED_SAMPLES)
    output.say(f"adapt: recipes {', '.join(f'{s}: {recipes[s].describe()}' for s in args.scenarios)}; at most "
               f"{planned} fresh runs of {args.epochs} epochs of {epoch_text} samples (grid points under "
               f"{len(conditions_run)} conditions)"
               + (f", ~{args.seconds:g} s each before a competitor or a phase change lengthens it: "
                  f"~{planned * (args.seconds + 3) / 60:.0f} minutes at least" if sizes else ""))
    grids: dict[str, list[dict[str, Any]]] = {}
    results: dict[str, Any] = {}
    rows = []
    for scenario in args.scenarios:
        conditions = GRID_OF.get(scenario, scenario)
        if conditions not in grids:
            grids[conditions] = measure_grid(partial(run, conditions), conditions, points[scenario])
        results[scenario] = r = scenario_result(partial(run, conditions), scenario, recipes[scenario],
                                                grids[conditions], repeats)
        r["conditions"] = conditions
        totals, goal = r["totals"], r["goal"]
        best = LoaderConfig.from_json(r["grid"]["best"]["config"])
        rows.append([scenario, LoaderConfig.from_json(r["fixed"]).describe(),
                     "the recipe" if r["recipe_is_best"] else best.describe(),
                     output.fmt(totals["fixed recipe"]), output.fmt(totals["adapt=True"]),
                     output.fmt(totals["grid best"]), ratio_text(r["adapt_over_best"]),
                     ratio_text(r["adapt_over_fixed"]), f"{goal['ratio']} ≤ {goal['bound']:.2f}: {goal['verdict']}"])
    table = output.markdown_table(["scenario", "fixed recipe", "grid best", "fixed s", "adapt=True s", "grid best s",
                                   "adapt ÷ best", "adapt ÷ fixed", "goal"], rows)
    notes = [f"{epoch_text} samples an epoch ("
             + (f"sized for {args.seconds:g} s a run under the step as it starts" if sizes else "stated")
             + f") of {args.work} numpy rounds and a random augmentation (uncachable), batch "
             f"{BATCH}, {args.epochs} epochs, a step of {args.step_rounds} 256x256 matmuls; whole-run wall seconds, "
             f"median (min–max) of {repeats} interleaved fresh processes; the ratios over the interleaved pairs.",
             "mismatch's recipe: the fastest worker count under the proxy (no step: the loader alone), torch's "
             "threads; competitor's and phase's: a real search under a cheap step (--quick: the usual advice).",
             "Each grid: the points adapt=True can reach from the scenario's recipe (workers x the main's threads, "
             "the recipe's cache and allocator), the recipe's among them; the goal: adapt ÷ fixed ≤ 1.03 where the "
             "recipe is the grid's best, else adapt ÷ best ≤ 1.10; 'met' when every pair is within it, 'not met' "
             "when none is, 'tie within noise' otherwise.",
             "no_regret runs under mismatch's conditions and takes its grid; its recipe is the grid's best, so its "
             "grid best row is its fixed recipe runs."]
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": repeats, "epochs": args.epochs, "samples": sizes or args.samples, "seconds": args.seconds,
        "calibration": calibration, "batch_size": BATCH,
        "search": search, "proxy": proxy, "grid": {s: [c.to_json() for c in p] for s, p in points.items()},
        "scenarios": results}, machine=machine.facts())


if __name__ == "__main__":
    sys.exit(main())
