"""Small datasets for the search and factory tests, at module level so they pickle into trial processes."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import traceback

import torch
from torch.utils.data import Dataset, get_worker_info

_TESTS = os.path.dirname(os.path.abspath(__file__))


def run_recipe_script(body: str, recipe: os.PathLike | str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``body`` in a fresh interpreter that imports this checkout's autotune and these workloads, with the
    recipe's path as ``sys.argv[1]``; fails the test with the child's stderr if it does not exit 0."""
    code = "import sys; sys.path[:0] = sys.argv[2:]\n" + body
    run = subprocess.run([sys.executable, "-c", code, str(recipe), os.path.dirname(_TESTS), _TESTS],
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-2000:]
    return run


class Numbers(Dataset):
    """Sample i is a small tensor holding i; ``delay`` seconds of work per sample."""

    def __init__(self, n: int = 64, delay: float = 0.0):
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        return torch.full((4,), float(i)), i


def take(loader, n=None) -> list[list[int]]:
    """The index lists of a new epoch's first ``n`` batches (all of them without ``n``), left there: a loop that
    breaks mid-epoch, as one that saves a checkpoint does."""
    got = []
    for batch in loader:
        got.append(batch[1].tolist())
        if len(got) == n:
            break
    return got


class RaisesInWorkers(Numbers):
    def __getitem__(self, i: int):
        if get_worker_info() is not None:
            raise RuntimeError("this dataset only works in the main process")
        return super().__getitem__(i)


class BusErrorInWorkers(Numbers):
    def __getitem__(self, i: int):
        if get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGBUS)
        return super().__getitem__(i)


class BusErrorAfterFirstBatch(Numbers):
    """The second worker dies of a bus error a moment after starting its first batch, while the main
    process is inside the step for the first worker's batch (``step_that_logs_and_goes_on``)."""

    def __getitem__(self, i: int):
        worker = get_worker_info()
        if worker is not None and worker.id == 1:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGBUS)
        return super().__getitem__(i)


def step_that_logs_and_goes_on(batch) -> None:
    """A training step that logs any exception and carries on, as many training loops' wrappers do: the
    DataLoader's "worker killed" error, raised in whatever the main thread is running, is swallowed."""
    try:
        time.sleep(3.0)
    except Exception:  # noqa: BLE001 - the point of this step
        traceback.print_exc()


class HangsInWorkers(Numbers):
    def __getitem__(self, i: int):
        if get_worker_info() is not None:
            time.sleep(3600)
        return super().__getitem__(i)


def double(sample):
    tensor, label = sample
    return tensor * 2, label


class Noisy(Numbers):
    """Random in __getitem__: a cache would freeze it."""

    def __getitem__(self, i: int):
        return torch.rand(4), i


def jitter(sample):
    tensor, label = sample
    return tensor + torch.rand_like(tensor), label


class Megabytes(Dataset):
    """Samples of 1 MiB made from the index: a large dataset with nothing on disk."""

    def __init__(self, n: int = 1000):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((1 << 18,), float(i))


class WithEpochs(Numbers):
    """Keeps per-epoch state the training loop sets: persistent workers would never see it."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class FourMegabyteBatches(Numbers):
    def __getitem__(self, i: int):
        return torch.full((1 << 17,), float(i)), i  # 512 KiB samples: 4 MiB batches of 8


class Stream(torch.utils.data.IterableDataset):
    """A stream of ``n`` samples (endless with n=None) that splits itself across DataLoader workers."""

    def __init__(self, n: int | None = 200, delay: float = 0.0):
        self.n = n
        self.delay = delay

    def _positions(self):
        return itertools.count() if self.n is None else range(self.n)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in self._positions():
            if i % workers == worker:
                if self.delay:
                    time.sleep(self.delay)
                yield torch.full((4,), float(i)), i


class UnshardedStream(Stream):
    """The classic bug: every worker yields the whole stream."""

    def __iter__(self):
        for i in self._positions():
            yield torch.full((4,), float(i)), i


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.n


class Exact(Dataset):
    """Sample i: float64 values drawn from a generator seeded with i (every bit counts), and i."""

    def __init__(self, n: int = 96):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"x": torch.randn(6, generator=torch.Generator().manual_seed(int(i)), dtype=torch.float64), "i": i}


class CheckExact:
    """A train step that checks every sample of a batch of ``Exact`` bit for bit against ``dataset[i]``
    (raising on a difference, which fails the trial) and appends the indices it saw to ``folder/<pid>``."""

    def __init__(self, dataset: Exact, folder: str):
        self.dataset = dataset
        self.folder = folder

    def __call__(self, batch):
        indices = batch["i"].tolist()
        for x, i in zip(batch["x"], indices):
            want = self.dataset[i]["x"]
            if x.dtype != want.dtype or not torch.equal(x.view(torch.int64), want.view(torch.int64)):
                raise AssertionError(f"the sample read for index {i} is not dataset[{i}]")
        with open(os.path.join(self.folder, str(os.getpid())), "a") as f:
            f.write(" ".join(map(str, indices)) + "\n")
