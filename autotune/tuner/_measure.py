"""Measure one candidate, inside the trial's own process: real DataLoader, real workers, real consumer.

Only measures. Timing runs are kept free of memory sampling: memory is read once at the end of each
epoch, with the clock stopped, while the workers are still alive.
"""

from __future__ import annotations

import gc
import os
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Subset

from autotune import caches
from autotune.caches import TRIAL_LOCK, DiskFill, FirstEpochCache, PartialCache, build_partial
from autotune.caches._lock import BuildLock
from autotune.caches._trust import check_trusted
from autotune.config import LoaderConfig, partial_count
from autotune.loader import DeviceConsumer, make_loader, prepare_source
from autotune.machine import EvictionReport, TreeMemory, evict, tree_memory
from autotune.process import apply_at_runtime
from autotune.tuner._measurement import Measurement
from autotune.tuner._predict import HEAD, EpochTiming, predict, scale_build


@dataclass
class Workload:
    """What the user trains with: everything a trial needs, picklable into the trial process."""

    dataset: Any
    batch_size: int
    epochs: int
    collate_fn: Callable[..., Any] | None = None
    transform: Callable[..., Any] | None = None
    train_step: Callable[..., Any] | None = None
    fingerprint: str = ""


@dataclass
class Plan:
    """How a trial measures: on which indices, how many epochs, with what safety limits."""

    indices: list[int]
    length: int
    seed: int = 0
    epochs_measured: int = 2
    batch_timeout: float = 120.0
    cache_root: str | None = None
    build_workers: int = 0  # processes decoding in parallel while a cache is built
    # Source files evicted from the page cache before the first epoch (and every epoch when the data
    # cannot stay cached), so the first epoch is measured cold, as the user's first epoch will be.
    files: tuple[str, ...] = ()
    cold_every_epoch: bool = False
    sample_memory: bool = True
    # The trial was forked from a process that holds the pages it shares (the search's forkserver, or the search
    # itself): its memory is what it adds beyond them (``machine.tree_memory``), as the plan counts it.
    forked: bool = False
    # A stream (IterableDataset): each epoch reads its first len(indices) samples, in whole batches, in the
    # stream's own order (no shuffle, no sampler, no cache); ``indices`` only counts them.
    stream: bool = False
    # With several ranks per node: the subset a cache holds and the dataset length it stands for, every
    # rank's shard together, since the factory caches the whole dataset (once per node on disk, once per
    # rank in memory) and each rank reads its shard of it. None: this plan's own indices and length.
    cache_indices: list[int] | None = None
    cache_length: int | None = None

    def cached(self) -> tuple[list[int], int]:
        """The indices a cache built by this trial holds, and the length its build is scaled to."""
        if self.cache_indices is None:
            return self.indices, self.length
        return self.cache_indices, self.cache_length or self.length

    @property
    def shares_cache(self) -> bool:
        """Whether the ranks of one candidate share a disk cache (built once, in one folder)."""
        return self.cache_indices is not None

    def stream_batches(self, batch_size: int) -> int | None:
        """The batches an epoch of a stream is measured over (None for a map-style dataset)."""
        return max(1, len(self.indices) // batch_size) if self.stream else None


# Progress of a running trial: (step, predicted total seconds so far), so a pruner can stop it early.
Report = Callable[[int, float], None]


def _consumer(workload: Workload, config: LoaderConfig) -> Callable[[Any], Any]:
    return workload.train_step if workload.train_step is not None else DeviceConsumer(config.pin_memory)


class TrialSite:
    """A trial's ``CacheSite``: its own folder (``plan.cache_root``, which the runner removes afterwards,
    even when it kills the trial) and its subset, every rank's samples when the ranks share a cache. A
    build on a subset measures its start-up first, on a few samples, outside the build's timing.

    A partial cache built before the first epoch holds ~share x subset samples in the trial, often fewer
    than its start-up build: its cost is measured outside the cache step on builds of the run's kind, a
    head (start-up) and a probe of ``_BUILD_PROBE`` samples (per sample), and scaled to the samples the
    run's build stores (``build_stores``), not to the dataset's length (``build_cost``)."""

    def __init__(self, workload: Workload, plan: Plan):
        self.workload, self.plan = workload, plan
        self.indices: Sequence[int] | None = plan.indices
        self.build_head: tuple[float, int] | None = None  # (seconds, samples) of the start-up build
        self.build_probe: tuple[float, int] | None = None  # a partial's: (seconds, samples) of a probe build
        self.build_stores: int | None = None  # a partial's: the samples the run's build stores
        self.trial_stores: int | None = None  # a partial's: the samples the trial's build stored
        self._root: str | None = None
        self._order: list[int] | None = None  # the indices the cache holds, position by position

    def root(self) -> str:
        if self._root is None:
            self._root = self.plan.cache_root or tempfile.mkdtemp(prefix="autotune-trial-")
            _hold_trial_folder(self._root)
        return self._root

    def before(self, step: str, config: LoaderConfig, dataset: Any) -> None:
        backend = config.cache
        assert backend is not None
        if step == "partial":
            assert config.cache_share is not None
            self._probe_partial(dataset, partial_count(config.cache_share, self.plan.cached()[1]))
            return
        if step == "partial_fill" or (step == "fill" and caches.get_backend(backend).in_memory):
            return  # held in this process's memory: no folder
        self.root()
        indices, length = self.plan.cached()
        if step == "build" and len(indices) < length and len(indices) > 4 * _BUILD_HEAD:
            # A build of a few samples first: its start-up is paid once by the whole build (tuner/_predict.py).
            start = time.perf_counter()
            self._build(backend, dataset, indices[:_BUILD_HEAD], "head")
            self.build_head = (time.perf_counter() - start, _BUILD_HEAD)
            _evict(self.plan)  # the head's files are warm now; the build is measured cold, as the factory's is

    def _probe_partial(self, dataset: Any, stores: int) -> None:
        """A partial's start-up (a build of ``_BUILD_HEAD`` samples) and per-sample cost (one of
        ``_BUILD_PROBE``), each on cold files as the run's build reads them, built as the run's partial is
        (``build_partial``) and dropped before the trial's own. A probe never holds more samples than the run's
        build ``stores``, which is what the memory plan counts for the cache: a run that stores no more than a
        probe is built once, whole, as its own probe (its time is the prediction, unscaled). A subset too small
        for that: none (the trial's own build is scaled whole)."""
        indices = sorted(self.plan.cached()[0])
        counts = (_BUILD_HEAD, _BUILD_PROBE) if stores > _BUILD_PROBE else (stores,)
        if len(indices) < counts[-1]:
            return
        timed: list[tuple[float, int]] = []
        for count in counts:
            _evict(self.plan)
            start = time.perf_counter()
            built = build_partial(dataset, count, fill="build", indices=indices[:count], progress=False,
                                  workers=self.plan.build_workers)
            timed.append((time.perf_counter() - start, count))
            del built
        _evict(self.plan)  # the probes' files are warm now; the trial's build is measured cold, as the run's is
        self.build_head, self.build_probe = (timed[0], timed[1]) if len(timed) == 2 else (None, timed[0])

    def build(self, backend: str, dataset: Any, key: dict[str, Any],
              meanwhile: Callable[[list[int]], None] | None = None) -> Any:
        indices, _ = self.plan.cached()
        self._order = list(indices)
        return self._build(backend, dataset, indices, "", meanwhile)

    def _build(self, backend: str, dataset: Any, indices: list[int], part: str,
               meanwhile: Callable[[list[int]], None] | None = None) -> Any:
        """A ``backend`` cache of ``indices`` under the trial's folder.

        Several ranks of one candidate share the folder: a disk cache goes through ``open_or_build`` and its
        build lock, as the factory's does, so one rank builds it and the others wait for it and open it
        (the wait is part of their run, as in a torchrun job); a memory cache is built by every rank, each
        holding its own copy, as each rank's factory does. Alone, the trial builds into its own folder."""
        root, plan, fingerprint = self.root(), self.plan, self.workload.fingerprint
        name = f"{backend}-{part}" if part else backend
        if plan.shares_cache and not caches.get_backend(backend).in_memory:
            manifest = {"key": f"trial-{part}" if part else "trial", "dataset": fingerprint, "trial": True}
            return caches.open_or_build(backend, dataset, root=root, manifest=manifest, indices=indices,
                                        progress=False, workers=plan.build_workers)
        cls = caches.get_backend(backend)
        extra = {"meanwhile": meanwhile} if meanwhile is not None and caches.takes(cls.build, "meanwhile") else {}
        return cls.build(dataset, indices, os.path.join(root, name), manifest={"dataset": fingerprint, "trial": True},
                         progress=False, workers=plan.build_workers, **extra)

    def fill(self, backend: str, dataset: Any, key: dict[str, Any]) -> Any:
        plan = self.plan
        if caches.get_backend(backend).in_memory:
            return FirstEpochCache(dataset, plan.indices)  # filled by the first epoch itself
        # a disk cache: one rank only (build_space)
        expected = caches.expected_manifest({"dataset": self.workload.fingerprint, "trial": True}, plan.indices)
        return DiskFill(backend, dataset, os.path.join(self.root(), f"{backend}-fill"), expected, plan.indices)

    def partial(self, dataset: Any, share: float, fill: str) -> PartialCache:
        """The whole run caches the first ``partial_count`` indices of the dataset, so the trial caches the
        subset's samples among them (a seeded subset: about the same share of its reads hit) and reads the
        others from the source, as the run does. Sorted, the subset's cached indices come first, as the
        run's do; the loader shuffles positions anyway."""
        indices, length = self.plan.cached()
        self._order = sorted(indices)
        first = partial_count(share, length)
        count = sum(1 for i in self._order if i < first)
        self.build_stores, self.trial_stores = first, max(1, min(count, len(self._order)))  # as build_partial stores
        return build_partial(dataset, count, fill=fill, indices=self._order, progress=False,
                             workers=self.plan.build_workers)

    def shard(self, dataset: Any) -> Any:
        """A cache of every rank's samples: this rank reads its shard of it."""
        if self.plan.cache_indices is None or self._order is None:
            return dataset
        position = {index: k for k, index in enumerate(self._order)}
        return Subset(dataset, [position[i] for i in self.plan.indices])


_BUILD_HEAD = 16  # samples in the build that measures a build's start-up
_BUILD_PROBE = 4 * _BUILD_HEAD  # samples in a partial's build that measures its per-sample cost


@dataclass(frozen=True)
class BuildCost:
    """What the cache step cost, for ``predict``: ``fixed`` seconds paid once whatever the length, and a build
    of ``samples`` in ``seconds`` (``head``: its start-up build) that the run's build of ``stores`` samples
    scales from. The invariant: a build's prediction is its start-up once plus its per-sample cost times the
    samples the run's build stores (``_predict.scale_build``)."""

    fixed: float
    seconds: float
    samples: int
    stores: int
    head: tuple[float, int] | None = None

    @property
    def predicted(self) -> float:
        return self.fixed + scale_build(self.seconds, self.samples, self.stores, self.head)


def build_cost(config: LoaderConfig, plan: Plan, site: TrialSite, steps: dict[str, float]) -> BuildCost:
    """The cache step's cost, by path: a fill (memory, disk, or a partial filled by the first epoch) stores
    nothing in it but sets up (its schema head, its folder): fixed, once. A partial built before the first
    epoch: its probe (or, on a small subset, the trial's own build of ``trial_stores``) scaled to the
    ``partial_count`` samples the run stores. A full build: the subset's, every rank's when they share it,
    scaled to the length it stands for, its start-up measured on a head. ``check``, ``key`` and ``warm`` are fixed."""
    # the warm (``loader._source._heap_for``) runs inside the cache step, once, whatever the length
    fixed = steps.get("check", 0.0) + steps.get("key", 0.0) + steps.get("warm", 0.0)
    cache = max(steps.get("cache", 0.0) - steps.get("warm", 0.0), 0.0)
    indices, length = plan.cached()
    if not config.cache or plan.stream:
        return BuildCost(fixed, 0.0, len(indices), length)
    if config.cache_fill == "first_epoch":
        return BuildCost(fixed + cache, 0.0, len(indices), length)
    if config.cache_share is not None and site.build_stores is not None and site.trial_stores is not None:
        if site.build_probe is not None:
            seconds, samples = site.build_probe
            return BuildCost(fixed, seconds, samples, site.build_stores, site.build_head)
        return BuildCost(fixed, cache, site.trial_stores, site.build_stores)
    return BuildCost(fixed, cache, len(indices), length, site.build_head)


_held: dict[str, Any] = {}  # trial folder -> its lock, held for the life of the trial's process


def _hold_trial_folder(root: str) -> None:
    """The same trust rules as the user's caches (``caches._trust``): the trial's folder and the one
    holding it belong to this user and nobody else can write them, else UntrustedCache. The trial
    holds ``.trial.lock`` there while it lives, so `autotune cache clear` leaves a running trial's
    cache alone and removes a dead one's."""

    check_trusted(root, "Trial cache folder")
    parent = os.path.dirname(os.path.abspath(root))
    if os.path.basename(parent) == "trials":  # the search's <workdir>/cache/trials
        st = os.stat(parent)
        if st.st_uid == os.geteuid() and st.st_mode & 0o022:
            os.chmod(parent, stat.S_IMODE(st.st_mode) & ~0o022)  # autotune's own folder, made under a loose umask
        check_trusted(parent, "Trial cache folder", follow=True)
    if root not in _held:
        lock = BuildLock(os.path.join(root, TRIAL_LOCK))
        if lock.try_acquire():
            _held[root] = lock


class TrialStopped(Exception):
    """The search asked this trial to stop (pruned): unwind normally so the workers shut down cleanly."""


def _evict(plan: Plan) -> EvictionReport | None:
    if not plan.files:
        return None

    return evict(plan.files)


def timed_epoch(loader: Any, consume: Callable[..., Any], *, sample_memory: bool = False, forked: bool = False,
                on_batch: Callable[[int, float, float], None] | None = None,
                should_stop: Callable[[], bool] | None = None,
                batches: int | None = None) -> tuple[EpochTiming, TreeMemory]:
    """Time one epoch under the consumer; returns its timing and the memory read at its end (zeros when not
    sampled; ``forked``: this process was forked from its parent, whose pages it shares are not its own).
    ``on_batch(count, elapsed, first_batch)`` sees progress; ``should_stop`` can end it early.
    ``batches`` bounds a stream's epoch: the iterator is then dropped after that many (a stream may be
    endless), not drained."""
    expected = len(loader) if batches is None else batches
    start = time.perf_counter()
    iterator = iter(loader)
    first = None
    head = None
    count = 0
    memory = TreeMemory(0, 0)
    for batch in iterator:
        consume(batch)
        count += 1
        now = time.perf_counter()
        if first is None:
            first = now - start
        if count == HEAD:
            head = now - start
        if on_batch is not None:
            on_batch(count, now - start, first)
        if should_stop is not None and should_stop():
            raise TrialStopped
        if count == expected:
            elapsed = now - start
            if sample_memory:
                memory = tree_memory(forked_from=os.getppid() if forked else None)  # clock stopped; workers alive
            if batches is None:
                for _ in iterator:  # let the iterator finish its own shutdown, outside the clock
                    pass
            break
    else:
        elapsed = time.perf_counter() - start
    del iterator
    return EpochTiming(seconds=elapsed, first_batch=first or elapsed, batches=max(count, 1), head_seconds=head), memory


def whole_run_peak(peak: int, cache_bytes: int, samples: int, length: int) -> int:
    """The peak memory of the whole run from the subset's: a memory cache holds ``length`` samples, not the
    subset's ``samples``, and the rest (workers, prefetched batches, the interpreter) does not grow with
    the length. Reporting the subset's peak said 342 MiB for a run that holds a 1.15 GiB cache."""
    if not peak or not cache_bytes or samples <= 0 or length <= samples:
        return peak
    return peak + round(cache_bytes * (length - samples) / samples)


def measure(workload: Workload, config: LoaderConfig, plan: Plan, report: Report | None = None,
            should_stop: Callable[[], bool] | None = None) -> Measurement:
    """Run ``plan.epochs_measured`` epochs of ``config`` over the plan's indices; return the figures.

    Process settings (allocator, thread counts) are applied to this process: call it in a fresh one.
    """
    applied = apply_at_runtime(config.process_settings())
    evictions = [_evict(plan)]  # before the cache build too: it reads the source files
    # The factory's road (``loader.prepare_source``), on the trial's site: the steps it runs whatever the
    # length (the determinism check, a disk cache's key) are fixed; the cache step is the subset's build.
    steps: dict[str, float] = {}

    def timer(step: str, seconds: float) -> None:
        steps[step] = steps.get(step, 0.0) + seconds

    site = TrialSite(workload, plan)
    source = prepare_source(workload.dataset, config, site, transform=workload.transform,
                            collate_fn=workload.collate_fn, stream=plan.stream, timer=timer,
                            kept_batch=workload.batch_size if applied.keeps_freed else None)  # as the factory
    dataset, collate_fn = source.dataset, source.collate_fn
    cost = build_cost(config, plan, site, steps)
    fixed = cost.fixed
    memory_bytes = source.cache.nbytes if source.cache is not None and config.cache_in_memory else 0
    generator = torch.Generator().manual_seed(plan.seed)
    order: dict[str, Any] = {} if plan.stream else {"shuffle": True}  # a stream keeps its own order
    loader = make_loader(
        dataset, config, batch_size=workload.batch_size, generator=generator, collate_fn=collate_fn,
        timeout=plan.batch_timeout if config.num_workers else 0, **order,
    )
    consume = _consumer(workload, config)
    n = len(plan.indices)
    full_batches = -(-plan.length // workload.batch_size)
    timings: list[EpochTiming] = []
    peak = added = 0

    bound = plan.stream_batches(workload.batch_size)
    batches = len(loader) if bound is None else bound
    cached_indices, build_length = plan.cached()  # what a cache covered and stands for (its memory's scaling)
    build_samples = len(cached_indices)
    build_full = cost.predicted
    restarts = 1 if config.persistent_workers else workload.epochs  # worker start-up paid per epoch
    # A fill's first epoch decodes and writes the cache, the later ones read it: extrapolated to every
    # epoch it would be far too high and prune the candidate, so the running figure counts it once (a
    # lower bound, as step 0's is). Without a fill, the first epoch stands for all of them.
    epochs_like_the_first = 1 if config.cache and config.cache_fill == "first_epoch" else workload.epochs

    def progress(epoch: int) -> Callable[[int, float, float], None]:
        """Report the figure so far: step 0 a lower bound from the first batch, then running estimates."""
        checkpoints = {max(HEAD + 2, batches // 3): 1, batches: 2} if epoch == 0 else {}
        head = [0.0]

        def on_batch(count: int, elapsed: float, first: float) -> None:
            if report is None or epoch:
                return
            if count == 1:
                report(0, build_full + first * restarts)
            if count == HEAD:
                head[0] = elapsed
            elif count in checkpoints and count > HEAD:
                per_batch = (elapsed - head[0]) / (count - HEAD)
                epoch_s = head[0] + per_batch * (full_batches - HEAD)
                report(checkpoints[count], build_full + epoch_s * epochs_like_the_first)

        return on_batch

    for epoch in range(plan.epochs_measured):
        if epoch and plan.cold_every_epoch:
            evictions.append(_evict(plan))
        timing, memory = timed_epoch(loader, consume, sample_memory=plan.sample_memory, forked=plan.forked,
                                     on_batch=progress(epoch),
                                     should_stop=should_stop, batches=bound)
        timings.append(timing)
        peak, added = max(peak, memory.pss), max(added, memory.added)
    del loader
    gc.collect()
    if isinstance(source.cache, DiskFill):
        # Its commit runs beside the later epochs; what is left of it when they end, the run waits for at
        # exit (``_disk_fill``): a cost of the data, so it scales with the length as a build does.
        start = time.perf_counter()
        source.cache.close()
        fixed += (time.perf_counter() - start) * plan.length / len(plan.indices)
    peak = whole_run_peak(peak, memory_bytes, build_samples, build_length)
    added = whole_run_peak(added, memory_bytes, build_samples, build_length)
    first, warm = timings[0], timings[-1]
    length = plan.length
    if bound is not None and first.batches < bound:  # the stream ended before the bound: read whole
        n = length = min(n, first.batches * workload.batch_size)
    prediction = predict(first=first, warm=warm, build_seconds=cost.seconds, measured_samples=n,
                         length=length, batch_size=workload.batch_size, epochs=workload.epochs,
                         build_fixed_seconds=fixed, build_head=cost.head,
                         build_samples=cost.samples, build_length=cost.stores)
    # its origin: built in this process, or waited for (opened from) another rank's build; a memory fill has none
    origin = getattr(source.cache, "origin", None)
    builder = (getattr(source.cache, "manifest", None) or {}).get("builder", {}).get("id")
    return Measurement(prediction=prediction, epochs=tuple(timings), measured_samples=n, peak_memory_bytes=peak,
                       added_memory_bytes=added,
                       build_seconds_subset=steps.get("cache", 0.0), eviction=evictions[0],
                       process_applied=tuple(applied.applied), process_not_applied=tuple(applied.not_applied),
                       cache_origins=(origin,) if origin is not None else (),
                       cache_builders=(builder,) if builder else ())
