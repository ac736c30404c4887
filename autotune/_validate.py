"""The promise checked: run a recipe for real and compare with what it predicted.

``validate_fresh`` runs what the user runs: a fresh Python process (``python -m
autotune._validate``) loads the dataset file, evicts its source files, and calls
``autotune.dataloader(...)`` (recipe load and cache build, timed as "build") against an empty temporary
cache folder, so nothing an earlier run built is reused; then the recipe's ``epochs`` (each bounded by
``max_batches`` and extrapolated). After the run, with the clock of the run stopped, the child times
the parts of the build (recipe load, determinism check, cache key) and a bare decode pass of the same
samples on the same build workers (``bare_decode``), so the build's overhead over decoding shows.

``validate`` is the same run in miniature in this process: the dataset's files (and a disk cache's)
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
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler

import autotune
from autotune._api import load
from autotune.caches import dataset_key
from autotune.caches._codec import sample_nbytes
from autotune.caches._disk_fill import close_all
from autotune.caches._memory import _HEAD as SCHEMA_HEAD
from autotune.config import partial_count
from autotune.dataset import (
    bare_decode,
    check_deterministic,
    dataset_fingerprint,
    decode_once,
    epoch_gathers,
    load_user_file,
    require_map_style,
)
from autotune.errors import AutotuneError, RecipeError
from autotune.loader import DeviceConsumer
from autotune.machine import _evict, build_workers, first_touch_seconds
from autotune.recipe import _factory_runs
from autotune.recipe._factory import cache_location
from autotune.recipe._file import Profile, RecipeFile, _locked
from autotune.tuner._measure import timed_epoch
from autotune.tuner._predict import EpochTiming, batches_in, scale_epoch

__all__ = ["Validation", "error_percent", "store", "validate", "validate_fresh"]


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
    validated_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).replace(
        microsecond=0).isoformat())
    notes: list[str] = field(default_factory=list)
    build_error_percent: float | None = None
    predicted_total_seconds: float | None = None
    measured_total_seconds: float | None = None
    total_error_percent: float | None = None
    epochs_run: int | None = None
    fresh_process: bool = False  # run through the factory in a new process, against an empty cache folder
    process_start_seconds: float | None = None  # interpreter, imports and dataset file, before the factory
    bare_decode_seconds: float | None = None  # dataset[i] for every sample once, on the build's workers, cold
    bare_decode_workers: int | None = None
    # This machine's floor for the run (dataset/_floor.py): every sample decoded once on the build's workers,
    # nothing stored, plus every epoch's batch gathers of the whole dataset from memory; the whole run over it.
    floor_decode_seconds: float | None = None
    floor_gathers_seconds: float | None = None
    floor_seconds: float | None = None
    over_floor: float | None = None
    # A memory cache's bytes written into fresh memory once, on the build's workers (machine._first_touch):
    # what keeping the samples costs the run, which the floor does not count (its samples are in memory
    # before its clock starts). None without a memory cache.
    keep_seconds: float | None = None
    keep_bytes: int | None = None
    build_parts: dict[str, float] = field(default_factory=dict)  # seconds of the build's fixed steps
    cache_fill: str | None = None
    # the data the fresh process ran, as a search fingerprints it: its run is kept for that data only
    dataset_fingerprint: str | None = None
    dataset_length: int | None = None
    finish_seconds: float = 0.0  # what the run waited for at its end: a first-epoch fill's commit

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["eviction"] = self.eviction.to_dict() if self.eviction is not None else None
        out["loader"] = {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
                         for k, v in self.loader.items()}
        return out


def _timed_epoch(loader: Any, consume: Callable[[Any], Any]) -> EpochTiming:
    return timed_epoch(loader, consume)[0]


def _cache_files(profile: Profile, dataset: Any) -> set[str]:
    path = cache_location(profile, dataset)
    if path is None or not os.path.exists(path):
        return set()
    return _evict.files_under(path) if os.path.isdir(path) else {os.path.realpath(path)}


def validate(recipe: Any, dataset: Any, *, transform: Callable[..., Any] | None = None,
             train_step: Callable[..., Any] | None = None, collate_fn: Callable[..., Any] | None = None,
             batch_size: int | None = None,
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
    tuned_batch = profile.settings.batch_size
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
        consume = DeviceConsumer(bool(loader.pin_memory))
    timings = [_timed_epoch(loader, consume) for _ in range(epochs)]
    settings = dict(getattr(getattr(loader, "autotune", None), "settings", {}) or {})
    del loader

    return _compare(profile, recipe.matches_this_machine, timings, build_seconds, full=full,
                    measured_batches=measured_batches, epochs=epochs, report=report, found_by=found_by, fits=fits,
                    settings=settings, batch_size=batch_size, seed=seed, notes=notes)


def _compare(profile: Profile, on_this_machine: bool, timings: list[EpochTiming], build_seconds: float, *, full: int,
             measured_batches: int, epochs: int, report: _evict.EvictionReport | None, found_by: str,
             fits: bool | None, settings: dict[str, Any], batch_size: int, seed: int, notes: list[str],
             **extra: Any) -> Validation:
    """Predicted (the profile's ``measured.chosen``) against measured, phase by phase; ``finish_seconds``
    in ``extra`` is what the run waited for at its end (a fill's commit), part of the total."""
    first = scale_epoch(timings[0], full)
    warm = statistics.median(scale_epoch(t, full) for t in timings[1:]) if len(timings) > 1 else None
    predicted = profile.measured.chosen
    pred_first, pred_warm = predicted.first_epoch_seconds, predicted.epoch_seconds
    total = build_seconds + first + (warm or 0.0) * (epochs - 1) + extra.get("finish_seconds", 0.0)
    pred_total = predicted.total_seconds
    if pred_total is not None and predicted.epoch_seconds is not None and epochs != (
            profile.settings.epochs or epochs):  # the same model for the epochs run
        pred_total = ((predicted.build_seconds or 0.0) + (pred_first or 0.0) + predicted.epoch_seconds * (epochs - 1))
    floor = None
    if extra.get("floor_decode_seconds") is not None and extra.get("floor_gathers_seconds") is not None:
        floor = extra["floor_decode_seconds"] + extra["floor_gathers_seconds"]
    return Validation(
        floor_seconds=floor,
        over_floor=total / floor if floor else None,
        predicted_first_epoch_seconds=pred_first,
        measured_first_epoch_seconds=first,
        first_epoch_error_percent=error_percent(first, pred_first),
        predicted_epoch_seconds=pred_warm,
        measured_epoch_seconds=warm if warm is not None else first,
        epoch_error_percent=error_percent(warm, pred_warm) if warm is not None else None,
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
        on_this_machine=on_this_machine,
        batch_size=batch_size,
        seed=seed,
        notes=notes,
        build_error_percent=error_percent(build_seconds, predicted.build_seconds),
        predicted_total_seconds=pred_total,
        measured_total_seconds=total,
        total_error_percent=error_percent(total, pred_total),
        epochs_run=epochs,
        cache_fill=getattr(profile.config, "cache_fill", None) if profile.config.cache else None,
        **extra,
    )


def store(recipe_path: str | os.PathLike[str], validation: Validation) -> Path:
    """Write ``validation`` into its profile's ``measured["validation"]`` in the recipe file, atomically,
    under the recipe file's lock; the other profiles and fields are kept. A run through the factory in a
    fresh process is added to the profile's ``factory_runs``, which the next search on this machine
    predicts from (recipe/_factory_runs.py)."""

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
        run = _factory_runs.from_validation(validation, profile)
        if run is not None:
            profile.factory_runs = _factory_runs.merged(profile.factory_runs, (run,))
        return rf.write(path)


# --------------------------------------------------------------------------- the user's run, in a new process

_FRESH_TIMEOUT = 3600.0  # seconds; a validation that hangs is stopped, not waited for forever


def _build_parts(recipe_path: str, dataset: Any, profile: Profile) -> dict[str, float]:
    """The fixed steps of the factory's build, each timed again on their own (the files now warm)."""

    parts: dict[str, float] = {}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load(recipe_path)
    parts["recipe_load"] = time.perf_counter() - start
    if profile.config.cache:
        start = time.perf_counter()
        check_deterministic(dataset)
        parts["determinism_check"] = time.perf_counter() - start
        if not profile.config.cache_in_memory:
            start = time.perf_counter()
            dataset_key(dataset)
            parts["cache_key"] = time.perf_counter() - start
        else:  # the samples a memory cache reads in this process to fix its schema, before any worker
            start = time.perf_counter()
            for i in range(min(SCHEMA_HEAD, len(dataset))):
                dataset[i]
            parts["schema_head"] = time.perf_counter() - start
    if profile.config.num_workers:
        parts["worker_start"] = _worker_start(profile.config.num_workers, profile.config.multiprocessing_context)
    return parts


def _worker_start(workers: int, context: str | None) -> float:
    """Seconds for ``workers`` DataLoader workers of ``context`` to start from this process and hand back
    one trivial item each: what starting the recipe's workers costs, its samples apart."""
    items = torch.utils.data.TensorDataset(torch.arange(workers))
    start = time.perf_counter()
    for _ in torch.utils.data.DataLoader(items, batch_size=1, num_workers=workers, multiprocessing_context=context):
        pass
    return time.perf_counter() - start


def _child(payload: dict[str, Any]) -> dict[str, Any]:
    """The fresh process's run (see the module docstring); returns what it measured, as JSON-able data."""

    ready_wall = time.time()
    spec = load_user_file(payload["target"], batch_size=payload["batch_size"])
    require_map_style(spec, "validate")
    dataset = spec.dataset
    loaded_wall = time.time()
    length, batch_size, epochs = len(dataset), payload["batch_size"], payload["epochs"]
    full = batches_in(length, batch_size)
    max_batches = payload.get("max_batches")
    measured_batches = min(full, max_batches) if max_batches else full
    take = min(length, measured_batches * batch_size)
    generator = torch.Generator().manual_seed(payload["seed"])
    orders = [torch.randperm(length, generator=generator)[:take].tolist() for _ in range(epochs)]
    # Every file the build or the epochs read (the whole dataset's: a build reads it all), found as the
    # search finds them (--data-dir, a Hugging Face dataset's Arrow files, or what dataset[i] opens).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cached = autotune.load(payload["recipe"]).config.cache is not None
    read = list(range(length)) if cached else sorted({i for order in orders for i in order})
    sources = _evict.source_files(dataset, read, length, payload.get("data_dir"))
    files, found_by = set(sources.files), "given" if payload.get("data_dir") else sources.how
    total_bytes = sum(os.stat(p).st_size for p in files if os.path.exists(p))
    fits = _evict.fits_page_cache(total_bytes) if files else None
    report = _evict.evict(files)

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once by the parent's load; the run is what is measured here
        loader = autotune.dataloader(dataset, payload["recipe"], transform=spec.transform, collate_fn=spec.collate_fn,
                                     batch_size=batch_size, sampler=EpochOrders(orders), progress=False)
    build_seconds = time.perf_counter() - start
    consume = spec.train_step if spec.train_step is not None else DeviceConsumer(bool(loader.pin_memory))
    timings = [_timed_epoch(loader, consume) for _ in range(epochs)]
    settings = dict(getattr(getattr(loader, "autotune", None), "settings", {}) or {})
    del loader
    start = time.perf_counter()
    close_all()  # what exit does before the process can end: a first-epoch fill's commit (caches/_disk_fill.py)
    finish_seconds = time.perf_counter() - start

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = autotune.load(payload["recipe"]).profile
    parts = _build_parts(payload["recipe"], dataset, profile)
    workers = build_workers()
    decode = bare_decode(dataset, workers, files) if profile.config.cache else None  # what a build is held against
    # The floor's decode: that pass, or, where the run read only some samples, theirs scaled to the dataset.
    floor_decode = decode
    if floor_decode is None and read:  # a run that read no sample has no floor to be held against
        floor_decode = decode_once(dataset, read, workers, files) * length / len(read)
    nbytes = sample_nbytes(dataset[0])
    gathers = epoch_gathers(length, nbytes, batch_size, payload["seed"]) * epochs
    config = profile.config
    kept = nbytes * partial_count(config.cache_share, length) if config.cache and config.cache_in_memory else 0
    keep = first_touch_seconds(kept, workers) if kept else None
    fingerprint = dataset_fingerprint(dataset, spec.source_text)
    return {
        "timings": [asdict(t) for t in timings], "build_seconds": build_seconds, "report": report.to_dict(),
        "finish_seconds": finish_seconds,
        "found_by": found_by, "fits": fits, "settings": {k: v if isinstance(v, (str, int, float, bool, type(None)))
                                                         else repr(v) for k, v in settings.items()},
        "full": full, "measured_batches": measured_batches, "ready_wall": ready_wall, "loaded_wall": loaded_wall,
        "build_parts": parts, "bare_decode_seconds": decode, "bare_decode_workers": workers,
        "floor_decode_seconds": floor_decode, "floor_gathers_seconds": gathers,
        "keep_seconds": keep, "keep_bytes": kept or None,
        "profile_fingerprint": profile.fingerprint, "dataset_fingerprint": fingerprint, "dataset_length": length,
    }


def validate_fresh(recipe: Any, recipe_path: str | os.PathLike[str], target: str, *, batch_size: int | None = None,
                   epochs: int | None = None, max_batches: int | None = None, data_dir: str | None = None,
                   seed: int = 0, timeout: float = _FRESH_TIMEOUT) -> Validation:
    """Run the recipe as the user will (see the module docstring): ``target`` is the dataset file
    (``PATH[:NAME]``), ``recipe_path`` the recipe ``recipe`` was loaded from; ``epochs`` defaults to the
    recipe's. The temporary cache folder is removed afterwards, whatever happens."""
    profile = recipe.profile
    tuned_batch = profile.settings.batch_size
    batch_size = batch_size or tuned_batch or 32
    epochs = epochs or profile.settings.epochs or 2
    if epochs < 1:
        raise AutotuneError(f"--epochs must be at least 1, but got {epochs}.")
    if max_batches is not None and max_batches < 2:
        raise AutotuneError(f"--max-batches must be at least 2 (start-up and steady batches), but got {max_batches}.")
    notes: list[str] = []
    if tuned_batch and batch_size != tuned_batch:
        notes.append(f"validated with batch_size={batch_size}, the recipe was tuned for {tuned_batch}")
    if not recipe.matches_this_machine:
        notes.append("the recipe was tuned on other hardware: " + "; ".join(recipe.changes))
    payload = {"target": target, "recipe": os.path.abspath(os.fspath(recipe_path)), "batch_size": batch_size,
               "epochs": epochs, "max_batches": max_batches, "data_dir": data_dir, "seed": seed}
    cache_root = tempfile.mkdtemp(prefix="autotune-validate-")
    env = dict(os.environ)
    env["AUTOTUNE_CACHE_DIR"] = cache_root
    if profile.ranks_per_node > 1:  # the child chooses the profile a rank of such a job would
        env["LOCAL_WORLD_SIZE"] = str(profile.ranks_per_node)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
    try:
        spawned = time.time()
        out = subprocess.run([sys.executable, "-m", "autotune._validate", json.dumps(payload)], env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise AutotuneError(f"The validation run did not finish within {timeout:.0f} s; bound it with "
                            "--max-batches.") from None
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        errors = [line for line in out.stderr.splitlines() if line.startswith("autotune: error: ")]
        if errors:
            raise AutotuneError(errors[-1].removeprefix("autotune: error: "))
        tail = " | ".join(out.stderr.strip().splitlines()[-3:])
        raise AutotuneError(f"The validation run failed (exit {out.returncode}): {tail}")
    got = json.loads(lines[-1])
    if got["profile_fingerprint"] != profile.fingerprint:
        notes.append("the fresh process loaded another profile of the recipe file than this one")
    e = got["report"]
    report = _evict.EvictionReport(**{**e, "failed": tuple(e["failed"])})
    if not report.effective:
        notes.append(f"the first epoch may not be cold: {report.note}")
    if got["fits"] is False:
        notes.append("the data does not fit in the page cache: later epochs are cold too")
    timings = [EpochTiming(**t) for t in got["timings"]]
    return _compare(profile, recipe.matches_this_machine, timings, got["build_seconds"], full=got["full"],
                    measured_batches=got["measured_batches"], epochs=epochs, report=report,
                    found_by=got["found_by"], fits=got["fits"], settings=got["settings"], batch_size=batch_size,
                    seed=seed, notes=notes, fresh_process=True, process_start_seconds=got["loaded_wall"] - spawned,
                    bare_decode_seconds=got["bare_decode_seconds"], bare_decode_workers=got["bare_decode_workers"],
                    floor_decode_seconds=got["floor_decode_seconds"],
                    floor_gathers_seconds=got["floor_gathers_seconds"],
                    keep_seconds=got["keep_seconds"], keep_bytes=got["keep_bytes"],
                    build_parts=got["build_parts"], dataset_fingerprint=got["dataset_fingerprint"],
                    dataset_length=got["dataset_length"], finish_seconds=got["finish_seconds"])


def _main(argv: list[str]) -> int:
    try:
        result = _child(json.loads(argv[0]))
    except AutotuneError as exc:
        print(f"autotune: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    print("\n" + json.dumps(result), flush=True)
    os._exit(0)  # no teardown of workers or threads after the result is out


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
