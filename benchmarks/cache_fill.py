"""Build the cache first, or fill it while the first epoch trains: the whole run, per backend.

Data: the article's random-pixel 224x224 JPEGs (``examples/jpeg_folder.py``), batch 64, shuffled with a
fixed seed, 3 epochs. Every cell runs through ``Recipe.dataloader`` in a fresh process with an empty
cache folder, the JPEGs evicted before setup and before epoch 1, and counts what the process does at
exit (a fill's commit). Cells, interleaved:

  none      no cache, 0 and 2 workers (the reference)
  build     each backend built before the first epoch (its build uses the machine's build workers),
            then read with 0 or 2 workers
  fill      each backend filled by the first epoch's 2 forked persistent workers, read by them after (the
            memory cache's workers decode into its columns and the training process gathers each batch)

Each row's total is also given against the same backend built first (the faster of 0 and 2 workers
reading it), and its first epoch against its second: a first epoch after a build that pays no first
touch of the cache's pages reads as the second.

    python benchmarks/cache_fill.py [--images 2000] [--repeats 3] [--backends memory pickle hdf5 lmdb] [--quick]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from harness import EXAMPLES, output, recipes, stats
from harness.child import child_main
from harness.fresh import run_fresh
from harness.workloads import BATCH, EPOCHS, jpeg_dataset, jpeg_files

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.caches import backend_names
from autotune.config import LoaderConfig

NAME = "cache_fill"
BACKENDS = backend_names()


def config_for(cell: str) -> LoaderConfig:
    """``cache/fill/workers``, e.g. ``pickle/first_epoch/2`` or ``none/build/0``."""
    cache, fill, workers = cell.split("/")
    extra = ({"prefetch_factor": 2, "persistent_workers": True, "multiprocessing_context": "fork"}
             if int(workers) else {})
    return LoaderConfig(num_workers=int(workers), cache=None if cache == "none" else cache, cache_fill=fill, **extra)


def cell(params: dict):
    config = config_for(params["cell"])
    profile = recipes.profile_for(config, batch_size=BATCH, epochs=EPOCHS, source=str(EXAMPLES / "jpeg_folder.py"))
    cache_dir = Path(params["workdir"]) / f"cache-{os.getpid()}"  # empty: the build or the fill is counted
    return recipes.recipe_setup(profile.to_dict(), lambda: jpeg_dataset(params["images"]), jpeg_files,
                                cache_dir=str(cache_dir))


def cells_for(backends: list[str]) -> list[str]:
    out = ["none/build/0", "none/build/2"]
    for backend in backends:
        out += [f"{backend}/build/0", f"{backend}/build/2", f"{backend}/first_epoch/2"]
    return out


def first_over_second(runs: list[dict]) -> dict | None:
    """Each run's first epoch over its second, median (min-max) over the runs."""
    return stats.spread([r["epoch_s"][0] / r["epoch_s"][1] for r in stats.ok(runs)
                         if len(r["epoch_s"]) > 1 and r["epoch_s"][1] > 0])


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    args = p.parse_args(argv)
    if args.cell:
        spec_cell = __import__("json").loads(args.cell)["cell"]
        return child_main({spec_cell: lambda params: cell({**params, "cell": spec_cell})}, args.cell)
    if args.quick:
        args.images, args.backends = min(args.images, 64), ["memory", "pickle"]
    repeats = args.repeats or (1 if args.quick else 3)
    work = output.workdir(args.workdir, NAME)
    started = time.perf_counter()
    jpeg_dataset(args.images)  # write the images once, outside every measurement
    names = cells_for(args.backends)
    params = {"images": args.images, "workdir": str(work)}
    runs = stats.interleaved({c: (lambda c=c: run_fresh(__file__, c, params, epochs=EPOCHS)) for c in names},
                             repeats, log=output.say)
    rows = {c: stats.summarise_runs(runs[c]) for c in names}
    for c in names:
        rows[c]["finish_s"] = stats.spread([r["finish_s"] for r in stats.ok(runs[c])])
    best_build = {b: min((rows[f"{b}/build/{w}"] for w in (0, 2)), key=lambda r: r["total_s"]["median"])
                  for b in args.backends if all(rows[f"{b}/build/{w}"].get("total_s") for w in (0, 2))}
    table_rows = []
    for c in names:
        r = rows[c]
        if not r.get("total_s"):
            table_rows.append([c, *["failed"] * 7])
            continue
        cache, fill, _ = c.split("/")
        vs = "–"
        if fill == "first_epoch" and cache in best_build:
            r["over_best_build"] = r["total_s"]["median"] / best_build[cache]["total_s"]["median"]
            vs = f"{r['over_best_build']:.2f}"
        r["first_over_second"] = first_over_second(runs[c])
        table_rows.append([config_for(c).describe(), output.fmt(r["setup_s"]),
                           *[output.fmt(e) for e in r["epoch_s"]], output.fmt(r["finish_s"]),
                           output.fmt(r["total_s"]), vs, output.fmt(r["first_over_second"])])
    table = output.markdown_table(
        ["configuration", "setup (build), s", "epoch 1 (cold), s", "epoch 2, s", "epoch 3, s", "exit (commit), s",
         "total, s", "fill ÷ best build", "epoch 1 ÷ epoch 2"], table_rows)
    notes = [(f"{args.images} JPEGs, batch {BATCH}, {EPOCHS} epochs; median (min–max) of {repeats} interleaved "
              "fresh-process run(s) through Recipe.dataloader, empty cache folder, files evicted before setup and "
              "before epoch 1; \"exit\" is the fill's commit the process waits for at exit."),
             "fill ÷ best build: the fill's total over the faster of the same backend built first and read by 0 or "
             "2 workers.",
             "epoch 1 ÷ epoch 2: per run, then median (min–max); epoch 1 is cold (files evicted), so without a "
             "cache it is also the cold read's cost."]
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": repeats, "images": args.images, "batch_size": BATCH, "epochs": EPOCHS, "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
