"""What an adapting run learned, written into its profile's place in the recipe file.

A write reads, merges and rewrites the recipe atomically under its lock, with two fsyncs: 16-40 ms on the
2-vCPU VMs, which the training loop waits for, and which the policy charges to its exploration budget as
the loader's own time. Written after every epoch, it cost a 1.3 s epoch 1-3% of the run, the whole of the
no-regret bound. The invariant: **the writes between the first and the last take at most ``SHARE`` of the
run's wall time, and the record on disk is whole whenever the run ends by returning** — the first epoch's record is
written at once (a run killed early still leaves one), each later write waits until the run has gone on
``1 / SHARE`` times as long as the last write took, and what is left is written at the loader's ``close()``
and at the interpreter's exit. A run killed by a signal loses at most the epochs since the last write.
"""

from __future__ import annotations

import atexit
import os
import time
import warnings
from typing import Any

from autotune.errors import AutotuneError
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._learned import Learned, record

__all__ = ["SHARE", "WriteBack"]

SHARE = 0.005  # of the run's wall time, at most, spent writing what it learned


class WriteBack:
    """Called with each epoch's event and the loader (``AdaptiveLoader``'s ``on_epoch``); ``flush()`` writes
    what is not yet on disk. Holds the latest record, never the loader, so the loader is collected as before."""

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
        atexit.register(self.flush)

    def __call__(self, event: Any, loader: Any) -> None:
        if self._failed:
            return
        self._latest = record(self.mode, loader.policy, loader.history.events, self.batch_size, self.length,
                              previous=self.profile.learned)
        if self._clock() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Write the latest record if it is not on disk yet; said once if it cannot be, and the training goes on."""
        learned, self._latest = self._latest, None
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
