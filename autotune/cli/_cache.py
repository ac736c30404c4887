"""`autotune cache list|clear`: the sample caches autotune built under a directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.caches import BACKENDS, DEFAULT_ROOT, clear_caches, list_caches


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="list or clear the sample caches under .autotune/cache")
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION")
    actions.required = True
    lp = actions.add_parser("list", help="show each cache: backend, path, samples, size, dataset, date, state")
    lp.add_argument("--dir", type=Path, default=DEFAULT_ROOT, help="cache directory (default: %(default)s)")
    cp = actions.add_parser("clear", help="delete caches and leftovers of interrupted builds")
    cp.add_argument("--dir", type=Path, default=DEFAULT_ROOT, help="cache directory (default: %(default)s)")
    cp.add_argument("--backend", choices=[b for b in BACKENDS if b != "memory"], help="only this backend")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.cache_action == "clear":
        n = clear_caches(args.dir, backend=args.backend)
        print(f"Removed {n} cache{'s' if n != 1 else ''} from {args.dir}.")
        return 0
    entries = list_caches(args.dir)
    if not entries:
        print(f"No caches in {args.dir}.")
        return 0
    header = ("BACKEND", "PATH", "SAMPLES", "SIZE", "DATASET", "BUILT", "STATE")
    rows = [header] + [
        (e["backend"], e["path"], "-" if e["samples"] is None else str(e["samples"]), _size(e["nbytes"]),
         e["fingerprint"] or "-", (e["built"] or "-").replace("T", " ")[:19], e["status"])
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    bad = [e for e in entries if e["status"] != "valid"]
    if bad:
        print(f"{len(bad)} not valid; `autotune cache clear --dir {args.dir}` removes them "
              "(they are rebuilt when next used).")
    return 0
