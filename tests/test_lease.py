"""A cache in use is never removed: a loader holds a shared lease on its cache (main process and
workers, forked or spawned); `autotune cache clear` skips and names leased caches; a rebuild of an
invalid cache that a loader still reads goes beside it (caches/_lease.py)."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune import caches
from autotune.caches import CacheRebuildWarning
from autotune.caches._codec import samples_equal
from autotune.caches._lease import Lease, in_use
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured

pytestmark = pytest.mark.timeout(240)

TESTS = Path(__file__).parent
ROOT = Path(__file__).resolve().parents[1]


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.from_numpy(np.random.default_rng(i).random((3, 4), dtype=np.float32)), i


def _recipe(tmp_path: Path, backend: str, fill: str, workers: int) -> Path:
    extra = {"multiprocessing_context": "fork", "prefetch_factor": 2} if workers else {}
    profile = Profile(hardware=hardware.collect(), dataset={"source": "<python object>", "length": 40},
                      settings={"batch_size": 4, "epochs": 3},
                      config=LoaderConfig(num_workers=workers, cache=backend, cache_fill=fill, **extra),
                      measured=Measured())
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile)
    return path


_READER = """
import sys
sys.path.insert(0, {tests!r})
import autotune
from autotune.caches._codec import samples_equal
from test_lease import Rows
loader = autotune.load({recipe!r}).dataloader(Rows(), cache_dir={root!r}, shuffle=False, progress=False)
print(type(loader.dataset.source).__name__, flush=True)
exact = 0
for epoch in range({epochs}):
    for batch in loader:
        for x, i in zip(*batch):
            exact += bool(samples_equal(x, Rows()[int(i)][0]))
    if epoch == 0 and {wait}:
        print("read one epoch", flush=True)
        sys.stdin.readline()  # the clear runs now, in another process
print("exact", exact, flush=True)
"""


def _reader(tmp_path: Path, recipe: Path, *, epochs: int, wait: bool) -> subprocess.Popen:
    code = _READER.format(tests=str(TESTS), recipe=str(recipe), root=str(tmp_path / "c"), epochs=epochs, wait=wait)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _cache_cli(action: str, root: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "autotune", "cache", action, "--dir", str(root)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _clear(root: Path) -> str:
    return _cache_cli("clear", root)


def _state(listing: str, path: str) -> str:
    """The STATE column of ``path``'s row in `autotune cache list`."""
    [row] = [line for line in listing.splitlines() if f" {path} " in f" {line} "]
    return row.split("  ")[-1].strip()


@pytest.mark.parametrize("backend, workers, fill", [
    *((b, 2, f) for b in ("pickle", "hdf5", "lmdb") for f in ("build", "first_epoch")),
    ("pickle", 0, "build"), ("lmdb", 0, "first_epoch")])
def test_cache_clear_leaves_a_cache_a_loader_is_reading(tmp_path, backend, workers, fill):
    recipe = _recipe(tmp_path, backend, fill, workers)
    if fill == "first_epoch":  # a first run fills the cache and commits it at exit; the reader opens it
        first = _reader(tmp_path, recipe, epochs=1, wait=False)
        out, err = first.communicate(timeout=180)
        assert first.returncode == 0 and out.split() == ["DiskFill", "exact", "40"], err
    reader = _reader(tmp_path, recipe, epochs=3, wait=True)
    try:
        assert reader.stdout.readline().strip() == caches.get_backend(backend).__name__
        assert reader.stdout.readline().strip() == "read one epoch"
        [cache] = [e for e in caches.list_caches(tmp_path / "c") if e["kind"] == "cache"]
        assert cache["in_use"] and _state(_cache_cli("list", tmp_path / "c"), cache["path"]) == "valid, in use"
        said = _clear(tmp_path / "c")
        assert f"Left {cache['path']} untouched: in use by a loader reading it." in said
        assert "Removed 0 caches" in said
        reader.stdin.write("\n")
        reader.stdin.flush()
        out, err = reader.communicate(timeout=180)
    finally:
        reader.kill()
    assert reader.returncode == 0, err
    assert out.split() == ["exact", str(3 * 40)], "every epoch read exactly, the clear notwithstanding"
    assert _state(_cache_cli("list", tmp_path / "c"), cache["path"]) == "valid"  # the loader is gone
    assert "Removed 1 cache " in _clear(tmp_path / "c")  # free once the loader is gone
    assert [e for e in caches.list_caches(tmp_path / "c") if e["kind"] == "cache"] == []


def test_a_pickled_cache_takes_its_own_lease_as_a_spawned_worker_does(tmp_path):
    script = textwrap.dedent(f"""
        import gc, pickle, sys
        sys.path.insert(0, {str(TESTS)!r})
        from autotune import caches
        from test_lease import Rows
        cache = caches.open_or_build("lmdb", Rows(), root={str(tmp_path)!r}, manifest={{"key": "r"}}, progress=False)
        clone = pickle.loads(pickle.dumps(cache))  # what a spawned worker receives
        del cache
        gc.collect()
        print(clone.path, flush=True)
        sys.stdin.readline()
        print(float(clone[3][0].sum()), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        path = Path(proc.stdout.readline().strip())
        assert in_use(path)
        assert caches.clear_caches(tmp_path)["in_use"] == [str(path)]
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert float(proc.stdout.readline()) == pytest.approx(float(Rows()[3][0].sum()))
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert not in_use(path) and caches.clear_caches(tmp_path)["removed"] == [str(path)]


def test_the_lease_lives_as_long_as_the_cache_object(tmp_path):
    cache = caches.open_or_build("pickle", Rows(), root=tmp_path, manifest={"key": "r"}, progress=False)
    path = cache.path
    assert in_use(path)
    loader = torch.utils.data.DataLoader(cache, batch_size=8, num_workers=2, multiprocessing_context="fork",
                                         persistent_workers=True)
    next(iter(loader))
    assert caches.clear_caches(tmp_path)["in_use"] == [str(path)]
    del cache, loader
    gc.collect()
    assert not in_use(path)
    assert caches.clear_caches(tmp_path)["removed"] == [str(path)]
    with pytest.raises(FileNotFoundError):
        Lease(path)  # a folder set aside is never leased again under its old name


def test_a_rebuild_of_an_invalid_cache_a_loader_still_reads_goes_beside_it(tmp_path):
    dataset = Rows()
    held = caches.open_or_build("pickle", dataset, root=tmp_path, manifest={"key": "r"}, progress=False)
    path = held.path
    held[0]  # the holder reads through its open handle
    data = path / "data.bin"
    os.truncate(data, data.stat().st_size // 2)  # invalid now for anyone who opens it anew
    with pytest.warns(CacheRebuildWarning, match="anew"):
        rebuilt = caches.open_or_build("pickle", dataset, root=tmp_path, manifest={"key": "r"}, progress=False)
    assert rebuilt.path != path and rebuilt.path.name.startswith(path.name + "~") and path.is_dir()
    assert all(samples_equal(rebuilt[k], dataset[k]) for k in range(len(dataset)))
    assert in_use(path), "the holder's folder was not replaced"
    del held, rebuilt
    gc.collect()
    again = caches.open_or_build("pickle", dataset, root=tmp_path, manifest={"key": "r"}, progress=False)
    assert again.path.name.startswith(path.name + "~") and again.origin == "reused"
    assert not path.exists(), "the invalid one is removed once its lease is free"
    del again
    gc.collect()
    assert pickle.loads(pickle.dumps(caches.clear_caches(tmp_path)))["in_use"] == []
