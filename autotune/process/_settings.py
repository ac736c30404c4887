"""Process-level settings of a recipe: the memory allocator and CPU thread counts.

They are kept apart from the DataLoader keywords because they act on whole processes, and some of
them only when a process starts:

========================  ===================================  =======================================
setting                   at run time (``apply_at_runtime``,    at start (``launch_env``,
                          ``worker_init``)                     ``autotune run``)
========================  ===================================  =======================================
allocator glibc-tuned     ``mallopt`` in main and workers       ``MALLOC_MMAP_THRESHOLD_`` /
                                                               ``MALLOC_TRIM_THRESHOLD_``
allocator tcmalloc,       no (reported as not applied; glibc-   ``LD_PRELOAD``
jemalloc                  tuned's mallopt stands in)
main_threads              ``torch.set_num_threads`` in main     ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
worker_threads            ``torch.set_num_threads`` in workers  (by the factory's ``worker_init_fn``)
========================  ===================================  =======================================

Nothing here changes a process silently: every function returns what it did and what it could not
do, as human-readable lines, for the caller to print or log.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from autotune.process import _allocator as _alloc

PRELOAD_ALLOCATORS = tuple(_alloc.PRELOAD_LIBRARIES)  # ("tcmalloc", "jemalloc")

RUN_HINT = "start training with `autotune run -- python train.py`"


@dataclass(frozen=True)
class ProcessSettings:
    """The process-level part of a ``LoaderConfig`` (``LoaderConfig.process_settings()``; it is never
    stored on its own). None means "leave as the process has it"."""

    allocator: str = "glibc"
    main_threads: int | None = None  # torch.set_num_threads in the main process; OMP/MKL at start
    worker_threads: int | None = None  # torch.set_num_threads in each DataLoader worker

    def __post_init__(self) -> None:
        if self.allocator not in _alloc.ALLOCATORS:
            raise ValueError(
                f"allocator must be one of {', '.join(_alloc.ALLOCATORS)}, but got {self.allocator!r}"
            )
        for f in ("main_threads", "worker_threads"):
            value = getattr(self, f)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{f} must be a positive integer or None, but got {value!r}")

    def describe(self) -> str:
        """One line for `autotune show`: only what differs from the defaults."""
        parts = [f"allocator={self.allocator}"]
        for f in ("main_threads", "worker_threads"):
            if getattr(self, f) is not None:
                parts.append(f"{f}={getattr(self, f)}")
        return ", ".join(parts)


def _mallopt_text(where: str) -> str:
    return (
        f"mallopt(M_MMAP_THRESHOLD={_alloc.format_size(_alloc.DEFAULT_MMAP_THRESHOLD)}, "
        f"M_TRIM_THRESHOLD={_alloc.format_size(_alloc.DEFAULT_TRIM_THRESHOLD)}) in {where}"
    )


def fallback_allocator() -> str:
    """What a missing preload library falls back to: glibc-tuned where glibc, else glibc.

    A recipe picks tcmalloc or jemalloc because large freed blocks are reused, which glibc-tuned
    also gives at run time.
    """
    return "glibc-tuned" if _alloc.is_glibc() else "glibc"


def resolve_allocator(name: str) -> tuple[str, str | None]:
    """(the allocator that can really be used here for ``name``, a note when it differs)."""
    reason = _alloc.not_available_reason(name)
    if reason is None:
        return name, None
    if name in PRELOAD_ALLOCATORS:
        fallback = fallback_allocator()
        return fallback, f"{name} {reason}; using {fallback} instead"
    return "glibc", f"{name} {reason}; using the C library's default allocator instead"


_ALLOCATOR_ENV = (_alloc.ENV_MMAP_THRESHOLD, _alloc.ENV_TRIM_THRESHOLD)


def _thread_env(settings: ProcessSettings) -> dict[str, str]:
    """A process started with the main-process thread count: torch sizes its intra-op pool from
    OMP_NUM_THREADS at start (DataLoader workers still set their own, one unless worker_threads says)."""
    if settings.main_threads is None:
        return {}
    return {"OMP_NUM_THREADS": str(settings.main_threads), "MKL_NUM_THREADS": str(settings.main_threads)}


def needs_fresh_process(settings: ProcessSettings) -> bool:
    """True when ``settings`` can only take full effect in a process started with them.

    That is: the allocator to use (after falling back for a missing library) is a preload that
    this process was not started with, or this process has a preload the settings do not want.
    Thread counts are not among them: ``torch.set_num_threads`` applies them at run time.
    A trial for such settings must run in a child process started with :func:`launch_env`.
    """
    effective, _ = resolve_allocator(settings.allocator)
    wanted = effective if effective in PRELOAD_ALLOCATORS else "glibc"
    return _alloc.active_allocator() != wanted


def launch_env(
    settings: ProcessSettings, base_env: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The environment to start a process with ``settings`` applied, and notes on what was not.

    - tcmalloc / jemalloc: the library is put first in LD_PRELOAD (an existing LD_PRELOAD is kept
      after it). A missing library falls back (see :func:`fallback_allocator`) with a note.
    - glibc-tuned: MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_, which glibc reads at start,
      so they hold in every process started from it, spawned DataLoader workers included.
    - main_threads: OMP_NUM_THREADS and MKL_NUM_THREADS, so the started program's torch starts with
      that many intra-op threads (``autotune.dataloader`` also calls ``torch.set_num_threads``).

    worker_threads is not an environment setting; each worker applies it (:func:`worker_init`).
    ``base_env`` is not modified.
    """
    env = dict(base_env)
    notes: list[str] = []
    effective, note = resolve_allocator(settings.allocator)
    if note:
        notes.append(note)
    existing = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if effective in PRELOAD_ALLOCATORS:
        lib = _alloc.find_library(effective)
        assert lib is not None  # resolve_allocator fell back when the library is missing
        preload = [lib] + [p for p in existing if p != lib]
        env["LD_PRELOAD"] = ":".join(preload)
    elif effective == "glibc-tuned":
        env[_alloc.ENV_MMAP_THRESHOLD] = str(_alloc.DEFAULT_MMAP_THRESHOLD)
        env[_alloc.ENV_TRIM_THRESHOLD] = str(_alloc.DEFAULT_TRIM_THRESHOLD)
    # A preload already in the environment that is another allocator would win or clash.
    for name, filenames in _alloc.PRELOAD_LIBRARIES.items():
        if name == effective:
            continue
        clash = [p for p in existing if os.path.basename(p) in filenames]
        if clash:
            notes.append(
                f"LD_PRELOAD already loads {name} ({clash[0]}), so the recipe's allocator "
                f"{effective} may not take effect; unset LD_PRELOAD to use it"
            )
    env.update(_thread_env(settings))
    return env, notes


def command_line(
    settings: ProcessSettings,
    argv: list[str],
    *,
    via_run: bool = False,
    recipe: str | None = None,
) -> str:
    """The exact shell command that starts ``argv`` with ``settings`` applied.

    ``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 OMP_NUM_THREADS=2 python
    train.py``, or with ``via_run`` the ``autotune run [--recipe PATH] -- python train.py`` form,
    which reads the settings from the recipe at start and so works on every machine.
    """
    if via_run:
        head = ["autotune", "run"]
        if recipe is not None:
            head += ["--recipe", recipe]
        return shlex.join(head + ["--"] + list(argv))
    env, _ = launch_env(settings, {})
    prefix = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join(prefix + [shlex.join(argv)])


@dataclass
class Applied:
    """What :func:`apply_at_runtime` did, and what it could not do, as lines to print or log."""

    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)


def _runtime_allocator(settings: ProcessSettings, where: str, out: Applied) -> bool:
    """Apply what can be applied of the allocator now. True when mallopt should also run in workers."""
    active = _alloc.active_allocator()
    wanted = settings.allocator
    if wanted in PRELOAD_ALLOCATORS:
        if active == wanted:
            out.applied.append(f"{wanted} (preloaded at start) in {where}")
            return False
        effective, note = resolve_allocator(wanted)
        if note is not None:
            out.not_applied.append(note)
        else:
            out.not_applied.append(f"{wanted} needs a preload: {RUN_HINT}")
            effective = fallback_allocator()
        if effective == "glibc-tuned" and active == "glibc":
            if _alloc.apply_mallopt():
                out.applied.append(f"{_mallopt_text(where)}, in place of {wanted}")
                return True
        return False
    if active != "glibc":
        out.not_applied.append(
            f"allocator {wanted}: this process was started with {active} preloaded, "
            f"which stays in use; {RUN_HINT}"
        )
        return False
    if wanted == "glibc-tuned":
        reason = _alloc.not_available_reason("glibc-tuned")
        if reason is not None:
            out.not_applied.append(f"glibc-tuned {reason}")
        elif _alloc.apply_mallopt():
            out.applied.append(_mallopt_text(where))
            return True
        else:
            out.not_applied.append(f"glibc-tuned: glibc refused {_mallopt_text(where)}")
    return False


_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX",
               "GLIBC_TUNABLES")
_ours: dict[str, int] = {}  # what this module set in this process (so a second loader does not take it for the user's)


def torch_default_threads() -> set[int]:
    """The intra-op thread counts torch starts with here, without OMP_NUM_THREADS/MKL_NUM_THREADS: one per
    usable CPU (GNU OpenMP honours the affinity mask) or one per physical core."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = psutil.cpu_count(logical=False) or usable
    return {usable, min(usable, physical), os.cpu_count() or usable}


def users_threads() -> str | None:
    """How the user set this process's intra-op threads, when they did ("OMP_NUM_THREADS=1",
    "torch.set_num_threads(1)"); None when it is torch's default (or autotune's own earlier setting)."""
    import torch

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(name, "").strip():
            return f"{name}={os.environ[name].strip()}"
    current = torch.get_num_threads()
    if current == _ours.get("threads") or current in torch_default_threads():
        return None
    return f"torch.set_num_threads({current})"


def users_allocator() -> str | None:
    """The glibc malloc tunables the user set in the environment, when they did."""
    found = [name for name in _MALLOC_ENV if os.environ.get(name)]
    return ", ".join(f"{n}={os.environ[n]}" for n in found) or None


def apply_at_runtime(settings: ProcessSettings) -> Applied:
    """Apply now, in this (main) process, what can be applied at run time; report the rest.

    Applies mallopt (glibc-tuned, also as the stand-in for a preload this process lacks) and
    ``torch.set_num_threads(main_threads)``, each only where the user has not set it: a thread count the
    user chose (OMP_NUM_THREADS, or torch.set_num_threads to other than torch's default) and malloc
    tunables in the environment win, and the report says so. Reports a preload this process was not
    started with as not applied. Worker settings are applied by :func:`worker_init`.
    """
    out = Applied()
    mine = users_allocator()
    if mine is not None and settings.allocator != "glibc":
        out.not_applied.append(f"allocator {settings.allocator}: the user's {mine} kept (set by the user)")
    else:
        _runtime_allocator(settings, "main process", out)
    if settings.main_threads is not None:
        import torch

        before = torch.get_num_threads()
        theirs = users_threads()
        if before == settings.main_threads:
            pass  # already so: nothing changes
        elif theirs is not None:
            out.not_applied.append(f"main_threads={settings.main_threads}: the user's {theirs} kept (set by the "
                                   "user, which wins over the recipe)")
        else:
            torch.set_num_threads(settings.main_threads)
            _ours["threads"] = settings.main_threads
            out.applied.append(
                f"torch.set_num_threads({settings.main_threads}) in main process (was torch's default {before})"
            )
    return out


@dataclass(frozen=True)
class WorkerInit:
    """A picklable DataLoader ``worker_init_fn`` that applies process settings in each worker.

    Applies mallopt where the settings call for glibc-tuned (also as the stand-in for a preload
    that is missing) and ``torch.set_num_threads(worker_threads)``, then calls ``chain`` (the
    user's own worker_init_fn) with the worker id. What it did in this worker is kept in
    :data:`LAST_WORKER_APPLIED`.
    """

    settings: ProcessSettings
    chain: Callable[[int], Any] | None = None

    def __call__(self, worker_id: int) -> None:
        global LAST_WORKER_APPLIED
        out = Applied()
        _runtime_allocator(self.settings, f"worker {worker_id}", out)
        if self.settings.worker_threads is not None:
            import torch

            torch.set_num_threads(self.settings.worker_threads)
            out.applied.append(
                f"torch.set_num_threads({self.settings.worker_threads}) in worker {worker_id}"
            )
        LAST_WORKER_APPLIED = out
        if self.chain is not None:
            self.chain(worker_id)


LAST_WORKER_APPLIED: Applied | None = None


def worker_init(
    settings: ProcessSettings, chain: Callable[[int], Any] | None = None
) -> WorkerInit:
    """A picklable ``worker_init_fn`` for ``settings``, calling ``chain(worker_id)`` afterwards."""
    return WorkerInit(settings, chain)
