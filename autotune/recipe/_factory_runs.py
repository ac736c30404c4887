"""What the factory cost on this machine: the runs ``autotune validate`` made through
``autotune.dataloader(...)`` in a fresh process, from a cold start, kept in the machine's profile
(``"factory_runs"``), so the next search on this machine predicts from them (docs/architecture.md §3).

A trial predicts the factory's build from a subset's build scaled to the dataset; on this 2-CPU machine
one such figure varies by ±15%, and it ran in a trial's process, not the factory's. A validation measures
the real thing. Each run is filed under what decides each phase's cost, so a later search uses it only
where it applies (``FactoryRun.builds_like`` and ``runs_like``):

- the build: the dataset (fingerprint and length), the cache backend, that it is built first, and the
  processes building it;
- the epochs: the same, plus the whole loader configuration and the batch size.

The newest ``KEEP`` runs are kept; a search that replaces the profile keeps them (``merged``).
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import LoaderConfig
from autotune.errors import RecipeError

if TYPE_CHECKING:  # the profile holds these runs: recipe/_file.py imports this module
    from autotune.recipe._file import Profile

# how a search's note that its figures were learned from these runs begins (``autotune show`` finds it)
FACTORY_NOTE = "predicted from runs of the factory on this machine (autotune validate)"
KEEP = 8  # runs kept per profile: enough for a median, few enough that an old machine state ages out

_FLOATS = ("build_seconds", "first_epoch_seconds", "epoch_seconds")
_INTS = ("length", "batch_size", "build_workers")
_TEXTS = ("dataset", "validated_at")


def _bad(key: str, value: Any, kind: str) -> RecipeError:
    return RecipeError(f"a profile's factory_runs[].{key} must be {kind}, but got {value!r}; "
                       "remove factory_runs from the recipe file (run `autotune validate` again to refill it)")


@dataclass(frozen=True)
class FactoryRun:
    """One validated run of the factory: what it ran and what each phase took (seconds, whole epochs)."""

    dataset: str  # the dataset's fingerprint (dataset/_fingerprint.py), read in the validation's process
    length: int
    batch_size: int
    config: LoaderConfig
    build_workers: int  # processes a cache build decodes on (0 without a cache)
    build_seconds: float  # the autotune.dataloader(...) call: recipe load, checks, cache build
    first_epoch_seconds: float
    epoch_seconds: float
    validated_at: str = ""

    def builds_like(self, config: LoaderConfig, dataset: str, length: int, build_workers: int) -> bool:
        """Whether this run's build stands for ``config``'s: the same data, the same cache built first by as
        many processes. The loader's other settings do not touch the build."""
        return (config.cache is not None and config.cache_fill == "build" and self.config.cache == config.cache
                and self.config.cache_fill == "build" and self.dataset == dataset and self.length == length
                and self.build_workers == build_workers)

    def runs_like(self, config: LoaderConfig, dataset: str, length: int, batch_size: int) -> bool:
        """Whether this run's epochs stand for ``config``'s: the same configuration over the same data and
        batches."""
        return (self.config == config and self.dataset == dataset and self.length == length
                and self.batch_size == batch_size)

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "length": self.length, "batch_size": self.batch_size,
                "config": self.config.to_json(), "build_workers": self.build_workers,
                "build_seconds": self.build_seconds, "first_epoch_seconds": self.first_epoch_seconds,
                "epoch_seconds": self.epoch_seconds, "validated_at": self.validated_at}

    @classmethod
    def from_json(cls, data: Any) -> FactoryRun:
        """From one entry of a profile's ``factory_runs``; RecipeError naming the first bad value."""
        if not isinstance(data, dict):
            raise RecipeError("a profile's factory_runs must be a list of objects; remove factory_runs from the "
                              "recipe file (run `autotune validate` again to refill it)")
        values: dict[str, Any] = {}
        for key in _FLOATS:
            v = data.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise _bad(key, v, "a non-negative number of seconds")
            values[key] = float(v)
        for key in _INTS:
            v = data.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise _bad(key, v, "a non-negative integer")
            values[key] = v
        for key in _TEXTS:
            v = data.get(key, "")
            if not isinstance(v, str):
                raise _bad(key, v, "a string")
            values[key] = v
        return cls(config=LoaderConfig.from_json(data.get("config")), **values)


def read(data: Any) -> tuple[FactoryRun, ...]:
    """A profile's ``factory_runs`` (absent: none)."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise RecipeError("a profile's factory_runs must be a list of objects; remove factory_runs from the "
                          "recipe file (run `autotune validate` again to refill it)")
    return tuple(FactoryRun.from_json(d) for d in data)


def merged(old: tuple[FactoryRun, ...], new: tuple[FactoryRun, ...]) -> tuple[FactoryRun, ...]:
    """``old`` then ``new`` without repeats, the newest ``KEEP``."""
    out: list[FactoryRun] = []
    for run in (*old, *new):
        if run not in out:
            out.append(run)
    return tuple(out[-KEEP:])


def from_validation(validation: Any, profile: Profile) -> FactoryRun | None:
    """The factory run a validation measured, or None where it does not stand for this machine's factory:
    not a fresh process, the recipe of other hardware, several ranks per node (a validation runs one), a
    dataset the validation did not fingerprint, or source files it found and could not evict (its first
    epoch was not cold). Data with no files to evict (generated, or held in memory) is read the same way
    by trials and the factory, so its runs count."""
    eviction = validation.eviction
    warm = eviction is not None and bool(eviction.files or eviction.failed) and not eviction.effective
    if (not validation.fresh_process or not validation.on_this_machine or not validation.dataset_fingerprint
            or validation.profile_fingerprint != profile.fingerprint or profile.ranks_per_node != 1 or warm):
        return None
    return FactoryRun(
        dataset=validation.dataset_fingerprint, length=validation.dataset_length or 0,
        batch_size=validation.batch_size,
        config=profile.config, build_workers=(validation.bare_decode_workers or 0) if profile.config.cache else 0,
        build_seconds=validation.measured_build_seconds, first_epoch_seconds=validation.measured_first_epoch_seconds,
        epoch_seconds=validation.measured_epoch_seconds,
        validated_at=validation.validated_at or _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
    )
