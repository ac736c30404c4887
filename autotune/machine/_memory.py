"""Memory of a process and its descendants (the DataLoader workers), and the budget it must fit."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psutil

from autotune.machine._memory_limit import job_memory

BUDGET_SHARE = 0.7  # of what is available: the rest is the training's own growth and the kernel's


def _pss(proc: psutil.Process) -> int:
    try:
        info = proc.memory_full_info()  # reads smaps_rollup: costly, so callers sample sparsely
        return int(getattr(info, "pss", 0) or info.rss)
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return int(proc.memory_info().rss)


def _tree_total(pid: int | None, read: Callable[[Any], int]) -> int:
    """``read(process)`` summed over ``pid`` and all its descendants (the DataLoader workers)."""
    try:
        root = psutil.Process(pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += read(proc)
        except psutil.NoSuchProcess:
            continue  # a worker that exited between listing and reading
    return total


def tree_pss(pid: int | None = None) -> int:
    """PSS (RSS where the OS has no PSS) summed over ``pid`` and all its descendants, in bytes.

    PSS splits shared pages between the processes sharing them, so a forked worker that only reads
    its parent's buffers adds little; RSS would count those pages once per worker.
    """
    return _tree_total(pid, _pss)


def process_uss(pid: int | None = None) -> int:
    """The memory only this process holds (USS: its private pages; RSS where it cannot be read), in bytes:
    what a fresh process with the same imports would add to the job."""
    try:
        proc = psutil.Process(pid or os.getpid())
        try:
            return int(getattr(proc.memory_full_info(), "uss", 0) or proc.memory_info().rss)
        except (psutil.AccessDenied, psutil.ZombieProcess):
            return int(proc.memory_info().rss)
    except psutil.NoSuchProcess:
        return 0


def tree_rss(pid: int) -> int:
    """Cheap RSS of a process tree (from statm), for the guard that stops runaway trials."""
    return _tree_total(pid, lambda proc: proc.memory_info().rss)


def available_bytes() -> int:
    """What this job may still take now: the host's available memory, or less under a cgroup or rlimit
    (``machine._memory_limit``)."""
    return job_memory().available


def default_budget() -> int:
    """A safe share of the memory available to this job now: what a search may let one candidate use, and
    what the factory lets a recipe add."""
    return int(available_bytes() * BUDGET_SHARE)
