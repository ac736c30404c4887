"""Which values of each knob this machine and this dataset allow, with a reason for each left out."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from autotune.config import cache_backend
from autotune.dataset._probe import Probe
from autotune.machine._memory import format_bytes
from autotune.recipe._allocator import ALLOCATORS, availability
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
    notes: list[str] = field(default_factory=list)


def disk_free(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(folder).free


def cache_choices(probe: Probe, limits: Limits) -> tuple[str | None, ...]:
    """None (no cache) plus every backend whose estimated need fits, each exclusion noted."""
    if limits.caches is not None and not [c for c in limits.caches if c != "none"]:
        return (None,)
    from autotune.caches import backend_names, estimate_need

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

    wanted = ALLOCATORS if limits.allocators is None else limits.allocators
    have = availability()
    out = []
    for name in wanted:
        if have.get(name) is None:
            out.append(name)
        else:
            limits.notes.append(f"allocator {name} left out: {have[name]}")
    return tuple(out) or ("glibc",)


def build_space(probe: Probe, limits: Limits) -> Space:
    cpus = max(1, limits.usable_cpus)
    max_workers = limits.max_workers if limits.max_workers is not None else cpus
    threads = tuple(range(1, cpus + 1))
    # The main process's intra-op threads matter with or without a train_step: decode and collate run
    # there with num_workers=0, and its OpenMP threads compete with the workers for the same cores.
    main_threads = (None, *threads) if cpus > 1 else ()
    caches = cache_choices(probe, limits)
    return Space(
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
    )
