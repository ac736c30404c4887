"""The command line's one vocabulary: each option shared by several subcommands is defined here, once.

==================  ========================================================================
``-r/--recipe PATH``  the recipe file, in every subcommand that reads or writes one (default
                      ``autotune.json``). The older spellings still work, hidden: the positional
                      ``show|check|report [RECIPE]`` and ``search -o/--output``.
``--json``            print what the command reports as one JSON document instead of text
``--no-progress``     no progress line or bar on stderr
``--ranks-per-node N``  the training processes per node whose profile is chosen (default: torchrun's
                      ``LOCAL_WORLD_SIZE``, else 1)
==================  ========================================================================

``-o`` is not part of the vocabulary: it survives only as a hidden alias of what each command wrote
with it before (``search``'s recipe, ``report``'s HTML file, now ``--html``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from autotune.errors import AutotuneError

DEFAULT_RECIPE = "autotune.json"
_POSITIONAL = "recipe_positional"


def add_recipe(p: argparse.ArgumentParser, *, positional: bool = False, aliases: tuple[str, ...] = (),
               writes: bool = False) -> None:
    """``-r/--recipe PATH``; ``positional`` keeps an older ``[RECIPE]`` argument and ``aliases`` older
    flags, both hidden from the help."""
    what = "recipe file to write" if writes else "recipe file"
    p.add_argument("-r", "--recipe", dest="recipe", metavar="PATH", default=None,
                   help=f"{what} (default {DEFAULT_RECIPE})")
    if aliases:
        p.add_argument(*aliases, dest="recipe", metavar="PATH", default=None, help=argparse.SUPPRESS)
    if positional:
        p.add_argument(_POSITIONAL, nargs="?", default=None, metavar="RECIPE", help=argparse.SUPPRESS)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")


def add_no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", dest="progress", action="store_const", const=False, default=None,
                   help="no progress display on stderr")


def add_ranks_per_node(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="training processes on this node, whose profile is chosen (default: torchrun's "
                   "LOCAL_WORLD_SIZE, else 1)")


def add_profile_options(p: argparse.ArgumentParser) -> None:
    """What a command that reads this machine's profile of a recipe takes: the recipe (also as the older
    positional), the ranks per node that choose the profile, and ``--json``."""
    add_recipe(p, positional=True)
    add_ranks_per_node(p)
    add_json(p)


def settle(args: argparse.Namespace) -> None:
    """The shared options' final values, checked once for every subcommand: the recipe path from
    whichever spelling was given (two different ones are refused), ``--ranks-per-node`` at least 1."""
    if hasattr(args, _POSITIONAL):
        given = getattr(args, _POSITIONAL)
        delattr(args, _POSITIONAL)
        if given is not None and args.recipe is not None and given != args.recipe:
            raise AutotuneError(f"Two recipe files given ({given} and --recipe {args.recipe}); give one.")
        args.recipe = args.recipe or given
    if hasattr(args, "recipe") and args.recipe is None:
        args.recipe = DEFAULT_RECIPE
    ranks = getattr(args, "ranks_per_node", None)
    if ranks is not None and (isinstance(ranks, bool) or ranks < 1):
        raise AutotuneError(f"--ranks-per-node must be at least 1, but got {ranks}.")


def print_json(data: Any, out: TextIO | None = None) -> None:
    """``--json``'s one document: indented, no NaN, paths and other objects as text."""
    out = sys.stdout if out is None else out
    json.dump(data, out, indent=2, allow_nan=False, default=str)
    out.write("\n")
