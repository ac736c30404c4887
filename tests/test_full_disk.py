"""A cache root with too little disk: the factory reads the source with one warning (never a raw OSError, an
lmdb.Error or a screen of h5py "Exception ignored" lines, nor HDF5 crashing), and the search's disk check
counts the cache root as well as the work folder. A real 2 MiB tmpfs, mounted as root; skipped otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def small_disk():
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root (the full-disk paths are reproduced on a real one)")
    where = Path(tempfile.mkdtemp(prefix="autotune-small-"))
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True,
                         text=True)
    if run.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)
    where.rmdir()


SCRIPT = """
import dataclasses, sys, warnings
sys.path.insert(0, {tests!r})
import torch
from torch.utils.data import Dataset
from test_show_check import make_profile
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import RecipeFile
import autotune

class Big(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):  # {grow}: the first sample small, so that only writing finds the disk full
        n = 16 if {grow} and i == 0 else 16384
        return torch.full((n,), float(i)), i

profile = make_profile(hardware.collect(), 0)
RecipeFile.merge_write("autotune.json", dataclasses.replace(profile, config=LoaderConfig(cache={backend!r})))
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    loader = autotune.dataloader(Big(), "autotune.json", cache_dir={root!r}, batch_size=64, collate_fn=list,
                                 progress=False)
    print("SAMPLES", sum(len(b) for b in loader))
print("WARNINGS", [str(w.message) for w in seen if "cache could not be built" in str(w.message)])
"""


@pytest.mark.parametrize("backend, grow", [("pickle", False), ("hdf5", False), ("lmdb", False),
                                           ("pickle", True), ("lmdb", True)])
def test_a_full_cache_root_falls_back_to_the_source_with_one_warning(tmp_path, small_disk, backend, grow):
    """``grow``: the estimate from the first sample fits, the writing does not (the library's own error)."""
    root = small_disk / f"{backend}-{grow}"
    code = textwrap.dedent(SCRIPT.format(tests=str(ROOT / "tests"), backend=backend, root=str(root), grow=grow))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=150,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "SAMPLES 64" in run.stdout
    (warning,) = eval(run.stdout.split("WARNINGS ", 1)[1])
    assert f"the {backend} cache could not be built in {root}" in warning and "reads the source instead" in warning
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]  # nothing half-written is left


def test_the_search_counts_the_cache_roots_free_space(small_disk, tmp_path, monkeypatch):
    """On 9eac6c3 only --workdir was looked at: a disk cache the factory then could not build was chosen."""
    from autotune.dataset import UserSpec
    from autotune.tuner._options import SearchOptions
    from autotune.tuner._preparation import prepare

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(small_disk / "root"))
    spec = UserSpec(dataset=[float(i) for i in range(64)], source="<test>", batch_size=8, epochs=1)
    setup = prepare(spec, SearchOptions(budget=60, workdir=tmp_path / "w", progress=False))
    assert setup.limits.disk_free == shutil.disk_usage(small_disk).free
