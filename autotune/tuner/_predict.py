"""From a measured subset to the predicted wall time of the user's whole run (docs/architecture.md §3).

An epoch of ``b`` batches is modelled as a head (iterator creation to the HEAD-th batch: worker start,
the first fetches, allocator and thread-pool warm-up) plus ``b - HEAD`` steady batches. A subset run
gives both terms; the whole epoch keeps the head and scales the steady part. Counting two batches as
the head, not one, keeps a slow second batch (a first large allocation, the other worker's first
fetch) from being multiplied by the whole epoch's length. The cache build is paid once, the first
epoch is the cold one.

The build is what ``autotune.dataloader(...)`` costs in the user's process: the steps it runs once
whatever the length (``build_fixed_seconds``: the determinism check that decides whether a cache may
be used, the cache key of a disk cache, the schema head of a cache filled while training), measured
in the trial in the factory's order on cold files, plus the trial's build of its subset scaled to the
whole length.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

HEAD = 2


@dataclass(frozen=True)
class EpochTiming:
    seconds: float
    first_batch: float
    batches: int
    head_seconds: float | None = None  # when the HEAD-th batch arrived; None: the head is the first batch

    def head(self) -> tuple[float, int]:
        """(seconds, batches) of the start-up part of this epoch."""
        if self.head_seconds is not None and self.batches > HEAD:
            return self.head_seconds, HEAD
        return self.first_batch, 1

    @property
    def per_batch(self) -> float:
        head, k = self.head()
        if self.batches <= k:
            return self.seconds
        return (self.seconds - head) / (self.batches - k)


def batches_in(length: int, batch_size: int, drop_last: bool = False) -> int:
    return length // batch_size if drop_last else math.ceil(length / batch_size)


def scale_epoch(timing: EpochTiming, full_batches: int) -> float:
    """Seconds for an epoch of ``full_batches`` batches, given one measured on ``timing.batches``."""
    if full_batches == timing.batches:
        return timing.seconds
    head, k = timing.head()
    return head + timing.per_batch * max(full_batches - k, 0)


def scale_build(seconds: float, samples: int, length: int, head: tuple[float, int] | None = None) -> float:
    """A cache build that stores ``length`` samples, from one of ``samples`` that took ``seconds``: its
    start-up once plus its per-sample cost times ``length`` (the invariant every cache path keeps: a full
    build's ``length`` is the dataset's, a partial's the samples its share holds, ``partial_count``).
    ``head``, a build of a few samples (seconds, count), splits start-up (worker start, the schema's head)
    from the per-sample cost; without it the build is scaled whole. ``length`` may be below ``samples`` (a
    partial of 10 samples from a probe of 64): still start-up once, plus 10 samples."""
    if samples == length:
        return seconds
    if head is not None and 0 < head[1] < samples:
        per_sample = max(seconds - head[0], 0.0) / (samples - head[1])
        return max(head[0] + per_sample * (length - head[1]), 0.0)
    return seconds * length / samples


@dataclass(frozen=True)
class Prediction:
    build_seconds: float
    first_epoch_seconds: float
    epoch_seconds: float
    total_seconds: float
    epochs: int
    extrapolated: bool
    build_fixed_seconds: float = 0.0  # the part of build_seconds that does not scale with the length

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(
    *,
    first: EpochTiming,
    warm: EpochTiming,
    build_seconds: float,
    measured_samples: int,
    length: int,
    batch_size: int,
    epochs: int,
    build_fixed_seconds: float = 0.0,
    build_head: tuple[float, int] | None = None,
    build_samples: int | None = None,
    build_length: int | None = None,
) -> Prediction:
    """The whole-run prediction: build (its fixed part, plus the subset's build scaled by samples) +
    first epoch + (epochs-1) warm epochs. ``build_samples`` and ``build_length``: what the cache build
    covered and stands for, when not the measured samples and length (a rank reads its shard of a cache
    of every rank's samples)."""
    full_batches = batches_in(length, batch_size)
    first_s = scale_epoch(first, full_batches)
    warm_s = scale_epoch(warm, full_batches)
    build = build_fixed_seconds + scale_build(build_seconds, build_samples or measured_samples, build_length or length,
                                              build_head)
    total = build + first_s + warm_s * (epochs - 1)
    return Prediction(
        build_seconds=build,
        first_epoch_seconds=first_s,
        epoch_seconds=warm_s,
        total_seconds=total,
        epochs=epochs,
        extrapolated=measured_samples < length,
        build_fixed_seconds=build_fixed_seconds,
    )
