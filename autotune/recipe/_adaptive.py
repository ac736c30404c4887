"""The adapting loader: the real training measured, and the configuration moved at epoch boundaries.

``AdaptiveLoader`` is iterable like a DataLoader (``len``, the same batches: every inner loader shares the
caller's sampler and generator and draws from it as a plain loader does, ``loader._order``). Each epoch it
times the real step's stall (``_stall_clock``) and hands the epoch to the policy (``_adapt_policy``),
which returns the next epoch's configuration; only what can change between iterators moves (workers,
prefetch, persistence, pinning), the source (a cache) is built once. A switch shuts the old workers down
before the new loader exists, so two pools are never alive at once. A move is allowed only where its
batches fit ``/dev/shm`` and its workers the job's memory budget (the factory's rules: ``shm_rule``, 70%
of what the job may still take), from the process tree's PSS read at epoch ends, outside the clock.

With torch.distributed initialised, every rank's epoch is reduced (the slowest rank's time and wait),
rank 0 decides, and its decision is broadcast: the ranks switch together.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from autotune.config import LoaderConfig
from autotune.recipe._adapt_policy import Decision, EpochObservation, Policy
from autotune.recipe._stall_clock import HostClock, clock_for_this_process

log = logging.getLogger("autotune")

CHUNKS = 8  # an epoch's steady batches in this many chunks: the run's own noise (_adapt_policy rule 2)
MIN_BATCHES = 4  # an epoch left sooner (a break) teaches nothing


@dataclass
class Memory:
    """What the memory and /dev/shm rules need: a batch's bytes (the first batch), a worker's PSS (read at
    epoch ends, outside the clock)."""

    batch_bytes: int = 0
    per_worker_bytes: int | None = None

    def read(self, config: LoaderConfig) -> None:
        """A worker's share of the process tree's PSS under ``config``."""
        if not config.num_workers:
            return
        import psutil

        from autotune.machine import tree_pss

        try:
            info = psutil.Process().memory_full_info()
            main = int(getattr(info, "pss", 0) or info.rss)
        except psutil.Error:
            return
        self.per_worker_bytes = max(0, tree_pss() - main) // config.num_workers

    def allowed(self, config: LoaderConfig, current: LoaderConfig, ranks: int = 1) -> str | None:
        """None when ``config``'s batches fit /dev/shm and its extra workers and batches fit 70% of what the
        job may still take (the factory's rules), else why not."""
        from autotune.machine import job_memory, shm_free, shm_rule
        from autotune.machine._memory import BUDGET_SHARE

        why = shm_rule(config.num_workers, config.prefetch_factor, self.batch_bytes, shm_free())
        if why is not None:
            return why
        per_worker = self.per_worker_bytes or 0
        extra = (per_worker * (config.num_workers - current.num_workers)
                 + self.batch_bytes * (config.num_workers * (config.prefetch_factor or 0)
                                       - current.num_workers * (current.prefetch_factor or 0)))
        budget = int(job_memory().available * BUDGET_SHARE) // max(1, ranks)
        if extra > budget:
            return f"needs {extra} more bytes, over the memory budget of {budget}"
        return None


def _epoch_stats(waits: list[float], marks: list[float], start: float, end: float, config: LoaderConfig,
                 fresh: bool) -> EpochObservation:
    """The epoch as the policy sees it: ``marks`` are the times each batch left ``next()``."""
    chunk_seconds: list[float] = []
    steady = marks[1:]  # from the first batch on: its wait is the start-up, not the run's noise
    size = max(1, (len(steady) - 1) // CHUNKS)
    for i in range(0, len(steady) - size, size):
        chunk_seconds.append((steady[i + size] - steady[i]) / size)
    return EpochObservation(config=config, batches=len(waits), seconds=end - start, wait_seconds=sum(waits),
                            first_wait_seconds=waits[0] if waits else 0.0, chunk_seconds=tuple(chunk_seconds),
                            fresh_pool=fresh)


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
        values = torch.tensor([obs.seconds, obs.wait_seconds, obs.first_wait_seconds, float(obs.batches), *chunks],
                              dtype=torch.float64, device=device)
        self.dist.all_reduce(values, op=self.dist.ReduceOp.MAX)
        v = values.tolist()
        return EpochObservation(config=obs.config, batches=int(v[3]), seconds=v[0], wait_seconds=v[1],
                                first_wait_seconds=v[2], chunk_seconds=tuple(c for c in v[4:] if c > 0),
                                fresh_pool=obs.fresh_pool)

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
    """One epoch of the run, for ``history`` and the record written back."""

    epoch: int
    config: LoaderConfig
    seconds_per_batch: float
    stall: float
    decision: str  # Decision.event
    line: str
    next_config: LoaderConfig


@dataclass
class History:
    events: list[Event] = field(default_factory=list)

    def switches(self) -> list[Event]:
        """The epochs after which the configuration changed."""
        return [e for e in self.events if e.next_config != e.config]


@dataclass
class _Pending:
    """An epoch being read: its clock, each batch's time out of ``next()``, its start and configuration."""

    clock: HostClock
    marks: list[float]
    start: float
    config: LoaderConfig
    fresh: bool

    def estimated_end(self) -> float:
        waits, marks = self.clock.waits, self.marks
        steps = [(marks[i + 1] - waits[i + 1]) - marks[i] for i in range(min(len(marks), len(waits)) - 1)]
        return marks[-1] + (sum(steps) / len(steps) if steps else 0.0)


def shut_down(loader: Any) -> None:
    """Stop ``loader``'s workers now (a persistent pool lives as long as its iterator)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    if iterator is not None:
        loader._iterator = None


class AdaptiveLoader:
    """Iterable like the DataLoader it holds; see the module docstring. ``make(config)`` builds an inner
    loader; ``policy`` decides (its ``allowed`` is ``self.memory.allowed``, wired by the factory);
    ``on_epoch(event, loader)`` is told each epoch (the record written back)."""

    def __init__(self, make: Callable[[LoaderConfig], Any], start: LoaderConfig, policy: Policy, *,
                 on_epoch: Callable[[Event, AdaptiveLoader], None] | None = None,
                 clock: Callable[[], HostClock] = clock_for_this_process, sync: RankSync | None = None,
                 read_memory: bool = True):
        self._make = make
        self.config = start
        self.policy = policy
        self.history = History()
        self.memory = Memory()
        self._on_epoch = on_epoch
        self._clock = clock
        self._sync = sync
        self._read_memory = read_memory
        self._loader = make(start)
        self._fresh = True
        self._pending: _Pending | None = None
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
        return getattr(self._loader, name)  # batch_size, dataset, sampler, num_workers, autotune, ...

    def state_dict(self) -> dict[str, Any]:
        """The inner loader's state (StatefulDataLoader) and the configuration it was saved under."""
        return {"autotune_config": self.config.to_json(), "loader": self._loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the loader of the configuration the state was saved under, then its state."""
        config = LoaderConfig.from_json(state["autotune_config"])
        if config != self.config:
            self._switch(config)
        self.policy.restart_from(config)
        self._loader.load_state_dict(state["loader"])

    def _switch(self, config: LoaderConfig) -> None:
        shut_down(self._loader)  # before the new loader starts: never two pools at once
        self._loader = self._make(config)
        self.config = config
        self._fresh = True

    def __iter__(self) -> Iterator[Any]:
        self._finish_pending()  # an epoch its consumer left at its last batch (len known): ends before this one
        loader, clock = self._loader, self._clock()
        fresh = self._fresh or not (self.config.persistent_workers and self.config.num_workers)
        self._fresh = False
        try:
            expected: int | None = len(loader)
        except TypeError:  # a stream without a length: an epoch ends at StopIteration only
            expected = None
        pending = _Pending(clock, [], clock.now(), self.config, fresh)
        ended = None
        try:
            for batch in _timed(iter(loader), clock, pending.marks):
                if len(pending.marks) == 1 and not self.memory.batch_bytes:
                    from autotune.machine import batch_bytes

                    self.memory.batch_bytes = batch_bytes(batch)
                if len(pending.marks) == expected:
                    # whole by count: a training loop that knows len (Lightning) never asks past the last batch
                    self._pending = pending
                yield batch
            ended = clock.now()
        finally:
            if self._pending is pending:
                self._finish_pending(ended)
            elif ended is not None and expected is None:
                self._end(pending, ended)

    def _finish_pending(self, ended: float | None = None) -> None:
        """End the epoch that was whole by count: at ``ended``, or (its consumer never came back) one step
        after its last batch, the step being the epoch's mean time between batches."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._end(pending, ended if ended is not None else pending.estimated_end())

    def _end(self, pending: _Pending, end: float) -> None:
        waits = pending.clock.epoch_waits()
        if len(waits) >= MIN_BATCHES:
            self._end_epoch(_epoch_stats(waits, pending.marks, pending.start, end, pending.config, pending.fresh))

    def _end_epoch(self, obs: EpochObservation) -> None:
        if self._read_memory:
            self.memory.read(self.config)  # outside the clock
        if self._sync is not None:
            obs = self._sync.reduce(obs)
            decision = self._sync.broadcast(self.policy.decide(obs) if self._sync.rank == 0 else None)
        else:
            decision = self.policy.decide(obs)
        event = Event(self.epoch, obs.config, obs.seconds_per_batch, obs.stall, decision.event, decision.line,
                      decision.config)
        self.history.events.append(event)
        self.epoch += 1
        if decision.event not in ("measure", "observe", "warm-up"):
            log.info("autotune adapt, epoch %d: %s", event.epoch + 1, decision.line)
        if self._on_epoch is not None:
            self._on_epoch(event, self)
        if decision.config != self.config:
            self._switch(decision.config)


def _timed(iterator: Iterator[Any], clock: HostClock, marks: list[float]) -> Iterator[Any]:
    """``iterator``'s items, each ``next()`` between two reads of ``clock``."""
    while True:
        clock.enter()
        try:
            batch = next(iterator)
        except StopIteration:  # the last call's wait is the end's, not a batch's
            return
        marks.append(clock.leave())
        yield batch
