"""`autotune diagnose PATH[:NAME]`: where a loader's time goes, one table and a verdict in plain words.

``--json`` prints one JSON object instead, stable for scripts (fields are only ever added)::

    {
      "schema": "autotune-diagnose", "version": 1,
      "measurements": {                 # autotune.verdict.Breakdown; seconds, bytes
        "source", "length", "samples", "seed", "batch_size", "usable_cpus", "cuda",
        "sample_cold", "sample_warm",   # dataset[i] per sample, files evicted / in the page cache
        "read_cold", "read_warm",       # opening+reading its files per sample (null: no files seen)
        "files", "file_bytes_per_sample", "fits_in_memory", "evicted",
        "transform",                    # per sample (0 without one)
        "collate", "batch_bytes", "sample_bytes",   # collate per batch; payload sizes
        "transfer",                     # per batch, worker -> main process, extra over in-process
        "pin", "h2d",                   # per batch; null without CUDA
        "consumer", "consumer_kind", "consumer_on_cpu",  # per batch; null when nothing consumes
        "notes": [str],
        "build", "bare_decode",         # memory-cache build vs dataset[i] alone, same samples and workers,
        "build_fixed", "build_workers", # files evicted (null: not measured); its fixed part;
        "build_first_touch", "build_bytes",  # writing the cache's bytes into fresh memory, same workers
        "epochs", "floor", "floor_decode", "floor_gathers", "floor_workers",  # this machine's floor for
                                        # the whole run: decode once on every usable CPU + the epochs'
                                        # batch gathers from memory (null: not measured)
        "recipe_total", "recipe_config", "over_floor",  # --recipe: its predicted whole run, ÷ the floor
      },
      "verdict": {                      # autotune.verdict.Verdict
        "bound": "consumer" | "loader",
        "stage", "first_epoch_stage":   # "storage" | "decode" | "transform" | "collate" | "transfer" | null
        "stages", "cold_stages": {stage: seconds per batch on one CPU}, "shares": {stage: 0..1},
        "loader_cpus", "loader_batch", "loader_batch_cold",
        "ceilings": {"no_stall", "prepared", "cold", "serial", "expected"},  # samples/s; null = unbounded
        "summary": str, "explanation": [str], "helps": [str], "cannot_help": [str]
      }
    }
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from autotune.cli._options import add_json, add_no_progress, add_ranks_per_node
from autotune.dataset import load_user_file, require_map_style
from autotune.errors import AutotuneError, RecipeError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "diagnose",
        help="measure where the loading time goes and say what can help",
        description="Measure, on a seeded subset: dataset[i] cold and warm (file reading vs decode), "
        "transform, collate, worker-to-main transfer, pinning (with CUDA) and the consumer alone; print "
        "the ceilings they imply and a verdict: loader-bound or consumer-bound, and what can help.",
    )
    p.add_argument("target", metavar="PATH[:NAME]",
                   help="Python file defining the dataset (NAME defaults to 'dataset')")
    p.add_argument("--batch-size", type=int, help="batch size (default: the file's batch_size, else 32)")
    p.add_argument("--samples", type=int, help="samples in the measured subset (default: 4 batches, at least 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the subset (default 0)")
    # Its own dest: the shared ``recipe`` option defaults to autotune.json (``_options.settle``), and the
    # floor is held against a recipe only when one is named.
    p.add_argument("-r", "--recipe", dest="floor_recipe", metavar="PATH", default=None,
                   help="a recipe file: its predicted whole run for this machine is shown as a multiple of the floor")
    add_ranks_per_node(p)  # which of the recipe's profiles
    add_json(p)
    add_no_progress(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autotune.diagnose._breakdown import diagnose, format_table, to_json

    for flag in ("batch_size", "samples"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise AutotuneError(f"--{flag.replace('_', '-')} must be a positive integer, but got {value}.")
    spec = load_user_file(args.target, batch_size=args.batch_size)
    require_map_style(spec, "diagnose")
    recipe = _recipe_run(args.floor_recipe, args.ranks_per_node) if args.floor_recipe else None
    m, v = diagnose(spec, samples=args.samples, seed=args.seed, progress=_progress(args.progress is not False),
                    recipe=recipe)
    if args.progress is not False:
        _progress_done()
    if args.json:
        print(json.dumps(to_json(m, v), indent=2, allow_nan=False))
    else:
        print(format_table(m, v))
    return 0


def _recipe_run(path: str, ranks_per_node: int | None) -> tuple[float, str]:
    """This machine's profile's predicted whole run and its configuration (for ``ranks_per_node``, default
    torchrun's ``LOCAL_WORLD_SIZE``); RecipeError (exit 2) without one."""
    from autotune._api import load

    recipe = load(path, on_mismatch="error", ranks_per_node=ranks_per_node)
    total = recipe.measured.chosen.total_seconds
    if total is None:
        raise RecipeError(f"{path} holds no predicted whole run for this machine; run autotune search again.")
    return total, recipe.config.describe(recipe.profile.ranks_per_node)


def _progress(wanted: bool) -> Callable[[str], None] | None:
    if not wanted or not sys.stderr.isatty():
        return None

    def say(text: str) -> None:
        sys.stderr.write(f"\rautotune diagnose: {text}...\033[K")
        sys.stderr.flush()

    return say


def _progress_done() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
