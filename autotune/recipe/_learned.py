"""What an adapting run learned, kept in this machine's profile (``"learned"``), so the next run starts there.

::

    "learned": {"mode": "adapt", "batch_size": 64, "length": 50000, "updated": "2026-...", "epochs": 12,
                "best": CONFIG, "configs": [{"config": CONFIG, "epochs": 3, "seconds_per_batch": 0.012,
                "stall": 0.04}, ...], "switches": [{"epoch": 3, "from": CONFIG, "to": CONFIG,
                "event": "keep", "line": "..."}, ...]}

A search is a forecast; this is what the real step measured. The factory starts the next run from ``best``
(the loader keywords an adapting loader moves; the cache, allocator and threads stay the recipe's), for the
same batch size and dataset length, adapting or not (``starting_config``); ``autotune show`` tells it. Every
value is checked on reading, and written through the recipe file's atomic, locked ``merge_write``.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from dataclasses import dataclass
from typing import Any

from autotune.config import LoaderConfig
from autotune.errors import RecipeError

MOVED = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "main_threads",
         "worker_threads")  # what an adapting loader moves
KEEP_SWITCHES = 32  # the newest switches kept
MODES = ("adapt", "observe")


def _fail(what: str) -> RecipeError:
    return RecipeError(f"a profile's learned.{what}; remove \"learned\" from the recipe file (the next adapting "
                       "run writes it again)")


def _number(data: Any, key: str, where: str) -> float:
    v = data.get(key) if isinstance(data, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _fail(f"{where}{key} must be a non-negative number, but got {v!r}")
    return float(v)


def _count(data: Any, key: str, where: str, optional: bool = False) -> int | None:
    v = data.get(key) if isinstance(data, dict) else None
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _fail(f"{where}{key} must be a non-negative integer, but got {v!r}")
    return v


def _text(data: Any, key: str, where: str) -> str:
    v = data.get(key, "") if isinstance(data, dict) else None
    if not isinstance(v, str):
        raise _fail(f"{where}{key} must be a string")
    return v


def _config(data: Any, where: str) -> LoaderConfig:
    try:
        return LoaderConfig.from_json(data)
    except RecipeError as exc:
        raise _fail(f"{where}: {exc}") from None


@dataclass(frozen=True)
class ConfigFigures:
    config: LoaderConfig
    epochs: int
    seconds_per_batch: float  # the median epoch's
    stall: float  # the latest epoch's share of time waiting inside next()

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "epochs": self.epochs, "seconds_per_batch": self.seconds_per_batch,
                "stall": self.stall}


@dataclass(frozen=True)
class Switch:
    epoch: int  # the epoch after which the configuration changed (1 = the first)
    before: LoaderConfig
    after: LoaderConfig
    event: str
    line: str

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "from": self.before.to_json(), "to": self.after.to_json(), "event": self.event,
                "line": self.line}


@dataclass(frozen=True)
class Learned:
    mode: str
    batch_size: int | None
    length: int | None
    epochs: int
    best: LoaderConfig
    configs: tuple[ConfigFigures, ...] = ()
    switches: tuple[Switch, ...] = ()
    updated: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "batch_size": self.batch_size, "length": self.length, "epochs": self.epochs,
                "updated": self.updated, "best": self.best.to_json(),
                "configs": [c.to_json() for c in self.configs], "switches": [s.to_json() for s in self.switches]}

    @classmethod
    def from_json(cls, data: Any) -> Learned | None:
        """From a profile's ``"learned"`` (absent: None); RecipeError naming the first bad value."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise _fail("must be an object")
        mode = _text(data, "mode", "")
        if mode not in MODES:
            raise _fail(f"mode must be one of {', '.join(MODES)}, but got {mode!r}")
        configs, switches = data.get("configs", []), data.get("switches", [])
        if not isinstance(configs, list) or not isinstance(switches, list):
            raise _fail("configs and switches must be lists")
        return cls(
            mode=mode, batch_size=_count(data, "batch_size", "", optional=True),
            length=_count(data, "length", "", optional=True), epochs=_count(data, "epochs", "") or 0,
            best=_config(data.get("best"), "best"), updated=_text(data, "updated", ""),
            configs=tuple(_figures(c) for c in configs),
            switches=tuple(Switch(_count(s, "epoch", "switches[].") or 0,
                                  _config(s.get("from") if isinstance(s, dict) else None, "switches[].from"),
                                  _config(s.get("to") if isinstance(s, dict) else None, "switches[].to"),
                                  _text(s, "event", "switches[]."), _text(s, "line", "switches[]."))
                           for s in switches),
        )

    def figures(self, config: LoaderConfig) -> ConfigFigures | None:
        """What was measured of ``config`` (None: nothing)."""
        return next((c for c in self.configs if c.config == config), None)

    def differs_from(self, config: LoaderConfig) -> bool:
        """Whether the run moved away from ``config`` (the searched one): the forecast missed this run's step."""
        return any(getattr(self.best, k) != getattr(config, k) for k in MOVED)

    def describe(self) -> str:
        """One line for ``autotune show``."""
        best = self.figures(self.best)
        at = f" ({best.seconds_per_batch * 1e3:.2f} ms a batch, stall {best.stall:.0%})" if best else ""
        what = "observed" if self.mode == "observe" else "adapted to"
        others = [f"{c.config.num_workers}w/pf{c.config.prefetch_factor or '-'}"
                  f"{'/persistent' if c.config.persistent_workers else ''}: {c.seconds_per_batch * 1e3:.2f} ms"
                  for c in self.configs if c.config != self.best]
        tried = f"; also measured {', '.join(others)}" if others else ""
        return (f"{what} {_loader_words(self.best)}{at} over {self.epochs} epochs of batch {self.batch_size}, "
                f"{len(self.switches)} switch(es){tried}; {self.updated or 'at an unknown time'}; the next run "
                "starts there")


def _figures(c: Any) -> ConfigFigures:
    return ConfigFigures(_config(c.get("config") if isinstance(c, dict) else None, "configs[]"),
                         _count(c, "epochs", "configs[].") or 0, _number(c, "seconds_per_batch", "configs[]."),
                         _number(c, "stall", "configs[]."))


def _loader_words(config: LoaderConfig) -> str:
    words = [f"{k}={v}" for k, v in config.loader_kwargs().items() if k in MOVED]
    return ", ".join(words + [f"{k}={getattr(config, k)}" for k in ("main_threads", "worker_threads")
                              if getattr(config, k) is not None])


def record(mode: str, policy: Any, events: list[Any], batch_size: int | None, length: int | None,
           previous: Learned | None = None) -> Learned:
    """The record of a run from its policy's figures and its epochs' events (``_adaptive.Event``); the
    switches of an earlier run of the same batches kept before this run's."""
    configs = tuple(ConfigFigures(c, len(s.epochs), statistics.median(s.epochs), s.stall)
                    for c, s in policy.stats.items() if s.epochs)
    switches = [Switch(e.epoch + 1, e.config, e.next_config, e.decision, e.line)
                for e in events if e.next_config != e.config]
    if previous is not None and (previous.batch_size, previous.length) == (batch_size, length):
        switches = [*previous.switches, *switches]
    epochs = len({e.epoch for e in events})  # a long epoch's parts are one epoch
    return Learned(mode=mode, batch_size=batch_size, length=length, epochs=epochs, best=policy.incumbent,
                   configs=configs, switches=tuple(switches[-KEEP_SWITCHES:]),
                   updated=_dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat())


def starting_config(config: LoaderConfig, learned: Learned | None, batch_size: int | None,
                    length: int | None) -> LoaderConfig | None:
    """``config`` with what an adapting run of the same batches learned (None: nothing learned that applies)."""
    if learned is None or learned.mode != "adapt" or (learned.batch_size, learned.length) != (batch_size, length):
        return None
    moved = {k: getattr(learned.best, k) for k in MOVED}
    if learned.best.num_workers:
        moved["multiprocessing_context"] = learned.best.multiprocessing_context
    start = config.refit(**moved)
    return start if start != config else None
