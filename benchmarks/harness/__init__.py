"""The one benchmark harness: every script in ``benchmarks/`` measures through these modules.

How a configuration is measured (docs/architecture.md §3 and "Measuring on small machines"):

- a fresh Python process per run (``fresh.run_fresh``): allocator state, thread pools and worker
  start-up never carry over; a preloaded allocator is put in the environment it starts with;
- the dataset's source files are evicted from the page cache before the one-time setup reads them and
  again just before epoch 1 (``child.run_setup``);
- the setup (cache build, load, recipe factory) is timed apart from the epochs; each epoch is timed
  from ``iter(loader)`` to the last batch consumed, the consumer included, and to its first batch
  (the first step's wait for data); shuffle with a fixed seed;
- no memory is read while epochs are timed: peak PSS comes from a separate run (``memory=True``);
- configurations are interleaved (A B C A B C ...) and summarised by median with the min-max spread.

Modules: ``child`` (what runs in the fresh process), ``fresh`` (the parent side: environment, launch),
``stats`` (interleaving, medians, spread), ``machine`` (the facts a result is quoted with), ``output``
(command line, tables, JSON), ``recipes`` (autotune's search and a Profile for any LoaderConfig),
``oracle`` (the exhaustive grid), ``workloads`` (the datasets and consumers several scripts share).

Importing this package puts the repository and ``examples/`` first on ``sys.path``, so the checkout's
``autotune`` is the one measured; import it before ``autotune``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
EXAMPLES = REPO / "examples"
RESULTS = BENCHMARKS / "results"
SEED = 0

for _folder in (EXAMPLES, REPO):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
