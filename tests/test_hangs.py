"""A dataset that hangs gets one line naming the read that hung and exit 2, within the budget: every read
autotune makes of the user's data in its own process runs under the watchdog (dataset/_watchdog.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(180)

HANGS = """
import time
import torch
from torch.utils.data import Dataset

HANG = {hang}

class Hangs(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if HANG is None or i == HANG:
            time.sleep(10 ** 6)  # a dead network mount
        return torch.full((4,), float(i))

dataset = Hangs()
batch_size = 8
"""


def _search(tmp_path, hang, budget="20s"):
    (tmp_path / "hangs.py").write_text(textwrap.dedent(HANGS.format(hang=hang)))
    return subprocess.run([sys.executable, "-m", "autotune", "search", "hangs.py", "--budget", budget, "--no-progress"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=150)


@pytest.mark.parametrize("hang, index", [(None, 0), (63, 63)])
def test_a_hanging_read_is_one_line_naming_the_index_and_exit_2(tmp_path, hang, index):
    """Every index hanging (the file's first sample) and only the last one (the determinism check reads it).
    On 9eac6c3 both ran on with no output (180 s and more for a 20 s budget)."""
    run = _search(tmp_path, hang)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.count("\n") == 1, run.stderr
    assert f"autotune: error: dataset[{index}] had not returned after " in run.stderr
    assert "a read that hangs" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "autotune.json").exists()


def test_an_index_only_a_trial_reads_is_named_and_the_search_ends_at_its_wall(tmp_path):
    """dataset[5] is read by no check in the search's own process (the probe, determinism, fingerprint and
    per-epoch-state reads miss it): the trial that hangs on it is given up at the budget, asked which index
    it is reading, and the search's one line names it. On 9eac6c3: 87 s for a 20 s budget, no index."""
    # The budget counts from the process start: room for the imports, the preparation and a trial (20 s were spent
    # before the first trial on a slow 2-vCPU VM at pytest -n 4).
    run = _search(tmp_path, 5, budget="40s")
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.count("\n") == 1, run.stderr
    assert "could not be measured: timed out after" in run.stderr
    assert "dataset[5] had not returned after" in run.stderr


def test_the_deadline_holds_between_named_reads_too():
    """Code in a guarded block that reads the data its own way (no ``reading`` label) still ends at the
    deadline, and a named read nested in it is still held to its own limit."""
    code = textwrap.dedent("""
        import time
        from autotune.dataset import guarded, reading
        from autotune.dataset._watchdog import own_the_process
        own_the_process()  # as the autotune command does: its own process may be ended
        with guarded(time.monotonic() + 1.0, 100.0):
            with reading("dataset[3]"):
                pass
            time.sleep(100)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "the budget ran out while autotune read the dataset" in run.stderr, run.stderr
    code = textwrap.dedent("""
        import time
        from autotune.dataset import guarded, reading
        from autotune.dataset._watchdog import own_the_process
        own_the_process()  # as the autotune command does: its own process may be ended
        with guarded(time.monotonic() + 100.0, 1.0):
            time.sleep(1.5)  # longer than one read may take, but no named read: only the deadline holds
            with reading("dataset[3]"):
                time.sleep(100)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "dataset[3] had not returned after 1 s" in run.stderr, run.stderr
