"""The adapting loader: the real training measured, and the configuration moved at epoch boundaries, and at
the chunk boundaries of a long epoch.

``AdaptiveLoader`` is iterable like a DataLoader (``len``, the same batches: every inner loader batches
from one index stream, ``loader._order.EpochStream``, drawn from the caller's sampler and generator as a
plain loader draws them; the loader tells the stream what reached the training loop, so a pool stopped
mid-epoch hands its undelivered batches to the next, and the epoch's permutation goes on where the
training loop is). Each epoch, or each ``PART_BATCHES`` of a long one, it times the real step's stall
(``_stall_clock``) and hands it to the policy (``_adapt_policy``), which returns the configuration to go
on with; only what can change between iterators moves (workers, prefetch, persistence, pinning, the
thread split: ``_thread_split``), the source (a cache) is built once. A switch shuts the old workers down
before the new loader exists, so two pools are never alive at once; a move of the main process's
threads alone keeps the pool. A candidate (a configuration being tried) that fails (a worker killed,
out of memory or /dev/shm, any error) hands the epoch back to the incumbent at its first undelivered
batch, with one warning, and is never tried again; the incumbent meeting the same error raises it (a dataset's own
error is the plain loader's). A move is allowed only where its
batches fit ``/dev/shm`` and its workers the job's memory budget (the factory's rules: ``shm_rule``, 70%
of what the job may still take), from the process tree's PSS read once a pool, at the end of its first part,
outside the clock.

With torch.distributed initialised, every rank's epoch is reduced (the slowest rank's time and wait),
rank 0 decides, and its decision is broadcast: the ranks switch together.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from autotune.config import LoaderConfig
from autotune.loader import EpochStream, reuses_iterator
from autotune.machine import batch_bytes, job_memory, shm_free, shm_rule, tree_pss
from autotune.recipe._adapt_policy import MIN_BATCHES, Decision, EpochObservation, Policy, probe_batches, same_pool
from autotune.recipe._stall_clock import HostClock, clock_for_this_process
from autotune.recipe._thread_split import MainThreads

log = logging.getLogger("autotune")

CHUNKS = 8  # an epoch's steady batches in this many chunks: the run's own noise (_adapt_policy rule 2)
PART_BATCHES = 256  # a long epoch (two parts or more) is judged, and may switch, every this many batches
_STEPS_SINCE_SNAPSHOT = "_steps_since_snapshot"  # torchdata's multi-worker iterator state: batches past its snapshot


@dataclass
class Memory:
    """What the memory and /dev/shm rules need: a batch's bytes (the first batch), a worker's PSS (read once
    a pool, at the end of its first part, outside the clock: a reading walks every page table of the tree,
    tens of milliseconds, which every epoch would cost the run a share of its exploration budget)."""

    batch_bytes: int = 0
    per_worker_bytes: int | None = None
    read_for: LoaderConfig | None = None  # the pool the reading is of

    def read(self, config: LoaderConfig) -> None:
        """A worker's share of the process tree's PSS under ``config``, unless read for its pool already."""
        if not config.num_workers or (self.read_for is not None and same_pool(self.read_for, config)):
            return
        self.read_for = config
        try:
            info = psutil.Process().memory_full_info()
            main = int(getattr(info, "pss", 0) or info.rss)
        except psutil.Error:
            return
        self.per_worker_bytes = max(0, tree_pss() - main) // config.num_workers

    def allowed(self, config: LoaderConfig, current: LoaderConfig, ranks: int = 1) -> str | None:
        """None when ``config``'s batches fit /dev/shm and its extra workers and batches fit 70% of what the
        job may still take (the factory's rules), else why not."""
        why = shm_rule(config.num_workers, config.prefetch_factor, self.batch_bytes, shm_free())
        if why is not None:
            return why
        per_worker = self.per_worker_bytes or 0
        extra = (per_worker * (config.num_workers - current.num_workers)
                 + self.batch_bytes * (config.num_workers * (config.prefetch_factor or 0)
                                       - current.num_workers * (current.prefetch_factor or 0)))
        budget = job_memory().budget(ranks)
        if extra > budget:
            return f"needs {extra} more bytes, over the memory budget of {budget}"
        return None


def _epoch_stats(waits: list[float], marks: list[float], start: float, end: float, config: LoaderConfig,
                 fresh: bool, cpu_seconds: float = 0.0, chunk: int = 0) -> EpochObservation:
    """The epoch as the policy sees it: ``marks`` are the times each batch left ``next()``. ``chunk``: the
    batches of a chunk (``chunk_size``), so that a part cut short (a probe, a drift, a failure) is chunked as its
    epoch is and the run's noise stays one chunk's (0: this part's own steady batches / ``CHUNKS``)."""
    chunk_seconds: list[float] = []
    steady = marks[1:]  # from the first batch on: its wait is the start-up, not the run's noise
    size = chunk or chunk_size(len(marks))
    for i in range(0, len(steady) - size, size):
        chunk_seconds.append((steady[i + size] - steady[i]) / size)
    return EpochObservation(config=config, batches=len(waits), seconds=end - start, wait_seconds=sum(waits),
                            first_wait_seconds=waits[0] if waits else 0.0, chunk_seconds=tuple(chunk_seconds),
                            fresh_pool=fresh, main_cpu_seconds=cpu_seconds)


def rate_so_far(marks: list[float], now: float) -> float:
    """A part's seconds per batch so far from its first batch on, as its chunks are measured (``_epoch_stats``):
    the first batch's wait (a persistent pool's refill at an epoch's start, a load's worth of batches) is no
    drift. ``marks``: the times each batch left ``next()``, two at least."""
    return (now - marks[0]) / (len(marks) - 1)


def chunk_size(batches: int) -> int:
    """The batches of one chunk of an epoch (or long part) of ``batches``: its steady batches in ``CHUNKS``."""
    return max(1, (batches - 2) // CHUNKS)


class RankSync:
    """The ranks of a torch.distributed job deciding together: the epoch reduced to the slowest rank's,
    rank 0's decision broadcast."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def reduce(self, obs: EpochObservation) -> EpochObservation:
        import torch

        device = "cuda" if self.dist.get_backend() == "nccl" else "cpu"
        chunks = list(obs.chunk_seconds)[:CHUNKS] + [0.0] * (CHUNKS - len(obs.chunk_seconds[:CHUNKS]))
        values = torch.tensor([obs.seconds, obs.wait_seconds, obs.first_wait_seconds, float(obs.batches),
                               obs.main_cpu_seconds, obs.overhead_seconds, *chunks],
                              dtype=torch.float64, device=device)
        self.dist.all_reduce(values, op=self.dist.ReduceOp.MAX)
        v = values.tolist()
        return EpochObservation(config=obs.config, batches=int(v[3]), seconds=v[0], wait_seconds=v[1],
                                first_wait_seconds=v[2], chunk_seconds=tuple(c for c in v[6:] if c > 0),
                                fresh_pool=obs.fresh_pool, main_cpu_seconds=v[4], probe=obs.probe,
                                overhead_seconds=v[5], capped=obs.capped, mid_epoch=obs.mid_epoch, span=obs.span)

    def broadcast(self, decision: Decision | None) -> Decision:
        payload = [None if decision is None else
                   (json.dumps(decision.config.to_json()), decision.event, decision.line)]
        self.dist.broadcast_object_list(payload, src=0)
        text, event, line = payload[0]  # type: ignore[misc]
        return Decision(LoaderConfig.from_json(json.loads(text)), event, line)


def rank_sync() -> RankSync | None:
    """A ``RankSync`` when this process is one of several torch.distributed ranks."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return RankSync()
    return None


@dataclass
class Event:
    """One epoch of the run (or one part of a long epoch), for ``history`` and the record written back."""

    epoch: int
    config: LoaderConfig
    seconds_per_batch: float
    stall: float
    decision: str  # Decision.event, or "crash"
    line: str
    next_config: LoaderConfig
    mid_epoch: bool = False  # ended at a chunk boundary of a long epoch, not at its end


@dataclass
class History:
    events: list[Event] = field(default_factory=list)

    def switches(self) -> list[Event]:
        """The epochs (or parts) after which the configuration changed."""
        return [e for e in self.events if e.next_config != e.config]


@dataclass
class _Pending:
    """A part of an epoch being read (the whole epoch, or a long epoch's part): its clock, each batch's
    time out of ``next()``, its start and configuration."""

    clock: HostClock
    marks: list[float]
    start: float
    config: LoaderConfig
    fresh: bool
    cpu_start: float = field(default_factory=time.process_time)  # the main process's CPU clock, all threads
    probe: bool = False  # a candidate's first part: ends after ``probe_batches`` (the policy's rule 4)
    chunk: int = 0  # the batches of a chunk of the epoch (or long part) it belongs to (``_epoch_stats``)
    span: int = 0  # the batches of that epoch (or long part): EpochObservation.span

    def estimated_end(self) -> float:
        waits, marks = self.clock.waits, self.marks
        steps = [(marks[i + 1] - waits[i + 1]) - marks[i] for i in range(min(len(marks), len(waits)) - 1)]
        return marks[-1] + (sum(steps) / len(steps) if steps else 0.0)


def shut_down(loader: Any, iterator: Any = None) -> None:
    """Stop ``loader``'s workers now (a persistent pool lives as long as its iterator), and ``iterator``'s (a
    non-persistent one is not kept on its loader)."""
    for it in (getattr(loader, "_iterator", None), iterator):
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator = None


def _unwatch(iterator: Any) -> None:
    """Take a candidate pool's workers out of torch's SIGCHLD check, which raises wherever the main thread
    is when a worker dies (in the training step too); the pool's own check (every few seconds inside
    ``next()``, torch's ``MP_STATUS_CHECK_INTERVAL``) still finds a dead worker, where ``_recover`` can
    take the epoch back."""
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(iterator))  # type: ignore[attr-defined]
        iterator._worker_pids_set = False


def _stop_broken(exc: BaseException) -> None:
    """Stop the pools in ``exc``'s traceback: an inner iterator whose start failed (a worker died before
    ``iter()`` returned, torch's SIGCHLD check raising inside it) is held by nothing else, with its workers'
    pids still in that check, which would raise again as its other workers exit."""
    tb = exc.__traceback__
    seen: set[int] = set()
    while tb is not None:
        it = tb.tb_frame.f_locals.get("self")
        if it is not None and id(it) not in seen and hasattr(it, "_shutdown_workers"):
            seen.add(id(it))
            _unwatch(it)
            if hasattr(it, "_shutdown") and hasattr(it, "_workers"):  # far enough in its start to have a pool
                shut_down(None, it)
        tb = tb.tb_next


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class AdaptiveLoader:
    """Iterable like the DataLoader it holds; see the module docstring. ``make(config)`` builds an inner
    loader; ``policy`` decides (its ``allowed`` is ``self.memory.allowed``, wired by the factory);
    ``on_epoch(event, loader)`` is told each epoch (the record written back), ``on_close()`` when the loader
    is closed (what is left of it written). ``stream``: the index stream every inner loader draws from
    (``loader._order.EpochStream``), which lets a long epoch switch at its chunk boundaries and a failed
    candidate hand the rest of the epoch back; None (a caller's batch sampler, a stream of samples): epoch
    boundaries only. ``threads``: the main process's threads where the split
    may move. ``caller``: the attributes the caller's loader would have (batch_size, sampler, ...), which
    the inner loaders, batching through ``stream``, do not."""

    def __init__(self, make: Callable[[LoaderConfig], Any], start: LoaderConfig, policy: Policy, *,
                 on_epoch: Callable[[Event, AdaptiveLoader], None] | None = None,
                 on_close: Callable[[], None] | None = None,
                 clock: Callable[[], HostClock] = clock_for_this_process, sync: RankSync | None = None,
                 read_memory: bool = True, stream: EpochStream | None = None, threads: MainThreads | None = None,
                 caller: dict[str, Any] | None = None, part_batches: int = PART_BATCHES):
        self._make = make
        self.config = start
        self.policy = policy
        self.history = History()
        self.memory = Memory()
        self.part_batches = part_batches  # a long epoch's parts, in batches (see ``_boundary``)
        self._on_epoch = on_epoch
        self._on_close = on_close
        self._clock = clock
        self._sync = sync
        self._read_memory = read_memory
        self._stream = stream
        self._threads = threads
        self._caller = dict(caller or {})
        self._loader = make(start)
        self._fresh = True
        self._pending: _Pending | None = None
        self._active: Any = None  # the inner iterator of the epoch being read
        self._completed: set[LoaderConfig] = set()  # configurations that read a part without failing
        self._note: str | None = None  # a failed candidate's warning, said once the incumbent went past it
        self._trial = False  # the last decision was a try: the next part starts with its probe
        self._outside = 0.0  # the loader's own wall time since the last observation: the policy's rule 5
        self._drift_epoch = -1  # the epoch whose part a drift ended (at most one an epoch: ``_drift_ends``)
        self._chunk = 0  # the batches of a chunk of the epoch being read (``chunk_size``)
        self._span = 0  # the batches of that epoch (or long part): ``_part_size``
        self._replayed = 0  # batches a resumed StatefulDataLoader's iterator replays to reach its saved place
        self.epoch = 0

    @property
    def loader(self) -> Any:
        """The DataLoader this epoch runs on."""
        return self._loader

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._caller:
            return self._caller[name]
        return getattr(self._loader, name)  # dataset, num_workers, autotune, ...

    def close(self) -> None:
        """Stop the workers now and give the main process's threads back as the loader found them."""
        self._finish_pending()
        if self._on_close is not None:
            self._on_close()
        shut_down(self._loader, self._active)
        self._active = None
        if self._threads is not None:
            self._threads.restore()

    def __enter__(self) -> AdaptiveLoader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """The inner loader's state (StatefulDataLoader) and the configuration it was saved under."""
        return {"autotune_config": self.config.to_json(), "loader": self._loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the loader of the configuration the state was saved under, then its state."""
        config = LoaderConfig.from_json(state["autotune_config"])
        if config != self.config:
            self._switch(config)
        self.policy.restart_from(config)
        inner = state["loader"]
        # A state saved n batches after its last snapshot (``snapshot_every_n_steps`` > 1) is resumed from the
        # snapshot: the new iterator draws those n batches again and drops them (the saved run delivered them).
        # The stream sees them handed out, never delivered: counted here, or the epoch's position stays n behind
        # (its end never reached, a switch handing them out again).
        self._replayed = int(inner.get(_STEPS_SINCE_SNAPSHOT) or 0) if isinstance(inner, dict) else 0
        self._loader.load_state_dict(inner)

    def _switch(self, config: LoaderConfig) -> None:
        if self._threads is not None and config.main_threads != self.config.main_threads:
            if not self._threads.apply(config.main_threads):
                config = config.refit(main_threads=self.config.main_threads)  # the user's now: not moved
                self.policy.fixed = self.policy.fixed | {"main_threads"}
        if same_pool(self.config, config):
            self.config = config  # the same workers go on
            return
        shut_down(self._loader, self._active)  # before the new loader starts: never two pools at once
        self._active = None
        if self._stream is not None:
            self._stream.rewind()  # what the stopped pool had in flight is the next loader's first
        self._loader = self._make(config)
        self.config = config
        self._fresh = True

    def _position(self, count: int) -> int:
        """Batches of this epoch the training loop received (a resumed epoch's count from its start)."""
        return self._stream.epoch.delivered if self._stream is not None else count

    def _boundary(self, position: int, total: int | None) -> bool:
        """Whether a long epoch's part ends after batch ``position``: every ``part_batches`` batches of an
        epoch of at least two parts, the last part at least as long as the others; never while the first
        epoch fills a cache (its workers write it), never without an owned index stream."""
        size = self.part_batches
        return (self._stream is not None and total is not None and size > 0 and total >= 2 * size
                and position % size == 0 and total - position >= size
                and not (self.epoch == 0 and self.config.cache_fill == "first_epoch"))

    def _probe_ends(self, pending: _Pending, position: int, total: int | None) -> bool:
        """Whether a candidate's probe ends after batch ``position``: a quarter of its epoch (or of a long
        epoch's part), at least ``MIN_BATCHES``, with at least ``MIN_BATCHES`` of the epoch left for the rest;
        only with an owned index stream (the incumbent takes the epoch back mid-way)."""
        if not pending.probe or self._stream is None or total is None:
            return False
        size = self._part_size(total)
        return len(pending.marks) == probe_batches(size) and total - position >= MIN_BATCHES

    def _part_size(self, total: int) -> int:
        """The batches of one part of an epoch of ``total``: ``part_batches`` in a long epoch, else the epoch."""
        return self.part_batches if 0 < self.part_batches and total >= 2 * self.part_batches else total

    def _drift_ends(self, pending: _Pending, position: int, total: int | None) -> bool:
        """Whether the incumbent's part ends after batch ``position`` because its seconds per batch so far left
        the incumbent's figure by a drift (the policy's ``drifting``: a competitor, a heavier step that starts
        mid-epoch), so the policy reopens now instead of after an epoch at the old configuration: at a chunk
        boundary from the first (``MIN_BATCHES`` at least): the test's noise is one chunk's, so one chunk is the
        evidence it is calibrated for (a probe's length, two chunks of a long epoch, let benchmarks/adapt.py's
        competitor run 42 batches at fifteen times the incumbent's figure, 6 s, before the policy could move),
        with a probe's length and ``MIN_BATCHES`` of the epoch left to try a move on, at most once an epoch.
        A part that started its pool too (a pool that restarts every epoch: the phase change of
        benchmarks/adapt.py from a far recipe ran its whole heavy epoch at the old configuration, 2.8 s over the
        best): the start-up is the first batch's wait, which the rate so far leaves out, and the new workers' first
        chunk ran as their later ones (its workload, two forked workers, 4 epochs: the first chunk 0.97-1.06x the
        mean of the 7 after it; the drift is 16%). Not with several ranks: their parts must end together, and
        each rank's clock is its own (they reopen at the epoch's end, from the all-reduced figure)."""
        if (self._sync is not None or self._stream is None or total is None or pending.probe
                or self._drift_epoch == self.epoch):
            return False
        size = self._part_size(total)
        chunk, n = pending.chunk or chunk_size(size), len(pending.marks)
        if n < max(MIN_BATCHES, chunk) or n % chunk or total - position < probe_batches(size) + MIN_BATCHES:
            return False
        so_far = rate_so_far(pending.marks, pending.clock.now())
        if not self.policy.drifting(pending.config, so_far):
            return False
        self._drift_epoch = self.epoch
        return True

    def _budget_ends(self, pending: _Pending, total: int | None) -> bool:
        """Whether a try's part ends now because its extra so far and its way back no longer fit the run's
        exploration budget (the policy's rule 5b, ``over_budget``), asked after each of its batches; the
        incumbent then takes the rest of the epoch. Only with an owned index stream and a known length (the
        epoch goes on), and not with several ranks, whose parts must end together and whose clocks are
        each their own (a try there is bounded by its expected cost alone)."""
        if self._sync is not None or self._stream is None or total is None or self.policy.trying is None:
            return False
        seconds = pending.clock.now() - pending.start
        return self.policy.over_budget(pending.config, seconds, len(pending.marks), self._outside)

    def _new_pending(self, clock: HostClock, fresh: bool) -> _Pending:
        probe, self._trial = self._trial, False
        return _Pending(clock, [], clock.now(), self.config, fresh, probe=probe, chunk=self._chunk,
                        span=self._span)

    def __iter__(self) -> Iterator[Any]:
        self._finish_pending()  # an epoch its consumer left at its last batch (len known): ends before this one
        self._drop_old()
        if self._stream is not None:
            self._stream.begin()
        clock = self._clock()
        fresh = self._fresh or not (self.config.persistent_workers and self.config.num_workers)
        self._fresh = False
        try:
            total: int | None = len(self._loader)
        except TypeError:  # a stream without a length: an epoch ends at StopIteration only
            total = None
        self._span = 0 if total is None else self._part_size(total)
        self._chunk = 0 if total is None else chunk_size(self._span)
        pending = self._new_pending(clock, fresh)
        iterator: Any = None
        count = 0
        ended = None
        try:
            while True:
                try:
                    clock.enter()
                    if iterator is None:
                        iterator = self._active = iter(self._loader)
                        if self._stream is not None:
                            for _ in range(self._replayed):
                                self._stream.delivered()
                        self._replayed = 0
                        if self._recoverable():
                            _unwatch(iterator)
                    batch = next(iterator)
                except StopIteration:  # the last call's wait is the end's, not a batch's
                    break
                except Exception as exc:
                    if not self._recover(exc):
                        raise
                    self._outside += clock.now() - pending.start  # the failed part, whole: the try's cost
                    iterator = None
                    clock.epoch_waits()  # the part mixed two configurations: it teaches nothing
                    self._trial = False
                    pending = _Pending(clock, [], clock.now(), self.config, True, chunk=self._chunk, span=self._span)
                    self._fresh = False
                    continue
                pending.marks.append(clock.leave())
                count += 1
                if self._stream is not None:
                    self._stream.delivered()
                position = self._position(count)
                if count == 1 and not self.memory.batch_bytes:
                    self.memory.batch_bytes = batch_bytes(batch)
                if self._note is not None:
                    warnings.warn(self._note, stacklevel=2)  # the incumbent went past the failed batch
                    self._note = None
                if position == total:
                    # whole by count: a training loop that knows len (Lightning) never asks past the last batch
                    self._pending = pending
                yield batch
                capped = self._pending is not pending and self._budget_ends(pending, total)
                probe = not capped and self._probe_ends(pending, position, total)
                if self._pending is not pending and (capped or probe or self._boundary(position, total)
                                                     or self._drift_ends(pending, position, total)):
                    loader = self._loader
                    self._end(pending, clock.now(), mid_epoch=True, probe=probe, capped=capped)
                    if self._loader is not loader:
                        iterator = None  # stopped: the next loader continues the epoch
                    pending = self._new_pending(clock, self._fresh)
                    self._fresh = False
            ended = clock.now()
        finally:
            if self._pending is pending:
                self._finish_pending(ended)
            elif ended is not None and total is None:
                self._end(pending, ended)
            if self._active is iterator and not self._kept(iterator):
                shut_down(None, iterator)  # a loop left early: its pool goes now, as a plain loader's would
                self._active = None

    def _kept(self, iterator: Any) -> bool:
        """Whether the inner loader hands ``iterator`` out again on its next ``iter()`` (a persistent pool,
        a StatefulDataLoader's made for ``state_dict``)."""
        loader = self._loader
        return iterator is not None and iterator is getattr(loader, "_iterator", None) and (
            reuses_iterator(loader) or bool(getattr(loader, "_initial_iter_for_state_dict", False)))

    def _drop_old(self) -> None:
        """Stop the last epoch's workers unless its iterator goes on: an epoch left at its last batch keeps
        its iterator (and a non-persistent pool) alive in the consumer's generator."""
        old, self._active = self._active, None
        if old is not None and not self._kept(old):
            shut_down(None, old)

    def _recover(self, exc: Exception) -> bool:
        """After ``exc`` from the inner loader: True where it is a candidate's failure (a configuration being
        tried, not the incumbent: a worker killed, out of memory or /dev/shm, any error the incumbent did not
        meet): the incumbent takes the epoch on from its first undelivered batch. False (raise it) under the
        incumbent, without an incumbent that read a part, or without an owned index stream to hand back; an
        error of the dataset itself so meets the incumbent again on the same batch, and is raised there."""
        if not self._recoverable():
            return False
        assert self._stream is not None  # _recoverable
        failed, good = self.config, self.policy.incumbent
        why = _first_line(exc)
        _stop_broken(exc)
        self.policy.crashed(failed, why)
        at = self._stream.epoch.delivered + 1
        self._switch(good)
        line = f"{failed.describe()} failed ({why}): back to {good.describe()}, the epoch goes on at batch {at}"
        log.info("autotune adapt, epoch %d: %s", self.epoch + 1, line)
        self.history.events.append(Event(self.epoch, failed, 0.0, 0.0, "crash", line, good, mid_epoch=True))
        self._note = f"autotune adapt: {line}"
        return True

    def _recoverable(self) -> bool:
        """Whether a failure now is a candidate's (``_recover``)."""
        failed, good = self.config, self.policy.incumbent
        return (self._stream is not None and failed != good and good in self._completed
                and not same_pool(failed, good))

    def _finish_pending(self, ended: float | None = None) -> None:
        """End the epoch that was whole by count: at ``ended``, or (its consumer never came back) one step
        after its last batch, the step being the epoch's mean time between batches."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._end(pending, ended if ended is not None else pending.estimated_end())

    def _end(self, pending: _Pending, end: float, *, mid_epoch: bool = False, probe: bool = False,
             capped: bool = False) -> None:
        began = time.perf_counter()  # from here to the next part's clock: the loader's own time (a switch too)
        waits = pending.clock.epoch_waits()
        if len(waits) >= MIN_BATCHES or (capped and waits):  # a capped try's part is the policy's however short
            self._completed.add(pending.config)
            obs = _epoch_stats(waits, pending.marks, pending.start, end, pending.config, pending.fresh,
                               time.process_time() - pending.cpu_start, pending.chunk)
            obs = dataclasses.replace(obs, probe=probe, overhead_seconds=self._outside, capped=capped,
                                      mid_epoch=mid_epoch, span=pending.span)
            self._outside = 0.0
            self._end_epoch(obs, mid_epoch)
        self._outside += time.perf_counter() - began

    def _end_epoch(self, obs: EpochObservation, mid_epoch: bool = False) -> None:
        if self._read_memory:
            self.memory.read(self.config)  # outside the clock
        if self._sync is not None:
            obs = self._sync.reduce(obs)
            decision = self._sync.broadcast(self.policy.decide(obs) if self._sync.rank == 0 else None)
        else:
            decision = self.policy.decide(obs)
        event = Event(self.epoch, obs.config, obs.seconds_per_batch, obs.stall, decision.event, decision.line,
                      decision.config, mid_epoch)
        self.history.events.append(event)
        # a part is a probe where it starts a try: a kept move goes on to the next one at once (the policy's _judge)
        self._trial = decision.event in ("try", "reopen", "keep") and decision.config != self.config
        if not mid_epoch:
            self.epoch += 1
        if decision.event not in ("measure", "observe", "warm-up", "continue"):
            where = " (mid-epoch)" if mid_epoch else ""
            log.info("autotune adapt, epoch %d%s: %s", event.epoch + 1, where, decision.line)
        if self._on_epoch is not None:
            self._on_epoch(event, self)
        if decision.config != self.config:
            self._switch(decision.config)
