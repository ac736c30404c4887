"""autotune.process: settings round trip, the launch environment, and settings really applied in
the main process, in DataLoader workers and in a child started with launch_env."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autotune.config import LoaderConfig
from autotune.process import _allocator as allocator
from autotune.process import _family as allocators
from autotune.process import _settings as process
from autotune.process._settings import (
    ProcessSettings,
    command_line,
    launch_env,
    needs_fresh_process,
    worker_init,
)

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
GLIBC = allocator.is_glibc()
TCMALLOC = allocators.get("tcmalloc").library()
# The article's batch (64 float32 224x224x3 images, 37 MiB): above the 32 MiB that glibc's default mmap
# threshold can rise to on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX), so with the defaults every one is a fresh mapping.
BUFFER = 64 * 224 * 224 * 3 * 4
ROUNDS = 5
MAX_ROUNDS = 60
HUGE_PAGES_PER_BUFFER = BUFFER // (2 << 20)  # the fewest faults a fresh mapping of BUFFER can cost


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without allocator settings, with this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS)])
    env.update(extra)
    return env


def run_child(script: str, *args: str, env: dict[str, str] | None = None) -> dict:
    return run_child_lines(script, *args, env=env)[-1]


def run_child_lines(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 110) -> list:
    """Every JSON line the child printed, in order."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.strip().splitlines() if line.startswith(("{", "["))]


def realloc_faults() -> list[int]:
    """Minor faults of each free and reallocation of a BUFFER-sized torch buffer, until ROUNDS rounds in a
    row fault less than a fresh mapping would, or MAX_ROUNDS rounds.

    torch allocates with posix_memalign, whose alignment slack leaves a freed block a little too
    small for the next request until the heap has grown a few blocks' worth, and how many depends
    on what else the process allocated (here 1 to 10 rounds). With glibc's default thresholds
    nothing is ever reused, so every round faults and the rounds run to MAX_ROUNDS.
    """
    import resource

    per_round: list[int] = []
    while len(per_round) < MAX_ROUNDS and not settled(per_round):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(BUFFER, dtype=torch.uint8).fill_(1)
        per_round.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return per_round


def settled(per_round: list[int]) -> bool:
    """True when the last ROUNDS reallocations reused a freed block instead of mapping fresh pages."""
    last = per_round[-ROUNDS:]
    return len(last) == ROUNDS and all(faults < HUGE_PAGES_PER_BUFFER for faults in last)


def remapped_every_round(per_round: list[int]) -> bool:
    """True when every one of MAX_ROUNDS reallocations mapped fresh pages."""
    return len(per_round) == MAX_ROUNDS and all(faults >= HUGE_PAGES_PER_BUFFER for faults in per_round)


class FaultDataset(Dataset):
    """Each item reports the page faults its worker pays for reallocating a large buffer."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, idx: int):
        applied = process.LAST_WORKER_APPLIED
        return {
            "faults": realloc_faults(),
            "threads": torch.get_num_threads(),
            "applied": applied.applied if applied is not None else None,
            "chained": os.environ.get("CHAINED_WORKER", ""),
        }


def mark_chained(worker_id: int) -> None:
    os.environ["CHAINED_WORKER"] = str(worker_id)


def loader_report(allocator_name: str, context: str) -> list[dict]:
    settings = ProcessSettings(allocator=allocator_name, worker_threads=1)
    loader = DataLoader(
        FaultDataset(),
        batch_size=None,
        num_workers=1,
        multiprocessing_context=context,
        worker_init_fn=worker_init(settings, chain=mark_chained),
    )
    return list(loader)


# Run in a fresh process, so the parent's malloc state is the default and a forked worker does
# not inherit thresholds from pytest's process. One parent serves every (allocator, context) pair:
# the settings are applied in its workers only, never in itself, so every loader's workers start
# from a parent with glibc's default thresholds.
WORKER_SCRIPT = r"""
import json, sys
from test_process import loader_report
pairs = json.loads(sys.argv[1])
print(json.dumps([loader_report(name, context) for name, context in pairs]))
"""

MAIN_SCRIPT = r"""
import json, sys
from autotune.process._settings import ProcessSettings, apply_at_runtime
from test_process import realloc_faults
import torch
# Each settings argument in turn, in this one process: a line each.
for arg in sys.argv[1:-1]:
    settings = ProcessSettings(**json.loads(arg))
    applied = apply_at_runtime(settings) if sys.argv[-1] == "apply" else None
    print(json.dumps({
        "faults": realloc_faults(),
        "threads": torch.get_num_threads(),
        "applied": applied.applied if applied is not None else None,
        "not_applied": applied.not_applied if applied is not None else None,
        "maps": open("/proc/self/maps").read(),
        "env": {k: v for k, v in __import__("os").environ.items()
                if k in ("LD_PRELOAD", "OMP_NUM_THREADS", "MKL_NUM_THREADS") or k.startswith("MALLOC_")},
    }))
"""


# ------------------------------------------------------------------ settings and the recipe dict


def test_settings_come_from_the_loader_config():
    config = LoaderConfig(num_workers=2, multiprocessing_context="spawn", worker_threads=3, main_threads=2,
                          allocator="tcmalloc")
    assert config.process_settings() == ProcessSettings(allocator="tcmalloc", main_threads=2, worker_threads=3)
    assert LoaderConfig().process_settings() == ProcessSettings()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"allocator": "mimalloc"}, "allocator must be one of glibc, glibc-tuned, tcmalloc, jemalloc, but got 'mimalloc'"),
        ({"worker_threads": "2"}, "worker_threads must be a positive integer or None, but got '2'"),
        ({"main_threads": True}, "main_threads must be a positive integer or None, but got True"),
        ({"main_threads": 0}, "main_threads must be a positive integer or None, but got 0"),
    ],
)
def test_invalid_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError) as info:
        ProcessSettings(**kwargs)
    assert str(info.value) == message


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ProcessSettings().allocator = "tcmalloc"  # type: ignore[misc]


# ------------------------------------------------------------------ launch_env


def fake_libraries(tmp_path: Path, monkeypatch, *names: str) -> dict[str, str]:
    """Point the library search at a folder holding (empty) files for ``names``."""
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))
    paths = {}
    for name in names:
        path = tmp_path / allocators.get(name).libraries[0]
        path.write_bytes(b"")
        paths[name] = str(path)
    return paths


def test_launch_env_prepends_preload_and_keeps_existing(tmp_path, monkeypatch):
    libs = fake_libraries(tmp_path, monkeypatch, "tcmalloc", "jemalloc")
    base = {"LD_PRELOAD": "/opt/a.so:/opt/b.so", "PATH": "/bin"}
    env, notes = launch_env(ProcessSettings(allocator="tcmalloc", main_threads=2), base)
    assert env["LD_PRELOAD"] == f"{libs['tcmalloc']}:/opt/a.so:/opt/b.so"
    assert env["OMP_NUM_THREADS"] == "2"
    assert env["MKL_NUM_THREADS"] == "2"
    assert env["PATH"] == "/bin"
    assert "MALLOC_MMAP_THRESHOLD_" not in env
    assert notes == []
    assert base == {"LD_PRELOAD": "/opt/a.so:/opt/b.so", "PATH": "/bin"}  # not modified

    env, notes = launch_env(ProcessSettings(allocator="jemalloc"), {})
    assert env == {"LD_PRELOAD": libs["jemalloc"]}
    # already first in LD_PRELOAD: not added twice
    env, _ = launch_env(ProcessSettings(allocator="jemalloc"), {"LD_PRELOAD": libs["jemalloc"]})
    assert env["LD_PRELOAD"] == libs["jemalloc"]


def test_launch_env_for_glibc_tuned_and_glibc():
    env, notes = launch_env(ProcessSettings(allocator="glibc-tuned"), {"HOME": "/root"})
    if GLIBC:
        assert env == {
            "HOME": "/root",
            "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
            "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
        }
        assert notes == []
    env, notes = launch_env(ProcessSettings(), {"HOME": "/root"})
    assert env == {"HOME": "/root"} and notes == []


def test_launch_env_falls_back_when_library_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))  # an empty folder
    monkeypatch.setattr(allocator, "is_glibc", lambda: True)
    env, notes = launch_env(ProcessSettings(allocator="tcmalloc", main_threads=1), {"LD_PRELOAD": "/opt/a.so"})
    assert notes == [
        "tcmalloc not available: libtcmalloc_minimal.so.4 not found; install it with "
        "`apt-get install libtcmalloc-minimal4`; using glibc-tuned instead"
    ]
    assert env == {
        "LD_PRELOAD": "/opt/a.so",
        "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
        "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def test_launch_env_falls_back_to_plain_default_without_glibc(tmp_path, monkeypatch):
    monkeypatch.setenv(allocator.ENV_LIBRARY_PATH, str(tmp_path))
    monkeypatch.setattr(allocator, "is_glibc", lambda: False)
    env, notes = launch_env(ProcessSettings(allocator="jemalloc"), {})
    assert env == {}
    assert notes == [
        "jemalloc not available: libjemalloc.so.2 not found; install it with "
        "`apt-get install libjemalloc2`; using glibc instead"
    ]
    env, notes = launch_env(ProcessSettings(allocator="glibc-tuned"), {})
    assert env == {}
    assert notes[0].startswith("glibc-tuned not available: needs glibc's mallopt")


def test_launch_env_notes_another_preloaded_allocator(tmp_path, monkeypatch):
    libs = fake_libraries(tmp_path, monkeypatch, "tcmalloc", "jemalloc")
    env, notes = launch_env(ProcessSettings(allocator="tcmalloc"), {"LD_PRELOAD": libs["jemalloc"]})
    assert env["LD_PRELOAD"] == f"{libs['tcmalloc']}:{libs['jemalloc']}"
    assert notes == [
        f"LD_PRELOAD already loads jemalloc ({libs['jemalloc']}), so the recipe's allocator "
        "tcmalloc may not take effect; unset LD_PRELOAD to use it"
    ]


def test_command_line(tmp_path, monkeypatch):
    libs = fake_libraries(tmp_path, monkeypatch, "tcmalloc")
    s = ProcessSettings(allocator="tcmalloc", main_threads=2)
    assert command_line(s, ["python", "train.py", "--lr", "0.1"]) == (
        f"LD_PRELOAD={libs['tcmalloc']} OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 python train.py --lr 0.1"
    )
    assert command_line(s, ["python", "my train.py"], via_run=True, recipe="r.json") == (
        "autotune run --recipe r.json -- python 'my train.py'"
    )
    assert command_line(ProcessSettings(), ["python", "train.py"]) == "python train.py"


def test_needs_fresh_process(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(allocators, "active", lambda: "glibc")
    fake_libraries(tmp_path, monkeypatch, "tcmalloc")
    assert needs_fresh_process(ProcessSettings()) is False
    assert needs_fresh_process(ProcessSettings(allocator="glibc-tuned")) is False  # mallopt at run time
    assert needs_fresh_process(ProcessSettings(allocator="tcmalloc")) is True
    assert needs_fresh_process(ProcessSettings(main_threads=1)) is False  # set_num_threads at run time
    # jemalloc is missing here, so it falls back to glibc-tuned, which needs no fresh process
    assert needs_fresh_process(ProcessSettings(allocator="jemalloc")) is False
    # a process started with tcmalloc cannot go back to glibc
    monkeypatch.setattr(allocators, "active", lambda: "tcmalloc")
    assert needs_fresh_process(ProcessSettings(allocator="tcmalloc")) is False
    assert needs_fresh_process(ProcessSettings()) is True


# ------------------------------------------------------------------ applied for real


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
@pytest.mark.timeout(120)
def test_apply_at_runtime_applies_mallopt_in_main_process():
    # One process, the default first: applying glibc changes nothing, and its BUFFER-sized buffers are
    # mmapped and unmapped, so glibc-tuned is then applied to a process as fresh as a new one.
    plain, tuned = run_child_lines(MAIN_SCRIPT, json.dumps({"allocator": "glibc"}),
                                   json.dumps({"allocator": "glibc-tuned", "main_threads": 1}), "apply")
    assert plain["applied"] == [] and plain["not_applied"] == []
    assert remapped_every_round(plain["faults"]), plain["faults"]
    assert settled(tuned["faults"]), tuned["faults"]  # the freed block is reused
    assert tuned["threads"] == 1
    assert tuned["applied"][0] == "mallopt(M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=1 GiB) in main process"
    assert tuned["applied"][1].startswith("torch.set_num_threads(1) in main process (was ")
    assert tuned["not_applied"] == []


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
@pytest.mark.timeout(120)
def test_apply_at_runtime_reports_what_needs_a_start(tmp_path):
    # tcmalloc installed but not preloaded (or missing): glibc-tuned stands in, and it says so.
    settings = {"allocator": "tcmalloc", "main_threads": 1}
    report = run_child(MAIN_SCRIPT, json.dumps(settings), "apply", env=clean_env())
    run_hint = "start training with `autotune run -- python train.py`"
    if TCMALLOC:
        assert report["not_applied"][0] == f"tcmalloc needs a preload: {run_hint}"
    else:
        assert report["not_applied"][0].startswith("tcmalloc not available: libtcmalloc_minimal.so.4 not found")
    assert len(report["not_applied"]) == 1
    assert report["applied"][0] == (
        "mallopt(M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=1 GiB) in main process, in place of tcmalloc")
    assert report["applied"][1].startswith("torch.set_num_threads(1) in main process (was ")
    assert settled(report["faults"]), report["faults"]


@pytest.fixture(scope="module")
def worker_reports() -> dict[tuple[str, str], list[dict]]:
    """loader_report of each allocator in each start method, from one fresh parent."""
    pairs = [(name, context) for context in ("fork", "spawn") for name in ("glibc", "glibc-tuned")]
    [reports] = run_child_lines(WORKER_SCRIPT, json.dumps(pairs), timeout=220)
    return dict(zip(pairs, reports))


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
@pytest.mark.timeout(240)  # the first one waits for every report
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_init_applies_mallopt_and_threads_in_workers(context, worker_reports):
    plain = worker_reports["glibc", context]
    tuned = worker_reports["glibc-tuned", context]
    for item in plain:
        assert remapped_every_round(item["faults"]), item["faults"]
        assert item["applied"] == ["torch.set_num_threads(1) in worker 0"]
    for item in tuned:
        assert settled(item["faults"]), item["faults"]
        assert item["applied"] == [
            "mallopt(M_MMAP_THRESHOLD=1 GiB, M_TRIM_THRESHOLD=1 GiB) in worker 0",
            "torch.set_num_threads(1) in worker 0",
        ]
    for item in plain + tuned:
        assert item["threads"] == 1
        assert item["chained"] == "0"  # the user's worker_init_fn still ran


def test_worker_init_pickles():
    init = worker_init(ProcessSettings(allocator="glibc-tuned", worker_threads=2), chain=mark_chained)
    again = pickle.loads(pickle.dumps(init))
    assert again == init
    assert again.settings.worker_threads == 2


@pytest.mark.skipif(not GLIBC, reason="the MALLOC_*_ variables are glibc's")
@pytest.mark.timeout(120)
def test_child_started_with_launch_env_has_tuned_glibc():
    env, notes = launch_env(ProcessSettings(allocator="glibc-tuned", main_threads=1), clean_env())
    report = run_child(MAIN_SCRIPT, json.dumps({}), "measure", env=env)
    assert notes == []
    assert report["env"]["MALLOC_MMAP_THRESHOLD_"] == str(1 << 30)
    assert report["env"]["OMP_NUM_THREADS"] == "1"
    assert settled(report["faults"]), report["faults"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["tcmalloc", "jemalloc"])
def test_child_started_with_launch_env_has_preload_mapped(name):
    path = allocators.get(name).library()
    if path is None:
        pytest.skip(f"{name} is not installed here (apt-get install {allocators.get(name).package})")
    env, notes = launch_env(ProcessSettings(allocator=name), clean_env(LD_PRELOAD="/nonexistent-but-kept.so"))
    assert notes == []
    assert env["LD_PRELOAD"] == f"{path}:/nonexistent-but-kept.so"
    report = run_child(MAIN_SCRIPT, json.dumps({"allocator": name}), "apply", env=env)
    assert os.path.realpath(path) in report["maps"] or path in report["maps"]
    assert report["applied"] == [f"{name} (preloaded at start) in main process"]
