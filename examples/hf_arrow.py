"""A Hugging Face ``datasets`` map-style dataset on Arrow files, read with ``with_format("torch")``.

    autotune search examples/hf_arrow.py

4000 rows of 3x64x64 uint8 pixels (an ``Array3D`` column) and a label, saved with ``save_to_disk`` in
four Arrow files under ``examples/data/hf_arrow`` (``AUTOTUNE_EXAMPLE_DIR``, ``AUTOTUNE_EXAMPLE_SAMPLES``).
Arrow files are memory-mapped rather than opened per sample, so autotune finds them through
``Dataset.cache_files`` and evicts them from the page cache before each trial's first epoch: the first
epoch is measured cold, as in a fresh training job. Whether a sample cache pays over memory-mapped
Arrow is found by measurement, like everything else; the recipe's notes and finalists say which.
``transform`` (float pixels in [0, 1]) runs after any cache, every epoch.

In training: ``autotune.dataloader(dataset(), "autotune.json", transform=transform, shuffle=True)``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import datasets
import numpy as np

ROWS = int(os.environ.get("AUTOTUNE_EXAMPLE_SAMPLES", "4000"))
DATA_DIR = Path(os.environ.get("AUTOTUNE_EXAMPLE_DIR", Path(__file__).parent / "data")) / f"hf_arrow-{ROWS}"
SHAPE = (3, 64, 64)

batch_size = 64
epochs = 3


def make_arrow(root: Path, rows: int, seed: int = 0) -> Path:
    """Save ``rows`` rows with ``save_to_disk`` unless they are already there."""
    if (root / "state.json").exists():
        return root
    datasets.disable_progress_bars()
    rng = np.random.default_rng(seed)
    features = datasets.Features({"pixels": datasets.Array3D(shape=SHAPE, dtype="uint8"),
                                  "label": datasets.Value("int64")})
    table = datasets.Dataset.from_dict(
        {"pixels": rng.integers(0, 256, size=(rows, *SHAPE), dtype=np.uint8), "label": np.arange(rows) % 10},
        features=features,
    )
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    table.save_to_disk(str(tmp), num_shards=4)
    tmp.replace(root)  # a crash mid-way never leaves a half-written dataset behind
    return root


def dataset() -> datasets.Dataset:
    return datasets.load_from_disk(str(make_arrow(DATA_DIR, ROWS))).with_format("torch")


def transform(sample: dict):
    return sample["pixels"].float().div_(255), sample["label"]
