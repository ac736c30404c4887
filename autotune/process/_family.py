"""The memory allocators as one family of classes (optuna's ``BaseSampler`` is the model), as the
cache backends are (``autotune/caches/_family.py``).

An allocator is an :class:`Allocator` subclass registered here (``register``); what it is lives on the
class: ``name`` (what a recipe stores), ``order`` (where it is listed), ``title`` (its column in
``benchmarks/allocators.py``), ``searched`` (whether a search tries it where it is available),
``unavailable()`` (why it cannot be used on this machine, with the fix), ``environment()`` (what a process
started with it has set), ``apply()`` (what it switches on at run time, in this process) and ``stand_in``
(what is used where it cannot be). Two kinds:

- :class:`Preloaded`: a library put first in ``LD_PRELOAD``; it replaces ``malloc`` only from a process's
  start, so it needs a fresh process (tcmalloc, jemalloc). Found by its ``libraries`` file names.
- :class:`Mallopt`: glibc's own allocator with raised ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``, so a
  freed large block (a 38 MB batch) stays in the heap and the next batch reuses it instead of paying fresh
  page faults; ``mallopt`` at run time (the main process and each DataLoader worker), glibc's
  ``MALLOC_*_`` variables at start (glibc-tuned).

``glibc``, the C library's allocator as the process starts, is the plain one: it changes nothing, is
always available, and everything falls back to it in the end. Every list of allocators, the check of a
recipe's allocator, the search's choices, which processes a trial must start fresh, and what is applied
where are derived from the registered classes, so a new allocator is a class and one ``register`` call.
"""

from __future__ import annotations

import os
import re
from typing import ClassVar, TypeVar

from autotune._family import Family
from autotune.errors import AutotuneError
from autotune.process import _allocator as _alloc

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")  # a recipe's value and a command line's word: nothing to quote
DEFAULT = "glibc"  # the plain allocator: LoaderConfig's default, and where every fallback ends


class Allocator:
    """The base of the family; as it is, the plain allocator's behaviour: nothing to set, nothing to find."""

    name: ClassVar[str] = ""
    order: ClassVar[int] = 100  # listed by order, then as registered
    title: ClassVar[str] = ""  # a few words for a table's column
    searched: ClassVar[bool] = True  # a search tries it where it is available (``tuner/_candidates.py``)
    preloaded: ClassVar[bool] = False  # only takes effect in a process started with it (a fresh one)
    stand_in: ClassVar[str] = DEFAULT  # used instead where this one is not available (or not preloaded)
    # Whether freed large blocks stay in the process (reused, never returned): then a process holds the peak of what
    # it allocated at once, where glibc's default unmaps each batch (over its mmap threshold) as it is freed. The
    # memory plan counts it (``tuner/_memory_plan.py``): the main process of a trial without workers, collating 2000
    # JPEGs' 36.8 MiB batches, held 74 MiB over its start under glibc and 45 under jemalloc, 148 under tcmalloc and
    # 147-155 under glibc-tuned (four batches: the one consumed, the next one's samples and their collation, and one
    # more the allocator keeps apart); a worker's batches are collated into shared memory, which no allocator keeps.
    keeps_freed: ClassVar[bool] = False

    @classmethod
    def unavailable(cls) -> str | None:
        """None when this allocator can be used on this machine, else a one-line reason with the fix."""
        return None

    @classmethod
    def environment(cls) -> dict[str, str]:
        """What a process started with this allocator has in its environment (``LD_PRELOAD`` included)."""
        return {}

    @classmethod
    def apply(cls, where: str) -> tuple[bool, str] | None:
        """Switch this allocator on now in this process (``where``: "main process", "worker 3"): whether it
        took and the line that says what was done or refused; None when there is nothing to do at run time."""
        return None


class Preloaded(Allocator):
    """An allocator library that replaces ``malloc`` when preloaded (``LD_PRELOAD``) at a process's start."""

    preloaded = True
    libraries: ClassVar[tuple[str, ...]] = ()  # its file names, preferred first
    package: ClassVar[str] = ""  # the Debian package that installs it
    # A recipe picks a preload because large freed blocks are reused, which glibc-tuned also gives at run time.
    stand_in = "glibc-tuned"

    @classmethod
    def library(cls) -> str | None:
        """The path of its library on this machine, or None (``_allocator.find_library``)."""
        return _alloc.find_library(cls.libraries)

    @classmethod
    def unavailable(cls) -> str | None:
        if cls.library() is not None:
            return None
        return f"not available: {cls.libraries[0]} not found; install it with `apt-get install {cls.package}`"

    @classmethod
    def environment(cls) -> dict[str, str]:
        library = cls.library()
        if library is None:
            raise AutotuneError(f"{cls.name} {cls.unavailable()}")
        return {"LD_PRELOAD": library}

    @classmethod
    def loaded(cls, mapped: set[str]) -> bool:
        """Whether one of its libraries is among ``mapped`` (``_allocator.mapped_paths``), any version."""
        stems = {f.split(".so")[0] for f in cls.libraries}
        return any(os.path.basename(p).split(".so")[0] in stems for p in mapped)


class Mallopt(Allocator):
    """glibc's allocator with its mmap and trim thresholds raised: ``mallopt`` at run time, glibc's
    ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` (read at start) in a started process's environment."""

    mmap_threshold: ClassVar[int] = _alloc.DEFAULT_MMAP_THRESHOLD
    trim_threshold: ClassVar[int] = _alloc.DEFAULT_TRIM_THRESHOLD
    keeps_freed = True  # what the raised thresholds are for

    @classmethod
    def unavailable(cls) -> str | None:
        return _alloc.not_glibc()

    @classmethod
    def environment(cls) -> dict[str, str]:
        return {_alloc.ENV_MMAP_THRESHOLD: str(cls.mmap_threshold), _alloc.ENV_TRIM_THRESHOLD: str(cls.trim_threshold)}

    @classmethod
    def apply(cls, where: str) -> tuple[bool, str] | None:
        text = (f"mallopt(M_MMAP_THRESHOLD={_alloc.format_size(cls.mmap_threshold)}, "
                f"M_TRIM_THRESHOLD={_alloc.format_size(cls.trim_threshold)}) in {where}")
        reason = cls.unavailable()
        if reason is not None:
            return False, f"{cls.name} {reason}"
        if _alloc.apply_mallopt(cls.mmap_threshold, cls.trim_threshold):
            return True, text
        return False, f"{cls.name}: glibc refused {text}"


class Glibc(Allocator):
    name = DEFAULT
    order = 0
    title = "glibc default"


class GlibcTuned(Mallopt):
    name = "glibc-tuned"
    order = 10
    title = f"glibc, thresholds raised ({_alloc.format_size(_alloc.DEFAULT_MMAP_THRESHOLD)})"


class Tcmalloc(Preloaded):
    name = "tcmalloc"
    order = 20
    title = "tcmalloc (LD_PRELOAD)"
    libraries = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
    package = "libtcmalloc-minimal4"
    keeps_freed = True  # its page heap keeps freed spans


class Jemalloc(Preloaded):
    name = "jemalloc"
    order = 30
    title = "jemalloc (LD_PRELOAD)"
    libraries = ("libjemalloc.so.2",)
    package = "libjemalloc2"


_FAMILY: Family[type[Allocator]] = Family("allocator", "allocators", _NAME.pattern)
A = TypeVar("A", bound="type[Allocator]")


def register(cls: A) -> A:
    """Add ``cls`` to the family under ``cls.name`` (usable as a class decorator); refuses a name taken by
    another class or that a recipe could not store plainly, a preload without a library to look for, and a
    ``stand_in`` that is not registered."""
    if issubclass(cls, Preloaded) and not cls.libraries:
        raise ValueError(f"The preloaded allocator {cls.__name__} names no library file (libraries).")
    if cls.stand_in != getattr(cls, "name", None) and cls.stand_in not in _FAMILY.registered:
        raise ValueError(f"{cls.__name__}'s stand_in {cls.stand_in!r} is not a registered allocator.")
    _FAMILY.add(cls)
    return cls


def unregister(name: str) -> None:
    """Remove the allocator ``name`` (a plugin's tests undo their ``register``); the plain one stays."""
    if name != DEFAULT:
        _FAMILY.remove(name)


def get(name: str) -> type[Allocator]:
    """The registered class of the allocator ``name``; AutotuneError naming the valid ones."""
    return _FAMILY.get(name)


def _listed() -> list[type[Allocator]]:
    return _FAMILY.listed()


def names() -> tuple[str, ...]:
    """Every registered allocator's name, by ``order`` (glibc, glibc-tuned, tcmalloc, jemalloc, then others)."""
    return _FAMILY.names()


def searched_names() -> tuple[str, ...]:
    """The allocators a search tries where they are available (``searched``)."""
    return tuple(cls.name for cls in _listed() if cls.searched)


def availability() -> dict[str, str | None]:
    """Each allocator -> None when usable on this machine, else why not (with the fix)."""
    return {cls.name: cls.unavailable() for cls in _listed()}


def resolve(name: str) -> tuple[type[Allocator], str | None]:
    """The allocator that is really used here for ``name`` (its ``stand_in``, and theirs, where it is not
    available; the plain one in the end), and a note when it is not ``name``'s own."""
    cls = get(name)
    reason = cls.unavailable()
    if reason is None:
        return cls, None
    chosen = cls
    for _ in _FAMILY.registered:  # a chain of stand-ins visits each class once at most
        chosen = get(chosen.stand_in)
        if chosen.name == DEFAULT or chosen.unavailable() is None:
            break
    else:
        chosen = get(DEFAULT)
    return chosen, f"{name} {reason}; using {chosen.name} instead"


def active() -> str:
    """The preloaded allocator loaded into this process (from /proc/self/maps), else the plain one: a
    mallopt leaves no trace to read back, and where that file does not exist nothing is known to be."""
    mapped = _alloc.mapped_paths()
    for cls in _listed():
        if issubclass(cls, Preloaded) and cls.loaded(mapped):
            return cls.name
    return DEFAULT


for _builtin in (Glibc, GlibcTuned, Tcmalloc, Jemalloc):
    register(_builtin)

__all__ = ["DEFAULT", "Allocator", "Mallopt", "Preloaded", "active", "availability", "get", "names", "register",
           "resolve", "searched_names", "unregister"]
