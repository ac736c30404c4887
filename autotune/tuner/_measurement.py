"""One trial's result, typed and frozen: what ``measure()`` found for one configuration (docs/architecture.md §3).

A ``Measurement`` travels from the trial process (pickled through its pipe) to the search, which combines
ranks that ran together (``slowest_rank``), takes the median of interleaved re-measurements (``median``)
and hands the winner's and the default's to the recipe. ``to_json`` / ``from_json`` are the one place its
keys are written and read: Optuna's trial attributes and the finalists' runs pooled in a (shared) study.
``from_json`` refuses unknown keys and values of the wrong type with a MeasurementError naming them; a
field an older version did not store reads as its default, so a study it wrote still reads.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from autotune.errors import MeasurementError
from autotune.machine import EvictionReport
from autotune.tuner._predict import EpochTiming, Prediction

_T = TypeVar("_T")


@dataclass(frozen=True)
class Measurement:
    """What one trial measured, or what several runs of one configuration combine into."""

    prediction: Prediction  # the predicted whole run (docs/architecture.md §3)
    epochs: tuple[EpochTiming, ...]  # each measured epoch of the subset, the cold one first
    measured_samples: int  # samples an epoch read (summed over ranks that ran together)
    # PSS of the trial and its workers at an epoch's end, a memory cache scaled from the subset to the whole
    # dataset (``_measure.whole_run_peak``); summed over ranks, max over runs
    peak_memory_bytes: int
    # What the same run adds to the job's memory (``machine.tree_memory``: less the pages a forked trial
    # shares with its forkserver): the figure the budget is held to, as the memory plan counts it. None: an
    # older study, whose peak stands for it.
    added_memory_bytes: int | None = None
    build_seconds_subset: float | None = None  # the cache build on the subset; None: not stored (an older study)
    eviction: EvictionReport | None = None  # before the first epoch; None: no files to evict, or not stored
    process_applied: tuple[str, ...] = ()  # process settings applied in the trial (process/_settings.py)
    process_not_applied: tuple[str, ...] = ()  # and the ones that could not be, with the reason
    ranks: tuple[float, ...] = ()  # every rank's predicted total, when ranks ran together (``slowest_rank``)
    runs: tuple[float, ...] = ()  # every run's predicted total, when this is their median (``median``)
    # Where each rank's cache came from ("built" in that process, "waited" for or "reused" from another
    # rank's build of a disk cache its ranks share) and the id of the build it read; () without a cache.
    cache_origins: tuple[str, ...] = ()
    cache_builders: tuple[str, ...] = ()

    @property
    def charged_bytes(self) -> int:
        """What the run adds to the job's memory (its peak where an older study did not record it)."""
        return self.peak_memory_bytes if self.added_memory_bytes is None else self.added_memory_bytes

    @property
    def total_seconds(self) -> float:
        """The predicted whole run: the figure the search minimises."""
        return self.prediction.total_seconds

    def to_json(self) -> dict[str, Any]:
        """JSON-native values only (lists, not tuples), so a stored copy compares equal to a fresh one."""
        encoded = _encode(self)
        assert isinstance(encoded, dict)
        return encoded

    @classmethod
    def from_json(cls, data: Any) -> Measurement:
        """From ``to_json``'s form; MeasurementError for an unknown key, a missing or a wrongly typed value."""
        return _decode_object(cls, data, "")

    @classmethod
    def from_trial_attrs(cls, attrs: Mapping[str, Any]) -> Measurement | None:
        """From an Optuna trial's user attributes, which also hold the trial's other keys (its configuration,
        its reason); None when the trial stored no measurement (failed, pruned, a repeat)."""
        names = {f.name for f in dataclasses.fields(cls)}
        mine = {k: v for k, v in attrs.items() if k in names}
        return cls.from_json(mine) if mine else None

    @classmethod
    def slowest_rank(cls, results: Sequence[Measurement]) -> Measurement:
        """Ranks that ran together as one figure: the slowest rank's run (the job waits for it), with the
        memory and the samples of all ranks summed and every rank's total kept (in rank order)."""
        if not results:
            raise ValueError("no rank reported a result")
        if len(results) == 1:
            return results[0]
        slowest = max(results, key=lambda r: r.total_seconds)
        return replace(slowest, peak_memory_bytes=sum(r.peak_memory_bytes for r in results),
                       added_memory_bytes=_combined_added(results, sum),
                       measured_samples=sum(r.measured_samples for r in results),
                       ranks=tuple(r.total_seconds for r in results),
                       cache_origins=tuple(o for r in results for o in r.cache_origins),
                       cache_builders=tuple(b for r in results for b in r.cache_builders))

    @classmethod
    def median(cls, results: Sequence[Measurement]) -> Measurement:
        """Several runs of one configuration as one figure: the run whose predicted total is the median, with
        the peak memory of all runs and every run's total (in order). For an even count the prediction is the
        mean of the two middle runs' (the rest is the lower one's): the lower of two, which the finalists'
        two rounds often leave, made every recipe's figure optimistic by half the runs' spread (a 3.23 and a
        2.63 s run predicted 2.63 s for a run measured at 3.11 s, docs/architecture.md §3)."""
        if not results:
            raise ValueError("no run to take the median of")
        ordered = sorted(results, key=lambda r: r.total_seconds)
        chosen = ordered[(len(ordered) - 1) // 2]
        prediction = chosen.prediction
        if len(ordered) % 2 == 0:
            upper = ordered[len(ordered) // 2].prediction
            prediction = replace(prediction, **{
                name: (getattr(prediction, name) + getattr(upper, name)) / 2 for name in _TIMES})
        return replace(chosen, prediction=prediction, peak_memory_bytes=max(r.peak_memory_bytes for r in results),
                       added_memory_bytes=_combined_added(results, max),
                       runs=tuple(r.total_seconds for r in results))


def _combined_added(results: Sequence[Measurement], combine: Callable[[Iterable[int]], int]) -> int | None:
    """What several results add together (``combine``: sum over ranks, max over runs); None where none recorded
    it (an older study), so a combined older result still reads as one."""
    if all(r.added_memory_bytes is None for r in results):
        return None
    return combine(r.charged_bytes for r in results)


# The prediction's seconds (its float fields): what the median of an even count averages.
_TIMES = tuple(f.name for f in dataclasses.fields(Prediction) if f.type in ("float", float))


# ------------------------------------------------------------------------------- the JSON form


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    return value


def _name(path: str) -> str:
    return f"a trial result's {path}" if path else "a trial result"


def _decode_object(cls: type[_T], data: Any, path: str) -> _T:
    """A frozen dataclass from its JSON object, every field checked against the field's type."""
    if not isinstance(data, Mapping):
        raise MeasurementError(f"{_name(path)} must be an object, but got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise MeasurementError(f"{_name(path)} has unknown keys {', '.join(map(repr, unknown))}")
    missing = [name for name, f in fields.items() if name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise MeasurementError(f"{_name(path)} lacks {', '.join(map(repr, missing))}")
    hints = typing.get_type_hints(cls)
    prefix = f"{path}." if path else ""
    return cls(**{k: _decode(hints[k], v, prefix + k) for k, v in data.items()})


_KINDS: dict[Any, str] = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}


def _decode(hint: Any, value: Any, path: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):  # only ``X | None`` is used
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, value, path)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise MeasurementError(f"{_name(path)} must be a list, but got {value!r}")
        items = [_decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode_object(hint, value, path)
    if hint in _KINDS:
        ok = isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
        if hint is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise MeasurementError(f"{_name(path)} must be {_KINDS[hint]}, but got {value!r}")
        return float(value) if hint is float else value
    raise TypeError(f"no JSON form for {hint!r} at {path}")  # a field of a type added without one
