"""``make bench``: every benchmark script, in order, each writing benchmarks/results/<name>.json.

Minutes are those of the 2-CPU machine the README quotes (each result's ``wall_s``):

1. article_table.py     2000 JPEGs, 3 epochs; 90 s search; 90-point grid on the search's plan; 6 rows x 3
                        interleaved repeats + one memory pass each                          (~20 min)
2. search_cost.py       reuses step 1's search and grid (``--reuse``); a RandomSampler study given as
                        long as autotune's search                                            (~1.5 min)
3. cpu_lstm.py          1000 reviews, 3 epochs; 60 s search; 2 rows x 3 repeats               (~2 min)
4. accelerator.py       512 JPEGs, batch 8, 8 epochs (512 steps a run); compute 5/20/60 ms per batch;
                        30 s search and a 9-point grid each; 3 rows x 2 repeats  (~9 min)
5. allocators.py        3 loader paths x 4 allocators x 3 fresh processes                     (~3 min)
6. process_settings.py  5 searches of 60 s; 2 recipes x 3 repeats                             (~4 min)
7. cache_memory.py      800 samples in the memory cache, 0 and 4 forked workers, PSS           (~1 min)
8. prediction.py        3 examples x (a 60 s search, 3 stored validations, a 60 s search that learns
                        from them, 3 validations of its recipe)                              (~10 min)
9. cache_fill.py        2000 JPEGs, 3 epochs; no cache, and each backend built first (0 or 2 workers)
                        or filled by the first epoch (2 workers): 14 cells x 3 repeats      (~10 min)
10. memory_limit.py     inside a 1.2 GiB cgroup it makes (root; skipped with the reason otherwise):
                        10,000 and 40,000 JPEGs (6 and 24 GB decoded); a 120 s search and a small grid
                        inside the limit; 6 rows x 3 interleaved repeats               (~2 h, estimated)
12. adapt.py            640 CPU-decoded, randomly augmented (uncachable) samples, 8 epochs, a CPU-heavy
                        step; a 60 s search under a cheap step; 4 scenarios (no_regret on mismatch's grid) x
                        (a 6-point grid of what adapt can reach + 3 rows x 3 interleaved repeats): 51 fresh
                        runs                                                     (13-18 min, estimated)
13. epoch_one.py       2000 JPEGs, 3 epochs; a memory cache built by workers, then read without workers,
                        the batches' heap made resident during the build or not: 2 cells x 5 repeats (~1.5 min)

Each script prints its Markdown table (passed through here). Timings are only worth quoting from a quiet
machine (see docs/architecture.md, "Measuring on small machines"). ``--quick`` runs every script's smoke
test mode (tests/test_benchmarks_smoke.py runs it).

    python benchmarks/run_all.py [--quick] [--only article_table cpu_lstm ...] [--results DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("article_table", "search_cost", "cpu_lstm", "accelerator", "allocators", "process_settings",
         "cache_memory", "prediction", "cache_fill", "memory_limit", "provenance", "adapt",
         "epoch_one")


def command(name: str, args: argparse.Namespace, work: Path, failed: list[str]) -> list[str]:
    cmd = [sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if args.quick else []),
           "--workdir", str(work / name)]
    if name == "search_cost" and "article_table" in args.only and "article_table" not in failed:
        cmd += ["--reuse", str(work / "article_table")]
    if args.results:
        cmd += ["--output", str(Path(args.results) / f"{name}.json")]
    return cmd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="every script's --quick mode (a smoke test)")
    p.add_argument("--only", nargs="+", choices=ORDER, default=list(ORDER))
    p.add_argument("--results", default=None, help="folder for the JSON files (default benchmarks/results)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-all-"))
    spent: dict[str, float] = {}
    failed: list[str] = []
    for name in (n for n in ORDER if n in args.only):
        print(f"\n## {name}\n", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(command(name, args, work, failed))
        spent[name] = time.perf_counter() - t0
        if rc != 0:
            failed.append(name)
            print(f"\n{name} FAILED (exit {rc})", flush=True)
    print("\n" + "\n".join(f"- {n}: {s:.0f} s" for n, s in spent.items()) + f"\n- all: {sum(spent.values()):.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
