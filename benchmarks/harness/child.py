"""The child side of a fresh-process run: evict the source files, time the setup, time each epoch.

A script defines its cells, ``name -> function(params) -> Setup``; ``fresh.run_fresh`` starts
``script --cell JSON`` and the script hands that JSON to :func:`child_main`.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.machine._evict import evict
from autotune.machine._memory import tree_pss


@dataclass
class Setup:
    """What a cell hands back: the source files to evict, and how to build its loader.

    ``prepare()`` is the one-time work of the run (cache build, in-memory load, the factory), timed as
    "setup"; it returns the loader and the consumer of each batch. ``parts`` may be filled by
    ``prepare`` with named sub-timings (seconds); ``info`` with anything else worth keeping.
    ``finish()`` is what the process does at exit before it can end (a first-epoch fill's commit,
    ``autotune/caches/_disk_fill.py``), timed as "finish" and counted in the total, since the harness
    ends the child with ``os._exit``, which skips exit handlers.
    """

    files: set[str]
    prepare: Callable[[], tuple[Iterable, Callable[[Any], Any]]]
    parts: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    finish: Callable[[], None] | None = None


def evict_files(paths: Iterable[str]) -> dict[str, Any]:
    """Drop ``paths`` from the page cache and say how well it worked."""
    paths = list(paths)
    if not paths:
        return {"files": 0, "effective": None, "note": "no files to evict (data generated in memory)"}
    return evict(paths).to_dict()


def _epoch(loader: Iterable, consume: Callable[[Any], Any], memory: bool) -> dict[str, Any]:
    """One epoch: wall seconds, seconds to the first batch (before it is consumed), batches, main-process CPU
    seconds and minor faults; peak PSS in the memory pass."""
    every = 0
    if memory:
        try:
            every = max(1, len(loader) // 10)  # type: ignore[arg-type]
        except TypeError:
            every = 10
    peak = batches = 0
    first: float | None = None
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu = time.process_time()
    start = time.perf_counter()
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        consume(batch)
        batches += 1
        if every and batches % every == 0:
            peak = max(peak, tree_pss())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "first_batch_s": seconds if first is None else first, "batches": batches,
            "peak": peak, "cpu_s": time.process_time() - cpu,
            "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults}


def run_setup(setup: Setup, epochs: int, memory: bool = False) -> dict[str, Any]:
    """Evict, prepare (timed), evict again, then time ``epochs`` epochs (or sample memory)."""
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    before_setup = evict_files(setup.files)
    t0 = time.perf_counter()
    loader, consume = setup.prepare()
    setup_seconds = time.perf_counter() - t0
    peak = tree_pss() if memory else 0
    gc.collect()
    before_epoch1 = evict_files(setup.files)
    done = [_epoch(loader, consume, memory) for _ in range(epochs)]
    epoch_s = [e["seconds"] for e in done]
    t1 = time.perf_counter()
    if setup.finish is not None:
        setup.finish()
    finish_seconds = time.perf_counter() - t1
    return {
        "setup_s": setup_seconds,
        "parts_s": dict(setup.parts),
        "epoch_s": epoch_s,
        "finish_s": finish_seconds,
        "first_batch_s": [e["first_batch_s"] for e in done],
        "total_s": setup_seconds + sum(epoch_s) + finish_seconds,
        "batches": [e["batches"] for e in done],
        "main_cpu_s": [e["cpu_s"] for e in done],
        "main_faults": [e["faults"] for e in done],
        "peak_pss_bytes": max([peak, *(e["peak"] for e in done)]) if memory else None,
        "eviction": {"before_setup": before_setup, "before_epoch1": before_epoch1},
        "info": dict(setup.info),
    }


def child_main(cells: Mapping[str, Callable[[dict], Setup]], payload: str) -> int:
    """The child's entry point: build the cell, run it, print one JSON line."""
    spec = json.loads(payload)
    setup = cells[spec["cell"]](spec["params"])
    result = run_setup(setup, spec["epochs"], spec["memory"])
    sys.stdout.flush()
    print("\n" + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of workers/threads: the result is out
