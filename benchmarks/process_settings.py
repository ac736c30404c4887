"""The process settings (the allocator knob): what they are worth to a tuned recipe, and which allocator the tuner
picks on each of the allocation-heavy paths.

Part 1, the three loading paths, each searched with the loader held to that path: (a) decode
JPEGs with ``num_workers=0``; (b) in-memory float tensors with ``num_workers=0``; (c) the same with up to
2 workers. The search's own interleaved finalists give the picked recipe's figure against the default.

Part 2, the article's experiment (2000 JPEGs, batch 64, 3 epochs, first cold, build included): the recipe
searched with every allocator against the recipe searched with glibc's defaults only, each run for real
in a fresh process (with its preload, where it has one), interleaved, medians of ``--repeats``.

    python benchmarks/process_settings.py [--budget 60] [--repeats 3] [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import article_table as A
from harness import BENCHMARKS, EXAMPLES, output, recipes, stats
from harness.fresh import allocator_env, run_fresh
from harness.workloads import BATCH, EPOCHS, InMemoryTensors, jpeg_dataset

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.dataset._userfile import UserSpec

NAME = "process_settings"


def _spec(dataset, source: str) -> UserSpec:
    return UserSpec(dataset=dataset, source=source, batch_size=BATCH, epochs=EPOCHS,
                    sys_path=[str(EXAMPLES), str(BENCHMARKS)])


def paths_part(args, work: Path) -> list[dict]:
    cases = [
        ("decode JPEGs, num_workers=0", lambda: jpeg_dataset(args.images), {"max_workers": 0}),
        ("in-memory float tensors, num_workers=0", lambda: InMemoryTensors(args.images), {"max_workers": 0}),
        ("in-memory float tensors, up to 2 workers", lambda: InMemoryTensors(args.images), {"max_workers": 2}),
    ]
    out = []
    for i, (label, make, limits) in enumerate(cases[-1:] if args.quick else cases):  # --quick: workers, pickling
        output.say(f"search: {label} ...")
        recipe, _, timing = recipes.autotune_search(_spec(make(), label), budget=args.budget,
                                                    workdir=work / f"path{i}", caches=("none",), **limits)
        m = recipe.measured
        out.append({"path": label, "picked": recipe.config.describe(), "allocator": recipe.config.allocator,
                    "epoch_s": m.chosen.epoch_seconds, "default_epoch_s": m.default.epoch_seconds,
                    "runs_s": list(m.runs_seconds), "default_runs_s": list(m.default_runs_seconds),
                    "search_s": timing["wall_s"]})
        output.say(f"  -> {recipe.config.describe()}: epoch {m.chosen.epoch_seconds:.2f} s vs default "
                   f"{m.default.epoch_seconds:.2f} s")
    return out


def article_part(args, work: Path, repeats: int) -> dict:
    spec = _spec(jpeg_dataset(args.images), str(EXAMPLES / "jpeg_folder.py"))
    profiles, allocators, searches = {}, {}, {}
    for label, allocs in (("with process settings", None), ("glibc defaults only", ("glibc",))):
        output.say(f"search ({label}) ...")
        recipe, _, timing = recipes.autotune_search(spec, budget=args.budget, workdir=work / label.replace(" ", "-"),
                                                    allocators=allocs)
        profiles[label] = recipe.profile.to_dict()
        allocators[label] = recipe.config.allocator
        searches[label] = {"config": recipe.config.describe(), "wall_s": timing["wall_s"]}
        output.say(f"  -> {recipe.config.describe()}")

    def runner(label: str):  # article_table.py's recipe cell: the same measurement as its autotune row
        params = {"images": args.images, "workdir": str(work), "profile": profiles[label]}
        env = allocator_env(allocators[label])
        return lambda: run_fresh(A.__file__, "autotune", params, epochs=EPOCHS, env=env)

    runs = stats.interleaved({label: runner(label) for label in profiles}, repeats, log=output.say)
    return {"searches": searches, "rows": {label: stats.summarise_runs(runs[label]) for label in profiles}}


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--budget", type=float, default=60.0, help="each search's budget, seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.budget = min(args.images, 128), min(args.budget, 30.0)
    repeats = args.repeats or (1 if args.quick else 3)
    work = output.workdir(args.workdir, NAME)
    started = time.perf_counter()
    jpeg_dataset(args.images)
    paths = paths_part(args, work)
    article = article_part(args, work, repeats)
    t1 = output.markdown_table(
        ["path", "recipe the tuner picks", "allocator", "epoch, s (tuned)", "epoch, s (default)", "ratio"],
        [[r["path"], r["picked"], r["allocator"], f"{r['epoch_s']:.2f}", f"{r['default_epoch_s']:.2f}",
          f"{r['default_epoch_s'] / r['epoch_s']:.2f}x"] for r in paths])
    rows = article["rows"]
    t2 = output.markdown_table(
        ["recipe", "settings", "epoch 1 (cold), s", "epoch 2, s", "epoch 3, s", "setup / cache build, s", "total, s"],
        [[label, article["searches"][label]["config"], *[output.fmt(e) for e in rows[label].get("epoch_s") or []],
          output.fmt(rows[label].get("setup_s")), output.fmt(rows[label].get("total_s"))] for label in rows])
    notes = [(f"Part 1: each search's own interleaved finalists, {args.budget:.0f} s budget; part 2: {args.images} "
             f"JPEGs, batch {BATCH}, {EPOCHS} epochs, median (min–max) of {repeats} interleaved fresh-process run(s).")]
    return output.finish(NAME, args, started, [t1, t2], notes, {
        "repeats": repeats, "images": args.images, "budget_s": args.budget, "paths": paths, "article": article})


if __name__ == "__main__":
    sys.exit(main())
