"""What a loader reads: the user's dataset, or a cache of it, with the per-sample ``transform`` after it.

``prepare_source`` is the one road to it, for the factory and for a trial alike: the trial differs
only in its ``CacheSite`` (its own folder, its subset) and the ``Timer`` it passes, so it cannot
measure a path the factory does not take.

A memory cache (built, or filled during the first epoch) is read a whole batch at a time when the
caller collates with PyTorch's default and has no transform (``caches._gather``); everything else is
read sample by sample through ``Transformed``, so ``transform`` runs after the cache, every epoch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from torch.utils.data import Dataset

from autotune.caches import (
    FirstEpochCache,
    GatherDataset,
    GatheringFill,
    GatheringPartial,
    PartialCache,
    RandomSamples,
    build_partial,
    can_gather,
    collate_gathered,
    dataset_key,
    get_backend,
    last_line,
    open_or_build,
    open_or_fill,
    takes,
)
from autotune.config import LoaderConfig, partial_count
from autotune.dataset import check_deterministic
from autotune.errors import AutotuneError
from autotune.loader._dataloader import Transformed, with_transform
from autotune.machine import WARMED_BATCHES, build_workers, warm_heap

Collate = Callable[..., Any] | None
log = logging.getLogger("autotune")
_T = TypeVar("_T")


def cached_source(cache: Any, transform: Callable[..., Any] | None,
                  collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a built ``cache`` (or a disk fill), and the collate function to pass."""
    if can_gather(cache, collate_fn, transform):
        return GatherDataset(cache), collate_gathered
    return Transformed(cache, transform), collate_fn


def filling_source(cache: FirstEpochCache, transform: Callable[..., Any] | None,
                   collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a memory cache the first epoch fills, and the collate function."""
    if transform is None and collate_fn is None and not cache.schema.has_blob_leaves:
        return GatheringFill(cache), collate_gathered
    return Transformed(cache, transform), collate_fn


def partial_source(cache: PartialCache, transform: Callable[..., Any] | None,
                   collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a partial memory cache, and the collate function to pass with it."""
    if transform is None and collate_fn is None:
        return GatheringPartial(cache), collate_gathered
    return Transformed(cache, transform), collate_fn


def reading(source: Any, transform: Callable[..., Any] | None, collate_fn: Collate) -> tuple[Dataset[Any], Collate]:
    """The dataset a loader reads from a cache or a fill, and the collate function to pass with it."""
    if isinstance(source, PartialCache):
        return partial_source(source, transform, collate_fn)
    if isinstance(source, FirstEpochCache):
        return filling_source(source, transform, collate_fn)
    return cached_source(source, transform, collate_fn)  # a disk fill reads as a disk cache does


# ---------------------------------------------------------------------------- the one road to a cache

Timer = Callable[[str, float], None]
"""Told each step's seconds as the road runs it: ``"check"`` (is ``dataset[i]`` deterministic),
``"key"`` (a disk cache's content key), ``"cache"`` (opening, building or setting up the fill) and
``"warm"`` (the part of a memory build spent making the batches' heap resident, ``_heap_for``)."""


class CacheSite(Protocol):
    """Where a source's cache is kept, and of which samples: the user's cache folder and the whole
    dataset for the factory (``FactorySite``), a trial's own folder and its subset for the search.
    The road decides what is done; the site only says where."""

    indices: Sequence[int] | None  # the samples a loader without a cache reads (None: all, in order)

    def before(self, step: str, config: LoaderConfig, dataset: Any) -> None:
        """Called before the cache step (``"build"``, ``"fill"``, ``"partial"`` built before the first epoch
        or ``"partial_fill"`` filled by it) of ``config``'s cache, outside its timing: a trial makes its folder
        here, and measures a build's start-up on a few samples."""

    def build(self, backend: str, dataset: Any, key: dict[str, Any],
              meanwhile: Callable[[list[int]], None] | None = None) -> Any:
        """The ``backend`` cache of the site's samples, opened or built; ``key`` is its content key
        (empty for memory); ``meanwhile`` goes to a memory build (``caches.open_or_build``)."""

    def fill(self, backend: str, dataset: Any, key: dict[str, Any]) -> Any:
        """A cache the first epoch fills (a memory ``FirstEpochCache``, a disk fill) or, on disk, one
        already there."""

    def partial(self, dataset: Any, share: float, fill: str) -> PartialCache:
        """A memory cache of the first ``share`` of the samples, the rest read from the source."""

    def shard(self, dataset: Any) -> Any:
        """What this process reads of the cache's dataset (a rank's shard; the whole by default)."""


@dataclass
class Prepared:
    """What a loader reads and passes: the dataset, the collate function, the cache behind them."""

    dataset: Any
    collate_fn: Collate
    cache: Any = None  # the cache or fill read (None: the dataset itself)
    random: bool = False  # a cache was asked for but dataset[i] is random: none is used
    why: str = ""  # what showed it random (one line naming the index and ``transform``)


def _timed(timer: Timer | None, step: str, fn: Callable[[], _T]) -> _T:
    start = time.perf_counter()
    try:
        return fn()
    finally:
        if timer is not None:
            timer(step, time.perf_counter() - start)


def prepare_source(dataset: Any, config: LoaderConfig, site: CacheSite, *, transform: Callable[..., Any] | None,
                   collate_fn: Collate, stream: bool = False, timer: Timer | None = None,
                   kept_batch: int | None = None) -> Prepared:
    """The source a loader of ``config`` reads, prepared the one way both the factory and a trial do:
    the determinism check (a random ``dataset[i]`` gets no cache), a disk cache's key, the cache opened,
    built or set up to be filled (``config.cache_fill``, ``cache_share``), then read through the gather
    path or ``Transformed`` with ``transform`` after it. ``timer`` is told each step's seconds.

    ``kept_batch``: the batch size, where this process's allocator keeps what it frees
    (``process.Allocator.keeps_freed``); then a memory cache built by workers for a loader without
    workers has the heap of the batches it will gather made resident while the workers decode
    (``machine.warm_heap``), so epoch 1 does not fault it in (``_heap_for``)."""
    if stream:
        return Prepared(with_transform(dataset, transform, stream=True), collate_fn)
    if config.cache is None:
        return Prepared(_uncached(dataset, transform, site), collate_fn)
    deterministic, why = _timed(timer, "check", lambda: check_deterministic(dataset))
    if not deterministic:
        return Prepared(_uncached(dataset, transform, site), collate_fn, random=True, why=why)
    gathered = transform is None and collate_fn is None  # else batches are default_collate's, of other sizes
    try:
        cache = _cache(dataset, config, site, timer, _heap_for(config, kept_batch if gathered else None, timer))
    except RandomSamples as exc:  # found by the build, which stored nothing: the source, never a traceback
        return Prepared(_uncached(dataset, transform, site), collate_fn, random=True, why=last_line(exc))
    if cache is None:  # it could not be written (a full disk): the source, as without a cache
        return Prepared(_uncached(dataset, transform, site), collate_fn)
    data, collate = reading(cache, transform, collate_fn)
    return Prepared(site.shard(data), collate, cache)


def _heap_for(config: LoaderConfig, kept_batch: int | None,
              timer: Timer | None = None) -> Callable[[list[int]], None] | None:
    """What a memory build's idle process does for a loader of ``config``: with no workers, every batch is
    gathered in this process, and the two alive at once (the one the loop holds, the next) are new memory
    in epoch 1 only where nothing freed them before; None where the loader's workers gather (each its
    own), where the allocator returns freed memory (nothing would stay warm), or without a batch size.
    Its seconds go to ``timer`` as ``"warm"``: inside the build's, and not a cost per sample."""
    if not kept_batch or kept_batch < 1 or config.num_workers or config.cache is None:
        return None
    if not get_backend(config.cache).in_memory:
        return None

    def warm(row_bytes: list[int]) -> None:
        try:
            seconds = warm_heap([kept_batch * b for b in row_bytes], copies=WARMED_BATCHES)
        except Exception as exc:  # noqa: BLE001 - a warm that cannot be had (MemoryError) leaves epoch 1 to take it
            log.debug("autotune: the batches' heap was not made resident during the build: %s", exc)
            return
        if timer is not None:
            timer("warm", seconds)
        log.debug("autotune: the heap of two batches made resident during the build's decode (%.3f s)", seconds)

    return warm


def _cache(dataset: Any, config: LoaderConfig, site: CacheSite, timer: Timer | None,
           meanwhile: Callable[[list[int]], None] | None = None) -> Any:
    backend = config.cache
    assert backend is not None
    key = {} if get_backend(backend).in_memory else _timed(timer, "key", lambda: dataset_key(dataset))
    if config.cache_share is not None:
        share, fill = config.cache_share, config.cache_fill
        site.before("partial" if fill == "build" else "partial_fill", config, dataset)
        cache = _timed(timer, "cache", lambda: site.partial(dataset, share, fill))
    elif config.cache_fill == "first_epoch":
        site.before("fill", config, dataset)
        cache = _timed(timer, "cache", lambda: site.fill(backend, dataset, key))
    else:
        site.before("build", config, dataset)
        extra = {"meanwhile": meanwhile} if meanwhile is not None and takes(site.build, "meanwhile") else {}
        cache = _timed(timer, "cache", lambda: site.build(backend, dataset, key, **extra))
    return cache


class CacheBuildFailed(UserWarning):
    """A cache could not be written (a full disk): the loader reads the source instead."""


def _outside_autotune() -> int:
    """The stacklevel of the first caller outside this package, so a warning names the user's line."""
    frame, level = sys._getframe(1), 1
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def _unraisables() -> Iterator[list[str]]:
    """Collect, for the block, what would print as "Exception ignored in ..." (sys.unraisablehook), as lines:
    keeping the exceptions would keep the dying objects they name alive."""
    seen: list[str] = []
    before = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.exc_value is not None:
            seen.append(_first_line(unraisable.exc_value))

    sys.unraisablehook = hook
    try:
        yield seen
    finally:
        sys.unraisablehook = before


def _uncached(dataset: Any, transform: Callable[..., Any] | None, site: CacheSite) -> Any:
    if site.indices is None:
        return with_transform(dataset, transform)
    return Transformed(dataset, transform, list(site.indices))


class FactorySite:
    """The factory's: the user's cache folder (``cache_dir``, else the per-user default), the whole dataset."""

    indices: Sequence[int] | None = None

    def __init__(self, root: str | os.PathLike[str] | None = None, *, progress: bool = True,
                 workers: int | None = None):
        self.root = None if root is None else os.fspath(root)
        self.progress = progress
        self._workers = workers

    @property
    def workers(self) -> int:
        """The processes a build decodes on (default: what this process may use, ``machine.build_workers``)."""
        return build_workers() if self._workers is None else self._workers

    def before(self, step: str, config: LoaderConfig, dataset: Any) -> None:
        pass

    def build(self, backend: str, dataset: Any, key: dict[str, Any],
              meanwhile: Callable[[list[int]], None] | None = None) -> Any:
        """The cache opened or built; None, with one warning, when it cannot be written (a full disk: an
        OSError, lmdb.Error or an h5py error): training reads the source instead, as a fill does. The
        library's own complaints while the failed build is torn down (h5py's "Exception ignored" lines from
        its destructors) are part of that one warning, not printed beside it."""
        problem = ""
        with _unraisables() as ignored:
            try:
                return open_or_build(backend, dataset, root=self.root, manifest=key, progress=self.progress,
                                     workers=self.workers, meanwhile=meanwhile)
            except AutotuneError:  # the dataset's own failure (DatasetError), random samples, or a refusal: an
                raise  # untrusted or foreign folder is said, never read past (README "Cache identity and trust")
            except Exception as exc:  # noqa: BLE001 - a backend's write error comes in its library's types
                problem = _first_line(exc)
        if ignored and "No space left" not in problem:
            problem += f" ({ignored[0]})"
        where = self.root or "the per-user cache folder"
        warnings.warn(f"autotune: the {backend} cache could not be built in {where}: {problem}; this loader "
                      "reads the source instead (free some disk, or pass cache_dir= a folder with room)",
                      CacheBuildFailed, stacklevel=_outside_autotune())
        return None

    def fill(self, backend: str, dataset: Any, key: dict[str, Any]) -> Any:
        if get_backend(backend).in_memory:
            return FirstEpochCache(dataset)
        return open_or_fill(backend, dataset, root=self.root, manifest=key)

    def partial(self, dataset: Any, share: float, fill: str) -> PartialCache:
        return build_partial(dataset, partial_count(share, len(dataset)), fill=fill, progress=self.progress,
                             workers=self.workers)

    def shard(self, dataset: Any) -> Any:
        return dataset
