"""Which values of each knob this machine and this dataset allow, with a reason for each left out."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from autotune._units import format_bytes
from autotune.caches import backend_names, estimate_need
from autotune.config import cache_backend
from autotune.dataset import Probe
from autotune.process import DEFAULT_ALLOCATOR, get_allocator, searched_allocators
from autotune.tuner._memory_plan import TrialMemory, fit_space
from autotune.tuner._space import Space, start_methods


@dataclass
class Limits:
    usable_cpus: int
    memory_budget: int  # for the node's ranks together
    disk_free: int
    max_workers: int | None = None
    caches: tuple[str, ...] | None = None  # the user's --caches; None means every backend
    allocators: tuple[str, ...] | None = None
    stateful: bool = False  # per-epoch state that persistent workers would freeze
    ranks: int = 1  # training processes per node, each with its own memory cache
    process_memory: int = 0  # what a trial's process holds besides a cache (the search's own, as an estimate)
    notes: list[str] = field(default_factory=list)
    cache_shares: tuple[float, ...] = ()  # set by cache_choices: a partial memory cache's shares, if any
    trial_memory: TrialMemory | None = None  # what a trial costs in memory, measured (None: not planned)


def disk_free(*folders: Path) -> int:
    """The free space a disk cache may use: the least of the folders it is written in (the trials' caches
    under the work folder, the factory's under the cache root), each measured at its nearest existing folder
    (nothing is created to look)."""
    free = []
    for folder in folders:
        existing = Path(folder).absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free.append(shutil.disk_usage(existing).free)
    return min(free)


SHARE_STEP = 0.01  # partial memory caches are offered in 1% steps (a 1.2 GiB job holds ~10% of 6 GB)


def partial_shares(whole: int, limits: Limits) -> tuple[float, ...]:
    """The shares of the dataset a memory cache of ``whole`` bytes may hold within the budget, with room
    for the trial's own process: the largest that fits and half of it (the estimate of the process's own
    memory is rough, and a candidate over the budget fails), in ``SHARE_STEP`` steps; () when none fits."""
    room = limits.memory_budget / max(1, limits.ranks) - limits.process_memory
    if whole <= 0 or room <= 0:
        return ()
    steps = math.floor(min(1.0, room / whole) / SHARE_STEP + 1e-9)
    shares = {round(n * SHARE_STEP, 4) for n in (steps, steps // 2) if 0 < n < round(1 / SHARE_STEP)}
    return tuple(sorted(shares, reverse=True))


def cache_choices(probe: Probe, limits: Limits) -> tuple[str | None, ...]:
    """None (no cache) plus every backend whose estimated need fits, each exclusion noted."""
    if limits.caches is not None and not [c for c in limits.caches if c != "none"]:
        return (None,)
    wanted = backend_names() if limits.caches is None else tuple(c for c in limits.caches if c != "none")
    if not probe.deterministic:
        limits.notes.append(f"caches left out: {probe.determinism_note}")
        return (None,)
    choices: list[str | None] = [None]
    for name in wanted:
        ram, disk = estimate_need(name, probe.sample_bytes, probe.length)
        ranks = max(1, limits.ranks)
        if ram * ranks > limits.memory_budget:
            # Every rank holds its own memory cache of the whole dataset: N copies in the node's budget.
            need = (f"needs ~{format_bytes(ram)} of RAM" if ranks == 1 else
                    f"needs ~{format_bytes(ram)} of RAM in each of the node's {ranks} ranks, "
                    f"~{format_bytes(ram * ranks)} together")
            shares = partial_shares(ram, limits) if cache_backend(name).in_memory else ()
            if shares:
                limits.cache_shares = shares
                choices.append(name)
                limits.notes.append(
                    f"cache {name} of the whole dataset left out: {need}, over the budget of "
                    f"{format_bytes(limits.memory_budget)} (--max-memory); a memory cache of the first "
                    f"{' or '.join(f'{s:.0%}' for s in shares)} of the samples is tried instead, the rest "
                    "read from the source")
                continue
            limits.notes.append(
                f"cache {name} left out: {need}, over the budget of "
                f"{format_bytes(limits.memory_budget)} (--max-memory)"
            )
        elif disk > limits.disk_free * 0.9:
            limits.notes.append(
                f"cache {name} left out: needs ~{format_bytes(disk)} of disk, {format_bytes(limits.disk_free)} free"
            )
        else:
            choices.append(name)
    return tuple(choices)


def allocator_choices(limits: Limits) -> tuple[str, ...]:
    """The allocators the search tries (the user's, or every registered one the family marks ``searched``)
    that this machine has, each left out noted; the plain one where none is left."""
    wanted = searched_allocators() if limits.allocators is None else limits.allocators
    out = []
    for name in wanted:
        reason = get_allocator(name).unavailable()
        if reason is None:
            out.append(name)
        else:
            limits.notes.append(f"allocator {name} left out: {reason}")
    return tuple(out) or (DEFAULT_ALLOCATOR,)


def build_space(probe: Probe, limits: Limits) -> Space:
    cpus = max(1, limits.usable_cpus)
    max_workers = limits.max_workers if limits.max_workers is not None else cpus
    threads = tuple(range(1, cpus + 1))
    # The main process's intra-op threads matter with or without a train_step: decode and collate run
    # there with num_workers=0, and its OpenMP threads compete with the workers for the same cores.
    main_threads = (None, *threads) if cpus > 1 else ()
    caches = cache_choices(probe, limits)
    space = Space(
        max_workers=max_workers,
        contexts=start_methods(),
        cuda=torch.cuda.is_available(),
        worker_threads=threads,
        main_threads=main_threads,
        persistent=(False,) if limits.stateful else (False, True),
        caches=caches,
        cache_fills=("build", "first_epoch") if any(caches) else ("build",),
        # Each rank's first epoch reads only its shard: a node's shared disk cache would never be whole.
        filled_caches=tuple(c for c in caches if c and (cache_backend(c).in_memory or max(1, limits.ranks) == 1)),
        allocators=allocator_choices(limits),
        cache_shares=limits.cache_shares if any(c and cache_backend(c).in_memory for c in caches) else (),
    )
    if limits.trial_memory is None:
        return space
    space, notes = fit_space(space, limits.trial_memory)  # MemoryTooSmall when not even the default fits
    limits.notes.extend(notes)
    return space
