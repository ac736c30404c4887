"""The datasets and consumers several scripts share. Module-level, so they pickle into trial processes."""

from __future__ import annotations

import os
import time
from typing import Any

import jpeg_folder  # examples/, put on sys.path by the harness
import torch

from harness import SEED

# The DataLoader article's experiment: random 224x224 JPEGs, batch 64, 3 epochs, the first cold.
BATCH = 64
EPOCHS = 3


def jpeg_dataset(images: int) -> jpeg_folder.JpegFolder:
    """The first ``images`` JPEGs of ``examples/jpeg_folder.py`` (written once, then reused)."""
    return jpeg_folder.JpegFolder(jpeg_folder.make_images(jpeg_folder.DATA_DIR, images))


def jpeg_files(dataset: jpeg_folder.JpegFolder) -> set[str]:
    """The files a cell evicts from the page cache."""
    return {os.path.realpath(p) for p in dataset.paths}


def seeded_loader(dataset: Any, batch_size: int = BATCH, **kwargs: Any) -> torch.utils.data.DataLoader:
    """A DataLoader shuffled with the harness's fixed seed."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                       generator=torch.Generator().manual_seed(SEED), **kwargs)


class InMemoryTensors(torch.utils.data.Dataset):
    """``count`` float32 3x224x224 tensors held in memory, as after decoding once; an item is a view.

    Made again from a seed when unpickled, so a trial process receives a few bytes instead of 1.2 GB and
    rebuilds them before any measurement starts."""

    def __init__(self, count: int):
        self.count = count
        self.images = torch.rand(count, 3, 224, 224, generator=torch.Generator().manual_seed(SEED))

    def __getstate__(self) -> dict:
        return {"count": self.count}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["count"])  # type: ignore[misc]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], i % 10


class SleepConsumer:
    """An accelerator's step emulated as a fixed compute time per batch (the MLPerf Storage method)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch: Any) -> None:
        time.sleep(self.seconds)
