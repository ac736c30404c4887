"""Interleaved repeats and their summary: median with the min-max spread; a ratio over interleaved pairs
and the verdict it supports against a bound."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from typing import Any

from harness.fresh import RunFailed


def interleaved(runs: dict[str, Callable[[], dict]], repeats: int, log: Callable[[str], None] | None = None
                ) -> dict[str, list[dict]]:
    """Call each run ``repeats`` times, interleaved: A B C A B C ...; failures are recorded, not raised."""
    out: dict[str, list[dict]] = {name: [] for name in runs}
    for rep in range(repeats):
        for name, fn in runs.items():
            try:
                result = fn()
            except (RunFailed, subprocess.TimeoutExpired) as exc:
                result = {"failed": str(exc)}
            out[name].append(result)
            if log:
                log(f"{name} #{rep + 1}: " + describe_run(result))
    return out


def describe_run(result: dict) -> str:
    if "failed" in result:
        return "FAILED " + result["failed"].splitlines()[0]
    epochs = " ".join(f"{s:.2f}" for s in result["epoch_s"])
    return f"setup {result['setup_s']:.2f} s, epochs {epochs} s, total {result['total_s']:.2f} s"


def spread(values: list[float]) -> dict[str, Any] | None:
    """Median with min and max, or None without values."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def paired_ratio(num: list[float | None], den: list[float | None]) -> dict[str, Any] | None:
    """``num[i] / den[i]`` over the interleaved pairs (repeat i of each row ran side by side, under the same
    load), as ``spread`` summarises it; a pair with a failed run (None) is left out; None without a pair."""
    return spread([a / b for a, b in zip(num, den, strict=True) if a is not None and b is not None])


def verdict(ratio: dict[str, Any] | None, bound: float) -> str:
    """Whether the pairs support ``ratio <= bound``: "met" when every pair's ratio is within it, "not met" when
    none is, "tie within noise" when the pairs fall on both sides (the spread straddles the bound: the run
    shows neither), "not measured" without a pair."""
    if not ratio:
        return "not measured"
    if ratio["max"] <= bound:
        return "met"
    if ratio["min"] > bound:
        return "not met"
    return "tie within noise"


def ok(runs: list[dict]) -> list[dict]:
    """The runs that did not fail."""
    return [r for r in runs if "failed" not in r]


def summarise_runs(runs: list[dict], memory_run: dict | None = None) -> dict[str, Any]:
    """Per-column median (min-max) over the repeats of one configuration."""
    good = ok(runs)
    out: dict[str, Any] = {"repeats": len(runs), "failed": [r["failed"] for r in runs if "failed" in r]}
    if not good:
        return out
    epochs = len(good[0]["epoch_s"])
    out["epoch_s"] = [spread([r["epoch_s"][e] for r in good]) for e in range(epochs)]
    out["setup_s"] = spread([r["setup_s"] for r in good])
    out["total_s"] = spread([r["total_s"] for r in good])
    steady = [statistics.median(r["epoch_s"][1:]) for r in good] if epochs > 1 else []
    out["first_over_steady"] = spread([r["epoch_s"][0] / s for r, s in zip(good, steady, strict=False) if s > 0])
    out["runs"] = runs
    if memory_run is not None:
        out["peak_pss_bytes"] = memory_run.get("peak_pss_bytes")
        out["memory_run"] = memory_run
    return out
