"""This machine's floor for a dataset, as a row of a benchmark (``autotune/dataset/_floor.py``).

``floor_setup`` is a cell like any other, run in a fresh process and interleaved with the rows it is
compared with: its setup is every sample decoded once on every usable CPU in fresh worker processes,
nothing stored (the files evicted before it, as every row's setup); its epochs are the batch gathers
of a shuffled order from a tensor already in memory, into a reused buffer. The tensor is made and
written before the clock starts. ``over_floor`` reports every row's whole run as a multiple of it;
``keep_row`` adds what the floor does not count, keeping the samples (their bytes written into fresh
memory once, ``machine.first_touch_seconds``, measured in the same process outside the clock).
"""

from __future__ import annotations

import statistics
from typing import Any

from autotune.caches._codec import sample_nbytes
from autotune.dataset import GatherEpochs, decode_once, rows_in_memory
from autotune.loader import DeviceConsumer
from autotune.machine import build_workers, first_touch_seconds
from harness import SEED
from harness.child import Setup

ROW = "floor"


def floor_setup(dataset: Any, files: set[str], batch_size: int) -> Setup:
    """The floor of ``dataset``'s run as a ``Setup``: decode once (timed as setup), then gathers (the epochs)."""
    n = len(dataset)
    nbytes = sample_nbytes(dataset[0])
    rows = rows_in_memory(n, nbytes)  # outside the clock: the samples as if held
    workers = build_workers()
    setup = Setup(files, lambda: None)  # type: ignore[arg-type,return-value]
    # Outside the clock too: what holding them costs a run that must put them there, the samples' bytes
    # written into fresh memory once on the same workers, as a memory cache writes them (``keep_row``).
    setup.info["keep_s"] = first_touch_seconds(n * nbytes, workers)

    def prepare() -> tuple[GatherEpochs, DeviceConsumer]:
        setup.parts["decode"] = decode_once(dataset, range(n), workers)  # run_setup evicted the files
        setup.info["decode_workers"] = workers
        return GatherEpochs(rows, batch_size, SEED), DeviceConsumer(False)

    setup.prepare = prepare
    return setup


def keep_row(rows: dict[str, dict[str, Any]], floor: str = ROW) -> dict[str, Any] | None:
    """The floor plus keeping the samples (the median of the floor runs' ``keep_s``: their bytes written
    into fresh memory once, which the floor's own total does not count), and each row's total over it."""
    runs = [r for r in (rows.get(floor) or {}).get("runs") or [] if "keep_s" in (r.get("info") or {})]
    base = (rows.get(floor) or {}).get("total_s")
    if not runs or not base:
        return None
    keep = statistics.median(r["info"]["keep_s"] for r in runs)
    held = base["median"] + keep
    return {"keep_s": keep, "floor_plus_keep_s": held,
            "over": {name: row["total_s"]["median"] / held for name, row in rows.items() if row.get("total_s")}}


def over_floor(rows: dict[str, dict[str, Any]], floor: str = ROW) -> dict[str, float | None]:
    """Each row's median whole run over the floor row's (None where either has no run)."""
    base = (rows.get(floor) or {}).get("total_s")
    out: dict[str, float | None] = {}
    for name, row in rows.items():
        total = row.get("total_s")
        out[name] = total["median"] / base["median"] if base and total and base["median"] > 0 else None
    return out
