"""Is ``dataset[i]`` one sample? Caches store one read of each, so every read must return it.

Up front, on a few indices (the first, the last, seeded random ones), a sample is refused when

- a read drew from a random generator (Python's, numpy's, torch's, or one the dataset holds:
  ``caches._draws``), however the dice fell;
- two reads in a row differ (randomness from the operating system, state kept between reads);
- a read in a DataLoader worker differs from the main process's (data keyed on
  ``get_worker_info()``, augmentation seeded by the worker's seed);
- the dataset has ``set_epoch`` and a read after ``set_epoch(0)`` differs from one after
  ``set_epoch(1)`` (augmentation seeded by the epoch). The worker reads on its own copy (a fork), so
  the user's dataset is never moved to another epoch.

Builds and fills watch every read for draws as well (``caches._draws``), and a build compares its
reads of the key's probed indices with the key's: randomness at a few indices is caught there.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import pickle
import random
import signal
import time
from typing import Any

import torch

from autotune.caches._codec import samples_equal
from autotune.caches._draws import WatchedReads, message
from autotune.caches._key import _datasets
from autotune.dataset._userfile import read_sample
from autotune.machine import make_expendable

log = logging.getLogger("autotune")
_EPOCHS = (0, 1)
_WORKER_WAIT = 5.0  # seconds: a forked worker's start and one read, at the least


def _indices(length: int, probe: int, seed: int) -> list[int]:
    if length <= 0 or probe <= 0:
        return []
    picks = [0, length - 1]
    rng = random.Random(seed)
    picks += [rng.randrange(length) for _ in range(max(0, probe - 2))]
    return list(dict.fromkeys(picks))[:probe]


def _with_epochs(dataset: Any) -> list[Any]:
    """The dataset and the datasets it wraps that have ``set_epoch`` (a Subset's dataset, a concat's parts)."""
    return [d for d in _datasets(dataset) if callable(getattr(d, "set_epoch", None))]


class _WorkerReads(torch.utils.data.Dataset[Any]):
    """Item j of ``plan``: ``(epoch or None, index)``; in the worker, the epoch set on its own copy of the
    dataset, then the read's protocol-5 bytes (exact, as a build's) and the generator it drew from."""

    def __init__(self, dataset: Any, plan: list[tuple[int | None, int]]):
        self.dataset, self.plan = dataset, plan
        self.reads = WatchedReads(dataset)

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, j: int) -> tuple[bytes, str | None]:
        epoch, i = self.plan[j]
        if epoch is not None:
            for d in _with_epochs(self.dataset):
                d.set_epoch(epoch)
        sample, drawn = self.reads.read_noting(i)
        return pickle.dumps(sample, protocol=5), drawn


def _in_a_worker(dataset: Any, indices: list[int], main: list[Any], timeout: float) -> str:
    """Why the reads in a forked worker show the samples are not one sample each, or ""."""
    epochs = bool(_with_epochs(dataset))
    plan: list[tuple[int | None, int]] = [(None, i) for i in indices]
    if epochs:
        plan += [(e, i) for e in _EPOCHS for i in indices]
    pid = multiprocessing.get_context("fork").Value("i", 0)
    loader = torch.utils.data.DataLoader(_WorkerReads(dataset, plan), batch_size=None, num_workers=1,
                                         multiprocessing_context="fork", timeout=timeout,
                                         worker_init_fn=functools.partial(_tell_pid, pid))
    it = iter(loader)
    try:
        got = [(pickle.loads(wire), drawn) for wire, drawn in it]
    except Exception as exc:  # noqa: BLE001 - the dataset cannot be read in a forked worker (in time)
        _kill_worker(it, pid.value)
        del it
        log.info("autotune: dataset[i] could not be read in a forked worker (%s: %s); only the main "
                 "process's reads were compared", type(exc).__name__, str(exc).strip().splitlines()[-1:])
        return ""
    for (epoch, i), (_sample, drawn) in zip(plan, got):
        if drawn is not None:
            where = "in a DataLoader worker" if epoch is None else f"after set_epoch({epoch})"
            return message(i, f"drew from {drawn} {where}")
    n = len(indices)
    for i, ours, (theirs, _) in zip(indices, main, got[:n]):
        if not samples_equal(ours, theirs):
            return message(i, "differs between the main process and a DataLoader worker (it depends on "
                              "get_worker_info() or the worker's seed)")
    if epochs:
        for i, (a, _), (b, _) in zip(indices, got[n:2 * n], got[2 * n:]):
            if not samples_equal(a, b):
                return message(i, "changes with set_epoch() (augmentation seeded by the epoch)")
    return ""


def _kill_worker(it: Any, pid: int) -> None:
    """End the check's worker at once: a worker stuck in a read may ignore SIGTERM, and shutting down must
    not wait on it. Its pid leaves the DataLoader's SIGCHLD watch first: that handler raises "DataLoader
    worker (pid N) is killed by signal" in the main thread, wherever it then is, for any registered worker
    that dies of a signal (a dataset that raises in workers ended the search that way)."""
    if getattr(it, "_worker_pids_set", False):
        torch._C._remove_worker_pids(id(it))  # what DataLoader's own shutdown calls
        it._worker_pids_set = False
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def check_deterministic(dataset: Any, probe: int = 3, seed: int = 0, *, timeout: float | None = None
                        ) -> tuple[bool, str]:
    """Read ``probe`` indices as the module docstring says; (True, "") or (False, one-line reason that
    names ``transform=``). ``timeout``: seconds the worker may take for one read (default: ten times the
    main process's slowest, at least ``_WORKER_WAIT``); past it the worker's comparison is skipped, said
    in the log (a dataset that hangs only in workers is the trial's and the loader's to report)."""
    indices = _indices(len(dataset), probe, seed)
    noting = _Noting(WatchedReads(dataset))
    first = []
    slowest = 0.0
    for i in indices:
        start = time.perf_counter()
        sample = read_sample(noting, i)  # under the search's watchdog, a failure in one line
        slowest = max(slowest, time.perf_counter() - start)
        if noting.drawn is not None:
            return False, message(i, f"drew from {noting.drawn}")
        first.append(sample)
    for i, before in zip(indices, first):
        if not samples_equal(before, read_sample(dataset, i)):
            return False, message(i, "returned different samples on two reads")
    wait = timeout if timeout is not None else max(_WORKER_WAIT, 10 * slowest)
    problem = _in_a_worker(dataset, indices, first, wait) if indices else ""
    return (not problem), problem


def _tell_pid(pid: Any, worker_id: int) -> None:
    make_expendable()  # the check's own worker: an OOM in it must not end the search or the training (machine._oom)
    pid.value = os.getpid()


class _Noting:
    """``dataset[i]`` read through ``reads``, keeping the generator the last read drew from."""

    def __init__(self, reads: WatchedReads):
        self.reads = reads
        self.drawn: str | None = None

    def __getitem__(self, i: int) -> Any:
        sample, self.drawn = self.reads.read_noting(i)
        return sample


__all__ = ["check_deterministic"]
