"""A search's figures learned from what the factory cost on this machine (recipe/_factory_runs.py).

A trial predicts the factory's build from its subset's build, and its epochs from the subset's epochs,
in a trial's process. Where ``autotune validate`` has run the factory on this machine for the same data,
the search predicts each phase from those runs instead: the median of what the factory took, in its own
conditions (a fresh process, cold files, the whole dataset), is a better figure for the next run through
the factory than one trial's scaled subset. Phases no validated run stands for keep the trial's figure
(docs/architecture.md §3).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from autotune.config import LoaderConfig
from autotune.recipe._factory_runs import FACTORY_NOTE, FactoryRun
from autotune.tuner._measurement import Measurement


@dataclass(frozen=True)
class FactoryCosts:
    """The factory runs that can stand for this search's candidates, and what they are compared on."""

    runs: tuple[FactoryRun, ...] = ()
    dataset: str = ""  # the searched dataset's fingerprint
    length: int = 0
    batch_size: int = 0
    build_workers: int = 0

    def learned(self, config: LoaderConfig, measurement: Measurement) -> tuple[Measurement, str | None]:
        """``measurement`` with each phase the factory's runs stand for replaced by their median, and a note
        saying so (None when no run applies: the measurement as it was)."""
        builds = [r for r in self.runs if r.builds_like(config, self.dataset, self.length, self.build_workers)]
        epochs = [r for r in self.runs if r.runs_like(config, self.dataset, self.length, self.batch_size)]
        if not builds and not epochs:
            return measurement, None
        p = measurement.prediction
        build = statistics.median(r.build_seconds for r in builds) if builds else p.build_seconds
        first = statistics.median(r.first_epoch_seconds for r in epochs) if epochs else p.first_epoch_seconds
        epoch = statistics.median(r.epoch_seconds for r in epochs) if epochs else p.epoch_seconds
        total = build + first + epoch * (p.epochs - 1)
        learned = replace(p, build_seconds=build, first_epoch_seconds=first, epoch_seconds=epoch, total_seconds=total)
        parts = []
        if builds:
            parts.append(f"the build from {len(builds)} (trials: {p.build_seconds:.2f} s, factory: {build:.2f} s)")
        if epochs:
            parts.append(f"the epochs from {len(epochs)} (trials: {p.first_epoch_seconds:.2f} s then "
                         f"{p.epoch_seconds:.2f} s, factory: {first:.2f} s then {epoch:.2f} s)")
        note = f"{FACTORY_NOTE}: {' and '.join(parts)}; whole run {p.total_seconds:.2f} s -> {total:.2f} s"
        return replace(measurement, prediction=learned), note
