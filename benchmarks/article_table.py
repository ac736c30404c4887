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

Without CUDA ``pin_memory=True`` is a no-op (DataLoader warns and skips pinning); rows B-D keep the flag
as the article did. Every run is a fresh process, the JPEGs are evicted from the page cache before
setup and before epoch 1, the six rows are interleaved (A B C D autotune oracle, repeated), and a
separate run of each row samples peak PSS (main + workers). "setup" is everything before epoch 1:
decoding into memory (C), decode + pickle + fsync + cold load (D), the recipe's cache build.

    python benchmarks/article_table.py [--repeats 3] [--budget 90] [--images 2000] [--quick]
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "article_table"
STATE = "search_state.pkl"  # in --workdir: what search_cost.py --reuse needs
BATCH = 64
EPOCHS = 3
ROWS = {
    "A": "A: `num_workers=0`",
    "B": "B: 4 workers + pin + persistent",
    "C": "C: in-memory PIL list + 2 workers + pin + persistent",
    "D": "D: pickle file loaded whole + 2 workers + pin + persistent",
    "autotune": "autotune recipe",
    "oracle": "oracle (best grid point)",
}


# ------------------------------------------------------------------------------------------ datasets


def jpeg_dataset(images: int):
    import jpeg_folder

    return jpeg_folder.JpegFolder(jpeg_folder.make_images(jpeg_folder.DATA_DIR, images))


def jpeg_files(dataset) -> set[str]:
    return {os.path.realpath(p) for p in dataset.paths}


def to_tensor(pixels):
    import torch

    return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255)


class PilList:
    """Row C: decoded PIL images held in a Python list; converted to a float tensor per access."""

    def __init__(self, paths: list[str]):
        from PIL import Image

        self.images = []
        for path in paths:
            with Image.open(path) as img:
                self.images.append(img.convert("RGB"))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx: int):
        import numpy as np

        return to_tensor(np.asarray(self.images[idx])), idx % 10


class ArrayList:
    """Row D: decoded uint8 arrays loaded whole from one pickle file."""

    def __init__(self, arrays: list):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, idx: int):
        return to_tensor(self.arrays[idx]), idx % 10


# ------------------------------------------------------------------------------------------ cells (child)


def _loader(dataset, **kwargs):
    import torch

    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True,
                                       generator=torch.Generator().manual_seed(C.SEED), **kwargs)


def _consumer(pin: bool):
    from autotune._loader import DeviceConsumer

    return DeviceConsumer(pin)  # autotune's default consumer: a device copy (nothing to move without CUDA)


def cell_a(params: dict) -> C.Setup:
    ds = jpeg_dataset(params["images"])
    return C.Setup(jpeg_files(ds), lambda: (_loader(ds, num_workers=0), _consumer(False)))


def cell_b(params: dict) -> C.Setup:
    ds = jpeg_dataset(params["images"])
    return C.Setup(jpeg_files(ds), lambda: (
        _loader(ds, num_workers=4, pin_memory=True, persistent_workers=True), _consumer(True)))


def cell_c(params: dict) -> C.Setup:
    ds = jpeg_dataset(params["images"])

    def prepare():
        memory = PilList(ds.paths)
        return _loader(memory, num_workers=2, pin_memory=True, persistent_workers=True), _consumer(True)

    return C.Setup(jpeg_files(ds), prepare)


def cell_d(params: dict) -> C.Setup:
    import numpy as np
    from PIL import Image

    ds = jpeg_dataset(params["images"])
    setup = C.Setup(jpeg_files(ds), lambda: None)

    def prepare():
        t0 = time.perf_counter()
        arrays = []
        for path in ds.paths:
            with Image.open(path) as img:
                arrays.append(np.asarray(img.convert("RGB")))
        target = Path(params["workdir"]) / f"arrays-{os.getpid()}.pkl"
        with open(target, "wb") as f:
            pickle.dump(arrays, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        del arrays
        setup.parts["decode_and_write"] = time.perf_counter() - t0
        setup.info["pickle_eviction"] = C.evict_files([str(target)])  # built offline: the load is cold
        t1 = time.perf_counter()
        with open(target, "rb") as f:
            arrays = pickle.load(f)
        setup.parts["load_whole"] = time.perf_counter() - t1
        target.unlink()
        return (_loader(ArrayList(arrays), num_workers=2, pin_memory=True, persistent_workers=True),
                _consumer(True))

    setup.prepare = prepare
    return setup


def cell_recipe(params: dict) -> C.Setup:
    cache_dir = Path(params["workdir"]) / f"recipe-cache-{os.getpid()}"  # fresh: the build is counted
    return C.recipe_setup(params["profile"], lambda: jpeg_dataset(params["images"]), jpeg_files,
                          cache_dir=str(cache_dir))


CELLS = {"A": cell_a, "B": cell_b, "C": cell_c, "D": cell_d, "autotune": cell_recipe, "oracle": cell_recipe}


# ------------------------------------------------------------------------------------------ driver (parent)


def search_and_grid(args, work: Path) -> dict:
    """autotune's search, then the grid on the same plan; returns profiles and costs for the rows."""
    import jpeg_folder
    from autotune.dataset._userfile import UserSpec

    dataset = jpeg_dataset(args.images)
    spec = UserSpec(dataset=dataset, source=str(C.EXAMPLES / "jpeg_folder.py"), batch_size=BATCH,
                    epochs=EPOCHS, sys_path=[str(C.EXAMPLES)])
    assert isinstance(dataset, jpeg_folder.JpegFolder)
    C.say(f"autotune search, budget {args.budget:.0f} s ...")
    recipe, outcome, timing = C.autotune_search(spec, budget=args.budget, workdir=work)
    C.say(f"  -> {recipe.config.describe()} in {timing['wall_s']:.1f} s ({outcome.trials} trials)")
    space = C.reduced_space(max_workers=2)
    points = C.grid_points(space, args.quick)
    C.say(f"grid: {len(points)} points on the search's plan ({len(outcome.plan.indices)} of {outcome.plan.length})")
    t0 = time.perf_counter()
    grid = C.evaluate_points(spec, outcome, points, log=C.say)
    grid_wall = time.perf_counter() - t0
    best = C.best_point(grid)
    if best is None:
        raise SystemExit("no grid point could be measured")
    from autotune.config import LoaderConfig

    best_config = LoaderConfig.from_json(best["config"])
    with open(work / STATE, "wb") as f:  # for search_cost.py --reuse: the same plan, probe and grid
        pickle.dump({"images": args.images, "budget": args.budget, "plan": outcome.plan, "probe": outcome.probe,
                     "search": timing, "trial_log": C.study_trials(outcome), "grid": grid,
                     "grid_space": repr(space)}, f)
    oracle_profile = C.profile_for(best_config, batch_size=BATCH, epochs=EPOCHS, source=spec.source)
    return {
        "search": {**timing, "config": recipe.config.to_json(), "describe": recipe.config.describe(),
                   "trials": outcome.trials, "pruned": outcome.pruned, "failed": len(outcome.failed),
                   "search_seconds": outcome.search_seconds, "measured": recipe.measured.to_json(),
                   "plan_samples": len(outcome.plan.indices), "study": outcome.study,
                   "trial_log": C.study_trials(outcome)},
        "grid": {"space": repr(space), "points": len(points), "complete": not args.quick, "wall_s": grid_wall,
                 "cost_s": sum(e["duration_s"] for e in grid), "best": best, "evaluated": grid},
        "profiles": {"autotune": recipe.profile.to_dict(), "oracle": oracle_profile.to_dict()},
        "allocators": {"autotune": recipe.config.allocator, "oracle": best_config.allocator},
    }


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--budget", type=float, default=90.0, help="autotune search budget, seconds")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = p.parse_args(argv)
    if args.cell:
        return C.child_main(CELLS, args.cell)
    if args.quick:
        args.images = min(args.images, 128)
        args.budget = min(args.budget, 8.0)
    repeats = args.repeats or (1 if args.quick else 3)
    work = C.workdir(args.workdir, NAME)
    started = time.perf_counter()
    jpeg_dataset(args.images)  # write the images once, outside every measurement

    tuned = None
    if {"autotune", "oracle"} & set(args.rows):
        tuned = search_and_grid(args, work)
    script = Path(__file__).resolve()
    base = {"images": args.images, "workdir": str(work)}

    def runner(row: str, memory: bool = False):
        params = dict(base)
        env = None
        if row in ("autotune", "oracle"):
            params["profile"] = tuned["profiles"][row]
            env = C.env_for_allocator(tuned["allocators"][row])
        return lambda: C.run_fresh(script, row, params, epochs=EPOCHS, memory=memory, env=env)

    C.say(f"rows {', '.join(args.rows)}: {repeats} interleaved repeat(s), then one memory pass each")
    runs = C.interleaved({row: runner(row) for row in args.rows}, repeats, log=C.say)
    memory = C.interleaved({row: runner(row, memory=True) for row in args.rows}, 1, log=C.say)
    rows = {row: C.summarise_runs(runs[row], memory[row][0]) for row in args.rows}

    ref = rows.get("autotune", {}).get("total_s")
    table_rows = []
    for row in args.rows:
        s = rows[row]
        epochs = s.get("epoch_s") or [None] * EPOCHS
        cost = "–"
        if row == "autotune" and tuned:
            cost = f"{tuned['search']['wall_s']:.0f} s search"
        elif row == "oracle" and tuned:
            cost = f"{tuned['grid']['cost_s']:.0f} s grid ({tuned['grid']['points']} points)"
        total = s.get("total_s")
        ratio = f"{ref['median'] / total['median']:.2f}" if ref and total else "–"
        s["autotune_over_row"] = ref["median"] / total["median"] if ref and total else None
        table_rows.append([ROWS[row], *[C.fmt(e) for e in epochs], C.fmt(s.get("setup_s")), C.fmt(total),
                           C.fmt(s.get("first_over_steady")), C.fmt_bytes(s.get("peak_pss_bytes")), cost, ratio])
    headers = ["row", "epoch 1 (cold), s", "epoch 2, s", "epoch 3, s", "setup / cache build, s", "total, s",
               "epoch 1 / steady", "peak PSS (main + workers)", "search cost", "autotune total ÷ row total"]
    table = C.markdown_table(headers, table_rows)
    notes = [f"{args.images} JPEGs, batch {BATCH}, {EPOCHS} epochs; median (min–max) of {repeats} interleaved "
             "fresh-process run(s); files evicted before setup and before epoch 1; memory from a separate run.",
             "pin_memory=True is kept in rows B–D as in the article; without CUDA it is a no-op."]
    if tuned:
        notes.append(f"autotune: {tuned['search']['describe']}; oracle: {tuned['grid']['best']['describe']} "
                     f"(grid value {tuned['grid']['best']['value']:.2f} s predicted).")
    if args.quick:
        notes.append("--quick: tiny sizes and a 2-point grid; a smoke test, not a result.")
    print(table + "\n\n" + "\n".join(f"- {n}" for n in notes))
    path = C.write_json(NAME, {
        "quick": args.quick, "repeats": repeats, "images": args.images, "batch_size": BATCH, "epochs": EPOCHS,
        "budget_s": args.budget, "rows": rows, "labels": {r: ROWS[r] for r in args.rows},
        "search": tuned["search"] if tuned else None, "grid": tuned["grid"] if tuned else None,
        "profiles": tuned["profiles"] if tuned else None,
        "table_markdown": table, "notes": notes, "wall_s": time.perf_counter() - started,
    }, args.output)
    C.say(f"written {path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
