"""The main process's share of the thread split, as an adapting loader moves it.

A configuration's ``main_threads`` is ``torch.set_num_threads`` in the training process (unset: the count
the loader found there); its ``worker_threads`` reach the workers through the factory's
``worker_init_fn``, so a new pool is all they need. The main's count is process-wide state in the
user's house: it moves only while it is still what autotune left (a count the user set meanwhile wins,
and from then on the split stays theirs), each change is logged, and ``restore`` puts back the count the
loader found, unless the user changed it since.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("autotune")


class MainThreads:
    """The training process's intra-op threads under an adapting loader (see the module docstring)."""

    def __init__(self) -> None:
        self.found = torch.get_num_threads()  # what a configuration without main_threads means
        self.left = self.found  # what autotune left it at
        self.users = False  # the user set it while the loader ran: never moved again

    def apply(self, wanted: int | None) -> bool:
        """Make the count ``wanted`` (None: the count found); False, and never again, where the user
        changed it since autotune last did."""
        if self.users:
            return False
        now = torch.get_num_threads()
        if now != self.left:
            self.users = True
            log.info("autotune adapt: the main process's threads are the user's (%d, set while the loader ran): "
                     "the thread split no longer moves", now)
            return False
        target = wanted or self.found
        if target != now:
            torch.set_num_threads(target)
            log.info("autotune adapt: torch.set_num_threads(%d) in the main process (was %d)", target, now)
        self.left = target
        return True

    def restore(self) -> None:
        """The count the loader found, where autotune's is still in place."""
        if not self.users and torch.get_num_threads() == self.left != self.found:
            torch.set_num_threads(self.found)
            log.info("autotune adapt: torch.set_num_threads(%d) in the main process, as the loader found it",
                     self.found)
        self.left = self.found
