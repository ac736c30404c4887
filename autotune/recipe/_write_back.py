"""What an adapting run learned, written into its profile's place in the recipe file.

A write reads, merges and rewrites the recipe atomically under its lock, with two fsyncs: 16-40 ms on the
2-vCPU VMs, which the training loop waits for, and which the policy charges to its exploration budget as
the loader's own time. Written after every epoch, it cost a 1.3 s epoch 1-3% of the run, the whole of the
no-regret bound. The invariant: **the writes between the first and the last take at most ``SHARE`` of the
run's wall time, and the record on disk is whole whenever the run ends by returning** — the first epoch's record is
written at once (a run killed early still leaves one), each later write waits until the run has gone on
``1 / SHARE`` times as long as the last write took, and what is left is written at the loader's ``close()``
and at the interpreter's exit. A run killed by a signal loses at most the epochs since the last write.

The exit write: **the exit hook references a WriteBack exactly while it holds a record not yet on disk.** One
hook for the module (``_flush_pending``, registered once) writes every WriteBack in ``_pending``; a WriteBack
enters it when an epoch's record is left for later and leaves it when ``flush()`` takes the record (written,
failed, or in a forked child, which never writes the parent's record), so one with nothing pending is collected
with its loader. Each WriteBack registering its own ``flush`` kept every one, its profile and its last record,
until the interpreter exited: a Hugging Face Trainer makes a loader at every ``evaluate()``. The hook's order
among the exit hooks does not matter: a write reads and rewrites only the recipe file (``caches/_disk_fill``'s
``close_all`` re-registers itself to run first, for h5py's sake, and still does).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
from typing import Any

from autotune.errors import AutotuneError
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._learned import Learned, record

__all__ = ["SHARE", "WriteBack"]

SHARE = 0.005  # of the run's wall time, at most, spent writing what it learned

_pending: dict[int, WriteBack] = {}  # id -> a WriteBack whose latest record is not on disk yet
_lock = threading.Lock()


def _fresh_lock() -> None:
    global _lock
    _lock = threading.Lock()  # a fork taken while another thread held it leaves the child's copy held


def _flush_pending() -> None:
    """The exit hook: write every record of this process not yet on disk (a forked child's copy of the
    parent's ``_pending`` is not its own to write)."""
    with _lock:
        waiting = [w for w in _pending.values() if w._pid == os.getpid()]
    for write_back in waiting:
        write_back.flush()


atexit.register(_flush_pending)
os.register_at_fork(after_in_child=_fresh_lock)


class WriteBack:
    """Called with each epoch's event and the loader (``AdaptiveLoader``'s ``on_epoch``); ``flush()`` writes
    what is not yet on disk. Holds the latest record, never the loader, so the loader is collected as before; the
    exit hook holds it only while that record is not on disk."""

    def __init__(self, path: str | os.PathLike[str], profile: Profile, mode: str, batch_size: int | None,
                 length: int | None, *, clock: Any = time.monotonic) -> None:
        self.path = path
        self.profile = profile
        self.mode = mode
        self.batch_size = batch_size
        self.length = length
        self.writes = 0
        self._clock = clock
        self._latest: Learned | None = None  # not yet on disk
        self._due = float("-inf")
        self._failed = False
        self._pid = os.getpid()  # a child forked from the training process never writes the parent's record

    def __call__(self, event: Any, loader: Any) -> None:
        if self._failed:
            return
        latest = record(self.mode, loader.policy, loader.history.events, self.batch_size, self.length,
                        previous=self.profile.learned)
        with _lock:
            self._latest = latest
            _pending[id(self)] = self  # until flush() takes it: written at the interpreter's exit at the latest
        if self._clock() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Write the latest record if it is not on disk yet; said once if it cannot be, and the training goes on."""
        with _lock:
            learned, self._latest = self._latest, None
            _pending.pop(id(self), None)
        if learned is None or self._failed or os.getpid() != self._pid:
            return
        began = self._clock()
        try:
            RecipeFile.learn(self.path, self.profile, learned)
        except (OSError, AutotuneError) as exc:
            self._failed = True
            warnings.warn(f"autotune could not write what the run learned to {self.path}: {exc}", stacklevel=2)
            return
        ended = self._clock()
        self.writes += 1
        self._due = ended + (ended - began) / SHARE
