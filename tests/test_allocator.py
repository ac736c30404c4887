"""autotune.allocator: finding the libraries, the "not available" report, mallopt's real effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.errors import AutotuneError
from autotune.process import _allocator as allocator
from autotune.process import _family as allocators
from autotune.process._allocator import apply_mallopt
from autotune.process._family import availability

REPO = Path(__file__).resolve().parents[1]

# A child Python that frees and reallocates a 64 MB buffer and prints the minor page faults the
# reallocations cost. Fresh 64 MB mappings fault at least once per 2 MB (a huge page); a reused
# heap block faults not at all.
FAULTS_SCRIPT = r"""
import json, resource, sys
import numpy as np
from autotune.process import _allocator as allocator, _family
ok = allocator.apply_mallopt() if sys.argv[1] == "mallopt" else None
def once():
    a = np.empty(64 << 20, dtype=np.uint8)
    a.fill(1)
    del a
once()  # the first allocation faults in any case
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    once()
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"ok": ok, "faults": after - before, "active": _family.active()}))
"""
ROUNDS = 5
HUGE_PAGES_PER_BUFFER = (64 << 20) // (2 << 20)  # the fewest faults a fresh 64 MB mapping can cost


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def run_faults(mode: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT, mode],
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def find_library(name: str) -> str | None:
    cls = allocators.get(name)
    assert issubclass(cls, allocators.Preloaded)
    return cls.library()


def test_allocator_names():
    assert allocators.names() == ("glibc", "glibc-tuned", "tcmalloc", "jemalloc")


def test_not_available_report_when_libraries_cannot_be_found(tmp_path, monkeypatch):
    # LoaderConfig, not the thing measured: point the search at an empty folder.
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))
    assert find_library("tcmalloc") is None
    assert find_library("jemalloc") is None
    report = availability()
    assert report["tcmalloc"] == (
        "not available: libtcmalloc_minimal.so.4 not found; "
        "install it with `apt-get install libtcmalloc-minimal4`"
    )
    assert report["jemalloc"] == (
        "not available: libjemalloc.so.2 not found; install it with `apt-get install libjemalloc2`"
    )
    assert report["glibc"] is None


def test_find_library_prefers_tcmalloc_minimal(tmp_path, monkeypatch):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, f"{tmp_path / 'empty'}{os.pathsep}{tmp_path}")
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    assert find_library("tcmalloc") == str(tmp_path / "libtcmalloc.so.4")
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_library("tcmalloc") == str(tmp_path / "libtcmalloc_minimal.so.4")
    assert availability()["tcmalloc"] is None


def test_an_unknown_allocator_is_refused_naming_the_valid_ones():
    with pytest.raises(AutotuneError, match=r"^Unknown allocator 'mimalloc'. Valid allocators: glibc, glibc-tuned, "
                                            r"tcmalloc, jemalloc.$"):
        allocators.get("mimalloc")


@pytest.mark.parametrize("name", ["tcmalloc", "jemalloc"])
def test_find_library_finds_installed_library(name):
    path = find_library(name)
    if path is None:
        pytest.skip(f"{name} is not installed here (apt-get install {allocators.get(name).package})")
    assert os.path.exists(path)
    assert os.path.basename(path) in allocators.get(name).libraries
    assert availability()[name] is None


def test_glibc_tuned_needs_glibc(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda *a, **k: ("musl", "1.2"))
    assert apply_mallopt() is False
    assert availability()["glibc-tuned"] == "not available: needs glibc's mallopt, but this C library is musl"


@pytest.mark.skipif(not allocator.is_glibc(), reason="mallopt is glibc's")
def test_mallopt_makes_freed_large_blocks_reused_without_faults():
    plain = run_faults("plain")
    tuned = run_faults("mallopt")
    assert tuned["ok"] is True
    # glibc's default mmaps 64 MB and unmaps it on free: every round faults the pages again.
    assert plain["faults"] >= ROUNDS * HUGE_PAGES_PER_BUFFER
    # With the thresholds raised the freed block stays in the heap and is reused.
    assert tuned["faults"] < HUGE_PAGES_PER_BUFFER


@pytest.mark.skipif(not allocator.is_glibc(), reason="the MALLOC_*_ variables are glibc's")
def test_glibc_reads_the_threshold_variables_at_start():
    env = child_env(
        MALLOC_MMAP_THRESHOLD_=str(allocator.DEFAULT_MMAP_THRESHOLD),
        MALLOC_TRIM_THRESHOLD_=str(allocator.DEFAULT_TRIM_THRESHOLD),
    )
    assert run_faults("plain", env)["faults"] < HUGE_PAGES_PER_BUFFER


def test_active_allocator_is_glibc_without_preload():
    assert run_faults("plain")["active"] == "glibc"


@pytest.mark.parametrize("name", ["tcmalloc", "jemalloc"])
def test_active_allocator_sees_preload(name):
    path = find_library(name)
    if path is None:
        pytest.skip(f"{name} is not installed here (apt-get install {allocators.get(name).package})")
    assert run_faults("plain", child_env(LD_PRELOAD=path))["active"] == name


def test_mallopt_rejects_values_glibc_cannot_take():
    with pytest.raises(ValueError, match="mallopt values"):
        apply_mallopt(mmap_threshold=1 << 40)


def test_format_size():
    assert allocator.format_size(1 << 30) == "1 GiB"
    assert allocator.format_size(3 << 20) == "3 MiB"
    assert allocator.format_size(1000) == "1000 B"
