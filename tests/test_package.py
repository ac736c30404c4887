"""The package as a user installs it: metadata, entry points, and what ``import autotune`` costs a
training process (subprocesses, so this test run's own imports do not count)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import optuna
import pytest

from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._records import DatasetRecord, RunSettings

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("optuna", "h5py", "lmdb", "matplotlib")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def _imported(code: str, cwd: Path) -> list[str]:
    """The heavy top-level packages loaded after ``code`` runs in a fresh interpreter."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = _python(probe, cwd)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return [m for m in loaded if m in HEAVY]


def test_import_autotune_loads_no_search_or_cache_dependencies(tmp_path):
    assert _imported("import autotune", tmp_path) == []


@pytest.mark.parametrize("cache, expected", [(None, []), ("pickle", []), ("hdf5", ["h5py"])])
def test_a_process_that_only_builds_loaders_loads_what_its_recipe_uses(tmp_path, cache, expected):
    profile = Profile(hardware=hardware.collect(), dataset=DatasetRecord(source="<test>", length=40, fingerprint="x"),
                      settings=RunSettings(batch_size=8, epochs=2), config=LoaderConfig(num_workers=1, cache=cache))
    RecipeFile.merge_write(tmp_path / "autotune.json", profile)
    code = (
        "import autotune\nfrom workloads import Numbers\n"
        "loader = autotune.dataloader(Numbers(40), 'autotune.json', cache_dir='c', progress=False)\n"
        "assert sum(len(b[1]) for b in loader) == 40"
    )
    assert _imported(code, tmp_path) == expected


def test_python_m_autotune_and_version(tmp_path):
    import autotune

    for argv in (["-m", "autotune", "--version"], ["-m", "autotune", "--debug", "--version"]):
        done = subprocess.run([sys.executable, "-X", "importtime", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert (done.returncode, done.stdout.strip()) == (0, f"autotune {autotune.__version__}")
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
        assert "autotune.cli._main" in imported and "torch" not in imported  # --version answers at once
    done = subprocess.run([sys.executable, "-m", "autotune", "show", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "usage: autotune show" in done.stdout


def test_search_leaves_optunas_log_level_as_it_found_it(tmp_path):
    from test_search_core import FakeRunner, _opts, _setup, _spec

    from autotune.tuner._study import search

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.DEBUG)
    try:
        search(_spec(), _opts(tmp_path), setup=_setup(), runner=FakeRunner())
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG
    finally:
        optuna.logging.set_verbosity(before)


def test_wheel_has_its_name_license_and_type_marker(tmp_path):
    """``pip install .`` builds this wheel: the distribution name, the MIT licence, py.typed, the command."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "dataloader-autotune" and meta["license"] == "MIT"
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "autotune", src / "autotune", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("dataloader_autotune-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "autotune/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Name: dataloader-autotune" in metadata and "License-Expression: MIT" in metadata
    assert "autotune = autotune.cli:main" in entry
