"""The floor: what this machine can physically do for a dataset's run, measured, not estimated.

No loader can deliver a run faster than two things this machine must do anyway: decode every sample
once, on all the cores it may use (nothing stored: one bare pass of ``dataset[i]`` in fresh worker
processes, the files evicted first), and, every epoch, hand training each batch, which is at best a
gather of the batch's rows from samples already in memory (a reused buffer, no allocation). The
floor is their sum: ``decode + epochs x gathers``. Every other figure (a recipe's run, a hand-written
loader) is reported as a ratio to it, so a user sees how far from the physical limit it is.

A subset's floor is scaled to the whole dataset: the decode pass and each epoch's gathers grow with
the samples (``Floor.scale``). ``autotune diagnose`` measures it on its subset, ``autotune validate``
beside the recipe's run in its fresh process; the benchmarks measure it whole, in a fresh process,
interleaved with the rows they compare with it. ``bare_decode`` is also what a cache build is held
against (``diagnose._build``, ``_validate``): the same decode, on the same processes, keeping nothing.

Where a recipe's run goes against it (the article table's first-epoch memory fill, 1.21x: its fixed steps
before epoch 1, keeping the samples in epoch 1, the later epochs' DataLoader round trips), measured by
phase and in CPU seconds: docs/architecture.md §4.
"""

from __future__ import annotations

import mmap
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from autotune.caches._codec import sample_nbytes
from autotune.machine import _evict, build_workers

GATHER_EPOCHS = 3  # epochs of gathers timed (``epoch_gathers``); their median is kept
GATHER_BYTES = 256 << 20  # the most rows held to time gathers over; a larger dataset's are scaled from them


@dataclass(frozen=True)
class Floor:
    """The floor of a run of ``epochs`` epochs over ``length`` samples in batches of ``batch_size``,
    measured on ``samples`` of them (seconds)."""

    length: int
    samples: int
    batch_size: int
    epochs: int
    workers: int  # processes the decode ran on (``machine.build_workers``: every usable CPU, 0 on one)
    decode_seconds: float  # every measured sample decoded once on ``workers`` processes, nothing stored
    gather_seconds: float  # one epoch of batch gathers of the measured samples from memory

    @property
    def scale(self) -> float:
        return self.length / self.samples if self.samples else 0.0

    @property
    def decode_total(self) -> float:
        """The whole dataset decoded once."""
        return self.decode_seconds * self.scale

    @property
    def gathers_total(self) -> float:
        """Every epoch's batch gathers of the whole dataset."""
        return self.gather_seconds * self.scale * self.epochs

    @property
    def total(self) -> float:
        return self.decode_total + self.gathers_total

    def ratio(self, seconds: float) -> float | None:
        """``seconds`` (a whole run of the same dataset and epochs) as a multiple of the floor."""
        return seconds / self.total if self.total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "decode_total": self.decode_total, "gathers_total": self.gathers_total,
                "total": self.total}


class _Discard(Dataset[Any]):
    """``dataset[i]`` for the i a bare decode pass reads, returning nothing: the decode, no transport."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> int:
        self.dataset[i]
        return 0


def _none(batch: Any) -> None:
    return None


def bare_decode(dataset: Any, workers: int, files: set[str]) -> float:
    """Seconds to read every ``dataset[i]`` once on ``workers`` fresh processes (none: this one), keeping
    nothing, the files evicted first."""
    if files:
        _evict.evict(files)
    start = time.perf_counter()
    if workers:
        loader = torch.utils.data.DataLoader(_Discard(dataset), batch_size=16, num_workers=workers,
                                             collate_fn=_none)
        for _ in loader:
            pass
    else:
        for i in range(len(dataset)):
            dataset[i]
    return time.perf_counter() - start


class _Subset(Dataset[Any]):
    def __init__(self, dataset: Any, indices: Sequence[int]):
        self.dataset, self.indices = dataset, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> Any:
        return self.dataset[self.indices[k]]


def decode_once(dataset: Any, indices: Sequence[int], workers: int, files: set[str] | None = None) -> float:
    """Seconds to decode ``dataset[i]`` for ``indices`` once on ``workers`` fresh processes (0: this one),
    keeping nothing; ``files`` are evicted first."""
    return bare_decode(_Subset(dataset, indices), workers, set(files or ()))


def rows_in_memory(count: int, nbytes: int) -> torch.Tensor:
    """``count`` rows of ``nbytes`` each (rounded up to float32 words), written once so every page is
    resident: the samples as a loader would hold them decoded, the gathers' source. In shared memory, as
    a memory cache's columns are: a fork made while it is held copies no page tables for it (the decode's
    workers start as fast as without it)."""
    width = max(1, -(-nbytes // 4))
    buffer = mmap.mmap(-1, count * width * 4, flags=mmap.MAP_SHARED)
    rows = torch.frombuffer(buffer, dtype=torch.float32).view(count, width)
    rows.fill_(1.0)
    return rows


class GatherEpochs:
    """Epochs of batch gathers from ``rows``: each batch is the rows of a seeded shuffled order, gathered
    into a buffer reused from batch to batch (as a loader at the floor would: no allocation, one copy per
    row; ``numpy.take`` into it, a plain copy of each row, ran faster here than ``torch.index_select``).
    The buffers are made and written here, before any epoch is timed."""

    def __init__(self, rows: torch.Tensor, batch_size: int, seed: int = 0):
        self.rows, self.batch_size = rows, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self._buffers: dict[int, tuple[np.ndarray, torch.Tensor]] = {}
        for size in {min(batch_size, len(rows)), len(rows) % batch_size or batch_size}:
            out = np.ones((size, *rows.shape[1:]), dtype=rows.numpy().dtype)  # written: its pages resident
            self._buffers[size] = out, torch.from_numpy(out)

    def __len__(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        source = self.rows.numpy()
        order = torch.randperm(len(self.rows), generator=self.generator).numpy()
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            out, batch = self._buffers[len(idx)]
            # mode="clip": with the default "raise" numpy buffers ``out`` and copies every row twice (4x
            # slower here); the order's indices are all in range, so clipping changes none of them.
            np.take(source, idx, axis=0, out=out, mode="clip")
            yield batch


def gather_epoch_seconds(epochs: GatherEpochs) -> float:
    """Seconds of one pass over ``epochs``."""
    start = time.perf_counter()
    for _ in epochs:
        pass
    return time.perf_counter() - start


def held_rows(count: int, nbytes: int, batch_size: int) -> int:
    """Rows ``epoch_gathers`` holds for ``count`` samples of ``nbytes``: all of them, or as many as fit
    ``GATHER_BYTES`` (at least a batch)."""
    return max(1, min(count, max(batch_size, GATHER_BYTES // max(1, nbytes))))


def epoch_gathers(count: int, nbytes: int, batch_size: int, seed: int = 0) -> float:
    """Seconds of one epoch of batch gathers over ``count`` samples of ``nbytes`` from memory: the median
    of ``GATHER_EPOCHS`` epochs over ``held_rows`` of them, scaled to ``count``."""
    held = held_rows(count, nbytes, batch_size)
    gathers = GatherEpochs(rows_in_memory(held, nbytes), batch_size, seed)
    return statistics.median(gather_epoch_seconds(gathers) for _ in range(GATHER_EPOCHS)) * count / held


def measure_floor(dataset: Any, indices: Sequence[int], *, batch_size: int, epochs: int,
                  files: set[str] | None = None, workers: int | None = None, seed: int = 0,
                  decoded: float | None = None) -> Floor:
    """The floor of ``epochs`` epochs over the whole ``dataset``, measured on ``indices`` (see the module):
    one decode pass of them on ``workers`` (default ``machine.build_workers()``) fresh processes, the files
    evicted first (``decoded``: that pass's seconds, already timed), then their batch gathers from
    memory (``epoch_gathers``)."""
    indices = list(indices)
    if not indices:
        raise ValueError("The floor needs at least one sample, but got 0 indices.")
    workers = build_workers() if workers is None else workers
    nbytes = sample_nbytes(dataset[indices[0]])
    decode = decode_once(dataset, indices, workers, files) if decoded is None else decoded
    gather = epoch_gathers(len(indices), nbytes, batch_size, seed)
    return Floor(length=len(dataset), samples=len(indices), batch_size=batch_size, epochs=epochs, workers=workers,
                 decode_seconds=decode, gather_seconds=gather)
