"""A deadline for the reads autotune makes of the user's data in its own process.

A read in the main thread cannot be interrupted safely (a dead network mount blocks in the kernel, an
endless loop holds the interpreter), so a thread watches it instead: when a read outlives its allowance, or
the deadline passes while one runs, the thread prints one line naming what was being read and ends the
process with exit 2 when it is the ``autotune`` command's (``own_the_process``); in a user's process
(``autotune.search()``) it interrupts the main thread instead, which raises one DatasetError, where that
reaches the read: the block runs in the main thread (else it warns and waits). The interruption is a real
SIGINT (it wakes a sleep or a wait, EINTR), taken by a handler ``guarded`` puts in front of the
program's for the block's length: autotune's own interruption ends the read, a real Ctrl-C goes on to
the program's handler (a training script's checkpointing one, Python's KeyboardInterrupt, or none where
it ignores SIGINT), which is back in place when the block ends. Every read inside ``guarded`` is watched;
``reading`` names the one under way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from autotune.errors import DatasetError

EXIT_CODE = 2
log = logging.getLogger("autotune")

_lock = threading.Lock()
_reads: list[tuple[str, float, bool]] = []  # what is being read now, innermost last: since when, one read or not
_armed: list[tuple[float, float, str]] = []  # (deadline, longest one read may take, the fix to name)


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """Mark ``what`` ("dataset[17]", "len(dataset)") as being read, for the watchdog's message."""
    with _lock:
        _reads.append((what, time.monotonic(), True))
    try:
        yield
    finally:
        with _lock:
            _reads.pop()


def _overdue(now: float) -> str | None:
    with _lock:
        if not _armed:
            return None
        deadline, per_read, fix = _armed[-1]
        what, started, one_read = _reads[-1]
    running = now - started
    causes = (f"a read that hangs (a dead network mount, a lock, an endless loop in __getitem__), a very slow "
              f"one, or a budget too small for this machine; {fix}")
    if now >= deadline:
        return f"the budget ran out while autotune read {what} (for {running:.0f} s): {causes}"
    if one_read and running >= per_read:
        return f"{what} had not returned after {running:.0f} s (a quarter of the budget): {causes}"
    return None


def _watch(stop: threading.Event, interruptible: bool) -> None:
    while not stop.wait(0.1):
        problem = _overdue(time.monotonic())
        if problem is not None:
            if not _process_is_ours[0] and not interruptible:
                # A SIGINT would not reach the read: it runs outside the main thread, which would get a Ctrl-C
                # of nobody's making. Said, never forced.
                log.warning("autotune: %s; it cannot be interrupted here, so it is waited for", problem)
                return
            if not _process_is_ours[0]:
                # The user's process (autotune.search(), a notebook, a test): never ended from here. The main
                # thread is interrupted as Ctrl-C would be; ``guarded`` turns that into one DatasetError. A read
                # blocked in the kernel stays blocked, as it would without autotune.
                _hung.append(problem)
                # a real SIGINT to the main thread: it wakes a sleep or a wait (EINTR), which interrupt_main's
                # simulated one does not
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                return
            try:
                print(f"autotune: error: {problem}", file=sys.stderr, flush=True)
            finally:
                os._exit(EXIT_CODE)  # the command's own process, its read holding the main thread


@contextlib.contextmanager
def guarded(deadline: float, per_read: float, fix: str = "fix that read, or pass a larger --budget",
            what: str = "the dataset") -> Iterator[None]:
    """Watch the block: nothing in it may run past ``deadline`` (time.monotonic()), and no read named by
    ``reading`` may take longer than ``per_read`` seconds. Nested blocks use the innermost deadline."""
    with _lock:
        _armed.append((deadline, per_read, fix))
        # whatever runs in the block between named reads (a check reading samples its own way) is under the
        # deadline too, not under the limit of one read
        _reads.append((what, time.monotonic(), False))
    stop = threading.Event()
    interruptible = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _before(signal.getsignal(signal.SIGINT))) if interruptible else None
    thread = threading.Thread(target=_watch, args=(stop, interruptible), name="autotune-watchdog", daemon=True)
    thread.start()
    try:
        yield
    except KeyboardInterrupt:
        if not _hung:
            raise
        raise DatasetError(_hung.pop()) from None
    finally:
        stop.set()
        thread.join()
        if interruptible:
            signal.signal(signal.SIGINT, previous)
        with _lock:
            _armed.pop()
            _reads.pop()


def _before(program: Any) -> Callable[[int, Any], None]:
    """A SIGINT handler in front of ``program``'s: autotune's own interruption of a hung read raises
    KeyboardInterrupt (``guarded`` makes it a DatasetError); any other SIGINT is the program's."""

    def handler(signum: int, frame: Any) -> None:
        if _hung:
            raise KeyboardInterrupt
        if callable(program):
            program(signum, frame)
        elif program == signal.SIG_DFL:  # what an unhandled SIGINT does: the process ends by it
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        # SIG_IGN (or None, a handler not set from Python): ignored, as it would be

    return handler


def own_the_process() -> None:
    """Called by the ``autotune`` command: its process is autotune's, so a hung read may end it (exit 2)."""
    _process_is_ours[0] = True


_process_is_ours = [False]
_hung: list[str] = []
