"""The search plans its trials within the job's memory budget (tuner/_memory_plan.py), in memory: fake budgets,
exact exclusions and messages; the search loop never starts a candidate over the budget; and the processes
autotune starts for trials are the OOM killer's first choice (machine/_oom.py), read back from /proc."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from autotune.config import DEFAULT, LoaderConfig
from autotune.errors import AutotuneError
from autotune.machine._oom import EXPENDABLE, oom_kills, oom_score_adj
from autotune.tuner._candidates import Limits, build_space
from autotune.tuner._memory_plan import MemoryTooSmall, TrialMemory, fit_space
from autotune.tuner._space import Space

MIB = 1 << 20
# A trial forked from the forkserver, with no workers, adds 16 MiB heap + 4 MiB dataset + 2 batches of 10 MiB = 40
# MiB (the server's 100 MiB interpreter is resident before the budget is read, and shared); a trial spawned for a
# preloaded allocator holds an interpreter of its own: 140 MiB. A forked worker at prefetch 1: 10 + 16 = 26 MiB; a
# spawned one adds an interpreter and the dataset: 130 MiB.
MEMORY = TrialMemory(budget=200 * MIB, interpreter=100 * MIB, heap=16 * MIB, dataset=4 * MIB, batch_bytes=10 * MIB,
                     available=429 * MIB, limit_text="the cgroup memory limit of 700.0 MiB (test)")
SPACE = Space(max_workers=8, contexts=("fork", "forkserver", "spawn"), prefetch_factors=(1, 2, 4, 8))


def test_the_need_of_each_kind_of_trial():
    assert MEMORY.need(DEFAULT) == 40 * MIB
    # spawned: an interpreter of its own; and tcmalloc keeps what it frees: without workers, four batches
    assert MEMORY.need(LoaderConfig(allocator="tcmalloc")) == 140 * MIB + 2 * 10 * MIB
    assert MEMORY.need(LoaderConfig(allocator="jemalloc")) == 140 * MIB  # spawned; returns what it frees
    assert MEMORY.need(LoaderConfig(allocator="glibc-tuned")) == 60 * MIB  # forked from the server; keeps four
    assert MEMORY.need(LoaderConfig(num_workers=3, prefetch_factor=1)) == 40 * MIB + 3 * 26 * MIB
    assert MEMORY.need(LoaderConfig(num_workers=1, prefetch_factor=8)) == 40 * MIB + 96 * MIB
    assert MEMORY.need(LoaderConfig(num_workers=1, prefetch_factor=1, multiprocessing_context="spawn")) == 170 * MIB
    # forkserver workers: each a fresh interpreter, and their server once
    assert MEMORY.need(LoaderConfig(num_workers=2, prefetch_factor=1,
                                    multiprocessing_context="forkserver")) == 40 * MIB + 2 * 130 * MIB + 100 * MIB
    assert MEMORY.need(DEFAULT, cache_bytes=50 * MIB) == 90 * MIB
    assert replace(MEMORY, ranks=2).need(DEFAULT, cache_bytes=50 * MIB) == 180 * MIB  # every rank's own


def test_a_cache_built_before_the_first_epoch_counts_its_builds_workers_not_the_loaders():
    """The build's forked workers hold their heap and their samples in flight; the loader's workers start after
    it; the peak is the larger phase. 1 MiB samples, 2 build workers: a disk build holds 20 MiB (heap, dataset)
    + 32 MiB (a received chunk of 16 samples and their unpickled copies) + 2 x (16 + 48) MiB (three chunks in
    flight each) = 180 MiB, and its writer's beside them (hdf5: 2 x 16 rows; lmdb: 2 x 64 MiB of one
    transaction; pickle: its 1 MiB buffer and a record); a memory build 20 + 16 (the schema's head) + 2 x
    (16 + 1) = 70 MiB, beside its cache."""
    built = replace(MEMORY, sample_bytes=MIB, build_workers=2)
    assert built.need(LoaderConfig(cache="hdf5")) == 212 * MIB
    assert built.need(LoaderConfig(cache="lmdb", num_workers=4, prefetch_factor=1)) == 308 * MIB  # > 40 + 4 x 26
    assert built.need(LoaderConfig(cache="pickle", num_workers=6, prefetch_factor=1)) == 196 * MIB  # training's
    assert built.need(LoaderConfig(cache="pickle")) == 182 * MIB
    assert built.need(LoaderConfig(cache="memory"), cache_bytes=50 * MIB) == 70 * MIB + 50 * MIB
    # with a loader's worker, its main process warms no batches (machine._warm_heap): 70 MiB, above training's 66
    assert built.need(LoaderConfig(cache="memory", allocator="glibc-tuned", num_workers=1, prefetch_factor=1,
                                   multiprocessing_context="fork"), cache_bytes=50 * MIB) == 120 * MIB  # no warm
    # a cache the first epoch fills has no build: the loader's workers are the trial's
    assert built.need(LoaderConfig(cache="hdf5", cache_fill="first_epoch")) == 40 * MIB
    assert built.need(LoaderConfig()) == 40 * MIB
    # on one CPU the trial builds alone, a chunk at a time
    assert replace(built, build_workers=0).need(LoaderConfig(cache="hdf5")) == 68 * MIB  # 20 + 16 + 32 > 40
    assert replace(built, build_workers=0).need(LoaderConfig(cache="pickle")) == 40 * MIB  # 20 + 16 + 2 < 40
    assert replace(built, budget=212 * MIB).over_budget(LoaderConfig(cache="hdf5")) is None
    assert replace(built, budget=212 * MIB - 1).over_budget(LoaderConfig(cache="hdf5")) == (
        "not tried: it would hold ~212.0 MiB, over the memory budget of 212.0 MiB (the cgroup memory limit of "
        "700.0 MiB (test))")


def test_an_lmdb_build_counts_the_transaction_its_writer_holds_in_the_main_process():
    """lmdb's writer keeps up to ``_TXN_BYTES`` (64 MiB) of records for one transaction and the transaction copies
    them into its dirty pages before the commit: with 1 MiB samples and 2 forked build workers, 20 + 32 + 2 x
    (16 + 48) = 180 MiB as any disk build, and 2 x 64 MiB beside it; a build of fewer samples than a transaction
    holds them twice (40 samples: 2 x 40 MiB); under tcmalloc, 145 (spawned) + 5 x 16 + 128 + 2 x (30 + 64)."""
    from autotune.caches import LmdbCache
    from autotune.caches._lmdb import _TXN_BYTES
    from autotune.tuner._runner import ForkCharges

    built = replace(MEMORY, sample_bytes=MIB, build_workers=2)
    assert _TXN_BYTES == 64 * MIB
    assert LmdbCache.build_held(MIB, None) == LmdbCache.build_held(MIB, 96) == 128 * MIB
    assert built.need(LoaderConfig(cache="lmdb")) == (180 + 128) * MIB
    assert replace(built, build_samples=96).need(LoaderConfig(cache="lmdb")) == (180 + 128) * MIB
    assert replace(built, build_samples=40).need(LoaderConfig(cache="lmdb")) == (180 + 80) * MIB
    assert replace(built, build_workers=0).need(LoaderConfig(cache="lmdb")) == (20 + 16 + 128) * MIB
    spawned = replace(built, tracker=11 * MIB, build_context="fork",
                      spawned=lambda _: ForkCharges(interpreter=130 * MIB, forked=30 * MIB, tracker=11 * MIB))
    assert spawned.need(LoaderConfig(cache="lmdb", allocator="tcmalloc")) == (
        145 + 80 + 128 + 2 * (30 + 64)) * MIB
    assert spawned.need(LoaderConfig(cache="lmdb", allocator="jemalloc")) == (145 + 32 + 128 + 2 * (30 + 48)) * MIB


def test_a_trials_resource_tracker_is_counted_once_per_trial_and_never_per_worker():
    """Every trial starts its own resource tracker (tuner/_runner.py), an exec'd interpreter the guard counts whole
    (machine.tree_memory): 6 MiB (this machine's: 6 MiB forked, 11 MiB with tcmalloc preloaded) once per trial, in
    both phases, whatever its workers, and once per rank."""
    tracked = replace(MEMORY, tracker=6 * MIB)
    assert tracked.need(DEFAULT) == 46 * MIB
    assert tracked.need(LoaderConfig(allocator="jemalloc")) == 146 * MIB
    assert tracked.need(LoaderConfig(num_workers=3, prefetch_factor=1)) == 46 * MIB + 3 * 26 * MIB
    assert tracked.worker("fork", 1) == MEMORY.worker("fork", 1) == 26 * MIB
    built = replace(tracked, sample_bytes=MIB, build_workers=2)
    assert built.need(LoaderConfig(cache="hdf5")) == 218 * MIB  # the build's 212 and the tracker beside it
    assert replace(tracked, ranks=2).need(DEFAULT) == 92 * MIB
    assert replace(tracked, budget=46 * MIB - 1).over_budget(DEFAULT) == (
        "not tried: it would hold ~46.0 MiB, over the memory budget of 46.0 MiB (the cgroup memory limit of "
        "700.0 MiB (test))")


def test_a_preloaded_trial_is_planned_from_the_figures_measured_spawned_under_its_preload():
    """A trial of a preloaded allocator is spawned under its preload, not forked (tuner/_runner.py): its own
    process, its resource tracker and each child forked from it are the figures of a probe spawned so (here 130,
    11 and 30 MiB), asked once per allocator and only for such a trial; every other trial keeps the forked ones."""
    from autotune.tuner._runner import ForkCharges

    asked: list[str] = []

    def spawned(allocator: str) -> ForkCharges:
        asked.append(allocator)
        return ForkCharges(interpreter=130 * MIB, forked=30 * MIB, tracker=11 * MIB)

    measured = replace(MEMORY, tracker=6 * MIB, spawned=spawned)
    assert measured.need(DEFAULT) == 46 * MIB  # forked: 16 + 4 + 6 + 2 x 10, as without the probe
    assert measured.need(LoaderConfig(allocator="glibc-tuned")) == 66 * MIB
    assert measured.need(LoaderConfig(num_workers=2, prefetch_factor=1, multiprocessing_context="spawn")) == (
        46 * MIB + 2 * (10 + 16 + 100 + 4) * MIB)
    assert asked == []  # no preloaded trial planned: nothing spawned
    # its own 130 + the dataset's 4 + its tracker's 11, and 4 batches (tcmalloc keeps what it frees) or 2
    assert measured.need(LoaderConfig(allocator="tcmalloc")) == 145 * MIB + 4 * 10 * MIB
    assert measured.need(LoaderConfig(allocator="jemalloc")) == 145 * MIB + 2 * 10 * MIB
    # its forked workers are children of the spawned trial (30 each), its spawned ones preloaded interpreters
    assert measured.need(LoaderConfig(num_workers=2, prefetch_factor=1, allocator="jemalloc")) == (
        165 * MIB + 2 * (10 + 30) * MIB)
    assert measured.need(LoaderConfig(num_workers=1, prefetch_factor=1, multiprocessing_context="forkserver",
                                      allocator="jemalloc")) == 165 * MIB + (10 + 30 + 130 + 4) * MIB + 130 * MIB
    # a disk build forked from it: 145 + 2 chunks + 2 x (30 + 3 chunks) under jemalloc; tcmalloc keeps 5 and 4;
    # hdf5's writer holds 2 x 16 rows beside them, pickle's its buffer and a record
    built = replace(measured, sample_bytes=MIB, build_workers=2, build_context="fork")
    assert built.need(LoaderConfig(cache="hdf5", allocator="jemalloc")) == (145 + 32 + 32 + 2 * (30 + 48)) * MIB
    assert built.need(LoaderConfig(cache="hdf5", allocator="tcmalloc")) == (145 + 80 + 32 + 2 * (30 + 64)) * MIB
    assert replace(built, ranks=2).need(LoaderConfig(cache="pickle", allocator="jemalloc")) == (
        2 * (145 + 32 + 2 + 2 * (30 + 48)) * MIB)
    assert built.started(LoaderConfig(allocator="tcmalloc")).tracker == 11 * MIB
    assert built.started(DEFAULT) is built
    assert asked == ["tcmalloc", "jemalloc", "jemalloc", "jemalloc", "jemalloc", "tcmalloc", "jemalloc", "tcmalloc"]


def test_the_spawned_figures_are_measured_once_per_allocator_and_stand_in_where_no_probe_starts(monkeypatch):
    """``SpawnedCharges`` spawns one probe per allocator for the search and keeps its figures; where none can be
    spawned, the forked figures stand in with the interpreter the spawned trial holds on top of them."""
    from autotune.tuner import _runner
    from autotune.tuner._runner import ForkCharges, SpawnedCharges

    spawned: list[str] = []

    def probe(config: LoaderConfig) -> ForkCharges:
        spawned.append(config.allocator)
        if config.allocator == "jemalloc":
            raise RuntimeError("the spawned memory probe did not start in time")
        return ForkCharges(interpreter=170, forked=38, tracker=12)

    monkeypatch.setattr(_runner, "spawn_charges", probe)
    figures = SpawnedCharges(ForkCharges(interpreter=149, forked=47, tracker=7))
    assert [figures("tcmalloc"), figures("tcmalloc"), figures("jemalloc"), figures("jemalloc")] == [
        ForkCharges(170, 38, 12), ForkCharges(170, 38, 12), ForkCharges(196, 47, 7), ForkCharges(196, 47, 7)]
    assert spawned == ["tcmalloc", "jemalloc"]


@pytest.mark.timeout(180)
def test_a_probe_spawned_under_the_preload_measures_what_the_plan_holds_for_such_a_trial():
    """Real processes: the search's plan for a tcmalloc trial is built from a probe spawned under tcmalloc (its own
    process, its tracker, its forked child), measured once, and not from the forkserver's figures."""
    from workloads import Numbers

    from autotune.dataset._userfile import UserSpec
    from autotune.process import get_allocator
    from autotune.tuner._memory_plan import KEPT_BATCHES_IN_MAIN
    from autotune.tuner._preparation import trial_memory

    why = get_allocator("tcmalloc").unavailable()
    if why:
        pytest.skip(f"tcmalloc {why}")
    memory = trial_memory(UserSpec(dataset=Numbers(8), source="<test>", batch_size=4, epochs=1), batch_bytes=64,
                          ranks=1, max_memory=300 * MIB)
    config = LoaderConfig(allocator="tcmalloc")
    assert memory.spawned is not None
    charges = memory.spawned("tcmalloc")
    assert memory.spawned("tcmalloc") is charges  # kept for the search
    started = memory.started(config)
    assert (started.interpreter, started.heap, started.tracker) == (charges.interpreter, charges.forked,
                                                                    charges.tracker)
    assert memory.need(config) == charges.interpreter + memory.dataset + charges.tracker + KEPT_BATCHES_IN_MAIN * 64
    # a fresh interpreter holds torch; its tracker an interpreter without it; a forked child its collection's writes
    assert charges.tracker < charges.forked < charges.interpreter
    assert 0 < charges.tracker


def test_an_allocator_that_keeps_what_it_frees_holds_the_main_processs_peak_without_workers():
    """Without workers the main process collates each batch from its samples while the last one is consumed; glibc
    unmaps each freed 36.8 MiB batch, tcmalloc and glibc-tuned keep them (measured: 148 and 147-155 MiB over the
    process's start against 74 under glibc), so the plan holds KEPT_BATCHES_IN_MAIN batches for those. With workers
    the main process receives its batches in shared memory, which no allocator keeps: the two of any trial."""
    from autotune.process import get_allocator
    from autotune.tuner._memory_plan import BATCHES_IN_MAIN, KEPT_BATCHES_IN_MAIN

    assert (BATCHES_IN_MAIN, KEPT_BATCHES_IN_MAIN) == (2, 4)
    assert [name for name in ("glibc", "glibc-tuned", "tcmalloc", "jemalloc") if get_allocator(name).keeps_freed] == [
        "glibc-tuned", "tcmalloc"]
    assert TrialMemory.main_batches(LoaderConfig(allocator="tcmalloc")) == 4
    assert TrialMemory.main_batches(LoaderConfig(allocator="glibc-tuned")) == 4
    assert TrialMemory.main_batches(LoaderConfig(allocator="jemalloc")) == TrialMemory.main_batches(DEFAULT) == 2
    worked = LoaderConfig(num_workers=1, prefetch_factor=1, allocator="tcmalloc")
    assert TrialMemory.main_batches(worked) == 2
    assert MEMORY.need(worked) == 140 * MIB + 26 * MIB  # the spawned trial, its two batches and a forked worker
    assert MEMORY.need(LoaderConfig(num_workers=1, prefetch_factor=1, allocator="glibc-tuned")) == 40 * MIB + 26 * MIB
    # a build phase holds chunks, not batches: the larger phase counts, the training's now 20 + 4 x 10 = 60 MiB
    built = replace(MEMORY, sample_bytes=MIB, build_workers=2)
    # a disk build keeps freed chunks too: 20 + 5 x 16 (KEPT_CHUNKS_IN_MAIN) + 2 x (16 + 4 x 16) = 260 MiB, not 180,
    # and hdf5's writer its 2 x 16 rows
    assert built.need(LoaderConfig(cache="hdf5", allocator="glibc-tuned")) == 292 * MIB
    # a memory build: 70 MiB and the two batches its main process makes resident meanwhile (20), above training's 60
    assert built.need(LoaderConfig(cache="memory", allocator="glibc-tuned"), cache_bytes=50 * MIB) == 140 * MIB
    assert replace(built, build_workers=0).need(LoaderConfig(cache="pickle", allocator="glibc-tuned")) == 60 * MIB


def test_fit_space_cuts_workers_and_start_methods_with_a_note_each():
    fitted, notes = fit_space(SPACE, MEMORY)
    assert fitted == replace(SPACE, max_workers=6, contexts=("fork", "spawn"))  # 40 + 6 x 26; 40 + 130
    assert notes == [
        "memory: start method forkserver left out: each worker is a fresh interpreter and a server (~130.0 MiB), "
        "which does not fit the budget of 200.0 MiB",
        "memory: num_workers at most 6 (of 8): each worker holds ~26.0 MiB (its prefetched batches and heap), "
        "within the budget of 200.0 MiB (the cgroup memory limit of 700.0 MiB (test)); a configuration beyond "
        "it is not tried",
    ]


def test_its_neighbours_a_roomy_budget_cuts_nothing_and_a_byte_less_cuts_one_worker():
    roomy = replace(MEMORY, budget=64 << 30)
    assert fit_space(SPACE, roomy) == (SPACE, [])
    exact = replace(MEMORY, budget=40 * MIB + 6 * 26 * MIB)  # the sixth worker fits to the byte
    assert fit_space(SPACE, exact)[0].max_workers == 6
    assert fit_space(SPACE, replace(exact, budget=exact.budget - 1))[0].max_workers == 5
    # one spawned worker fits to the byte (40 + 130): spawn stays, forkserver (and its server) does not
    fitted, _ = fit_space(SPACE, replace(MEMORY, budget=170 * MIB))
    assert fitted.contexts == ("fork", "spawn") and fitted.max_workers == 5
    fitted, _ = fit_space(SPACE, replace(MEMORY, budget=170 * MIB - 1))
    assert fitted.contexts == ("fork",)
    # no worker fits at all: the space is the default's, the start methods left as they were (never asked)
    fitted, notes = fit_space(SPACE, replace(MEMORY, budget=50 * MIB))
    assert fitted.max_workers == 0 and fitted.contexts == SPACE.contexts
    assert notes == ["memory: num_workers at most 0 (of 8): each worker holds ~26.0 MiB (its prefetched batches "
                     "and heap), within the budget of 50.0 MiB (the cgroup memory limit of 700.0 MiB (test)); a "
                     "configuration beyond it is not tried"]


def test_not_even_the_default_fits_is_one_line_naming_the_limit_what_is_available_and_the_fix():
    small = replace(MEMORY, budget=39 * MIB, available=200 * MIB)
    with pytest.raises(MemoryTooSmall) as caught:
        fit_space(SPACE, small)
    assert isinstance(caught.value, AutotuneError) and caught.value.exit_code == 2
    assert str(caught.value) == (
        "Not even the smallest trial (num_workers=0, no cache) fits this job's memory: the cgroup memory limit "
        "of 700.0 MiB (test) leaves 200.0 MiB available to the search, whose budget of 39.0 MiB is below the "
        "~40.0 MiB a trial adds to it (its dataset, heap and 2 batches of 10.0 MiB). "
        "Raise the memory limit by at least ~1.0 MiB (or --max-memory), or search with a smaller batch size.")
    # nothing left at all: the job must grow until 70% of what is left holds the trial (40 / 0.7 = 57.1 MiB)
    empty = str(MemoryTooSmall(replace(small, budget=0, available=0).too_small()))
    assert "leaves 0 B available to the search, whose budget of 0 B is below the ~40.0 MiB" in empty
    assert "Raise the memory limit by at least ~57.1 MiB (or --max-memory)" in empty
    assert fit_space(SPACE, replace(small, budget=40 * MIB))[0].max_workers == 0  # the default to the byte fits


def test_over_budget_names_the_need_and_the_budget():
    assert MEMORY.over_budget(LoaderConfig(num_workers=3, prefetch_factor=1)) is None
    assert MEMORY.over_budget(LoaderConfig(num_workers=3, prefetch_factor=8)) == (
        "not tried: it would hold ~328.0 MiB, over the memory budget of 200.0 MiB (the cgroup memory limit of "
        "700.0 MiB (test))")
    assert MEMORY.over_budget(DEFAULT, cache_bytes=161 * MIB) is not None  # a memory cache of the whole run counts
    assert MEMORY.over_budget(DEFAULT, cache_bytes=160 * MIB) is None
    assert "(2 ranks together)" in (replace(MEMORY, ranks=2).over_budget(DEFAULT, cache_bytes=70 * MIB) or "")


def test_build_space_applies_the_plan_and_notes_it():
    from test_search_core import _setup

    probe = _setup().probe
    limits = Limits(usable_cpus=8, memory_budget=MEMORY.budget, disk_free=10**12, caches=("none",),
                    allocators=("glibc",), trial_memory=MEMORY)
    space = build_space(probe, limits)
    assert space.max_workers == 6
    assert sum(n.startswith("memory: num_workers at most 6 (of 8)") for n in limits.notes) == 1
    with pytest.raises(MemoryTooSmall):
        build_space(probe, replace(limits, trial_memory=replace(MEMORY, budget=MIB), notes=[]))


def test_the_search_never_starts_a_candidate_over_the_budget(tmp_path):
    """The loop asks the plan before every trial: a combination the space could not cut (many workers at a
    large prefetch, a memory cache) is failed with its reason, never handed to the runner."""
    from test_search_core import FakeRunner, _opts, _setup, _spec

    from autotune.tuner._study import search

    space = Space(max_workers=3, contexts=("fork",), prefetch_factors=(1, 8), caches=(None, "memory"),
                  allocators=("glibc",))
    setup = _setup(space)
    # the probe's memory cache of the whole run: 1000 samples of 100 B, far below the budget
    setup.limits.trial_memory = MEMORY
    runner = FakeRunner()
    outcome = search(_spec(), _opts(tmp_path, max_trials=24), setup=setup, runner=runner)
    assert runner.calls and all(MEMORY.need(c) <= MEMORY.budget for c in runner.calls)
    refused = [r for r in outcome.failed if r.startswith("not tried: it would hold ~")]
    assert refused, outcome.failed  # prefetch 8 with 2 or 3 workers was drawn and refused
    assert any(n.startswith(f"memory limits this job: {len(refused)} candidate(s) not tried, e.g. ")
               for n in outcome.notes), outcome.notes


def test_a_trial_and_its_forkserver_are_the_oom_killers_first_choice_and_the_search_is_not_changed():
    from autotune.tuner import _runner

    before = oom_score_adj()
    if before is None:
        pytest.skip("no /proc/self/oom_score_adj here")
    _runner.warm_forkserver()
    server = _runner.forkserver_pid()
    assert server is not None and oom_score_adj(server) == EXPENDABLE
    deadline = time.monotonic() + 120  # its preload imported, it waits for requests: the plan's measured figure
    while _runner.waiting_forkserver() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _runner.waiting_forkserver() == server
    assert oom_score_adj() == before  # the search's own process (the user's, under autotune.search) untouched
    assert isinstance(oom_kills(), int)
    assert os.getpid() != server


def test_the_search_keeps_no_copy_of_the_workload_it_hands_its_trials(tmp_path):
    """The workload is pickled straight into a private file the trials read: the runner holds its path, not its
    bytes (an in-memory dataset's size); the file is in a folder of its own, named as trial folders are, which
    goes with the runner; one a killed search left is removed by the next runner."""
    import gc
    import pickle
    from pathlib import Path

    from autotune.caches._own import is_own, mark
    from autotune.caches._trials import _host, is_leftover
    from autotune.tuner._measure import Workload
    from autotune.tuner._runner import Runner

    dead = tmp_path / "work" / f"trial-{_host()}-999999999-abc"  # a search killed outright left it
    dead.mkdir(parents=True)
    mark(str(dead), "trial")
    workload = Workload(dataset=list(range(100_000)), batch_size=8, epochs=1)
    runner = Runner(workload, spool=tmp_path / "work")
    assert not dead.exists()
    path = runner.workload_file
    assert path is not None and os.path.dirname(os.path.dirname(path)) == str(tmp_path / "work")
    folder = Path(os.path.dirname(path))
    assert is_own(folder) and folder.name.startswith(f"trial-{_host()}-{os.getpid()}-")
    assert not is_leftover(folder)  # this search is alive
    assert os.stat(path).st_mode & 0o077 == 0  # this user's alone
    with open(path, "rb") as f:
        assert pickle.load(f).dataset == workload.dataset
    assert not any(isinstance(v, bytes) and len(v) > 1000 for v in vars(runner).values())
    del runner
    gc.collect()
    assert not os.path.exists(path) and not folder.exists()


def _in_a_tree_forked_from_a_server(trial: Callable[[np.ndarray], object]) -> object:
    """Run ``trial(held)`` in a process forked from a "forkserver" holding 120 MiB of touched private pages
    (``held``, numpy-filled in place so no temporary stays in the heap), and return what it returned (a repr
    through a pipe: the test process's own heap is not in the tree)."""
    read, write = os.pipe()
    server = os.fork()
    if server == 0:
        try:
            held = np.full(120 * MIB, 115, dtype=np.uint8)
            pid = os.fork()
            if pid == 0:
                try:
                    os.write(write, repr(trial(held)).encode())
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        text = fh.read()
    os.waitpid(server, 0)
    return eval(text)  # noqa: S307 - our own repr


def _sleepers(count: int) -> list[int]:
    """``count`` forked children that only wait (DataLoader workers that share what their parent holds)."""
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    return pids


def test_what_a_forked_tree_adds_is_its_own_pages_not_the_ones_it_shares_with_its_server():
    """``machine.tree_memory``, the one figure the plan, the runner's guard and the trial's peak count: a tree
    forked from a server that holds 120 MiB adds nothing for them, though its PSS counts 3/4 of them; what it
    allocates, and the server's pages it copies, it adds whole. Real processes, read from /proc."""
    from autotune.machine import tree_memory

    def trial(held: np.ndarray) -> list[tuple[int, int]]:
        workers = _sleepers(2)
        figures = [tree_memory(forked_from=os.getppid())]
        own = np.full(40 * MIB, 116, dtype=np.uint8)
        figures.append(tree_memory(forked_from=os.getppid()))
        held[:20 * MIB] = 99  # copies 20 MiB of the server's pages
        figures.append(tree_memory(forked_from=os.getppid()))
        figures.append(tree_memory())  # nothing named: the PSS, shared pages and all
        for worker in workers:
            os.kill(worker, 9)
        del own
        return [tuple(f) for f in figures]

    (pss0, added0), (pss1, added1), (_, added2), (pss3, added3) = _in_a_tree_forked_from_a_server(trial)
    assert pss0 >= 80 * MIB  # three of the four sharers of the server's 120 MiB
    assert added0 < 12 * MIB  # a Python process's own pages, none of the server's
    assert 40 * MIB <= added1 - added0 < 44 * MIB
    assert 20 * MIB <= added2 - added1 < 24 * MIB
    assert added3 == pss3 >= pss1


def test_the_heap_is_measured_by_a_probe_forked_from_the_resident_forkserver():
    """No constant: the heap of a trial and of each forked worker is what a probe forked from the trials'
    forkserver adds once it has run (the guard's accounting), and the plan's cuts follow it."""
    from workloads import Numbers

    from autotune.dataset._userfile import UserSpec
    from autotune.tuner._preparation import trial_memory
    from autotune.tuner._runner import forkserver_pid, waiting_forkserver

    memory = trial_memory(UserSpec(dataset=Numbers(8), source="<test>", batch_size=4, epochs=1), batch_bytes=64,
                          ranks=1, max_memory=300 * MIB)
    # the probe waited for the server's imports: it is back asleep in its poll (a read right after the probe ends
    # may catch it reaping the probe, so read until it sleeps)
    server = forkserver_pid()
    assert server is not None
    for _ in range(100):
        if waiting_forkserver() == server:
            break
        time.sleep(0.05)
    assert waiting_forkserver() == server
    assert 0 < memory.heap < memory.interpreter  # a fork writes a part of the interpreter it shares
    # the probe started its own resource tracker, as a trial does: a small interpreter without torch, counted apart
    assert 0 < memory.tracker < memory.heap
    assert memory.need(DEFAULT) == memory.heap + memory.tracker + memory.dataset + 2 * 64
    assert memory.need(LoaderConfig(num_workers=2, prefetch_factor=2)) == memory.need(DEFAULT) + 2 * (memory.heap + 128)
    # the cut follows the measured heap: at 47 MiB (this machine's probe) two of the test space's workers fit
    assert fit_space(SPACE, replace(MEMORY, heap=47 * MIB))[0].max_workers == 2  # 47 + 4 + 20 + 2 x 57 = 185 of 200
    assert fit_space(SPACE, replace(MEMORY, heap=16 * MIB))[0].max_workers == 6


def test_a_memory_probe_whose_search_stopped_first_exits_quietly(capfd):
    """The search can stop (its budget ran out while the dataset was read, a signal) before it measures the
    probe it forked: the probe then finds its pipe closed and exits 0 without a traceback."""
    import multiprocessing

    from autotune.tuner._runner import _probe_main

    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=True)
    receiver.close()  # the search is gone
    proc = ctx.Process(target=_probe_main, args=(sender,))
    proc.start()
    sender.close()
    proc.join(30)
    assert proc.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err


def test_an_execd_process_in_a_forked_tree_takes_nothing_off_what_the_tree_adds():
    """A trial's tree holds processes that were exec'd, not forked (its resource tracker, a spawned worker): they
    map none of the server's pages, so they must not take a server's share off the tree's figure. Here the
    trial makes 40 MiB before forking two workers (shared among the three: in no USS) and starts a fresh
    interpreter; what the tree adds still holds the 40 MiB."""
    import subprocess
    import sys

    from autotune.machine import tree_memory

    def trial(held: np.ndarray) -> int:
        own = np.full(40 * MIB, 116, dtype=np.uint8)
        workers = _sleepers(2)
        fresh = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(1.0)  # the fresh interpreter has started
        added = tree_memory(forked_from=os.getppid()).added
        fresh.kill()
        for worker in workers:
            os.kill(worker, 9)
        del own
        return added

    added = _in_a_tree_forked_from_a_server(trial)
    assert isinstance(added, int) and added >= 40 * MIB, added


@pytest.mark.timeout(180)
@pytest.mark.parametrize("config", [LoaderConfig(cache="pickle"), LoaderConfig(cache="hdf5", allocator="tcmalloc"),
                                    LoaderConfig(cache="pickle", allocator="jemalloc"), LoaderConfig(cache="lmdb"),
                                    LoaderConfig(cache="lmdb", allocator="jemalloc"),
                                    LoaderConfig(cache="lmdb", allocator="tcmalloc")],
                         ids=["pickle-forked", "hdf5-tcmalloc-spawned", "pickle-jemalloc-spawned", "lmdb-forked",
                              "lmdb-jemalloc-spawned", "lmdb-tcmalloc-spawned"])
def test_a_trial_the_plan_admits_is_never_stopped_by_the_guard_held_to_its_plan(config, tmp_path):
    """The invariant end to end, real processes: a trial whose guard budget is exactly its planned need (the figures
    measured as a search measures them) runs to its end, and what its run holds is within it. A disk cache built
    before the first epoch on two workers, forked from the server or spawned for a preloaded allocator: its build's
    workers were fresh interpreters there (each importing torch again, ~150 MiB over the plan's), which the guard
    stopped (the benchmark's 617-622 MiB over a 607 MiB budget)."""
    from pathlib import Path

    from workloads import Megabytes

    from autotune.dataset._userfile import UserSpec
    from autotune.process import get_allocator
    from autotune.tuner._measure import Plan, Workload
    from autotune.tuner._preparation import trial_memory
    from autotune.tuner._runner import Runner

    why = get_allocator(config.allocator).unavailable()
    if why:
        pytest.skip(f"{config.allocator} {why}")
    dataset, batch = Megabytes(96), 8
    memory = trial_memory(UserSpec(dataset=dataset, source="<test>", batch_size=batch, epochs=1),
                          batch_bytes=batch * MIB, ranks=1, max_memory=None, sample_bytes=MIB, build_workers=2)
    need = memory.need(config)
    assert need == memory.started(config)._build(config) > memory.need(DEFAULT)  # the build's phase is the peak planned
    runner = Runner(Workload(dataset=dataset, batch_size=batch, epochs=1), [str(Path(__file__).parent)],
                    memory_limit=need, spool=tmp_path / "work")
    plan = Plan(indices=list(range(96)), length=96, epochs_measured=1, cache_root=str(tmp_path / "trials"),
                build_workers=2)
    result = runner.run(config, plan, timeout=150)  # TrialFailed ("used ..., over the memory budget") if stopped
    assert 0 < result.charged_bytes <= need


def test_the_plans_memory_cache_is_the_samples_the_run_stores_as_the_factory_estimates_them():
    """One estimate of a memory cache: the plan counts the ``partial_count`` samples a share stores, as the
    factory's fit does (recipe/_memory_fit.py), not the whole cache's bytes times the share."""
    from autotune.config import cache_backend, partial_count
    from autotune.recipe._memory_fit import _cache_need
    from autotune.tuner._memory_plan import memory_cache_bytes

    for share in (None, 0.02, 0.39):
        config = LoaderConfig(cache="memory", cache_share=share)
        count = 10_000 if share is None else partial_count(share, 10_000)
        assert memory_cache_bytes(config, 602_112, 10_000) == _cache_need("memory", 602_112, count) == int(
            cache_backend("memory").estimate_need(602_112, count)[0])
    assert memory_cache_bytes(LoaderConfig(cache="pickle"), 602_112, 10_000) == 0  # on disk: none in memory
