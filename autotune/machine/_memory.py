"""Memory of a process and its descendants (the DataLoader workers), and the budget it must fit."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import psutil

from autotune.machine._memory_limit import job_memory


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
    return tree_memory(pid).pss


class TreeMemory(NamedTuple):
    """A process tree's memory read at one moment: its PSS, and what it adds to the job (``tree_memory``)."""

    pss: int
    added: int


def tree_memory(pid: int | None = None, *, forked_from: int | None = None) -> TreeMemory:
    """The PSS of ``pid``'s tree and what the tree adds to the job's memory, read at the same moment.

    The invariant: ``added`` counts each page the tree holds that nothing outside it held before, once. PSS
    alone splits every shared page among its sharers, so a tree forked from ``forked_from`` (a trial from its
    forkserver) would be charged ~n/(n+1) of every page it still shares with that process: the parent's whole
    interpreter, which the job already holds. Each of the tree's n processes forked (not exec'd) from it maps
    each such page the parent maps (it inherited them), so the tree's share of them is n times the parent's
    share of its shared pages (PSS less USS), which is taken off. A process of the tree that was exec'd (a
    resource tracker, a spawned worker) inherited none of them and is not counted in n; a forked one still runs
    its parent's command line, which exec replaces. A page of the parent one process of the tree has since
    copied is then under-counted by 1/n of a page at most; the tree's private pages (USS) bound ``added`` from
    below."""
    try:
        root = psutil.Process(pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return TreeMemory(0, 0)
    command: list[str] | None = None
    shared = 0
    if forked_from:
        try:
            parent = psutil.Process(forked_from)
            command = parent.cmdline()
            info = parent.memory_full_info()
            shared = max(0, int(getattr(info, "pss", 0)) - int(getattr(info, "uss", 0)))
        except psutil.Error:
            forked_from = None
    pss = uss = forked = 0
    for proc in procs:
        try:
            try:
                info = proc.memory_full_info()
                pss += int(getattr(info, "pss", 0) or info.rss)
                uss += int(getattr(info, "uss", 0) or info.rss)
            except (psutil.AccessDenied, psutil.ZombieProcess):
                rss = int(proc.memory_info().rss)
                pss, uss = pss + rss, uss + rss
            if forked_from and proc.cmdline() == command:
                forked += 1
        except psutil.Error:
            continue  # a worker that exited between listing and reading
    if not forked_from:
        return TreeMemory(pss, pss)
    return TreeMemory(pss, max(uss, pss - forked * shared))


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
    return job_memory().budget()
