"""The Python API: search, load, dataloader and the Recipe they hand back (docs/architecture.md §6)."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from torch.utils.data import DataLoader

from autotune._units import parse_duration
from autotune.config import LoaderConfig, usual_advice
from autotune.dataset import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS, UserSpec, check_dataset, load_user_file, resolving
from autotune.errors import AutotuneError
from autotune.integrations._lightning import plain_loader
from autotune.integrations._trainer import TrainerArguments, trainer_arguments
from autotune.machine import _hardware as hardware
from autotune.machine import ranks_per_node as ranks_from
from autotune.machine import usable_cpus
from autotune.recipe._adaptive import AdaptiveLoader
from autotune.recipe._factory import FROM_RECIPE, build_loader
from autotune.recipe._file import Profile, RecipeFile, choose_profile
from autotune.recipe._measured import Measured, RunFigures, Subset
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._options import SearchKeywords, SearchOptions

if TYPE_CHECKING:
    from autotune.tuner._predict import Prediction
    from autotune.tuner._study import Outcome

DEFAULT_RECIPE = "autotune.json"
log = logging.getLogger("autotune")


class Recipe:
    """One machine's tuned settings for one dataset, and the factory that applies them."""

    def __init__(self, profile: Profile, path: str | os.PathLike[str] | None = None, changes: list[str] | None = None):
        self.profile = profile
        self.path = Path(path) if path is not None else None
        self.changes = list(changes or [])  # what differs from this machine ([] when tuned here)

    @property
    def matches_this_machine(self) -> bool:
        return not self.changes

    @property
    def config(self) -> LoaderConfig:
        return self.profile.config

    @property
    def loader_kwargs(self) -> dict[str, Any]:
        return self.config.loader_kwargs()

    @property
    def measured(self) -> Measured:
        return self.profile.measured

    def dataloader(self, dataset: Any, *, transform: Callable[..., Any] | None = None,
                   cache: str | None = FROM_RECIPE, cache_dir: str | os.PathLike[str] | None = None,
                   apply_process_settings: bool = True, progress: bool = True, adapt: bool | str = False,
                   **overrides: Any) -> DataLoader[Any] | AdaptiveLoader:
        """A DataLoader over ``dataset`` with this recipe's settings; keyword arguments win over the recipe.

        ``cache="hdf5"`` (or None) forces a cache backend, ``"recipe"`` (the default) takes the recipe's;
        ``transform`` runs after the cache every epoch;
        ``collate_fn``, ``shuffle``, ``sampler``, ``drop_last`` and the like pass through untouched.
        The loader's ``autotune`` attribute says where each setting came from and what was applied.
        ``loader_cls=StatefulDataLoader`` (torchdata) builds that class instead of torch's DataLoader.
        ``adapt=True`` returns an ``AdaptiveLoader``: iterable like the DataLoader, with the same batches, it
        measures the real step's stall and moves workers, prefetch, persistence and pinning at epoch
        boundaries when that is measurably faster; ``adapt="observe"`` measures and never moves. What it
        learns is written into this machine's profile in the recipe file, where the next loader starts.
        """
        learn_to = self.path if adapt and self.matches_this_machine else None
        if adapt and learn_to is None:
            log.info("autotune will not write what this run learns: the recipe %s was tuned on other hardware",
                     self.path or "")
        loader: DataLoader[Any] | AdaptiveLoader = build_loader(
            self.profile, dataset, transform=transform, cache=cache, cache_dir=cache_dir,
            apply_process_settings=apply_process_settings, progress=progress, adapt=adapt, learn_to=learn_to,
            **overrides)
        return loader

    def trainer_arguments(self) -> TrainerArguments:
        """For the Hugging Face Trainer: ``args, not_carried = recipe.trainer_arguments()``, then
        ``TrainingArguments(..., **args)``. ``not_carried`` lists, one line each, what the recipe holds that
        those arguments cannot carry (a cache, the allocator, thread counts) and how to apply it."""
        return trainer_arguments(self.config)

    def __repr__(self) -> str:
        where = "this machine" if self.matches_this_machine else "other hardware"
        m = self.profile.measured
        extra = f", {m.speedup_text()}" if m.speedup is not None else ""
        return f"Recipe({self.config.describe(self.profile.ranks_per_node)}; tuned on {where}{extra})"


def _figures(prediction: Prediction) -> RunFigures:
    return RunFigures(build_seconds=prediction.build_seconds, first_epoch_seconds=prediction.first_epoch_seconds,
                      epoch_seconds=prediction.epoch_seconds, total_seconds=prediction.total_seconds)


def profile_from(outcome: Outcome, spec: UserSpec) -> Profile:
    config, figures, default = outcome.config, outcome.figures, outcome.default_figures
    return Profile(
        hardware=outcome.hardware,
        dataset=DatasetRecord(source=spec.source, length=outcome.probe.length, fingerprint=outcome.probe.fingerprint,
                              stream=outcome.probe.stream,
                              length_known=bool(outcome.probe.stream and outcome.probe.length_known)),
        settings=RunSettings(batch_size=spec.batch_size, epochs=spec.epochs),
        config=config,
        measured=Measured(
            chosen=_figures(figures.prediction),
            default=_figures(default.prediction),
            peak_memory_bytes=figures.peak_memory_bytes,
            default_peak_memory_bytes=default.peak_memory_bytes,
            runs_seconds=figures.runs,
            default_runs_seconds=default.runs,
            trials=outcome.trials,
            failed_trials=len(outcome.failed),
            failures=tuple(sorted(set(outcome.failed))[:10]),
            pruned_trials=outcome.pruned,
            search_seconds=outcome.search_seconds,
            subset=Subset(measured=len(outcome.plan.indices), length=outcome.probe.length),
            is_default=outcome.is_default,
            note=outcome.note,
            notes=tuple(outcome.notes),
            interval=outcome.interval,
            noisy=outcome.noisy,
            has_transform=spec.transform is not None,
            finalists=tuple(outcome.finalists),
            study_name=outcome.study.get("name", ""),
            study_storage=outcome.study.get("storage", ""),
        ),
    )


def search_spec(spec: UserSpec, opts: SearchOptions, output: str | os.PathLike[str] | None) -> tuple[Recipe, Outcome]:
    """Search ``spec`` and, with an ``output`` path, add this machine's profile to that recipe file."""
    if output is not None:
        RecipeFile.check_target(output)  # fails now, not after the budget is spent
    from autotune.tuner._study import search as run_search  # Optuna: imported by a search only

    if output is not None and not opts.factory_runs and Path(output).exists():
        # what validations measured through the factory on each machine: the search predicts from them
        runs = {fp: p.factory_runs for fp, p in RecipeFile.read(output).profiles.items() if p.factory_runs}
        opts = dataclasses.replace(opts, factory_runs=runs)
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        outcome = run_search(spec, opts)
    finally:
        # A DataLoader or torch reading the default context fixes the start method; the caller may still
        # want to choose it (set_start_method without force), so it is left as it was found.
        if multiprocessing.get_start_method(allow_none=True) != method:
            multiprocessing.set_start_method(method, force=True)
    profile = profile_from(outcome, spec)
    if output is not None:
        RecipeFile.merge_write(output, profile)
    return Recipe(profile, output), outcome


def search(dataset: Any, *, batch_size: int = DEFAULT_BATCH_SIZE, epochs: int = DEFAULT_EPOCHS,
           collate_fn: Callable[..., Any] | None = None, transform: Callable[..., Any] | None = None,
           train_step: Callable[..., Any] | None = None, output: str | os.PathLike[str] | None = DEFAULT_RECIPE,
           samples_per_epoch: int | None = None, **options: Unpack[SearchKeywords]) -> Recipe:
    """Tune a DataLoader for ``dataset`` on this machine and return the Recipe (also written to ``output``).

    ``options`` are `autotune search`'s: budget ("2m" or seconds), workdir, storage, seed, caches,
    max_memory, max_workers, ranks_per_node, data_dir, progress, max_trials, max_rounds, resume_only; their
    defaults are SearchOptions' (autotune/tuner/_options.py). ``dataset`` is map-style or a stream (an
    IterableDataset); a stream is measured over a bounded number of batches, and its epoch extrapolated from
    them when its length is known (``__len__``, or ``samples_per_epoch``). The multiprocessing start method is the
    caller's again when it returns."""
    check_dataset(dataset, "the dataset")
    spec = UserSpec(dataset=dataset, source=f"<python object: {type(dataset).__name__}>", batch_size=batch_size,
                    epochs=epochs, collate_fn=collate_fn, transform=transform, train_step=train_step,
                    samples_per_epoch=samples_per_epoch)
    opts = SearchOptions(**options)  # type: ignore[arg-type] # SearchOptions converts and checks each value
    return search_spec(spec, opts, output)[0]


def load(path: str | os.PathLike[str] = DEFAULT_RECIPE, *, on_mismatch: str = "warn", dataset: Any = None,
         budget: str | float = SearchOptions.budget, ranks_per_node: int | None = None) -> Recipe:
    """The profile for this machine from a recipe file.

    Profiles are filed under (hardware, ranks per node): ``ranks_per_node`` defaults to torchrun's
    ``LOCAL_WORLD_SIZE`` (1 outside torchrun), so each rank of a job finds the profile that
    ``autotune search --ranks-per-node N`` wrote.
    With no profile for this machine: ``on_mismatch="warn"`` warns what changed and uses the nearest,
    ``"error"`` raises HardwareMismatch, ``"search"`` tunes here now (``dataset`` or the recipe's dataset
    file), adds this machine's profile to the file and uses it.
    """
    rf = RecipeFile.read(path)
    ranks = ranks_from(ranks_per_node)
    profile, changes = choose_profile(rf, hardware.collect(ranks_per_node=ranks), on_mismatch, stacklevel=3)
    if changes and on_mismatch == "search":
        return _search_here(profile, path, dataset, budget, ranks)
    return Recipe(profile, path, changes)


def _search_here(nearest: Profile, path: str | os.PathLike[str], dataset: Any, budget: str | float,
                 ranks: int = 1) -> Recipe:
    settings, source = nearest.settings, nearest.dataset.source
    if dataset is None:
        if source.startswith("<"):
            raise AutotuneError(
                f"{path} was tuned from a Python object; pass dataset=... to load(on_mismatch='search')."
            )
        spec = load_user_file(source, batch_size=settings.batch_size, epochs=settings.epochs)
    else:
        known = nearest.dataset.stream and nearest.dataset.length_known
        spec = UserSpec(dataset=dataset, source=source, batch_size=settings.batch_size or DEFAULT_BATCH_SIZE,
                        epochs=settings.epochs or DEFAULT_EPOCHS,
                        samples_per_epoch=nearest.dataset.length if known else None)
    opts = SearchOptions(budget=parse_duration(budget), ranks_per_node=ranks)
    return search_spec(spec, opts, path)[0]


def dataloader(dataset: Any, path: str | os.PathLike[str] = DEFAULT_RECIPE, *, on_mismatch: str = "warn",
               ranks_per_node: int | None = None, adapt: bool | str = False,
               **kwargs: Any) -> DataLoader[Any] | AdaptiveLoader:
    """One step: ``load(path)`` then ``Recipe.dataloader(dataset, **kwargs)``.

    With ``adapt`` and no recipe file at ``path``, the loader starts from the search's usual advice (a
    worker per usable CPU, persistent) and adapts from there.
    The one line a LightningDataModule's ``train_dataloader()`` needs; while ``autotune search`` reads
    that datamodule, it returns a plain DataLoader with torch's defaults instead (no recipe is read)."""
    calls = resolving()
    if calls is not None:
        loader: DataLoader[Any] = plain_loader(dataset, calls, **kwargs)
        return loader
    if adapt and not Path(path).exists():
        recipe = Recipe(prior_profile(kwargs.get("batch_size"), ranks_from(ranks_per_node)), path)
    else:
        recipe = load(path, on_mismatch=on_mismatch, dataset=dataset, ranks_per_node=ranks_per_node)
    return recipe.dataloader(dataset, adapt=adapt, **kwargs)


def prior_profile(batch_size: int | None, ranks: int = 1) -> Profile:
    """This machine's profile before any search: the usual advice (``config.usual_advice``), nothing measured."""
    context = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    return Profile(hardware=hardware.collect(ranks_per_node=ranks), dataset=DatasetRecord(source="<no recipe>"),
                   settings=RunSettings(batch_size=batch_size),
                   config=usual_advice(usable_cpus(ranks), context=context))
