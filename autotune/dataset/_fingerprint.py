"""A short, stable fingerprint of a dataset: its length, a few samples' bits, its source file."""

from __future__ import annotations

import hashlib
from typing import Any

from autotune.caches._codec import sample_digest
from autotune.dataset._watchdog import reading

FINGERPRINT_VERSION = 1


def probe_indices(length: int, probe: int = 4) -> list[int]:
    """``probe`` indices spread deterministically over ``range(length)``: first, last and evenly between."""
    if length <= 0 or probe <= 0:
        return []
    if probe == 1:
        return [0]
    picks = {round(k * (length - 1) / (probe - 1)) for k in range(probe)}
    return sorted(picks)


def dataset_fingerprint(dataset: Any, source_text: str | None = None, probe: int = 4) -> str:
    """Hex digest (16 chars) of the length, the digests of ``probe`` samples and the source text.

    A change to the dataset's file, its length, or the bits of the probed samples changes the
    fingerprint, and with it the manifest a cache is checked against.
    """
    length = len(dataset)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"autotune-fingerprint-v{FINGERPRINT_VERSION}:len={length}".encode())
    for i in probe_indices(length, probe):
        h.update(f":{i}:".encode())
        with reading(f"dataset[{i}]"):
            h.update(sample_digest(dataset[i]))
    if source_text is not None:
        h.update(b":source:")
        h.update(hashlib.sha256(source_text.encode("utf-8", "surrogatepass")).digest())
    return h.hexdigest()


__all__ = ["dataset_fingerprint", "probe_indices"]
