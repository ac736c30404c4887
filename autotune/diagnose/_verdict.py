"""Where the time goes: the verdict of ``autotune diagnose`` as a pure function of its measurements.

``judge(Breakdown) -> Verdict`` does no I/O and reads no clock, so tests feed it constructed
measurements. The model, per batch of ``B`` samples, in seconds of one CPU:

- storage: ``B * read`` -- opening and reading the files ``dataset[i]`` opened (cold in the first
  epoch; warm afterwards when the files fit in the page cache, cold every epoch when they do not);
- decode: ``B * (dataset[i] warm - read warm)`` -- the rest of ``dataset[i]`` (decode, parsing);
- transform: ``B * transform`` -- the per-epoch work after any cache;
- collate: one ``collate_fn`` call;
- transfer: moving the batch from a worker to the main process (plus pinning where CUDA exists).

Storage, decode, transform and collate run in the DataLoader workers, so they spread over the CPUs the
loader can have: the usable CPUs, less one when the consumer itself computes on the CPU. Transfer is
paid by the main process for every batch, whatever the number of workers. The loader's best time per
batch is the slower of the two sides (a pipeline goes at its slowest stage); the consumer's is
``train_step`` alone on batches already in memory.

The ceilings, in samples per second (DS-Analyzer's stall analysis):

- ``no_stall``: the consumer alone, data already in memory -- no loader setting can beat it;
- ``prepared``: the loader with its files in the page cache and the CPUs it can have;
- ``cold``: the loader reading cold files with the same CPUs (work assumed to spread over them;
  storage that does not serve parallel reads will do worse);
- ``serial``: ``num_workers=0``, loading and consuming one after the other on one CPU;
- ``expected``: the best steady rate, ``min(no_stall, prepared)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune._units import format_fine
from autotune.caches import backend_names

__all__ = ["LOADER_STAGES", "STAGE_LABELS", "Breakdown", "Verdict", "judge"]

LOADER_STAGES = ("storage", "decode", "transform", "collate", "transfer")
STAGE_LABELS = {
    "storage": "storage (opening and reading files)",
    "decode": "decode (the rest of dataset[i])",
    "transform": "transform",
    "collate": "collate",
    "transfer": "transfer (worker -> main process)",
}
# Below this share of a step, work the loader does in series with the consumer is not worth hiding.
NEGLIGIBLE = 0.10


@dataclass(frozen=True)
class Breakdown:
    """What ``autotune diagnose`` measured. Times in seconds, per sample or per batch as named."""

    batch_size: int
    usable_cpus: int
    sample_cold: float  # dataset[i], its files evicted from the page cache, per sample
    sample_warm: float  # dataset[i], files in the page cache, per sample
    collate: float  # one collate_fn call, per batch
    transfer: float  # receiving a batch from a worker process rather than in-process, per batch
    consumer: float | None  # train_step (or the device copy) alone, per batch; None: nothing consumes
    read_cold: float | None = None  # opening and reading the files dataset[i] opened, cold, per sample
    read_warm: float | None = None  # the same, warm; None for both when dataset[i] opened no files
    transform: float = 0.0  # the transform, per sample (0 without one)
    pin: float | None = None  # pin_memory, per batch; None without CUDA
    h2d: float | None = None  # host-to-device copy of a pinned batch, per batch; None without CUDA
    consumer_kind: str = "train_step"  # "train_step", "device copy" or "none"
    consumer_on_cpu: bool = False  # train_step computes on the CPU (competes with workers for cores)
    fits_in_memory: bool = True  # the dataset's files fit in the page cache, so later epochs are warm
    evicted: bool = True  # the cold figures come from really evicted files
    source: str = ""
    length: int = 0
    samples: int = 0
    seed: int = 0
    files: int = 0  # distinct files dataset[i] opened over the subset
    file_bytes_per_sample: float = 0.0
    sample_bytes: float = 0.0  # payload of dataset[i] before transform (what a cache stores)
    batch_bytes: float = 0.0  # payload of a collated batch
    cuda: bool = False
    notes: tuple[str, ...] = ()
    # A memory-cache build of the subset against a bare decode of it, same workers, files evicted
    # (autotune/diagnose/_build.py); None when it was not measured.
    build: float | None = None
    bare_decode: float | None = None
    build_fixed: float | None = None  # the determinism check plus a 16-sample build (start-up)
    build_workers: int | None = None
    build_first_touch: float | None = None  # writing the cache's bytes into fresh memory once, same workers
    build_bytes: int | None = None  # what the subset's memory cache holds
    # This machine's floor for the whole run (autotune/dataset/_floor.py): every sample decoded once on
    # ``floor_workers`` processes, nothing stored, plus ``epochs`` epochs of batch gathers from memory,
    # measured on the subset and scaled to ``length``; None when it was not measured.
    epochs: int = 1
    floor_workers: int | None = None
    floor_decode: float | None = None
    floor_gathers: float | None = None
    floor: float | None = None  # floor_decode + floor_gathers
    recipe_total: float | None = None  # the recipe's predicted whole run (``--recipe``), None without one
    recipe_config: str = ""  # its configuration, described

    @property
    def over_floor(self) -> float | None:
        """The recipe's whole run as a multiple of the floor (None without both)."""
        if self.recipe_total is None or not self.floor:
            return None
        return self.recipe_total / self.floor

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["over_floor"] = self.over_floor
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Breakdown:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["notes"] = tuple(values.get("notes", ()))
        return cls(**values)


@dataclass(frozen=True)
class Verdict:
    bound: str  # "consumer" or "loader"
    stage: str | None  # the loader stage that dominates steady epochs (also given when consumer-bound)
    first_epoch_stage: str | None  # the stage that dominates the cold first epoch
    stages: dict[str, float]  # per-batch seconds of each loader stage, on one CPU (steady epochs)
    cold_stages: dict[str, float]  # the same in the cold first epoch
    shares: dict[str, float]  # each stage's share of the loader's steady work
    loader_cpus: int  # CPUs the loader's workers can have
    loader_batch: float  # best steady seconds per batch of the loader with those CPUs
    loader_batch_cold: float  # the same from cold files
    ceilings: dict[str, float | None]  # samples per second; None = unbounded (nothing to wait for)
    summary: str
    helps: list[str] = field(default_factory=list)
    cannot_help: list[str] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in asdict(self).items()}


def _caches() -> str:
    """The cache backends a verdict names, as registered (``caches._family``)."""
    return ", ".join(backend_names())


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _rate(batch_size: int, seconds: float | None) -> float | None:
    if seconds is None or seconds <= 0:
        return None
    return batch_size / seconds


def _stages(m: Breakdown, read: float | None) -> dict[str, float]:
    b = m.batch_size
    read_warm = m.read_warm or 0.0
    return {
        "storage": b * (read or 0.0),
        "decode": b * max(m.sample_warm - read_warm, 0.0),
        "transform": b * m.transform,
        "collate": m.collate,
        "transfer": m.transfer + (m.pin or 0.0),
    }


def _loader_time(stages: dict[str, float], cpus: int) -> float:
    worker_side = sum(v for k, v in stages.items() if k != "transfer") / cpus
    return max(worker_side, stages["transfer"])


def _effective(stages: dict[str, float], cpus: int) -> dict[str, float]:
    """Per-batch seconds of each stage once the worker stages are spread over ``cpus``."""
    return {k: (v if k == "transfer" else v / cpus) for k, v in stages.items()}


def _dominant(stages: dict[str, float], cpus: int) -> str | None:
    """The stage that costs most per batch once the worker stages are spread over ``cpus``."""
    effective = _effective(stages, cpus)
    best = max(effective, key=lambda k: effective[k])
    return best if effective[best] > 0 else None


def _runner_up(stages: dict[str, float], cpus: int, first: str, close: float = 0.75) -> str | None:
    """The second stage when it costs at least ``close`` of the first (noise could swap them)."""
    effective = _effective(stages, cpus)
    others = {k: v for k, v in effective.items() if k != first}
    second = max(others, key=lambda k: others[k])
    return second if effective[first] > 0 and others[second] >= close * effective[first] else None


_ms = format_fine


def _pct(share: float) -> str:
    return "under 1%" if 0 < share < 0.005 else f"{100 * share:.0f}%"


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def judge(m: Breakdown) -> Verdict:
    """The verdict for ``m``: who bounds training, which loader stage dominates, what can help."""
    cpus = max(1, m.usable_cpus)
    loader_cpus = max(1, cpus - 1) if m.consumer_on_cpu and m.consumer else cpus
    warm_stages = _stages(m, m.read_warm)
    cold_stages = _stages(m, m.read_cold)
    # The cold epoch's decode is dataset[i] cold less its cold reads; never below the warm decode.
    cold_stages["decode"] = max(m.batch_size * max(m.sample_cold - (m.read_cold or 0.0), 0.0),
                                warm_stages["decode"])
    # Files that do not fit in the page cache are read cold every epoch.
    stages = warm_stages if m.fits_in_memory else dict(cold_stages)
    loader_batch = _loader_time(stages, loader_cpus)
    loader_batch_cold = _loader_time(cold_stages, loader_cpus)
    work = sum(stages.values())
    shares = {k: (v / work if work > 0 else 0.0) for k, v in stages.items()}
    serial_batch = sum(v for k, v in stages.items() if k != "transfer") + (m.consumer or 0.0)
    ceilings = {
        "no_stall": _rate(m.batch_size, m.consumer),
        "prepared": _rate(m.batch_size, loader_batch),
        "cold": _rate(m.batch_size, loader_batch_cold),
        "serial": _rate(m.batch_size, serial_batch),
    }
    finite = [r for r in (ceilings["no_stall"], ceilings["prepared"]) if r is not None]
    ceilings["expected"] = min(finite) if finite else None
    stage = _dominant(stages, loader_cpus)
    first = _dominant(cold_stages, loader_cpus)
    consumer = m.consumer or 0.0
    consumer_bound = consumer > 0 and consumer >= loader_batch
    helps: list[str] = []
    cannot: list[str] = []
    lines: list[str] = []
    rate = ceilings["no_stall"]

    if consumer_bound:
        hidden = serial_batch - consumer
        serial_share = hidden / serial_batch if serial_batch > 0 else 0.0
        summary = (f"consumer-bound: {m.consumer_kind} takes {_ms(consumer)} per batch, the loader needs "
                   f"{_ms(loader_batch)} with {loader_cpus} CPU(s); no loader setting will make training faster.")
        lines.append(
            f"The consumer is the bottleneck: {m.consumer_kind} alone, with the data already in memory, runs at "
            f"{rate:,.0f} samples/s, and the loader can prepare {ceilings['prepared']:,.0f} samples/s. "
            "No loader setting (num_workers, prefetch_factor, persistent_workers, pin_memory, a cache, a file "
            f"format) will make training faster than {rate:,.0f} samples/s."
        )
        cannot.append("any DataLoader setting: num_workers, prefetch_factor, persistent_workers, pin_memory")
        cannot.append("a cache or a faster file format: the data is ready before the consumer wants it")
        helps.append("a faster train_step: a smaller or cheaper model, mixed precision, or an accelerator")
        if m.consumer_on_cpu:
            helps.append("the main process's thread count (torch.set_num_threads) for the CPU train_step")
            lines.append(f"train_step computes on the CPU: DataLoader workers compete with it for the {cpus} "
                         "usable CPU(s), so extra workers can make it slower, not faster.")
        if serial_share > NEGLIGIBLE:
            lines.append(
                f"With num_workers=0 the loader's {_ms(hidden)} per batch is paid in series with the consumer "
                f"({100 * serial_share:.0f}% of a step); background workers can hide it, bringing the rate from "
                f"{ceilings['serial']:,.0f} towards {rate:,.0f} samples/s, but not beyond.")
            helps.append("num_workers >= 1 only to overlap loading with the consumer "
                         f"(up to {100 * serial_share:.0f}% faster), if a CPU is spare")
        else:
            lines.append(f"Even with num_workers=0 loading costs only {100 * serial_share:.0f}% of a step.")
    elif not m.consumer:
        summary = (f"loader-bound: nothing consumes the batches (no train_step, no CUDA); "
                   f"{STAGE_LABELS.get(stage or '', 'nothing')} dominates.")
        lines.append("There is no train_step and no CUDA device: the loader is the whole job, so every second "
                     "it saves is saved. Define train_step in the file to diagnose under the real load.")
    else:
        summary = (f"loader-bound: the loader needs {_ms(loader_batch)} per batch with {loader_cpus} CPU(s), "
                   f"{m.consumer_kind} {_ms(m.consumer)}; {STAGE_LABELS.get(stage or '', 'nothing')} dominates.")
        lines.append(
            f"The loader is the bottleneck: it prepares {ceilings['prepared']:,.0f} samples/s with "
            f"{loader_cpus} CPU(s), the consumer could take {rate:,.0f} samples/s. "
            f"The best a loader setting can reach is the consumer's rate, {rate:,.0f} samples/s.")

    if not consumer_bound and stage is not None:
        _advice(m, stage, stages, shares, loader_cpus, helps, cannot, lines)
        runner_up = _runner_up(stages, loader_cpus, stage)
        if runner_up is not None:
            lines.append(f"{STAGE_LABELS[runner_up].capitalize()} is close behind "
                         f"({_ms(_effective(stages, loader_cpus)[runner_up])} per batch against "
                         f"{_ms(_effective(stages, loader_cpus)[stage])}): once {stage} is cut, it will be next.")
    if first is not None and first != stage and first == "storage":
        lines.append(
            f"The first epoch reads cold files: {_ms(cold_stages['storage'])} of storage per batch makes "
            f"{STAGE_LABELS['storage']} dominate it ({ceilings['cold']:,.0f} samples/s); later epochs read "
            f"from the page cache. A cache ({_caches()}) pays that read once, when it is built.")
    if not m.evicted:
        lines.append("Note: the files could not be evicted, so the 'cold' figures are warm ones.")
    return Verdict(
        bound="consumer" if consumer_bound else "loader",
        stage=stage,
        first_epoch_stage=first,
        stages=stages,
        cold_stages=cold_stages,
        shares=shares,
        loader_cpus=loader_cpus,
        loader_batch=loader_batch,
        loader_batch_cold=loader_batch_cold,
        ceilings=ceilings,
        summary=summary,
        helps=helps,
        cannot_help=cannot,
        explanation=lines,
    )


def _advice(m: Breakdown, stage: str, stages: dict[str, float], shares: dict[str, float], cpus: int,
            helps: list[str], cannot: list[str], lines: list[str]) -> None:
    share = f"{_pct(shares[stage])} of the loader's work"
    read_share = _pct(shares["storage"])
    cache_size = _mib(m.sample_bytes * m.length) if m.sample_bytes and m.length else "its size"
    if stage == "storage":
        every = "every epoch, since the files do not fit in the page cache" if not m.fits_in_memory else \
            "even from the page cache"
        lines.append(f"Opening and reading files dominates ({share}, {_ms(stages['storage'])} per batch, {every}).")
        helps.append(f"a cache ({_caches()}): dataset[i] is read once and kept, about {cache_size}")
        helps.append("a faster format: a few large files read sequentially instead of many small ones")
        helps.append("more workers, if the storage serves parallel reads (local SSDs do, network disks often not)")
        cannot.append("a larger prefetch_factor or persistent workers: they hide delays, they do not raise the "
                      "storage's bandwidth")
    elif stage == "decode":
        lines.append(f"Decoding in dataset[i] dominates ({share}); reading the files is only {read_share}.")
        helps.append(f"more workers, up to {cpus} (decoding runs in the workers, in parallel)")
        helps.append(f"a cache ({_caches()}): it keeps dataset[i] decoded, so decoding is paid "
                     f"once, for about {cache_size}")
        cannot.append(f"faster storage or a faster format for the source files: reading is only {read_share}")
        cannot.append("prefetch_factor or pin_memory: they do not make decoding cheaper")
    elif stage == "transform":
        lines.append(f"The transform dominates ({share}); it runs after any cache, every epoch.")
        helps.append(f"more workers, up to {cpus} (the transform runs in the workers)")
        helps.append("a cheaper transform (move deterministic work into dataset[i] so a cache keeps it)")
        cannot.append("a cache: the transform runs after it, every epoch")
        cannot.append("faster storage or a faster file format")
    elif stage == "collate":
        lines.append(f"Collating dominates ({share}, {_ms(stages['collate'])} per batch).")
        helps.append(f"more workers, up to {cpus} (collate_fn runs in the workers)")
        helps.append("a cheaper collate_fn: samples as arrays of one shape that stack in one copy")
        cannot.append("a cache or a faster format: they come before collate")
    elif stage == "transfer":
        lines.append(
            f"Moving batches from the workers to the main process dominates ({_ms(stages['transfer'])} per batch "
            f"of {_mib(m.batch_bytes)}); the main process receives every batch itself.")
        helps.append("fewer bytes per batch: e.g. uint8 images, converted to float in train_step")
        helps.append("num_workers=0 with a memory cache: no hop between processes at all")
        if m.cuda:
            helps.append("pin_memory=True, so the copy to the device runs asynchronously")
        cannot.append("more workers: each batch still crosses into the main process, which does it alone")
