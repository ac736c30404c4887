"""Trial folders: the cache folder of one trial, under the search's cache root.

Each is named after the host and process id of the search that made it (``trial-HOST-PID-RANDOM``), so
a later search (``remove_leftovers``) and ``autotune cache clear`` can tell a dead search's leftovers
from a live one's folders. A trial holds ``TRIAL_LOCK`` in its folder while it lives.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from autotune.caches._own import is_own, mark, remove_own

TRIAL_LOCK = ".trial.lock"
_PREFIX = "trial-"


def _host() -> str:
    name = socket.gethostname() or "host"
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name)[:64]


def remove_trial_folder(path: str | os.PathLike[str]) -> bool:
    """Remove a trial folder ``trial_folder`` made (whether it was autotune's own: ``_own``)."""
    return remove_own(path)


def trial_folder(root: str | os.PathLike[str]) -> str:
    """A new, empty folder for one trial under ``root``: ``trial-HOST-PID-RANDOM``."""
    os.makedirs(root, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f"{_PREFIX}{_host()}-{os.getpid()}-", dir=root)
    mark(folder, "trial")
    return folder


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (killed, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc to ask: it exists
    return state not in (b"Z", b"X")


def is_leftover(path: Path) -> bool:
    """A trial folder whose search is gone: made on this host by a process that no longer exists, or by an
    older autotune that did not name its folders (``trial-RANDOM``). Another host's folders are left alone.
Only a folder autotune marked as its own (``_own``) is ever removed as one."""
    parts = path.name[len(_PREFIX):].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return True
    host, pid = parts[0], int(parts[1])
    return host == _host() and not _alive(pid)


def leftover_trials(root: str | os.PathLike[str]) -> list[Path]:
    """The trial folders under ``root`` left by searches that were killed (see ``is_leftover``)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX) and is_own(p) and is_leftover(p))


def remove_leftovers(root: str | os.PathLike[str]) -> list[Path]:
    """Remove the leftover trial folders under ``root``; the ones removed."""
    return [path for path in leftover_trials(root) if remove_own(path)]
