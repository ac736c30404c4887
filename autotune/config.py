"""One loader configuration, and every rule about it, stated once.

A ``LoaderConfig`` is what a search tries, what a recipe stores and what the factory applies: the
DataLoader keywords autotune tunes, the per-process settings (allocator, thread counts) and the sample
cache. Every other form it takes is a conversion from here:

=========================  ==============================================================
form                       conversion
=========================  ==============================================================
DataLoader keywords        ``loader_kwargs()``
Optuna parameters          ``autotune.tuner._space.Space`` (draws through ``LoaderConfig``)
recipe JSON                ``to_json()`` / ``from_json()`` (validated: types and bounds)
process settings           ``process_settings()`` (allocator, threads; ``autotune run``)
=========================  ==============================================================

The validity rules (docs/architecture.md, "Loader configuration rules"):

1. ``prefetch_factor``, ``persistent_workers``, ``multiprocessing_context`` and ``worker_threads``
   only mean something with workers; with ``num_workers=0`` they must be left unset (DataLoader
   itself raises for the first two).
2. One loader, one spelling: with workers, ``prefetch_factor`` unset means DataLoader's default,
   ``DEFAULT_PREFETCH``, and is stored as that number; ``worker_threads=1`` is what DataLoader
   already gives each worker, and is stored as unset.
3. A forked worker keeps one intra-op thread: GNU OpenMP is not fork-safe once the parent has run a
   parallel region (the child hangs in its first one), so ``worker_threads > 1`` needs spawn or
   forkserver.
4. ``cache_fill`` says when the cache is filled: ``"build"`` (before the first epoch, a pass of its
   own) or ``"first_epoch"`` (while the first epoch trains: each sample the workers decode goes to
   training and into the cache, later epochs read the cache). It only means something with a cache;
   without one it must be ``"build"``.
5. ``cache_share`` is the share of the dataset a memory cache holds when all of it does not fit: the
   first ``partial_count(share, len(dataset))`` samples by index stay in memory for the whole run, the
   rest are read from the source every epoch (CoorDL's MinIO policy: nothing is evicted, so a dataset
   larger than memory does not thrash as the page cache's LRU does). Only with ``cache="memory"``;
   ``0 < share < 1``; the whole dataset is stored as unset (one spelling).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.errors import RecipeError
from autotune.process import DEFAULT_ALLOCATOR, ProcessSettings, allocator_names

DEFAULT_PREFETCH = 2  # DataLoader's own default with workers
CONTEXTS = ("fork", "forkserver", "spawn")
CACHE_FILLS = ("build", "first_epoch")
WORKER_ONLY = ("prefetch_factor", "persistent_workers", "multiprocessing_context", "worker_threads")
# The DataLoader keywords a configuration sets (``loader_kwargs``), and those of them DataLoader refuses without
# workers: the factory's caller may override each, and a loader without workers drops the latter.
LOADER_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "multiprocessing_context")
WORKER_LOADER_KEYS = tuple(k for k in WORKER_ONLY if k in LOADER_KEYS)
MAX_WORKERS = 1024
MAX_PREFETCH = 1024
MAX_THREADS = 4096


def partial_count(share: float | None, length: int) -> int:
    """The samples a memory cache of ``share`` holds of ``length`` (rule 5): the first ones, at least one."""
    if share is None:
        return length
    return max(1, min(length, int(share * length + 1e-6)))  # a share written as count / length gives count back


class ConfigError(ValueError):
    """A loader configuration breaks one of the rules above; the message names the rule and the value."""


def _check_int(name: str, value: Any, low: int, high: int, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, but got {value!r}")


def cache_backend(name: str) -> Any:
    """The registered class of the cache backend ``name`` (``autotune.caches._family``); AutotuneError
    naming the valid ones. The caches are imported on first use, for they import torch: a process that
    reads a recipe without a cache (``autotune show``) or imports this module alone needs none of it."""
    from autotune.caches._family import backend

    return backend(name)


def _in_memory_names() -> tuple[str, ...]:
    return tuple(n for n in cache_names() if cache_backend(n).in_memory)


def cache_names() -> tuple[str, ...]:
    """The registered cache backends' names (see ``cache_backend``)."""
    from autotune.caches._family import names

    return names()


def _check_choice(name: str, value: Any, choices: tuple[str, ...], *, optional: bool) -> None:
    if value is None and optional:
        return
    if value not in choices:
        allowed = ", ".join(choices) + (" or null" if optional else "")
        raise ConfigError(f"{name} must be one of {allowed}, but got {value!r}")


@dataclass(frozen=True)
class LoaderConfig:
    """Everything autotune tunes about one loader. Construct it and the rules hold, or ConfigError."""

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    multiprocessing_context: str | None = None
    worker_threads: int | None = None  # torch.set_num_threads in each worker; None: torch's choice (1)
    main_threads: int | None = None  # torch.set_num_threads in the training process; None: torch's
    cache: str | None = None  # a cache backend, None for none
    allocator: str = DEFAULT_ALLOCATOR  # a registered allocator (autotune/process/_family.py)
    cache_fill: str = "build"  # when the cache is filled (rule 4); recipes without it read "build"
    cache_share: float | None = None  # the share of the dataset a memory cache holds (rule 5); None: all

    def __post_init__(self) -> None:
        _check_int("num_workers", self.num_workers, 0, MAX_WORKERS, optional=False)
        _check_int("prefetch_factor", self.prefetch_factor, 1, MAX_PREFETCH, optional=True)
        _check_int("worker_threads", self.worker_threads, 1, MAX_THREADS, optional=True)
        _check_int("main_threads", self.main_threads, 1, MAX_THREADS, optional=True)
        for name in ("persistent_workers", "pin_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, but got {getattr(self, name)!r}")
        _check_choice("multiprocessing_context", self.multiprocessing_context, CONTEXTS, optional=True)
        if self.cache is not None:
            _check_choice("cache", self.cache, cache_names(), optional=True)
        _check_choice("allocator", self.allocator, allocator_names(), optional=False)
        _check_choice("cache_fill", self.cache_fill, CACHE_FILLS, optional=False)
        if self.cache_fill != "build" and self.cache is None:  # rule 4
            raise ConfigError(f"cache_fill={self.cache_fill!r} needs a cache, but cache=None")
        if self.cache_share is not None:  # rule 5
            share = self.cache_share
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
                raise ConfigError(f"cache_share must be a number above 0 and at most 1, but got {share!r}")
            if not self.cache_in_memory:
                wanted = " or ".join(f"cache={n!r}" for n in _in_memory_names())
                raise ConfigError(f"cache_share={share!r} needs {wanted}, but cache={self.cache!r}")
            object.__setattr__(self, "cache_share", None if share == 1 else float(share))
        if not self.num_workers:  # rule 1
            set_ = [k for k in WORKER_ONLY if getattr(self, k) not in (None, False)]
            if set_:
                raise ConfigError(f"{', '.join(set_)} need num_workers > 0, but num_workers=0")
        elif self.prefetch_factor is None:  # rule 2
            object.__setattr__(self, "prefetch_factor", DEFAULT_PREFETCH)
        if self.worker_threads == 1:  # rule 2
            object.__setattr__(self, "worker_threads", None)
        if not fork_allows_threads(self.multiprocessing_context, self.worker_threads):  # rule 3
            raise ConfigError(
                f"forked workers must keep one intra-op thread (OpenMP is not fork-safe), but got "
                f"worker_threads={self.worker_threads}; use spawn or forkserver for more"
            )

    @classmethod
    def fitted(cls, **values: Any) -> LoaderConfig:
        """A configuration from values that may break rules 1 and 3 (a recipe's worker settings under a
        caller's ``num_workers=0``): what cannot apply is dropped instead of refused."""
        if not values.get("num_workers"):
            for key in WORKER_ONLY:
                values[key] = False if key == "persistent_workers" else None
        if not fork_allows_threads(values.get("multiprocessing_context"), values.get("worker_threads")):
            values["worker_threads"] = None
        if values.get("cache") is None:  # rule 4
            values["cache_fill"] = "build"
        if values.get("cache") not in _in_memory_names():  # rule 5
            values["cache_share"] = None
        return cls(**values)

    def refit(self, **changes: Any) -> LoaderConfig:
        """A copy with ``changes``, fitted to the rules (see ``fitted``): what no longer applies is dropped,
        where ``dataclasses.replace`` would raise ConfigError."""
        return LoaderConfig.fitted(**{**self.to_json(), **changes})

    # ------------------------------------------------------------------ conversions

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keyword arguments (never batch_size, sampler or collate_fn: those are the user's)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers:
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["persistent_workers"] = self.persistent_workers
            if self.multiprocessing_context:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    def to_json(self) -> dict[str, Any]:
        """The recipe's ``"config"`` object. ``cache_share`` only where set: a recipe without a partial cache
        stays readable by a version before it."""
        out = dataclasses.asdict(self)
        if out["cache_share"] is None:
            del out["cache_share"]
        return out

    @classmethod
    def from_json(cls, data: Any) -> LoaderConfig:
        """From a recipe's ``"config"`` object: unknown keys are refused, every value is checked.
        Raises RecipeError naming the problem (a hand-edited or hostile file)."""
        if not isinstance(data, Mapping):
            raise RecipeError(f"a profile's 'config' must be an object, but got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise RecipeError(f"a profile's 'config' has unknown keys {', '.join(map(repr, unknown))}")
        try:
            return cls(**dict(data))
        except ConfigError as exc:
            raise RecipeError(f"a profile's 'config' is invalid: {exc}") from None

    def key(self) -> str:
        """A stable text identity, canonical JSON (``from_json(json.loads(key))`` gives the configuration
        back): the same configuration always gives the same key, and a field added later is left out at
        its default, so keys written before it stay the same."""
        items = self.to_json()
        if items["cache_fill"] == "build":
            del items["cache_fill"]
        return json.dumps(items, sort_keys=True)

    @property
    def cache_in_memory(self) -> bool:
        """Whether the cache lives in the memory of the process that built it, so every rank holds its
        own (memory), or in a folder the node's ranks share (the disk backends); False without one."""
        return self.cache is not None and bool(cache_backend(self.cache).in_memory)

    def process_settings(self) -> ProcessSettings:
        """The process-level part: allocator and thread counts (``autotune.process``)."""
        return ProcessSettings(allocator=self.allocator, main_threads=self.main_threads,
                               worker_threads=self.worker_threads)

    def describe_cache(self, ranks: int = 1) -> str:
        """The cache in words: its backend ("none" without one); with several ranks per node, also who
        holds it, as the factory builds it: every rank its own memory cache, or the node one disk cache,
        built once and shared."""
        if not self.cache or ranks <= 1:
            return self.cache if self.cache and self.cache_share is None else (
                f"{self.cache} cache of the first {self.cache_share:.0%} of the samples" if self.cache else "none")
        if not self.cache_in_memory:
            return f"{self.cache} cache, shared by the node's {ranks} ranks"
        filled = ", each filled with its rank's samples" if self.cache_fill == "first_epoch" else ""
        share = f" of the first {self.cache_share:.0%} of the samples" if self.cache_share is not None else ""
        return f"{self.cache} cache{share}, one per rank (x{ranks} in memory){filled}"

    def describe(self, ranks: int = 1) -> str:
        """One readable line: the loader keywords, then threads, cache and allocator where set; ``ranks``
        per node says who holds the cache (``describe_cache``)."""
        parts = [f"num_workers={self.num_workers}"]
        if self.num_workers:
            parts += [
                f"prefetch_factor={self.prefetch_factor}",
                f"persistent_workers={self.persistent_workers}",
                f"context={self.multiprocessing_context or 'default'}",
            ]
            if self.worker_threads:
                parts.append(f"worker_threads={self.worker_threads}")
        if self.pin_memory:
            parts.append("pin_memory=True")
        if self.main_threads:
            parts.append(f"main_threads={self.main_threads}")
        held = ""
        if self.cache and ranks > 1:  # the same words as describe_cache, in one parenthesis
            held = (f" (shared by the node's {ranks} ranks)" if not self.cache_in_memory
                    else f" (one per rank, x{ranks} in memory)")
        parts.append(f"cache={self.cache or 'none'}{held}")
        if self.cache_share is not None:
            parts.append(f"cache_share={self.cache_share:g}")
        if self.cache and self.cache_fill != "build":
            parts.append(f"cache_fill={self.cache_fill}")
        if self.allocator != DEFAULT_ALLOCATOR:
            parts.append(f"allocator={self.allocator}")
        return ", ".join(parts)


def fork_allows_threads(context: str | None, worker_threads: int | None) -> bool:
    """Rule 3: forked workers keep one intra-op thread (no context: the platform's default method)."""
    if (worker_threads or 1) == 1:
        return True
    # get_start_method(allow_none=True) reads the method without fixing it, as get_context() would
    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return (context or default) != "fork"


DEFAULT = LoaderConfig()


def usual_advice(max_workers: int, *, persistent: bool = True, context: str | None = "fork",
                 main_threads: int | None = None) -> LoaderConfig:
    """The usual advice, a worker per usable CPU, persistent: the search's first prior after the default,
    and where an adapting loader without a recipe starts."""
    if not max_workers:
        return LoaderConfig(main_threads=main_threads)
    return LoaderConfig(num_workers=max_workers, prefetch_factor=2, persistent_workers=persistent,
                        multiprocessing_context=context, main_threads=main_threads)
