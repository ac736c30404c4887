"""What a profile records about the dataset it was tuned on and the run it was tuned for.

Frozen, checked on reading (``from_json``: types and bounds, ``RecipeError`` naming the field), and
written back to the same JSON as before; keys a newer autotune wrote are kept in ``extra`` so a
merge does not drop them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.errors import RecipeError

_MAX_INT = 2**62  # larger than any real count; rejects absurd hand-edits


def _int(data: dict[str, Any], where: str, name: str, low: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_INT:
        word = "a positive integer" if low else "a non-negative integer"
        raise RecipeError(f"a profile's {where}.{name} must be {word}, but got {value!r}")
    return value


def _text(data: dict[str, Any], where: str, name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise RecipeError(f"a profile's {where}.{name} must be a string")
    return value


def _flag(data: dict[str, Any], where: str, name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise RecipeError(f"a profile's {where}.{name} must be true or false, but got {value!r}")
    return value


@dataclass(frozen=True)
class DatasetRecord:
    """The dataset a profile was tuned on: where it came from, its length and identity."""

    source: str = ""  # PATH:NAME of the dataset file, or "<python object: Class>" from autotune.search
    length: int | None = None  # samples per epoch (a stream's: when known)
    fingerprint: str | None = None  # dataset/_fingerprint.py
    stream: bool = False  # an IterableDataset: no cache, read in its own order
    length_known: bool = False  # a stream's length came from __len__ or samples_per_epoch
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    _FIELDS = ("source", "length", "fingerprint", "stream", "length_known")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in ("source", "length", "fingerprint")
                               if getattr(self, k) not in (None, "")}
        if self.stream:
            out.update(stream=True, length_known=self.length_known)
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @classmethod
    def from_json(cls, data: Any) -> DatasetRecord:
        if not isinstance(data, dict):
            raise RecipeError("a profile has no 'dataset' object")
        return cls(source=_text(data, "dataset", "source") or "", length=_int(data, "dataset", "length", 0),
                   fingerprint=_text(data, "dataset", "fingerprint"), stream=_flag(data, "dataset", "stream"),
                   length_known=_flag(data, "dataset", "length_known"),
                   extra={k: v for k, v in data.items() if k not in cls._FIELDS})


@dataclass(frozen=True)
class RunSettings:
    """The run a profile was tuned for: the user's batch size and epochs (``autotune search`` flags or
    the dataset file's hooks)."""

    batch_size: int | None = None
    epochs: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    _FIELDS = ("batch_size", "epochs")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self._FIELDS if getattr(self, k) is not None}
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunSettings:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise RecipeError("a profile's 'settings' must be an object")
        return cls(batch_size=_int(data, "settings", "batch_size", 1), epochs=_int(data, "settings", "epochs", 1),
                   extra={k: v for k, v in data.items() if k not in cls._FIELDS})
