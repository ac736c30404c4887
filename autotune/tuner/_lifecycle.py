"""How a search and its trials live and die: signals stop the search cleanly, a trial dies with its parent,
and the folders of a search that was killed anyway are found and removed later.

- ``stop_on_signals``: SIGTERM and SIGHUP (a scheduler's pre-emption, a closed terminal) raise ``Stopped``
  in the search, so the ``finally`` blocks that stop a trial's process tree and remove its folder run, as
  they do for Ctrl-C (KeyboardInterrupt). The command line exits 128 + the signal's number.
- ``stop_held``: inside a trial process, a stop signal that arrives while a DataLoader starts its workers waits
  until they are started. torch's ``_MultiProcessingDataLoaderIter.__init__`` interrupted half-way leaves an
  object whose ``__del__`` fails ("Exception ignored ... no attribute '_workers_status'") and workers it no
  longer tracks; started whole, the iterator stops them cleanly as the stop unwinds.
- ``watch_parent``: inside a trial process, a thread that kills the trial's whole tree the moment its
  parent is gone (the search was killed with SIGKILL), even when the trial's main thread is stuck in a read.

Each trial's cache folder is named after the host and process id of the search that made it
(``autotune.caches._trials``), so a later search and ``autotune cache clear`` can tell a dead search's
leftovers from a live one's folders.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_HELD: list[int | None] = [0, None]  # how deep inside ``stop_held``, and the exit a held stop asked for


class Stopped(BaseException):
    """The search received a stop signal; unwinds like KeyboardInterrupt (not caught as an error)."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``Stopped`` in the main thread; a second signal (or Ctrl-C)
    during the clean-up is ignored so the clean-up finishes. Does nothing outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, signal.SIGINT)}

    def handler(signum: int, frame: object) -> None:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # unwinding must not be interrupted again
        raise Stopped(signum)

    def interrupt(signum: int, frame: object) -> None:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt

    for s in STOP_SIGNALS:
        signal.signal(s, handler)
    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def watch_parent(parent: int, interval: float = 0.25) -> threading.Thread:
    """A daemon thread that, once ``parent`` is no longer this process's parent, kills every descendant of
    this process and then this process. Works while the main thread is blocked in a read (the thread needs
    only the GIL, which a blocking read releases)."""

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(interval)
        kill_descendants()
        os._exit(143)

    thread = threading.Thread(target=watch, name="autotune-parent-watch", daemon=True)
    thread.start()
    return thread


def kill_descendants() -> None:
    """SIGKILL every process below this one (DataLoader workers, a resource tracker)."""
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing or the tree changing under us: nothing to do
        return
    for child in children:
        with contextlib.suppress(Exception):
            child.kill()


@contextlib.contextmanager
def stop_held() -> Iterator[None]:
    """While inside, ``stop_or_hold`` only notes the stop; it is raised on leaving (see the module's note)."""
    _HELD[0] = int(_HELD[0] or 0) + 1
    try:
        yield
    finally:
        _HELD[0] = int(_HELD[0] or 1) - 1
        code = _HELD[1]
        if not _HELD[0] and code is not None:
            _HELD[1] = None
            raise SystemExit(code)


def stop_or_hold(code: int) -> None:
    """Raise ``SystemExit(code)`` now, or on leaving ``stop_held`` when inside it (a signal handler's stop)."""
    if _HELD[0]:
        _HELD[1] = code
        return
    raise SystemExit(code)
