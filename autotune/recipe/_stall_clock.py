"""The real step's stall: how long the training loop waits inside ``next()`` for each batch.

Two clock reads a batch on the host: on entering ``next()`` (the step on the previous batch is done, as
far as the host knows) and on leaving it. With CUDA a step returns before its kernels finish, so the
host's wait can overlap the device's work and look like a stall where there is none. ``DeviceClock``
also records a CUDA event at both reads: the device is idle between the step's end and the data's
arrival exactly when the second event completes after the first, and ``elapsed_time`` between the two
is that idle time, read at the epoch's end (one synchronisation an epoch, none a batch).
"""

from __future__ import annotations

import time
from typing import Any


class HostClock:
    """Host time only: right without an accelerator, or for a step that synchronises."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self._entered = 0.0

    def now(self) -> float:
        return time.perf_counter()

    def enter(self) -> float:
        self._entered = time.perf_counter()
        return self._entered

    def leave(self) -> float:
        left = time.perf_counter()
        self.waits.append(left - self._entered)
        return left

    def epoch_waits(self) -> list[float]:
        """Each batch's wait this epoch, in seconds; starts the next epoch's list."""
        waits, self.waits = self.waits, []
        return waits


class DeviceClock(HostClock):
    """The host's clock for the epoch, and CUDA events for the waits (module docstring). ``event`` makes one
    timing event (``torch.cuda.Event(enable_timing=True)`` unless given)."""

    def __init__(self, event: Any = None) -> None:
        super().__init__()
        if event is None:
            import torch

            def event() -> Any:
                return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._event = event
        self._pairs: list[tuple[Any, Any]] = []
        self._open: Any = None

    def enter(self) -> float:
        self._open = self._event()
        self._open.record()
        return super().enter()

    def leave(self) -> float:
        left = super().leave()
        done = self._event()
        done.record()
        self._pairs.append((self._open, done))
        return left

    def epoch_waits(self) -> list[float]:
        host = super().epoch_waits()
        pairs, self._pairs = self._pairs, []
        if not pairs:
            return host
        pairs[-1][1].synchronize()  # the epoch's last event: every earlier one has completed too
        # the device's idle time, never more than the host waited (an event pair spans the host's wait)
        return [min(h, start.elapsed_time(end) / 1e3) for h, (start, end) in zip(host, pairs, strict=True)]


def clock_for_this_process() -> HostClock:
    """``DeviceClock`` where CUDA is initialised in this process (a step that uses it), else ``HostClock``."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return DeviceClock()
    return HostClock()
