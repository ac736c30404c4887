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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

NAME = "cpu_lstm"
ROWS = {"default": "default loader, default threads", "autotune": "autotune recipe"}


def reviews(n: int):
    import imdb_lstm

    return imdb_lstm.SyntheticReviews(n)


def cell_default(params: dict) -> C.Setup:
    import imdb_lstm
    import torch

    ds = reviews(params["reviews"])

    def prepare():
        loader = torch.utils.data.DataLoader(ds, batch_size=imdb_lstm.batch_size, shuffle=True,
                                             collate_fn=imdb_lstm.collate_fn,
                                             generator=torch.Generator().manual_seed(C.SEED))
        return loader, imdb_lstm.train_step

    return C.Setup(set(), prepare, info={"torch_threads": torch.get_num_threads()})


def cell_recipe(params: dict) -> C.Setup:
    import imdb_lstm

    setup = C.recipe_setup(params["profile"], lambda: reviews(params["reviews"]), lambda ds: set(),
                           cache_dir=str(Path(params["workdir"]) / "recipe-cache"),
                           collate_fn=imdb_lstm.collate_fn, consumer=lambda config: imdb_lstm.train_step)
    prepare = setup.prepare

    def with_threads():
        import torch

        out = prepare()
        setup.info["torch_threads"] = torch.get_num_threads()  # as the recipe left it
        return out

    setup.prepare = with_threads
    return setup


CELLS = {"default": cell_default, "autotune": cell_recipe}


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__, NAME)
    p.add_argument("--reviews", type=int, default=1000)
    p.add_argument("--budget", type=float, default=60.0, help="autotune search budget, seconds")
    args = p.parse_args(argv)
    if args.cell:
        return C.child_main(CELLS, args.cell)
    import imdb_lstm
    from autotune.dataset._userfile import UserSpec

    if args.quick:
        args.reviews = min(args.reviews, 64)
        args.budget = min(args.budget, 6.0)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # a smoke test must not wait on a loaded machine
    repeats = args.repeats or (1 if args.quick else 3)
    epochs = imdb_lstm.epochs
    work = C.workdir(args.workdir, NAME)
    started = time.perf_counter()

    spec = UserSpec(dataset=reviews(args.reviews), source=str(C.EXAMPLES / "imdb_lstm.py"),
                    batch_size=imdb_lstm.batch_size, epochs=epochs, collate_fn=imdb_lstm.collate_fn,
                    train_step=imdb_lstm.train_step, sys_path=[str(C.EXAMPLES)])
    C.say(f"autotune search, budget {args.budget:.0f} s ...")
    recipe, outcome, timing = C.autotune_search(spec, budget=args.budget, workdir=work)
    C.say(f"  -> {recipe.config.describe()} in {timing['wall_s']:.1f} s")
    script = Path(__file__).resolve()
    base = {"reviews": args.reviews, "workdir": str(work)}
    env = C.env_for_allocator(recipe.config.allocator)
    runs = C.interleaved({
        "default": lambda: C.run_fresh(script, "default", base, epochs=epochs),
        "autotune": lambda: C.run_fresh(script, "autotune", {**base, "profile": recipe.profile.to_dict()},
                                        epochs=epochs, env=env),
    }, repeats, log=C.say)
    rows = {name: C.summarise_runs(r) for name, r in runs.items()}
    for name, s in rows.items():
        ok = [r for r in runs[name] if "failed" not in r]
        s["later_epochs_s"] = C.spread([statistics.mean(r["epoch_s"][1:]) for r in ok])
        s["torch_threads"] = ok[0]["info"].get("torch_threads") if ok else None
    d, t = rows["default"].get("total_s"), rows["autotune"].get("total_s")
    speedup = d["median"] / t["median"] if d and t else None
    config = {"default": "num_workers=0, cache=none", "autotune": recipe.config.describe()}
    table = C.markdown_table(
        ["row", "settings", "torch threads (main)", "epoch 1, s", "later epochs (mean), s", "epoch 1 / later",
         "setup, s", "total, s", "default total ÷ row total"],
        [[ROWS[n], config[n], str(s.get("torch_threads")), C.fmt((s.get("epoch_s") or [None])[0]),
          C.fmt(s.get("later_epochs_s")), C.fmt(s.get("first_over_steady")), C.fmt(s.get("setup_s")),
          C.fmt(s.get("total_s")),
          f"{d['median'] / s['total_s']['median']:.2f}" if d and s.get("total_s") else "–"]
         for n, s in rows.items()])
    notes = [f"{args.reviews} reviews, batch {imdb_lstm.batch_size}, {epochs} epochs, the LSTM's training step "
             f"as consumer; median (min–max) of {repeats} interleaved fresh-process run(s).",
             f"autotune's search took {timing['wall_s']:.0f} s (budget {args.budget:.0f} s), not in the totals."]
    if args.quick:
        notes.append("--quick: tiny sizes, OMP_NUM_THREADS=1; a smoke test, not a result.")
    print(table + "\n\n" + "\n".join(f"- {n}" for n in notes))
    path = C.write_json(NAME, {
        "quick": args.quick, "repeats": repeats, "reviews": args.reviews, "batch_size": imdb_lstm.batch_size,
        "epochs": epochs, "budget_s": args.budget, "rows": rows, "speedup": speedup,
        "search": {**timing, "config": recipe.config.to_json(), "describe": recipe.config.describe(),
                   "trials": outcome.trials, "measured": recipe.measured.to_json()},
        "profile": recipe.profile.to_dict(), "table_markdown": table, "notes": notes,
        "wall_s": time.perf_counter() - started,
    }, args.output)
    C.say(f"written {path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
