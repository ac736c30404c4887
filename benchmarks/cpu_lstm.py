"""The CPU LSTM case: the default DataLoader and default threads against autotune's recipe.

Data and model: ``examples/imdb_lstm.py`` (IMDB-like synthetic reviews tokenised in ``__getitem__``, padded
in ``collate_fn``, a small LSTM trained on the CPU in ``train_step``); batch 32, 3 epochs. The training
step competes with loader workers for the CPUs, so the recipe may change the worker count and the
main process's thread count (``torch.set_num_threads``).

Rows: default (``num_workers=0``, torch's default threads) and the recipe of ``autotune``'s own search
(``--budget``), built with ``Recipe.dataloader`` (which applies its thread counts). Each run is a fresh
process, the two rows are interleaved, the consumer is the training step itself. The reviews are
generated in memory, so there are no files to evict. Time per epoch, epoch 1 against the later ones.

    python benchmarks/cpu_lstm.py [--repeats 3] [--reviews 1000] [--budget 60] [--quick]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness  # first: it puts examples/ and the checkout's autotune first on sys.path
import imdb_lstm
import torch
from harness import output, recipes, stats
from harness.child import Setup, child_main
from harness.fresh import allocator_env, run_fresh
from harness.workloads import seeded_loader

from autotune.dataset._userfile import UserSpec

NAME = "cpu_lstm"
ROWS = {"default": "default loader, default threads", "autotune": "autotune recipe"}


def cell_default(params: dict) -> Setup:
    ds = imdb_lstm.SyntheticReviews(params["reviews"])
    return Setup(set(), lambda: (seeded_loader(ds, imdb_lstm.batch_size, collate_fn=imdb_lstm.collate_fn),
                                 imdb_lstm.train_step), info={"torch_threads": torch.get_num_threads()})


def cell_recipe(params: dict) -> Setup:
    setup = recipes.recipe_setup(params["profile"], lambda: imdb_lstm.SyntheticReviews(params["reviews"]),
                                 lambda ds: set(), cache_dir=str(Path(params["workdir"]) / "recipe-cache"),
                                 collate_fn=imdb_lstm.collate_fn, consumer=lambda config: imdb_lstm.train_step)
    prepare = setup.prepare

    def with_threads():
        out = prepare()
        setup.info["torch_threads"] = torch.get_num_threads()  # as the recipe left it
        return out

    setup.prepare = with_threads
    return setup


CELLS = {"default": cell_default, "autotune": cell_recipe}


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--reviews", type=int, default=1000)
    p.add_argument("--budget", type=float, default=60.0, help="autotune search budget, seconds")
    p.add_argument("--hog", type=int, default=0, help="busy processes beside the search (a noisy machine): the "
                   "recipe must then keep the default or say it was too noisy to tell")
    args = p.parse_args(argv)
    if args.cell:
        return child_main(CELLS, args.cell)
    if args.quick:
        args.reviews, args.budget = min(args.reviews, 64), min(args.budget, 60.0)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # a smoke test must not wait on a loaded machine
    repeats = args.repeats or (1 if args.quick else 3)
    epochs = imdb_lstm.epochs
    work = output.workdir(args.workdir, NAME)
    started = time.perf_counter()
    spec = UserSpec(dataset=imdb_lstm.SyntheticReviews(args.reviews), source=str(harness.EXAMPLES / "imdb_lstm.py"),
                    batch_size=imdb_lstm.batch_size, epochs=epochs, collate_fn=imdb_lstm.collate_fn,
                    train_step=imdb_lstm.train_step, sys_path=[str(harness.EXAMPLES)])
    output.say(f"autotune search, budget {args.budget:.0f} s ...")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
    try:
        recipe, outcome, timing = recipes.autotune_search(spec, budget=args.budget, workdir=work)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    verdict = recipe.profile.measured.speedup_text()
    output.say(f"  -> {recipe.config.describe()} in {timing['wall_s']:.1f} s: {verdict}")
    base = {"reviews": args.reviews, "workdir": str(work)}
    env = allocator_env(recipe.config.allocator)
    runs = stats.interleaved({
        "default": lambda: run_fresh(__file__, "default", base, epochs=epochs),
        "autotune": lambda: run_fresh(__file__, "autotune", {**base, "profile": recipe.profile.to_dict()},
                                      epochs=epochs, env=env),
    }, repeats, log=output.say)
    rows = {name: stats.summarise_runs(r) for name, r in runs.items()}
    for name, s in rows.items():
        ok = stats.ok(runs[name])
        s["later_epochs_s"] = stats.spread([statistics.mean(r["epoch_s"][1:]) for r in ok])
        s["torch_threads"] = ok[0]["info"].get("torch_threads") if ok else None
    d, t = rows["default"].get("total_s"), rows["autotune"].get("total_s")
    config = {"default": "num_workers=0, cache=none", "autotune": recipe.config.describe()}
    table = output.markdown_table(
        ["row", "settings", "torch threads (main)", "epoch 1, s", "later epochs (mean), s", "epoch 1 / later",
         "setup, s", "total, s", "default total ÷ row total"],
        [[ROWS[n], config[n], str(s.get("torch_threads")), output.fmt((s.get("epoch_s") or [None])[0]),
          output.fmt(s.get("later_epochs_s")), output.fmt(s.get("first_over_steady")), output.fmt(s.get("setup_s")),
          output.fmt(s.get("total_s")),
          f"{d['median'] / s['total_s']['median']:.2f}" if d and s.get("total_s") else "–"]
         for n, s in rows.items()])
    notes = [(f"{args.reviews} reviews, batch {imdb_lstm.batch_size}, {epochs} epochs, the LSTM's training step "
             f"as consumer; median (min–max) of {repeats} interleaved fresh-process run(s)."),
             f"autotune's search took {timing['wall_s']:.0f} s (budget {args.budget:.0f} s), not in the totals"
             + (f", beside {args.hog} busy process(es)" if args.hog else "") + f"; its verdict: {verdict}"
             + (f"; warning: {recipe.profile.measured.noisy}" if recipe.profile.measured.noisy else "") + "."]
    if args.quick:
        notes.append("--quick runs with OMP_NUM_THREADS=1.")
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": repeats, "reviews": args.reviews, "batch_size": imdb_lstm.batch_size, "epochs": epochs,
        "budget_s": args.budget, "rows": rows, "speedup": d["median"] / t["median"] if d and t else None,
        "search": recipes.search_record(recipe, outcome, timing), "profile": recipe.profile.to_dict(),
        "hog": args.hog, "verdict": verdict, "noisy": recipe.profile.measured.noisy})


if __name__ == "__main__":
    sys.exit(main())
