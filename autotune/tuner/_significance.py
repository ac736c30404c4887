"""Is a candidate really faster than the default, on this machine, today? The noise the search ran in and
the interval of each speed-up (docs/architecture.md §3).

Runs of one configuration vary (5-18% on a small VM, more beside another job), so a ratio of two medians
means little alone. Each configuration's runs are taken on a log scale, where a ratio is a difference; the
spread is pooled over every configuration measured more than once (one machine, one noise), and the
speed-up's 95% interval is the difference of the log medians plus or minus Student's t times that spread.
Until the runs give ``PRIOR_DF`` degrees of freedom of their own, ``PRIOR_SPREAD`` (what a small VM shows)
stands in for the ones missing: a pair of runs that happened to agree does not make the interval narrow.
Once they do, the runs' own spread decides: a prior of fixed weight kept a 10% spread in every interval
however quietly the runs agreed (the accelerator benchmark's 60 ms search: finalists' runs within 1%, two
and three of them 10% apart, read as a tie at 0.99-1.26x). A candidate whose interval holds 1 is tied with
the default, and a tie keeps the default.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

from autotune.config import LoaderConfig

PRIOR_SPREAD = 0.10  # log-scale spread of one configuration's runs before any was repeated (5-18% measured)
PRIOR_DF = 4  # the runs' degrees of freedom the prior spread stands in for until they have them
NARROW = 0.05  # a speed-up's interval is narrow enough at about +-5%
EQUIVALENT = 0.05  # two winners this close in median cost the same in practice: the smaller change is kept
NOISY_SPREAD = 0.15  # runs of one configuration varying more than ~15% make a machine too noisy to tell
NOISY_STEAL = 0.05  # CPU time taken by the hypervisor for other guests
NOISY_LOAD = 1.5  # runnable processes per usable CPU, beyond the search's own

_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 30: 2.04}


def t95(df: int) -> float:
    """Student's two-sided 95% quantile for ``df`` degrees of freedom (1.96 for none: the prior's normal)."""
    if df <= 0:
        return 1.96
    for k in sorted(_T95):
        if df <= k:
            return _T95[k]
    return 1.96


@dataclass(frozen=True)
class Spread:
    """The log-scale spread of repeated runs, pooled over configurations, and its degrees of freedom."""

    sigma: float
    df: int
    measured_df: int = 0  # the runs' own share of ``df``: 0 when nothing was repeated

    @classmethod
    def pooled(cls, runs: Mapping[object, Sequence[float]]) -> Spread:
        """The runs' spread, the prior standing in for the degrees of freedom they lack (``df`` counts both)."""
        squares, df = 0.0, 0
        for values in runs.values():
            logs = [math.log(v) for v in values if v > 0]
            if len(logs) >= 2:
                mean = statistics.fmean(logs)
                squares += sum((x - mean) ** 2 for x in logs)
                df += len(logs) - 1
        # The prior fills the degrees of freedom up to PRIOR_DF: one pair of runs that happened to agree (or not)
        # does not make the interval as narrow (or as wide, with t of 1 degree of freedom: 12.7) as that pair
        # alone; runs with PRIOR_DF of their own are evidence enough of this machine's noise today.
        prior = max(0, PRIOR_DF - df)
        return cls(math.sqrt((squares + prior * PRIOR_SPREAD ** 2) / (df + prior)), df + prior, df)


@dataclass(frozen=True)
class Ratio:
    """How many times faster than ``base`` a configuration is: the point and its 95% interval."""

    speedup: float
    low: float
    high: float

    @property
    def faster(self) -> bool:
        return self.low > 1.0

    @property
    def tied(self) -> bool:
        return self.low <= 1.0 <= self.high

    @property
    def half_width(self) -> float:
        """Half the interval's width on the log scale (0.05: about +-5%)."""
        return (math.log(self.high) - math.log(self.low)) / 2


def ratio(base: float, base_runs: int, other: float, other_runs: int, spread: Spread) -> Ratio:
    """``base / other`` (seconds) with the interval ``spread`` gives runs counted ``base_runs``, ``other_runs``."""
    centre = math.log(base) - math.log(other)
    half = t95(spread.df) * spread.sigma * math.sqrt(1 / max(base_runs, 1) + 1 / max(other_runs, 1))
    return Ratio(math.exp(centre), math.exp(centre - half), math.exp(centre + half))


def changes(config: LoaderConfig, default: LoaderConfig) -> int:
    """How many settings ``config`` changes from the default: among tied candidates the smaller change wins."""
    return sum(getattr(config, f.name) != getattr(default, f.name) for f in fields(LoaderConfig))


_C = TypeVar("_C", bound=LoaderConfig)


def choose(totals: Mapping[_C, float], counts: Mapping[_C, int], default: _C,
           spread: Spread) -> tuple[_C, dict[_C, Ratio]]:
    """The winner and each candidate's speed-up over the default. Only a candidate measurably faster than the
    default may win; among those, the fastest, or a smaller change tied with it and within ``EQUIVALENT`` of its
    median."""
    base, n = totals[default], counts[default]
    ratios = {c: ratio(base, n, t, counts[c], spread) for c, t in totals.items() if c != default}
    faster = [c for c, r in ratios.items() if r.faster]
    if not faster:
        return default, ratios
    fastest = min(faster, key=lambda c: (totals[c], c.key()))
    # A tie between two winners says neither is proven faster than the other, not that they are equal: on
    # a few noisy runs the interval can hold 1.3x. The smaller change is worth only a cost that is the same
    # in practice, so it must also be within EQUIVALENT of the fastest's median.
    tied = [c for c in faster
            if c == fastest or (totals[c] <= totals[fastest] * (1 + EQUIVALENT)
                                and ratio(totals[c], counts[c], totals[fastest], counts[fastest], spread).tied)]
    return min(tied, key=lambda c: (changes(c, default), totals[c], c.key())), ratios


@dataclass(frozen=True)
class Noise:
    """The conditions the search measured in: CPU steal and load from /proc, and the spread of repeated runs."""

    steal: float | None = None  # fraction of all CPU time stolen by the hypervisor meanwhile
    load: float | None = None  # runnable processes per usable CPU (1-minute load average)
    spread: float | None = None  # pooled log-scale spread of repeated runs (None: nothing repeated)

    def problems(self) -> list[str]:
        out = []
        if self.spread is not None and self.spread > NOISY_SPREAD:
            out.append(f"runs of one configuration varied by ~{self.spread:.0%}")
        if self.steal is not None and self.steal > NOISY_STEAL:
            out.append(f"the hypervisor took {self.steal:.0%} of the CPU time")
        if self.load is not None and self.load > NOISY_LOAD:
            out.append(f"the load was {self.load:.1f} per CPU")
        return out


def cpu_times() -> tuple[float, float] | None:
    """(all, stolen) CPU time so far from /proc/stat; None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu":
        return None
    values = [float(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(values), values[7] if len(values) > 7 else 0.0


def noise_since(start: tuple[float, float] | None, cpus: int, spread: Spread) -> Noise:
    """The noise from ``start`` (``cpu_times()`` then) until now."""
    now = cpu_times()
    steal = None
    if start is not None and now is not None and now[0] > start[0]:
        steal = (now[1] - start[1]) / (now[0] - start[0])
    try:
        load = os.getloadavg()[0] / max(cpus, 1)
    except OSError:
        load = None
    return Noise(steal=steal, load=load, spread=spread.sigma if spread.measured_df else None)
