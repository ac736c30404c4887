"""The DataLoader article's table, the autotuned recipe and the exhaustive grid's best point, in one run.

Data: random-pixel 224x224 RGB JPEGs (quality 85, ``examples/jpeg_folder.py``), decoded with Pillow to a
float CHW tensor, label ``idx % 10``; batch 64, shuffled with a fixed seed, 3 epochs, the first cold.

Rows:
  A  ``num_workers=0``
  B  4 workers + pin_memory + persistent
  C  an in-memory list of decoded PIL images + 2 workers + pin_memory + persistent
  D  one pickle file of decoded arrays, loaded whole + 2 workers + pin_memory + persistent
  autotune  the recipe of ``autotune``'s own search (``--budget``), through ``Recipe.dataloader``
  oracle  the best point of an exhaustive grid over a reduced version of the searched space (workers
          0-2 x persistent x prefetch {2, 4} x cache {none, memory, pickle, hdf5, lmdb} x allocator
          {glibc, glibc-tuned}), each point measured with ``Runner.run`` on the search's plan, then run
          for real through the same factory.
  floor  this machine's floor (``harness/floor.py``): every JPEG decoded once on all usable CPUs, nothing
         stored (setup), then the epochs' batch gathers from a tensor already in memory; every row's total
         is also given as a multiple of it. Its runs also time, outside their clock, the samples' bytes
         written into fresh memory once (keeping them, which the floor does not count); a note gives the
         floor plus that and every row over it.

Without CUDA ``pin_memory=True`` is a no-op (DataLoader warns and skips pinning); rows B-D keep the flag
as the article did. Every run is a fresh process, the JPEGs are evicted from the page cache before
setup and before epoch 1, the seven rows are interleaved (A B C D autotune oracle floor, repeated), and a
separate run of each row samples peak PSS (main + workers; ``--quick``: the one run). "setup" is everything
before epoch 1: decoding into memory (C), decode + pickle + fsync + cold load (D), the recipe's cache build.

    python benchmarks/article_table.py [--repeats 3] [--budget 90] [--images 2000] [--quick]
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import EXAMPLES, oracle, output, recipes, stats
from harness.child import Setup, child_main, evict_files
from harness.floor import floor_setup, keep_row, over_floor
from harness.fresh import allocator_env, run_fresh
from harness.workloads import BATCH, EPOCHS, jpeg_dataset, jpeg_files, seeded_loader
from PIL import Image

from autotune.config import LoaderConfig
from autotune.dataset._userfile import UserSpec

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.loader import DeviceConsumer

NAME = "article_table"
STATE = "search_state.pkl"  # in --workdir: what search_cost.py --reuse needs
ROWS = {
    "A": "A: `num_workers=0`",
    "B": "B: 4 workers + pin + persistent",
    "C": "C: in-memory PIL list + 2 workers + pin + persistent",
    "D": "D: pickle file loaded whole + 2 workers + pin + persistent",
    "autotune": "autotune recipe",
    "oracle": "oracle (best grid point)",
    "floor": "floor: decode once on all CPUs + gathers from memory",
}
HAND = {"num_workers": 2, "pin_memory": True, "persistent_workers": True}  # rows C and D


def to_tensor(pixels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255)


class Decoded:
    """Decoded images held in a Python list (row C: PIL images; row D: uint8 arrays loaded whole from one
    pickle file), converted to a float tensor per access."""

    def __init__(self, images: list):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx: int):
        return to_tensor(np.asarray(self.images[idx])), idx % 10


def decoded(paths: list[str], as_array: bool) -> list:
    out = []
    for path in paths:
        with Image.open(path) as img:
            out.append(np.asarray(img.convert("RGB")) if as_array else img.convert("RGB"))
    return out


# ------------------------------------------------------------------------------------------ cells (child)


def cell_a(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])  # DeviceConsumer: autotune's default consumer, a device copy
    return Setup(jpeg_files(ds), lambda: (seeded_loader(ds, num_workers=0), DeviceConsumer(False)))


def cell_b(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])
    return Setup(jpeg_files(ds), lambda: (
        seeded_loader(ds, num_workers=4, pin_memory=True, persistent_workers=True), DeviceConsumer(True)))


def cell_c(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])
    return Setup(jpeg_files(ds), lambda: (seeded_loader(Decoded(decoded(ds.paths, False)), **HAND),
                                          DeviceConsumer(True)))


def cell_d(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])
    setup = Setup(jpeg_files(ds), lambda: None)  # type: ignore[arg-type,return-value]

    def prepare():
        t0 = time.perf_counter()
        arrays = decoded(ds.paths, True)
        target = Path(params["workdir"]) / f"arrays-{os.getpid()}.pkl"
        with open(target, "wb") as f:
            pickle.dump(arrays, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        del arrays
        setup.parts["decode_and_write"] = time.perf_counter() - t0
        setup.info["pickle_eviction"] = evict_files([str(target)])  # built offline: the load is cold
        t1 = time.perf_counter()
        with open(target, "rb") as f:
            arrays = pickle.load(f)
        setup.parts["load_whole"] = time.perf_counter() - t1
        target.unlink()
        return seeded_loader(Decoded(arrays), **HAND), DeviceConsumer(True)

    setup.prepare = prepare
    return setup


def cell_recipe(params: dict) -> Setup:
    cache_dir = Path(params["workdir"]) / f"recipe-cache-{os.getpid()}"  # fresh: the build is counted
    return recipes.recipe_setup(params["profile"], lambda: jpeg_dataset(params["images"]), jpeg_files,
                                cache_dir=str(cache_dir))


def cell_floor(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])
    return floor_setup(ds, jpeg_files(ds), BATCH)


CELLS = {"A": cell_a, "B": cell_b, "C": cell_c, "D": cell_d, "autotune": cell_recipe, "oracle": cell_recipe,
         "floor": cell_floor}


# ------------------------------------------------------------------------------------------ driver (parent)


def search_and_grid(args, work: Path, *, grid: bool = True) -> dict:
    """autotune's search, then (``grid``) the grid on the same plan; returns profiles and costs for the rows."""
    spec = UserSpec(dataset=jpeg_dataset(args.images), source=str(EXAMPLES / "jpeg_folder.py"), batch_size=BATCH,
                    epochs=EPOCHS, sys_path=[str(EXAMPLES)])
    output.say(f"autotune search, budget {args.budget:.0f} s ...")
    recipe, outcome, timing = recipes.autotune_search(spec, budget=args.budget, workdir=work)
    output.say(f"  -> {recipe.config.describe()} in {timing['wall_s']:.1f} s ({outcome.trials} trials)")
    search = {**recipes.search_record(recipe, outcome, timing), "pruned": outcome.pruned,
              "failed": len(outcome.failed), "search_seconds": outcome.search_seconds,
              "plan_samples": len(outcome.plan.indices), "study": outcome.study}
    if not grid:  # the grid serves the oracle row and search_cost.py
        return {"search": search, "grid": None, "profiles": {"autotune": recipe.profile.to_dict()},
                "allocators": {"autotune": recipe.config.allocator}}
    space = oracle.reduced_space(max_workers=2)
    points = oracle.grid_points(space, args.quick)
    output.say(f"grid: {len(points)} points on the search's plan "
               f"({len(outcome.plan.indices)} of {outcome.plan.length})")
    t0 = time.perf_counter()
    grid = oracle.evaluate_points(spec, outcome, points, log=output.say)
    grid_wall = time.perf_counter() - t0
    best = oracle.best_point(grid)
    if best is None:
        raise SystemExit("no grid point could be measured")
    best_config = LoaderConfig.from_json(best["config"])
    trial_log = oracle.study_trials(outcome)
    with open(work / STATE, "wb") as f:  # for search_cost.py --reuse: the same plan, probe and grid
        pickle.dump({"images": args.images, "budget": args.budget, "plan": outcome.plan, "probe": outcome.probe,
                     "search": timing, "trial_log": trial_log, "grid": grid, "grid_space": repr(space)}, f)
    oracle_profile = recipes.profile_for(best_config, batch_size=BATCH, epochs=EPOCHS, source=spec.source)
    return {
        "search": {**search, "trial_log": trial_log},
        "grid": {"space": repr(space), "points": len(points), "complete": not args.quick, "wall_s": grid_wall,
                 "cost_s": sum(e["duration_s"] for e in grid), "best": best, "evaluated": grid},
        "profiles": {"autotune": recipe.profile.to_dict(), "oracle": oracle_profile.to_dict()},
        "allocators": {"autotune": recipe.config.allocator, "oracle": best_config.allocator},
    }


def table_row(row: str, s: dict, tuned: dict | None, ref: dict | None, floor: float | None = None) -> list[str]:
    cost = "–"
    if row == "autotune" and tuned:
        cost = f"{tuned['search']['wall_s']:.0f} s search"
    elif row == "oracle" and tuned:
        cost = f"{tuned['grid']['cost_s']:.0f} s grid ({tuned['grid']['points']} points)"
    total = s.get("total_s")
    s["autotune_over_row"] = ref["median"] / total["median"] if ref and total else None
    ratio = f"{s['autotune_over_row']:.2f}" if s["autotune_over_row"] else "–"
    s["over_floor"] = floor
    return [ROWS[row], *[output.fmt(e) for e in s.get("epoch_s") or [None] * EPOCHS], output.fmt(s.get("setup_s")),
            output.fmt(total), output.fmt(s.get("first_over_steady")), output.fmt_bytes(s.get("peak_pss_bytes")),
            cost, ratio, f"{floor:.2f}x" if floor else "–"]


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--budget", type=float, default=90.0, help="autotune search budget, seconds")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = p.parse_args(argv)
    if args.cell:
        return child_main(CELLS, args.cell)
    if args.quick:
        args.images, args.budget = min(args.images, 128), min(args.budget, 30.0)
    repeats = args.repeats or (1 if args.quick else 3)
    work = output.workdir(args.workdir, NAME)
    started = time.perf_counter()
    jpeg_dataset(args.images)  # write the images once, outside every measurement
    tuned = (search_and_grid(args, work, grid="oracle" in args.rows) if {"autotune", "oracle"} & set(args.rows)
             else None)

    def runner(row: str, memory: bool = False):
        params: dict = {"images": args.images, "workdir": str(work)}
        env = None
        if tuned and row in ("autotune", "oracle"):
            params["profile"] = tuned["profiles"][row]
            env = allocator_env(tuned["allocators"][row])
        return lambda: run_fresh(__file__, row, params, epochs=EPOCHS, memory=memory, env=env)

    if args.quick and repeats == 1:  # a smoke test's one run per row samples memory too: no timing here is a result
        output.say(f"rows {', '.join(args.rows)}: one run each, sampling memory")
        runs = memory = stats.interleaved({row: runner(row, memory=True) for row in args.rows}, 1, log=output.say)
    else:
        output.say(f"rows {', '.join(args.rows)}: {repeats} interleaved repeat(s), then one memory pass each")
        runs = stats.interleaved({row: runner(row) for row in args.rows}, repeats, log=output.say)
        memory = stats.interleaved({row: runner(row, memory=True) for row in args.rows}, 1, log=output.say)
    rows = {row: stats.summarise_runs(runs[row], memory[row][0]) for row in args.rows}
    ref = rows.get("autotune", {}).get("total_s")
    floors = over_floor(rows)
    table = output.markdown_table(
        ["row", "epoch 1 (cold), s", "epoch 2, s", "epoch 3, s", "setup / cache build, s", "total, s",
         "epoch 1 / steady", "peak PSS (main + workers)", "search cost", "autotune total ÷ row total",
         "row total ÷ floor"],
        [table_row(row, rows[row], tuned, ref, floors.get(row)) for row in args.rows])
    notes = [(f"{args.images} JPEGs, batch {BATCH}, {EPOCHS} epochs; median (min–max) of {repeats} interleaved "
             "fresh-process run(s); files evicted before setup and before epoch 1; memory from a separate run"
              + (" (--quick: the same run)." if args.quick and repeats == 1 else ".")),
             "pin_memory=True is kept in rows B–D as in the article; without CUDA it is a no-op."]
    if "floor" in rows and rows["floor"].get("total_s"):
        notes.append("floor: setup is every JPEG decoded once on all usable CPUs in fresh workers, nothing stored; "
                     "its epochs are the batch gathers of the shuffled order from a tensor already in memory.")
    kept = keep_row(rows)
    if kept:
        rows["floor"]["keep"] = kept
        over = ", ".join(f"{r} {x:.2f}x" for r, x in kept["over"].items() if r != "floor")
        notes.append(f"floor plus keeping the samples: {kept['floor_plus_keep_s']:.2f} s (their bytes written into "
                     f"fresh memory once on the same workers, {kept['keep_s']:.2f} s, which the floor does not count)"
                     + (f"; each row's total over it: {over}." if over else "."))
    if tuned and tuned["grid"]:
        notes.append(f"autotune: {tuned['search']['describe']}; oracle: {tuned['grid']['best']['describe']} "
                     f"(grid value {tuned['grid']['best']['value']:.2f} s predicted).")
    if args.quick:
        notes.append("--quick: a 2-point grid, not an oracle.")
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": repeats, "images": args.images, "batch_size": BATCH, "epochs": EPOCHS, "budget_s": args.budget,
        "rows": rows, "labels": {r: ROWS[r] for r in args.rows}, "search": tuned["search"] if tuned else None,
        "grid": tuned["grid"] if tuned else None, "profiles": tuned["profiles"] if tuned else None})


if __name__ == "__main__":
    sys.exit(main())
