"""Is ``dataset[i]`` deterministic? Caches store one read of each sample, so it must be."""

from __future__ import annotations

import random
from typing import Any

from autotune.caches._codec import samples_equal
from autotune.dataset._userfile import read_sample


def _indices(length: int, probe: int, seed: int) -> list[int]:
    if length <= 0 or probe <= 0:
        return []
    picks = [0, length - 1]
    rng = random.Random(seed)
    picks += [rng.randrange(length) for _ in range(max(0, probe - 2))]
    return list(dict.fromkeys(picks))[:probe]


def check_deterministic(dataset: Any, probe: int = 3, seed: int = 0) -> tuple[bool, str]:
    """Read ``probe`` indices twice and compare exactly; (True, "") or (False, one-line reason).

    The indices are the first, the last, and seeded random ones. All are read once, then all again,
    so randomness from a shared generator (``random``, ``np.random``, ``torch``) shows up.
    """
    indices = _indices(len(dataset), probe, seed)
    first = [read_sample(dataset, i) for i in indices]
    for i, before in zip(indices, first):
        if not samples_equal(before, read_sample(dataset, i)):
            return False, (
                f"dataset[{i}] returned different samples on two reads, so no cache can store it: "
                "move the random part (augmentation) into a module-level `transform` in the dataset file; "
                "it runs after the cache, every epoch."
            )
    return True, ""


__all__ = ["check_deterministic"]
