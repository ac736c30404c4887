"""Does the memory cache stay shared across forked DataLoader workers? (PyTorch issue 13246)

Fills the memory cache with a dataset of >= 200 MB, iterates one epoch with num_workers=0 and with
4 forked workers, and samples the total PSS of the main process and its workers (psutil
``memory_full_info().pss`` summed over the process and its children) near the end of the epoch.
A naive dataset that keeps a Python list of per-sample tensors is measured the same way.

    .venv/bin/python benchmarks/cache_memory.py [--samples 800] [--workers 4]

Prints the figures and writes benchmarks/results/cache_memory.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autotune.caches import CachedDataset, open_or_build  # noqa: E402

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
        self.samples = [source[i] for i in range(len(source))]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


# --------------------------------------------------------------------------------------------- facts
def collect_cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def collect_usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_facts() -> dict:
    return {
        "cpu_model": collect_cpu_model(),
        "usable_cpus": collect_usable_cpus(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# --------------------------------------------------------------------------------------------- memory
def total_pss() -> tuple[int, list[int]]:
    """PSS of this process plus all its children (the DataLoader workers), in bytes."""
    procs = [psutil.Process()] + psutil.Process().children(recursive=True)
    values = []
    for p in procs:
        try:
            values.append(p.memory_full_info().pss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return sum(values), values


def epoch_pss(dataset: torch.utils.data.Dataset, workers: int, batch_size: int) -> dict:
    """Iterate one shuffled epoch; sample total PSS at 50%, 75% and 90% of the batches; keep the max."""
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        generator=torch.Generator().manual_seed(0),
    )
    n = len(loader)
    marks = {int(n * f) for f in (0.5, 0.75, 0.9)}
    samples = []
    checksum = 0.0
    t0 = time.perf_counter()
    for b, (x, _) in enumerate(loader):
        checksum += float(x[:, 0, 0, 0].sum())  # the consumer touches each batch
        if b in marks:
            total, per_process = total_pss()
            samples.append({"batch": b, "pss_total_bytes": total, "pss_per_process_bytes": per_process})
    seconds = time.perf_counter() - t0
    del loader
    gc.collect()
    peak = max(samples, key=lambda s: s["pss_total_bytes"])
    return {"workers": workers, "batches": n, "epoch_seconds": round(seconds, 3), "checksum": checksum,
            "pss_total_bytes": peak["pss_total_bytes"], "processes": len(peak["pss_per_process_bytes"]),
            "samples": samples}


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=800)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "cache_memory.json")
    parser.add_argument("--no-naive", action="store_true", help="skip the list-of-tensors contrast")
    args = parser.parse_args()
    # 4 workers on fewer CPUs is the point here (memory, not speed): torch's advice is noise.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    source = Synthetic(args.samples)
    base_pss, _ = total_pss()
    cache = open_or_build("memory", source, root=None, manifest={"benchmark": "cache_memory"}, progress=False)
    gc.collect()
    built_pss, _ = total_pss()
    print(f"memory cache: {len(cache)} samples, {mib(cache.nbytes)} in {len(cache.columns)} column buffers "
          f"+ {cache.blobs.nbytes} blob bytes; process PSS {mib(base_pss)} -> {mib(built_pss)}")

    results: dict = {"benchmark": "cache_memory", "machine": machine_facts(),
                     "dataset": {"samples": args.samples, "sample_shape": list(SHAPE), "dtype": "float32",
                                 "payload_bytes": int(args.samples * np.prod(SHAPE) * 4)},
                     "batch_size": args.batch_size, "cache_nbytes": cache.nbytes, "runs": {}}

    def measure(label: str, dataset: torch.utils.data.Dataset) -> None:
        single = epoch_pss(dataset, 0, args.batch_size)
        multi = epoch_pss(dataset, args.workers, args.batch_size)
        ratio = multi["pss_total_bytes"] / single["pss_total_bytes"]
        results["runs"][label] = {"single": single, "workers": multi, "ratio": ratio,
                                  "extra_bytes": multi["pss_total_bytes"] - single["pss_total_bytes"]}
        print(f"{label:>12}: num_workers=0 {mib(single['pss_total_bytes'])}  |  num_workers={args.workers} "
              f"(fork) {mib(multi['pss_total_bytes'])} over {multi['processes']} processes  |  "
              f"ratio {ratio:.3f}  (+{mib(multi['pss_total_bytes'] - single['pss_total_bytes'])})")

    measure("memory cache", CachedDataset(cache))
    if not args.no_naive:
        del cache
        gc.collect()
        measure("naive list", NaiveList(source))

    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
