"""Issue 7's allocator table, measured on this machine.

Rows: three DataLoader paths (decode 2000 random 224x224 JPEGs with num_workers=0; in-memory float
tensors with num_workers=0; the same with 2 persistent workers). Columns: glibc default,
glibc-tuned (raised mmap/trim thresholds), tcmalloc and jemalloc (preloaded; only where installed).

Every cell runs in a fresh Python process started with ``autotune.recipe._process.launch_env``, so a
preload really applies; the runs are interleaved across columns (A B C D A B C D ...). Each process
runs two epochs and reports the second (the first includes worker start-up and the allocator's
warm-up); the cell is the median over ``--repeats`` processes with the min-max spread. Batch 64,
shuffled with a fixed seed, default torch threads. Beside the wall time each process reports its
own CPU time and minor page faults for that epoch: on a shared machine the wall time of a cell can
be inflated by other load, the faults (what the allocator changes) cannot.

    python benchmarks/allocators.py [--repeats 3] [--output benchmarks/results/allocators.json]

Prints a Markdown table and writes the raw timings with the machine facts as JSON.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from autotune import allocator  # noqa: E402
from autotune.recipe._process import ProcessSettings, launch_env  # noqa: E402

ROWS = {
    "jpeg-0": "decode JPEGs, `num_workers=0` (the article's config A)",
    "memory-0": "in-memory float tensors, `num_workers=0`",
    "memory-2p": "in-memory float tensors, 2 persistent workers",
}
COLUMNS = {
    "glibc": "glibc default",
    "glibc-tuned": "glibc, thresholds raised (1 GiB)",
    "tcmalloc": "tcmalloc (LD_PRELOAD)",
    "jemalloc": "jemalloc (LD_PRELOAD)",
}
BATCH = 64
IMAGES = 2000
EPOCHS = 2  # the second is reported
SEED = 0


# ------------------------------------------------------------------ one cell, in a fresh process


class InMemory:
    """2000 float CHW images in one contiguous tensor; an item is a view, the batch a fresh copy."""

    def __init__(self, n: int):
        import torch

        g = torch.Generator().manual_seed(SEED)
        self.data = torch.rand(n, 3, 224, 224, generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int):
        return self.data[idx], idx % 10


def _jpeg_dataset():
    spec = importlib.util.spec_from_file_location("jpeg_folder", REPO / "examples" / "jpeg_folder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dataset()


def run_cell(row: str, images: int) -> dict:
    import torch
    from torch.utils.data import DataLoader

    if row == "jpeg-0":
        ds = _jpeg_dataset()
        kwargs = {"num_workers": 0}
    elif row == "memory-0":
        ds = InMemory(images)
        kwargs = {"num_workers": 0}
    elif row == "memory-2p":
        ds = InMemory(images)
        kwargs = {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "fork"}
    else:
        raise SystemExit(f"unknown row {row!r}; rows: {', '.join(ROWS)}")
    if len(ds) > images:
        ds = torch.utils.data.Subset(ds, range(images))
    loader = DataLoader(
        ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(SEED), **kwargs
    )
    times, cpu, faults = [], [], []
    for _ in range(EPOCHS):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0 = time.process_time()
        t0 = time.perf_counter()
        for batch in loader:
            pass
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    del batch, loader
    return {
        "epoch_s": times,
        "main_cpu_s": cpu,
        "main_faults": faults,
        "active": allocator.active_allocator(),
    }


# ------------------------------------------------------------------ the driver


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    return env


def measure(row: str, column: str, images: int) -> dict:
    env, notes = launch_env(ProcessSettings(allocator=column), base_env())
    if notes:  # a fallback would measure the wrong thing
        raise SystemExit(f"{column}: {'; '.join(notes)}")
    out = subprocess.run(
        [sys.executable, __file__, "--cell", row, "--images", str(images)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    if out.returncode != 0:
        raise SystemExit(f"{row} / {column} failed:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected = column if column in allocator.PRELOAD_LIBRARIES else "glibc"
    if result["active"] != expected:
        raise SystemExit(f"{row} / {column}: the child allocates with {result['active']}, not {expected}")
    return result


def machine_facts() -> dict:
    """The shared facts, plus what this table depends on: the C library and the preload libraries."""
    return {**_common.machine_facts(), "libc": " ".join(platform.libc_ver()),
            "libraries": {name: allocator.find_library(name) for name in allocator.PRELOAD_LIBRARIES}}


def cell_text(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:.2f} ({min(values):.2f}–{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--images", type=int, default=IMAGES)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "allocators.json"))
    p.add_argument("--cell", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.cell:
        print(json.dumps(run_cell(args.cell, args.images)))
        return 0

    available = allocator.availability()
    columns = [c for c in COLUMNS if available[c] is None]
    skipped = {c: available[c] for c in COLUMNS if available[c] is not None}
    for c, why in skipped.items():
        print(f"{c}: {why}; column left out", file=sys.stderr)

    started = time.time()
    load_before = os.getloadavg()
    raw: dict[str, dict[str, list[dict]]] = {r: {c: [] for c in columns} for r in args.rows}
    for row in args.rows:
        for rep in range(args.repeats):
            for column in columns:  # interleaved: A B C D A B C D ...
                result = measure(row, column, args.images)
                raw[row][column].append(result)
                print(
                    f"{row:10s} {column:12s} #{rep + 1}: epoch 2 {result['epoch_s'][1]:.3f} s "
                    f"(epoch 1 {result['epoch_s'][0]:.3f} s), main-process CPU "
                    f"{result['main_cpu_s'][1]:.3f} s, faults {result['main_faults'][1]}",
                    file=sys.stderr,
                )

    def table(title: str, key: str, fmt) -> str:
        lines = [f"{title}", "", "| path | " + " | ".join(COLUMNS[c] for c in columns) + " |"]
        lines.append("|---" * (len(columns) + 1) + "|")
        for row in args.rows:
            lines.append(
                f"| {ROWS[row]} | "
                + " | ".join(fmt([r[key][1] for r in raw[row][c]]) for c in columns)
                + " |"
            )
        return "\n".join(lines)

    rows_out = []
    for row in args.rows:
        cells = {}
        for column in columns:
            runs = raw[row][column]
            second = [r["epoch_s"][1] for r in runs]
            cells[column] = {
                "median_s": statistics.median(second),
                "min_s": min(second),
                "max_s": max(second),
                "epoch_s": [r["epoch_s"] for r in runs],
                "main_cpu_s": [r["main_cpu_s"] for r in runs],
                "main_faults": [r["main_faults"] for r in runs],
                "active_allocator": runs[0]["active"],
            }
        rows_out.append({"row": row, "path": ROWS[row], "cells": cells})
    tables = "\n\n".join([
        table("Epoch wall time, s: median (min–max)", "epoch_s", cell_text),
        table("Main-process CPU time per epoch, s: median (min–max)", "main_cpu_s", cell_text),
        table("Main-process minor page faults per epoch: median", "main_faults",
              lambda v: f"{int(statistics.median(v)):,}"),
    ])
    print(tables)

    result = {
        "benchmark": "allocators",
        "issue": 7,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "repeats": args.repeats,
        "images": args.images,
        "batch_size": BATCH,
        "method": (
            "each run a fresh process started with autotune.process.launch_env; runs interleaved "
            "across columns; each process runs 2 epochs (shuffled, fixed seed) and the second is "
            "reported; cell = median of the repeats, spread = min-max"
        ),
        "columns": {c: COLUMNS[c] for c in columns},
        "not_available": skipped,
        "rows": rows_out,
        "tables_markdown": tables,
        "wall_s": round(time.time() - started, 1),
        # the machine is shared; a high load average means noisier cells
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)
    print(f"\nwritten {out} ({result['wall_s']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
