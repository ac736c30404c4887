"""A LightningDataModule whose training loader autotune tunes, and the one line that applies the recipe.

    autotune search examples/lightning_datamodule.py:MyDataModule
    python examples/lightning_datamodule.py          # trains one epoch with the recipe

autotune calls ``setup("fit")`` and ``train_dataloader()`` and tunes that loader's dataset, batch size
and collate_fn. ``train_dataloader()`` applies the recipe in one line, ``autotune.dataloader(...)``;
while autotune reads the datamodule, that line returns a plain DataLoader, so it works before any
recipe exists. When this machine's recipe chose ``num_workers=0`` by measurement, Lightning's "does
not have many workers" advice is filtered (exactly that warning) and the log says why.

The dataset holds JPEGs in memory (``AUTOTUNE_EXAMPLE_SAMPLES``, default 2000) and decodes one per
sample; ``AUTOTUNE_RECIPE`` names the recipe file (default ``autotune.json``).
"""

from __future__ import annotations

import io
import os

import lightning as L
import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

import autotune

SAMPLES = int(os.environ.get("AUTOTUNE_EXAMPLE_SAMPLES", "2000"))
RECIPE = os.environ.get("AUTOTUNE_RECIPE", "autotune.json")
SIZE = 96

epochs = 3


def jpeg_bytes(index: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng([seed, index]).integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=85)
    return out.getvalue()


class InMemoryJpegs(Dataset):
    def __init__(self, count: int):
        self.blobs = [jpeg_bytes(i) for i in range(count)]

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        with Image.open(io.BytesIO(self.blobs[i])) as img:
            pixels = np.array(img.convert("RGB"))
        return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255), i % 10


class MyDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 64, samples: int = SAMPLES):
        super().__init__()
        self.batch_size = batch_size
        self.samples = samples

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.train = InMemoryJpegs(self.samples)

    def train_dataloader(self):
        # The one line that applies this machine's recipe (tuned by `autotune search THIS_FILE:MyDataModule`).
        return autotune.dataloader(self.train, RECIPE, batch_size=self.batch_size, shuffle=True)


class TinyClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(), torch.nn.Linear(192, 10))

    def training_step(self, batch, index):
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(max_epochs: int = 1, limit_train_batches: int | float = 1.0) -> L.Trainer:
    trainer = L.Trainer(accelerator="cpu", max_epochs=max_epochs, limit_train_batches=limit_train_batches,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(TinyClassifier(), datamodule=MyDataModule())
    return trainer


if __name__ == "__main__":
    train()
