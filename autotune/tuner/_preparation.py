"""Everything a search decides before its first trial: the machine, the dataset's probe, the limits, the
space, the measured subset, the files to evict, the batch size in bytes, and what the user is told."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune._units import format_bytes
from autotune.caches import default_root
from autotune.config import DEFAULT
from autotune.dataset import (
    UserSpec,
    check_sharding,
    epoch_state_warning,
    guarded,
    is_stream,
    local_shard_files,
    shard_count,
    stream_length,
)
from autotune.dataset._probe import Probe, probe_dataset, probe_indices, probe_stream
from autotune.machine import (
    JobMemory,
    SourceFiles,
    build_workers,
    job_memory,
    process_uss,
    shm_free,
    source_files,
    usable_cpus,
)
from autotune.machine import _hardware as hardware
from autotune.tuner._candidates import Limits, build_space, disk_free
from autotune.tuner._measure import Plan, Workload
from autotune.tuner._memory_plan import TrialMemory
from autotune.tuner._options import Clock, SearchOptions
from autotune.tuner._runner import ForkCharges, SpawnedCharges, fork_charges, search_start_method
from autotune.tuner._space import Space


@dataclass
class Setup:
    hardware: dict[str, Any]
    probe: Probe
    limits: Limits
    space: Space
    plan: Plan
    workload: Workload
    batch_bytes: int
    shm_free: int | None
    trial_seconds: float
    ranks: int = 1  # training processes per node, measured together (memory budget and /dev/shm shared)


def subset_size(probe: Probe, batch_size: int, seconds: float, step_seconds: float = 0.0) -> int:
    """About ``seconds`` of default loading and training (``step_seconds`` per batch), in whole batches, at
    least four batches, at most everything."""
    wanted = int(seconds / max(probe.sample_seconds + step_seconds / batch_size, 1e-6))
    count = max(min(probe.length, 4 * batch_size), min(probe.length, wanted))
    if count < probe.length:
        count = max(batch_size, count // batch_size * batch_size)
    return count


def stream_subset(probe: Probe, batch_size: int, seconds: float) -> int:
    """Samples a stream's measured epoch reads: about ``seconds`` of default loading in whole batches, at
    least four batches, at most its known length."""
    wanted = int(seconds / max(probe.sample_seconds, 1e-6))
    count = max(4 * batch_size, wanted) // batch_size * batch_size
    return min(count, probe.length) if probe.length_known else count


def prepare(spec: UserSpec, opts: SearchOptions, clock: Clock | None = None) -> Setup:
    """Every read of the user's data here runs under the search's deadline (``dataset/_watchdog.py``): a read
    that hangs, or preparation outliving the promise, is one line naming the read and exit 2. Preparation
    and the default's trial are what any answer needs, so both may run to the wall (the budget plus the
    finalists' share ``--help`` states), as the first trial does: a small budget on a loaded machine still
    measures the default instead of ending in exit 2."""
    clock = clock or opts.clock()
    with guarded(clock.wall, clock.read_allowance):
        if is_stream(spec.dataset):
            return prepare_stream(spec, opts, clock)
        return _prepare_map_style(spec, opts)


class _Counter:
    """A file that keeps only the count of the bytes written to it."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return len(data)


def pickled_size(value: object) -> int:
    """The bytes of ``value``'s pickle, without holding them (a dataset held in memory pickles to its size);
    0 where it cannot be pickled (trials then fork from this process and share its pages)."""
    counter = _Counter()
    try:
        pickle.Pickler(counter, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception:  # noqa: BLE001 - an unpicklable dataset: the runner's fork fallback
        return 0
    return counter.size


def trial_memory(spec: UserSpec, batch_bytes: int, ranks: int, max_memory: int | None, *, sample_bytes: float = 0,
                 build_workers: int = 0, build_samples: int = 0) -> TrialMemory:
    """The figures a trial's memory is planned from (``_memory_plan``), measured here (``fork_charges``, which
    waits until the trials' forkserver holds its imports): the server's own memory (a fresh interpreter), what
    a process forked from it adds once it has run (the plan's heap of a trial and of each forked worker), the
    dataset as a trial unpickles it, and the budget: 70% of what the job has left with the server resident, or
    ``--max-memory``. Where no probe can be forked, this process's own memory bounds both figures.
    ``build_samples``: the most a trial's cache build stores (its subset), for the backends' writers."""
    try:
        charges = fork_charges()
    except (OSError, EOFError, RuntimeError, ValueError):
        charges = ForkCharges(interpreter=process_uss(), forked=process_uss())
    memory = job_memory()
    return TrialMemory(budget=max_memory or memory.budget(), interpreter=charges.interpreter,
                       heap=charges.forked, dataset=pickled_size(spec.dataset), batch_bytes=batch_bytes,
                       ranks=ranks, available=memory.available, limit_text=memory.describe_limit(),
                       sample_bytes=int(sample_bytes), build_workers=build_workers, build_samples=build_samples,
                       tracker=charges.tracker,
                       build_context=search_start_method(), spawned=SpawnedCharges(charges))


def _prepare_map_style(spec: UserSpec, opts: SearchOptions) -> Setup:
    hw = hardware.collect(ranks_per_node=opts.ranks_per_node)
    probe = probe_dataset(spec, seed=opts.seed)
    stateful = epoch_state_warning(spec.dataset)
    ranks = max(1, opts.ranks_per_node)
    builders = build_workers(usable_cpus(1))  # as the factory builds: with the node's CPUs, in any rank
    trial_seconds = opts.default_trial_seconds
    count = subset_size(probe, spec.batch_size, trial_seconds, probe.step_seconds)
    memory = trial_memory(spec, probe.batch_bytes, ranks, opts.max_memory, sample_bytes=probe.sample_bytes,
                          build_workers=builders, build_samples=count)  # a trial's cache holds its subset at most
    limits = Limits(
        usable_cpus=usable_cpus(ranks),
        memory_budget=memory.budget,  # the node's: its N ranks' trials are checked together
        disk_free=disk_free(opts.workdir, default_root()),
        # With N ranks, workers per rank may go up to the node's CPUs: the N ranks' loaders are measured
        # competing for them, so the measurement, not a division by N, decides.
        max_workers=opts.max_workers if opts.max_workers is not None or ranks == 1 else usable_cpus(1),
        caches=opts.caches,
        allocators=opts.allocators,
        stateful=stateful is not None,
        ranks=ranks,
        process_memory=memory.need(DEFAULT) // ranks,  # a trial's own, beside a cache (tuner/_memory_plan.py)
        trial_memory=memory,
    )
    if stateful:
        limits.notes.append(stateful)
    if not opts.max_memory:
        _note_limit(limits, available=memory.available)
    space = build_space(probe, limits)
    indices = list(range(probe.length)) if count >= probe.length else probe_indices(probe.length, count, opts.seed)
    sources = source_files(spec.dataset, indices, probe.length, opts.data_dir)
    _note_sources(sources, limits)
    plan = Plan(
        indices=indices,
        length=probe.length,
        seed=opts.seed,
        batch_timeout=opts.trial_timeout or max(60.0, 20 * trial_seconds),
        cache_root=str(Path(opts.workdir) / "cache" / "trials"),
        build_workers=builders,
        files=sources.files,
        cold_every_epoch=sources.cold_every_epoch,
    )
    workload = Workload(dataset=spec.dataset, batch_size=spec.batch_size, epochs=spec.epochs,
                        collate_fn=spec.collate_fn, transform=spec.transform, train_step=spec.train_step,
                        fingerprint=probe.fingerprint)
    if ranks > 1:
        limits.notes.append(f"{ranks} ranks per node: each candidate runs as {ranks} processes at once, each on "
                            f"its own shard; the figure is the slowest rank's; memory and /dev/shm are shared; "
                            f"workers per rank are tried up to the node's {limits.max_workers} CPUs; a disk "
                            f"cache is built once, in a folder the {ranks} ranks share, and read by all, a "
                            f"memory cache once in every rank (counted {ranks} times in the memory budget)")
    return Setup(hw, probe, limits, space, plan, workload, probe.batch_bytes, shm_free(), trial_seconds, ranks)


def with_subset(setup: Setup, spec: UserSpec, opts: SearchOptions, count: int) -> Setup:
    """``setup`` measuring ``count`` samples instead: a study shared by several searches keeps the subset the
    first one chose (its size comes from a timing, which differs a little between nodes and runs)."""
    probe = setup.probe
    count = max(1, min(int(count), probe.length))
    if count == len(setup.plan.indices):
        return setup
    indices = list(range(probe.length)) if count >= probe.length else probe_indices(probe.length, count, opts.seed)
    sources = source_files(spec.dataset, indices, probe.length, opts.data_dir)
    plan = replace(setup.plan, indices=indices, files=sources.files, cold_every_epoch=sources.cold_every_epoch)
    limits = setup.limits
    if limits.trial_memory is not None:  # a trial's cache build stores the new subset at most
        limits = replace(limits, trial_memory=replace(limits.trial_memory, build_samples=count))
    return replace(setup, plan=plan, limits=limits)


def _note_limit(limits: Limits, memory: JobMemory | None = None, available: int | None = None) -> None:
    """Say where the memory budget comes from when a limit, not the host, sets it (``available``: what the
    plan found left, ``trial_memory``)."""
    memory = memory or job_memory()
    if memory.limit is not None:
        left = memory.available if available is None else available
        limits.notes.append(f"memory budget: {format_bytes(limits.memory_budget)}, 70% of the "
                            f"{format_bytes(left)} {memory.describe_limit()} leaves this job once the "
                            "search and its trial server hold their imports")


def _note_sources(sources: SourceFiles, limits: Limits) -> None:
    if sources.files:
        every = " every epoch: the data does not fit in the page cache" if sources.cold_every_epoch else ""
        limits.notes.append(
            f"cold reads: {len(sources.files)} source file(s) ({sources.how}, ~{format_bytes(sources.total_bytes)} "
            f"for the whole dataset) are evicted from the page cache before the first epoch{every}"
        )
    else:
        limits.notes.append(f"cold reads: no source files to evict ({sources.how}); every epoch is measured warm")


def prepare_stream(spec: UserSpec, opts: SearchOptions, clock: Clock) -> Setup:
    """A stream (IterableDataset): the same search over workers, prefetch, persistence, pinning, start
    method, threads and allocator, measured on the stream's first batches in its own order. The sharding
    check runs first: a stream that hands every worker all its data is refused before any trial."""
    hw = hardware.collect(ranks_per_node=opts.ranks_per_node)
    known = spec.samples_per_epoch or stream_length(spec.dataset)
    probe = probe_stream(spec, known)
    memory = trial_memory(spec, probe.batch_bytes, max(1, opts.ranks_per_node), opts.max_memory)
    limits = Limits(
        usable_cpus=usable_cpus(opts.ranks_per_node),
        memory_budget=memory.budget,
        trial_memory=memory,
        disk_free=disk_free(opts.workdir, default_root()),
        max_workers=opts.max_workers,
        caches=("none",),
        ranks=max(1, opts.ranks_per_node),
        allocators=opts.allocators,
    )
    limits.notes.append(
        "caches left out: a stream is read in its own order (its shuffle buffer, its shard order), and a cache "
        "would replay one recorded pass every epoch, freezing that order"
    )
    not_checked = check_sharding(spec.dataset, timeout=min(opts.trial_timeout or 120.0,
                                                            max(1.0, clock.left(clock.wall))))
    if not_checked:
        limits.notes.append(not_checked)
    shards = shard_count(spec.dataset)
    if shards is not None:
        cap = limits.max_workers if limits.max_workers is not None else limits.usable_cpus
        if shards < cap:
            limits.max_workers = shards
            limits.notes.append(f"num_workers at most {shards}: the stream has {shards} shard(s), and a worker "
                                "beyond them would get no data (Hugging Face) or fail (webdataset)")
    space = build_space(probe, limits)
    trial_seconds = opts.default_trial_seconds
    count = stream_subset(probe, spec.batch_size, trial_seconds)
    if not probe.length_known:
        probe = replace(probe, length=count)
        limits.notes.append(
            f"the stream has no length: an epoch is taken to be the {count} samples measured; pass "
            "--samples-per-epoch (samples_per_epoch=) to extrapolate to the real epoch"
        )
    if opts.data_dir is not None:
        sources = source_files(spec.dataset, [], probe.length, opts.data_dir)
    else:
        shard_files = local_shard_files(spec.dataset)
        sources = SourceFiles(tuple(sorted(shard_files)), "webdataset shards" if shard_files else
                              "a stream: pass --data-dir", sum(os.path.getsize(f) for f in shard_files))
    _note_sources(sources, limits)
    plan = Plan(
        indices=list(range(count)),
        length=probe.length,
        seed=opts.seed,
        batch_timeout=opts.trial_timeout or max(60.0, 20 * trial_seconds),
        cache_root=str(Path(opts.workdir) / "cache" / "trials"),
        files=sources.files,
        cold_every_epoch=sources.cold_every_epoch,
        stream=True,
    )
    workload = Workload(dataset=spec.dataset, batch_size=spec.batch_size, epochs=spec.epochs,
                        collate_fn=spec.collate_fn, transform=spec.transform, train_step=spec.train_step,
                        fingerprint=probe.fingerprint)
    return Setup(hw, probe, limits, space, plan, workload, probe.batch_bytes, shm_free(), trial_seconds,
                 opts.ranks_per_node)
