"""Recipe -> DataLoader: the tuned settings, the caller's overrides, and a report of where each came from.

Order of precedence, resolved here and nowhere else: caller's keyword > recipe > DataLoader's default.
The caller's batch composition (collate_fn, shuffle, sampler, batch_sampler, drop_last, generator)
always passes through untouched.
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import DataLoader

from autotune.cpus import build_workers
from autotune.errors import AutotuneError
from autotune.loader import Transformed, make_loader
from autotune.process import apply_at_runtime
from autotune.space import Config

log = logging.getLogger("autotune")

TUNED_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "multiprocessing_context")
WORKER_ONLY = ("prefetch_factor", "persistent_workers", "multiprocessing_context")
_UNSET: Any = object()
_said: set[str] = set()  # what could not be applied is said once per process, not once per loader


@dataclass
class Resolution:
    """The settings a loader was built with, where each came from, and what was applied to the process."""

    settings: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(f"{k}={self.settings[k]!r} ({self.sources[k]})" for k in self.settings)


_PACKAGE_DIR = str(Path(__file__).resolve().parent)


def _caller_stacklevel() -> int:
    """The warnings stacklevel of the first frame outside autotune, so a warning points at the user's line."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        level += 1
        frame = frame.f_back
    return level


def recipe_config(profile: Any) -> Config:
    loader = profile.loader
    threads = profile.threads or {}
    workers = int(loader.get("num_workers", 0))
    return Config(
        num_workers=workers,
        prefetch_factor=loader.get("prefetch_factor") if workers else None,
        persistent_workers=bool(loader.get("persistent_workers")) if workers else False,
        pin_memory=bool(loader.get("pin_memory", False)),
        multiprocessing_context=loader.get("multiprocessing_context") if workers else None,
        worker_threads=threads.get("worker"),
        main_threads=threads.get("main"),
        cache=(profile.cache or {}).get("backend"),
        allocator=(profile.process or {}).get("allocator", "glibc"),
    )


def _resolve(profile: Any, overrides: dict[str, Any], cache: Any) -> tuple[Config, Resolution]:
    base = recipe_config(profile)
    res = Resolution()
    values: dict[str, Any] = {}
    for key in TUNED_KEYS:
        if key in overrides:
            values[key], res.sources[key] = overrides.pop(key), "caller"
        else:
            values[key], res.sources[key] = getattr(base, key), "recipe"
    if not values["num_workers"]:
        for key in WORKER_ONLY:
            if res.sources[key] == "caller" and values[key] not in (None, False):
                raise AutotuneError(f"{key} needs num_workers > 0, but num_workers=0 was chosen.")
            values[key] = None if key != "persistent_workers" else False
            res.sources[key] = "not used without workers"
    if values["multiprocessing_context"] == "fork" and (base.worker_threads or 1) > 1:
        base = replace(base, worker_threads=None)  # forked workers keep one thread (OpenMP is not fork-safe)
    values["cache"] = base.cache if cache is _UNSET else cache
    res.sources["cache"] = "recipe" if cache is _UNSET else "caller"
    config = replace(base, **values)
    res.settings = {k: getattr(config, k) for k in (*TUNED_KEYS, "cache")}
    return config, res


def cache_manifest(dataset: Any, source: str | None) -> dict[str, Any]:
    """The identity a full cache is stored under: a stable key from the dataset's source (so a changed
    dataset replaces its old cache) and a fingerprint of the data itself (so a changed one is rebuilt)."""
    from autotune.fingerprint import dataset_fingerprint

    text = None
    if source and not source.startswith("<"):
        path = Path(source.rpartition(":")[0] or source)
        text = path.read_text(errors="replace") if path.is_file() else None
    key = source if source and not source.startswith("<") else type(dataset).__name__
    return {"key": key, "fingerprint": dataset_fingerprint(dataset, text)}


def _cached_source(dataset: Any, backend: str, profile: Any, cache_dir: str | Path | None, progress: bool,
                   workers: int) -> Any:
    from autotune import caches

    recorded = (profile.cache or {}).get("root")
    root = Path(cache_dir) if cache_dir is not None else Path(recorded) if recorded else caches.DEFAULT_ROOT
    manifest = cache_manifest(dataset, profile.dataset.get("source"))
    return caches.open_or_build(backend, dataset, root=root, manifest=manifest, progress=progress, workers=workers)


def build_loader(profile: Any, dataset: Any, *, transform: Callable | None = None, cache: Any = _UNSET,
                 cache_dir: str | Path | None = None, apply_process_settings: bool = True,
                 progress: bool = True, **overrides: Any) -> DataLoader:
    """A DataLoader over ``dataset`` with the profile's settings; see the module docstring for precedence."""
    tuned_batch = (profile.settings or {}).get("batch_size")
    if "batch_sampler" not in overrides:
        overrides.setdefault("batch_size", tuned_batch or 1)
    elif tuned_batch:
        log.info("batch_sampler given: the recipe's batch_size %s is not used", tuned_batch)
    if tuned_batch and overrides.get("batch_size", tuned_batch) != tuned_batch:
        warnings.warn(
            f"The recipe was tuned for batch_size={tuned_batch}, but batch_size={overrides['batch_size']} was "
            "passed; the tuned settings may not be the fastest for it. Re-tune with --batch-size.",
            stacklevel=_caller_stacklevel(),
        )
    if (profile.measured or {}).get("has_transform") and transform is None:
        warnings.warn("The recipe was tuned with a per-sample transform; pass transform=... so the loader "
                      "applies it after the cache, every epoch.", stacklevel=_caller_stacklevel())
    config, res = _resolve(profile, overrides, cache)
    user_init = overrides.pop("worker_init_fn", None)
    if config.cache:
        from autotune.gather import cached_source

        source = _cached_source(dataset, config.cache, profile, cache_dir, progress, build_workers())
        data, collate_fn = cached_source(source, transform, overrides.get("collate_fn"))
        if collate_fn is not None:
            overrides["collate_fn"] = collate_fn
    else:
        data = Transformed(dataset, transform) if transform is not None else dataset
    if apply_process_settings:
        applied = apply_at_runtime(replace(config.process_settings(), worker_threads=None))
        res.applied, res.not_applied = applied.applied, applied.not_applied
        if config.num_workers and (config.worker_threads or config.allocator != "glibc"):
            res.applied.append("per-worker settings in worker_init_fn: " + config.process_settings().describe())
    else:
        config = replace(config, allocator="glibc", main_threads=None, worker_threads=None)
    loader = make_loader(data, config, user_worker_init=user_init, **overrides)
    loader.autotune = res
    log.info("autotune DataLoader: %s", res.describe())
    for line in res.applied:
        log.info("autotune applied: %s", line)
    for line in res.not_applied:
        if line not in _said:
            _said.add(line)
            warnings.warn(f"autotune could not apply: {line}", stacklevel=_caller_stacklevel())
    return loader
