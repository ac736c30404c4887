"""``autotune report``: pictures of a search, as one self-contained HTML file (and PNGs).

The figures come from two places: the recipe profile (``autotune.json``: the chosen settings, the
default's figures, the finalists' interleaved re-measurements, the hardware) and the Optuna study it
names in ``measured["study"]`` (every trial: its config, predicted epoch times, peak memory, state).
When the study cannot be opened (the recipe was carried to another machine, the storage moved), the
report draws what the recipe alone holds and says so.

Sections (each an ``<section id=...>`` in the HTML, one PNG each where there is a plot):
``history`` (trial value by number, best so far), ``by-workers`` (time per epoch by num_workers and
by cache backend), ``memory`` (peak memory by num_workers), ``finalists`` (the chosen recipe against
the default and the other finalists), ``cold-warm`` (first epoch against a warm one), ``hardware``,
and ``study`` (how to open it in optuna-dashboard). Images are embedded as base64 PNGs: no network is
needed to view the file.
"""

from __future__ import annotations

import base64
import html
import io
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune._units import format_bytes, format_seconds
from autotune.config import DEFAULT, LoaderConfig
from autotune.errors import AutotuneError, MeasurementError
from autotune.machine import _hardware as hardware
from autotune.machine import ranks_per_node as ranks_from
from autotune.recipe._file import Profile, RecipeFile, choose_profile
from autotune.recipe._measured import Measured
from autotune.tuner._measurement import Measurement

__all__ = ["SECTIONS", "ReportResult", "TrialRow", "build_report", "load_trials"]

SECTIONS = ("history", "by-workers", "memory", "finalists", "cold-warm", "hardware", "study")
_PNG_NAMES = {
    "history": "history.png",
    "by-workers": "epoch_by_workers_and_cache.png",
    "memory": "memory_by_workers.png",
    "finalists": "finalists.png",
    "cold-warm": "cold_vs_warm_epoch.png",
}
_CHOSEN, _DEFAULT, _OTHER = "#d62728", "#7f7f7f", "#1f77b4"


@dataclass
class TrialRow:
    """One trial of the study, as the report needs it."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    value: float | None  # predicted whole-run seconds (COMPLETE), or the last reported one (PRUNED)
    config: dict[str, Any]
    measurement: Measurement | None  # what it measured (None: failed, pruned, a repeat)
    reason: str = ""
    repeat: bool = False


@dataclass
class ReportResult:
    output: Path
    pngs: list[Path] = field(default_factory=list)
    study_opened: bool = False
    study_note: str = ""
    dashboard_command: str | None = None
    profile_note: str = ""


def load_trials(study: dict[str, Any] | None) -> tuple[list[TrialRow] | None, str]:
    """The trials of the study a profile names, or None and why it could not be opened."""
    if not study or not study.get("name") or not study.get("storage"):
        return None, "the recipe names no Optuna study"
    url, name = str(study["storage"]), str(study["name"])
    try:
        import optuna

        from autotune.tuner._storage import open_existing_study, shown

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        loaded = open_existing_study(url, name)  # read-only: never creates a database, tables or a study
        trials = loaded.get_trials(deepcopy=False)
    except LookupError as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - any storage failure means: draw from the recipe alone
        return None, f"the study {name!r} could not be opened from {shown(url)}: {type(exc).__name__}: {exc}"
    rows = []
    for t in trials:
        value = t.value
        if value is None and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        try:
            measurement = Measurement.from_trial_attrs(t.user_attrs)
        except MeasurementError as exc:
            return None, f"trial {t.number} of the study {name!r} could not be read: {exc}"
        rows.append(TrialRow(
            number=t.number, state=t.state.name, value=value, config=dict(t.user_attrs.get("config") or {}),
            measurement=measurement, reason=str(t.user_attrs.get("reason") or ""),
            repeat=bool(t.user_attrs.get("repeat")),
        ))
    return rows, ""


# ------------------------------------------------------------------------------------------ plots


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise AutotuneError("autotune report needs matplotlib: pip install 'dataloader-autotune[report]'.") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def _measured(rows: list[TrialRow]) -> list[TrialRow]:
    """Completed trials that really ran (not repeats of a point already measured)."""
    return [r for r in rows if r.state == "COMPLETE" and not r.repeat and r.value is not None]


def _with_figures(rows: list[TrialRow]) -> list[tuple[TrialRow, Measurement]]:
    """The measured trials that stored their figures, each with its measurement."""
    return [(r, r.measurement) for r in _measured(rows) if r.measurement is not None]


def _plot_history(rows: list[TrialRow], measured: Measured) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    done = [r for r in rows if r.state == "COMPLETE" and r.value is not None]
    pruned = [r for r in rows if r.state == "PRUNED" and r.value is not None]
    failed = [r for r in rows if r.state == "FAIL"]
    ax.scatter([r.number for r in done], [r.value for r in done], color=_OTHER, s=22, label="completed trial",
               zorder=3)
    if pruned:
        ax.scatter([r.number for r in pruned], [r.value for r in pruned], marker="x", color="#ff7f0e", s=28,
                   label="pruned (last reported)", zorder=3)
    best, xs, ys = None, [], []
    for r in sorted(done, key=lambda r: r.number):
        value = r.value or 0.0
        best = value if best is None else min(best, value)
        xs.append(r.number)
        ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color=_CHOSEN, label="best so far")
    if measured.default.total_seconds:
        ax.axhline(measured.default.total_seconds, color=_DEFAULT, ls="--", lw=1,
                   label="default (num_workers=0), re-measured")
    if failed:
        bottom = ax.get_ylim()[0]
        ax.scatter([r.number for r in failed], [bottom] * len(failed), marker="v", color="black", s=30,
                   label=f"failed ({len(failed)})", clip_on=False, zorder=4)
    values = [r.value for r in done + pruned if r.value and r.value > 0]
    if values and max(values) / min(values) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("trial number")
    ax.set_ylabel("predicted whole run (s)")
    ax.set_title("Optimisation history")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return _png(fig)


def _strip(ax: Any, groups: dict[Any, list[float]], labels: list[str], color: str = _OTHER) -> None:
    """Each value as a dot (jittered), and the median of each group as a bar."""
    for i, key in enumerate(groups):
        values = groups[key]
        n = len(values)
        xs = [i + (j - (n - 1) / 2) * min(0.5 / max(n, 1), 0.06) for j in range(n)]
        ax.scatter(xs, values, color=color, s=16, alpha=0.75, zorder=3)
        if values:
            m = statistics.median(values)
            ax.hlines(m, i - 0.3, i + 0.3, color="black", lw=2, zorder=4)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(labels)
    ax.grid(alpha=0.3, axis="y")


def _plot_by_workers(rows: list[TrialRow]) -> bytes:
    plt = _pyplot()
    runs = _with_figures(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True,
                                      gridspec_kw={"width_ratios": [3, 2]})
    by_workers: dict[int, list[float]] = {}
    for r, m in sorted(runs, key=lambda run: run[0].config.get("num_workers", 0)):
        by_workers.setdefault(int(r.config.get("num_workers", 0)), []).append(m.prediction.epoch_seconds)
    _strip(left, by_workers, [str(k) for k in by_workers])
    left.set_xlabel("num_workers")
    left.set_ylabel("time per warm epoch (s, whole dataset)")
    left.set_title("by num_workers (bar: median)")
    by_cache: dict[str, list[float]] = {}
    for r, m in runs:
        by_cache.setdefault(r.config.get("cache") or "none", []).append(m.prediction.epoch_seconds)
    by_cache = dict(sorted(by_cache.items()))
    _strip(right, by_cache, list(by_cache), color="#2ca02c")
    right.set_xlabel("cache backend")
    right.set_title("by cache backend")
    fig.suptitle("Time per epoch, every measured trial")
    return _png(fig)


def _plot_memory(rows: list[TrialRow]) -> bytes:
    plt = _pyplot()
    runs = [(r, m) for r, m in _with_figures(rows) if m.peak_memory_bytes]
    fig, ax = plt.subplots(figsize=(7, 4))
    groups: dict[int, list[float]] = {}
    for r, m in sorted(runs, key=lambda run: run[0].config.get("num_workers", 0)):
        groups.setdefault(int(r.config.get("num_workers", 0)), []).append(m.peak_memory_bytes / (1 << 20))
    _strip(ax, groups, [str(k) for k in groups], color="#9467bd")
    ax.set_xlabel("num_workers")
    ax.set_ylabel("peak memory, main + workers (MiB, PSS)")
    ax.set_title("Memory by num_workers (bar: median)")
    ax.set_ylim(bottom=0)
    return _png(fig)


def _label(config: dict[str, Any]) -> str:
    text = LoaderConfig.from_json(config).describe()
    return text.replace("persistent_workers", "persistent").replace("prefetch_factor", "prefetch")


def _finalist_rows(profile: Profile) -> list[tuple[str, list[float], str]]:
    """(label, runs in seconds, role) for each finalist: role "chosen", "default" or "finalist"."""
    chosen = profile.config
    m = profile.measured
    out = []
    for f in m.finalists:
        role = "chosen" if f.config == chosen else "default" if f.config == DEFAULT else "finalist"
        out.append((_label(f.config.to_json()), list(f.total_seconds), role))
    if not out:  # an older recipe: the chosen and the default from the measured figures
        out.append((_label(chosen.to_json()), list(m.runs_seconds or [m.chosen.total_seconds or 0.0]), "chosen"))
        if not m.is_default:
            out.append(("num_workers=0, cache=none",
                        list(m.default_runs_seconds or [m.default.total_seconds or 0.0]), "default"))
    out.sort(key=lambda row: {"chosen": 0, "finalist": 1, "default": 2}[row[2]])
    return out


def _plot_finalists(profile: Profile) -> bytes:
    plt = _pyplot()
    rows = _finalist_rows(profile)
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(rows) + 1.6))
    colors = {"chosen": _CHOSEN, "default": _DEFAULT, "finalist": _OTHER}
    for i, (_label, runs, role) in enumerate(rows):
        y = len(rows) - 1 - i
        if runs:
            median = statistics.median_low(runs)  # the rule the search chose by
            ax.barh(y, median, color=colors[role], alpha=0.35, height=0.6)
            ax.scatter(runs, [y] * len(runs), color=colors[role], s=22, zorder=3)
            ax.text(max(runs), y, f"  median {median:.2f} s", va="center", fontsize=8)
        else:
            ax.text(0, y, "  failed in the re-measurement", va="center", fontsize=8, color="#a33")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"[{role}] {label}" for label, _, role in reversed(rows)], fontsize=8)
    ax.set_xlabel("predicted whole run (s): interleaved re-measurements (dots), median (bar)")
    ax.set_title("The chosen recipe against the default and the other finalists")
    longest = max((max(runs) for _, runs, _ in rows if runs), default=1.0)
    ax.set_xlim(0, longest * 1.25)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


def _cold_warm_rows(profile: Profile, rows: list[TrialRow] | None) -> list[tuple[str, float, float, str]]:
    m = profile.measured
    chosen = profile.config
    out = [(_label(chosen.to_json()), m.chosen.first_epoch_seconds or 0.0, m.chosen.epoch_seconds or 0.0, "chosen")]
    if not m.is_default:
        out.append(("num_workers=0, cache=none", m.default.first_epoch_seconds or 0.0,
                    m.default.epoch_seconds or 0.0, "default"))
    if rows:
        runs = _with_figures(rows)
        for f in m.finalists:
            config = f.config
            if config == chosen or config == DEFAULT:
                continue
            same = [(r, measured) for r, measured in runs if LoaderConfig.from_json(r.config) == config]
            if same:
                p = min(same, key=lambda run: run[0].value or 0.0)[1].prediction
                out.append((_label(config.to_json()), p.first_epoch_seconds, p.epoch_seconds,
                            "finalist, search trial"))
    return out


def _plot_cold_warm(profile: Profile, rows: list[TrialRow] | None) -> bytes:
    plt = _pyplot()
    data = _cold_warm_rows(profile, rows)
    fig, ax = plt.subplots(figsize=(9, 0.8 * len(data) + 1.6))
    for i, (_label, first, warm, _role) in enumerate(data):
        y = len(data) - 1 - i
        ax.barh(y + 0.18, first, height=0.34, color="#1f77b4", label="first epoch (cold)" if i == 0 else None)
        ax.barh(y - 0.18, warm, height=0.34, color="#ff7f0e", label="later epoch (warm)" if i == 0 else None)
        ax.text(first, y + 0.18, f" {first:.2f} s", va="center", fontsize=8)
        ax.text(warm, y - 0.18, f" {warm:.2f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(data)))
    ax.set_yticklabels([f"[{role}] {label}" for label, _, _, role in reversed(data)], fontsize=8)
    ax.set_xlabel("seconds per epoch (whole dataset)")
    ax.set_title("First (cold) epoch against a warm one")
    longest = max((max(first, warm) for _, first, warm, _ in data), default=1.0)
    ax.set_xlim(0, longest * 1.45)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


# ------------------------------------------------------------------------------------------ HTML

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
img{max-width:100%} table{border-collapse:collapse} td,th{padding:.2em .8em;border-bottom:1px solid #eee;
text-align:left;vertical-align:top} code{background:#f4f4f4;padding:.1em .3em} .note{color:#a33}
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(pairs: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in pairs)
    return f"<table>{cells}</table>"


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{html.escape(title)}</h2>\n{body}\n</section>\n'


def _hardware_pairs(hw: dict[str, Any]) -> list[tuple[str, Any]]:
    pairs = [("summary", hardware.describe(hw))]
    for key in ("cpu_model", "usable_cpus", "logical_cpus", "memory_bytes", "gpus", "torch", "cuda", "python",
                "platform", "shm_bytes", "fingerprint"):
        if key in hw:
            value = hw[key]
            if key.endswith("_bytes"):
                value = hardware.format_bytes(value)
            elif key == "gpus":
                value = hardware.format_gpus(value)
            pairs.append((key, "none" if value is None else value))
    return pairs


def build_report(recipe_path: str | os.PathLike[str], output: str | os.PathLike[str] = "report.html",
                 png_dir: str | os.PathLike[str] | None = None, ranks_per_node: int | None = None) -> ReportResult:
    """Write the HTML report for this machine's profile in ``recipe_path`` (the nearest one when none
    was tuned here) for ``ranks_per_node`` (default: torchrun's ``LOCAL_WORLD_SIZE``, else 1), and the PNGs
    under ``png_dir`` when given."""

    rf = RecipeFile.read(recipe_path)
    hw = hardware.collect(ranks_per_node=ranks_from(ranks_per_node))
    profile, changes = choose_profile(rf, hw, on_mismatch="search")
    result = ReportResult(output=Path(output))
    if changes:
        result.profile_note = (f"No profile was tuned on this machine; showing the nearest "
                               f"({profile.fingerprint}): {'; '.join(changes)}.")
    m = profile.measured
    study = {"name": m.study_name, "storage": m.study_storage} if m.study_name else {}
    rows, result.study_note = load_trials(study)
    result.study_opened = rows is not None
    if m.study_storage:
        result.dashboard_command = f"optuna-dashboard {m.study_storage}"

    images: dict[str, bytes] = {}
    if rows is not None:
        images["history"] = _plot_history(rows, m)
        images["by-workers"] = _plot_by_workers(rows)
        images["memory"] = _plot_memory(rows)
    images["finalists"] = _plot_finalists(profile)
    images["cold-warm"] = _plot_cold_warm(profile, rows)

    config = profile.config
    parts = [f"<h1>autotune report: {html.escape(profile.dataset.source or '?')}</h1>"]
    summary = [
        ("recipe file", str(recipe_path)),
        ("chosen settings", config.describe() + (" (the plain default)" if m.is_default else "")),
        ("whole run", f"{format_seconds(m.chosen.total_seconds or 0)} vs "
                      f"{format_seconds(m.default.total_seconds or 0)} for the default: "
                      f"{m.speedup_text()}"),
        ("epoch (warm)", f"{format_seconds(m.chosen.epoch_seconds or 0)} vs "
                         f"{format_seconds(m.default.epoch_seconds or 0)}"),
        ("peak memory", format_bytes(m.peak_memory_bytes or 0)),
        ("batch size, epochs", f"{profile.settings.batch_size}, {profile.settings.epochs}"),
        ("trials", f"{m.trials if m.trials is not None else '?'} ({m.pruned_trials} pruned, "
                   f"{m.failed_trials} failed)"),
        ("tuned", profile.created),
    ]
    if m.note:
        summary.append(("note", m.note))
    parts.append(_table(summary))
    if result.profile_note:
        parts.append(f'<p class="note">{html.escape(result.profile_note)}</p>')
    missing = ""
    if rows is None:
        missing = (f'<p class="note">Not available: {html.escape(result.study_note)}. This section needs the '
                   "Optuna study; the rest of the report is drawn from the recipe alone.</p>")
        parts.append(f'<p class="note">The Optuna study could not be opened ({html.escape(result.study_note)}); '
                     "this report shows what the recipe file alone holds.</p>")

    def plot(sid: str, caption: str) -> str:
        return (_img(images[sid], caption) + f"<p>{html.escape(caption)}</p>") if sid in images else missing

    parts.append(_section("history", "Optimisation history", plot(
        "history", "Each trial's predicted wall time of the whole run (cache build, cold first epoch, warm "
                   "epochs), by trial number; the line is the best so far.")))
    parts.append(_section("by-workers", "Time per epoch by num_workers and by cache backend", plot(
        "by-workers", "The predicted warm epoch over the whole dataset of every measured trial, grouped by "
                      "num_workers and by cache backend; bars are medians.")))
    parts.append(_section("memory", "Memory by num_workers", plot(
        "memory", "Peak memory of the main process and its workers (PSS) of every measured trial.")))
    parts.append(_section("finalists", "The chosen recipe against the default and the other finalists", plot(
        "finalists", "The finalists re-measured interleaved (A B C, B C A, ...); the winner is chosen by median "
                     "and must beat the plain default.")))
    parts.append(_section("cold-warm", "Cold against warm epoch", plot(
        "cold-warm", "Predicted first epoch (cold files) against a later, warm one over the whole dataset (a "
                     "cache build is counted apart). The chosen recipe and the default are the interleaved "
                     "re-measurements; other finalists are their best search trial.")))
    parts.append(_section("hardware", "Hardware it was tuned on", _table(_hardware_pairs(profile.hardware))))
    if result.dashboard_command:
        study_body = (f"<p>Study <code>{html.escape(str(study.get('name')))}</code>. Open it in optuna-dashboard "
                      f"(<code>pip install optuna-dashboard</code>):</p><pre>{html.escape(result.dashboard_command)}"
                      "</pre>")
        if rows is None:
            study_body += f'<p class="note">{html.escape(result.study_note)}</p>'
    else:
        study_body = "<p>The recipe names no Optuna study.</p>"
    parts.append(_section("study", "The Optuna study", study_body))
    document = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>autotune report</title>"
                f"<style>{_CSS}</style></head><body>\n{''.join(parts)}</body></html>\n")
    result.output.parent.mkdir(parents=True, exist_ok=True)
    result.output.write_text(document, encoding="utf-8")
    if png_dir is not None:
        folder = Path(png_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for sid, png in images.items():
            path = folder / _PNG_NAMES[sid]
            path.write_bytes(png)
            result.pngs.append(path)
    return result
