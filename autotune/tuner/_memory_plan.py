"""What a trial costs in memory, planned against the job's budget before the trial starts.

The invariant: **the search never exceeds the job's memory by its own planning**, and so **a trial the plan admits
stays under the budget the guard enforces**, for every backend x allocator x start method: the plan counts every
process of the trial's tree that the guard reads (``machine.tree_memory``), at that process's peak as its
allocator keeps it. The budget is 70% of
what the job had left once the search and its trial forkserver were resident (``machine._memory``); every
candidate's processes are counted against it before any is started, from figures the running search
measured, and what cannot fit is not tried, with a note, instead of being left to the kernel's OOM killer
(which ends a trial, never the search: ``machine._oom``). A trial holds:

- no interpreter when it is forked from the forkserver: the server's pages are resident before the budget is
  read and the trial shares them, so they are not what it adds (and the runner's guard and the trial's own
  figure count the same: ``machine.tree_memory`` takes the shared pages off the tree's PSS); a trial spawned
  for a preloaded allocator is a fresh interpreter, and holds one whole: its figures (its own process, its
  tracker, what a child forked from it adds) are measured from a probe spawned the same way, under the same
  preload, the first time such a trial is planned (``TrialMemory.started``, ``tuner._runner.spawn_charges``:
  ~6 s of a loaded 2-CPU VM, once per allocator and search), and every figure below is then that trial's;
- its own resource tracker (``tracker``: an exec'd interpreter without torch, which the guard counts whole; measured
  with the heap, 6 MiB here);
- ``heap``: what a process forked from a resident interpreter writes of the pages it shares once it has run
  (measured at the search's start: a probe forked from the forkserver runs a full collection, which writes
  every object's header, and ``tree_memory`` reads what it adds; ``tuner._runner.fork_charges``); then the
  dataset as it unpickles it and ``BATCHES_IN_MAIN`` batches (the one being consumed and the one collated or
  received; ``KEPT_BATCHES_IN_MAIN`` without workers under an allocator that keeps what it frees, which holds the
  main process's peak: ``Allocator.keeps_freed``);
- per DataLoader worker, its prefetched batches (``prefetch_factor`` of them, in shared memory the job is
  charged for) and ``heap`` (a forked worker is such a process); a spawned or forkserver worker is a fresh interpreter
  holding its own copy of the dataset, and forkserver workers add their server's interpreter once;
- a memory cache of the whole run (its share of it), as the recipe will hold it;
- while a cache is built before the first epoch (``cache_fill="build"``), the build's own processes instead of
  the loader's workers, which start after it: ``build_workers`` workers (forked for a memory build; for a disk
  build of ``build_context``, the search's start method: a fresh interpreter and the dataset each under spawn or a
  forkserver), each ``heap`` and the samples it has in flight (a disk build's worker decodes
  ``caches.READ_CHUNK`` samples at a time and the loader prefetches two such chunks of it, while the main
  process unpickles one and writes one; a memory build's worker writes each sample straight into the cache's
  columns, while the main process, for a loader without workers under an allocator that keeps what it frees,
  makes ``WARMED_BATCHES`` batches of heap resident (``machine._warm_heap``); under such an allocator, a disk
  build's processes keep freed chunks too:
  ``KEPT_CHUNKS_IN_MAIN`` and ``KEPT_CHUNKS_IN_WORKER``), and beside a disk build's chunks what its backend's
  writer holds in the main process (``DiskCache.build_held``: lmdb's transaction, 2 x 64 MiB at most); the
  trial's peak is the larger of the two phases;
- all of it once per rank.

``fit_space`` narrows the space to what fits (workers, start methods) with a note for
each cut, and refuses a job where not even the smallest trial fits (exit 2, naming the limit, what was
available and the fix); ``TrialMemory.over_budget`` is asked before each trial for the combinations left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from autotune._units import format_bytes
from autotune.caches import READ_CHUNK, estimate_need
from autotune.config import DEFAULT, LoaderConfig, cache_backend, partial_count
from autotune.errors import AutotuneError
from autotune.machine import BUDGET_SHARE, WARMED_BATCHES
from autotune.process import get_allocator
from autotune.tuner._space import Space

if TYPE_CHECKING:
    from autotune.tuner._runner import ForkCharges

__all__ = ["BATCHES_IN_MAIN", "KEPT_BATCHES_IN_MAIN", "KEPT_CHUNKS_IN_MAIN", "KEPT_CHUNKS_IN_WORKER", "MemoryTooSmall",
           "TrialMemory", "fit_space", "memory_cache_bytes"]

BATCHES_IN_MAIN = 2
# Without workers, an allocator that keeps freed blocks (``Allocator.keeps_freed``) holds the main process's peak:
# the batch consumed, the next one's samples and their collation, and one more it keeps apart (measured: 4 batches).
KEPT_BATCHES_IN_MAIN = 4
# A disk build's processes under such an allocator keep the chunks they freed too (measured under tcmalloc with 1 MiB
# samples, the guard's figures at the build's peak: the main process held ~5 chunks over its spawned start where the
# plan's two are held at once, each read worker ~3.3 beside its heap where three are in flight).
KEPT_CHUNKS_IN_MAIN = 5
KEPT_CHUNKS_IN_WORKER = 4
FRESH_CONTEXTS = ("spawn", "forkserver")  # DataLoader start methods whose workers are fresh interpreters


class MemoryTooSmall(AutotuneError):
    """Not even the smallest trial fits the job's memory."""


def _keeps_batches(config: LoaderConfig) -> bool:
    """Whether the main process gathers the batches (no workers) under an allocator that keeps what it frees."""
    return not config.num_workers and get_allocator(config.process_settings().allocator).keeps_freed


@dataclass(frozen=True)
class TrialMemory:
    """The figures a trial's memory is planned from, measured by the running search."""

    budget: int  # what one candidate's processes may hold together (every rank's)
    interpreter: int  # a fresh interpreter with torch and the trial's modules (the forkserver's USS)
    heap: int  # what a process forked from a resident interpreter adds once it has run (measured: fork_charges)
    dataset: int  # the workload as a trial unpickles it (its pickle's length)
    batch_bytes: int
    ranks: int = 1
    available: int = 0  # what the job had left when the budget was read, for the messages
    limit_text: str = "the host's memory"  # JobMemory.describe_limit()
    sample_bytes: int = 0  # one decoded sample (what a cache stores), for a build's samples in flight
    build_workers: int = 0  # the processes a cache built before the first epoch decodes on (Plan.build_workers)
    tracker: int = 0  # the trial's own resource tracker, an exec'd process of its tree (tuner/_runner.py, measured)
    # The start method a disk build's read workers get: the search's own (the user's), which a trial takes
    # (tuner/_runner.py); a memory build forks its workers always (they inherit its columns).
    build_context: str | None = None
    build_samples: int = 0  # the most a trial's cache build stores (its subset), for its writer (0: not known)
    # A trial of a preloaded allocator is spawned under its preload, not forked (tuner/_runner.py: _context_for):
    # its figures, by allocator name, measured the first time such a trial is planned and kept for the search
    # (``_runner.SpawnedCharges``). None: the forked figures stand in (a spawned trial holds an interpreter more).
    spawned: Callable[[str], ForkCharges] | None = field(default=None, compare=False, repr=False)
    spawned_main: bool = False  # these are a spawned trial's own figures (``started``)

    def started(self, config: LoaderConfig) -> TrialMemory:
        """These figures as ``config``'s trial is started: forked from the server, or spawned under its
        allocator's preload, whose own process (``interpreter``: all of it, its collection's writes too), resource
        tracker and forked children (``heap``) were measured so (``_runner.spawn_charges``)."""
        allocator = config.process_settings().allocator
        if self.spawned is None or not get_allocator(allocator).preloaded:
            return self
        charges = self.spawned(allocator)
        return replace(self, interpreter=charges.interpreter, heap=charges.forked, tracker=charges.tracker,
                       spawned=None, spawned_main=True)

    def worker(self, context: str | None, prefetch: int | None) -> int:
        """One DataLoader worker's own memory."""
        own = (prefetch or 2) * self.batch_bytes + self.heap
        return own + (self.interpreter + self.dataset if context in FRESH_CONTEXTS else 0)

    def need(self, config: LoaderConfig, cache_bytes: int = 0) -> int:
        """What a trial of ``config`` adds to the job at its peak, every rank together; ``cache_bytes``: one
        rank's memory cache of the whole run. The peak is the training's, or the cache's build before it."""
        started = self.started(config)
        if started is not self:
            return started.need(config, cache_bytes)
        n = config.num_workers
        workers = n * self.worker(config.multiprocessing_context, config.prefetch_factor)
        if n and config.multiprocessing_context == "forkserver":
            workers += self.interpreter  # the DataLoader's own forkserver
        training = self._main(config) + self.main_batches(config) * self.batch_bytes + workers
        return max(1, self.ranks) * (max(training, self._build(config)) + cache_bytes)

    @staticmethod
    def main_batches(config: LoaderConfig) -> int:
        """The batches the trial's main process holds while it trains: the one being consumed and the one collated
        or received; without workers, under an allocator that keeps what it frees, the peak it collated at."""
        return KEPT_BATCHES_IN_MAIN if _keeps_batches(config) else BATCHES_IN_MAIN

    def _main(self, config: LoaderConfig) -> int:
        """The trial's own processes, before any batch: its own and its resource tracker."""
        if self.spawned_main:  # measured spawned as the trial is: its interpreter is all its own process holds
            return self.interpreter + self.dataset + self.tracker
        main = self.heap + self.dataset + self.tracker
        if get_allocator(config.process_settings().allocator).preloaded:
            main += self.interpreter  # spawned, not forked from the server (tuner/_runner.py: _context_for)
        return main

    def _build(self, config: LoaderConfig) -> int:
        """The trial while its cache is built before the first epoch (0 for none, or one the first epoch fills):
        its own process, the samples the main process holds, and the build's workers (the module docstring)."""
        if config.cache is None or config.cache_fill != "build":
            return 0
        chunk = READ_CHUNK * self.sample_bytes
        backend = cache_backend(config.cache)
        # beside a disk build's samples, what its backend's writer holds (``DiskCache.build_held``: lmdb's
        # transaction of records, hdf5's rows); a memory build writes each sample into its columns
        writer = 0 if backend.in_memory else backend.build_held(self.sample_bytes, self.build_samples or None)
        if not self.build_workers:
            return self._main(config) + chunk + writer  # the trial reads the source a chunk at a time itself
        if backend.in_memory:  # its forked workers write each sample into the columns
            held, in_flight = chunk, self.sample_bytes  # the schema's head, then nothing but blobs
            if _keeps_batches(config):
                held += WARMED_BATCHES * self.batch_bytes  # the batches' heap made resident meanwhile (_warm_heap)
            return self._main(config) + held + self.build_workers * (self.heap + in_flight)
        # the main process holds a received chunk and its unpickled samples, and its writer's; each worker is a
        # DataLoader worker of the process's start method (its heap, or a fresh interpreter with its own dataset)
        kept = get_allocator(config.process_settings().allocator).keeps_freed
        held, in_flight = (KEPT_CHUNKS_IN_MAIN, KEPT_CHUNKS_IN_WORKER) if kept else (2, 3)
        held, in_flight = held * chunk + writer, in_flight * chunk
        fresh = self.build_context in FRESH_CONTEXTS
        each = self.heap + in_flight + (self.interpreter + self.dataset if fresh else 0)
        server = self.interpreter if self.build_context == "forkserver" else 0
        return self._main(config) + held + self.build_workers * each + server

    def over_budget(self, config: LoaderConfig, cache_bytes: int = 0) -> str | None:
        """Why a trial of ``config`` is not started (one line), or None when it fits the budget."""
        need = self.need(config, cache_bytes)
        if need <= self.budget:
            return None
        ranks = f" ({self.ranks} ranks together)" if self.ranks > 1 else ""
        return (f"not tried: it would hold ~{format_bytes(need)}{ranks}, over the memory budget of "
                f"{format_bytes(self.budget)} ({self.limit_text})")

    def too_small(self) -> str:
        """The one line for a job where not even the plain default's trial fits."""
        need = self.need(DEFAULT)
        # The budget is a share of what the job has left: that must grow to need / share (a budget the user set
        # with --max-memory must grow by what is missing).
        short = max(need - self.budget, int(need / BUDGET_SHARE) - self.available)
        return (f"Not even the smallest trial (num_workers=0, no cache) fits this job's memory: {self.limit_text} "
                f"leaves {format_bytes(self.available)} available to the search, whose budget of "
                f"{format_bytes(self.budget)} is below the ~{format_bytes(need)} a trial adds to it (its dataset, "
                f"heap and {BATCHES_IN_MAIN} batches of "
                f"{format_bytes(self.batch_bytes)}). Raise the memory limit by at least "
                f"~{format_bytes(short)} (or --max-memory), or search with a smaller "
                "batch size.")


def memory_cache_bytes(config: LoaderConfig, sample_bytes: float, length: int) -> int:
    """One rank's memory cache of ``config``'s whole run (its share of ``length`` samples), 0 without one: what
    ``TrialMemory.need`` holds beside the trial's processes."""
    if config.cache is None or not cache_backend(config.cache).in_memory:
        return 0
    # the samples the run's cache stores, estimated as the factory's fit estimates them (recipe/_memory_fit.py)
    count = length if config.cache_share is None else partial_count(config.cache_share, length)
    return int(estimate_need(config.cache, sample_bytes, count)[0])


def _most_workers(memory: TrialMemory, space: Space, context: str) -> int:
    """The most workers of ``context`` that fit, at the smallest prefetch the space tries."""
    prefetch = min(space.prefetch_factors)
    most = 0
    for n in range(1, space.max_workers + 1):
        config = LoaderConfig(num_workers=n, prefetch_factor=prefetch, multiprocessing_context=context)
        if memory.need(config) > memory.budget:
            break
        most = n
    return most


def fit_space(space: Space, memory: TrialMemory) -> tuple[Space, list[str]]:
    """``space`` less what cannot fit ``memory``'s budget, and a note for each cut; ``MemoryTooSmall`` when
    not even the plain default fits."""
    if memory.need(DEFAULT) > memory.budget:
        raise MemoryTooSmall(memory.too_small())
    notes: list[str] = []
    budget = format_bytes(memory.budget)
    most = {context: _most_workers(memory, space, context) for context in space.contexts}
    workers = max(most.values(), default=0)
    contexts = tuple(c for c in space.contexts if most[c] > 0) or space.contexts
    if workers:
        for left in (c for c in space.contexts if c not in contexts):
            fresh = "a fresh interpreter" + (" and a server" if left == "forkserver" else "")
            notes.append(f"memory: start method {left} left out: each worker is {fresh} "
                         f"(~{format_bytes(memory.worker(left, min(space.prefetch_factors)))}), which does not "
                         f"fit the budget of {budget}")
    if workers < space.max_workers:
        each = format_bytes(memory.worker("fork", min(space.prefetch_factors)))
        notes.append(f"memory: num_workers at most {workers} (of {space.max_workers}): each worker holds ~{each} "
                     f"(its prefetched batches and heap), within the budget of {budget} ({memory.limit_text}); "
                     "a configuration beyond it is not tried")
    fitted = replace(space, max_workers=workers, contexts=contexts)
    return fitted, notes
