"""`autotune search PATH[:NAME]`: tune, write the recipe, print a summary."""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import TYPE_CHECKING

from autotune._units import format_bytes, format_seconds
from autotune.cli._options import add_json, add_recipe, print_json
from autotune.cli._validate import summary as validation_summary
from autotune.errors import AutotuneError

if TYPE_CHECKING:
    from autotune._api import Recipe
    from autotune._validate import Validation
    from autotune.dataset import UserSpec
    from autotune.tuner._options import SearchOptions
    from autotune.tuner._study import Outcome


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    """The dataset's flags, then one flag per user option of SearchOptions (its help, its default)."""
    from autotune.tuner._options import SearchOptions, user_fields

    p.add_argument("target", metavar="PATH[:NAME]",
                   help="Python file defining the dataset (NAME defaults to 'dataset')")
    p.add_argument("--batch-size", type=int, help="batch size (default: the file's batch_size, else 32)")
    p.add_argument("--epochs", type=int, help="epochs the recipe is optimised for (default: the file's, else 10)")
    p.add_argument("--samples-per-epoch", type=int, help="samples in one epoch of a stream (IterableDataset) "
                   "without __len__ (default: the file's samples_per_epoch); the epoch is extrapolated from it")
    defaults = SearchOptions()
    for f in user_fields():
        flag = f.metadata["flag"] or f"--{f.name.replace('_', '-')}"
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            # --no-progress sets progress=False; --resume-only sets resume_only=True
            p.add_argument(flag, dest=f.name, action="store_const", const=not default, default=None,
                           help=f.metadata["help"])
            continue
        shown = f" (default {format_seconds(default)})" if f.name == "budget" else (
            f" (default {default})" if default is not None and "(default" not in f.metadata["help"] else "")
        if isinstance(default, int) or f.name in ("max_workers", "max_trials"):
            p.add_argument(flag, dest=f.name, type=int, default=None, help=f.metadata["help"] + shown)
        else:  # text: SearchOptions reads it ("2m", "8G", "memory,pickle")
            p.add_argument(flag, dest=f.name, default=None, help=f.metadata["help"] + shown)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("search", help="tune the DataLoader for a dataset file and write the recipe")
    add_search_arguments(p)
    add_recipe(p, aliases=("-o", "--output"), writes=True)
    add_json(p)
    p.add_argument("--validate", action="store_true",
                   help="then run the recipe as the user will (a fresh process, cold start, its epochs) "
                   "and print predicted vs measured")
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace) -> SearchOptions:
    """SearchOptions from the flags given; the others keep SearchOptions' defaults. The budget's clock runs
    from the command's start (``cli/_main.process_started``; from now when main() is called from Python):
    the imports, the dataset file's and its first sample are the search's to pay."""
    from autotune.tuner._options import SearchOptions, user_fields

    for flag in ("batch_size", "epochs", "samples_per_epoch"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise AutotuneError(f"--{flag.replace('_', '-')} must be a positive integer, but got {value}.")
    given = {f.name: getattr(args, f.name) for f in user_fields() if getattr(args, f.name, None) is not None}
    return SearchOptions(**given, started=getattr(args, "started", None) or time.monotonic())


def summary(recipe: Recipe, outcome: Outcome, output: str | None) -> str:
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
    lines.append(f"  epoch: {format_seconds(epoch)}, the default's (num_workers=0)" if m.is_default else
                 f"  epoch: {format_seconds(epoch)} vs {format_seconds(d_epoch)} for the default "
                 f"(num_workers=0): {epoch / d_epoch if d_epoch else 1.0:.2f}x the default's time")
    lines.append(
        f"  whole run ({recipe.profile.settings.epochs} epochs"
        f"{', cache build included' if recipe.config.cache else ''}): {format_seconds(total)} vs "
        f"{format_seconds(d_total)}: {m.speedup_text()}"
    )
    if m.noisy:
        lines.append(f"  warning: {m.noisy}")
    ranks = recipe.profile.ranks_per_node
    together = f", the {ranks} ranks together" if ranks > 1 else ""
    lines.append(f"  peak memory (main + workers{together}, PSS): {format_bytes(m.peak_memory_bytes or 0)}")
    scope = f"a seeded subset of {sub.measured} of {sub.length} samples, extrapolated" if sub.extrapolated \
        else f"all {sub.length} samples"
    if recipe.profile.dataset.stream:
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
    from autotune.dataset import guarded, load_user_file
    from autotune.recipe._file import RecipeFile

    opts = options_from(args)
    RecipeFile.check_target(args.recipe)  # before the budget is spent
    clock = opts.clock()
    with guarded(clock.wall, clock.read_allowance):  # the file's import and its first sample
        spec = load_user_file(args.target, batch_size=args.batch_size, epochs=args.epochs,
                              samples_per_epoch=args.samples_per_epoch)
    if args.validate and _spec_is_stream(spec):
        raise AutotuneError("--validate runs a map-style dataset's epochs; a stream's recipe is checked by the "
                            "search's own interleaved re-measurement. Drop --validate.")
    recipe, outcome = search_spec(spec, opts, args.recipe)
    validation = validate_recipe(recipe, spec, args) if args.validate else None
    if args.json:
        print_json({"recipe": str(args.recipe), "profile": recipe.profile.to_dict(), "notes": list(outcome.notes),
                    "failed": list(outcome.failed),
                    "validation": None if validation is None else dataclasses.asdict(validation[0])})
        return 0
    print(summary(recipe, outcome, args.recipe))
    if validation is not None:
        print(validation_summary(*validation))
    return 0


def _spec_is_stream(spec: UserSpec) -> bool:
    from autotune.dataset import is_stream

    return is_stream(spec.dataset)


def validate_recipe(recipe: Recipe, spec: UserSpec, args: argparse.Namespace) -> tuple[Validation, str | None]:
    """Run the recipe for real and store predicted against measured in the recipe file."""
    from autotune.cli._validate import validate_spec

    subset = recipe.profile.measured.subset
    # A dataset too large to read whole during a search is validated on as many batches as a trial read.
    max_batches = max(2, subset.measured // spec.batch_size) if subset and subset.extrapolated else None
    return validate_spec(recipe, spec, recipe_path=args.recipe, target=args.target, data_dir=args.data_dir,
                         max_batches=max_batches)
