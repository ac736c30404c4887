"""The search space as data: one candidate ``Config`` and the ``Space`` it is drawn from.

The validity rules are DataLoader's own (prefetch_factor and persistent_workers need workers) plus one
it does not enforce: a forked worker must not run more than one intra-op thread, because GNU OpenMP is
not fork-safe once the parent has used it (the child hangs in its first parallel region).
"""

from __future__ import annotations

import itertools
import multiprocessing
from dataclasses import asdict, dataclass, fields
from typing import Any

from autotune.process import ProcessSettings

PREFETCH_FACTORS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Config:
    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    multiprocessing_context: str | None = None
    worker_threads: int | None = None
    main_threads: int | None = None
    cache: str | None = None
    allocator: str = "glibc"

    def __post_init__(self) -> None:
        if self.num_workers == 0 and (
            self.prefetch_factor is not None or self.persistent_workers or self.multiprocessing_context
        ):
            raise ValueError("prefetch_factor, persistent_workers and multiprocessing_context need num_workers > 0")
        if self.multiprocessing_context == "fork" and (self.worker_threads or 1) > 1:
            raise ValueError("forked workers must keep one intra-op thread (OpenMP is not fork-safe)")

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keyword arguments this candidate sets (never batch_size, sampler, collate_fn)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers:
            kwargs["prefetch_factor"] = self.prefetch_factor or 2
            kwargs["persistent_workers"] = self.persistent_workers
            if self.multiprocessing_context:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def process_settings(self) -> ProcessSettings:
        """The process-level part: allocator and thread counts (applied by autotune.process)."""
        return ProcessSettings(allocator=self.allocator, main_threads=self.main_threads,
                               worker_threads=self.worker_threads)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def describe(self) -> str:
        parts = [f"num_workers={self.num_workers}"]
        if self.num_workers:
            parts += [
                f"prefetch_factor={self.prefetch_factor or 2}",
                f"persistent_workers={self.persistent_workers}",
                f"context={self.multiprocessing_context or 'default'}",
            ]
            if self.worker_threads:
                parts.append(f"worker_threads={self.worker_threads}")
        if self.pin_memory:
            parts.append("pin_memory=True")
        if self.main_threads:
            parts.append(f"main_threads={self.main_threads}")
        parts.append(f"cache={self.cache or 'none'}")
        if self.allocator != "glibc":
            parts.append(f"allocator={self.allocator}")
        return ", ".join(parts)


DEFAULT = Config()


def start_methods() -> tuple[str, ...]:
    """The multiprocessing start methods this OS offers, fork first where it exists."""
    order = ("fork", "forkserver", "spawn")
    have = set(multiprocessing.get_all_start_methods())
    return tuple(m for m in order if m in have)


@dataclass(frozen=True)
class Space:
    max_workers: int
    contexts: tuple[str, ...] = ("fork",)
    cuda: bool = False
    prefetch_factors: tuple[int, ...] = PREFETCH_FACTORS
    worker_threads: tuple[int, ...] = (1,)
    main_threads: tuple[int | None, ...] = ()  # None: leave torch's own count
    persistent: tuple[bool, ...] = (False, True)
    caches: tuple[str | None, ...] = (None,)
    allocators: tuple[str, ...] = ("glibc",)

    def suggest(self, trial: Any) -> Config:
        """Draw a Config from an Optuna trial; dependent knobs are asked only where they apply."""
        workers = trial.suggest_int("num_workers", 0, self.max_workers)
        kwargs: dict[str, Any] = {"num_workers": workers}
        if workers:
            kwargs["prefetch_factor"] = trial.suggest_categorical("prefetch_factor", list(self.prefetch_factors))
            kwargs["persistent_workers"] = (trial.suggest_categorical("persistent_workers", list(self.persistent))
                                            if len(self.persistent) > 1 else self.persistent[0])
            context = trial.suggest_categorical("multiprocessing_context", list(self.contexts))
            kwargs["multiprocessing_context"] = context
            threads = [t for t in self.worker_threads if context != "fork" or t == 1]
            if len(threads) > 1:
                kwargs["worker_threads"] = trial.suggest_categorical(f"worker_threads_{context}", threads)
        if self.cuda:
            kwargs["pin_memory"] = trial.suggest_categorical("pin_memory", [False, True])
        if len(self.main_threads) > 1:
            kwargs["main_threads"] = trial.suggest_categorical("main_threads", list(self.main_threads))
        if len(self.caches) > 1:
            kwargs["cache"] = _none_from(trial.suggest_categorical("cache", [c or "none" for c in self.caches]))
        elif self.caches:
            kwargs["cache"] = self.caches[0]
        if len(self.allocators) > 1:
            kwargs["allocator"] = trial.suggest_categorical("allocator", list(self.allocators))
        return Config(**kwargs)

    def params_for(self, config: Config) -> dict[str, Any]:
        """The Optuna parameters that ``suggest`` would draw to produce ``config`` (for enqueue_trial)."""
        params: dict[str, Any] = {"num_workers": config.num_workers}
        if config.num_workers:
            params["prefetch_factor"] = config.prefetch_factor or 2
            if len(self.persistent) > 1:
                params["persistent_workers"] = config.persistent_workers
            context = config.multiprocessing_context or self.contexts[0]
            params["multiprocessing_context"] = context
            if len([t for t in self.worker_threads if context != "fork" or t == 1]) > 1:
                params[f"worker_threads_{context}"] = config.worker_threads or 1
        if self.cuda:
            params["pin_memory"] = config.pin_memory
        if len(self.main_threads) > 1:
            params["main_threads"] = config.main_threads
        if len(self.caches) > 1:
            params["cache"] = config.cache or "none"
        if len(self.allocators) > 1:
            params["allocator"] = config.allocator
        return params

    def default(self) -> Config:
        """The plain default every recipe is checked against: no workers, no cache, torch's threads."""
        return DEFAULT

    def grid(self) -> list[Config]:
        """Every valid point of the space (the exhaustive oracle of the benchmarks)."""
        points: list[Config] = []
        mains = list(self.main_threads) if len(self.main_threads) > 1 else [None]
        pins = [False, True] if self.cuda else [False]
        for cache, alloc, main, pin in itertools.product(self.caches, self.allocators, mains, pins):
            base = dict(cache=cache, allocator=alloc, main_threads=main, pin_memory=pin)
            points.append(Config(**base))
            for workers, prefetch, persistent, context in itertools.product(
                range(1, self.max_workers + 1), self.prefetch_factors, self.persistent, self.contexts
            ):
                for threads in [t for t in self.worker_threads if context != "fork" or t == 1]:
                    points.append(
                        Config(
                            num_workers=workers,
                            prefetch_factor=prefetch,
                            persistent_workers=persistent,
                            multiprocessing_context=context,
                            worker_threads=threads if len(self.worker_threads) > 1 else None,
                            **base,
                        )
                    )
        return points


def _none_from(value: str) -> str | None:
    return None if value == "none" else value
