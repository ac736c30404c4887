"""Does the memory cache stay shared across forked DataLoader workers? (PyTorch issue 13246)

Fills the memory cache with a dataset of >= 200 MB, iterates one epoch with num_workers=0 and with
4 forked workers, and samples the total PSS of the main process and its workers
(``autotune.machine._memory.tree_pss``) at 50%, 75% and 90% of the epoch, keeping the largest.
A naive dataset that keeps a Python list of per-sample tensors is measured the same way. Both run in
this one process, one after the other: what is measured is memory, not speed.

    python benchmarks/cache_memory.py [--samples 800] [--workers 4] [--quick]
"""

from __future__ import annotations

import gc
import sys
import time
import warnings

import numpy as np
import psutil
import torch
from harness import machine, output
from harness.workloads import seeded_loader

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.caches import MemoryCache, open_or_build
from autotune.loader import Transformed
from autotune.machine._memory import tree_pss

NAME = "cache_memory"
SHAPE = (3, 224, 224)


class Synthetic(torch.utils.data.Dataset):
    """Deterministic float32 (3, 224, 224) images with an int label: the source the cache reads once."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = np.random.default_rng(i)
        return torch.from_numpy(g.random(SHAPE, dtype=np.float32)), i % 1000


class NaiveList(torch.utils.data.Dataset):
    """The usual in-memory dataset: a Python list holding one tensor per sample."""

    def __init__(self, source: torch.utils.data.Dataset):
        self.samples = [source[i] for i in range(len(source))]  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


def epoch_pss(dataset: torch.utils.data.Dataset, workers: int, batch_size: int) -> dict:
    """Iterate one shuffled epoch; sample total PSS at 50%, 75% and 90% of the batches; keep the max."""
    loader = seeded_loader(dataset, batch_size, num_workers=workers,
                           multiprocessing_context="fork" if workers else None)
    n = len(loader)
    marks = {int(n * f) for f in (0.5, 0.75, 0.9)}
    samples = []
    checksum = 0.0
    t0 = time.perf_counter()
    for b, (x, _) in enumerate(loader):
        checksum += float(x[:, 0, 0, 0].sum())  # the consumer touches each batch
        if b in marks:
            processes = 1 + len(psutil.Process().children(recursive=True))
            samples.append({"batch": b, "pss_total_bytes": tree_pss(), "processes": processes})
    seconds = time.perf_counter() - t0
    del loader
    gc.collect()
    peak = max(samples, key=lambda s: s["pss_total_bytes"])
    return {"workers": workers, "batches": n, "epoch_seconds": round(seconds, 3), "checksum": checksum,
            "pss_total_bytes": peak["pss_total_bytes"], "processes": peak["processes"], "samples": samples}


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--samples", type=int, default=800)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--no-naive", action="store_true", help="skip the list-of-tensors contrast")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.workers = min(args.samples, 64), min(args.workers, 2)
    # 4 workers on fewer CPUs is the point here (memory, not speed): torch's advice is noise.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    started = time.perf_counter()
    source = Synthetic(args.samples)
    base_pss = tree_pss()
    cache = open_or_build("memory", source, manifest={"benchmark": NAME}, progress=False)  # root: unused in memory
    assert isinstance(cache, MemoryCache)
    gc.collect()
    built_pss = tree_pss()
    output.say(f"memory cache: {len(cache)} samples, {output.fmt_bytes(cache.nbytes)} in {len(cache.columns)} "
               f"column buffers + {cache.blobs.nbytes} blob bytes; process PSS {output.fmt_bytes(base_pss)} -> "
               f"{output.fmt_bytes(built_pss)}")
    runs: dict = {}

    def measure(label: str, dataset: torch.utils.data.Dataset) -> list[str]:
        single = epoch_pss(dataset, 0, args.batch_size)
        multi = epoch_pss(dataset, args.workers, args.batch_size)
        extra = multi["pss_total_bytes"] - single["pss_total_bytes"]
        ratio = multi["pss_total_bytes"] / single["pss_total_bytes"]
        runs[label] = {"single": single, "workers": multi, "ratio": ratio, "extra_bytes": extra}
        return [label, output.fmt_bytes(single["pss_total_bytes"]), output.fmt_bytes(multi["pss_total_bytes"]),
                str(multi["processes"]), f"{runs[label]['ratio']:.3f}", output.fmt_bytes(extra)]

    table_rows = [measure("memory cache", Transformed(cache))]
    cache_nbytes = cache.nbytes
    if not args.no_naive:
        del cache
        gc.collect()
        table_rows.append(measure("naive list", NaiveList(source)))
    table = output.markdown_table(["dataset", "PSS, num_workers=0", f"PSS, num_workers={args.workers} (fork)",
                                   "processes", "ratio", "extra"], table_rows)
    notes = [(f"{args.samples} samples of float32 {SHAPE} ({output.fmt_bytes(args.samples * np.prod(SHAPE) * 4)}), "
             f"batch {args.batch_size}; peak of three PSS samples (main + workers) in one epoch, one run each.")]
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": 1, "dataset": {"samples": args.samples, "sample_shape": list(SHAPE), "dtype": "float32",
                                  "payload_bytes": int(args.samples * np.prod(SHAPE) * 4)},
        "batch_size": args.batch_size, "cache_nbytes": cache_nbytes, "runs": runs},
        machine=machine.facts(numpy=np.__version__))


if __name__ == "__main__":
    sys.exit(main())
