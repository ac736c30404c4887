"""`autotune report [autotune.json]`: a self-contained HTML report of the search (and PNGs with --png)."""

from __future__ import annotations

import argparse

from autotune.cli._options import add_json, add_ranks_per_node, add_recipe, print_json


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML report (and PNGs) of the search behind a recipe",
        description="Write one self-contained HTML file: optimisation history, time per epoch by "
        "num_workers and cache backend, memory by num_workers, the chosen recipe against the default and "
        "the other finalists, cold against warm epoch, and the hardware. Needs matplotlib.",
    )
    add_recipe(p, positional=True)
    p.add_argument("--html", metavar="PATH", default=None, help="HTML file to write (default report.html)")
    p.add_argument("-o", "--output", dest="html", default=None, help=argparse.SUPPRESS)  # the older spelling
    p.add_argument("--png", metavar="DIR", help="also write each plot as a PNG file in DIR")
    add_ranks_per_node(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autotune.diagnose._report import build_report

    result = build_report(args.recipe, args.html or "report.html", args.png, ranks_per_node=args.ranks_per_node)
    if args.json:
        print_json({"recipe": str(args.recipe), "html": str(result.output), "png": [str(p) for p in result.pngs],
                    "notes": [n for n in (result.profile_note, None if result.study_opened else result.study_note)
                              if n],
                    "dashboard_command": result.dashboard_command or None})
        return 0
    if result.profile_note:
        print(f"note: {result.profile_note}")
    if not result.study_opened:
        print(f"note: {result.study_note}; the report shows what the recipe alone holds.")
    print(f"Report written to {result.output}")
    for path in result.pngs:
        print(f"  {path}")
    if result.dashboard_command:
        print(f"Open the study in optuna-dashboard (pip install optuna-dashboard): {result.dashboard_command}")
    return 0
