"""The search space as data: which values of each knob a search may try (``Space``), and the one
function that draws a ``LoaderConfig`` from an Optuna trial (``Space.suggest``).

The inverse (``params_for``, for ``enqueue_trial``) and the exhaustive grid are not written again:
both replay ``suggest`` against a trial that answers from a configuration, or that walks every
branch, so they can never disagree with it. Validity is ``LoaderConfig``'s (autotune/config.py).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.config import DEFAULT, LoaderConfig, cache_backend, cache_names, fork_allows_threads

PREFETCH_FACTORS = (1, 2, 4, 8)


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
    allocators: tuple[str, ...] = (DEFAULT.allocator,)
    # When a cache is filled: before the first epoch ("build") or while it trains ("first_epoch":
    # autotune/caches/_fill.py for memory, _disk_fill.py for the others); asked only where one of
    # ``filled_caches`` was drawn (a disk cache's fill needs one rank: build_space).
    cache_fills: tuple[str, ...] = ("build",)
    filled_caches: tuple[str, ...] = field(default_factory=lambda: tuple(
        n for n in cache_names() if cache_backend(n).in_memory))
    # Shares of the dataset a memory cache may hold when all of it does not fit (LoaderConfig rule 5);
    # empty: the memory cache holds everything.
    cache_shares: tuple[float, ...] = ()

    def suggest(self, trial: Any) -> LoaderConfig:
        """Draw a configuration from an Optuna trial; dependent knobs are asked only where they apply."""
        values: dict[str, Any] = {"num_workers": trial.suggest_int("num_workers", 0, self.max_workers)}
        if values["num_workers"]:
            values["prefetch_factor"] = trial.suggest_categorical("prefetch_factor", list(self.prefetch_factors))
            values["persistent_workers"] = _choose(trial, "persistent_workers", self.persistent)
            context = trial.suggest_categorical("multiprocessing_context", list(self.contexts))
            values["multiprocessing_context"] = context
            threads = [t for t in self.worker_threads if fork_allows_threads(context, t)]
            if len(threads) > 1:  # a parameter per context: Optuna's choices must not depend on another
                values["worker_threads"] = trial.suggest_categorical(f"worker_threads_{context}", threads)
        if self.cuda:
            values["pin_memory"] = trial.suggest_categorical("pin_memory", [False, True])
        values["main_threads"] = _choose(trial, "main_threads", self.main_threads, None)
        values["cache"] = _none_from(_choose(trial, "cache", [c or "none" for c in self.caches], "none"))
        if values["cache"] is not None and cache_backend(values["cache"]).in_memory and self.cache_shares:
            values["cache_share"] = _choose(trial, "cache_share", self.cache_shares)
        if values["cache"] in self.filled_caches:
            values["cache_fill"] = _choose(trial, "cache_fill", self.cache_fills, "build")
        values["allocator"] = _choose(trial, "allocator", self.allocators, DEFAULT.allocator)
        return LoaderConfig(**values)

    def params_for(self, config: LoaderConfig) -> dict[str, Any]:
        """The Optuna parameters ``suggest`` draws to produce ``config`` (for ``enqueue_trial``).
        ValueError when ``config`` lies outside this space."""
        replay = _Replay(config)
        drawn = self.suggest(replay)
        if drawn != config:
            raise ValueError(f"{config.describe()} is not in this search space (closest: {drawn.describe()})")
        return replay.params

    def default(self) -> LoaderConfig:
        """The plain default every recipe is checked against: no workers, no cache, torch's threads."""
        return DEFAULT

    def grid(self) -> list[LoaderConfig]:
        """Every configuration ``suggest`` can draw (the exhaustive oracle of the benchmarks)."""
        points: dict[LoaderConfig, None] = {}
        prefix: list[int] = []
        while True:
            walk = _Walk(prefix)
            points.setdefault(self.suggest(walk), None)
            prefix = walk.next_prefix()
            if not prefix:
                return list(points)


def _choose(trial: Any, name: str, choices: Sequence[Any], absent: Any = None) -> Any:
    """Ask only when there is a choice: one value is fixed, none leaves ``absent``."""
    if len(choices) > 1:
        return trial.suggest_categorical(name, list(choices))
    return choices[0] if choices else absent


def _none_from(value: str) -> str | None:
    return None if value == "none" else value


class _Replay:
    """An Optuna-trial stand-in that answers each ``suggest_*`` with ``config``'s value for it."""

    def __init__(self, config: LoaderConfig):
        self.values = config.to_json()
        self.values["cache"] = config.cache or "none"
        self.values["cache_share"] = config.cache_share
        self.params: dict[str, Any] = {}

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return int(self.suggest_categorical(name, list(range(low, high + 1))))

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        field = "worker_threads" if name.startswith("worker_threads_") else name
        value = self.values[field]
        if field == "worker_threads" and value is None:
            value = 1  # stored as unset, drawn as 1 (LoaderConfig rule 2)
        if value not in choices:
            raise ValueError(f"{field}={value!r} is not in this search space (choices {choices})")
        self.params[name] = value
        return value


class _Walk:
    """A trial stand-in that takes the branch ``prefix`` names and the first choice after it, and
    remembers each decision's number of choices, so ``grid`` visits every leaf in order."""

    def __init__(self, prefix: list[int]):
        self.prefix = prefix
        self.taken: list[tuple[int, int]] = []  # (index, number of choices)

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return int(self.suggest_categorical(name, list(range(low, high + 1))))

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        depth = len(self.taken)
        index = self.prefix[depth] if depth < len(self.prefix) else 0
        self.taken.append((index, len(choices)))
        return choices[index]

    def next_prefix(self) -> list[int]:
        """The branch after this one (depth-first), or [] when every branch was taken."""
        taken = list(self.taken)
        while taken:
            index, count = taken.pop()
            if index + 1 < count:
                return [i for i, _ in taken] + [index + 1]
        return []
