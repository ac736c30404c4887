"""A read that hangs in the user's own process (``autotune.search()``, a notebook, a test) raises one
DatasetError there; only the ``autotune`` command's own process is ended with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from autotune.dataset._watchdog import guarded, reading
from autotune.errors import DatasetError


def test_a_hang_in_a_users_process_raises_instead_of_ending_it():
    woke = []
    with pytest.raises(DatasetError, match=r"^dataset\[3\] had not returned after \d+ s"):
        with guarded(time.monotonic() + 60, 0.5):
            with reading("dataset[3]"):
                time.sleep(30)
                woke.append(True)
    assert woke == [], "the hung read was interrupted, not waited out"
    assert os.getpid()  # still here: the process was not ended


def test_the_commands_own_process_ends_with_exit_2_and_one_line():
    code = ("import time\nfrom autotune.dataset._watchdog import guarded, reading, own_the_process\n"
            "own_the_process()\nwith guarded(time.monotonic() + 60, 0.5):\n"
            "    with reading('dataset[7]'):\n        time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("autotune: error: dataset[7] had not returned after") and done.stderr.count("\n") == 1
