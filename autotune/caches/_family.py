"""The cache backends as one family of classes (optuna's ``BaseSampler`` is the model).

A backend is a :class:`~autotune.caches._base.Cache` subclass registered here (``register``); what it
is lives on the class: ``name``, ``in_memory`` (held by the process that built it, so each rank has
its own, and it is never opened from a folder), ``order`` (where it is listed) and ``estimate_need``.
A disk backend's folders are named by ``_base.temp_name`` and ``_lock.lock_path`` from its cache's
name, and it is filled during a first epoch from spooled records (``DiskCache.write_records``), a
memory backend from the loader's samples in shared columns (``_fill``). Every list of backends, the
names a cache folder, its temporary folders and its lock may have, and every per-backend decision
elsewhere in autotune are derived from the registered classes, so a new backend is its module and
one ``register`` call (the built-in ones register as ``caches/__init__`` imports them).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TypeVar

from autotune._family import Family

if TYPE_CHECKING:
    from autotune.caches._base import Cache

# no "-" or ".": a backend's name starts its folders' names
_FAMILY: Family[type[Cache]] = Family("cache backend", "backends", r"^[a-z][a-z0-9_]*$")
C = TypeVar("C", bound="type[Cache]")


def register(cls: C) -> C:
    """Add ``cls`` to the family under ``cls.name`` (usable as a class decorator); refuses a name taken
    by another class, or one that cannot begin a folder name."""
    _FAMILY.add(cls)
    return cls


def unregister(name: str) -> None:
    """Remove the backend ``name`` (a plugin's tests undo their ``register``)."""
    _FAMILY.remove(name)


def backend(name: str) -> type[Cache]:
    """The registered class of the backend ``name``; AutotuneError naming the valid ones."""
    return _FAMILY.get(name)


def _listed() -> list[type[Cache]]:
    return _FAMILY.listed()


def names() -> tuple[str, ...]:
    """Every registered backend's name, by ``order`` (memory, pickle, hdf5, lmdb, then the others)."""
    return _FAMILY.names()


def disk_names() -> tuple[str, ...]:
    """The backends that live in a folder (everything but the in-memory ones)."""
    return tuple(cls.name for cls in _listed() if not cls.in_memory)


def in_memory(name: str) -> bool:
    """Whether the backend ``name`` is held in the memory of the process that built it."""
    return backend(name).in_memory


def folder_pattern() -> str:
    """A regular expression (no anchors) matching ``<backend>`` or ``<backend>-<anything>``, the
    names of disk caches' folders (``_registry.cache_path``) for every registered disk backend."""
    return "(?:" + "|".join(re.escape(n) for n in disk_names()) + r")(?:-.+)?"


__all__ = ["backend", "disk_names", "folder_pattern", "in_memory", "names", "register", "unregister"]
