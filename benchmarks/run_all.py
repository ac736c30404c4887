"""``make bench``: the issue-5 benchmarks that fit in about 20 minutes on a 2-CPU machine, in order.

1. article_table.py  2000 JPEGs, 3 epochs; 90 s search; 90-point grid on the search's plan; 6 rows x 3
                     interleaved repeats + one memory pass each                      (~10-11 min)
2. search_cost.py    reuses step 1's search and grid (``--reuse``); a RandomSampler study given as
                     long as autotune's search                                         (~1.5-2 min)
3. cpu_lstm.py       1000 reviews, 3 epochs; 60 s search; 2 rows x 3 repeats           (~3 min)
4. accelerator.py    1000 JPEGs, 3 epochs; compute 20/60/150 ms per batch; 40 s search each; 3 rows
                     x 2 repeats                                                        (~4-5 min)

Each script prints its Markdown table (passed through here) and writes benchmarks/results/<name>.json.
Timings are only worth quoting from a quiet machine (see docs/architecture.md, "Measuring on small machines").

    python benchmarks/run_all.py [--quick] [--only article_table cpu_lstm ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("article_table", "search_cost", "cpu_lstm", "accelerator")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="every script's --quick mode (a smoke test)")
    p.add_argument("--only", nargs="+", choices=ORDER, default=list(ORDER))
    p.add_argument("--results", default=None, help="folder for the JSON files (default benchmarks/results)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-all-"))
    extra = ["--quick"] if args.quick else []
    spent: dict[str, float] = {}
    failed: list[str] = []
    for name in ORDER:
        if name not in args.only:
            continue
        cmd = [sys.executable, str(HERE / f"{name}.py"), *extra]
        if name == "article_table":
            cmd += ["--workdir", str(work / "article")]
        elif name == "search_cost" and "article_table" in args.only and "article_table" not in failed:
            cmd += ["--reuse", str(work / "article")]
        if args.results:
            cmd += ["--output", str(Path(args.results) / f"{name}.json")]
        print(f"\n## {name}\n", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        spent[name] = time.perf_counter() - t0
        if rc != 0:
            failed.append(name)
            print(f"\n{name} FAILED (exit {rc})", flush=True)
    print("\n" + "\n".join(f"- {n}: {s:.0f} s" for n, s in spent.items()) + f"\n- all: {sum(spent.values()):.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
