"""Build against bare decode: what a memory-cache build costs over decoding the same samples.

The factory's cache build (``autotune.dataloader(...)`` with a cache) decodes every sample once on
the build workers and stores it. A bare decode pass reads ``dataset[i]`` for the same samples on the
same number of workers and keeps nothing. Both start with the files evicted, interleaved over two
rounds (noise from other work hits both alike), medians kept. What separates them is split into:

- ``fixed``: the steps the factory runs once whatever the length (the determinism check, which reads
  a few samples twice; the schema's head, read in the main process; worker start-up), measured as
  the build of a handful of samples;
- ``first_touch``: writing the cache's bytes into fresh memory once, on the same workers
  (``machine._first_touch``): the price of holding the samples, which a bare decode never pays;
- the rest, per sample: storing (copying into the columns, the blobs that cross the pipe).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from autotune.caches import MemoryCache
from autotune.dataset import check_deterministic, decode_once
from autotune.machine import _evict, build_workers, first_touch_seconds

ROUNDS = 2
_SMALL = 16  # samples in the build that measures the fixed part


@dataclass(frozen=True)
class BuildCost:
    samples: int
    workers: int
    build_seconds: float  # memory-cache build of the samples, files evicted
    bare_decode_seconds: float  # dataset[i] for the same samples on the same workers, files evicted
    fixed_seconds: float  # the determinism check plus the build of a handful of samples (start-up)
    determinism_seconds: float
    cache_bytes: int = 0  # what the built cache holds
    first_touch_seconds: float = 0.0  # writing cache_bytes of fresh memory once, on the same workers

    @property
    def per_sample_overhead(self) -> float:
        """Seconds per sample the build spends over decoding the same samples."""
        return (self.build_seconds - self.bare_decode_seconds) / self.samples if self.samples else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _build(dataset: Any, indices: list[int], workers: int) -> tuple[float, int]:
    """Seconds of a memory-cache build of ``indices``, and the bytes the cache holds."""
    start = time.perf_counter()
    cache = MemoryCache.build(dataset, indices, None, manifest={}, progress=False, workers=workers)
    seconds = time.perf_counter() - start
    nbytes = cache.nbytes
    del cache
    return seconds, nbytes


def build_against_decode(dataset: Any, indices: list[int], files: set[str], *, workers: int | None = None,
                         rounds: int = ROUNDS) -> BuildCost:
    """Time a memory-cache build of ``indices`` against a bare decode pass of them (see the module)."""
    workers = build_workers() if workers is None else workers
    builds, decodes, touches, nbytes = [], [], [], 0
    for _ in range(rounds):
        if files:
            _evict.evict(files)
        seconds, nbytes = _build(dataset, indices, workers)
        builds.append(seconds)
        decodes.append(decode_once(dataset, indices, workers, files))
        touches.append(first_touch_seconds(nbytes, workers))
    if files:
        _evict.evict(files)
    start = time.perf_counter()
    check_deterministic(dataset)
    determinism = time.perf_counter() - start
    small, _ = _build(dataset, indices[:_SMALL], workers)
    return BuildCost(samples=len(indices), workers=workers, build_seconds=statistics.median(builds),
                     bare_decode_seconds=statistics.median(decodes), fixed_seconds=determinism + small,
                     determinism_seconds=determinism, cache_bytes=nbytes,
                     first_touch_seconds=statistics.median(touches))
