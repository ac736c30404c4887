"""A helper process autotune forks must not outlive the process that forked it."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent exits (prctl PR_SET_PDEATHSIG); False where
    the call does not exist. Cleared across fork, so each process that wants it must ask itself."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False
