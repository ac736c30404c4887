"""A cache in use is never removed: a loader holds a shared lease on its cache (main process and
workers, forked or spawned); `autotune cache clear` skips and names leased caches; a rebuild of an
invalid cache that a loader still reads goes beside it (caches/_lease.py)."""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing
import os
import pickle
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest
import torch

import autotune
from autotune import caches, cli
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


_FIRST_RUN = """
import sys
sys.path.insert(0, {tests!r})
import autotune
from test_lease import _read
_read(autotune.load({recipe!r}), {root!r}, epochs=1, say=print)
"""


def _read(recipe: autotune.Recipe, root: str, *, epochs: int, say, wait=None) -> None:
    """Read ``epochs`` epochs of Rows through the recipe's loader, saying the source's type, after a
    first epoch "read one epoch" (then ``wait()``: the clear runs meanwhile), and at the end how many
    samples were exact."""
    loader = recipe.dataloader(Rows(), cache_dir=root, shuffle=False, progress=False)
    say(type(loader.dataset.source).__name__)
    exact = 0
    for epoch in range(epochs):
        for batch in loader:
            for x, i in zip(*batch):
                exact += bool(samples_equal(x, Rows()[int(i)][0]))
        if epoch == 0 and wait is not None:
            say("read one epoch")
            wait()
    say(f"exact {exact}")


def _first_run(tmp_path: Path, recipe: Path) -> subprocess.CompletedProcess[str]:
    """A run of its own interpreter: a first epoch's fill is committed at its exit."""
    code = _FIRST_RUN.format(tests=str(TESTS), recipe=str(recipe), root=str(tmp_path / "c"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)


def _reader_main(conn, recipe: str, root: str) -> None:
    _read(autotune.load(recipe), root, epochs=3, say=conn.send, wait=conn.recv)


def _reader(tmp_path: Path, recipe: Path) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    """A loader reading in another process, forked from this one (which opened no cache, so holds no
    lease): its lease is what `cache clear` here must respect."""
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_reader_main, args=(theirs, str(recipe), str(tmp_path / "c")))
    proc.start()
    theirs.close()
    return proc, ours


def _heard(conn: Connection) -> str:
    assert conn.poll(180), "the reader said nothing"
    said = conn.recv()
    assert isinstance(said, str)
    return said


def _cache_cli(action: str, root: Path) -> str:
    """`autotune cache ACTION --dir ROOT`, run here: this process holds no lease, so it sees what
    another process's command would."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["cache", action, "--dir", str(root)]) == 0
    return out.getvalue()


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
        first = _first_run(tmp_path, recipe)
        assert first.returncode == 0 and first.stdout.split() == ["DiskFill", "exact", "40"], first.stderr
    reader, conn = _reader(tmp_path, recipe)
    try:
        assert _heard(conn) == caches.get_backend(backend).__name__
        assert _heard(conn) == "read one epoch"
        [cache] = [e for e in caches.list_caches(tmp_path / "c") if e["kind"] == "cache"]
        assert cache["in_use"] and _state(_cache_cli("list", tmp_path / "c"), cache["path"]) == "valid, in use"
        said = _clear(tmp_path / "c")
        assert f"Left {cache['path']} untouched: in use by a loader reading it." in said
        assert "Removed 0 caches" in said
        conn.send("go on")
        out = _heard(conn)
        reader.join(180)
    finally:
        reader.kill()
        reader.join()
        conn.close()
    assert reader.exitcode == 0
    assert out == f"exact {3 * 40}", "every epoch read exactly, the clear notwithstanding"
    assert _state(_cache_cli("list", tmp_path / "c"), cache["path"]) == "valid"  # the loader is gone
    assert "Removed 1 cache " in _clear(tmp_path / "c")  # free once the loader is gone
    assert [e for e in caches.list_caches(tmp_path / "c") if e["kind"] == "cache"] == []


def _clone_holder(conn, root: str) -> None:
    cache = caches.open_or_build("lmdb", Rows(), root=root, manifest={"key": "r"}, progress=False)
    clone = pickle.loads(pickle.dumps(cache))  # what a spawned worker receives
    del cache
    gc.collect()
    conn.send(str(clone.path))
    conn.recv()
    conn.send(float(clone[3][0].sum()))


def test_a_pickled_cache_takes_its_own_lease_as_a_spawned_worker_does(tmp_path):
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_clone_holder, args=(theirs, str(tmp_path)))
    proc.start()  # forked from this process, which holds no lease: only the clone holds one there
    theirs.close()
    try:
        path = Path(_heard(conn=ours))
        assert in_use(path)
        assert caches.clear_caches(tmp_path)["in_use"] == [str(path)]
        ours.send("go on")
        assert ours.poll(60)
        assert ours.recv() == pytest.approx(float(Rows()[3][0].sum()))
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        proc.kill()
        proc.join()
        ours.close()
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
