"""A family of classes registered by name (optuna's ``BaseSampler`` is the model): what the cache backends
(``caches/_family.py``) and the memory allocators (``process/_family.py``) share. Each member class carries
its ``name`` and ``order``; every list is derived from the registered classes, in ``order`` (stable: then
as registered)."""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

from autotune.errors import AutotuneError

T = TypeVar("T", bound=type)


class Family(Generic[T]):
    """The registered classes of one family: ``what`` names a member in messages ("cache backend"),
    ``plural`` the valid ones ("backends"); a name must match ``pattern`` (what a recipe stores plainly and a
    folder's name may start with)."""

    def __init__(self, what: str, plural: str, pattern: str):
        self.what, self.plural, self.pattern = what, plural, re.compile(pattern)
        self.registered: dict[str, T] = {}

    def add(self, cls: T) -> T:
        """Add ``cls`` under ``cls.name``; refuses a name that does not match, or is taken by another class."""
        name: Any = getattr(cls, "name", None)
        if not isinstance(name, str) or not self.pattern.match(name):
            raise ValueError(f"A{'n' if self.what[0] in 'aeiou' else ''} {self.what}'s name must match "
                             f"{self.pattern.pattern}, but {cls.__name__} has {name!r}.")
        if self.registered.get(name, cls) is not cls:
            raise ValueError(f"The {self.what} name {name!r} is taken by {self.registered[name].__name__}.")
        self.registered[name] = cls
        return cls

    def remove(self, name: str) -> None:
        self.registered.pop(name, None)

    def get(self, name: str) -> T:
        """The registered class ``name``; AutotuneError naming the valid ones."""
        try:
            return self.registered[name]
        except (KeyError, TypeError):
            raise AutotuneError(f"Unknown {self.what} {name!r}. Valid {self.plural}: "
                                f"{', '.join(self.names())}.") from None

    def listed(self) -> list[T]:
        return sorted(self.registered.values(), key=lambda cls: cls.order)  # type: ignore[attr-defined]

    def names(self) -> tuple[str, ...]:
        return tuple(cls.name for cls in self.listed())  # type: ignore[attr-defined]


__all__ = ["Family"]
