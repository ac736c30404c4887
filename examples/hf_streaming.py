"""A Hugging Face ``datasets`` stream: an ``IterableDataset`` in 8 shards, JPEGs decoded in ``.map``.

    autotune search examples/hf_streaming.py

The rows (a JPEG and a label) are saved once under ``examples/data/hf_streaming``
(``AUTOTUNE_EXAMPLE_DIR``, ``AUTOTUNE_EXAMPLE_SAMPLES``) and read back as a stream with
``to_iterable_dataset(num_shards=8)``, as ``load_dataset(..., streaming=True)`` would hand it over. Hugging
Face splits the shards across DataLoader workers itself, so autotune tunes it as a stream: a bounded
number of batches per trial, the epoch extrapolated from ``samples_per_epoch``, num_workers at most
the number of shards, and no cache (a cache would freeze the stream's order).

In training: ``autotune.dataloader(dataset(), "autotune.json")``.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import datasets
import numpy as np
import torch
from PIL import Image

ROWS = int(os.environ.get("AUTOTUNE_EXAMPLE_SAMPLES", "2400"))
DATA_DIR = Path(os.environ.get("AUTOTUNE_EXAMPLE_DIR", Path(__file__).parent / "data")) / f"hf_streaming-{ROWS}"
SHARDS = 8
SIZE = 128

batch_size = 64
epochs = 3
samples_per_epoch = ROWS  # a streaming dataset has no len()


def jpeg_bytes(index: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng([seed, index]).integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=85)
    return out.getvalue()


def make_rows(root: Path, rows: int) -> Path:
    if (root / "state.json").exists():
        return root
    datasets.disable_progress_bars()
    table = datasets.Dataset.from_dict({"jpg": [jpeg_bytes(i) for i in range(rows)],
                                        "label": [i % 10 for i in range(rows)]})
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    table.save_to_disk(str(tmp), num_shards=4)
    tmp.replace(root)
    return root


def decode(row: dict) -> dict:
    with Image.open(io.BytesIO(row["jpg"])) as img:
        pixels = np.array(img.convert("RGB"))
    return {"image": torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255), "label": row["label"]}


def dataset() -> datasets.IterableDataset:
    rows = datasets.load_from_disk(str(make_rows(DATA_DIR, ROWS)))
    return rows.to_iterable_dataset(num_shards=SHARDS).map(decode, remove_columns=["jpg"])
