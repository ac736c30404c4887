"""After a build in workers, the memory cache's pages are mapped in the training process (no first-touch
faults in epoch 1): checked in this process's own page tables (/proc/self/smaps Rss of each column's
mapping), for memory files and for shared anonymous memory."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from autotune.caches import MemoryCache
from autotune.caches._codec import samples_equal
from autotune.caches._memory import _shared_array
from autotune.machine import FileColumn
from autotune.machine._populate import populate

pytestmark = pytest.mark.timeout(120)
fork_only = pytest.mark.skipif(not FileColumn.available(), reason="memory files need memfd_create")


def resident(array: np.ndarray) -> int:
    """Bytes of the mapping holding ``array`` that are mapped in this process (smaps Rss)."""
    start = array.__array_interface__["data"][0]
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for k, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            if lo <= start < hi:
                for rest in lines[k + 1:]:
                    if rest.startswith("Rss:"):
                        return int(rest.split()[1]) * 1024
    raise AssertionError("no mapping holds the array")


def written_elsewhere(rows: int, row_bytes: int) -> FileColumn:
    """A memory-file column whose pages a child process wrote through the file: none mapped here."""
    column = FileColumn((rows, row_bytes), np.dtype(np.uint8))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child exits at once
        try:
            for k in range(rows):
                column.write(k, np.full(row_bytes, k % 251, dtype=np.uint8))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return column


class Images(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        return torch.full((4, 64, 64), float(i)), i


@fork_only
def test_populate_maps_every_page_another_process_wrote():
    column = written_elsewhere(64, 16 * mmap.PAGESIZE + 12)  # rows that do not start on a page
    assert resident(column.array) == 0, "written through the file: nothing is mapped here yet"
    populate(column.array)
    assert resident(column.array) == -(-column.array.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    assert all(int(column.array[k, -1]) == k % 251 for k in range(64))
    column.close()


def test_populate_maps_shared_anonymous_memory_a_child_wrote():
    array = _shared_array((32, 4 * mmap.PAGESIZE), np.dtype(np.uint8))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child exits at once
        try:
            array[:] = 7
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert resident(array) == 0
    populate(array)
    assert resident(array) == array.nbytes and int(array[31, -1]) == 7


def test_a_build_in_workers_leaves_the_cache_mapped_in_this_process():
    dataset = Images()
    cache = MemoryCache.build(dataset, range(len(dataset)), manifest={}, progress=False, workers=2)
    image_column = cache.columns[0]
    assert image_column.nbytes == 48 * 4 * 64 * 64 * 4
    # the workers wrote 40 of the 48 rows (the schema's 8 first ones were written here); all are mapped
    assert resident(image_column) == image_column.nbytes
    assert all(samples_equal(cache[i], dataset[i]) for i in range(len(dataset)))
