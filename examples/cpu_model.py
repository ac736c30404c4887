"""A compute-bound example: a small convolutional network trained on the CPU in ``train_step``.

The data is cheap (synthetic 3x32x32 images made from a seeded generator, no files); the training
step is not. This is the case where no DataLoader setting makes training faster, and where extra
workers compete with the model for the CPUs. Run:

    autotune diagnose examples/cpu_model.py
    autotune search examples/cpu_model.py

``AUTOTUNE_EXAMPLE_SAMPLES`` changes how many samples the dataset holds (default 4096).
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import Dataset

SAMPLES = int(os.environ.get("AUTOTUNE_EXAMPLE_SAMPLES", "4096"))
CLASSES = 10

batch_size = 128
epochs = 3


class SyntheticImages(Dataset):
    """Sample i: a 3x32x32 float image drawn from a generator seeded with i, and its label i % 10."""

    def __init__(self, length: int = SAMPLES):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int):
        generator = torch.Generator().manual_seed(idx)
        return torch.randn(3, 32, 32, generator=generator), idx % CLASSES


def dataset() -> SyntheticImages:
    return SyntheticImages()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, CLASSES),
    )


_state: dict = {}


def train_step(batch) -> float:
    """One SGD step of the model on ``batch``; the model is built on first use in each process."""
    if not _state:
        model = _model()
        _state["model"] = model
        _state["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = _state["model"], _state["optimizer"]
    images, labels = batch
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()
