"""What a disk cache's provenance costs: the check at every open, and recording while the build reads.

1. The open's check (``caches._provenance.changed``): one ``stat`` per recorded source file, on a
   synthetic tree of empty files (1,000 per folder), warm (dentries cached) and, as root, cold (after
   ``drop_caches``); on threads (the default from 4,096 files) and on one thread.
2. The build's reads with and without the record (``caches._base.read_source``, 2 forked workers, the
   article's JPEGs read warm so that only the recording differs), and one process's reads watched for
   random draws against bare ``dataset[i]``. In one process, interleaved.

    python benchmarks/provenance.py [--files 2000 1000000] [--images 2000] [--repeats 3] [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from harness import output
from harness.workloads import jpeg_dataset

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.caches import _provenance
from autotune.caches._base import read_source
from autotune.caches._draws import WatchedReads

NAME = "provenance"


def tree(root: Path, n: int) -> dict[str, _provenance.Stat]:
    """``n`` empty files under ``root`` (made once), stated as a build records them."""
    sources = _provenance.Sources()
    for k in range(n):
        folder = root / f"{k // 1000:04d}"
        if k % 1000 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{k:07d}.bin"
        if not path.exists():
            path.touch()
        sources.add(str(path))
    return {p: st for p, st in sources.seen.items() if st is not None}


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("2\n")  # dentries and inodes
        return True
    except OSError:
        return False


def check_cost(work: Path, n: int, repeats: int) -> dict:
    folder = work / f"record-{n}"
    folder.mkdir(parents=True, exist_ok=True)
    entry = _provenance.write(folder, tree(work / f"tree-{n}", n))
    out: dict[str, list[float]] = {"warm": [], "warm, one thread": [], "cold": [], "cold, one thread": []}
    parallel = _provenance._PARALLEL
    for _ in range(repeats):
        for how in out:
            if how.startswith("cold") and not _drop_caches():
                continue
            _provenance._PARALLEL = 1 << 62 if how.endswith("one thread") else parallel
            start = time.perf_counter()
            assert _provenance.changed(folder, entry) == []
            out[how].append(time.perf_counter() - start)
            _provenance._PARALLEL = parallel
    return {how: values for how, values in out.items() if values}


def _read_all(dataset, record: bool) -> float:
    indices = list(range(len(dataset)))
    sources = _provenance.Sources() if record else None
    start = time.perf_counter()
    for _ in read_source(dataset, indices, workers=2, progress=False, sources=sources):
        pass
    return time.perf_counter() - start


def _watched(dataset, watch: bool) -> float:
    reads = WatchedReads(dataset)
    start = time.perf_counter()
    for i in range(len(dataset)):
        _ = reads.read(i) if watch else dataset[i]
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--files", type=int, nargs="+", default=None)
    p.add_argument("--images", type=int, default=None)
    args = p.parse_args(argv)
    started = time.perf_counter()
    files = args.files or ([2000, 20000] if args.quick else [2000, 1_000_000])
    images = args.images or (64 if args.quick else 2000)
    repeats = args.repeats or (1 if args.quick else 3)
    work = output.workdir(args.workdir, NAME)

    rows, checks = [], {}
    for n in files:
        output.say(f"check of {n} recorded files ...")
        checks[n] = res = check_cost(work, n, repeats)
        for how, values in res.items():
            med = statistics.median(values)
            rows.append([f"{n:,}", how, output.fmt(_spread(values), 3), f"{med / n * 1e6:.2f}"])
    tables = [output.markdown_table(["recorded files", "how", "check at open, s", "µs per file"], rows)]

    dataset = jpeg_dataset(images)
    builds: dict[str, list[float]] = {"not recorded": [], "recorded": []}
    reads: dict[str, list[float]] = {"bare dataset[i]": [], "watched for draws": []}
    _read_all(dataset, False)  # the files warm, so that only the recording differs
    for _ in range(repeats):
        for how in builds:
            builds[how].append(_read_all(dataset, how == "recorded"))
        for how in reads:
            reads[how].append(_watched(dataset, how == "watched for draws"))
    base_b, base_r = statistics.median(builds["not recorded"]), statistics.median(reads["bare dataset[i]"])
    tables.append(output.markdown_table(
        [f"{images} JPEGs read", "s", "ratio"],
        [[f"build's reads, 2 workers, {how}", output.fmt(_spread(v)), f"{statistics.median(v) / base_b:.3f}"]
         for how, v in builds.items()]
        + [[f"one process, {how}", output.fmt(_spread(v)), f"{statistics.median(v) / base_r:.3f}"]
           for how, v in reads.items()]))
    notes = [f"{repeats} interleaved repeats in one process; medians (min–max); cold = after drop_caches "
             "(dentries and inodes), as root only"]
    return output.finish(NAME, args, started, tables, notes,
                         {"repeats": repeats, "checks": {str(k): v for k, v in checks.items()}, "builds": builds,
                          "reads": reads, "images": images})


def _spread(values: list[float]) -> dict:
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


if __name__ == "__main__":
    sys.exit(main())
