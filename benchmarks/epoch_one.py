"""Epoch 1 after a memory cache's build, with and without the batches' heap made resident during the build.

Data: the article's random-pixel 224x224 JPEGs (``examples/jpeg_folder.py``), batch 64, shuffled with a
fixed seed, 3 epochs. Both cells run the factory's road (``loader.prepare_source``) in a fresh process
under glibc with its thresholds raised (glibc-tuned, applied at run time as the factory applies it): a
memory cache built by the machine's build workers, then read by a loader without workers through the
gather path. They differ in one argument: ``kept_batch`` (the batch size, where the allocator keeps what
it frees), with which the build's idle training process makes two batches' worth of heap resident while
the workers decode (``machine.warm_heap``); without it, epoch 1's first batches take that memory new.
The JPEGs are evicted before setup and before epoch 1; the cells are interleaved.

    python benchmarks/epoch_one.py [--images 2000] [--repeats 5] [--quick]
"""

from __future__ import annotations

import sys
import time

from harness import output, stats
from harness.child import Setup, child_main
from harness.fresh import run_fresh
from harness.workloads import BATCH, EPOCHS, jpeg_dataset, jpeg_files, seeded_loader

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.config import LoaderConfig
from autotune.loader import DeviceConsumer, FactorySite, prepare_source
from autotune.process import apply_at_runtime

NAME = "epoch_one"
CELLS = {"cold": "heap taken by epoch 1", "warmed": "heap made resident during the build"}


def cell(params: dict, warmed: bool) -> Setup:
    config = LoaderConfig(num_workers=0, cache="memory", allocator="glibc-tuned")
    applied = apply_at_runtime(config.process_settings())
    dataset = jpeg_dataset(params["images"])
    setup = Setup(jpeg_files(dataset), lambda: None)  # type: ignore[arg-type,return-value]
    setup.info["applied"] = list(applied.applied)

    def prepare():
        prepared = prepare_source(dataset, config, FactorySite(progress=False), transform=None, collate_fn=None,
                                  kept_batch=BATCH if warmed else None)
        loader = seeded_loader(prepared.dataset, collate_fn=prepared.collate_fn, num_workers=0)
        return loader, DeviceConsumer(False)

    setup.prepare = prepare
    return setup


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--images", type=int, default=2000)
    args = p.parse_args(argv)
    if args.cell:
        return child_main({name: (lambda params, name=name: cell(params, name == "warmed")) for name in CELLS},
                          args.cell)
    if args.quick:
        args.images = min(args.images, 64)
    repeats = args.repeats or (1 if args.quick else 5)
    output.workdir(args.workdir, NAME)
    started = time.perf_counter()
    jpeg_dataset(args.images)  # write the images once, outside every measurement
    params = {"images": args.images}
    runs = stats.interleaved({c: (lambda c=c: run_fresh(__file__, c, params, epochs=EPOCHS)) for c in CELLS},
                             repeats, log=output.say)
    rows = {c: stats.summarise_runs(runs[c]) for c in CELLS}

    def per_run(c: str, fn) -> list[float | None]:
        return [fn(r) if r.get("epoch_s") else None for r in runs[c]]

    for c in CELLS:
        rows[c]["first_over_second"] = stats.spread(
            [r["epoch_s"][0] / r["epoch_s"][1] for r in stats.ok(runs[c]) if r["epoch_s"][1] > 0])
    paired = {
        "total": stats.paired_ratio(per_run("warmed", lambda r: r["total_s"]), per_run("cold", lambda r: r["total_s"])),
        "setup": stats.paired_ratio(per_run("warmed", lambda r: r["setup_s"]), per_run("cold", lambda r: r["setup_s"])),
        "epoch1": stats.paired_ratio(per_run("warmed", lambda r: r["epoch_s"][0]),
                                     per_run("cold", lambda r: r["epoch_s"][0])),
    }
    table = output.markdown_table(
        ["cell", "setup (build), s", "epoch 1, s", "epoch 2, s", "epoch 3, s", "total, s", "epoch 1 ÷ epoch 2"],
        [[CELLS[c], output.fmt(rows[c]["setup_s"]), *[output.fmt(e) for e in rows[c]["epoch_s"]],
          output.fmt(rows[c]["total_s"]), output.fmt(rows[c]["first_over_second"])] for c in CELLS])
    pairs = output.markdown_table(
        ["warmed ÷ cold, per interleaved pair", "median (min–max)"],
        [[k, output.fmt(v, 3)] for k, v in paired.items()])
    notes = [f"{args.images} JPEGs, batch {BATCH}, {EPOCHS} epochs, torch's threads; median (min–max) of {repeats} "
             "interleaved fresh-process runs; files evicted before setup and before epoch 1.",
             "A total ratio whose range holds 1 is a tie: on a machine whose build workers take every core, the "
             "heap's first touch moves from epoch 1 into the build rather than disappearing."]
    return output.finish(NAME, args, started, [table, pairs], notes, {
        "repeats": repeats, "images": args.images, "batch_size": BATCH, "epochs": EPOCHS, "rows": rows,
        "paired": paired})


if __name__ == "__main__":
    sys.exit(main())
