"""The allocator table: every memory allocator on three allocation-heavy DataLoader paths, measured here.

Rows: three DataLoader paths (decode 2000 random 224x224 JPEGs with num_workers=0; in-memory float
tensors with num_workers=0; the same with 2 persistent workers). Columns: every registered allocator
(``autotune/process/_family.py``: glibc default, glibc-tuned's raised mmap/trim thresholds, tcmalloc and
jemalloc preloaded), each only where this machine has it.

Every cell runs in a fresh Python process started with ``autotune.process._settings.launch_env``, so a
preload really applies; the runs are interleaved across columns (A B C D A B C D ...). Each process
runs two epochs and reports the second (the first includes worker start-up and the allocator's
warm-up); the cell is the median over ``--repeats`` processes with the min-max spread. Batch 64,
shuffled with a fixed seed, default torch threads, nothing evicted (the second epoch is the one reported).
Beside the wall time each process reports its own CPU time and minor page faults for that epoch: on a
shared machine the wall time of a cell can be inflated by other load, the faults (what the allocator
changes) cannot.

    python benchmarks/allocators.py [--repeats 3] [--images 2000] [--quick]
"""

from __future__ import annotations

import platform
import sys
import time
from functools import partial
from typing import Any

from harness import machine, output, stats
from harness.child import Setup, child_main
from harness.fresh import allocator_env, run_fresh
from harness.workloads import BATCH, InMemoryTensors, jpeg_dataset, seeded_loader

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.process import _family as allocators

NAME = "allocators"
ROWS = {
    "jpeg-0": "decode JPEGs, `num_workers=0` (the article's config A)",
    "memory-0": "in-memory float tensors, `num_workers=0`",
    "memory-2p": "in-memory float tensors, 2 persistent workers",
}
COLUMNS = {name: allocators.get(name).title for name in allocators.names()}
EPOCHS = 2  # the second is reported
LOADERS: dict[str, dict[str, Any]] = {
    "jpeg-0": {"num_workers": 0},
    "memory-0": {"num_workers": 0},
    "memory-2p": {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "fork"},
}


def cell(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"]) if params["row"] == "jpeg-0" else InMemoryTensors(params["images"])
    return Setup(set(), lambda: (seeded_loader(ds, **LOADERS[params["row"]]), lambda batch: None),
                 info={"active": allocators.active()})


def measure(row: str, column: str, images: int) -> dict:
    """One fresh process of ``row`` started with ``column``'s allocator; checks the allocator it got."""
    result = run_fresh(__file__, "cell", {"row": row, "images": images}, epochs=EPOCHS,
                       env=allocator_env(column, at_start=True), timeout=300)
    expected = column if allocators.get(column).preloaded else allocators.DEFAULT
    if result["info"]["active"] != expected:
        raise SystemExit(f"{row} / {column}: the child allocates with {result['info']['active']}, not {expected}")
    return result


def say_row(row: str, text: str) -> None:
    output.say(f"{row:10s} {text}")


def cell_summary(runs: list[dict]) -> dict:
    second = stats.spread([r["epoch_s"][1] for r in runs])
    assert second is not None
    return {"median_s": second["median"], "min_s": second["min"], "max_s": second["max"],
            "epoch_s": [r["epoch_s"] for r in runs], "main_cpu_s": [r["main_cpu_s"] for r in runs],
            "main_faults": [r["main_faults"] for r in runs], "active_allocator": runs[0]["info"]["active"]}


def table(title: str, rows: list[dict], columns: list[str], key: str, fmt) -> str:
    cells = [[ROWS[r["row"]], *(fmt(stats.spread([run[1] for run in r["cells"][c][key]])) for c in columns)]
             for r in rows]
    return title + "\n\n" + output.markdown_table(["path", *(COLUMNS[c] for c in columns)], cells)


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = p.parse_args(argv)
    if args.cell:
        return child_main({"cell": cell}, args.cell)
    if args.quick:
        args.images = min(args.images, 128)
    repeats = args.repeats or (1 if args.quick else 3)
    available = allocators.availability()
    columns = [c for c in COLUMNS if available[c] is None]
    skipped = {c: available[c] for c in COLUMNS if available[c] is not None}
    for c, why in skipped.items():
        output.say(f"{c}: {why}; column left out")
    started = time.perf_counter()
    jpeg_dataset(args.images)  # write the images once, outside every measurement
    rows = []
    for row in args.rows:  # interleaved across columns: A B C D A B C D ...
        runs = stats.interleaved({c: partial(measure, row, c, args.images) for c in columns}, repeats,
                                 log=partial(say_row, row))
        failed = [r["failed"] for rr in runs.values() for r in rr if "failed" in r]
        if failed:
            raise SystemExit(f"{row} failed:\n{failed[0]}")
        rows.append({"row": row, "path": ROWS[row], "cells": {c: cell_summary(runs[c]) for c in columns}})
    tables = [table("Epoch wall time, s: median (min–max)", rows, columns, "epoch_s", output.fmt),
              table("Main-process CPU time per epoch, s: median (min–max)", rows, columns, "main_cpu_s", output.fmt),
              table("Main-process minor page faults per epoch: median", rows, columns, "main_faults",
                    lambda s: f"{int(s['median']):,}")]
    notes = [(f"{args.images} images, batch {BATCH}; each cell the second of {EPOCHS} epochs in a fresh process, "
             f"median (min–max) of {repeats} run(s) interleaved across columns.")]
    notes += [f"{c} left out: {why}" for c, why in skipped.items()]
    return output.finish(NAME, args, started, tables, notes, {
        "repeats": repeats, "images": args.images, "batch_size": BATCH, "columns": {c: COLUMNS[c] for c in columns},
        "not_available": skipped, "rows": rows},
        machine=machine.facts(libc=" ".join(platform.libc_ver()),
                              libraries={n: cls.library() for n in allocators.names()
                                         if issubclass(cls := allocators.get(n), allocators.Preloaded)}))


if __name__ == "__main__":
    sys.exit(main())
