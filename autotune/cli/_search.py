"""`autotune search PATH[:NAME]`: tune, write the recipe, print a summary."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from autotune._units import format_seconds, parse_duration
from autotune.errors import AutotuneError

if TYPE_CHECKING:
    from autotune._api import Recipe
    from autotune.dataset import UserSpec
    from autotune.tuner._study import Outcome, SearchOptions


def parse_size(text: str) -> int:
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
             "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("kmgtib")
    unit = raw[len(number):]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise AutotuneError(f"Memory size must look like 8G, 512M or 2GiB, but got {text!r}.") from None
    if not math.isfinite(value):
        raise AutotuneError(f"Memory size must be a finite size such as 8G or 512M, but got {text!r}.")
    if value <= 0:
        raise AutotuneError(f"Memory size must be positive, but got {text!r}.")
    if value < 1 << 20:
        raise AutotuneError(f"Memory size {text!r} is under 1 MiB, too small for a DataLoader; give a unit, "
                            "e.g. 512M or 8G.")
    return int(value)


def parse_caches(text: str) -> tuple[str, ...]:
    from autotune.caches import backend_names

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if name != "none" and name not in backend_names():
            raise AutotuneError(f"Unknown cache backend {name!r}. Valid backends: none, {', '.join(backend_names())}.")
    return names


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="PATH[:NAME]",
                   help="Python file defining the dataset (NAME defaults to 'dataset')")
    p.add_argument("--budget", default="2m", help="time budget for the whole search, e.g. 90s, 2m, 1h (default 2m)")
    p.add_argument("--batch-size", type=int, help="batch size (default: the file's batch_size, else 32)")
    p.add_argument("--epochs", type=int, help="epochs the recipe is optimised for (default: the file's, else 10)")
    p.add_argument("--samples-per-epoch", type=int, help="samples in one epoch of a stream (IterableDataset) "
                   "without __len__ (default: the file's samples_per_epoch); the epoch is extrapolated from it")
    p.add_argument("--storage", help="Optuna storage URL (default: sqlite file under .autotune/)")
    p.add_argument("--workdir", default=".autotune", help="where studies and caches live (default .autotune)")
    p.add_argument("--caches", help="cache backends to consider, comma-separated, or 'none'")
    p.add_argument("--max-memory", help="memory budget for a candidate, e.g. 8G (default 70%% of available)")
    p.add_argument("--max-workers", type=int, help="upper bound of num_workers (default: usable CPUs)")
    p.add_argument("--ranks-per-node", type=int, default=1, help="training processes sharing this machine")
    p.add_argument("--data-dir", help="folder of the dataset's files, evicted for cold reads (default: the files "
                   "dataset[i] opens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume-only", action="store_true",
                   help="measure nothing: write the recipe from what the study (--storage, shared by a fleet) holds")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("search", help="tune the DataLoader for a dataset file and write the recipe")
    add_search_arguments(p)
    p.add_argument("--output", "-o", default="autotune.json", help="recipe file (default autotune.json)")
    p.add_argument("--validate", action="store_true",
                   help="then run the recipe as the user will (a fresh process, cold start, its epochs) "
                   "and print predicted vs measured")
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace) -> SearchOptions:
    from autotune.tuner._study import SearchOptions

    for flag in ("batch_size", "epochs", "max_workers", "samples_per_epoch"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag == "max_workers" else 1):
            raise AutotuneError(f"--{flag.replace('_', '-')} must be a positive integer, but got {value}.")
    if args.ranks_per_node < 1:
        raise AutotuneError(f"--ranks-per-node must be at least 1, but got {args.ranks_per_node}.")
    budget = parse_duration(args.budget)
    if not math.isfinite(budget):
        raise AutotuneError(f"--budget must be a finite duration such as 90s, 2m or 1h, but got {args.budget!r}.")
    workdir = Path(args.workdir)
    if workdir.exists() and not workdir.is_dir():
        raise AutotuneError(f"--workdir {workdir} is a file, not a folder; pass a folder (default .autotune).")
    return SearchOptions(
        budget=budget,
        workdir=workdir,
        storage=args.storage,
        seed=args.seed,
        caches=parse_caches(args.caches) if args.caches else None,
        max_memory=parse_size(args.max_memory) if args.max_memory else None,
        max_workers=args.max_workers,
        ranks_per_node=args.ranks_per_node,
        progress=not args.no_progress,
        data_dir=args.data_dir,
        resume_only=getattr(args, "resume_only", False),
    )


def summary(recipe: Recipe, outcome: Outcome, output: str | None) -> str:
    from autotune._units import format_bytes
    from autotune.recipe._measured import Subset

    m = recipe.profile.measured
    lines = []
    for note in outcome.notes:
        lines.append(f"note: {note}")
    if outcome.failed:
        lines.append(f"{len(outcome.failed)} candidate(s) failed, e.g.: {outcome.failed[0]}")
    lines.append(f"Best DataLoader settings ({'the plain default' if m.is_default else 'tuned'}):")
    lines.append(f"  {recipe.config.describe(recipe.profile.ranks_per_node)}")
    # a search just made this profile: every figure below is there
    epoch, d_epoch = m.chosen.epoch_seconds or 0.0, m.default.epoch_seconds or 0.0
    total, d_total = m.chosen.total_seconds or 0.0, m.default.total_seconds or 0.0
    sub = m.subset or Subset(measured=0, length=0)
    lines.append(
        f"  epoch: {format_seconds(epoch)} vs {format_seconds(d_epoch)} for the default "
        f"(num_workers=0): {epoch / d_epoch if d_epoch else 1.0:.2f}x the default's time"
    )
    lines.append(
        f"  whole run ({recipe.profile.settings['epochs']} epochs"
        f"{', cache build included' if recipe.config.cache else ''}): {format_seconds(total)} vs "
        f"{format_seconds(d_total)}: {m.speedup or 1.0:.2f}x faster"
    )
    ranks = recipe.profile.ranks_per_node
    together = f", the {ranks} ranks together" if ranks > 1 else ""
    lines.append(f"  peak memory (main + workers{together}, PSS): {format_bytes(m.peak_memory_bytes or 0)}")
    scope = f"a seeded subset of {sub.measured} of {sub.length} samples, extrapolated" if sub.extrapolated \
        else f"all {sub.length} samples"
    if recipe.profile.dataset.get("stream"):
        scope = f"the stream's first {sub.measured} samples" + (
            f" of {sub.length} per epoch, extrapolated" if sub.extrapolated else "")
    lines.append(f"  measured on {scope}; {m.trials} trials ({m.pruned_trials} pruned, "
                 f"{m.failed_trials} failed) in {format_seconds(m.search_seconds or 0.0)}")
    if m.note and m.is_default:
        lines.append(f"  {m.note}")
    if output:
        lines.append(f"Recipe written to {output}; use it with autotune.dataloader(dataset, {str(output)!r}).")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from autotune._api import search_spec
    from autotune.dataset import load_user_file
    from autotune.recipe._file import RecipeFile

    opts = options_from(args)
    if args.output is not None:
        RecipeFile.check_target(args.output)  # before the budget is spent
    spec = load_user_file(args.target, batch_size=args.batch_size, epochs=args.epochs,
                          samples_per_epoch=args.samples_per_epoch)
    if args.validate and _spec_is_stream(spec):
        raise AutotuneError("--validate runs a map-style dataset's epochs; a stream's recipe is checked by the "
                            "search's own interleaved re-measurement. Drop --validate.")
    recipe, outcome = search_spec(spec, opts, args.output)
    print(summary(recipe, outcome, args.output))
    if args.validate:
        print(validate_recipe(recipe, spec, args))
    return 0


def _spec_is_stream(spec: UserSpec) -> bool:
    from autotune.dataset import is_stream

    return is_stream(spec.dataset)


def validate_recipe(recipe: Recipe, spec: UserSpec, args: argparse.Namespace) -> str:
    """Run the recipe for real and store predicted against measured in the recipe file."""
    from autotune.cli._validate import validate_spec

    subset = recipe.profile.measured.subset
    # A dataset too large to read whole during a search is validated on as many batches as a trial read.
    max_batches = max(2, subset.measured // spec.batch_size) if subset and subset.extrapolated else None
    return validate_spec(recipe, spec, recipe_path=args.output, target=args.target, data_dir=args.data_dir,
                         max_batches=max_batches)
