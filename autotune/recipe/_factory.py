"""Recipe -> DataLoader[Any]: the tuned settings, the caller's overrides, and a report of where each came from.

Order of precedence, resolved here and nowhere else: caller's keyword > recipe > DataLoader's default.
The caller's batch composition (collate_fn, shuffle, sampler, batch_sampler, drop_last, generator)
always passes through untouched.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader

from autotune.caches import cache_path, collate_gathered, dataset_key, default_root, expected_manifest
from autotune.config import LOADER_KEYS as TUNED_KEYS
from autotune.config import WORKER_LOADER_KEYS as WORKER_ONLY
from autotune.config import ConfigError, LoaderConfig
from autotune.dataset import is_stream
from autotune.errors import AutotuneError, DatasetError
from autotune.integrations._lightning import quiet_worker_warning
from autotune.loader import FactorySite, make_loader, prepare_source, stream_batches
from autotune.machine import ranks_per_node
from autotune.process import DEFAULT_ALLOCATOR, apply_at_runtime, users_threads
from autotune.recipe._file import Profile
from autotune.recipe._learned import MOVED, starting_config
from autotune.recipe._measured import Measured
from autotune.recipe._memory_fit import fit_memory
from autotune.recipe._write_back import WriteBack

log = logging.getLogger("autotune")

FROM_RECIPE = "recipe"  # cache=: use the recipe's backend (the default); None: no cache; a name: that one
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
    level = 1
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        level += 1
        frame = frame.f_back
    return level


def _resolve(profile: Profile, overrides: dict[str, Any], cache: Any) -> tuple[LoaderConfig, Resolution]:
    """The configuration to build: the caller's keywords over the recipe's. A caller's worker-only
    keyword with no workers is refused (as DataLoader would); the recipe's is dropped."""
    base: LoaderConfig = profile.config
    res = Resolution()
    values = base.to_json()
    for key in TUNED_KEYS:
        if key in overrides:
            values[key], res.sources[key] = overrides.pop(key), "caller"
        else:
            res.sources[key] = "recipe"
    if cache != FROM_RECIPE:
        values["cache"] = cache
        if cache != base.cache:
            values["cache_fill"] = "build"  # the recipe's fill was chosen for its own backend
    res.sources["cache"] = "recipe" if cache == FROM_RECIPE else "caller"
    if not values["num_workers"]:
        for key in WORKER_ONLY:
            if res.sources.get(key) == "caller" and values[key] not in (None, False):
                raise AutotuneError(f"{key} needs num_workers > 0, but num_workers=0 was chosen.")
            if key in res.sources:
                res.sources[key] = "not used without workers"
    try:
        config = LoaderConfig.fitted(**values)
    except ConfigError as exc:
        raise AutotuneError(f"Cannot build the DataLoader: {exc}.") from None
    res.settings = {k: getattr(config, k) for k in (*TUNED_KEYS, "cache", "cache_share")}
    res.sources["cache_share"] = res.sources["cache"]
    return config, res


def cache_location(profile: Profile, dataset: Any, cache_dir: str | Path | None = None) -> Path | None:
    """Where the factory keeps the recipe's disk cache for ``dataset`` (None: memory or no cache). A cache
    belongs to the dataset actually passed (its key, ``caches._key``), never to anything the recipe says,
    so a train and a val set through one recipe get two caches."""
    backend = profile.config.cache
    if backend is None or profile.config.cache_in_memory:
        return None
    root = Path(cache_dir) if cache_dir is not None else default_root()
    return cache_path(backend, root, expected_manifest(dataset_key(dataset), range(len(dataset))))


def _fit_memory(config: LoaderConfig, profile: Profile, dataset: Any, res: Resolution, stream: bool,
                batch_size: int) -> LoaderConfig:
    """``config`` fitted to the memory this job may take now (``recipe._memory_fit``); a change is said in
    one line naming the limit."""
    if not config.num_workers and (stream or not config.cache_in_memory):
        return config  # nothing the recipe adds that a smaller choice would save
    fit = fit_memory(config, profile.measured, dataset, batch_size=batch_size, ranks=ranks_per_node(),
                     keep_workers=res.sources.get("num_workers") == "caller")
    if fit.line is None:
        return config
    for key in (*TUNED_KEYS, "cache", "cache_share"):  # fewer workers may drop the worker-only keys too
        if getattr(fit.config, key) != getattr(config, key):
            res.settings[key], res.sources[key] = getattr(fit.config, key), "fitted to the memory limit"
    res.not_applied.append(fit.line)
    return fit.config


def world_size() -> int:
    """The ranks of this training job (torch.distributed's group, else torchrun's ``WORLD_SIZE``)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _measured_gain(m: Measured) -> bool:
    """Whether the recipe measured its configuration faster than the default: its interval above 1 (a recipe
    of an older version: its speed-up)."""
    if m.is_default:
        return False
    if m.interval is not None:
        return m.interval.low > 1.0
    return (m.speedup or 0.0) > 1.0


def build_loader(profile: Profile, dataset: Any, *, transform: Callable[..., Any] | None = None,
                 cache: str | None = FROM_RECIPE, cache_dir: str | os.PathLike[str] | None = None,
                 apply_process_settings: bool = True, progress: bool = True,
                 loader_cls: type[DataLoader[Any]] = DataLoader, adapt: bool | str = False,
                 learn_to: str | os.PathLike[str] | None = None, **overrides: Any) -> Any:
    """A DataLoader over ``dataset`` with the profile's settings; see the module docstring for precedence.
    ``loader_cls`` builds another DataLoader subclass with the same arguments (torchdata's StatefulDataLoader).
    ``adapt=True`` returns an ``AdaptiveLoader`` that moves the settings during the run (``_adaptive``),
    ``adapt="observe"`` one that measures and never moves; what it learns is written to the recipe file
    ``learn_to`` (``_learned``), and a later loader of the same batches starts from it."""
    if adapt not in (False, True, "observe"):
        raise AutotuneError(f"adapt must be True, False or 'observe', but got {adapt!r}.")

    stream = is_stream(dataset)
    kind = type(dataset)  # a class has __getitem__ and __len__ as attributes, its instances are the datasets
    if not stream and not (hasattr(kind, "__getitem__") and hasattr(kind, "__len__")):
        hint = " (a function that makes one? call it)" if callable(dataset) else ""
        raise DatasetError(f"autotune.dataloader got a {type(dataset).__name__}, not a dataset{hint}: it needs "
                           "__getitem__(int) and __len__() (map-style), or to be a torch.utils.data.IterableDataset.")
    tuned_batch = profile.settings.batch_size
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
    if profile.measured.has_transform and transform is None:
        warnings.warn("The recipe was tuned with a per-sample transform; pass transform=... so the loader "
                      "applies it after the cache, every epoch.", stacklevel=_caller_stacklevel())
    length = None if stream else len(dataset)
    learned = starting_config(profile.config, profile.learned, overrides.get("batch_size"), length)
    config, res = _resolve(replace(profile, config=learned) if learned else profile, overrides, cache)
    for key in MOVED if learned else ():
        if res.sources.get(key) == "recipe" and getattr(learned, key) != getattr(profile.config, key):
            res.sources[key] = "learned by an adapting run"
    user_init = overrides.pop("worker_init_fn", None)
    if config.cache and stream:
        raise AutotuneError(f"A stream (IterableDataset) cannot be cached (cache={config.cache!r}): a cache would "
                            "replay one recorded pass, freezing its order; pass cache=None.")
    # The process settings first, so the cache build runs under them, as a trial's build did.
    main = replace(config.process_settings(), worker_threads=None)
    # a thread count an adapting run kept was measured faster by the real step
    gain = _measured_gain(profile.measured) or (learned is not None and learned.main_threads is not None
                                                and learned.main_threads != profile.config.main_threads)
    plain = replace(main, allocator=DEFAULT_ALLOCATOR, main_threads=None)
    if apply_process_settings and not gain and main != plain:
        # The user's process is changed only for a measured gain (an older recipe may lack the interval).
        log.info("autotune left this process's allocator and threads alone: the recipe measured no gain from it")
        main = plain
    kept = False  # the allocator in use after the apply keeps freed batches (left as it is: not known to)
    if apply_process_settings:
        applied = apply_at_runtime(main)
        res.applied, res.not_applied, kept = list(applied.applied), list(applied.not_applied), applied.keeps_freed
        if config.num_workers and (config.worker_threads or config.allocator != DEFAULT_ALLOCATOR):
            res.applied.append("per-worker settings in worker_init_fn: " + config.process_settings().describe())
    else:
        config = config.refit(allocator=DEFAULT_ALLOCATOR, main_threads=None, worker_threads=None)
    config = _fit_memory(config, profile, dataset, res, stream, overrides.get("batch_size") or 1)
    if config.cache_fill == "first_epoch" and not config.cache_in_memory and world_size() > 1:
        # each rank's first epoch reads its shard only: the node's one cache would never be whole
        config = config.refit(cache_fill="build")
        res.not_applied.append(f"cache_fill='first_epoch' with the {config.cache} cache in a job of several ranks: "
                               "the node's cache is built first")
    site = FactorySite(cache_dir, progress=progress)
    prepared = prepare_source(dataset, config, site, transform=transform, collate_fn=overrides.get("collate_fn"),
                              stream=stream, kept_batch=overrides.get("batch_size") if kept else None)
    if prepared.random:
        warnings.warn(f"The {config.cache!r} cache is not used: {prepared.why}.", stacklevel=_caller_stacklevel())
        config = config.refit(cache=None)
        res.settings["cache"], res.sources["cache"] = None, "not used: random samples"
        res.settings["cache_share"], res.sources["cache_share"] = None, res.sources["cache"]
    res.settings["cache_fill"] = config.cache_fill if config.cache else None
    res.sources["cache_fill"] = res.sources["cache"]
    if prepared.collate_fn is not None and not (prepared.collate_fn is collate_gathered and _unbatched(overrides)):
        overrides["collate_fn"] = prepared.collate_fn
    data = prepared.dataset
    caller: dict[str, Any] = {k: overrides[k] for k in ("batch_size", "drop_last", "sampler", "generator")
                              if k in overrides}
    index_stream = None
    if adapt:  # one index stream for every loader the run makes: a switch may come mid-epoch
        overrides, index_stream = stream_batches(data, overrides)

    def make(config: LoaderConfig) -> DataLoader[Any]:
        loader = make_loader(data, config, user_worker_init=user_init, loader_cls=loader_cls, **overrides)
        loader.autotune = res
        return loader

    loader = make(config) if not adapt else adaptive_loader(
        make, config, res, adapt, profile, learn_to, length, caller,
        stream=index_stream, threads_move=apply_process_settings and users_threads() is None)
    if not config.num_workers and res.sources.get("num_workers") == "recipe":
        quiet_worker_warning(profile.measured.note)
    log.info("autotune DataLoader: %s", res.describe())
    for line in res.applied:
        log.info("autotune applied: %s", line)
    for line in res.not_applied:
        if line not in _said:
            _said.add(line)
            warnings.warn(f"autotune could not apply: {line}", stacklevel=_caller_stacklevel())
    return loader


def _unbatched(overrides: dict[str, Any]) -> bool:
    """Whether the loader hands each sample alone to its collate function (``batch_size=None``): a plain one
    converts it (``default_convert``), where the gather path's collate would take the sample for a batch."""
    return "batch_size" in overrides and overrides["batch_size"] is None and overrides.get("batch_sampler") is None


def adaptive_loader(make: Callable[[LoaderConfig], DataLoader[Any]], config: LoaderConfig, res: Resolution,
                    adapt: bool | str, profile: Profile, learn_to: str | os.PathLike[str] | None,
                    length: int | None, caller: dict[str, Any], *, stream: Any, threads_move: bool) -> Any:
    """An ``AdaptiveLoader`` over ``make``, starting from ``config``; a setting the caller gave never moves,
    nor the thread split where the user set the main process's threads (``threads_move`` False).
    Rank 0 writes what it learns into ``profile``'s place in ``learn_to`` (``_write_back``: at most 0.5% of the
    run's time, and whole at its end)."""
    import torch

    from autotune.machine import usable_cpus
    from autotune.recipe._adapt_policy import Policy
    from autotune.recipe._adaptive import AdaptiveLoader, rank_sync
    from autotune.recipe._thread_split import MainThreads

    ranks = ranks_per_node()
    batch_size = caller.get("batch_size")
    threads = MainThreads() if threads_move else None
    if config.main_threads is not None and config.main_threads != torch.get_num_threads():
        config = config.refit(main_threads=None)  # not applied (the user's, or no measured gain): as found
    fixed = frozenset(k for k in TUNED_KEYS if res.sources.get(k) == "caller")
    if threads is None:
        fixed |= {"main_threads", "worker_threads"}
    policy = Policy(config, max_workers=usable_cpus(ranks), cuda=torch.cuda.is_available(),
                    observe=adapt == "observe", fixed=fixed, threads=threads.found if threads else None)
    sync = rank_sync()
    mode = "observe" if adapt == "observe" else "adapt"
    write_back = (WriteBack(learn_to, profile, mode, batch_size, length)
                  if learn_to is not None and (sync is None or sync.rank == 0) else None)
    loader = AdaptiveLoader(make, config, policy, sync=sync, on_epoch=write_back,
                            on_close=write_back.flush if write_back else None, stream=stream, threads=threads,
                            caller=caller)
    policy.allowed = lambda candidate: loader.memory.allowed(candidate, loader.config, ranks)
    log.info("autotune adapts the loader during the run%s", " (observing only)" if adapt == "observe" else "")
    return loader
