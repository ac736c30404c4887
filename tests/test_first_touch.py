"""machine._first_touch: the fresh memory is really filled, the way a cache's build fills it, in this
process or in forked workers; a row left unwritten is an error, not a figure."""

from __future__ import annotations

import math

import numpy as np
import psutil
import pytest

from autotune.machine import _first_touch
from autotune.machine._first_touch import first_touch_seconds
from autotune.machine._memory_file import FileColumn

NBYTES = 64 << 20


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_every_page_is_filled_and_the_workers_are_reaped(workers):
    me = psutil.Process()
    before = {c.pid for c in me.children()}  # a test runner's worker may have children of its own
    seconds = first_touch_seconds(NBYTES, workers=workers)  # raises when a page was left unwritten
    assert isinstance(seconds, float) and math.isfinite(seconds)
    assert {c.pid for c in me.children()} <= before  # no child left behind, not even a zombie


@pytest.mark.timeout(60)
@pytest.mark.skipif(not FileColumn.available(), reason="memory files need memfd_create")
def test_a_row_not_written_is_an_error(monkeypatch):
    skipped = {"rows": 0}
    real = FileColumn.write

    def every_other(self, k, value):
        if k % 2:
            skipped["rows"] += 1
            return
        real(self, k, value)

    monkeypatch.setattr(FileColumn, "write", every_other)
    with pytest.raises(RuntimeError, match=r"^1024 page\(s\) of the fresh memory were not written"):
        first_touch_seconds(8 << 20, workers=0)  # 8 rows of 1 MiB, 4 skipped: 4 x 256 pages
    assert skipped["rows"] == 4


@pytest.mark.skipif(not FileColumn.available(), reason="memory files need memfd_create")
def test_a_file_column_holds_exactly_what_was_written_in_its_rows_order():
    column = FileColumn((3, 2, 5), np.dtype(np.float32))
    values = np.arange(30, dtype=np.float32).reshape(3, 5, 2).transpose(0, 2, 1)  # strided rows
    try:
        for k in (2, 0, 1):
            column.write(k, values[k])
    finally:
        column.close()
    assert np.array_equal(column.array, values) and column.array.flags.c_contiguous
    assert _first_touch._ROW == 1 << 20
