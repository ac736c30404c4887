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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import article_table as A  # noqa: E402

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
    import optuna

    from autotune.tuner._candidates import Limits, build_space, disk_free
    from autotune.machine._cpus import usable_cpus
    from autotune.tuner._measure import Workload
    from autotune.machine._memory import default_budget
    from autotune.tuner._runner import Runner, TrialFailed

    probe, plan = state["probe"], state["plan"]
    dataset = A.jpeg_dataset(state["images"])
    limits = Limits(usable_cpus=usable_cpus(), memory_budget=default_budget(), disk_free=disk_free(work))
    space = build_space(probe, limits)  # as autotune.preparation builds the searched space
    workload = Workload(dataset=dataset, batch_size=A.BATCH, epochs=A.EPOCHS, fingerprint=probe.fingerprint)
    runner = Runner(workload, [str(C.EXAMPLES)], memory_limit=limits.memory_budget)
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
        key = json.dumps(config.to_json(), sort_keys=True)
        entry = {"number": trial.number, "config": config.to_json(), "start": time.time(), "repeat": key in seen}
        if key in seen:
            study.tell(trial, seen[key])
            entry.update(state="COMPLETE", value=seen[key], complete=time.time())
            trials.append(entry)
            continue
        t0 = time.perf_counter()
        try:
            result = runner.run(config, plan, timeout=plan.batch_timeout)
            value = result["prediction"]["total_seconds"]
            study.tell(trial, value)
            seen[key] = value
            entry.update(state="COMPLETE", value=value)
        except TrialFailed as exc:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            entry.update(state="FAIL", value=None, reason=str(exc))
        durations.append(time.perf_counter() - t0)
        entry.update(complete=time.time(), duration_s=durations[-1])
        trials.append(entry)
        C.say(f"random {trial.number}: {config.describe()} -> "
              f"{entry['value'] if entry['value'] is None else round(entry['value'], 2)}")
    return trials, start


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__, NAME)
    p.add_argument("--reuse", default=None, help="article_table.py's --workdir, to reuse its search and grid")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--budget", type=float, default=90.0, help="autotune search budget when not reused, seconds")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.images = min(args.images, 128)
        args.budget = min(args.budget, 8.0)
    started = time.perf_counter()
    if args.reuse:
        work = Path(args.reuse)
    else:
        work = C.workdir(args.workdir, NAME)
        A.jpeg_dataset(args.images)
        A.search_and_grid(args, work)
    with open(work / A.STATE, "rb") as f:
        state = pickle.load(f)
    grid = state["grid"]
    best = C.best_point(grid)
    oracle = best["value"]
    target = oracle * (1 + WITHIN)
    grid_cost = sum(e["duration_s"] for e in grid)
    search = state["search"]
    autotune_hit = first_within(state["trial_log"], target, search["started_epoch_s"])
    budget = search["wall_s"]
    C.say(f"random sampler for {budget:.0f} s (autotune's whole search) ...")
    random_trials, random_start = random_search(state, budget, args.seed, work)
    random_hit = first_within(random_trials, target, random_start)
    autotune_found = first_found(state["trial_log"], grid, target, search["started_epoch_s"])
    random_found = first_found(random_trials, grid, target, random_start)
    complete = len(grid) > 2

    def reach(hit: dict | None) -> str:
        return f"{hit['seconds_from_start']:.0f} s ({100 * hit['seconds_from_start'] / grid_cost:.0f}% of the grid)" \
            if hit else "not reached"

    auto_measured = [t for t in state["trial_log"] if t["state"] == "COMPLETE" and not t.get("repeat")]
    rand_measured = [t for t in random_trials if t["state"] == "COMPLETE" and not t.get("repeat")]
    table = C.markdown_table(
        ["method", "time to within 5% of the oracle (own figure)", "time to measure a point the grid puts within 5%",
         "whole run, s", "points measured", "best figure, s"],
        [["autotune (TPE, priors, pruning, finalists)", reach(autotune_hit), reach(autotune_found),
          f"{search['wall_s']:.0f}", str(len(auto_measured)),
          f"{min((t['value'] for t in auto_measured), default=float('nan')):.2f}"],
         ["Optuna RandomSampler, same time", reach(random_hit), reach(random_found), f"{budget:.0f}",
          str(len(rand_measured)), f"{min((t['value'] for t in rand_measured), default=float('nan')):.2f}"],
         ["exhaustive grid (the oracle)", f"{grid_cost:.0f} s to measure all", "–", f"{grid_cost:.0f}", str(len(grid)),
          f"{oracle:.2f}"]])
    notes = [f"oracle: {best['describe']}, {oracle:.2f} s predicted for {state['images']} JPEGs x {A.EPOCHS} epochs "
             f"(one measurement per point, on the search's plan of {len(state['plan'].indices)} samples).",
             "Figures are single trial measurements: a trial can land within 5% by noise; the spread of one "
             "configuration here is 5-18%."]
    if not complete:
        notes.append("--quick: a 2-point grid, not an oracle; a smoke test, not a result.")
    print(table + "\n\n" + "\n".join(f"- {n}" for n in notes))
    path = C.write_json(NAME, {
        "quick": args.quick, "repeats": 1, "images": state["images"], "within": WITHIN,
        "oracle": {"value_s": oracle, "config": best["config"], "describe": best["describe"]},
        "grid": {"points": len(grid), "cost_s": grid_cost, "space": state["grid_space"], "complete": complete},
        "autotune": {"wall_s": search["wall_s"], "budget_s": search["budget_s"], "hit": autotune_hit,
                     "seconds_to_within": autotune_hit["seconds_from_start"] if autotune_hit else None,
                     "share_of_grid": autotune_hit["seconds_from_start"] / grid_cost if autotune_hit else None,
                     "found": autotune_found,
                     "seconds_to_found": autotune_found["seconds_from_start"] if autotune_found else None,
                     "trials": state["trial_log"]},
        "random": {"budget_s": budget, "seed": args.seed, "hit": random_hit,
                   "seconds_to_within": random_hit["seconds_from_start"] if random_hit else None,
                   "share_of_grid": random_hit["seconds_from_start"] / grid_cost if random_hit else None,
                   "found": random_found,
                   "seconds_to_found": random_found["seconds_from_start"] if random_found else None,
                   "trials": random_trials},
        "table_markdown": table, "notes": notes, "wall_s": time.perf_counter() - started,
    }, args.output)
    C.say(f"written {path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
