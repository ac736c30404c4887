"""A process that uses a cache ends cleanly wherever it stops: a whole first-epoch fill is committed
for every disk backend even when the commit runs at exit, and no exit prints "Exception ignored"."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune import caches
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured

pytestmark = pytest.mark.timeout(180)

TESTS = Path(__file__).parent
DISK = ("pickle", "hdf5", "lmdb")


def _recipe(tmp_path: Path, backend: str, fill: str, workers: int) -> Path:
    extra = {"multiprocessing_context": "fork"} if workers else {}
    profile = Profile(hardware=hardware.collect(), dataset={"source": "<python object>", "length": 41},
                      settings={"batch_size": 4, "epochs": 2},
                      config=LoaderConfig(num_workers=workers, cache=backend, cache_fill=fill, **extra),
                      measured=Measured())
    path = tmp_path / f"autotune-{backend}-{fill}-{workers}.json"
    RecipeFile.merge_write(path, profile)
    return path


_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import autotune
import autotune.caches._disk_fill as disk_fill
from test_disk_fill import Mixed, _listed
disk_fill._POLL = {poll}  # a long poll: the commit of a whole fill is left to the exit
loader = autotune.load({recipe!r}).dataloader(Mixed(), cache_dir={root!r}, collate_fn=_listed, progress=False)
print(type(loader.dataset.source).__name__, flush=True)
for n, batch in enumerate(loader):
    if n == {stop}:
        break
"""


def _run(tmp_path: Path, recipe: Path, *, stop: int, poll: float = 3600.0) -> tuple[str, str]:
    code = _SCRIPT.format(tests=str(TESTS), recipe=str(recipe), root=str(tmp_path / "c"), stop=stop, poll=poll)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout.strip(), done.stderr


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("backend", DISK)
def test_a_whole_fill_committed_at_exit_is_the_next_processs_cache(tmp_path, backend, workers):
    recipe = _recipe(tmp_path, backend, "first_epoch", workers)
    source, stderr = _run(tmp_path, recipe, stop=-1)  # one whole first epoch, then exit: the commit runs at exit
    assert source == "DiskFill"
    assert "not written" not in stderr, stderr
    entries = caches.list_caches(tmp_path / "c")
    assert [(e["kind"], e["backend"], e["status"], e["samples"]) for e in entries] == [
        ("cache", backend, "valid", 41)], entries
    source, _ = _run(tmp_path, recipe, stop=-1)
    assert source == caches.get_backend(backend).__name__


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("backend, fill", [("memory", "first_epoch"), ("memory", "build"),
                                           *((b, f) for b in DISK for f in ("first_epoch", "build"))])
def test_no_exception_is_ignored_at_exit_after_one_batch(tmp_path, backend, fill, workers):
    """Stopped after the first batch: the exit closes what the cache and the fill hold."""
    _run(tmp_path, _recipe(tmp_path, backend, fill, workers), stop=0, poll=0.25)


def test_a_memory_fill_collected_before_the_exit_and_one_alive_at_it_exit_cleanly(tmp_path):
    script = textwrap.dedent(f"""
        import gc, sys
        sys.path.insert(0, {str(TESTS)!r})
        from test_disk_fill import Mixed
        from autotune.caches._fill import FirstEpochCache
        cache = FirstEpochCache(Mixed())
        cache[9]
        del cache
        gc.collect()
        again = FirstEpochCache(Mixed())
        again[10]
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Exception ignored" not in done.stderr, done.stderr
