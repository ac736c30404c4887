"""`autotune validate PATH[:NAME]`: run the recipe as the user will and print predicted against measured.

A fresh process, the factory from a cold start (the dataset's files evicted, an empty cache folder),
the recipe's epochs, each bounded by ``--max-batches`` for a large dataset and then extrapolated as
the search does; build, first epoch, steady epoch and total are compared with the recipe's prediction
and stored in this machine's profile under ``measured["validation"]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from autotune._units import format_seconds
from autotune.cli._options import add_json, add_ranks_per_node, add_recipe, print_json
from autotune.errors import AutotuneError

if TYPE_CHECKING:
    from autotune._api import Recipe
    from autotune._validate import Validation
    from autotune.dataset import UserSpec


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="run the recipe for real: predicted against measured epoch times",
                       description="Run the recipe over the dataset: a cold first epoch and a warm one; print "
                       "predicted against measured with the error in percent, and store it in the recipe.")
    p.add_argument("target", metavar="PATH[:NAME]",
                   help="Python file defining the dataset (NAME defaults to 'dataset')")
    add_recipe(p)
    add_ranks_per_node(p)
    add_json(p)
    p.add_argument("--max-batches", type=int, help="measure at most this many batches per epoch, then extrapolate")
    p.add_argument("--epochs", type=int, help="epochs to run (default: the recipe's)")
    p.add_argument("--batch-size", type=int, help="batch size (default: the recipe's)")
    p.add_argument("--data-dir", help="folder of the dataset's files to evict (default: found from what it opens)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle (default 0)")
    p.add_argument("--no-store", action="store_true", help="do not write the result into the recipe file")
    p.set_defaults(func=run)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def _secs(value: float | None) -> str:
    return "n/a" if value is None else format_seconds(value)


def _fraction(value: float | None) -> str:
    return "unknown" if value is None else f"{100 * value:.0f}%"


def summary(v: Validation, stored_in: str | None) -> str:
    lines = []
    for note in v.notes:
        lines.append(f"note: {note}")
    settings = ", ".join(f"{k}={val!r}" for k, val in v.loader.items())
    lines.append(f"Validated {settings or 'the recipe'} (batch_size={v.batch_size}, seed {v.seed})")
    if v.extrapolated:
        lines.append(f"  measured {v.batches_measured} of {v.full_batches} batches per epoch, extrapolated to the "
                     "whole epoch as the search does")
    else:
        lines.append(f"  measured whole epochs of {v.full_batches} batches")
    e = v.eviction
    if e is not None:
        verdict = "worked" if e.effective else "did NOT work"
        lines.append(f"  eviction {verdict}: {e.files} file(s), {e.bytes / (1 << 20):.1f} MiB (found by: "
                     f"{v.files_found_by}); resident {_fraction(e.resident_before)} before, "
                     f"{_fraction(e.resident_after)} after" + (f"; {e.note}" if e.note else ""))
    lines.append(f"  {'':22}{'predicted':>12}{'measured':>12}{'error':>10}")
    lines.append(f"  {'first epoch (cold)':22}{_secs(v.predicted_first_epoch_seconds):>12}"
                 f"{_secs(v.measured_first_epoch_seconds):>12}{_pct(v.first_epoch_error_percent):>10}")
    lines.append(f"  {'later epoch (warm)':22}{_secs(v.predicted_epoch_seconds):>12}"
                 f"{_secs(v.measured_epoch_seconds):>12}{_pct(v.epoch_error_percent):>10}")
    lines.append(f"  {'build (dataloader())':22}{_secs(v.predicted_build_seconds):>12}"
                 f"{_secs(v.measured_build_seconds):>12}{_pct(v.build_error_percent):>10}")
    if v.measured_total_seconds is not None:
        lines.append(f"  {f'whole run, {v.epochs_run} epochs':22}{_secs(v.predicted_total_seconds):>12}"
                     f"{_secs(v.measured_total_seconds):>12}{_pct(v.total_error_percent):>10}")
    if v.finish_seconds >= 0.005:
        lines.append(f"  the whole run includes {_secs(v.finish_seconds)} waited for at its end: the cache filled "
                     "during the first epoch, written before the process could exit")
    if v.bare_decode_seconds is not None:
        lines.append(f"  build vs bare decode: {_secs(v.measured_build_seconds)} against "
                     f"{_secs(v.bare_decode_seconds)} decoding the same samples on {v.bare_decode_workers or 'no'} "
                     "worker(s)")
    if v.build_parts:
        parts = ", ".join(f"{k} {_secs(val)}" for k, val in v.build_parts.items())
        lines.append(f"  fixed steps, paid once (timed again after the run): {parts}")
    if v.floor_seconds is not None and v.over_floor is not None:
        lines.append(f"  this machine's floor for the run: {_secs(v.floor_seconds)} (every sample decoded once on "
                     f"{v.bare_decode_workers or 'no'} worker(s), nothing stored, {_secs(v.floor_decode_seconds)}; "
                     f"{v.epochs_run} epoch(s) of batch gathers from memory, {_secs(v.floor_gathers_seconds)}): "
                     f"the whole run is {v.over_floor:.2f}x the floor")
        if v.keep_seconds is not None and v.keep_bytes and v.measured_total_seconds is not None:
            held = v.floor_seconds + v.keep_seconds
            workers = v.bare_decode_workers or "no"
            lines.append(f"  keeping the samples: {_secs(v.keep_seconds)} to write the cache's "
                         f"{v.keep_bytes / (1 << 20):.0f} MiB into fresh memory once on {workers} "
                         f"worker(s), which the floor does not count (its samples are in memory before its clock "
                         f"starts): the whole run is {v.measured_total_seconds / held:.2f}x the floor plus keeping")
    if v.fresh_process:
        lines.append(f"  run in a fresh process from a cold start (start-up before the factory: "
                     f"{_secs(v.process_start_seconds)}, not counted)")
    lines.append("  error = (measured - predicted) / predicted: positive when the run took longer than promised")
    if stored_in:
        lines.append(f"Stored in {stored_in} under this profile's measured[\"validation\"].")
    return "\n".join(lines)


def validate_spec(recipe: Recipe, spec: UserSpec, *, recipe_path: str | None, target: str,
                  recipe_file: str | None = None, data_dir: str | None = None, max_batches: int | None = None,
                  epochs: int | None = None, seed: int = 0) -> tuple[Validation, str | None]:
    """Run ``recipe`` as the user will (a fresh process over ``target``, the dataset file), store the result
    when given a recipe path; the validation and where it was stored (shared by `autotune validate` and
    `autotune search --validate`). ``recipe_file`` is where the recipe is read (default ``recipe_path``)."""
    from autotune._validate import store, validate_fresh

    if data_dir:
        from autotune.machine import files_under

        files_under(data_dir)  # a bad folder is refused before the run
    recipe_file = recipe_file or recipe_path
    if recipe_file is None:  # a search that writes no file: the fresh process reads a temporary one
        from autotune.recipe._file import RecipeFile

        with tempfile.TemporaryDirectory(prefix="autotune-validate-") as folder:
            RecipeFile.merge_write(Path(folder) / "autotune.json", recipe.profile)
            return validate_spec(recipe, spec, recipe_path=None, target=target,
                                 recipe_file=str(Path(folder) / "autotune.json"), data_dir=data_dir,
                                 max_batches=max_batches, epochs=epochs, seed=seed)
    result = validate_fresh(recipe, recipe_file, target, batch_size=spec.batch_size,
                            epochs=epochs, max_batches=max_batches, data_dir=data_dir, seed=seed)
    if recipe_path:
        store(recipe_path, result)
    return result, recipe_path or None


def run(args: argparse.Namespace) -> int:
    from autotune._api import load
    from autotune.dataset import load_user_file, require_map_style

    if args.max_batches is not None and args.max_batches < 2:
        raise AutotuneError(f"--max-batches must be at least 2, but got {args.max_batches}.")
    if args.epochs is not None and args.epochs < 1:
        raise AutotuneError(f"--epochs must be at least 1, but got {args.epochs}.")
    if args.batch_size is not None and args.batch_size < 1:
        raise AutotuneError(f"--batch-size must be a positive integer, but got {args.batch_size}.")
    recipe = load(args.recipe, ranks_per_node=args.ranks_per_node)
    spec = load_user_file(args.target, batch_size=args.batch_size or recipe.profile.settings.batch_size)
    require_map_style(spec, "validate")
    result, stored_in = validate_spec(recipe, spec, recipe_path=None if args.no_store else args.recipe,
                                      target=args.target, recipe_file=args.recipe, data_dir=args.data_dir,
                                      max_batches=args.max_batches, epochs=args.epochs, seed=args.seed)
    if args.json:
        print_json({"recipe": str(args.recipe), "stored": stored_in is not None, **dataclasses.asdict(result)})
        return 0
    print(summary(result, stored_in))
    return 0
