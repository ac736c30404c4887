"""Accelerator utilisation, the MLPerf Storage method: compute time / wall time under an emulated step.

The consumer of each batch is a fixed compute time (``time.sleep``), from loader-bound (short) to
compute-bound (long); utilisation = batches x compute time / wall time of the run (setup included; the
epochs-only figure is in the JSON). Data: the article's JPEGs (``examples/jpeg_folder.py``), batch 64,
3 epochs, the first cold. For each compute time, three rows: the default (``num_workers=0``), the
article's config B (4 workers + pin_memory + persistent; pinning is a no-op without CUDA), and the
recipe of an ``autotune`` search run with that consumer as ``train_step`` (``--budget`` each). Fresh
process per run, rows interleaved, median (min-max) of ``--repeats``.

    python benchmarks/accelerator.py [--compute-ms 20 60 150] [--images 1000] [--budget 40] [--quick]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from harness import BENCHMARKS, EXAMPLES, output, recipes, stats
from harness.child import Setup, child_main
from harness.fresh import allocator_env, run_fresh
from harness.workloads import BATCH, EPOCHS, SleepConsumer, jpeg_dataset, jpeg_files, seeded_loader

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.dataset._userfile import UserSpec

NAME = "accelerator"
ROWS = {"default": "default (`num_workers=0`)", "B": "article B (4 workers + pin + persistent)",
        "autotune": "autotune recipe for this consumer"}
COMPUTE_MS = [20.0, 60.0, 150.0]


def cell_default(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])
    return Setup(jpeg_files(ds), lambda: (seeded_loader(ds, num_workers=0), SleepConsumer(params["compute_s"])))


def cell_b(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])
    return Setup(jpeg_files(ds), lambda: (seeded_loader(ds, num_workers=4, pin_memory=True, persistent_workers=True),
                                          SleepConsumer(params["compute_s"])))


def cell_recipe(params: dict) -> Setup:
    return recipes.recipe_setup(params["profile"], lambda: jpeg_dataset(params["images"]), jpeg_files,
                                cache_dir=str(Path(params["workdir"]) / f"recipe-cache-{os.getpid()}"),
                                consumer=lambda config: SleepConsumer(params["compute_s"]))


CELLS = {"default": cell_default, "B": cell_b, "autotune": cell_recipe}


def utilisation(run: dict, compute_s: float) -> tuple[float, float]:
    compute = compute_s * sum(run["batches"])
    return compute / run["total_s"], compute / sum(run["epoch_s"])


def one_compute_time(args, work: Path, ms: float, repeats: int) -> tuple[dict, list[list[str]]]:
    """Search with this consumer as train_step, then the three rows interleaved."""
    compute_s = ms / 1000
    spec = UserSpec(dataset=jpeg_dataset(args.images), source=str(EXAMPLES / "jpeg_folder.py"), batch_size=BATCH,
                    epochs=EPOCHS, train_step=SleepConsumer(compute_s), sys_path=[str(EXAMPLES), str(BENCHMARKS)])
    output.say(f"compute {ms:g} ms/batch: autotune search, budget {args.budget:.0f} s ...")
    recipe, outcome, timing = recipes.autotune_search(spec, budget=args.budget, workdir=work / f"c{ms:g}")
    output.say(f"  -> {recipe.config.describe()} in {timing['wall_s']:.1f} s")
    base = {"images": args.images, "workdir": str(work), "compute_s": compute_s}
    env = allocator_env(recipe.config.allocator)
    runs = stats.interleaved({
        "default": lambda: run_fresh(__file__, "default", base, epochs=EPOCHS),
        "B": lambda: run_fresh(__file__, "B", base, epochs=EPOCHS),
        "autotune": lambda: run_fresh(__file__, "autotune", {**base, "profile": recipe.profile.to_dict()},
                                      epochs=EPOCHS, env=env),
    }, repeats, log=output.say)
    rows, table_rows = {}, []
    for name, rr in runs.items():
        s = stats.summarise_runs(rr)
        s["utilisation"] = stats.spread([utilisation(r, compute_s)[0] for r in stats.ok(rr)])
        s["utilisation_epochs_only"] = stats.spread([utilisation(r, compute_s)[1] for r in stats.ok(rr)])
        rows[name] = s
        u = s["utilisation"]
        table_rows.append([f"{ms:g}", ROWS[name], recipe.config.describe() if name == "autotune" else "–",
                           output.fmt(s.get("total_s")),
                           f"{100 * u['median']:.0f}% ({100 * u['min']:.0f}–{100 * u['max']:.0f}%)" if u else "–"])
    return ({"compute_ms": ms, "rows": rows, "search": recipes.search_record(recipe, outcome, timing),
             "profile": recipe.profile.to_dict()}, table_rows)


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--compute-ms", type=float, nargs="+", default=COMPUTE_MS)
    p.add_argument("--budget", type=float, default=40.0, help="autotune search budget per compute time, seconds")
    args = p.parse_args(argv)
    if args.cell:
        return child_main(CELLS, args.cell)
    if args.quick:
        args.images, args.budget = min(args.images, 128), min(args.budget, 6.0)
        args.compute_ms = args.compute_ms[:1] if args.compute_ms != COMPUTE_MS else [10.0]
    repeats = args.repeats or (1 if args.quick else 2)
    work = output.workdir(args.workdir, NAME)
    started = time.perf_counter()
    jpeg_dataset(args.images)
    results, table_rows = [], []
    for ms in args.compute_ms:
        result, rows = one_compute_time(args, work, ms, repeats)
        results.append(result)
        table_rows += rows
    table = output.markdown_table(["compute per batch, ms", "loader", "recipe", "total wall, s", "utilisation"],
                                  table_rows)
    notes = [(f"{args.images} JPEGs, batch {BATCH}, {EPOCHS} epochs, first cold; utilisation = batches x compute "
             f"time / wall time (setup included); median (min–max) of {repeats} interleaved fresh-process run(s)."),
             "pin_memory=True in row B as in the article; without CUDA it is a no-op."]
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": repeats, "images": args.images, "batch_size": BATCH, "epochs": EPOCHS, "budget_s": args.budget,
        "compute": results})


if __name__ == "__main__":
    sys.exit(main())
