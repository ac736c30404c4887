"""The classic "slow first epoch" experiment, ready to tune.

A folder of random-pixel 224x224 RGB JPEGs (quality 85), each decoded with Pillow into a float
CHW tensor in [0, 1], labelled ``idx % 10``; batch size 64, three epochs. Run:

    autotune search examples/jpeg_folder.py

The images are written once under ``examples/data/`` (``AUTOTUNE_EXAMPLE_DIR`` to move them,
``AUTOTUNE_EXAMPLE_IMAGES`` to change how many) and reused afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

IMAGES = int(os.environ.get("AUTOTUNE_EXAMPLE_IMAGES", "2000"))
DATA_DIR = Path(os.environ.get("AUTOTUNE_EXAMPLE_DIR", Path(__file__).parent / "data" / "jpeg_folder"))
SIZE = 224

batch_size = 64
epochs = 3


def make_images(root: Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` random JPEGs under ``root`` unless they are already there."""
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"{i:06d}.jpg" for i in range(count)]
    for i, path in enumerate(paths):
        if path.exists():
            continue
        pixels = np.random.default_rng([seed, i]).integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8)
        tmp = path.with_suffix(".tmp")
        Image.fromarray(pixels, "RGB").save(tmp, format="JPEG", quality=85)
        tmp.replace(path)  # a crash mid-way never leaves a truncated image behind
    return paths


class JpegFolder(Dataset):
    """Decodes one JPEG per access, as most image datasets do."""

    def __init__(self, paths: list[Path]):
        self.paths = [str(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int):
        with Image.open(self.paths[idx]) as img:
            pixels = np.array(img.convert("RGB"))
        image = torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255)
        return image, idx % 10


def dataset() -> JpegFolder:
    return JpegFolder(make_images(DATA_DIR, IMAGES))
