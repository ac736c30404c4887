"""A cache backend that exists only in the tests: one file per sample. It is registered here and
nowhere else, and runs through the same conformance suites as the built-in backends (the proof that
every list of backends, name pattern and per-backend decision comes from the registered classes)."""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune import caches
from autotune.caches._base import CorruptCache, DiskCache
from autotune.caches._codec import Schema, pack, unpack

RECORDS = "records"


class ShelfCache(DiskCache):
    """``records/<k>.bin``: crc32 then the packed record (``codec.pack``) of position k."""

    name = "shelf"

    @classmethod
    def estimate_need(cls, bytes_per_sample: float, n: int) -> tuple[int, int]:
        return 0, int((float(bytes_per_sample) + 4096) * n + (1 << 20))  # a block per file at least

    @classmethod
    def build_held(cls, sample_bytes: float, n: int | None) -> int:
        return int(sample_bytes)  # the record it packs: each goes to its file at once

    @classmethod
    def _write(cls, tmp: Path, schema: Schema, n: int, samples: Iterator[Any], head: list[Any]) -> dict[str, Any]:
        (tmp / RECORDS).mkdir()
        count = 0
        for sample in itertools.chain(head, samples):
            record = pack(schema, sample)
            (tmp / RECORDS / f"{count}.bin").write_bytes(struct.pack(">I", zlib.crc32(record)) + record)
            count += 1
        if count != n:
            raise RuntimeError(f"The dataset gave {count} samples, but {n} were expected.")
        return {}

    def _open_handle(self) -> Any:
        return self.folder / RECORDS

    def _close_handle(self, handle: Any) -> None:
        pass

    def _record(self, k: int) -> bytes:
        try:
            value = (self._get_handle() / f"{k}.bin").read_bytes()
        except OSError as exc:
            raise CorruptCache(f"Sample {k} of the cache at {self.path} is unreadable ({exc}).") from None
        if len(value) < 4 or struct.unpack(">I", value[:4])[0] != zlib.crc32(value[4:]):
            raise CorruptCache(f"Sample {k} of the cache at {self.path} fails its checksum.")
        return value[4:]

    def __getitem__(self, k: int) -> Any:
        return unpack(self.schema, self._record(self._position(k)))

    def _check(self, k: int) -> None:
        self._record(k)


def registered() -> Iterator[None]:
    """The test-only backend registered for the duration of a test (a fixture's body)."""
    caches.register(ShelfCache)
    try:
        yield
    finally:
        caches.unregister(ShelfCache.name)


def with_plugin(names: Any) -> tuple[str, ...]:
    """``names()`` (``caches.backend_names``, ``caches.disk_names``) with the test-only backend
    registered: what a suite parametrises on."""
    gen = registered()
    next(gen)
    try:
        return tuple(names())
    finally:
        gen.close()


plugin = pytest.fixture(registered)
