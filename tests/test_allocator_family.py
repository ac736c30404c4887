"""The allocators are a family of classes: an allocator registered in one place (tests/allocator_plugin.py)
is listed, validated by LoaderConfig and stored by name, offered by the search where this machine has it,
preloaded into a process started with it, and stood in for where it cannot be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import allocator_plugin
import pytest
from allocator_plugin import MallocDebug

from autotune.config import ConfigError, LoaderConfig
from autotune.errors import AutotuneError
from autotune.process import ProcessSettings, _family, allocator_names, availability, command_line, launch_env
from autotune.process import _allocator as allocator
from autotune.process._settings import RUN_HINT, needs_fresh_process
from autotune.tuner._candidates import Limits, allocator_choices
from autotune.tuner._options import SearchOptions
from autotune.tuner._space import Space

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
BUILT_IN = ("glibc", "glibc-tuned", "tcmalloc", "jemalloc")
MALLOPT = "mallopt(M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=1 GiB) in main process"

# A fresh process (so a preload and mallopt act on it alone) that registers the plugin as a user's program
# would, applies the settings at run time and says what it has.
CHILD = r"""
import json, sys
import allocator_plugin
from autotune import process
from autotune.process import _family
process.register(allocator_plugin.MallocDebug)
out = process.apply_at_runtime(process.ProcessSettings(allocator="malloc-debug"))
print(json.dumps({"active": _family.active(), "applied": out.applied, "not_applied": out.not_applied}))
"""


@pytest.fixture
def plugin():
    yield from allocator_plugin.registered()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS)])
    env.update(extra)
    return env


def run_child(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def limits() -> Limits:
    return Limits(usable_cpus=1, memory_budget=1 << 30, disk_free=1 << 30)


def test_a_registered_allocator_is_listed_while_registered(plugin):
    assert allocator_names() == (*BUILT_IN, "malloc-debug")
    assert _family.searched_names() == allocator_names()
    assert "malloc-debug" in availability()
    assert _family.get("malloc-debug") is MallocDebug


def test_an_allocator_not_registered_is_nowhere():
    assert allocator_names() == BUILT_IN
    with pytest.raises(ConfigError, match=r"^allocator must be one of glibc, glibc-tuned, tcmalloc, jemalloc, but got "
                                          r"'malloc-debug'$"):
        LoaderConfig(allocator="malloc-debug")
    with pytest.raises(AutotuneError, match=r"^Unknown allocator 'malloc-debug'. Valid allocators: glibc, glibc-tuned, "
                                            r"tcmalloc, jemalloc.$"):
        SearchOptions(budget=10, allocators=("glibc", "malloc-debug"))


def test_loader_config_takes_it_and_a_recipe_stores_it_by_name(plugin):
    config = LoaderConfig(num_workers=1, allocator="malloc-debug")
    assert config.to_json()["allocator"] == "malloc-debug"
    assert LoaderConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    assert "allocator=malloc-debug" in config.describe()
    assert config.process_settings() == ProcessSettings(allocator="malloc-debug")
    assert SearchOptions(budget=10, allocators=["malloc-debug"]).allocators == ("malloc-debug",)


def test_the_family_refuses_what_a_recipe_or_a_preload_cannot_work_with(plugin):
    class Spaced(MallocDebug):
        name = "malloc debug"

    class Taken(MallocDebug):
        pass

    class Nameless(MallocDebug):
        name = "nameless"
        libraries = ()

    class Orphan(MallocDebug):
        name = "orphan"
        stand_in = "mimalloc"

    for cls, message in ((Spaced, "must match"), (Taken, "is taken by MallocDebug"), (Nameless, "names no library"),
                         (Orphan, "stand_in 'mimalloc' is not a registered allocator")):
        with pytest.raises(ValueError, match=message):
            _family.register(cls)
    _family.unregister("glibc")  # the plain one, where every fallback ends, stays
    assert allocator_names()[0] == "glibc"


def test_the_search_offers_it_only_where_this_machine_has_it(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))  # the only folder looked in, empty
    missing = limits()
    choices = allocator_choices(missing)
    assert "malloc-debug" not in choices
    assert ("allocator malloc-debug left out: not available: libc_malloc_debug.so.0 not found; install it with "
            "`apt-get install libc6`") in missing.notes
    (tmp_path / "libc_malloc_debug.so.0").write_bytes(b"")
    have = limits()
    choices = allocator_choices(have)
    assert "malloc-debug" in choices and not [n for n in have.notes if "malloc-debug" in n]
    assert allocator_choices(Limits(usable_cpus=1, memory_budget=1 << 30, disk_free=1 << 30,
                                    allocators=("malloc-debug",))) == ("malloc-debug",)
    grid = Space(max_workers=1, allocators=choices).grid()
    assert {c.allocator for c in grid} == set(choices)


def test_a_process_started_with_it_preloads_its_library(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))
    (tmp_path / "libc_malloc_debug.so.0").write_bytes(b"")
    lib = str(tmp_path / "libc_malloc_debug.so.0")
    settings = ProcessSettings(allocator="malloc-debug", main_threads=2)
    env, notes = launch_env(settings, {"LD_PRELOAD": "/opt/a.so"})
    assert (env["LD_PRELOAD"], notes) == (f"{lib}:/opt/a.so", [])
    assert command_line(settings, ["python", "train.py"]) == (
        f"LD_PRELOAD={lib} OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 python train.py")
    monkeypatch.setattr(_family, "active", lambda: "glibc")
    assert needs_fresh_process(settings) is True  # so a trial of it is spawned with launch_env
    # another allocator's preload already in the environment would clash with it, and is named
    env, notes = launch_env(ProcessSettings(allocator="jemalloc"), {"LD_PRELOAD": lib})
    assert notes[-1] == (f"LD_PRELOAD already loads malloc-debug ({lib}), so the recipe's allocator "
                         f"{_family.resolve('jemalloc')[0].name} may not take effect; unset LD_PRELOAD to use it")


def test_where_its_library_is_missing_its_stand_in_is_used(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))
    monkeypatch.setattr(allocator, "is_glibc", lambda: True)
    env, notes = launch_env(ProcessSettings(allocator="malloc-debug"), {})
    assert "LD_PRELOAD" not in env
    assert env[allocator.ENV_MMAP_THRESHOLD] == str(allocator.DEFAULT_MMAP_THRESHOLD)
    assert notes == ["malloc-debug not available: libc_malloc_debug.so.0 not found; install it with "
                     "`apt-get install libc6`; using glibc-tuned instead"]
    monkeypatch.setattr(allocator, "is_glibc", lambda: False)  # and the stand-in's own stand-in after it
    env, notes = launch_env(ProcessSettings(allocator="malloc-debug"), {})
    assert env == {} and notes[0].endswith("; using glibc instead")


@pytest.mark.skipif(MallocDebug.library() is None, reason="libc_malloc_debug.so.0 (glibc 2.34+) is not here")
def test_a_real_process_started_with_it_runs_on_it(plugin):
    with_it, notes = launch_env(ProcessSettings(allocator="malloc-debug"), clean_env())
    assert notes == []
    assert run_child(with_it) == {"active": "malloc-debug", "not_applied": [],
                                  "applied": ["malloc-debug (preloaded at start) in main process"]}
    without = run_child(clean_env())  # not started with it: glibc-tuned's mallopt stands in, and it says so
    assert without["active"] == "glibc"
    assert without["not_applied"] == [f"malloc-debug needs a preload: {RUN_HINT}"]
    assert without["applied"] == ([f"{MALLOPT}, in place of malloc-debug"] if allocator.is_glibc() else [])
