"""Streams (``IterableDataset``: Hugging Face streaming, webdataset, torchdata, your own): how to tell
one, its length when it has one, its shards, a first look at its samples, and the check that it splits
its data across DataLoader workers instead of handing every worker the whole stream.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from autotune.errors import DatasetError

SHARDING_SAMPLES = 32  # samples read with 0 and with 2 workers to compare what each yields


def is_stream(obj: Any) -> bool:
    """True for an IterableDataset. Hugging Face's streaming datasets are also recognised by duck typing:
    they become torch IterableDataset subclasses only once an instance exists, and an early issubclass
    check would cache the wrong answer for the class."""
    if type(obj).__module__.startswith("datasets.") and hasattr(obj, "num_shards") and hasattr(obj, "__iter__"):
        return True
    from torch.utils.data import IterableDataset

    return isinstance(obj, IterableDataset)


def stream_length(obj: Any) -> int | None:
    """``len(obj)`` when the stream defines it (webdataset's ``with_length``, your ``__len__``), else None."""
    if not hasattr(type(obj), "__len__"):
        return None
    try:
        length = len(obj)
    except Exception:  # noqa: BLE001 - a stream's __len__ may raise anything: then it has no length
        return None
    return length if isinstance(length, int) and length > 0 else None


def shard_urls(obj: Any) -> list[str] | None:
    """A webdataset pipeline's shard list (its first stage's ``urls``), else None."""
    stages = getattr(obj, "pipeline", None)
    if isinstance(stages, list) and stages and isinstance(getattr(stages[0], "urls", None), list):
        return [str(u) for u in stages[0].urls]
    return None


def shard_count(obj: Any) -> int | None:
    """How many shards the stream splits across workers (HF ``num_shards``, webdataset's shard list):
    workers beyond it get nothing (HF) or fail (webdataset's empty check)."""
    shards = getattr(obj, "num_shards", None)
    if isinstance(shards, int) and shards > 0:
        return shards
    urls = shard_urls(obj)
    return len(urls) if urls else None


def local_shard_files(obj: Any) -> list[str]:
    """The shard files on local disk (evicted for a cold first epoch)."""
    files = []
    for url in shard_urls(obj) or []:
        path = url.removeprefix("file:")
        if os.path.isfile(path):
            files.append(os.path.realpath(path))
    return files


def first_samples(obj: Any, count: int) -> tuple[list[Any], list[float]]:
    """The stream's first ``count`` samples, read in this process, and the seconds each took."""
    samples: list[Any] = []
    seconds: list[float] = []
    try:
        iterator = iter(obj)
        while len(samples) < count:
            start = time.perf_counter()
            try:
                sample = next(iterator)
            except StopIteration:
                break
            seconds.append(time.perf_counter() - start)
            samples.append(sample)
    except Exception as exc:  # noqa: BLE001 - the user's stream can raise anything
        raise DatasetError(
            f"Iterating the stream raised {type(exc).__name__}: {exc}. "
            "Fix the dataset's __iter__ (run with --debug for the traceback)."
        ) from exc
    if not samples:
        raise DatasetError("The stream yielded no samples; point it at some data before tuning.")
    return samples, seconds


def sample_key(sample: Any) -> bytes:
    """A digest of a sample's values (tensors and arrays by dtype, shape and bytes), equal for equal samples
    wherever they were produced (main process or a worker)."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, sample)
    return h.digest()


def _feed(h: Any, value: Any) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous().numpy() if value.dtype != torch.bfloat16 else value.float().numpy()
    if isinstance(value, np.ndarray):
        h.update(f"a{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes() if value.dtype != object else repr(value.tolist()).encode())
    elif isinstance(value, dict):
        h.update(b"d")
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"l{len(value)}".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, (bytes, bytearray)):
        h.update(b"b" + bytes(value))
    else:
        h.update(repr(value).encode())


def _read_with_workers(obj: Any, workers: int, count: int, timeout: float) -> list[bytes]:
    from torch.utils.data import DataLoader

    loader = DataLoader(obj, batch_size=None, num_workers=workers, collate_fn=_identity,
                        timeout=timeout if workers else 0)
    iterator = iter(loader)
    try:
        return [sample_key(s) for s in itertools.islice(iterator, count)]
    finally:
        del iterator


def _identity(sample: Any) -> Any:
    return sample


def _duplicates(keys: Iterable[bytes]) -> int:
    keys = list(keys)
    return len(keys) - len(set(keys))


def check_sharding(obj: Any, *, count: int = SHARDING_SAMPLES, timeout: float = 120.0) -> str | None:
    """Compare the first ``count`` samples with 0 and with 2 workers. A stream that hands every worker the
    whole stream yields each sample twice with 2 workers: DatasetError, before any recipe is written.

    Returns a note when the check could not run (one shard, or the stream fails in workers), else None.
    """
    shards = shard_count(obj)
    if shards is not None and shards < 2:
        return "sharding not checked: the stream has one shard, so it is tuned with at most one worker"
    alone = _read_with_workers(obj, 0, count, timeout)
    try:
        two = _read_with_workers(obj, 2, len(alone), timeout)
    except Exception as exc:  # noqa: BLE001 - e.g. a stream that cannot be pickled into workers
        text = str(exc).strip().splitlines()
        return f"sharding not checked: reading with 2 workers failed ({type(exc).__name__}: {text[-1] if text else ''})"
    extra = _duplicates(two) - _duplicates(alone)
    if extra > 0 and extra * 4 >= len(two):
        raise DatasetError(
            f"The stream does not split its data across DataLoader workers: with 2 workers {extra} of the first "
            f"{len(two)} samples were duplicates (none with 0 workers), so every worker would read the whole "
            "stream; shard it by worker with torch.utils.data.get_worker_info() in __iter__ (webdataset: "
            "wds.split_by_worker; Hugging Face: to_iterable_dataset(num_shards=...)) and tune again."
        )
    return None
