"""What a search measured, as a profile keeps it: typed, immutable, validated, serialised here only.

``Measured.to_json`` / ``Measured.from_json`` are the one place the recipe's ``"measured"`` object is
written and read; every reader (``autotune show``, ``report``, ``validate``, the factory) asks the
object, never a key with a default of its own. Older recipes that lack a figure read it as unknown
(None), and a value of the wrong type or out of bounds is a RecipeError naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from autotune.config import LoaderConfig
from autotune.errors import RecipeError

_MAX = 2.0**62


def _number(data: dict[str, Any], key: str, *, integer: bool = False) -> Any:
    value = data.get(key)
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or not 0 <= value <= _MAX:
        kind = "a non-negative integer" if integer else "a non-negative number of seconds"
        raise RecipeError(f"a profile's measured.{key} must be {kind}, but got {value!r}")
    return value


def _numbers(data: dict[str, Any], key: str) -> tuple[float, ...]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise RecipeError(f"a profile's measured.{key} must be a list of seconds")
    return tuple(_number({key: v}, key) for v in value)


def _texts(data: dict[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecipeError(f"a profile's measured.{key} must be a list of strings")
    return tuple(value)


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key) or ""
    if not isinstance(value, str):
        raise RecipeError(f"a profile's measured.{key} must be a string, but got {value!r}")
    return value


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise RecipeError(f"a profile's measured.{key} must be true or false, but got {value!r}")
    return value


@dataclass(frozen=True)
class RunFigures:
    """The predicted whole run of one configuration: seconds per phase (None: not recorded)."""

    build_seconds: float | None = None
    first_epoch_seconds: float | None = None
    epoch_seconds: float | None = None
    total_seconds: float | None = None


@dataclass(frozen=True)
class Subset:
    measured: int
    length: int

    @property
    def extrapolated(self) -> bool:
        return self.measured < self.length


@dataclass(frozen=True)
class Finalist:
    config: LoaderConfig
    total_seconds: tuple[float, ...]  # each interleaved re-measurement; () when it failed


@dataclass(frozen=True)
class Interval:
    """A speed-up over the default and its 95% interval (tuner/_significance.py)."""

    speedup: float
    low: float
    high: float

    def text(self) -> str:
        """"3.4x (3.1-3.8x)"; two decimals below 2x, where they matter."""
        d = 2 if self.speedup < 2 else 1
        return f"{self.speedup:.{d}f}x ({self.low:.{d}f}\u2013{self.high:.{d}f}x)"

    def to_json(self) -> dict[str, float]:
        return {"speedup": self.speedup, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, data: Any) -> Interval | None:
        if data is None:
            return None
        if not isinstance(data, dict):
            raise RecipeError("a profile's measured.interval must be an object")
        values = [_number(data, k) for k in ("speedup", "low", "high")]
        if any(v is None or v <= 0 for v in values) or not values[1] <= values[0] <= values[2]:
            raise RecipeError("a profile's measured.interval must hold 0 < low <= speedup <= high")
        return cls(*values)


NO_DIFFERENCE = "no measurable difference"


@dataclass(frozen=True)
class Phase:
    """One phase of a validated run: what the recipe predicted and what the run took (seconds)."""

    predicted: float | None
    measured: float | None

    @property
    def error_percent(self) -> float | None:
        """``(measured - predicted) / predicted * 100``: positive when the run took longer than promised."""
        if self.measured is None or not self.predicted or self.predicted <= 0:
            return None
        return (self.measured - self.predicted) / self.predicted * 100.0


def _optional_number(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecipeError(f"a profile's measured.validation.{key} must be a number, but got {value!r}")
    return value


@dataclass(frozen=True)
class ValidationRecord:
    """What ``autotune validate`` measured, read typed from the recipe's ``measured.validation`` object.

    The four phases of the user's run (build = the ``autotune.dataloader(...)`` call, first epoch,
    steady epoch, total) predicted against measured, and how the run was made. ``record["key"]`` reads
    the stored JSON as written (older recipes: the keys they have), so readers of the plain object keep
    working."""

    build: Phase
    first_epoch: Phase
    epoch: Phase
    total: Phase
    fresh_process: bool = False
    epochs_run: int | None = None
    extrapolated: bool = False
    bare_decode_seconds: float | None = None
    cache_fill: str | None = None
    stored: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, key: str) -> Any:
        return self.stored[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.stored.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.stored

    def to_json(self) -> dict[str, Any]:
        return dict(self.stored)

    @classmethod
    def from_json(cls, data: Any) -> ValidationRecord:
        if not isinstance(data, dict):
            raise RecipeError("a profile's measured.validation must be an object")

        def phase(name: str) -> Phase:
            return Phase(_optional_number(data, f"predicted_{name}_seconds"),
                         _optional_number(data, f"measured_{name}_seconds"))

        epochs_run = data.get("epochs_run")
        if epochs_run is not None and (isinstance(epochs_run, bool) or not isinstance(epochs_run, int)):
            raise RecipeError(f"a profile's measured.validation.epochs_run must be an integer, but got {epochs_run!r}")
        fill = data.get("cache_fill")
        if fill is not None and not isinstance(fill, str):
            raise RecipeError(f"a profile's measured.validation.cache_fill must be a string, but got {fill!r}")
        return cls(build=phase("build"), first_epoch=phase("first_epoch"), epoch=phase("epoch"),
                   total=phase("total"), fresh_process=data.get("fresh_process") is True, epochs_run=epochs_run,
                   extrapolated=data.get("extrapolated") is True,
                   bare_decode_seconds=_optional_number(data, "bare_decode_seconds"), cache_fill=fill,
                   stored=dict(data))


@dataclass(frozen=True)
class Measured:
    """A profile's measured figures: the chosen configuration's predicted run against the default's."""

    chosen: RunFigures = field(default_factory=RunFigures)
    default: RunFigures = field(default_factory=RunFigures)
    peak_memory_bytes: int | None = None
    default_peak_memory_bytes: int | None = None
    runs_seconds: tuple[float, ...] = ()
    default_runs_seconds: tuple[float, ...] = ()
    trials: int | None = None
    failed_trials: int = 0
    pruned_trials: int = 0
    failures: tuple[str, ...] = ()
    search_seconds: float | None = None
    subset: Subset | None = None
    is_default: bool = False
    note: str = ""
    notes: tuple[str, ...] = ()
    has_transform: bool = False
    finalists: tuple[Finalist, ...] = ()
    study_name: str = ""
    study_storage: str = ""
    validation: ValidationRecord | None = None  # written by ``autotune validate`` (_validate.py)
    # the chosen configuration's speed-up with its interval; for a recipe that is the default, the best
    # candidate's (tied with the default, which is why it lost)
    interval: Interval | None = None
    noisy: str = ""  # why the machine was too noisy to tell, when it was

    def speedup_text(self) -> str:
        """"3.4x (3.1-3.8x) as fast" or "no measurable difference" (never "1.00x")."""
        if self.is_default:
            if self.interval is None:
                return NO_DIFFERENCE
            return f"{NO_DIFFERENCE} (the best candidate: {self.interval.text()})"
        if self.interval is not None:
            return f"{self.interval.text()} as fast"
        speedup = self.speedup
        if speedup is None or round(speedup, 2) == 1.0:
            return NO_DIFFERENCE
        return f"{speedup:.2f}x as fast"

    @property
    def speedup(self) -> float | None:
        """The default's whole run over the chosen one's (None when either is unknown)."""
        mine, theirs = self.chosen.total_seconds, self.default.total_seconds
        return theirs / mine if mine and theirs else None

    def with_validation(self, validation: dict[str, Any] | ValidationRecord) -> Measured:
        if not isinstance(validation, ValidationRecord):
            validation = ValidationRecord.from_json(validation)
        return replace(self, validation=validation)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for prefix, figures in (("", self.chosen), ("default_", self.default)):
            for f in fields(RunFigures):
                out[prefix + f.name] = getattr(figures, f.name)
        out.update(
            speedup=self.speedup,
            peak_memory_bytes=self.peak_memory_bytes,
            default_peak_memory_bytes=self.default_peak_memory_bytes,
            runs_seconds=list(self.runs_seconds),
            default_runs_seconds=list(self.default_runs_seconds),
            trials=self.trials,
            failed_trials=self.failed_trials,
            pruned_trials=self.pruned_trials,
            failures=list(self.failures),
            search_seconds=self.search_seconds,
            subset=None if self.subset is None else {"measured": self.subset.measured, "length": self.subset.length,
                                                     "extrapolated": self.subset.extrapolated},
            is_default=self.is_default,
            note=self.note,
            notes=list(self.notes),
            has_transform=self.has_transform,
            finalists=[{"config": f.config.to_json(), "total_seconds": list(f.total_seconds)}
                       for f in self.finalists],
            study={"name": self.study_name, "storage": self.study_storage},
        )
        if self.interval is not None:
            out["interval"] = self.interval.to_json()
        if self.noisy:
            out["noisy"] = self.noisy
        if self.validation is not None:
            out["validation"] = self.validation.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any) -> Measured:
        """From a profile's ``"measured"`` object; RecipeError naming the first bad value."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise RecipeError("a profile's 'measured' must be an object")
        figures = []
        for prefix in ("", "default_"):
            figures.append(RunFigures(**{f.name: _number(data, prefix + f.name) for f in fields(RunFigures)}))
        subset = data.get("subset")
        if subset is not None:
            if not isinstance(subset, dict):
                raise RecipeError("a profile's measured.subset must be an object")
            subset = Subset(measured=_number(subset, "measured", integer=True) or 0,
                            length=_number(subset, "length", integer=True) or 0)
        finalists = data.get("finalists") or []
        if not isinstance(finalists, list) or not all(isinstance(f, dict) for f in finalists):
            raise RecipeError("a profile's measured.finalists must be a list of objects")
        study = data.get("study") or {}
        if not isinstance(study, dict):
            raise RecipeError("a profile's measured.study must be an object")
        validation = data.get("validation")
        if validation is not None:
            validation = ValidationRecord.from_json(validation)
        return cls(
            chosen=figures[0],
            default=figures[1],
            peak_memory_bytes=_number(data, "peak_memory_bytes", integer=True),
            default_peak_memory_bytes=_number(data, "default_peak_memory_bytes", integer=True),
            runs_seconds=_numbers(data, "runs_seconds"),
            default_runs_seconds=_numbers(data, "default_runs_seconds"),
            trials=_number(data, "trials", integer=True),
            failed_trials=_number(data, "failed_trials", integer=True) or 0,
            pruned_trials=_number(data, "pruned_trials", integer=True) or 0,
            failures=_texts(data, "failures"),
            search_seconds=_number(data, "search_seconds"),
            subset=subset,
            is_default=_flag(data, "is_default"),
            note=_text(data, "note"),
            notes=_texts(data, "notes"),
            has_transform=_flag(data, "has_transform"),
            finalists=tuple(Finalist(LoaderConfig.from_json(f.get("config") or {}),
                                     _numbers(f, "total_seconds")) for f in finalists),
            study_name=_text(study, "name"),
            study_storage=_text(study, "storage"),
            validation=validation,
            interval=Interval.from_json(data.get("interval")),
            noisy=_text(data, "noisy"),
        )
