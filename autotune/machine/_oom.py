"""Who the kernel's OOM killer ends first, and whether it ended someone.

Over a job's memory limit the kernel kills the task with the highest badness: its resident memory plus
``oom_score_adj`` thousandths of the limit. The search process is the largest in its job (torch, Optuna,
the dataset), so left alone the kernel killed the search itself when a trial went over (a 307 MiB cgroup,
10,000 JPEGs). The invariant: **an OOM inside the job kills a process autotune started for a trial (a trial
process, its DataLoader workers, the trial forkserver), never the search or the user's own process**. Each
of those raises its own ``oom_score_adj`` to the most (raising needs no privilege; the children it starts
inherit the score across fork and exec), so at 1000 it is chosen before any process at 0; the user's
process, and the search in it, is never changed. ``oom_kills`` counts the kernel's OOM kills in this job,
so a trial that died of one is recorded as such, naming the limit, and the search goes on.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from autotune.machine._cpus import _dirs_up, _own_cgroup_paths, _read

__all__ = ["EXPENDABLE", "make_expendable", "oom_kills", "oom_score_adj"]

EXPENDABLE = 1000  # the most: chosen before every process the kernel may weigh at 0


def _score_file(pid: int | None) -> Path:
    return Path(f"/proc/{pid if pid else 'self'}/oom_score_adj")


def oom_score_adj(pid: int | None = None) -> int | None:
    """The process's ``oom_score_adj`` (this one's by default), None where it cannot be read."""
    text = _read(_score_file(pid))
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def make_expendable(pid: int | None = None) -> bool:
    """Raise ``pid``'s (this process's by default) ``oom_score_adj`` to ``EXPENDABLE``: only ever called in, or
    on, a process autotune started for trials. Never lowers a score; False where it could not be set."""
    now = oom_score_adj(pid)
    if now is None:
        return False
    if now >= EXPENDABLE:
        return True
    with contextlib.suppress(OSError):
        _score_file(pid).write_text(str(EXPENDABLE))
        return True
    return False


def _count(text: str | None) -> int:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def oom_kills(cgroup_root: str | Path = "/sys/fs/cgroup", *, cgroup_path: str | None = None,
              vmstat: str | Path = "/proc/vmstat") -> int:
    """The kernel's OOM kills so far that could have hit this process: in its cgroup and each parent (v2
    ``memory.events``, v1 ``memory.oom_control``) and on the host (``/proc/vmstat``). Only its growth means
    anything: compare a count taken before a trial with one taken after it."""
    root = Path(cgroup_root)
    own = _own_cgroup_paths() if cgroup_path is None else {"": cgroup_path, "memory": cgroup_path}
    total = _count(_read(Path(vmstat)))
    for unified in (root, root / "unified"):
        for folder in _dirs_up(unified, own.get("")):
            total += _count(_read(folder / "memory.events"))
    mount = root / "memory"
    if mount.is_dir():
        for folder in _dirs_up(mount, own.get("memory")):
            total += _count(_read(folder / "memory.oom_control"))
    return total
