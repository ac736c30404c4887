"""One build per cache, however many processes ask: an ``flock`` on a small file beside the cache.

NOTE [cache build lock]
~~~~~~~~~~~~~~~~~~~~~~~
A disk cache lives in ``ROOT/<backend>-<label>-<digest>``, where the digest covers everything the
cache is checked against (the dataset's identity, its source files, code, length and probed
samples). Such a directory is immutable once in place: a changed dataset has another digest, so it
gets another directory, and no build ever replaces files that a live loader has checked. The
invariants, which ``_registry.open_or_build``, ``DiskCache.build`` and ``cache clear`` rely on:

1. Only the holder of ``ROOT/.<name>.lock`` (``fcntl.flock``, exclusive) builds ``<name>``. Others
   wait (their progress bar names the holder's pid and host, which it writes into the lock file),
   then find the finished directory and open it.
2. A build writes into ``ROOT/.<name>.tmp-<pid>-<hex>`` and, manifest last, renames it to
   ``<name>`` only if ``<name>`` does not exist; it never renames over a directory.
3. The kernel releases an ``flock`` when its holder dies, so a killed builder never blocks anyone;
   the next holder removes the dead builder's temp directories (only a holder of the lock may, since
   only a holder builds) before it builds.
4. Lock files stay. Deleting one while another process waits on it would let two builders in;
   ``cache clear`` deletes one only after taking it, and a process that locked a file that was
   meanwhile unlinked notices (the inode differs from the path's) and locks the new file.
   Should two builders still finish, invariant 2 keeps the first directory and the second process
   opens it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path


def lock_path(root: Path, name: str) -> Path:
    return Path(root) / f".{name}.lock"


class BuildLock:
    """An exclusive ``flock`` on ``path`` (see NOTE [cache build lock]), held until ``release``."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._fd: int | None = None

    def _open_locked(self, blocking: bool) -> bool:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
                return True
            os.close(fd)  # the file was removed (cache clear) while we waited: lock the new one

    def try_acquire(self) -> bool:
        return self._open_locked(blocking=False)

    def holder(self) -> str:
        """"pid N on HOST" of the process holding the lock, as it wrote it, or "another process"."""
        try:
            pid, _, host = self.path.read_text().strip().partition(" ")
        except OSError:
            return "another process"
        return f"pid {pid} on {host}" if pid.isdigit() and host else "another process"

    def acquire(self, *, on_wait: Callable[[str, float], None] | None = None, poll: float = 0.05) -> None:
        """Take the lock, waiting as long as it takes; ``on_wait(holder, seconds waited)`` while waiting."""
        start = time.monotonic()
        while not self.try_acquire():
            if on_wait is not None:
                on_wait(self.holder(), time.monotonic() - start)
            time.sleep(poll)
            poll = min(poll * 1.5, 0.5)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_free(path: Path | str) -> bool:
    """Whether nobody holds the lock at ``path`` now (a missing file is free)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


__all__ = ["BuildLock", "is_free", "lock_path"]
