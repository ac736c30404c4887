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


def test_a_hang_outside_the_main_thread_is_never_a_ctrl_c_in_the_main_thread():
    """autotune.search() called from a thread of the user's: the main thread is not the reader, and a SIGINT
    sent to it would be a Ctrl-C of nobody's making there. The hang is said, and waited for."""
    code = ("import threading, time\nfrom autotune.dataset._watchdog import guarded, reading\n"
            "def search():\n    with guarded(time.monotonic() + 60, 0.3):\n"
            "        with reading('dataset[5]'):\n            time.sleep(1.5)\n"
            "t = threading.Thread(target=search)\nt.start()\ntime.sleep(3)\nt.join()\n"
            "print('the main thread was left alone')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "the main thread was left alone\n"), done.stderr
    assert "dataset[5] had not returned after" in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_a_programs_own_sigint_handler_is_never_fired_by_autotune_and_still_gets_a_real_ctrl_c():
    """autotune's interruption of a hung read is taken by its own handler in front of the program's, so the
    program's (a training script's checkpointing one) never runs for it; a real Ctrl-C meanwhile goes on to
    the program's handler; the program's is back in place after the block."""
    import signal

    fired = []

    def programs(signum, frame):
        fired.append(signum)

    before = signal.signal(signal.SIGINT, programs)
    try:
        with pytest.raises(DatasetError, match=r"^dataset\[4\] had not returned after"):
            with guarded(time.monotonic() + 60, 0.3):
                with reading("dataset[4]"):
                    time.sleep(30)
        assert fired == [], "the program's Ctrl-C handler ran though nobody pressed Ctrl-C"
        with guarded(time.monotonic() + 60, 30):
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, no read hung
            time.sleep(0.2)
        assert fired == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is programs
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_hang_inside_a_search_that_handles_sigint_itself_is_interrupted():
    """Inside autotune.search() SIGINT is the search's own handler (``stop_on_signals``): a hung read there
    must still end in one DatasetError, not a search waiting on the read forever."""
    from autotune.tuner._lifecycle import stop_on_signals

    with stop_on_signals():
        with pytest.raises(DatasetError, match=r"^dataset\[2\] had not returned after"):
            with guarded(time.monotonic() + 60, 0.3):
                with reading("dataset[2]"):
                    time.sleep(30)
