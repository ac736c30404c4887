"""Search cost: how long autotune's search takes to get within 5% of the oracle, against the exhaustive
grid's full cost and against Optuna's RandomSampler given the same time.

All three measure candidates the same way (``Runner.run`` on the search's own plan, the article's JPEG
workload of ``article_table.py``), so their figures (predicted 3-epoch totals) compare directly. The
oracle is the best point of the grid (workers 0-2 x persistent x prefetch {2, 4} x every cache x
allocator {glibc, glibc-tuned}). Time to within 5%: from the start of the search (probe included) to
the end of its first completed trial whose figure is <= 1.05 x the oracle's; for the grid, the time to
measure every point. The random baseline draws from the same space autotune searched (rebuilt with
``build_space`` from the search's probe), asks and tells an Optuna study like ``search.py`` does, without
pruning, for as long as autotune's whole search took.

``--reuse DIR`` takes the search, the grid and the plan that ``article_table.py --workdir DIR`` left there
(what ``run_all.py`` does); without it this script runs them itself first.

    python benchmarks/search_cost.py [--reuse DIR] [--budget 90] [--images 2000] [--quick]
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import article_table as A
import optuna
from harness import EXAMPLES, oracle, output
from harness.workloads import BATCH, EPOCHS, jpeg_dataset

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.machine._cpus import usable_cpus
from autotune.machine._memory import default_budget
from autotune.tuner._candidates import Limits, build_space, disk_free
from autotune.tuner._measure import Workload
from autotune.tuner._runner import Runner, TrialFailed

NAME = "search_cost"
WITHIN = 0.05


def first_within(trials: list[dict], target: float, start: float) -> dict | None:
    """The first completed, measured trial whose figure is within ``target``; seconds from ``start``."""
    for t in sorted(trials, key=lambda t: t["number"]):
        if t["state"] == "COMPLETE" and not t.get("repeat") and t["value"] is not None and t["value"] <= target:
            return {**t, "seconds_from_start": t["complete"] - start}
    return None


def first_found(trials: list[dict], grid: list[dict], target: float, start: float) -> dict | None:
    """The first completed trial whose configuration the grid measured within ``target``: the search found
    the point, whatever its own single measurement of it said (one run varies 5-18% here)."""
    on_grid = {json.dumps(e["config"], sort_keys=True): e["value"] for e in grid if "value" in e}
    for t in sorted(trials, key=lambda t: t["number"]):
        value = on_grid.get(json.dumps(t.get("config"), sort_keys=True))
        if t["state"] == "COMPLETE" and value is not None and value <= target:
            return {**t, "grid_value": value, "seconds_from_start": t["complete"] - start}
    return None


def random_search(state: dict, budget: float, seed: int, work: Path) -> tuple[list[dict], float]:
    """An Optuna RandomSampler study over autotune's space, driven through Runner.run on the same plan."""
    probe, plan = state["probe"], state["plan"]
    limits = Limits(usable_cpus=usable_cpus(), memory_budget=default_budget(), disk_free=disk_free(work))
    space = build_space(probe, limits)  # as autotune's preparation builds the searched space
    workload = Workload(dataset=jpeg_dataset(state["images"]), batch_size=BATCH, epochs=EPOCHS,
                        fingerprint=probe.fingerprint)
    runner = Runner(workload, [str(EXAMPLES)], memory_limit=limits.memory_budget)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler(seed=seed))
    start = time.time()
    trials: list[dict] = []
    seen: dict[str, float] = {}
    durations: list[float] = []
    while True:
        typical = sorted(durations)[len(durations) // 2] if durations else 0.0
        if time.time() - start + typical > budget or len(trials) > 500:
            break
        trial = study.ask()
        config = space.suggest(trial)
        key = config.key()
        entry: dict[str, Any] = {"number": trial.number, "config": config.to_json(), "start": time.time(),
                                 "repeat": key in seen}
        if key in seen:
            study.tell(trial, seen[key])
            entry.update(state="COMPLETE", value=seen[key], complete=time.time())
            trials.append(entry)
            continue
        t0 = time.perf_counter()
        try:
            result = runner.run(config, plan, timeout=plan.batch_timeout)
            value = result.total_seconds
            study.tell(trial, value)
            seen[key] = value
            entry.update(state="COMPLETE", value=value)
        except TrialFailed as exc:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            entry.update(state="FAIL", value=None, reason=str(exc))
        durations.append(time.perf_counter() - t0)
        entry.update(complete=time.time(), duration_s=durations[-1])
        trials.append(entry)
        output.say(f"random {trial.number}: {config.describe()} -> "
                   f"{entry['value'] if entry['value'] is None else round(entry['value'], 2)}")
    return trials, start


def method(trials: list[dict], hit: dict | None, found: dict | None, grid_cost: float, **extra) -> dict:
    """One method's result: its first trial within 5% by its own figure, and by the grid's."""
    return {**extra, "hit": hit, "seconds_to_within": hit["seconds_from_start"] if hit else None,
            "share_of_grid": hit["seconds_from_start"] / grid_cost if hit else None, "found": found,
            "seconds_to_found": found["seconds_from_start"] if found else None, "trials": trials}


def table_row(label: str, trials: list[dict], hit: dict | None, found: dict | None, grid_cost: float,
              wall: float) -> list[str]:
    def reach(h: dict | None) -> str:
        return f"{h['seconds_from_start']:.0f} s ({100 * h['seconds_from_start'] / grid_cost:.0f}% of the grid)" \
            if h else "not reached"

    measured = [t for t in trials if t["state"] == "COMPLETE" and not t.get("repeat")]
    return [label, reach(hit), reach(found), f"{wall:.0f}", str(len(measured)),
            f"{min((t['value'] for t in measured), default=float('nan')):.2f}"]


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--reuse", default=None, help="article_table.py's --workdir, to reuse its search and grid")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--budget", type=float, default=90.0, help="autotune search budget when not reused, seconds")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.budget = min(args.images, 128), min(args.budget, 30.0)
    started = time.perf_counter()
    if args.reuse:
        work = Path(args.reuse)
    else:
        work = output.workdir(args.workdir, NAME)
        jpeg_dataset(args.images)
        A.search_and_grid(args, work)
    with open(work / A.STATE, "rb") as f:
        state = pickle.load(f)
    grid, search = state["grid"], state["search"]
    best = oracle.best_point(grid)
    if best is None:
        raise SystemExit("no grid point was measured: nothing to compare with")
    target = best["value"] * (1 + WITHIN)
    grid_cost = sum(e["duration_s"] for e in grid)
    budget = search["wall_s"]
    output.say(f"random sampler for {budget:.0f} s (autotune's whole search) ...")
    random_trials, random_start = random_search(state, budget, args.seed, work)
    auto = (state["trial_log"], first_within(state["trial_log"], target, search["started_epoch_s"]),
            first_found(state["trial_log"], grid, target, search["started_epoch_s"]))
    rand = (random_trials, first_within(random_trials, target, random_start),
            first_found(random_trials, grid, target, random_start))
    table = output.markdown_table(
        ["method", "time to within 5% of the oracle (own figure)", "time to measure a point the grid puts within 5%",
         "whole run, s", "points measured", "best figure, s"],
        [table_row("autotune (TPE, priors, pruning, finalists)", *auto, grid_cost, search["wall_s"]),
         table_row("Optuna RandomSampler, same time", *rand, grid_cost, budget),
         ["exhaustive grid (the oracle)", f"{grid_cost:.0f} s to measure all", "–", f"{grid_cost:.0f}", str(len(grid)),
          f"{best['value']:.2f}"]])
    notes = [(f"oracle: {best['describe']}, {best['value']:.2f} s predicted for {state['images']} JPEGs x {EPOCHS} "
             f"epochs (one measurement per point, on the search's plan of {len(state['plan'].indices)} samples)."),
             ("Figures are single trial measurements: a trial can land within 5% by noise; the spread of one "
             "configuration here is 5-18%.")]
    if len(grid) <= 2:
        notes.append("a 2-point grid, not an oracle.")
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": 1, "images": state["images"], "within": WITHIN,
        "oracle": {"value_s": best["value"], "config": best["config"], "describe": best["describe"]},
        "grid": {"points": len(grid), "cost_s": grid_cost, "space": state["grid_space"], "complete": len(grid) > 2},
        "autotune": method(*auto, grid_cost, wall_s=search["wall_s"], budget_s=search["budget_s"]),
        "random": method(*rand, grid_cost, budget_s=budget, seed=args.seed)})


if __name__ == "__main__":
    sys.exit(main())
