"""A cache in use is never removed: every opened disk cache holds a shared lease on its folder.

The lease is ``flock(LOCK_SH)`` on ``LEASE`` inside the cache's folder, taken by ``DiskCache.open``
and held by the ``Cache`` object for its life: forked DataLoader workers inherit the open file
description (the lock lasts while any process holds it), a worker started by spawn or forkserver
takes its own when it unpickles the cache, and the kernel releases it when the last holder closes
it or dies. Whoever removes a cache (``cache clear``, a rebuild of an invalid one) first takes the
lease exclusively without waiting (``exclusive``); a leased cache is skipped and named as in use.

The race: the folder may be set aside between a reader's open of the lease file and its lock. So a
reader locks the file it opened through the folder's descriptor, then checks the folder's name
still leads to that folder (same inode); if not, the cache it opened is gone and it says so
(FileNotFoundError), so the caller builds or opens the cache that is there now. A remover holds
its exclusive lease while it renames the folder aside, so no reader locks a folder being removed.
"""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path
from typing import Any

LEASE = ".lease"


def _lock(path: Path, mode: int) -> int:
    """An ``flock(mode)`` on ``path/LEASE``, taken through the folder's descriptor; its descriptor.
    FileNotFoundError when the folder is no longer at ``path`` once locked; BlockingIOError when
    ``mode`` does not wait and someone else holds it."""
    folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open(LEASE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        try:
            fcntl.flock(fd, mode)
            try:
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(folder).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                raise FileNotFoundError(f"The cache at {path} was removed while it was being opened.")
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        os.close(folder)


class Lease:
    """A shared lease on the cache folder ``path``, held until the object is gone (or ``release``)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._fd = _lock(self.path, fcntl.LOCK_SH)
        self._release = weakref.finalize(self, os.close, self._fd)

    def release(self) -> None:
        self._release()

    @property
    def held(self) -> bool:
        return self._release.alive

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}  # a descriptor does not cross a pickle: the receiver takes its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]


def exclusive(path: Path | str) -> int | None:
    """The lease on ``path`` taken exclusively, without waiting: its descriptor (close it to release),
    or None when a loader holds it (or the folder is gone)."""
    try:
        return _lock(Path(path), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, FileNotFoundError, NotADirectoryError):
        return None


def in_use(path: Path | str) -> bool:
    """Whether a loader holds the lease on ``path`` now. Read-only: a folder without a lease file was
    never opened by a loader; with one, an exclusive lock is tried without waiting and let go at once
    (a reader opening meanwhile waits that instant for its shared one)."""
    try:
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fd = os.open(LEASE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return False
    finally:
        os.close(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock, if it got one
    return False


__all__ = ["LEASE", "Lease", "exclusive", "in_use"]
