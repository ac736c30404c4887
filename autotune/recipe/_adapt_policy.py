"""What an adapting loader does next, from what it measured: a pure function of the observations.

The loader (``recipe._adaptive``) hands ``Policy.decide`` one ``EpochObservation`` per epoch of the real
training and gets the configuration of the next epoch back; nothing here reads a clock or builds a loader,
so every decision is a function of the numbers fed in (the tests feed them).

The figure is the epoch's seconds per batch under the real step (the wall from ``iter()`` to the end);
for a freshly started persistent pool, its one-off start-up (the first batch's wait beyond the others')
is left out, since the next epochs do not pay it. The signal for the direction is the stall, the share
of that time spent waiting inside ``next()``: a loader that keeps the step waiting needs more (workers,
prefetch, persistence, pinning); one that never does may be taking the cores the step needs, so fewer
workers come first.

The rules (a hill climb, as tf.data's and MindSpore's, with a significance test):

1. The first epoch is a warm-up (cold files, a cache filling): it only sets the stall.
2. A move is tried for one epoch against the incumbent's latest epoch, and kept only when it is faster
   by more than the noise measured in this run: the spread of the chunks within epochs (their log
   seconds per batch, pooled) over the chunks compared, twice that, at least ``MIN_GAIN``, and at least
   the incumbent's own change between its last two epochs. Otherwise the next epoch reverts. A kept
   move's epoch is the new incumbent's latest, so the next move is tried from the next epoch on, without an
   epoch of the new incumbent between. The configuration a kept move beat (its main threads set or left to
   the process, the same run) is not tried back until a drift (rule 3) clears what was tried.
3. After ``MAX_REJECTIONS`` rejections in a row, or with no move left, the policy settles: the
   incumbent stays, and its figure is watched; a change beyond ``DRIFT`` (and the noise), or the stall
   crossing ``STALL_HIGH``, reopens the search from the incumbent. A drift is seen inside an epoch too
   (``drifting``, asked by the loader at its chunk boundaries): the incumbent's part ends there and the
   search reopens for the rest of the epoch, not one epoch later. The same change between two of the
   incumbent's epochs before it settles clears the rejections: they were judged under other conditions.
4. A candidate's first part (``probe``: the loader ends it after a quarter of the epoch or part, at a
   boundary the user cannot observe) is judged for a loss only: slower than the incumbent by more than
   ``LOSS``, three times the noise of one chunk against the incumbent's, and the incumbent's own change,
   it is reverted there, so a clearly bad try costs a quarter of an epoch; otherwise the candidate reads
   the rest, and rule 2 judges the whole (the probe and the rest as one epoch).
5. Exploration is bounded by its measured cost. The ledger (``spent_seconds``) holds the run's wall time
   over running the incumbent: the loader's own time outside the clocks (``overhead_seconds``: its
   bookkeeping, a switch's shut-down and new loader), each candidate part's whole wall (its new pool's
   start-up included) over the incumbent's seconds per batch, and the incumbent's restart after a revert.
   What is left (``left``) is ``EXPLORE_SHARE`` of the run so far (``seen_seconds``) less the ledger. A
   kept move's gain is not banked: once kept, the candidate is the incumbent the run's extra is counted
   against, and what it saved over the old one (its parts charged at the old rate, below zero) is the run's
   gain over the fixed run, not an allowance for losing to the new incumbent (the ledger goes to zero).

   The invariant: **the adapting run's extra wall time over the incumbent's (the fixed run's, where the
   recipe is the best) never exceeds ``EXPLORE_SHARE`` of the run so far, plus the loss of the one batch
   of a try that crossed it and whatever a pool's start-up or a switch took beyond its price**, as long as
   the bookkeeping alone stays within it. The mechanism, in two parts:

   a. A try's way back is reserved before it starts, priced by its kind and where it starts (``price``).
      The invariant: **a try's price is what the adapting run pays beyond what the fixed run would have
      paid at the same point**, for the worst way back (a revert mid-epoch: a probe's, a cap's). A move of
      the main process's threads alone stays on the pool and goes back in place: nothing, at an epoch
      boundary or not (a pool that is not persistent restarts there in both runs). A move to another pool
      (workers, prefetch, persistence on or off, pinning, worker threads) pays a switch there and back, the
      new pool's start-up and, where the incumbent has workers, their start-up again after the revert; less,
      at an epoch boundary (the last observation ended its epoch: ``mid_epoch`` False), the restart a
      non-persistent incumbent's pool pays there in the fixed run too (``restart_paid``). So a try from
      such a pool at an epoch boundary is priced one start-up under the same try mid-epoch (a chunk
      boundary), where only the adapting run restarts anything. The ledger credits the fixed run's
      restart the same way: at the try's first part, the incumbent's own measured start-up, its batches at
      its steady rate (``_fixed``). Each start-up and switch is this run's measured one
      (``start_up``, ``switch_seconds``), and before one was measured an assumed one (``ASSUMED_START_UP``
      for forked workers, ``ASSUMED_SPAWN_START_UP`` for spawned ones, ``ASSUMED_SWITCH``), never the last
      try of another kind (a thread move costs no start-up; a first pool from no workers was priced by
      nothing and cost 20x its price). A try starts only when its price and its probe at the least loss it
      is reverted for fit ``left`` (``expected_cost``: at least the last rejected try's cost of its kind);
      one that does not fit does not hold up the others: the next move in the order of promise whose
      expectation fits is tried, and exploration waits only when none does.
   b. While a try runs, the loader asks ``over_budget`` after every batch: when the try's measured extra
      so far and its reserved way back no longer fit ``left``, the loader ends the part there (``capped``)
      and the policy reverts it, a rejection. So no try can spend more than the run has left, whatever its
      probe let through (a candidate within a noisy probe's loss that is slower for the rest of the epoch).

   A try is thus held by the budget as it runs, not only by its expectation, and the allowance left after
   one is what the run earned, so a drift that needs a cheap move (the thread split, in place) finds it as
   soon as ``left`` covers the move's probe: the probe's floor is ``LOSS`` of a quarter of a part and the
   allowance grows by ``EXPLORE_SHARE`` of each batch's time, so even from a ledger at its bound the move is
   affordable after about 0.8 of a part: at the end of the epoch the drift was seen in, or of the next one
   (a try starts at a part's end). A drift also drops the tries' measured costs (``try_costs``: taken under the old
   conditions; the probe's floor is priced at the new rate), but never the ledger: the seconds spent are
   the run's. Under torch.distributed (the ranks' parts must end together) and without an owned index
   stream (no part ends mid-epoch) nothing ends a try early, and the bound is plus the one try under way.

   A move that only feeds the loader (more workers, prefetch, persistence, pinning, worker threads) is not
   tried while the stall is under ``MIN_GAIN``: removing every wait could not make the epoch as much faster
   as a switch is kept for. For the same reason persistence, which saves no more than the pool's restart an
   epoch, is not tried while the incumbent's measured start-up is under ``MIN_GAIN`` of its latest epoch (of
   a long epoch's part: the restart is then weighed against less than it is spread over, so it is tried sooner;
   the
   phase change of benchmarks/adapt.py: a 0.03 s restart of a 4-10 s epoch, tried first twice and rejected
   twice, where another move was 1.36x faster).
6. ``observe`` mode measures and never moves. A move ``allowed`` refuses (memory, /dev/shm) is skipped;
   a configuration whose workers failed (``crashed``) is never tried again in the run.

The thread split is a move like the others where the main process's threads may move (``threads``: the
main's count standing for a configuration that leaves it unset; None: the user set it, or the recipe
may not touch the process): more threads to the step ("more main threads", "fewer worker threads") or
to the loader ("more worker threads", where the workers are not forked; "fewer main threads"), in the
stall's order, judged by rule 2. The main process's CPU time says which way first when the step never
waits: a main process keeping all its threads busy tries "more main threads" before fewer workers, since
with ``MAX_REJECTIONS`` the move tried late may never be tried. A slow-down that
leaves the main process with under ``STARVED`` of its CPU share per wall second before it (the same
work, fewer cores: a competitor) tries "fewer main threads" first: parallel threads that lose their cores
wait for each other.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.config import LoaderConfig, fork_allows_threads

MIN_GAIN = 0.03  # the least speed-up a switch is kept for, on a log scale (~3%)
MAX_REJECTIONS = 3
DRIFT = 0.15  # a settled incumbent's change that reopens the search (log scale, ~16%)
STALL_HIGH = 0.1  # above: the step waits for the loader
SATURATED = 0.8  # the main's CPU seconds per wall second, per thread it has, from which its threads are all busy
LOSS = 0.06  # the least slow-down a probe is reverted for (log scale, ~6%)
EXPLORE_SHARE = 0.02  # the most of the run's time so far its extra wall time over the incumbent's may be
# A pool's start-up and a switch before this run measured one (rule 5a), assumed on the high side: a forked
# pool's start is a fork and its first batch (tenths of a second or less for benchmarks/adapt.py's workload), a
# spawned one imports torch first (seconds); a switch joins the old pool's workers and makes a loader.
ASSUMED_START_UP = 0.3
ASSUMED_SPAWN_START_UP = 2.0
ASSUMED_SWITCH = 0.1
STARVED = 0.75  # a slow-down with the main's CPU share below this fraction of its share before: cores lost
# (two busy processes on 2 CPUs leave the main's two threads one CPU between them: 1 of its ~1.5 before, where
# its spinning threads keep their CPU time a batch; a heavier step raises the share)
MIN_BATCHES = 4  # an epoch (or part) shorter than this teaches nothing; a probe's least length
PROBE_SHARE = 4  # a candidate's probe: this fraction (1/4) of its epoch, or of a long epoch's part
FEED = frozenset({"more workers", "more prefetch", "persistent workers", "pin memory", "more worker threads"})
MOST_PREFETCH = 8  # the most a move doubles prefetch_factor to (the search's largest)


def probe_batches(size: int) -> int:
    """A candidate's probe in an epoch (or part) of ``size`` batches: a quarter of it, at least MIN_BATCHES."""
    return max(MIN_BATCHES, size // PROBE_SHARE)


def same_pool(a: LoaderConfig, b: LoaderConfig) -> bool:
    """Whether ``b`` runs on ``a``'s loader: only the main process's threads differ."""
    return a.refit(main_threads=None) == b.refit(main_threads=None)


@dataclass(frozen=True)
class EpochObservation:
    """One epoch as the loader measured it."""

    config: LoaderConfig
    batches: int
    seconds: float  # iter() to the end of the epoch
    wait_seconds: float  # inside next(), summed
    first_wait_seconds: float  # the first batch's wait: a new pool's start-up, a reset's refill
    chunk_seconds: tuple[float, ...] = ()  # seconds per batch of each chunk of the epoch, in order
    fresh_pool: bool = False  # this epoch started the workers (a switch, or not persistent)
    main_cpu_seconds: float = 0.0  # the main process's CPU time over the epoch, all its threads (0: unknown)
    probe: bool = False  # a candidate's first part (rule 4): judged for a clear loss only
    overhead_seconds: float = 0.0  # the loader's own wall time outside the clocks since the previous observation
    capped: bool = False  # a try's part the loader ended because it no longer fit the budget (rule 5b)
    mid_epoch: bool = False  # ended at a chunk boundary of its epoch, not at its end: the next part starts there
    span: int = 0  # the batches of the epoch (or long epoch's part) it is a part of (0: its own)

    def then(self, rest: EpochObservation) -> EpochObservation:
        """This probe and the ``rest`` of its epoch (or part) as one observation; the chunks are the rest's,
        of the size the run's noise is measured in."""
        return EpochObservation(config=self.config, batches=self.batches + rest.batches,
                                seconds=self.seconds + rest.seconds,
                                wait_seconds=self.wait_seconds + rest.wait_seconds,
                                first_wait_seconds=self.first_wait_seconds, chunk_seconds=rest.chunk_seconds,
                                fresh_pool=self.fresh_pool,
                                main_cpu_seconds=self.main_cpu_seconds + rest.main_cpu_seconds,
                                overhead_seconds=self.overhead_seconds + rest.overhead_seconds,
                                mid_epoch=rest.mid_epoch, span=rest.span)

    @property
    def start_up_seconds(self) -> float:
        """A fresh pool's start-up: the first batch's wait beyond the mean of the others' (0 without one)."""
        if not self.fresh_pool or self.batches < 2:
            return 0.0
        rest = (self.wait_seconds - self.first_wait_seconds) / (self.batches - 1)
        return max(0.0, self.first_wait_seconds - rest)

    @property
    def steady_seconds_per_batch(self) -> float:
        """Seconds per batch without a fresh pool's start-up, persistent or not: a probe's rate, which a few
        batches would otherwise bury under the start-up a whole epoch amortises."""
        return (self.seconds - self.start_up_seconds) / max(1, self.batches)

    @property
    def stall(self) -> float:
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def seconds_per_batch(self) -> float:
        """The epoch's cost per batch as the next epochs of this configuration would pay it (rule in the
        module docstring): a persistent pool's start-up is paid once; a pool that restarts every epoch pays its
        start-up once in its ``span``, so a part that started it and ended early (a drift) holds the share of
        its batches: over a few batches the whole start-up would read as a slow-down the fixed run does not have,
        and make the next try look faster."""
        if self.config.persistent_workers:
            share = 0.0
        else:
            share = min(1.0, self.batches / self.span) if self.span else 1.0
        return (self.seconds - self.start_up_seconds * (1.0 - share)) / max(1, self.batches)


@dataclass(frozen=True)
class Decision:
    config: LoaderConfig  # the next epoch's
    event: str  # "warm-up", "observe", "measure", "try", "continue", "keep", "revert", "settle", "reopen"
    line: str  # in words, for the log and the record


@dataclass
class _Stats:
    epochs: list[float] = field(default_factory=list)  # seconds per batch, per epoch
    chunks: int = 0  # chunks behind the latest epoch
    stall: float = 0.0
    cpu_share: float = 0.0  # the main process's CPU seconds per wall second in the latest epoch
    cpu_before: float = 0.0  # the same in the epoch before it
    steady: float = 0.0  # the latest epoch's seconds per batch without its fresh pool's start-up
    start_up: float | None = None  # the latest fresh pool's start-up (a non-persistent pool pays it every
    # epoch); None before one was measured


Allowed = Callable[[LoaderConfig], str | None]  # None: the configuration may run; else why not


def _worker_step(n: int) -> int:
    """One worker at a time up to 4, then a quarter of them."""
    return 1 if n < 4 else n // 4


def moves(config: LoaderConfig, stall: float, *, max_workers: int, cuda: bool, first: str | None = None,
          threads: int | None = None, max_threads: int | None = None,
          cpu_share: float = 0.0, starved: bool = False) -> list[tuple[str, LoaderConfig]]:
    """The neighbours of ``config`` worth one epoch, in the order the stall suggests (``first``, the move
    last kept, leads while it still applies). ``threads``: the main process's thread count where
    ``config`` leaves it unset, None where the split may not move; ``max_threads`` (``max_workers``
    unless given): the most either side takes. ``cpu_share``: the main process's CPU seconds per wall
    second; a step that never waits and keeps every thread it has busy (``SATURATED``) is short of
    threads, so "more main threads" leads the moves toward the step; ``starved`` (the main's threads lost
    their cores, ``STARVED``): "fewer main threads" leads all. A step that barely waits may also take the
    loading itself, between its steps: "no workers" from a pool of two or more, where no worker process
    competes for the step's cores (one worker fewer may not show it: the last worker competes as the two
    did; benchmarks/adapt.py's phase change measured 2 and 1 workers alike, none 1.36x faster), right after
    "fewer workers" where the step keeps its threads busy, else after the moves toward the step."""
    max_threads = max_threads or max_workers
    n = config.num_workers
    out: dict[str, LoaderConfig] = {}
    if n and not config.persistent_workers:
        out["persistent workers"] = config.refit(persistent_workers=True)
    more = {}
    if n < max_workers:
        more["more workers"] = config.refit(num_workers=min(max_workers, n + _worker_step(n)),
                                            persistent_workers=config.persistent_workers or not n)
    if n and (config.prefetch_factor or 2) < MOST_PREFETCH:
        more["more prefetch"] = config.refit(prefetch_factor=2 * (config.prefetch_factor or 2))
    if cuda and not config.pin_memory:
        more["pin memory"] = config.refit(pin_memory=True)
    fewer = {}
    if n:
        fewer["fewer workers"] = config.refit(num_workers=n - _worker_step(n))
    if n and (config.prefetch_factor or 2) > 1:
        fewer["less prefetch"] = config.refit(prefetch_factor=max(1, (config.prefetch_factor or 2) // 2))
    if cuda and config.pin_memory:
        fewer["no pinning"] = config.refit(pin_memory=False)
    if threads is not None:
        main = config.main_threads or threads
        if main < max_threads:
            fewer["more main threads"] = config.refit(main_threads=min(max_threads, 2 * main))
        if main > 1:
            more["fewer main threads"] = config.refit(main_threads=max(1, main // 2))
        workers = config.worker_threads or 1
        if n and workers * 2 * n <= max_threads and fork_allows_threads(config.multiprocessing_context, 2):
            more["more worker threads"] = config.refit(worker_threads=2 * workers)
        if workers > 1:
            fewer["fewer worker threads"] = config.refit(worker_threads=max(1, workers // 2))
    if stall > STALL_HIGH:
        out.update(more)
        out.update(fewer)
    else:
        saturated = threads is not None and cpu_share >= SATURATED * main
        if saturated and "more main threads" in fewer:
            out["more main threads"] = fewer.pop("more main threads")
        none = {"no workers": config.refit(num_workers=0)} if n > 1 else {}
        for name, candidate in fewer.items():
            out[name] = candidate
            if name == "fewer workers" and saturated:  # the step is short of cores: see the docstring
                out.update(none)
        out.update(none)  # where it was not placed already (an update keeps a key's place)
        out.update(more)
    ordered = list(out.items())
    lead = "fewer main threads" if starved and "fewer main threads" in out else first
    if lead in out:
        ordered.sort(key=lambda item: item[0] != lead)
    return [(name, c) for name, c in ordered if c != config]


class Policy:
    """The adapting loader's decisions (see the module docstring); ``decide`` once per epoch."""

    def __init__(self, start: LoaderConfig, *, max_workers: int, cuda: bool = False, observe: bool = False,
                 allowed: Allowed | None = None, fixed: frozenset[str] = frozenset(), threads: int | None = None,
                 explore_share: float = EXPLORE_SHARE):
        self.incumbent = start
        self.explore_share = explore_share  # rule 5's bound (1: unbounded)
        self.threads = threads  # the main's thread count for a configuration without one; None: fixed
        self.max_workers = max_workers
        self.cuda = cuda
        self.observe = observe
        self.allowed: Allowed = allowed or (lambda config: None)
        self.fixed = fixed  # what the caller set: never moved
        self.stats: dict[LoaderConfig, _Stats] = {}
        self.trying: tuple[str, LoaderConfig] | None = None
        self.tried: set[LoaderConfig] = set()  # moves rejected from the present incumbent
        self.kept_move: str | None = None
        self.rejections = 0
        self.settled = False
        self.reference: float | None = None  # the settled incumbent's figure
        self.reference_steady = 0.0  # the same without its fresh pool's start-up (``_steady_figure``)
        self.settled_stall = 0.0
        self.epochs = 0
        self._log_chunks: list[float] = []  # each chunk's log seconds per batch less its epoch's mean
        self.skipped: dict[LoaderConfig, str] = {}
        self.failed: dict[LoaderConfig, str] = {}  # configurations whose workers failed: never again
        self.probed: EpochObservation | None = None  # the candidate's probe, while it reads the rest
        self.seen_seconds = 0.0  # the run's wall time so far: every observation and the loader's own time
        self.spent_seconds = 0.0  # rule 5's ledger: the run's measured wall time over the incumbent's
        self.try_costs: dict[str, float] = {}  # the last rejected try's whole cost, by kind ("pool", "threads")
        self.start_up: float | None = None  # the latest fresh pool's start-up, measured (None: not yet)
        self.switch_seconds: float | None = None  # the loader's own time around the latest change of pool
        self.starved = False  # the incumbent's last slow-down left the main short of cores (``STARVED``)
        self._previous: LoaderConfig | None = None  # the configuration of the previous observation
        self._open: tuple[str, float] | None = None  # the try being accounted: its kind, the ledger before it
        self._after_revert = False  # the incumbent's next observation pays its restart (rule 5)
        self._part = 0  # the incumbent's latest epoch (or part), in batches: what a probe is a quarter of
        self._restarted = False  # the incumbent's next part follows a probe's revert (a restarted pool)
        self._epoch_start = True  # the next part starts an epoch (the last observation ended one)
        self._credit = False  # the try's first part is yet to be charged: the fixed run's restart there (rule 5a)

    # ------------------------------------------------------------------ measurements

    def _account(self, obs: EpochObservation, drifted_rest: bool = False) -> None:
        """Rule 5's ledger, from the observation as measured (before it is recorded: the incumbent's figure
        it is charged against is the one before it). ``drifted_rest``: ``obs`` is the rest of an epoch a revert
        gave back, and it left the incumbent's figure (a drift, which the fixed run pays too)."""
        self.seen_seconds += obs.seconds + obs.overhead_seconds
        self.spent_seconds += obs.overhead_seconds  # a fixed loader has no bookkeeping and no switch
        if obs.fresh_pool and obs.config.num_workers:  # a one-batch part (capped): its whole first wait
            self.start_up = obs.start_up_seconds if obs.batches > 1 else obs.first_wait_seconds
        if self._previous is not None and not same_pool(self._previous, obs.config):
            self.switch_seconds = obs.overhead_seconds
        self._previous = obs.config
        incumbent = self.stats.get(self.incumbent)
        rate = incumbent.epochs[-1] if incumbent is not None and incumbent.epochs else None
        if self.trying is not None and obs.config == self.trying[1] and incumbent is not None and rate is not None:
            # its whole wall, its pool's start-up too, over what the fixed run paid from the same point
            self.spent_seconds += obs.seconds - self._fixed(incumbent, obs.batches, restart=self._credit)
            self._credit = False
        elif self._after_revert and obs.config == self.incumbent:
            self._after_revert = False
            if drifted_rest:  # its restart only, which mid-epoch the fixed run does not pay
                self.spent_seconds += obs.start_up_seconds
            elif self._restarted and incumbent is not None and rate is not None:  # the rest a probe gave back
                self.spent_seconds += obs.seconds - self._fixed(incumbent, obs.batches, restart=False)
            else:  # a whole epoch (or part): only its restart is beyond what the fixed run pays
                self.spent_seconds += obs.seconds - obs.seconds_per_batch * obs.batches
            if self._open is not None:
                kind, before = self._open
                self.try_costs[kind] = self.spent_seconds - before
                self._open = None

    def start_up_price(self, config: LoaderConfig) -> float:
        """What starting ``config``'s pool is priced at (rule 5a): this run's measured start-up, else the
        assumed one of its start method; nothing without workers."""
        if not config.num_workers:
            return 0.0
        if self.start_up is not None:
            return self.start_up
        forked = config.multiprocessing_context in (None, "fork")
        return ASSUMED_START_UP if forked else ASSUMED_SPAWN_START_UP

    def switch_price(self) -> float:
        """A change of pool's own time (shut-down, a new loader): measured in this run, else assumed."""
        return ASSUMED_SWITCH if self.switch_seconds is None else self.switch_seconds

    def way_back(self, config: LoaderConfig) -> float:
        """What going back from ``config`` to the incumbent costs beyond the fixed run (rule 5a): nothing on
        the same pool (the threads move in place), else a switch and the incumbent's pool started again."""
        if same_pool(self.incumbent, config):
            return 0.0
        return self.switch_price() + self.start_up_price(self.incumbent)

    def restart_paid(self, epoch_start: bool) -> bool:
        """Whether the fixed run restarts the incumbent's pool where a part starts (rule 5a): at an epoch
        boundary, a pool of workers that is not persistent; never mid-epoch."""
        inc = self.incumbent
        return epoch_start and bool(inc.num_workers) and not inc.persistent_workers

    def price(self, config: LoaderConfig, *, epoch_start: bool | None = None) -> float:
        """A try's costs nothing can stop once they start, beyond what the fixed run would have paid at the
        same point (rule 5a's invariant): the switch there, the new pool's start-up and the way back (a revert
        mid-epoch: a switch, the incumbent's pool started again), less the incumbent's restart the fixed run
        pays there itself (``restart_paid``); nothing for a move of the main's threads alone. ``epoch_start``:
        whether the try starts an epoch (None: where the next part starts, from the last observation)."""
        if same_pool(self.incumbent, config):
            return 0.0
        start = self._epoch_start if epoch_start is None else epoch_start
        paid = self.start_up_price(self.incumbent) if self.restart_paid(start) else 0.0
        return self.switch_price() + self.start_up_price(config) + self.way_back(config) - paid

    def _fixed(self, incumbent: _Stats, batches: int, *, restart: bool) -> float:
        """What the fixed run pays for ``batches`` of the incumbent from a try's point (rule 5a): its restart
        there where ``restart`` (the fixed run's start-up at the epoch boundary the try starts), then its steady
        rate, for a pool that restarts every epoch (whose figure holds its start-up spread over the epoch);
        otherwise its figure a batch."""
        if not self.incumbent.num_workers or self.incumbent.persistent_workers:
            return incumbent.epochs[-1] * batches
        return ((self._pool_start_up() or 0.0) if restart else 0.0) + incumbent.steady * batches

    def _pool_start_up(self) -> float | None:
        """The incumbent's pool's measured start-up: its own, or that of a configuration on the same pool
        (a kept move of the main's threads starts no pool of its own; benchmarks/adapt.py's phase change then
        tried persistence for a restart of 0.02 s an epoch of 10 s, and kept it on noise); None: never measured."""
        own = self.stats[self.incumbent].start_up if self.incumbent in self.stats else None
        if own is not None:
            return own
        return next((s.start_up for c, s in reversed(self.stats.items())
                     if s.start_up is not None and same_pool(c, self.incumbent)), None)

    def left(self, seconds: float = 0.0) -> float:
        """What the budget has left (rule 5), ``seconds`` more of the run counted in."""
        return self.explore_share * (self.seen_seconds + seconds) - self.spent_seconds

    def expected_cost(self, config: LoaderConfig, incumbent: _Stats) -> float:
        """What trying ``config`` from the incumbent is expected to cost in all (rule 5a): its price and its
        probe at the least loss it is reverted for, at least the last rejected try's measured cost of its
        kind (since the last drift)."""
        kind = "threads" if same_pool(self.incumbent, config) else "pool"
        floor = probe_batches(self._part) * incumbent.epochs[-1] * (math.exp(LOSS) - 1) + self.price(config)
        return max(floor, self.try_costs.get(kind, 0.0))

    def over_budget(self, config: LoaderConfig, seconds: float, batches: int, overhead: float = 0.0) -> bool:
        """Rule 5b, asked by the loader after each batch of a part under way: whether the try of ``config``,
        ``batches`` batches in ``seconds`` into its part (``overhead``: the loader's own time before it, not yet
        in the ledger), with its way back, no longer fits the budget. Never outside a try, nor unbounded."""
        if self.trying is None or config != self.trying[1] or self.explore_share >= 1:
            return False
        incumbent = self.stats.get(self.incumbent)
        if incumbent is None or not incumbent.epochs:
            return False
        extra = overhead + seconds - self._fixed(incumbent, batches, restart=self._credit) + self.way_back(config)
        return extra > self.left(seconds + overhead)

    def _record(self, obs: EpochObservation) -> _Stats:
        stats = self.stats.setdefault(obs.config, _Stats())
        stats.epochs.append(obs.seconds_per_batch)
        stats.steady = obs.steady_seconds_per_batch
        if obs.fresh_pool and obs.config.num_workers:
            stats.start_up = obs.start_up_seconds
        stats.stall = obs.stall
        stats.cpu_before = stats.cpu_share
        stats.cpu_share = obs.main_cpu_seconds / obs.seconds if obs.seconds > 0 else 0.0
        if obs.config == self.incumbent:
            self._part = obs.batches
        chunks = [c for c in obs.chunk_seconds if c > 0]
        stats.chunks = max(1, len(chunks))
        if len(chunks) > 1:
            logs = [math.log(c) for c in chunks]
            mean = statistics.fmean(logs)
            self._log_chunks += [v - mean for v in logs]
        return stats

    def noise(self) -> float:
        """The spread of one chunk's log seconds per batch in this run (0 before two chunks)."""
        if len(self._log_chunks) < 2:
            return 0.0
        return math.sqrt(sum(v * v for v in self._log_chunks) / (len(self._log_chunks) - 1))

    def threshold(self, incumbent: _Stats, candidate: _Stats) -> float:
        """The log speed-up a candidate must beat (rule 2)."""
        sigma = self.noise() * math.sqrt(1 / incumbent.chunks + 1 / candidate.chunks)
        own = abs(math.log(incumbent.epochs[-1] / incumbent.epochs[-2])) if len(incumbent.epochs) > 1 else 0.0
        return max(MIN_GAIN, 2 * sigma, own)

    def drifting(self, config: LoaderConfig, steady: float) -> bool:
        """Rule 3's drift seen inside an epoch: ``steady``, the seconds per batch of the incumbent's part under
        way (a part that did not start its pool), left the incumbent's figure (its latest epoch's, or the settled
        reference) by what ``decide`` reopens for: beyond ``DRIFT`` and twice the run's noise. The loader then
        ends the part there, and ``decide`` reopens from it. Never while a move is tried (its parts are judged
        by rules 2, 4 and 5b), nor in observe mode, nor before a measured epoch; the rest of an epoch a revert
        gave back is the incumbent's too (a competitor that started during a try)."""
        if self.observe or self.trying is not None or config != self.incumbent:
            return False
        before = self._steady_figure()
        return before is not None and self._changed(steady, before)

    def _steady_figure(self) -> float | None:
        """The incumbent's figure without its fresh pool's start-up: its latest epoch's, or the settled
        reference (None before a measured epoch). A part's steady rate is held against it, not against the
        figure: a pool that restarts every epoch has its start-up in that, so a part without one would read
        as faster, or its rest after a revert as a drift, where nothing changed."""
        stats = self.stats.get(self.incumbent)
        if stats is None or not stats.epochs:
            return None
        if self.settled and self.reference:
            return self.reference_steady or self.reference
        return stats.steady or stats.epochs[-1]

    def _changed(self, now: float, before: float) -> bool:
        """Rule 3's test: ``now`` left ``before`` (seconds per batch) beyond ``DRIFT`` and twice the run's noise."""
        return now > 0 and before > 0 and abs(math.log(now / before)) > max(DRIFT, 2 * self.noise())

    def crashed(self, config: LoaderConfig, why: str) -> None:
        """``config``'s workers failed where the incumbent's did not: the loader is back on the incumbent,
        and ``config`` is never tried again (a rejection)."""
        self.failed[config] = why
        if self.trying is not None and self.trying[1] == config:
            self.trying, self.probed, self._credit = None, None, False
            self.rejections += 1
            self._after_revert = True  # the incumbent's pool restarts (the failed part is the loader's own time)

    def restart_from(self, config: LoaderConfig) -> None:
        """Go on from ``config`` (a resumed state's): its epochs are the incumbent's, nothing is being tried."""
        self.incumbent, self.trying, self.probed = config, None, None
        self._open, self._after_revert, self._restarted, self._credit = None, False, False, False

    # ------------------------------------------------------------------ decisions

    def decide(self, obs: EpochObservation) -> Decision:
        self.epochs += 1
        # the rest of an epoch a revert gave back is not the incumbent's figure, unless it drifted (rule 3)
        rest = self._restarted and obs.config == self.incumbent and not self.observe
        before = self._steady_figure() if rest else None
        drifted_rest = before is not None and self._changed(obs.steady_seconds_per_batch, before)
        self._account(obs, drifted_rest)
        self._epoch_start = not obs.mid_epoch
        if self.epochs == 1 and not self.observe:  # rule 1: its figure would be the incumbent's noise
            self.stats.setdefault(obs.config, _Stats()).stall = obs.stall
            self._part = obs.batches
            return Decision(self.incumbent, "warm-up", "the first epoch warms up (files, caches, workers)")
        if self.trying is not None and obs.config == self.trying[1]:
            if obs.capped and not self.observe:
                return self._capped(obs)
            if obs.probe:
                return self._probe(obs)
            if self.probed is not None:
                obs, self.probed = self.probed.then(obs), None
        self._restarted = False
        if rest and not drifted_rest:  # a restarted pool's part, not the incumbent's figure
            return self._next_move(self.stats[self.incumbent])
        stats = self._record(obs)
        if drifted_rest:
            assert before is not None
            self.settled = False
            line = self._conditions_changed(stats, before, obs.steady_seconds_per_batch)
            decision = self._next_move(self.stats[self.incumbent])
            return Decision(decision.config, "reopen", f"{line}; {decision.line}")
        if self.observe:
            return Decision(obs.config, "observe", f"{obs.seconds_per_batch * 1e3:.2f} ms a batch, stall "
                                                   f"{obs.stall:.0%}: observed")
        if self.trying is not None and obs.config == self.trying[1]:
            return self._judge(stats)
        if obs.config != self.incumbent:  # an epoch of something else (a resumed state's): measured only
            return Decision(self.incumbent, "revert", f"back to {self.incumbent.describe()}")
        if self.settled:
            return self._watch(stats)
        drifted = self._drifted(stats)
        if drifted:
            decision = self._next_move(self.stats[self.incumbent])
            return Decision(decision.config, "reopen", f"{drifted}; {decision.line}")
        return self._next_move(stats)

    def _drifted(self, incumbent: _Stats) -> str | None:
        """Rule 3's drift, before settling too: the incumbent's latest epoch against its previous one. The
        moves rejected so far were judged under the conditions before (a competitor that starts, a step
        that grows), so they may be tried again, and the incumbent's figure starts from the new one;
        without this a run settling on the first slow epoch took it for the reference and never reopened."""
        if len(incumbent.epochs) < 2:
            return None
        now, before = incumbent.epochs[-1], incumbent.epochs[-2]
        if not self._changed(now, before):
            return None
        return self._conditions_changed(incumbent, before, now)

    def _conditions_changed(self, incumbent: _Stats, before: float, now: float) -> str:
        """Rule 3, once a drift is seen (``now`` against ``before``, seconds per batch): what was judged under
        the old conditions goes (the rejections, the moves tried and skipped, the tries' costs; the ledger
        stays: the seconds spent are the run's), the incumbent's figure starts from its latest epoch, and
        whether the slow-down starved the main process of its cores says which move leads."""
        self.rejections, self.tried, self.skipped, self.try_costs = 0, set(), {}, {}
        self.starved = self._starved(incumbent, before)
        self.stats[self.incumbent] = dataclasses.replace(incumbent, epochs=incumbent.epochs[-1:], cpu_before=0.0)
        return f"conditions changed: {now * 1e3:.2f} ms a batch against {before * 1e3:.2f} before"

    @staticmethod
    def _starved(incumbent: _Stats, before: float) -> bool:
        """Whether the incumbent's latest epoch, slower than ``before``, left its main process under
        ``STARVED`` of the CPU share per wall second it had the epoch before: the same work on fewer cores
        (a competitor), where a heavier step would have raised it."""
        return bool(incumbent.epochs[-1] > before > 0 and 0 < incumbent.cpu_share < STARVED * incumbent.cpu_before)

    def _probe(self, obs: EpochObservation) -> Decision:
        """Rule 4: the candidate's first part, reverted where clearly slower."""
        assert self.trying is not None
        name, config = self.trying
        incumbent = self.stats[self.incumbent]
        now, before = obs.steady_seconds_per_batch, incumbent.epochs[-1]
        loss = math.log(now / before)
        own = abs(math.log(incumbent.epochs[-1] / incumbent.epochs[-2])) if len(incumbent.epochs) > 1 else 0.0
        need = max(LOSS, 3 * self.noise() * math.sqrt(1 / incumbent.chunks + 1), own)
        figures = (f"{now * 1e3:.2f} vs {before * 1e3:.2f} ms a batch over its first {obs.batches} batches "
                   f"({math.exp(loss):.3f}x slower, reverted beyond {math.exp(need):.3f}x)")
        if loss <= need:
            self.probed = obs
            return Decision(config, "continue", f"{name}: {figures}: goes on")
        self.trying, self._restarted, self._after_revert = None, True, True
        return self._rejected(name, config, figures)

    def _capped(self, obs: EpochObservation) -> Decision:
        """Rule 5b: the try's part ended where its extra and its way back no longer fit the budget; reverted
        there (a rejection: it cost more than the run could pay), the incumbent takes the rest of the epoch."""
        assert self.trying is not None
        name, config = self.trying
        self.trying, self.probed, self._restarted, self._after_revert = None, None, True, True
        figures = (f"over its budget after {obs.batches} batches ({self.spent_seconds:.2f} s spent of "
                   f"{self.explore_share:.0%} of {self.seen_seconds:.2f} s)")
        return self._rejected(name, config, figures)

    def _rejected(self, name: str, config: LoaderConfig, figures: str) -> Decision:
        self.tried.add(config)
        self.rejections += 1
        if self.rejections >= MAX_REJECTIONS:
            self._settle()
            return Decision(self.incumbent, "settle", f"{name}: {figures}: reverted; settled after "
                                                      f"{self.rejections} rejections")
        return Decision(self.incumbent, "revert", f"{name}: {figures}: reverted")

    def _judge(self, candidate: _Stats) -> Decision:
        """Rule 2 on the candidate's whole epoch (or part). A kept move's epoch is the new
        incumbent's latest figure, so the next move is chosen from it at once: an epoch of the new incumbent
        before the next try would measure again what was just measured, one epoch a step (benchmarks/adapt.py's
        phase change from a far recipe walked 2 workers, 1, none, an epoch of each between its tries)."""
        assert self.trying is not None
        name, config = self.trying
        self.trying = None
        incumbent = self.stats[self.incumbent]
        gain = math.log(incumbent.epochs[-1] / candidate.epochs[-1])
        need = self.threshold(incumbent, candidate)
        figures = (f"{candidate.epochs[-1] * 1e3:.2f} vs {incumbent.epochs[-1] * 1e3:.2f} ms a batch "
                   f"({math.exp(gain):.3f}x, needed {math.exp(need):.3f}x)")
        if gain > need:
            beaten, self.incumbent, self.kept_move, self.rejections = self.incumbent, config, name, 0
            # the configuration just beaten beyond the noise is not tried back until conditions change (a drift
            # clears ``tried``): the competitor's runs spent what was left of their budget on it (capped after
            # 5-34 batches at up to 14x) before the move that paid could be afforded
            self.tried, self._open, self.starved = {beaten}, None, False
            self.spent_seconds = max(0.0, self.spent_seconds)  # rule 5: a kept move's gain is not banked
            following = self._next_move(candidate)
            return Decision(following.config, "keep", f"{name}: {figures}: kept; {following.line}")
        self._after_revert = True
        return self._rejected(name, config, figures)

    def _next_move(self, incumbent: _Stats) -> Decision:
        if self.rejections >= MAX_REJECTIONS and incumbent.epochs:  # rejections a crash ended (``crashed``)
            self._settle()
            return Decision(self.incumbent, "settle", f"settled after {self.rejections} rejections")
        threads = None if "main_threads" in self.fixed else self.threads
        waiting: str | None = None  # the most promising move the budget cannot pay for yet
        for name, config in moves(self.incumbent, incumbent.stall, max_workers=self.max_workers, cuda=self.cuda,
                                  first=self.kept_move, threads=threads, cpu_share=incumbent.cpu_share,
                                  starved=self.starved):
            ran = self._as_run(config)
            if any(self._as_run(c) == ran for c in (*self.tried, *self.skipped, *self.failed)) or any(
                    getattr(config, k) != getattr(self.incumbent, k) for k in self.fixed):
                continue
            if name in FEED and incumbent.stall < MIN_GAIN:  # rule 5: no wait worth removing
                continue
            start_up = self._pool_start_up()
            if name == "persistent workers" and start_up is not None and incumbent.epochs and (
                    start_up < MIN_GAIN * incumbent.epochs[-1] * self._part):
                continue  # rule 5: a restart it would save is under the least gain a switch is kept for
            why = self.allowed(config)
            if why is not None:
                self.skipped[config] = why
                continue
            expected = self.expected_cost(config, incumbent)
            left = self.left()
            if self.explore_share < 1 and expected > left:  # rule 5: the next affordable move goes first
                waiting = waiting or f"{name} would cost {expected:.2f} s"
                continue
            self.trying, self._credit = (name, config), self.restart_paid(self._epoch_start)
            self._open = ("threads" if same_pool(self.incumbent, config) else "pool", self.spent_seconds)
            return Decision(config, "try", f"trying {name}: {config.describe()}")
        if waiting is not None:  # none affordable: the run has to grow first
            return Decision(self.incumbent, "measure",
                            f"exploration waits: {waiting}, {max(0.0, self.left()):.2f} s of its "
                            f"{self.explore_share:.0%} of {self.seen_seconds:.2f} s left")
        self._settle()
        return Decision(self.incumbent, "settle", "settled: no move left to try")

    def _as_run(self, config: LoaderConfig) -> LoaderConfig:
        """``config`` as it runs: a count of main threads that is the one the process has (``threads``) is the
        configuration that leaves it unset, so "fewer main threads" from 4 back to the process's 2 is the
        configuration a kept "more main threads" beat, not a new one."""
        if self.threads is not None and config.main_threads == self.threads:
            return config.refit(main_threads=None)
        return config

    def _settle(self) -> None:
        self.settled = True
        self.reference = self.stats[self.incumbent].epochs[-1]
        self.reference_steady = self.stats[self.incumbent].steady
        self.settled_stall = self.stats[self.incumbent].stall

    def _watch(self, incumbent: _Stats) -> Decision:
        assert self.reference is not None
        now = incumbent.epochs[-1]
        change = abs(math.log(now / self.reference))
        crossed = (incumbent.stall > STALL_HIGH) != (self.settled_stall > STALL_HIGH)
        if change > max(DRIFT, 2 * self.noise()) or crossed:
            self.settled = False
            self._conditions_changed(incumbent, self.reference, now)
            decision = self._next_move(self.stats[self.incumbent])
            why = (f"{now * 1e3:.2f} ms a batch against {self.reference * 1e3:.2f} when settled" if not crossed
                   else f"the stall is now {incumbent.stall:.0%}")
            return Decision(decision.config, "reopen", f"reopened: {why}; {decision.line}")
        return Decision(self.incumbent, "measure", f"settled: {now * 1e3:.2f} ms a batch")

