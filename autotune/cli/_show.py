"""`autotune show [autotune.json]`: every profile in the recipe file, readable, this machine's marked."""

from __future__ import annotations

import argparse
import re
import textwrap
from typing import Any

from autotune.cli._options import add_profile_options, print_json
from autotune.machine import _hardware as hardware
from autotune.machine import ranks_per_node
from autotune.process import command_line, get_allocator
from autotune.recipe._factory_runs import FACTORY_NOTE
from autotune.recipe._file import VERSION, Profile, RecipeFile
from autotune.recipe._measured import Subset

WIDTH = 100
_LABEL = 12  # column where values start, after "    label   "
_INDENT = 4


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "show",
        help="show the recipe file readably",
        description="Show every profile in the recipe file: machine, dataset, DataLoader "
        "settings, cache, and what was measured; this machine's profile is marked.",
    )
    add_profile_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rf = RecipeFile.read(args.recipe)
    # the profile this rank's factory would choose: torchrun's LOCAL_WORLD_SIZE, as `check` and load() read it
    hw = hardware.collect(ranks_per_node=ranks_per_node(args.ranks_per_node))
    if args.json:
        print_json({"recipe": str(args.recipe), "machine": hw["fingerprint"], "version": VERSION,
                    "profiles": {key: p.to_dict() for key, p in rf.profiles.items()}})
        return 0
    print(render(rf, hw, str(args.recipe)))
    return 0


# ---------------------------------------------------------------------------- formatting


def _seconds(s: Any) -> str | None:
    if not isinstance(s, (int, float)) or isinstance(s, bool):
        return None
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    if s >= 10:
        return f"{s:.1f} s"
    return f"{s:.2f} s"


def _value(v: Any) -> str:
    if v is None:
        return "default"
    return repr(v) if isinstance(v, str) else str(v)


def _pairs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in d.items())


def _subset(subset: Subset | None) -> str:
    if subset is None:
        return "measured on the whole dataset"
    if not subset.extrapolated:
        return f"measured on all {subset.measured} samples"
    return f"measured on a seeded subset of {subset.measured} of {subset.length} samples, extrapolated"


def _process_command(p: Profile) -> str | None:
    """The exact command that starts training with the recipe's process settings."""

    settings = p.config.process_settings()
    if not get_allocator(settings.allocator).preloaded:
        return None  # applied at run time by autotune.dataloader: nothing to do at start
    return f"{command_line(settings, ['python', 'train.py'])}   (or: autotune run -- python train.py)"


def _rows(p: Profile) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("machine", hardware.describe(p.hardware))]
    if p.hardware.get("shm_bytes") is not None:
        rows[-1] = ("machine", rows[-1][1] + f", /dev/shm {hardware.format_bytes(p.hardware['shm_bytes'])}")

    d, s = p.dataset, p.settings
    ds = [d.source or "unknown source"]
    if d.length is not None:
        ds.append(f"{d.length} samples")
    if s.batch_size is not None:
        ds.append(f"batch {s.batch_size}")
    if s.epochs is not None:
        ds.append(f"{s.epochs} epochs")
    rows.append(("dataset", ", ".join(ds)))

    c = p.config
    rows.append(("loader", _pairs(c.loader_kwargs())))
    rows.append(("threads", f"worker {_value(c.worker_threads)}, main {_value(c.main_threads)}"))
    rows.append(("process", f"allocator={c.allocator}"))
    command = _process_command(p)
    if command:
        rows.append(("start with", command))
    rows.append(("cache", c.describe_cache(p.ranks_per_node)))

    m = p.measured
    epoch, default = _seconds(m.chosen.epoch_seconds), _seconds(m.default.epoch_seconds)
    if epoch:
        text = f"{epoch} per epoch"
        if default:
            text += f" vs {default} for the default (num_workers=0)"
        first = _seconds(m.chosen.first_epoch_seconds)
        if first:
            text += f"; first epoch {first}"
        rows.append(("predicted", text))
    total, dtotal = _seconds(m.chosen.total_seconds), _seconds(m.default.total_seconds)
    if total:
        text = f"{total} in all" + (f" vs {dtotal} for the default" if dtotal else "")
        if m.speedup is not None:
            text += f": {m.speedup_text()}"
        rows.append(("total", text))
    if m.is_default:
        rows.append(("verdict", "no candidate was measurably faster than the plain default; the recipe is the "
                                "default"))
    if m.noisy:
        rows.append(("warning", m.noisy))
    if m.peak_memory_bytes is not None:
        together = f", the {p.ranks_per_node} ranks together" if p.ranks_per_node > 1 else ""
        rows.append(("memory", f"peak {hardware.format_bytes(m.peak_memory_bytes)} (main + workers{together})"))
    trials = []
    if m.trials is not None:
        trials.append(f"{m.trials} trials" + (f" ({m.failed_trials} failed)" if m.failed_trials else ""))
    trials.append(_subset(m.subset))
    rows.append(("search", ", ".join(trials)))
    if m.note:
        rows.append(("note", m.note))
    v = m.validation
    if v is not None and v.total.measured is not None:
        where = "through the factory in a fresh process" if v.fresh_process else "in the validating process"
        text = f"{_seconds(v.total.measured)} in all {where}"
        if v.total.error_percent is not None:
            text += f" vs {_seconds(v.total.predicted)} predicted ({v.total.error_percent:+.0f}%)"
        rows.append(("validated", text + f", {v.get('validated_at', 'at an unknown time')}"))
    if p.factory_runs:
        learned = [n for n in m.notes if n.startswith(FACTORY_NOTE)]
        how = ("figures learned from them: " + learned[0][len(FACTORY_NOTE):].lstrip(" :") if learned
               else "the next search on this machine predicts from them")
        text = f"{len(p.factory_runs)} validated run(s) kept; {how}"
        rows.append(("factory", text))
    if p.learned is not None:
        hint = ("; the search's forecast missed the real step: re-search with it as train_step to tune the cache "
                "and threads for it too" if p.learned.mode == "adapt" and p.learned.differs_from(p.config) else "")
        rows.append(("learned", p.learned.describe() + hint))
    rows.append(("created", f"{p.created or 'unknown'} by autotune {p.autotune_version}"))
    return rows


def _wrap(label: str, text: str) -> list[str]:
    """Label, then the text wrapped at WIDTH, breaking after ", " / "; " / ": " where it can (so
    "3.10 s" or "1.8 GiB" stay whole), inside a part only when the part alone is too long."""
    head = " " * _INDENT + label.ljust(_LABEL)
    pad = " " * len(head)
    room = WIDTH - len(head)
    lines: list[str] = []
    current = ""
    for part in re.split(r"(?<=[,;:]) ", text):
        candidate = f"{current} {part}" if current else part
        if len(candidate) <= room:
            current = candidate
            continue
        if current:
            lines.append(current)
        if len(part) <= room:
            current = part
        else:
            pieces = textwrap.wrap(part, width=room, break_on_hyphens=False) or [""]
            lines.extend(pieces[:-1])
            current = pieces[-1]
    lines.append(current)
    return [(head if i == 0 else pad) + line for i, line in enumerate(lines)]


def render(rf: RecipeFile, hw: dict[str, Any], name: str = "autotune.json") -> str:
    """The whole table as text, no line longer than ``WIDTH``."""
    here = hw.get("fingerprint") or hardware.fingerprint(hw)
    count = len(rf.profiles)
    lines = textwrap.wrap(
        f"{count} profile{'s' if count != 1 else ''} (format version {VERSION}) in {name}",
        width=WIDTH,
        break_on_hyphens=False,
    )
    for fp, p in rf.profiles.items():
        lines.append("")
        mark = "*" if fp == here else " "
        lines.append(f"{mark} {fp}" + ("  <- this machine" if fp == here else ""))
        for label, text in _rows(p):
            lines.extend(_wrap(label, text))
    lines.append("")
    if here in rf.profiles:
        lines.append(f"* marks this machine's profile ({here}).")
    else:
        lines.extend(
            textwrap.wrap(
                f"No profile matches this machine ({here}: {hardware.describe(hw)}); "
                f"`autotune check {name}` says what changed.",
                width=WIDTH,
            )
        )
    return "\n".join(lines)
