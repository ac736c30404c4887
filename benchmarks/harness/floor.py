"""This machine's floor for a dataset, as a row of a benchmark (``autotune/dataset/_floor.py``).

``floor_setup`` is a cell like any other, run in a fresh process and interleaved with the rows it is
compared with: its setup is every sample decoded once on every usable CPU in fresh worker processes,
nothing stored (the files evicted before it, as every row's setup); its epochs are the batch gathers
of a shuffled order from a tensor already in memory, into a reused buffer. The tensor is made and
written before the clock starts. ``over_floor`` reports every row's whole run as a multiple of it.
"""

from __future__ import annotations

from typing import Any

from autotune.caches._codec import sample_nbytes
from autotune.dataset import GatherEpochs, decode_once, rows_in_memory
from autotune.loader import DeviceConsumer
from autotune.machine import build_workers
from harness import SEED
from harness.child import Setup

ROW = "floor"


def floor_setup(dataset: Any, files: set[str], batch_size: int) -> Setup:
    """The floor of ``dataset``'s run as a ``Setup``: decode once (timed as setup), then gathers (the epochs)."""
    n = len(dataset)
    rows = rows_in_memory(n, sample_nbytes(dataset[0]))  # outside the clock: the samples as if held
    workers = build_workers()
    setup = Setup(files, lambda: None)  # type: ignore[arg-type,return-value]

    def prepare() -> tuple[GatherEpochs, DeviceConsumer]:
        setup.parts["decode"] = decode_once(dataset, range(n), workers)  # run_setup evicted the files
        setup.info["decode_workers"] = workers
        return GatherEpochs(rows, batch_size, SEED), DeviceConsumer(False)

    setup.prepare = prepare
    return setup


def over_floor(rows: dict[str, dict[str, Any]], floor: str = ROW) -> dict[str, float | None]:
    """Each row's median whole run over the floor row's (None where either has no run)."""
    base = (rows.get(floor) or {}).get("total_s")
    out: dict[str, float | None] = {}
    for name, row in rows.items():
        total = row.get("total_s")
        out[name] = total["median"] / base["median"] if base and total and base["median"] > 0 else None
    return out
