"""A webdataset stream: JPEGs in tar shards, decoded to float CHW tensors, batch size 64, three epochs.

    autotune search examples/webdataset_shards.py              # tunes the sharded stream
    autotune search examples/webdataset_shards.py:unsharded    # refused: every worker would read every shard

``WebDataset`` splits its shard list across DataLoader workers by default (``workersplitter=
wds.split_by_worker``), so autotune tunes it like any stream, with num_workers at most the number of
shards. ``unsharded`` turns that split off, the classic bug that doubles the data with two workers;
autotune refuses it before writing any recipe. The shards are written once under
``examples/data/webdataset`` (``AUTOTUNE_EXAMPLE_DIR`` to move them, ``AUTOTUNE_EXAMPLE_SAMPLES`` for
how many samples, ``AUTOTUNE_EXAMPLE_SHARDS`` for how many shards).

In training, the recipe applies in one line: ``autotune.dataloader(dataset(), "autotune.json")``.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

SAMPLES = int(os.environ.get("AUTOTUNE_EXAMPLE_SAMPLES", "2400"))
SHARDS = int(os.environ.get("AUTOTUNE_EXAMPLE_SHARDS", "8"))
DATA_DIR = Path(os.environ.get("AUTOTUNE_EXAMPLE_DIR", Path(__file__).parent / "data")) / "webdataset"
SIZE = 128

batch_size = 64
epochs = 3
samples_per_epoch = SAMPLES  # a WebDataset has no len(); the epoch is extrapolated from this


def jpeg_bytes(index: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng([seed, index]).integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=85)
    return out.getvalue()


def make_shards(root: Path, samples: int, shards: int) -> list[str]:
    """Write ``samples`` JPEGs round-robin into ``shards`` tar files unless they are already there."""
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"shard-{s:04d}-of-{shards:04d}-{samples}.tar" for s in range(shards)]
    for s, path in enumerate(paths):
        if path.exists():
            continue
        tmp = path.with_suffix(".tmp")
        with wds.TarWriter(str(tmp)) as sink:
            for i in range(s, samples, shards):
                sink.write({"__key__": f"{i:08d}", "jpg": jpeg_bytes(i), "cls": i % 10})
        tmp.replace(path)  # a crash mid-way never leaves a truncated shard behind
    return [str(p) for p in paths]


def _stream(split_by_worker: bool) -> wds.WebDataset:
    urls = make_shards(DATA_DIR, SAMPLES, SHARDS)
    splitter = wds.split_by_worker if split_by_worker else None
    return (wds.WebDataset(urls, shardshuffle=False, workersplitter=splitter, empty_check=False)
            .decode("torchrgb").to_tuple("jpg", "cls"))


def dataset() -> wds.WebDataset:
    return _stream(split_by_worker=True)


def unsharded() -> wds.WebDataset:
    return _stream(split_by_worker=False)
