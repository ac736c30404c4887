"""Quantities in words: time budgets such as ``90s``, ``2m``, ``1m30s``, ``1.5h`` (or a plain number of
seconds) parsed and durations formatted; sizes in bytes formatted."""

from __future__ import annotations

import re

from autotune.errors import AutotuneError

_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|hr|min|m|sec|s)")


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text``; raises AutotuneError naming the accepted forms."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        raw = str(text).strip().lower()
        try:
            seconds = float(raw)
        except ValueError:
            parts = _PART.findall(raw)
            if not parts or _PART.sub("", raw).strip():
                raise AutotuneError(
                    f"Budget must be a duration such as 90s, 2m, 1m30s or 1h, but got {text!r}."
                ) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds > 0:
        raise AutotuneError(f"Budget must be longer than zero, but got {text!r}.")
    return seconds


def format_fine(seconds: float) -> str:
    """Down to microseconds, for per-sample and per-batch costs: 2.31 s, 41.2 ms, 659 us."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def format_seconds(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 120:
        return f"{int(minutes)}m{secs:02.0f}s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)}h{int(minutes):02d}m"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
