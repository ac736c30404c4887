"""``autotune diagnose``: measure where a loader's time goes, on a seeded subset, in this process.

``diagnose(spec)`` measures, in this order:

1. a recording pass: ``dataset[i]`` for every index of the subset, noting the files it opens
   (``autotune.machine._evict.record_files``; also warms up imports a first ``__getitem__`` may do);
2. two interleaved rounds of: the files evicted (``autotune.machine._evict.evict``) and ``dataset[i]`` timed per
   sample (cold); the files evicted again, opened and read raw in 1 MiB chunks, cold then warm (the
   share of ``dataset[i]`` spent opening and reading files; the rest is decode); ``dataset[i]`` timed
   again (warm), and in the first round ``transform`` on each sample, timed apart. Per-sample medians
   over the rounds;
3. collate: ``collate_fn`` (or the default) over whole batches of the transformed samples;
4. transfer: a DataLoader with one worker over those pre-made batches against the same loop in-process
   (each batch is a fresh copy in both; the difference is the hop between processes);
5. pinning and the host-to-device copy where CUDA exists ("n/a (no CUDA)" otherwise);
6. the consumer: ``train_step`` (or the default device copy) alone, on batches already in memory;
7. a memory-cache build of the subset against a bare decode pass of it on the same workers, files
   evicted (``autotune.diagnose._build``): what a cache build costs over decoding;
8. this machine's floor for the whole run (``autotune.dataset._floor``): the subset decoded once on
   every usable CPU, nothing stored (step 7's bare decode), and epochs of batch gathers from memory,
   scaled to the dataset; against a recipe's predicted run when one is given.

The figures become ``autotune.diagnose._verdict.Breakdown`` and the verdict is ``autotune.diagnose._verdict.judge``.
A run is a few seconds to a minute: the subset is small and each measurement short.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from autotune._units import format_bytes, format_fine
from autotune.caches._codec import sample_nbytes
from autotune.dataset import Floor, UserSpec, measure_floor, read_sample
from autotune.dataset._probe import probe_indices
from autotune.diagnose._build import build_against_decode
from autotune.diagnose._verdict import Breakdown, Verdict, judge
from autotune.errors import DatasetError
from autotune.loader import DeviceConsumer, move_to
from autotune.machine import evict, fits_page_cache, record_files, usable_cpus

__all__ = ["break_down", "diagnose", "measure_device", "read_files", "transfer_seconds", "default_samples"]

READ_CAP = 1 << 30  # read at most this many bytes of the recorded files; extrapolate beyond
CHUNK = 1 << 20
MAX_BATCHES = 4  # pre-made batches kept for transfer and consumer measurements
ROUNDS = 2  # interleaved cold/warm rounds of dataset[i]
CONSUMER_SECONDS = 3.0  # time spent timing the consumer, at most (and at least 3 calls)
WIDTH = 100

Progress = Callable[[str], None]


def default_samples(length: int, batch_size: int) -> int:
    """Four batches' worth, at least 64 samples, never more than the dataset holds."""
    return min(length, max(4 * batch_size, 64))


# ------------------------------------------------------------------------------------------ helpers


def _fresh(obj: Any) -> Any:
    """A copy of a (nested) batch with new tensor and array buffers, as a new batch would have."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        return {k: _fresh(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_fresh(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return copy.copy(obj)


def _touch(obj: Any) -> None:
    """Read every tensor once, as a consumer would (maps the shared memory a worker sent)."""
    if isinstance(obj, torch.Tensor):
        if obj.numel():
            obj.sum()
    elif isinstance(obj, dict):
        for v in obj.values():
            _touch(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _touch(v)


def _identity(batch: Any) -> Any:
    return batch


def _one_thread(_worker_id: int) -> None:
    torch.set_num_threads(1)  # a forked worker must not enter an OpenMP parallel region


class _Batches(Dataset[Any]):
    """``count`` items cycling over pre-made batches; each item is a fresh copy."""

    def __init__(self, batches: list[Any], count: int):
        self.batches = batches
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> Any:
        return _fresh(self.batches[i % len(self.batches)])


def _steady_per_batch(loader: Any) -> float:
    """Seconds per batch from the first batch received to the last (start-up left out)."""
    first = None
    count = 0
    for batch in loader:
        _touch(batch)
        count += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return (end - first) / max(count - 1, 1) if first is not None else 0.0


def transfer_seconds(batches: list[Any], *, count: int = 10, rounds: int = 2, timeout: float = 120.0) -> float:
    """Extra seconds per batch of receiving it from one worker process rather than making it in-process.

    Both loops hand out fresh copies of the same batches and read them; worker start-up is left out.
    Rounds are interleaved (in-process, worker, in-process, worker) and the medians compared.
    """
    if not batches:
        return 0.0
    data = _Batches(batches, max(count, 2))
    local, remote = [], []
    for _ in range(rounds):
        local.append(_steady_per_batch(DataLoader(data, batch_size=None, num_workers=0, collate_fn=_identity)))
        loader = DataLoader(data, batch_size=None, num_workers=1, collate_fn=_identity, prefetch_factor=2,
                            worker_init_fn=_one_thread, timeout=timeout)
        remote.append(_steady_per_batch(loader))
        del loader
    return max(0.0, statistics.median(remote) - statistics.median(local))


def measure_device(batches: list[Any], *, cuda: bool | None = None, pin: Callable[[Any], Any] | None = None,
                   copy_to: Callable[[Any], Any] | None = None, sync: Callable[[], None] | None = None,
                   repeats: int = 3) -> tuple[float | None, float | None]:
    """Seconds per batch to pin a batch and to copy a pinned batch to the device; (None, None) without
    CUDA. ``pin``, ``copy_to`` and ``sync`` default to torch's; tests pass their own."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if not cuda or not batches:
        return None, None
    if pin is None:
        from torch.utils.data._utils.pin_memory import pin_memory

        pin = pin_memory
    if copy_to is None:
        device = torch.device("cuda")

        def to_device(batch: Any) -> Any:
            return move_to(batch, device, True)

        copy_to = to_device
    if sync is None:
        sync = torch.cuda.synchronize
    pinned = [pin(b) for b in batches]  # warm-up: the first pin allocates the pinned pool
    copy_to(pinned[0])
    sync()
    pin_times, copy_times = [], []
    for _ in range(repeats):
        for batch in batches:
            start = time.perf_counter()
            pinned_batch = pin(batch)
            pin_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            copy_to(pinned_batch)
            sync()
            copy_times.append(time.perf_counter() - start)
    return statistics.median(pin_times), statistics.median(copy_times)


def read_files(paths: list[str], cap: int = READ_CAP) -> tuple[float, int]:
    """Seconds to open and read ``paths`` whole (raw bytes, 1 MiB chunks), and the bytes they hold.

    Beyond ``cap`` bytes the rest is not read; its time is extrapolated from the rate so far.
    """
    seconds = 0.0
    read = 0
    total = 0
    buffer = bytearray(CHUNK)
    for path in paths:
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        total += size
        if read >= cap:
            continue
        start = time.perf_counter()
        try:
            with open(path, "rb", buffering=0) as f:
                while read < cap and f.readinto(buffer):
                    read += CHUNK
        except OSError:
            continue
        seconds += time.perf_counter() - start
    if total > read > 0:
        seconds *= total / read
    return seconds, total


def _evict(paths: set[str]) -> tuple[bool, str]:
    """Evict ``paths`` from the page cache; whether it worked, and a note when not."""
    if not paths:
        return True, ""
    report = evict(paths)
    return report.effective, report.note


def _record(fn: Callable[[], Any]) -> tuple[Any, set[str]]:
    return record_files(fn)


def _fits(total_bytes: float) -> bool:
    return fits_page_cache(int(total_bytes))


def _time_samples(dataset: Any, indices: list[int]) -> tuple[list[float], list[Any]]:
    times, samples = [], []
    for index in indices:
        start = time.perf_counter()
        sample = read_sample(dataset, index)
        times.append(time.perf_counter() - start)
        samples.append(sample)
    return times, samples


def _apply_transform(transform: Callable[[Any], Any] | None, samples: list[Any]) -> tuple[list[Any], list[float]]:
    """The transformed samples and the seconds each transform took (none without a transform)."""
    if transform is None:
        return list(samples), []
    out, times = [], []
    for sample in samples:
        start = time.perf_counter()
        try:
            out.append(transform(sample))
        except Exception as exc:  # noqa: BLE001 - the user's transform can raise anything
            raise DatasetError(f"transform raised {type(exc).__name__}: {exc}. "
                               "Fix it (run with --debug for the traceback).") from exc
        times.append(time.perf_counter() - start)
    return out, times


def _consumer(spec: UserSpec) -> tuple[Callable[[Any], Any] | None, str]:
    if spec.train_step is not None:
        return spec.train_step, "train_step"
    if torch.cuda.is_available():
        return DeviceConsumer(pin_memory=False), "device copy"
    return None, "none"


def consumer_seconds(consume: Callable[[Any], Any], batches: list[Any], *, budget: float = CONSUMER_SECONDS,
                     least: int = 3, most: int = 20) -> float:
    """Median seconds of ``consume(batch)`` on batches already in memory, after one warm-up call."""
    def call(batch: Any) -> float:
        fresh = _fresh(batch)  # a train_step may change its batch in place
        start = time.perf_counter()
        try:
            consume(fresh)
        except Exception as exc:  # noqa: BLE001 - the user's train_step can raise anything
            raise DatasetError(f"train_step raised {type(exc).__name__}: {exc}. "
                               "Fix it (run with --debug for the traceback).") from exc
        return time.perf_counter() - start

    call(batches[0])
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < most and (len(times) < least or time.perf_counter() - began < budget):
        times.append(call(batches[len(times) % len(batches)]))
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ measure


def break_down(spec: UserSpec, *, samples: int | None = None, seed: int = 0,
            progress: Progress | None = None, recipe: tuple[float, str] | None = None) -> Breakdown:
    """Measure ``spec`` on a seeded subset; see the module docstring for the steps. ``recipe``: a recipe's
    predicted whole run (seconds) and its configuration described, held against the floor."""
    say = progress or (lambda _text: None)
    dataset = spec.dataset
    length = len(dataset)
    batch_size = spec.batch_size
    count = samples or default_samples(length, batch_size)
    indices = probe_indices(length, max(1, count), seed)
    n = len(indices)
    notes: list[str] = []

    say("recording the files dataset[i] opens")
    raw, files = _record(lambda: [read_sample(dataset, i) for i in indices])
    paths = sorted(files)
    sample_bytes = float(np.mean([sample_nbytes(s) for s in raw]))
    del raw

    # Interleaved rounds (cold, warm, cold, warm): noise from other work hits both alike.
    read_cold = read_warm = None
    file_bytes = 0
    evicted = True
    cold_runs: list[list[float]] = []
    warm_runs: list[list[float]] = []
    read_runs: list[tuple[float, float]] = []
    transformed: list[Any] = []
    transform_times: list[float] = []
    for round_ in range(ROUNDS):
        say(f"dataset[i] from cold files ({round_ + 1}/{ROUNDS})")
        ok, note = _evict(files)
        evicted = evicted and ok
        if note and note not in notes:
            notes.append(note)
        cold_runs.append(_time_samples(dataset, indices)[0])
        if paths:
            say(f"reading the files raw, cold and warm ({round_ + 1}/{ROUNDS})")
            ok, _ = _evict(files)
            evicted = evicted and ok
            cold_seconds, file_bytes = read_files(paths)
            read_runs.append((cold_seconds, read_files(paths)[0]))
        say(f"dataset[i] warm ({round_ + 1}/{ROUNDS})")
        times, got = _time_samples(dataset, indices)
        warm_runs.append(times)
        if round_ == 0:
            transformed, transform_times = _apply_transform(spec.transform, got)
        del got
    cold_per_sample = [statistics.median(run) for run in zip(*cold_runs)]
    warm_per_sample = [statistics.median(run) for run in zip(*warm_runs)]
    if paths:
        read_cold = statistics.median(c for c, _ in read_runs) / n
        read_warm = statistics.median(w for _, w in read_runs) / n
    else:
        notes.append("dataset[i] opened no files through Python (data in memory, or opened by native code "
                     "such as h5py or lmdb): file reading could not be told apart from decode")

    say("collate")
    collate = spec.collate_fn or default_collate
    batch_count = max(1, min(MAX_BATCHES * 2, n // batch_size))
    collate_times: list[float] = []
    batches: list[Any] = []
    for b in range(batch_count):
        chunk = [transformed[(b * batch_size + j) % n] for j in range(batch_size)]
        start = time.perf_counter()
        try:
            batch = collate(chunk)
        except Exception as exc:  # noqa: BLE001 - the user's collate_fn can raise anything
            raise DatasetError(f"collate_fn raised {type(exc).__name__}: {exc}. "
                               "Fix it (run with --debug for the traceback).") from exc
        collate_times.append(time.perf_counter() - start)
        if len(batches) < MAX_BATCHES:
            batches.append(batch)
    del transformed
    batch_bytes = float(np.mean([sample_nbytes(b) for b in batches]))

    say("transfer from a worker process")
    transfer = transfer_seconds(batches)

    say("pinning and host-to-device copy")
    pin, h2d = measure_device(batches)

    consume, kind = _consumer(spec)
    consumer = None
    if consume is not None:
        say(f"the consumer ({kind}) alone")
        consumer = consumer_seconds(consume, batches)

    say("a cache build against a bare decode of the same samples")
    cost = None
    try:
        cost = build_against_decode(dataset, indices, files)
    except Exception as exc:  # noqa: BLE001 - a sample the cache cannot hold: the rest still stands
        notes.append(f"the cache build was not measured: {type(exc).__name__}: {exc}")

    say("this machine's floor: one decode on every usable CPU, then gathers from memory")
    floor: Floor | None = None
    try:
        # the build comparison's bare decode is the floor's decode: the same samples on the same workers
        floor = measure_floor(dataset, indices, batch_size=batch_size, epochs=spec.epochs, files=files, seed=seed,
                              workers=cost.workers if cost else None,
                              decoded=cost.bare_decode_seconds if cost else None)
    except Exception as exc:  # noqa: BLE001 - the dataset's own failure in a worker: the rest still stands
        notes.append(f"the floor was not measured: {type(exc).__name__}: {exc}")

    if not evicted and paths:
        notes.append("the files could not be evicted: cold figures are warm")
    return Breakdown(
        build=cost.build_seconds if cost else None,
        bare_decode=cost.bare_decode_seconds if cost else None,
        build_fixed=cost.fixed_seconds if cost else None,
        build_workers=cost.workers if cost else None,
        build_first_touch=cost.first_touch_seconds if cost else None,
        build_bytes=cost.cache_bytes if cost else None,
        epochs=spec.epochs,
        floor_workers=floor.workers if floor else None,
        floor_decode=floor.decode_total if floor else None,
        floor_gathers=floor.gathers_total if floor else None,
        floor=floor.total if floor else None,
        recipe_total=recipe[0] if recipe else None,
        recipe_config=recipe[1] if recipe else "",
        batch_size=batch_size,
        usable_cpus=usable_cpus(),
        sample_cold=_mean(cold_per_sample),
        sample_warm=_mean(warm_per_sample),
        collate=_mean(collate_times),
        transfer=transfer,
        consumer=consumer,
        read_cold=read_cold,
        read_warm=read_warm,
        transform=_mean(transform_times) if transform_times else 0.0,
        pin=pin,
        h2d=h2d,
        consumer_kind=kind,
        consumer_on_cpu=kind == "train_step" and not torch.cuda.is_available(),
        fits_in_memory=_fits(file_bytes / n * length) if paths else True,
        evicted=evicted or not paths,
        source=spec.source,
        length=length,
        samples=n,
        seed=seed,
        files=len(paths),
        file_bytes_per_sample=file_bytes / n,
        sample_bytes=sample_bytes,
        batch_bytes=batch_bytes,
        cuda=torch.cuda.is_available(),
        notes=tuple(notes),
    )


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def diagnose(spec: UserSpec, *, samples: int | None = None, seed: int = 0,
             progress: Progress | None = None, recipe: tuple[float, str] | None = None) -> tuple[Breakdown, Verdict]:
    """Measure ``spec`` and judge it."""
    m = break_down(spec, samples=samples, seed=seed, progress=progress, recipe=recipe)
    return m, judge(m)


# ------------------------------------------------------------------------------------------ output

SCHEMA = "autotune-diagnose"
SCHEMA_VERSION = 1


def to_json(m: Breakdown, v: Verdict) -> dict[str, Any]:
    """The ``--json`` document (schema in ``autotune/cli/_diagnose.py``)."""
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "measurements": _clean(m.to_dict()),
            "verdict": v.to_dict()}


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _t(seconds: float | None) -> str:
    return "-" if seconds is None else format_fine(seconds)


_b = format_bytes


def _r(rate: float | None) -> str:
    return "unbounded" if rate is None else f"{rate:,.0f} samples/s"


def format_table(m: Breakdown, v: Verdict) -> str:
    """One table of the measurements and ceilings, then the verdict in plain words."""
    b = m.batch_size
    rows: list[tuple[str, str, str, str]] = []

    def row(name: str, per_sample: float | None = None, per_batch: float | None = None, note: str = "") -> None:
        rows.append((name, _t(per_sample) if per_sample is not None else "",
                     _t(per_batch) if per_batch is not None else "", note))

    cold_note = "no files to evict" if not m.files else "files evicted" if m.evicted else "NOT evicted: warm"
    row("dataset[i] cold", m.sample_cold, b * m.sample_cold, cold_note)
    row("dataset[i] warm", m.sample_warm, b * m.sample_warm, "files in page cache" if m.files else "")
    if m.read_cold is not None and m.read_warm is not None:
        files = f"{m.files} files, {_b(m.file_bytes_per_sample)}/sample"
        row("  opening+reading files, cold", m.read_cold, b * m.read_cold,
            f"{_pct(m.read_cold, m.sample_cold)} of cold; {files}")
        row("  opening+reading files, warm", m.read_warm, b * m.read_warm,
            f"{_pct(m.read_warm, m.sample_warm)} of warm")
        rest = max(m.sample_warm - m.read_warm, 0.0)
        row("  rest: decode etc., warm", rest, b * rest, f"{_pct(rest, m.sample_warm)} of warm")
    else:
        rows.append(("  opening+reading files", "n/a", "", "no files opened through Python"))
    if m.transform:
        row("transform", m.transform, b * m.transform)
    else:
        rows.append(("transform", "none", "", ""))
    row("collate", None, m.collate, f"{_b(m.batch_bytes)} per batch ({_b(m.sample_bytes)} per sample)")
    row("transfer worker -> main", None, m.transfer, "1 worker vs in-process, extra per batch")
    if m.cuda and m.pin is not None:
        row("pin memory", None, m.pin)
        row("host-to-device copy", None, m.h2d, "pinned batch")
    else:
        rows.append(("pin memory / host-to-device", "", "n/a (no CUDA)", ""))
    if m.consumer is not None:
        row(f"consumer ({m.consumer_kind})", None, m.consumer, "alone, data already in memory")
    else:
        rows.append(("consumer", "", "none", "no train_step and no CUDA"))
    if m.build is not None and m.bare_decode is not None and m.samples:
        extra = m.build - m.bare_decode
        row("build vs bare decode", m.build / m.samples, None,
            f"memory-cache build {_t(m.build)} vs bare decode {_t(m.bare_decode)} of the {m.samples} samples on "
            f"{m.build_workers or 'no'} worker(s): {_t(extra)} over ({_pct(extra, m.bare_decode)}); "
            f"fixed part {_t(m.build_fixed)}; first touch of the cache's {format_bytes(m.build_bytes or 0)} "
            f"{_t(m.build_first_touch)} (new memory a cache must hold; a bare decode reuses its buffer)")
    rows.append(("", "", "", ""))
    rows.append(("ceiling", "samples/s", "per batch", ""))
    c = v.ceilings
    rows.append(("no stalls (consumer alone)", _r(c["no_stall"]).replace(" samples/s", ""), _t(m.consumer), ""))
    rows.append(("prepared data (warm files)", _r(c["prepared"]).replace(" samples/s", ""), _t(v.loader_batch),
                 f"loader with {v.loader_cpus} of {m.usable_cpus} usable CPUs"))
    rows.append(("cold files", _r(c["cold"]).replace(" samples/s", ""), _t(v.loader_batch_cold),
                 f"loader with {v.loader_cpus} of {m.usable_cpus} usable CPUs"))
    rows.append(("num_workers=0 (all in series)", _r(c["serial"]).replace(" samples/s", ""),
                 _t(b / c["serial"]) if c["serial"] else "-", "load, then consume, one CPU"))

    head = ("measure", "per sample", f"per batch ({b})", "note")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = [f"autotune diagnose {m.source}: {m.samples} of {m.length} samples (seed {m.seed}), "
             f"batch size {b}, {m.usable_cpus} usable CPUs"]
    sep = "  "

    def fmt(r: tuple[str, str, str, str]) -> str:
        return sep.join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2]), r[3]]).rstrip()

    lines.append(fmt(head))
    lines.append(sep.join("-" * w for w in widths))
    lines.extend(fmt(r) for r in rows)
    lines.append("")
    lines.extend(floor_lines(m))
    lines.extend(textwrap.wrap(f"Verdict: {v.summary}", WIDTH, subsequent_indent="  "))
    for text in v.explanation:
        lines.extend(textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent="  "))
    for title, items in (("Can help", v.helps), ("Cannot help", v.cannot_help)):
        if items:
            lines.append(f"  {title}:")
            for item in items:
                lines.extend(textwrap.wrap(item, WIDTH, initial_indent="    - ", subsequent_indent="      "))
    for note in m.notes:
        lines.extend(textwrap.wrap(f"note: {note}", WIDTH, initial_indent="  ", subsequent_indent="    "))
    return "\n".join(lines)


def floor_lines(m: Breakdown) -> list[str]:
    """The floor's section: its parts, and the recipe's run as a multiple of it (nothing when not measured)."""
    if m.floor is None or m.floor_decode is None or m.floor_gathers is None:
        return []
    workers = f"{m.floor_workers} worker processes" if m.floor_workers else "this process"
    epochs = f"{m.epochs} epoch{'s' if m.epochs != 1 else ''}"
    lines = [f"Floor of this machine for the whole run ({m.length} samples, {epochs}, batch size {m.batch_size}; "
             f"measured on {m.samples}): {_t(m.floor)}",
             f"  every sample decoded once on {workers}, nothing stored: {_t(m.floor_decode)}",
             f"  {epochs} of batch gathers from samples in memory: {_t(m.floor_gathers)}"]
    if m.recipe_total is not None and m.over_floor is not None:
        lines.append(f"  the recipe ({m.recipe_config}), predicted {_t(m.recipe_total)}: "
                     f"{m.over_floor:.2f}x the floor")
    lines.append("")
    return lines


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"
