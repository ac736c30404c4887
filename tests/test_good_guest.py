"""The user's process is a guest house: the factory changes threads and the allocator only for a recipe that
measured a gain, never over a value the user set (and says which won), and logs each change."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import logging, sys, warnings
sys.path.insert(0, {tests!r})
import torch
from test_show_check import make_profile
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import RecipeFile
from autotune.recipe._measured import Interval
import dataclasses, autotune

{before}
profile = make_profile(hardware.collect(), 0)
measured = dataclasses.replace(profile.measured, interval={interval})
profile = dataclasses.replace(profile, config=LoaderConfig(main_threads={threads}, cache=None), measured=measured)
RecipeFile.merge_write("autotune.json", profile)
logging.basicConfig(level=logging.INFO, format="LOG %(message)s", stream=sys.stdout)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    autotune.dataloader(list(range(8)), "autotune.json", batch_size=4, progress=False)
for w in seen:
    print("WARN", w.message)
print("THREADS", torch.get_num_threads())
"""


def _run(tmp_path, *, before="", threads=1, interval="Interval(3.3, 3.0, 3.6)", env=None):
    code = textwrap.dedent(SCRIPT.format(tests=str(ROOT / "tests"), before=before, threads=threads,
                                         interval=interval))
    import os

    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=150,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _default_threads() -> int:
    """A fresh process's: an earlier test in this one may have set torch's threads (the suite's workers)."""
    import os

    run = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=True, env=dict(os.environ))
    return int(run.stdout)


def test_the_users_thread_count_wins_and_the_report_says_so(tmp_path):
    """On 9eac6c3 the factory replaced an explicit torch.set_num_threads(1) with the recipe's count."""
    theirs = 1 if _default_threads() != 1 else 3
    out = _run(tmp_path, before=f"torch.set_num_threads({theirs})", threads=theirs + 1)
    assert f"THREADS {theirs}" in out
    assert f"the user's torch.set_num_threads({theirs}) kept (set by the user" in out


def test_the_users_environment_wins_too(tmp_path):
    out = _run(tmp_path, threads=2, env={"OMP_NUM_THREADS": "1"})
    assert "THREADS 1" in out and "the user's OMP_NUM_THREADS=1 kept" in out


def test_torchs_default_is_changed_for_a_measured_gain_with_one_log_line(tmp_path):
    default = _default_threads()
    wanted = 1 if default != 1 else 2
    out = _run(tmp_path, threads=wanted)
    assert f"THREADS {wanted}" in out
    lines = [line for line in out.splitlines() if "torch.set_num_threads" in line]
    assert lines == [f"LOG autotune applied: torch.set_num_threads({wanted}) in main process (was torch's default "
                     f"{default})"]


def test_no_measured_gain_leaves_the_process_alone(tmp_path):
    """A recipe whose interval holds 1 (an older version's recipe could carry one): threads untouched."""
    default = _default_threads()
    out = _run(tmp_path, threads=1 if default != 1 else 2, interval="Interval(1.01, 0.9, 1.12)")
    assert f"THREADS {default}" in out
    assert "left this process's allocator and threads alone: the recipe measured no gain" in out
