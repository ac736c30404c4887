"""The determinism check accepts a pure dataset and names the index and the fix for a random one."""

from __future__ import annotations

import multiprocessing

import numpy as np
import torch
from test_codec import ZooDataset

from autotune.dataset._determinism import check_deterministic


class RandomCrop(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.full((2,), float(i)) + torch.rand(2)


class RandomOnlySometimes(torch.utils.data.Dataset):
    """Random only at the last index: the check must probe the end too."""

    def __len__(self):
        return 50

    def __getitem__(self, i):
        return np.random.rand() if i == 49 else float(i)


def test_deterministic_dataset_passes():
    assert check_deterministic(ZooDataset(5)) == (True, "")


def test_random_getitem_fails_with_index_and_fix():
    ok, reason = check_deterministic(RandomCrop())
    assert not ok
    assert "dataset[0]" in reason and "`transform`" in reason and "\n" not in reason


def test_probes_last_index():
    ok, reason = check_deterministic(RandomOnlySometimes(), probe=2)
    assert not ok and "dataset[49]" in reason


def test_a_dataset_that_raises_in_workers_leaves_no_signal_behind():
    """The check's worker is killed once its read failed; on c9e4379 the DataLoader's SIGCHLD handler then
    raised "DataLoader worker (pid N) is killed by signal: Killed" in the main thread, later, wherever it
    was (a search ended with that traceback)."""
    import time

    from workloads import RaisesInWorkers

    from autotune.dataset._determinism import check_deterministic

    assert check_deterministic(RaisesInWorkers(8)) == (True, "")
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # the SIGCHLD arrives within milliseconds; its handler runs here
        time.sleep(0.05)


class MeetsTheWorker(torch.utils.data.Dataset):
    """The main process's first read waits (up to 5 s) for the check's worker to have read: true only when the
    worker reads while the main process does. On 94e3a0d the worker was forked after the main process's reads,
    so that wait ran out."""

    def __init__(self):
        self.worker_read = multiprocessing.get_context("fork").Event()
        self.waited: list[bool] = []

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            self.worker_read.set()
        elif not self.waited:
            self.waited.append(self.worker_read.wait(5.0))
        return float(i)


def test_the_checks_worker_reads_while_the_main_process_reads():
    dataset = MeetsTheWorker()
    assert check_deterministic(dataset) == (True, "")
    assert dataset.waited == [True]


class HeadBesideTheWorker(torch.utils.data.Dataset):
    """The check's worker waits (up to 5 s) in its first read for the main process to read index ``mark``, which
    only a first-epoch fill's schema head reads (the check probes others): true only when the fill's head is
    read while the check's worker runs (on 94e3a0d the head waited for the worker's verdict)."""

    def __init__(self, n, mark):
        ctx = multiprocessing.get_context("fork")
        self.n, self.mark = n, mark
        self.head_read, self.saw = ctx.Event(), ctx.Value("i", -1)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            if self.saw.value < 0:
                self.saw.value = int(self.head_read.wait(5.0))
        elif i == self.mark:
            self.head_read.set()
        return np.full(4, float(i), dtype=np.float32), i % 3


def test_a_first_epoch_fill_reads_its_head_while_the_checks_worker_reads():
    from autotune.caches import FirstEpochCache
    from autotune.caches._fill import _HEAD
    from autotune.config import LoaderConfig
    from autotune.dataset._determinism import _indices
    from autotune.loader import FactorySite, prepare_source

    n = 40
    mark = next(k for k in range(1, _HEAD) if k not in _indices(n, 3, 0))
    dataset = HeadBesideTheWorker(n, mark)
    prepared = prepare_source(dataset, LoaderConfig(cache="memory", cache_fill="first_epoch"), FactorySite(),
                              transform=None, collate_fn=None)
    assert dataset.saw.value == 1
    cache = prepared.cache
    assert isinstance(cache, FirstEpochCache) and cache.filled_count == _HEAD and not cache.whole
    for k in range(n):  # exactly dataset[i]: the head from the cache, the rest from the source
        got, label = cache[k]
        assert np.array_equal(got, np.full(4, float(k), dtype=np.float32)) and label == k % 3


def test_a_fill_whose_samples_differ_in_workers_is_dropped_and_the_source_read():
    """The verdict comes after the fill's head was read: a worker-dependent dataset still gets no cache."""
    from autotune.config import LoaderConfig
    from autotune.loader import FactorySite, prepare_source

    prepared = prepare_source(WorkerKeyed(), LoaderConfig(cache="memory", cache_fill="first_epoch"), FactorySite(),
                              transform=None, collate_fn=None)
    assert prepared.random and prepared.cache is None
    assert "differs between the main process and a DataLoader worker" in prepared.why
    assert [prepared.dataset[i] for i in range(3)] == [0.0, 1.0, 2.0]


class WorkerKeyed(torch.utils.data.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return float(i) + (100.0 if torch.utils.data.get_worker_info() is not None else 0.0)


def test_a_check_settled_by_the_main_process_leaves_no_worker():
    """A draw found by the main process's first read ends the worker forked before it, at once."""
    ok, _ = check_deterministic(RandomCrop())
    assert not ok and multiprocessing.active_children() == []


HANGS_EVERYWHERE = """
import os, sys, time
import torch
from autotune.dataset import guarded
from autotune.dataset._determinism import check_deterministic
from autotune.dataset._watchdog import own_the_process

class Hangs(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            with open(sys.argv[1], "w") as f:
                f.write(str(os.getpid()))
        time.sleep(600)

own_the_process()
with guarded(time.monotonic() + 60.0, 1.5):
    check_deterministic(Hangs())
"""


def test_a_read_that_hangs_in_the_main_process_leaves_no_worker_behind(tmp_path):
    """The watchdog ends the process (exit 2) while the check's worker, forked before the main process's
    reads, hangs too: the worker dies with it (it would hold the output's pipes, and this run, for 600 s)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "worker.pid"
    try:
        run = subprocess.run([sys.executable, "-c", HANGS_EVERYWHERE, str(marker)], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2 and "dataset[0] had not returned after" in run.stderr, run.stderr
        assert marker.exists(), "the check's worker read while the main process's read hung"
        pid = int(marker.read_text())
        deadline = time.monotonic() + 5.0
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        if marker.exists() and _alive(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
