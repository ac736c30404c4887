"""A script's command line, its Markdown tables and its JSON under benchmarks/results/."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import RESULTS
from harness.machine import facts


def parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The options every script has: --quick, --repeats, --output, --workdir (and the hidden --cell)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script, not a result")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats of each configuration")
    p.add_argument("--output", default=None, help=f"JSON path (default benchmarks/results/{name}.json)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--cell", help=argparse.SUPPRESS)
    return p


def workdir(path: str | None, name: str) -> Path:
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fmt(s: dict | None, digits: int = 2) -> str:
    """"median (min–max)", or "–"."""
    if not s:
        return "–"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def fmt_bytes(n: float | None) -> str:
    return f"{n / 2**20:,.0f} MiB" if n else "–"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(name: str, payload: dict[str, Any], output: str | Path | None = None,
               machine: dict[str, Any] | None = None) -> Path:
    """Write ``payload`` (plus date and machine facts) atomically to benchmarks/results/<name>.json."""
    path = Path(output) if output else RESULTS / f"{name}.json"
    data = {"benchmark": name, "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "machine": machine or facts(), **payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def finish(name: str, args: argparse.Namespace, started: float, tables: list[str], notes: list[str],
           payload: dict[str, Any], machine: dict[str, Any] | None = None) -> int:
    """Print the tables and notes, write the JSON (with the keys every result has), say where; exit code 0."""
    if args.quick:
        notes = [*notes, "--quick: tiny sizes; a smoke test, not a result."]
    table = "\n\n".join(tables)
    print(table + "\n\n" + "\n".join(f"- {n}" for n in notes))
    path = write_json(name, {"quick": args.quick, **payload, "table_markdown": table, "notes": notes,
                             "wall_s": time.perf_counter() - started}, args.output, machine)
    say(f"written {path} ({time.perf_counter() - started:.0f} s)")
    return 0
