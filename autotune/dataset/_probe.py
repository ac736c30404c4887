"""First look at a dataset before any candidate runs: cost and size of a sample, determinism, identity."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import default_collate

from autotune.caches._codec import sample_nbytes
from autotune.dataset._determinism import check_deterministic
from autotune.dataset._fingerprint import dataset_fingerprint
from autotune.dataset._stream import first_samples, sample_key
from autotune.dataset._userfile import UserSpec, read_sample
from autotune.dataset._watchdog import reading
from autotune.errors import DatasetError
from autotune.machine import batch_bytes


@dataclass(frozen=True)
class Probe:
    length: int
    sample_seconds: float  # dataset[i] + transform, median over the probe, in this process
    sample_bytes: float  # payload bytes of one sample before transform (what a cache stores)
    batch_bytes: int  # tensor bytes of one collated batch, scaled from the probed samples (the /dev/shm rule)
    deterministic: bool
    determinism_note: str
    fingerprint: str
    stream: bool = False  # an IterableDataset: read in its own order, a bounded number of batches per trial
    length_known: bool = True  # False: a stream without __len__ or --samples-per-epoch; length is what is measured
    step_seconds: float = 0.0  # the user's train_step on the probed batch; 0 without one (``time_step``)


def probe_indices(length: int, count: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    count = min(count, length)
    return sorted(int(i) for i in rng.choice(length, size=count, replace=False))


def probe_dataset(spec: UserSpec, count: int = 8, seed: int = 0) -> Probe:
    """Read a few seeded indices; every failure of ``dataset[i]`` names the index (DatasetError)."""

    dataset = spec.dataset
    with reading("len(dataset)"):
        length = len(dataset)
    seconds, sizes, ready = [], [], []
    indices = probe_indices(length, count, seed)
    for index in indices:
        start = time.perf_counter()
        sample = read_sample(dataset, index)
        if sample is None:
            raise DatasetError(f"dataset[{index}] returned None, which no DataLoader can batch; return the "
                               "sample (or skip bad files when the dataset is built, not in __getitem__).")
        with reading(f"the transform of dataset[{index}]"):
            transformed = spec.transform(sample) if spec.transform is not None else sample
        seconds.append(time.perf_counter() - start)
        sizes.append(sample_nbytes(sample))
        ready.append(transformed)
    # What a worker puts in shared memory per batch, from the samples already read rather than a batch more.
    batch = collate_probe(spec.collate_fn, ready, indices)
    per_sample = batch_bytes(batch) / len(ready)
    deterministic, note = check_deterministic(dataset, probe=3, seed=seed)
    return Probe(
        length=length,
        sample_seconds=float(np.median(seconds)),
        sample_bytes=float(np.mean(sizes)),
        batch_bytes=int(per_sample * spec.batch_size),
        deterministic=deterministic,
        determinism_note=note,
        fingerprint=dataset_fingerprint(dataset, spec.source_text),
        step_seconds=time_step(spec.train_step, batch),
    )


def collate_probe(collate_fn: Callable[[list[Any]], Any] | None, samples: list[Any], indices: list[int]) -> Any:
    """The probed samples as one batch; a collate that cannot batch them is one line naming the samples."""
    try:
        with reading("the collate of the probed samples"):
            return (collate_fn or default_collate)(samples)
    except Exception as exc:  # noqa: BLE001 - the user's collate_fn (or what it is given) can raise anything
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        shown = ", ".join(f"dataset[{i}]" for i in indices[:3]) + (", ..." if len(indices) > 3 else "")
        name = "collate_fn" if collate_fn is not None else "torch's default_collate"
        raise DatasetError(f"{name} cannot batch {shown}: {type(exc).__name__}: {first}. Return samples of "
                           "tensors, numbers or arrays (no None), or define a collate_fn in the dataset file.") from exc


def time_step(train_step: Callable[[Any], Any] | None, batch: Any) -> float:
    """The user's ``train_step`` on one batch (the faster of two calls, the first warming it up); 0 without
    one, or when it fails here (its trials report that). A trial runs the step on every batch, so a subset
    sized by loading alone would leave a compute-bound search (60 ms a step) room for one trial, the
    default's: ``tuner._preparation.subset_size`` sizes it by both."""
    if train_step is None:
        return 0.0
    times = []
    try:
        for _ in range(2):
            start = time.perf_counter()
            with reading("the train_step on one batch"):
                train_step(batch)
            times.append(time.perf_counter() - start)
    except Exception:
        return 0.0
    return min(times)


def probe_stream(spec: UserSpec, length: int | None, count: int = 8) -> Probe:
    """The first ``count`` samples of a stream, read in this process: their cost, size and bits."""

    with reading("the stream's first samples"):
        samples, seconds = first_samples(spec.dataset, count)
        ready = [spec.transform(s) for s in samples] if spec.transform is not None else samples
    per_sample = batch_bytes(collate_probe(spec.collate_fn, ready, list(range(len(ready))))) / len(ready)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"autotune-stream-v1:len={length}:{type(spec.dataset).__qualname__}".encode())
    for sample in samples:
        h.update(sample_key(sample))
    if spec.source_text is not None:
        h.update(spec.source_text.encode("utf-8", "surrogatepass"))
    # The first read opens the stream (a shard, a connection): the median leaves that out.
    return Probe(
        length=length or 0,
        sample_seconds=float(np.median(seconds)),
        sample_bytes=float(np.mean([sample_nbytes(s) for s in samples])),
        batch_bytes=int(per_sample * spec.batch_size),
        deterministic=False,
        determinism_note="a stream is read in its own order, so a cache would freeze it",
        fingerprint=h.hexdigest(),
        stream=True,
        length_known=length is not None,
    )
