"""The heap of a loader's batches made resident while a memory cache's build workers decode.

Invariant: where a loader without workers gathers its batches in this process and the allocator keeps
what it frees, a memory cache built by workers leaves two batches' worth of heap resident, so epoch 1's
first batches take pages already there (as every later epoch's do), and the cache is exactly as built
without it. Anything else (workers that gather, a disk cache, an allocator that returns memory, no
batch size, a build in this process) is left as it was."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

import autotune.loader._source as source
from autotune.caches import MemoryCache
from autotune.caches._codec import samples_equal
from autotune.config import LoaderConfig
from autotune.loader import FactorySite, prepare_source
from autotune.machine import build_workers

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
fork_only = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")


class Rows(Dataset):
    """``n`` samples: a float tensor of ``width`` values from the index, and the index as its label."""

    def __init__(self, n: int = 40, width: int = 1000):
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.arange(self.width, dtype=torch.float32) + i, i


# A child that raises glibc's thresholds (as glibc-tuned does), then writes two 38 MB batches alive at
# once and counts the minor faults that costs, after warm_heap of the same two blocks or without it.
FAULTS = r"""
import json, resource, sys
import numpy as np
from autotune.process._allocator import apply_mallopt
from autotune.machine import warm_heap
assert apply_mallopt()
size = 38 << 20
if sys.argv[1] == "warm":
    warm_heap([size], copies=2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.empty(size, dtype=np.uint8); a.fill(1)
b = np.empty(size, dtype=np.uint8); b.fill(1)
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["faults"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and ru_minflt as on Linux")
def test_warm_heap_leaves_the_batches_pages_resident_under_a_keeping_allocator():
    cold, warm = _faults("cold"), _faults("warm")
    # fresh: at least one fault per huge page (numpy asks for them; 32 MiB on a 16 KiB-page arm64), thousands
    # where there are none (1005-1516 here); warmed: a stray fault or two (1 here)
    assert cold >= 2 * (38 << 20) // (32 << 20)
    assert warm <= max(4, cold // 10) < cold


@fork_only
def test_the_build_calls_meanwhile_once_while_its_workers_decode():
    seen: list[tuple[list[int], int]] = []
    data = Rows()
    others = set(multiprocessing.active_children())  # another test's processes in this pytest worker
    cache = MemoryCache.build(data, range(len(data)), manifest={}, progress=False, workers=2,
                              meanwhile=lambda rows: seen.append((rows, len(set(multiprocessing.active_children())
                                                                                  - others))))
    assert seen == [([4000, 8], 2)]  # one sample's columns: 1000 float32, one int64; both workers alive
    assert all(samples_equal(cache[i], data[i]) for i in range(len(data)))


def test_a_build_in_this_process_never_calls_meanwhile():
    called: list[list[int]] = []
    MemoryCache.build(Rows(), range(40), manifest={}, progress=False, workers=0, meanwhile=called.append)
    assert called == []


@fork_only
def test_a_failing_meanwhile_ends_the_build_and_leaves_no_worker():
    def boom(rows: list[int]) -> None:
        raise MemoryError("no room for the batches")

    others = set(multiprocessing.active_children())
    with pytest.raises(MemoryError, match="no room for the batches"):
        MemoryCache.build(Rows(), range(40), manifest={}, progress=False, workers=2, meanwhile=boom)
    assert set(multiprocessing.active_children()) - others == set()


@pytest.mark.parametrize(("config", "kept_batch", "warms"), [
    (LoaderConfig(num_workers=0, cache="memory"), 8, True),
    (LoaderConfig(num_workers=0, cache="memory"), None, False),  # the allocator returns freed memory
    (LoaderConfig(num_workers=2, cache="memory", multiprocessing_context="fork"), 8, False),  # workers gather
    (LoaderConfig(num_workers=0, cache="pickle"), 8, False),  # a disk cache's build writes in this process
    (LoaderConfig(num_workers=0, cache=None), 8, False),
])
def test_the_road_warms_only_for_batches_gathered_here(config, kept_batch, warms):
    assert (source._heap_for(config, kept_batch) is not None) is warms


class Recording(FactorySite):
    def __init__(self):
        super().__init__(progress=False, workers=2)
        self.meanwhile = "not called"

    def build(self, backend, dataset, key, meanwhile=None):
        self.meanwhile = meanwhile
        return super().build(backend, dataset, key, meanwhile)


@fork_only
def test_prepare_source_hands_the_build_two_batches_of_each_column(monkeypatch):
    calls: list[tuple[list[int], int]] = []
    real = source.warm_heap

    def spy(sizes, copies=2):
        calls.append((list(sizes), copies))
        return real(sizes, copies)

    monkeypatch.setattr(source, "warm_heap", spy)
    site, data = Recording(), Rows()
    prepared = prepare_source(data, LoaderConfig(num_workers=0, cache="memory"), site, transform=None,
                              collate_fn=None, kept_batch=8)
    assert callable(site.meanwhile)
    assert calls == [([8 * 4000, 8 * 8], 2)]
    loader = torch.utils.data.DataLoader(prepared.dataset, batch_size=8, collate_fn=prepared.collate_fn)
    plain = torch.utils.data.DataLoader(data, batch_size=8)
    for got, want in zip(loader, plain, strict=True):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# The factory passes the batch size only where it applied an allocator that keeps freed memory.
FACTORY = r"""
import dataclasses, json, sys
sys.path.insert(0, {tests!r})
from test_show_check import make_profile
import autotune, autotune.loader._source as source
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import RecipeFile
from autotune.recipe._measured import Interval
from test_warm_heap import Rows
calls = []
real = source.warm_heap
source.warm_heap = lambda sizes, copies=2: calls.append(list(sizes)) or real(sizes, copies)
profile = make_profile(hardware.collect(), 0)
measured = dataclasses.replace(profile.measured, interval=Interval(3.3, 3.0, 3.6))
config = LoaderConfig(num_workers=0, cache="memory", allocator={allocator!r})
RecipeFile.merge_write("autotune.json", dataclasses.replace(profile, config=config, measured=measured))
loader = autotune.dataloader(Rows(), "autotune.json", batch_size=4, progress=False,
                             apply_process_settings={apply})
print(json.dumps({{"calls": calls, "batches": len(list(loader))}}))
"""


@fork_only
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.skipif(build_workers() == 0, reason="one usable CPU: the factory builds in this process, no workers")
@pytest.mark.parametrize(("allocator", "apply", "users", "calls"), [
    ("glibc-tuned", True, {}, [[4 * 4000, 4 * 8]]),
    ("glibc-tuned", False, {}, []),  # the caller keeps the process as it is: its allocator returns memory
    ("glibc", True, {}, []),
    ("glibc-tuned", True, {"MALLOC_ARENA_MAX": "2"}, []),  # the user's malloc settings win: glibc's defaults
])
def test_the_factory_warms_where_it_applied_a_keeping_allocator(tmp_path, allocator, apply, users, calls):
    code = textwrap.dedent(FACTORY.format(tests=str(ROOT / "tests"), allocator=allocator, apply=apply))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=150,
                         env={**env, "PYTHONPATH": str(ROOT), **users})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"calls": calls, "batches": 10}


@fork_only
def test_a_site_or_backend_written_before_meanwhile_still_builds(monkeypatch):
    """A CacheSite whose build() takes three arguments, and an in-memory backend whose build() takes no
    ``meanwhile``, are called as before; the cache is exact, nothing is warmed."""
    from autotune.caches import _family

    calls: list[object] = []
    monkeypatch.setattr(source, "warm_heap", lambda sizes, copies=2: calls.append(sizes) or 0.0)

    class OldSite(FactorySite):
        def build(self, backend, dataset, key):  # the protocol's signature before meanwhile
            return super().build(backend, dataset, key)

    class OldMemory(MemoryCache):
        name = "oldmemory"

        @classmethod
        def build(cls, dataset, indices, path=None, *, manifest, progress=True, workers=0):
            return super().build(dataset, indices, path, manifest=manifest, progress=progress, workers=workers)

    data = Rows()
    for backend, site in (("memory", OldSite(progress=False, workers=2)),
                          ("oldmemory", FactorySite(progress=False, workers=2))):
        _family.register(OldMemory)
        try:
            prepared = prepare_source(data, LoaderConfig(num_workers=0, cache=backend), site, transform=None,
                                      collate_fn=None, kept_batch=8)
        finally:
            _family.unregister("oldmemory")
        assert prepared.cache is not None and all(samples_equal(prepared.cache[i], data[i]) for i in range(len(data)))
    assert calls == []


@fork_only
@pytest.mark.parametrize("per_sample", ["transform", "collate_fn"])
def test_no_warm_where_batches_are_not_gathered(monkeypatch, per_sample):
    """With a transform or the caller's collate_fn, batches are made by default_collate or the caller, of other
    sizes than the columns' rows: nothing is warmed."""
    calls: list[object] = []
    monkeypatch.setattr(source, "warm_heap", lambda sizes, copies=2: calls.append(sizes) or 0.0)
    given = {"transform": None, "collate_fn": None, per_sample: (lambda x: x)}
    prepare_source(Rows(), LoaderConfig(num_workers=0, cache="memory"), FactorySite(progress=False, workers=2),
                   kept_batch=8, **given)
    assert calls == []


@fork_only
def test_a_warm_that_cannot_be_had_leaves_the_cache_built(monkeypatch):
    def no_room(sizes, copies=2):
        raise MemoryError("no room for the batches")

    monkeypatch.setattr(source, "warm_heap", no_room)
    data = Rows()
    steps: dict[str, float] = {}
    prepared = prepare_source(data, LoaderConfig(num_workers=0, cache="memory"), FactorySite(progress=False, workers=2),
                              transform=None, collate_fn=None, kept_batch=8,
                              timer=lambda step, s: steps.__setitem__(step, s))
    assert isinstance(prepared.cache, MemoryCache)
    assert all(samples_equal(prepared.cache[i], data[i]) for i in range(len(data)))
    assert set(steps) == {"check", "cache"}  # no warm was had, so none is timed


@fork_only
def test_the_warm_is_timed_apart_and_a_trial_counts_it_once():
    """The road tells the timer the warm's seconds; a trial's build cost takes them off the build it scales
    and adds them once (a warm of two batches costs the same whatever the length)."""
    from autotune.tuner._measure import build_cost

    steps: dict[str, float] = {}
    prepare_source(Rows(), LoaderConfig(num_workers=0, cache="memory"), FactorySite(progress=False, workers=2),
                   transform=None, collate_fn=None, kept_batch=8,
                   timer=lambda step, s: steps.__setitem__(step, steps.get(step, 0.0) + s))
    assert set(steps) == {"check", "cache", "warm"} and 0 < steps["warm"] < steps["cache"]

    class Plan:
        stream = False

        def cached(self):
            return list(range(100)), 10_000

    class Site:
        build_stores = trial_stores = build_probe = build_head = None

    cost = build_cost(LoaderConfig(cache="memory"), Plan(), Site(), {"check": 0.5, "cache": 1.0, "warm": 0.25})
    assert (cost.fixed, cost.seconds, cost.samples, cost.stores) == (0.75, 0.75, 100, 10_000)
    assert cost.predicted == 0.75 + 0.75 * 100


def test_applied_says_whether_the_allocator_in_use_keeps_freed_memory():
    from autotune.process._settings import Applied

    assert [Applied(allocator=a).keeps_freed for a in ("glibc-tuned", "tcmalloc", "glibc", "jemalloc")] == [
        True, True, False, False]
    assert Applied().keeps_freed is False  # nothing looked at: not known to keep


class Shifted(Rows):
    """Rows whose values are shifted by ``by``: a second set (a val set) of the same shapes."""

    def __init__(self, by: int, n: int = 24):
        super().__init__(n)
        self.by = by

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return x + self.by, y + self.by


@fork_only
def test_a_train_and_a_val_set_each_warm_and_read_exactly_their_own_samples():
    train, val = Shifted(0, 40), Shifted(1000, 24)
    steps: list[str] = []
    loaders = []
    for data in (train, val):
        prepared = prepare_source(data, LoaderConfig(num_workers=0, cache="memory"),
                                  FactorySite(progress=False, workers=2), transform=None, collate_fn=None,
                                  kept_batch=8, timer=lambda step, s: steps.append(step))
        loaders.append((data, torch.utils.data.DataLoader(prepared.dataset, batch_size=8,
                                                          collate_fn=prepared.collate_fn)))
    assert steps.count("warm") == 2
    for data, loader in loaders:
        plain = torch.utils.data.DataLoader(data, batch_size=8)
        for got, want in zip(loader, plain, strict=True):
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
