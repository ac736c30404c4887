"""Turn a candidate LoaderConfig into a real torch DataLoader; used by trials and by the factory alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from autotune.config import WORKER_LOADER_KEYS, LoaderConfig
from autotune.loader._order import own_batches, plain_order
from autotune.process import DEFAULT_ALLOCATOR, worker_init


class Transformed(Dataset[Any]):
    """``transform(source[indices[i]])``: the user's per-epoch work applied after the data source."""

    def __init__(self, source: Any, transform: Callable[..., Any] | None = None, indices: list[int] | None = None):
        self.source = source
        self.transform = transform
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices) if self.indices is not None else len(self.source)

    def __getitem__(self, i: int) -> Any:
        index = self.indices[i] if self.indices is not None else i
        READING[0] = (index, time.monotonic())  # a trial that hangs says which index (tuner/_runner.py)
        try:
            sample = self.source[index]
        finally:
            READING[0] = None
        return self.transform(sample) if self.transform is not None else sample


# The index this process is reading from the user's dataset now, and since when (None between reads).
READING: list[tuple[int, float] | None] = [None]


class TransformedStream(IterableDataset[Any]):
    """``transform(sample)`` for each sample of a stream, in the stream's own order; the stream's own
    worker split (get_worker_info) applies unchanged."""

    def __init__(self, source: Any, transform: Callable[..., Any]):
        self.source = source
        self.transform = transform

    def __iter__(self) -> Any:
        return map(self.transform, self.source)


def with_transform(dataset: Any, transform: Callable[..., Any] | None, stream: bool = False) -> Any:
    """``dataset`` with the user's per-sample ``transform`` applied after it (map-style or stream)."""
    if transform is None:
        return dataset
    return TransformedStream(dataset, transform) if stream else Transformed(dataset, transform)


def make_loader(dataset: Any, config: LoaderConfig, *, user_worker_init: Callable[[int], None] | None = None,
                loader_cls: type[DataLoader[Any]] = DataLoader, **passthrough: Any) -> DataLoader[Any]:
    """A DataLoader (or ``loader_cls``, e.g. torchdata's StatefulDataLoader) with ``config``'s settings;
    ``passthrough`` (batch_size, sampler, collate_fn, ...) is the caller's and wins over the config.
    Process settings reach each worker via worker_init_fn. Its epochs draw from the generator what a plain
    loader's do, so its batches are a plain loader's whatever the configuration (``_order``)."""
    kwargs = config.loader_kwargs()
    if kwargs["pin_memory"] and not torch.cuda.is_available():
        kwargs["pin_memory"] = False  # pinning without CUDA only warns and costs time
    settings = config.process_settings()
    if config.num_workers and (settings.worker_threads or settings.allocator != DEFAULT_ALLOCATOR):
        kwargs["worker_init_fn"] = worker_init(settings, chain=user_worker_init)
    elif user_worker_init is not None:
        kwargs["worker_init_fn"] = user_worker_init
    kwargs.update(passthrough)
    if loader_cls is not DataLoader:
        kwargs = own_batches(dataset, kwargs)  # its samplers may draw otherwise (StatefulDataLoader's do)
    if not kwargs.get("num_workers"):
        for key in WORKER_LOADER_KEYS:
            kwargs.pop(key, None)
        kwargs.pop("timeout", None)
    return plain_order(loader_cls)(dataset, **kwargs)


def move_to(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """Move every tensor in a (nested) batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [move_to(v, device, non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


class DeviceConsumer:
    """The default consumer: move the batch to the accelerator and wait for the copy.

    Without CUDA there is nothing to move, and the loader alone is what is measured.
    """

    def __init__(self, pin_memory: bool):
        self.cuda = torch.cuda.is_available()
        self.non_blocking = pin_memory and self.cuda
        self.device = torch.device("cuda") if self.cuda else None

    def __call__(self, batch: Any) -> Any:
        if self.device is None:
            return batch
        moved = move_to(batch, self.device, self.non_blocking)
        torch.cuda.synchronize()
        return moved
