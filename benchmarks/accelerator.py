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

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import article_table as A  # noqa: E402

NAME = "accelerator"
BATCH = A.BATCH
EPOCHS = A.EPOCHS
ROWS = {"default": "default (`num_workers=0`)", "B": "article B (4 workers + pin + persistent)",
        "autotune": "autotune recipe for this consumer"}


def cell_default(params: dict) -> C.Setup:
    ds = A.jpeg_dataset(params["images"])
    return C.Setup(A.jpeg_files(ds), lambda: (A._loader(ds, num_workers=0), C.SleepConsumer(params["compute_s"])))


def cell_b(params: dict) -> C.Setup:
    ds = A.jpeg_dataset(params["images"])
    return C.Setup(A.jpeg_files(ds), lambda: (
        A._loader(ds, num_workers=4, pin_memory=True, persistent_workers=True), C.SleepConsumer(params["compute_s"])))


def cell_recipe(params: dict) -> C.Setup:
    import os

    return C.recipe_setup(params["profile"], lambda: A.jpeg_dataset(params["images"]), A.jpeg_files,
                          cache_dir=str(Path(params["workdir"]) / f"recipe-cache-{os.getpid()}"),
                          consumer=lambda config: C.SleepConsumer(params["compute_s"]))


CELLS = {"default": cell_default, "B": cell_b, "autotune": cell_recipe}


def utilisation(run: dict, compute_s: float) -> tuple[float, float]:
    compute = compute_s * sum(run["batches"])
    return compute / run["total_s"], compute / sum(run["epoch_s"])


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--compute-ms", type=float, nargs="+", default=[20.0, 60.0, 150.0])
    p.add_argument("--budget", type=float, default=40.0, help="autotune search budget per compute time, seconds")
    args = p.parse_args(argv)
    if args.cell:
        return C.child_main(CELLS, args.cell)
    from autotune.dataset._userfile import UserSpec

    if args.quick:
        args.images = min(args.images, 128)
        args.compute_ms = args.compute_ms[:1] if args.compute_ms != [20.0, 60.0, 150.0] else [10.0]
        args.budget = min(args.budget, 6.0)
    repeats = args.repeats or (1 if args.quick else 2)
    work = C.workdir(args.workdir, NAME)
    started = time.perf_counter()
    A.jpeg_dataset(args.images)
    script = Path(__file__).resolve()
    results = []
    table_rows = []
    for ms in args.compute_ms:
        compute_s = ms / 1000
        spec = UserSpec(dataset=A.jpeg_dataset(args.images), source=str(C.EXAMPLES / "jpeg_folder.py"),
                        batch_size=BATCH, epochs=EPOCHS, train_step=C.SleepConsumer(compute_s),
                        sys_path=[str(C.EXAMPLES), str(Path(__file__).resolve().parent)])
        C.say(f"compute {ms:g} ms/batch: autotune search, budget {args.budget:.0f} s ...")
        recipe, outcome, timing = C.autotune_search(spec, budget=args.budget, workdir=work / f"c{ms:g}")
        C.say(f"  -> {recipe.config.describe()} in {timing['wall_s']:.1f} s")
        base = {"images": args.images, "workdir": str(work), "compute_s": compute_s}
        env = C.env_for_allocator(recipe.config.allocator)
        runs = C.interleaved({
            "default": lambda: C.run_fresh(script, "default", base, epochs=EPOCHS),
            "B": lambda: C.run_fresh(script, "B", base, epochs=EPOCHS),
            "autotune": lambda: C.run_fresh(script, "autotune", {**base, "profile": recipe.profile.to_dict()},
                                            epochs=EPOCHS, env=env),
        }, repeats, log=C.say)
        rows = {}
        for name, rr in runs.items():
            s = C.summarise_runs(rr)
            ok = [r for r in rr if "failed" not in r]
            s["utilisation"] = C.spread([utilisation(r, compute_s)[0] for r in ok])
            s["utilisation_epochs_only"] = C.spread([utilisation(r, compute_s)[1] for r in ok])
            rows[name] = s
            u = s["utilisation"]
            table_rows.append([f"{ms:g}", ROWS[name],
                               recipe.config.describe() if name == "autotune" else "–",
                               C.fmt(s.get("total_s")),
                               f"{100 * u['median']:.0f}% ({100 * u['min']:.0f}–{100 * u['max']:.0f}%)" if u else "–"])
        results.append({"compute_ms": ms, "rows": rows,
                        "search": {**timing, "config": recipe.config.to_json(), "describe": recipe.config.describe(),
                                   "trials": outcome.trials, "measured": recipe.measured.to_json()},
                        "profile": recipe.profile.to_dict()})
    table = C.markdown_table(["compute per batch, ms", "loader", "recipe", "total wall, s", "utilisation"],
                             table_rows)
    notes = [f"{args.images} JPEGs, batch {BATCH}, {EPOCHS} epochs, first cold; utilisation = batches x compute "
             f"time / wall time (setup included); median (min–max) of {repeats} interleaved fresh-process run(s).",
             "pin_memory=True in row B as in the article; without CUDA it is a no-op."]
    if args.quick:
        notes.append("--quick: tiny sizes; a smoke test, not a result.")
    print(table + "\n\n" + "\n".join(f"- {n}" for n in notes))
    path = C.write_json(NAME, {
        "quick": args.quick, "repeats": repeats, "images": args.images, "batch_size": BATCH, "epochs": EPOCHS,
        "budget_s": args.budget, "compute": results, "table_markdown": table, "notes": notes,
        "wall_s": time.perf_counter() - started,
    }, args.output)
    C.say(f"written {path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
