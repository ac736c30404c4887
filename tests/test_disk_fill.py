"""Disk caches (pickle, hdf5, lmdb) filled while the first epoch trains: exactly dataset[i] every epoch
in forked and spawned workers, the whole fill committed as the backend's own cache (manifest last, the
build lock held), a partial or killed fill leaving nothing that claims to be a cache."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import autotune
from autotune import caches
from autotune.caches._codec import samples_equal
from autotune.caches._disk_fill import DiskFill
from autotune.caches._registry import open_or_fill
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._space import Space

pytestmark = pytest.mark.timeout(180)


class Mixed(Dataset):
    """Column samples, one the schema overflows on (index 13), strings, per-index values."""

    def __len__(self) -> int:
        return 41

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        shape = (3, 5) if i == 13 else (3, 4)
        return {"x": torch.from_numpy(rng.random(shape, dtype=np.float32)), "name": f"s{i}", "label": i}


def _listed(x):
    return x


def _committed(fill: DiskFill, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while fill.committed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(fill.committed)


def _loader(data, workers: int, context: str | None = None, persistent: bool = False) -> DataLoader:
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(3)).tolist()
    extra = {"multiprocessing_context": context, "persistent_workers": persistent} if workers else {}
    return DataLoader(data, batch_size=4, sampler=order, num_workers=workers, collate_fn=_listed, **extra)


def _exact(loader: DataLoader, dataset) -> int:
    got = [s for batch in loader for s in batch]
    order = list(loader.sampler)
    assert [s["label"] for s in got] == order
    assert all(samples_equal(s, dataset[i]) for i, s in zip(order, got))
    return len(got)


@pytest.mark.parametrize("backend", ["pickle", "hdf5", "lmdb"])
def test_every_epoch_is_exact_and_the_whole_fill_becomes_the_cache(tmp_path, backend):
    dataset = Mixed()
    fill = open_or_fill(backend, dataset, root=tmp_path, manifest={"key": "mixed"})
    assert isinstance(fill, DiskFill) and fill.filled_count == 8, "the schema's head is kept before the workers start"
    assert open_or_fill(backend, dataset, root=tmp_path, manifest={"key": "mixed"}) is fill, "one fill per process"
    loader = _loader(fill, 2, "fork", persistent=True)
    for _ in range(2):
        assert _exact(loader, dataset) == len(dataset)
    assert fill.whole and _committed(fill) and fill.result == "written"
    fill.close()
    assert not fill.staging.exists()
    cache = open_or_fill(backend, dataset, root=tmp_path, manifest={"key": "mixed"})
    assert isinstance(cache, caches.DiskCache) and cache.origin == "reused" and cache.path == fill.path
    assert all(samples_equal(cache[i], dataset[i]) for i in range(len(dataset)))
    reopened = caches.get_backend(backend).open(fill.path, manifest=fill.expected, verify=True)
    assert len(reopened) == len(dataset)
    if backend == "pickle":  # the spool files linked in as they are: the main process's head, two workers'
        meta = cache.manifest["meta"]["data_files"]
        assert meta == [f"data-{j}.bin" for j in range(len(meta))] and 2 <= len(meta) <= 3


def test_spawned_workers_fill_it_and_read_it_back(tmp_path):
    dataset = Mixed()
    fill = open_or_fill("pickle", dataset, root=tmp_path, manifest={"key": "mixed"})
    loader = _loader(fill, 2, "spawn", persistent=True)  # spawned once: each start imports torch
    assert _exact(loader, dataset) == len(dataset)
    assert fill.filled_count == len(dataset)
    spools = sorted(p.name for p in fill.staging.glob("spool-*.bin"))
    assert len(spools) == 3, spools  # this process's head and each spawned worker's samples
    assert _exact(loader, dataset) == len(dataset)
    assert _committed(fill)
    fill.close()


def test_a_partial_first_epoch_leaves_no_cache(tmp_path):
    dataset = Mixed()
    fill = open_or_fill("pickle", dataset, root=tmp_path, manifest={"key": "mixed"})
    for n, _ in enumerate(_loader(fill, 2, "fork")):
        if n == 3:
            break
    assert 8 <= fill.filled_count < len(dataset) and not fill.whole
    fill.close()
    assert fill.committed is None and fill.result.startswith("partial (")
    assert not fill.path.exists() and not fill.staging.exists()
    assert [e["kind"] for e in caches.list_caches(tmp_path)] == []


def test_a_record_failing_its_checksum_is_read_from_the_source_and_written_again_at_commit(tmp_path):
    dataset = Mixed()
    fill = open_or_fill("pickle", dataset, root=tmp_path, manifest={"key": "mixed"})
    for i in range(len(dataset) - 1):
        assert samples_equal(fill[i], dataset[i])
    writer, offset, length, _ = (int(x) for x in fill._view().where[20])
    spool = fill.staging / f"spool-{writer}.bin"
    with open(spool, "r+b") as fh:  # one flipped byte inside sample 20's record
        fh.seek(offset + length // 2)
        byte = fh.read(1)
        fh.seek(offset + length // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert samples_equal(fill[20], dataset[20])
    assert samples_equal(fill[len(dataset) - 1], dataset[len(dataset) - 1])  # the last one: whole now
    assert _committed(fill)
    fill.close()
    cache = caches.get_backend("pickle").open(fill.path, manifest=fill.expected, verify=True)
    assert all(samples_equal(cache[i], dataset[i]) for i in range(len(dataset)))


def test_a_killed_fill_is_busy_while_it_lives_and_removed_by_the_next_builder(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_disk_fill import Mixed
        from autotune.caches._registry import open_or_fill
        fill = open_or_fill("pickle", Mixed(), root={str(tmp_path)!r}, manifest={{"key": "mixed"}})
        print(fill.staging, flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        staging = Path(proc.stdout.readline().strip())
        listed = caches.list_caches(tmp_path)
        assert [(e["kind"], e["status"], e["reason"]) for e in listed] == [
            ("temp", "building", "a fill during a first epoch in progress")]
        assert caches.clear_caches(tmp_path)["busy"] == [str(staging)]
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        proc.kill()
    assert [(e["status"], e["reason"]) for e in caches.list_caches(tmp_path)] == [
        ("partial", "an unfinished or interrupted fill during a first epoch")]
    cache = caches.open_or_build("pickle", Mixed(), root=tmp_path, manifest={"key": "mixed"}, progress=False)
    assert cache.origin == "built" and not staging.exists()


def _recipe(tmp_path: Path, backend: str) -> Path:
    profile = Profile(hardware=hardware.collect(), dataset=DatasetRecord(source="<python object>", length=41),
                      settings=RunSettings(batch_size=4, epochs=2),
                      config=LoaderConfig(num_workers=2, multiprocessing_context="fork", cache=backend,
                                          cache_fill="first_epoch"), measured=Measured())
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile)
    return path


_RUN = """
import sys, warnings
sys.path.insert(0, {tests!r})
import autotune
from test_disk_fill import Mixed, _listed
loader = autotune.load({recipe!r}).dataloader(Mixed(), cache_dir={root!r}, collate_fn=_listed, progress=False)
print(type(loader.dataset.source).__name__, loader.autotune.settings["cache_fill"], flush=True)
for n, batch in enumerate(loader):
    if n == {stop}:
        break
"""


def _run(tmp_path: Path, recipe: Path, stop: int) -> list[str]:
    code = _RUN.format(tests=str(Path(__file__).parent), recipe=str(recipe), root=str(tmp_path / "c"), stop=stop)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_factory_commits_a_whole_first_epoch_at_exit_and_the_next_run_reads_the_cache(tmp_path):
    recipe = _recipe(tmp_path, "lmdb")
    assert _run(tmp_path, recipe, stop=2) == ["DiskFill", "first_epoch"]  # interrupted: nothing kept
    assert [e["kind"] for e in caches.list_caches(tmp_path / "c")] == []
    assert _run(tmp_path, recipe, stop=-1) == ["DiskFill", "first_epoch"]  # one whole epoch, then exit
    [entry] = [e for e in caches.list_caches(tmp_path / "c")]
    assert (entry["kind"], entry["backend"], entry["status"], entry["samples"]) == ("cache", "lmdb", "valid", 41)
    # The next run is this process, which never held the cache: it opens the committed one.
    loader = autotune.load(recipe).dataloader(Mixed(), cache_dir=tmp_path / "c", collate_fn=_listed, progress=False)
    assert [type(loader.dataset.source).__name__, loader.autotune.settings["cache_fill"]] == ["LmdbCache", "first_epoch"]
    assert _exact(DataLoader(loader.dataset, batch_size=4, collate_fn=_listed), Mixed()) == 41


def test_several_ranks_build_the_disk_cache_first(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    recipe = _recipe(tmp_path, "pickle")
    with pytest.warns(UserWarning, match="cache_fill='first_epoch' with the pickle cache in a job of several ranks"):
        loader = autotune.load(recipe).dataloader(Mixed(), cache_dir=tmp_path / "c", progress=False)
    assert loader.autotune.settings["cache_fill"] == "build"
    assert isinstance(loader.dataset.source, caches.PickleCache) and loader.dataset.source.origin == "built"


def test_the_space_asks_for_the_fill_of_the_caches_it_names():
    space = Space(max_workers=0, caches=(None, "memory", "pickle"), cache_fills=("build", "first_epoch"),
                  filled_caches=("memory", "pickle"))
    grid = space.grid()
    assert sorted(c.cache for c in grid if c.cache_fill == "first_epoch") == ["memory", "pickle"]
    assert space.params_for(LoaderConfig(cache="pickle", cache_fill="first_epoch"))["cache_fill"] == "first_epoch"
    only_memory = Space(max_workers=0, caches=(None, "memory", "pickle"), cache_fills=("build", "first_epoch"))
    assert [c.cache for c in only_memory.grid() if c.cache_fill == "first_epoch"] == ["memory"]


class Decoding(Dataset):
    """A source that costs something to read (as decoding does), cheap to read back from a cache."""

    def __len__(self) -> int:
        return 120

    def __getitem__(self, i: int):
        time.sleep(0.003)
        return torch.full((16,), float(i))


@pytest.mark.parametrize("cache", ["memory", "pickle"])
def test_a_fills_running_figure_counts_its_slow_first_epoch_once(tmp_path, cache):
    """The pruner reads a running figure of the whole run; a fill's first epoch (decode and write) is no
    measure of the later ones (read back), so extrapolating it to every epoch would prune the fill."""
    from autotune.tuner._measure import Plan, Workload, measure

    reports: list[tuple[int, float]] = []
    plan = Plan(indices=list(range(120)), length=120, epochs_measured=2, cache_root=str(tmp_path / "trial"))
    (tmp_path / "trial").mkdir(mode=0o700)
    figures = measure(Workload(dataset=Decoding(), batch_size=4, epochs=20),
                      LoaderConfig(cache=cache, cache_fill="first_epoch"), plan,
                      report=lambda step, value: reports.append((step, value)))
    end_of_first = [value for step, value in reports if step == 2]
    assert end_of_first and end_of_first[-1] <= figures.prediction.total_seconds
