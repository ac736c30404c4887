"""The promise checked: run a recipe for real and compare with what it predicted.

A validation is one user run in miniature, in this process: the dataset's files (and a disk cache's)
are evicted from the page cache, the recipe's DataLoader is built (a cache is opened or built, timed),
then a cold first epoch and warm later ones are consumed by ``train_step`` (or the default consumer).
Shuffling is the user's ``shuffle=True``: a seeded random permutation per epoch.  For a large dataset
each epoch stops after ``max_batches`` batches and is extrapolated to the whole epoch exactly as the
search extrapolates its subset (``autotune.tuner._predict.scale_epoch``).

``error_percent`` is ``(measured - predicted) / predicted * 100``: positive when the run took longer
than the recipe promised.
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import Sampler

from autotune.errors import AutotuneError, RecipeError
from autotune.machine import _evict
from autotune.tuner._measure import timed_epoch
from autotune.tuner._predict import EpochTiming, batches_in, scale_epoch

__all__ = ["Validation", "error_percent", "store", "validate"]


class EpochOrders(Sampler[int]):
    """Yields ``orders[k]`` on its k-th iteration (the last one again after that): a seeded shuffle
    per epoch, cut to the batches a bounded validation measures.  Module level, so it pickles."""

    def __init__(self, orders: list[list[int]]):
        self.orders = orders
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.orders[min(self.epoch, len(self.orders) - 1)])

    def __iter__(self) -> Iterator[int]:
        order = self.orders[min(self.epoch, len(self.orders) - 1)]
        self.epoch += 1
        return iter(order)


def error_percent(measured: float, predicted: float | None) -> float | None:
    """``(measured - predicted) / predicted * 100``; None when there is no positive prediction."""
    if not isinstance(predicted, (int, float)) or predicted <= 0:
        return None
    return (measured - predicted) / predicted * 100.0


@dataclass
class Validation:
    """Predicted against measured for one recipe on this machine."""

    predicted_first_epoch_seconds: float | None
    measured_first_epoch_seconds: float
    first_epoch_error_percent: float | None
    predicted_epoch_seconds: float | None
    measured_epoch_seconds: float
    epoch_error_percent: float | None
    predicted_build_seconds: float | None
    measured_build_seconds: float  # building the loader: opening or building its cache
    batches_measured: int  # per epoch
    full_batches: int
    extrapolated: bool
    epochs: list[dict[str, Any]]  # raw timings: seconds, first_batch, batches
    eviction: _evict.EvictionReport | None
    files_found_by: str
    fits_page_cache: bool | None
    loader: dict[str, Any]
    profile_fingerprint: str
    on_this_machine: bool
    batch_size: int
    seed: int
    validated_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).replace(
        microsecond=0).isoformat())
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["eviction"] = self.eviction.to_dict() if self.eviction is not None else None
        out["loader"] = {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
                         for k, v in self.loader.items()}
        return out


def _timed_epoch(loader: Any, consume: Callable[[Any], Any]) -> EpochTiming:
    return timed_epoch(loader, consume)[0]


def _cache_files(profile: Any, dataset: Any) -> set[str]:
    from autotune.recipe._factory import cache_location

    path = cache_location(profile, dataset)
    if path is None or not os.path.exists(path):
        return set()
    return _evict.files_under(path) if os.path.isdir(path) else {os.path.realpath(path)}


def validate(recipe: Any, dataset: Any, *, transform: Callable | None = None, train_step: Callable | None = None,
             collate_fn: Callable | None = None, batch_size: int | None = None,
             evict_paths: Any = None, max_batches: int | None = None, epochs: int = 2, seed: int = 0,
             progress: bool = False) -> Validation:
    """Run ``recipe`` over ``dataset`` for real: a cold first epoch, then ``epochs - 1`` warm ones.

    ``evict_paths``: the files to evict before the cold epoch (``files_under(--data-dir)``); by default
    they are found from what ``dataset[i]`` opens (``autotune.machine._evict.dataset_files``).  A disk cache
    named in the recipe is evicted too.  ``max_batches`` bounds each epoch (then extrapolated).
    """
    if epochs < 2:
        raise AutotuneError(f"A validation needs at least 2 epochs (a cold and a warm one), but got {epochs=}.")
    if max_batches is not None and max_batches < 2:
        raise AutotuneError(f"--max-batches must be at least 2 (start-up and steady batches), but got {max_batches}.")
    profile = recipe.profile
    tuned_batch = (profile.settings or {}).get("batch_size")
    batch_size = batch_size or tuned_batch or 32
    notes: list[str] = []
    if tuned_batch and batch_size != tuned_batch:
        notes.append(f"validated with batch_size={batch_size}, the recipe was tuned for {tuned_batch}")
    if not recipe.matches_this_machine:
        notes.append("the recipe was tuned on other hardware: " + "; ".join(recipe.changes))
    length = len(dataset)
    full = batches_in(length, batch_size)
    measured_batches = min(full, max_batches) if max_batches else full
    take = min(length, measured_batches * batch_size)
    generator = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(length, generator=generator)[:take].tolist() for _ in range(epochs)]

    # Find and evict the files the cold epoch reads.
    if evict_paths is not None:
        files, found_by = {os.path.realpath(os.fspath(p)) for p in evict_paths}, "given"
    else:
        files, found_by = _evict.dataset_files(dataset, orders[0])
    files |= _cache_files(profile, dataset)
    total_bytes = 0
    for path in files:
        try:
            total_bytes += os.stat(path).st_size
        except OSError:
            pass
    fits = _evict.fits_page_cache(total_bytes) if files else None
    if fits is False:
        notes.append("the data does not fit in the page cache: later epochs are cold too")
    report = _evict.evict(files)
    if not report.effective:
        notes.append(f"the first epoch may not be cold: {report.note}")

    sampler = EpochOrders(orders)
    start = time.perf_counter()
    loader = recipe.dataloader(dataset, transform=transform, collate_fn=collate_fn, batch_size=batch_size,
                               sampler=sampler, progress=progress)
    build_seconds = time.perf_counter() - start
    if train_step is not None:
        consume = train_step
    else:
        from autotune._loader import DeviceConsumer

        consume = DeviceConsumer(bool(loader.pin_memory))
    timings = [_timed_epoch(loader, consume) for _ in range(epochs)]
    settings = dict(getattr(getattr(loader, "autotune", None), "settings", {}) or {})
    del loader

    first = scale_epoch(timings[0], full)
    warm = statistics.median(scale_epoch(t, full) for t in timings[1:])
    predicted = profile.measured.chosen
    pred_first, pred_warm = predicted.first_epoch_seconds, predicted.epoch_seconds
    return Validation(
        predicted_first_epoch_seconds=pred_first,
        measured_first_epoch_seconds=first,
        first_epoch_error_percent=error_percent(first, pred_first),
        predicted_epoch_seconds=pred_warm,
        measured_epoch_seconds=warm,
        epoch_error_percent=error_percent(warm, pred_warm),
        predicted_build_seconds=predicted.build_seconds,
        measured_build_seconds=build_seconds,
        batches_measured=measured_batches,
        full_batches=full,
        extrapolated=measured_batches < full,
        epochs=[asdict(t) for t in timings],
        eviction=report,
        files_found_by=found_by,
        fits_page_cache=fits,
        loader=settings,
        profile_fingerprint=profile.fingerprint,
        on_this_machine=recipe.matches_this_machine,
        batch_size=batch_size,
        seed=seed,
        notes=notes,
    )


def store(recipe_path: str | os.PathLike, validation: Validation) -> Path:
    """Write ``validation`` into its profile's ``measured["validation"]`` in the recipe file, atomically,
    under the recipe file's lock; the other profiles and fields are kept."""
    from autotune.recipe._file import RecipeFile, _locked

    path = Path(recipe_path)
    with _locked(path):
        rf = RecipeFile.read(path)
        profile = rf.profiles.get(validation.profile_fingerprint)
        if profile is None:
            raise RecipeError(
                f"Recipe file {path} has no profile {validation.profile_fingerprint} to store the validation in; "
                "it was changed since it was loaded. Run `autotune validate` again."
            )
        profile.measured = profile.measured.with_validation(validation.to_dict())
        return rf.write(path)
