"""What autotune may delete: only folders it marked as its own when it made them.

Every folder autotune makes to delete later (a trial's folder, a fill's staging folder, a build's or a
commit's temporary folder, a cache set aside) gets ``MARKER`` inside it at once, written by the
process that made it. Before anything is removed, ``is_own`` checks the folder and its marker: a real
folder (not a symlink) owned by this user, holding a regular marker file owned by this user. A name
that looks like autotune's (``trial-*``, ``.pickle-*.tmp-*``) is never enough: a user's
``trial-2024/`` or a folder of that shape holding a user's file stays. A cache folder's mark is its
manifest (``_registry`` reads it as JSON, never as a payload).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from pathlib import Path

MARKER = ".autotune-own"


def mark(path: str | os.PathLike[str], kind: str) -> None:
    """Write the marker into the folder ``path`` that this process just made (``kind`` says what it is)."""
    target = Path(path) / MARKER
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps({"kind": kind, "pid": os.getpid(), "host": socket.gethostname()}).encode())
    finally:
        os.close(fd)


def make_own(path: str | os.PathLike[str], kind: str) -> Path:
    """Create the folder ``path`` (mode 0o700, whatever the umask) and mark it; FileExistsError if it exists."""
    path = Path(path)
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    mark(path, kind)
    return path


def _owned_by_me(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid()


def _stats(path: str | os.PathLike[str]) -> tuple[os.stat_result, os.stat_result] | None:
    """The folder's and its marker's own stats (no link followed) when both are what a mark is."""
    try:
        folder = os.lstat(path)
        marker = os.lstat(Path(path) / MARKER)
    except OSError:
        return None
    return (folder, marker) if stat.S_ISDIR(folder.st_mode) and stat.S_ISREG(marker.st_mode) else None


def is_marked(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder (not a symlink) holding autotune's marker, whoever owns it."""
    return _stats(path) is not None


def is_own(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder autotune marked as its own, made by this user (see the module docstring)."""
    found = _stats(path)
    return found is not None and _owned_by_me(found[0]) and _owned_by_me(found[1])


def remove_own(path: str | os.PathLike[str]) -> bool:
    """Remove ``path`` if it is autotune's own (``is_own``); whether it was. ``shutil.rmtree`` follows no
    symlink inside it."""
    if not is_own(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


__all__ = ["MARKER", "is_marked", "is_own", "make_own", "mark", "remove_own"]
