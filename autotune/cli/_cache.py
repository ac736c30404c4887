"""`autotune cache list|clear`: the sample caches in the per-user cache folder, and search trials' leftovers.

Both read names, modes and JSON manifests only: no cache payload is ever decoded here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune._units import format_bytes
from autotune.caches import clear_caches, default_root, disk_names, list_caches
from autotune.cli._options import add_json, print_json

_TRIALS = Path("cache") / "trials"  # under a search's --workdir


def _size(n: float | None) -> str:
    return "-" if n is None else format_bytes(n)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="list or clear the sample caches (in $AUTOTUNE_CACHE_DIR or ~/.cache/autotune)")
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION")
    actions.required = True
    for name, text in (("list", "show each cache: backend, path, samples, size, dataset, date, state"),
                       ("clear", "delete autotune's caches, unfinished builds and trial leftovers")):
        ap = actions.add_parser(name, help=text)
        ap.add_argument("--dir", type=Path, default=None,
                        help="cache folder (default: $AUTOTUNE_CACHE_DIR, else $XDG_CACHE_HOME/autotune, "
                             "else ~/.cache/autotune)")
        ap.add_argument("--workdir", type=Path, default=Path(".autotune"),
                        help="a search's --workdir, whose trial leftovers are included (default %(default)s)")
        add_json(ap)
        if name == "clear":
            ap.add_argument("--backend", choices=list(disk_names()), help="only this backend")
    p.set_defaults(func=run)


def _folders(args: argparse.Namespace) -> list[Path]:
    folders = [args.dir if args.dir is not None else default_root()]
    trials = args.workdir / _TRIALS
    if trials.is_dir() and trials.resolve() != folders[0].resolve():
        folders.append(trials)
    return folders


def run(args: argparse.Namespace) -> int:
    folders = _folders(args)
    if args.cache_action == "clear":
        results = {str(folder): clear_caches(folder, backend=args.backend) for folder in folders}
        if args.json:
            print_json({"folders": results})
            return 0
        for folder, result in results.items():
            n = len(result["removed"])
            print(f"Removed {n} cache{'s' if n != 1 else ''} from {folder}.")
            for path in result["foreign"]:
                print(f"Left {path} untouched: not autotune's.")
            for path in result["busy"]:
                print(f"Left {path} untouched: in use by a running build or trial.")
            for path in result["in_use"]:
                print(f"Left {path} untouched: in use by a loader reading it.")
            for path in result["not_owned"]:
                print(f"Left {path} untouched: owned by another user.")
        return 0
    entries = [e for folder in folders for e in list_caches(folder)]
    if args.json:
        print_json({"folders": [str(f) for f in folders], "caches": entries})
        return 0
    if not entries:
        print(f"No caches in {' or '.join(map(str, folders))}.")
        return 0
    header = ("BACKEND", "PATH", "SAMPLES", "SIZE", "DATASET", "BUILT", "STATE")
    rows = [header] + [
        (e["backend"] or "-", e["path"], "-" if e["samples"] is None else str(e["samples"]), _size(e["nbytes"]),
         str(e["dataset"] or "-"), (e["built"] or "-").replace("T", " ")[:19],
         e["status"] + (", in use" if e.get("in_use") else ""))
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for e in entries:
        if e["status"] in ("untrusted", "corrupt", "foreign"):
            print(f"{e['path']}: {e['status']}: {e['reason']}.")
    if any(e["status"] not in ("valid", "foreign", "building", "trial running") for e in entries):
        print("`autotune cache clear` removes autotune's caches and leftovers (they are rebuilt when next used); "
              "it never touches a folder that is not autotune's.")
    return 0
