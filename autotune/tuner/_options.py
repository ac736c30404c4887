"""How a search runs: ``SearchOptions`` is the one place its options and their defaults are written.

`autotune search`'s flags (``cli/_search.py``) and ``autotune.search()``'s keywords (``SearchKeywords``)
are built from the fields whose metadata carries a ``help``; each value is checked here, in one way, whether
it came from a flag (text: "2m", "8G", "memory,pickle") or from Python (2.5, 8 << 30, ("memory",)).

The budget is a wall: the trials and the reads of preparation end with the budget, the finalists' interleaved
re-measurement may take ``finalists_share`` more (stated in ``--help``), and then the search returns.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict

from autotune._units import format_seconds, parse_duration
from autotune.errors import AutotuneError
from autotune.process import get_allocator
from autotune.recipe._factory_runs import FactoryRun

FINALISTS_SHARE = 0.25  # of the budget, at least FINALISTS_MIN_S: the finalists' re-measurement after it
FINALISTS_MIN_S = 5.0
EXIT_S = 2.0  # of the promise, kept for what follows the search: the recipe's write, the summary, the exit
TRIAL_SHARE, TRIAL_MIN_S, TRIAL_MAX_S = 1 / 50, 1.0, 10.0  # a default trial's seconds: of the budget, bounded
MIN_ROUNDS = 2  # interleaved re-measurements of the finalists before their interval can be narrow enough
MAX_ROUNDS = 8  # the default of --max-rounds


def _user(help: str, flag: str | None = None) -> dict[str, Any]:
    """Metadata of an option the user sets: a flag of `autotune search` and a keyword of autotune.search()."""
    return {"help": help, "flag": flag}


@dataclass
class SearchOptions:
    budget: float = field(default=120.0, metadata=_user(
        "time budget of the search, e.g. 90s, 2m, 1h, from the command's start on; the finalists' "
        f"re-measurement may add {FINALISTS_SHARE * 100:.0f}%% of it (at least {FINALISTS_MIN_S:.0f} s), then the "
        "search returns"))
    workdir: Path = field(default=Path(".autotune"), metadata=_user("where studies, logs and trial caches live"))
    storage: str | None = field(default=None, metadata=_user(
        "Optuna storage URL shared by a fleet, e.g. postgresql://USER@HOST/DB (default: an SQLite file in "
        "the work folder)"))
    seed: int = field(default=0, metadata=_user("seed of the sampler and the measured subset"))
    caches: tuple[str, ...] | None = field(default=None, metadata=_user(
        "cache backends to consider, comma-separated, or 'none' (default: all that fit)"))
    max_memory: int | None = field(default=None, metadata=_user(
        "memory budget of a candidate, e.g. 8G (default 70%% of available)"))
    max_workers: int | None = field(default=None, metadata=_user("upper bound of num_workers (default: usable CPUs)"))
    ranks_per_node: int = field(default=1, metadata=_user("training processes sharing this machine"))
    data_dir: str | None = field(default=None, metadata=_user(
        "folder of the dataset's files, evicted for cold reads (default: the files dataset[i] opens)"))
    progress: bool = field(default=True, metadata=_user("no progress bar", flag="--no-progress"))
    max_trials: int | None = field(default=None, metadata=_user(
        "end the search once this many trials were asked, with budget left (default: until the budget's end)"))
    max_rounds: int = field(default=MAX_ROUNDS, metadata=_user(
        f"re-measure the finalists in at most this many interleaved rounds, at least {MIN_ROUNDS}; they stop "
        "sooner once the leader's speed-up over the default is known to about +-5%%"))
    trial_seconds: float | None = field(default=None, metadata=_user(
        "seconds of loading the plain default's trial measures, e.g. 1s, which sizes the measured subset "
        f"(default: the budget / 50, {TRIAL_MIN_S:.0f} to {TRIAL_MAX_S:.0f} s)"))
    resume_only: bool = field(default=False, metadata=_user(
        "measure nothing: write the recipe from what the study (--storage, shared by a fleet) holds"))
    allocators: tuple[str, ...] | None = None
    finalists: int = 3
    trial_timeout: float | None = None  # a trial still running after this is killed; derived, capped by the budget
    sampler: Any = None  # an Optuna sampler instead of the seeded TPE (the benchmarks compare RandomSampler)
    # what the factory cost, by hardware fingerprint: the recipe file's factory_runs (recipe/_factory_runs.py)
    factory_runs: dict[str, tuple[FactoryRun, ...]] = field(default_factory=dict)
    # when the budget's clock started (time.monotonic()); None: when the search starts. The command line
    # starts it at the process's start (cli/_search.py), before torch and the dataset file are imported.
    started: float | None = None

    def __post_init__(self) -> None:
        budget = parse_duration(self.budget)
        if not math.isfinite(budget):
            raise AutotuneError(f"--budget must be a finite duration such as 90s, 2m or 1h, but got {self.budget!r}.")
        self.budget = budget
        if self.trial_seconds is not None:
            given = self.trial_seconds
            try:
                seconds = parse_duration(given)
            except AutotuneError:
                seconds = math.nan
            if not math.isfinite(seconds):
                raise AutotuneError(f"--trial-seconds must be a duration such as 1s or 5s, but got {given!r}.")
            self.trial_seconds = seconds
        self.workdir = Path(self.workdir)
        if self.workdir.exists() and not self.workdir.is_dir():
            raise AutotuneError(f"--workdir {self.workdir} is a file, not a folder; pass a folder (default .autotune).")
        if isinstance(self.caches, str):
            self.caches = parse_caches(self.caches)
        elif self.caches is not None:
            self.caches = parse_caches(",".join(self.caches))
        if self.allocators is not None:
            self.allocators = tuple(get_allocator(name).name for name in self.allocators)  # unknown: names the valid
        if isinstance(self.max_memory, str):
            self.max_memory = parse_size(self.max_memory)
        elif self.max_memory is not None and (isinstance(self.max_memory, bool) or self.max_memory < 1 << 20):
            raise AutotuneError(f"max_memory must be a size in bytes of at least 1 MiB, but got {self.max_memory!r}.")
        for name, least in (("max_workers", 0), ("ranks_per_node", 1), ("seed", 0), ("max_trials", 1),
                            ("max_rounds", MIN_ROUNDS)):
            value = getattr(self, name)
            if (value is not None or name == "max_rounds") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise AutotuneError(f"--{name.replace('_', '-')} must be an integer of at least {least}, "
                                    f"but got {value!r}.")
        if self.storage is not None:
            from autotune.tuner._storage import check_url

            check_url(self.storage)

    @property
    def default_trial_seconds(self) -> float:
        """What the plain default's trial measures: ``--trial-seconds``, else a share of the budget."""
        return self.trial_seconds or min(TRIAL_MAX_S, max(TRIAL_MIN_S, self.budget * TRIAL_SHARE))

    @property
    def finalists_seconds(self) -> float:
        """What the finalists' re-measurement may add to the budget."""
        return max(FINALISTS_MIN_S, FINALISTS_SHARE * self.budget)

    def clock(self) -> Clock:
        return Clock(self.started if self.started is not None else time.monotonic(), self.budget,
                     self.finalists_seconds)


@dataclass(frozen=True)
class Clock:
    """The search's deadlines: trials after the first end at ``budget_end``; preparation, the first trial and
    the finalists at ``wall``."""

    start: float
    budget: float
    finalists_seconds: float

    @property
    def budget_end(self) -> float:
        return self.start + self.budget

    @property
    def wall(self) -> float:
        """Where the search's own work ends: the promise less EXIT_S, left for writing the recipe, the summary
        and the interpreter's exit (a 2-minute search returned at 148 s and its command ended at 150.24 s)."""
        return self.budget_end + self.finalists_seconds - EXIT_S

    @property
    def read_allowance(self) -> float:
        """The longest one read of the user's data may take before it counts as hung."""
        return max(5.0, self.budget / 4)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self, until: float | None = None) -> float:
        """Seconds to ``until`` (the wall by default), never below zero."""
        return max(0.0, (self.wall if until is None else until) - time.monotonic())

    def promise(self) -> str:
        return (f"within {format_seconds(self.budget)} plus {format_seconds(self.finalists_seconds)} for the "
                "finalists")


class SearchKeywords(TypedDict, total=False):
    """autotune.search()'s keywords: the user fields of SearchOptions (tests/test_search_options.py keeps
    the two the same)."""

    budget: str | float
    workdir: str | Path
    storage: str | None
    seed: int
    caches: tuple[str, ...] | str | None
    max_memory: int | str | None
    max_workers: int | None
    ranks_per_node: int
    data_dir: str | None
    progress: bool
    max_trials: int | None
    max_rounds: int
    trial_seconds: str | float | None
    resume_only: bool


def user_fields() -> list[Any]:
    """The options a user sets, in their order: `autotune search`'s flags and autotune.search()'s keywords."""
    return [f for f in fields(SearchOptions) if "help" in f.metadata]


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
