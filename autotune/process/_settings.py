"""Process-level settings of a recipe: the memory allocator and CPU thread counts.

They are kept apart from the DataLoader keywords because they act on whole processes, and some of
them only when a process starts:

========================  ===================================  =======================================
setting                   at run time (``apply_at_runtime``,    at start (``launch_env``,
                          ``worker_init``)                     ``autotune run``)
========================  ===================================  =======================================
allocator, ``Mallopt``    ``mallopt`` in main and workers       ``MALLOC_MMAP_THRESHOLD_`` /
(glibc-tuned)                                                  ``MALLOC_TRIM_THRESHOLD_``
allocator, ``Preloaded``  no (reported as not applied; its      ``LD_PRELOAD``
(tcmalloc, jemalloc)      ``stand_in``'s mallopt stands in)
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

from autotune.process import _family

RUN_HINT = "start training with `autotune run -- python train.py`"


@dataclass(frozen=True)
class ProcessSettings:
    """The process-level part of a ``LoaderConfig`` (``LoaderConfig.process_settings()``; it is never
    stored on its own). None means "leave as the process has it"."""

    allocator: str = _family.DEFAULT  # a registered allocator's name (``_family``)
    main_threads: int | None = None  # torch.set_num_threads in the main process; OMP/MKL at start
    worker_threads: int | None = None  # torch.set_num_threads in each DataLoader worker

    def __post_init__(self) -> None:
        if self.allocator not in _family.names():
            raise ValueError(f"allocator must be one of {', '.join(_family.names())}, but got {self.allocator!r}")
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
    effective, _ = _family.resolve(settings.allocator)
    wanted = effective.name if effective.preloaded else _family.DEFAULT
    return _family.active() != wanted


def launch_env(
    settings: ProcessSettings, base_env: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The environment to start a process with ``settings`` applied, and notes on what was not.

    - a preload (tcmalloc, jemalloc): the library is put first in LD_PRELOAD (an existing LD_PRELOAD is
      kept after it). A missing library falls back to its ``stand_in`` with a note.
    - a mallopt one (glibc-tuned): MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_, which glibc reads at
      start, so they hold in every process started from it, spawned DataLoader workers included.
    - main_threads: OMP_NUM_THREADS and MKL_NUM_THREADS, so the started program's torch starts with
      that many intra-op threads (``autotune.dataloader`` also calls ``torch.set_num_threads``).

    worker_threads is not an environment setting; each worker applies it (:func:`worker_init`).
    ``base_env`` is not modified.
    """
    env = dict(base_env)
    notes: list[str] = []
    effective, note = _family.resolve(settings.allocator)
    if note:
        notes.append(note)
    existing = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    wanted = effective.environment()
    if "LD_PRELOAD" in wanted:
        wanted["LD_PRELOAD"] = ":".join([wanted["LD_PRELOAD"]] + [p for p in existing if p != wanted["LD_PRELOAD"]])
    env.update(wanted)
    # A preload already in the environment that is another allocator would win or clash.
    for name in _family.names():
        other = _family.get(name)
        if other is effective or not issubclass(other, _family.Preloaded):
            continue
        clash = [p for p in existing if other.loaded({p})]
        if clash:
            notes.append(
                f"LD_PRELOAD already loads {name} ({clash[0]}), so the recipe's allocator "
                f"{effective.name} may not take effect; unset LD_PRELOAD to use it"
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
    allocator: str | None = None  # the allocator in use in the main process afterwards (None: not looked at)

    @property
    def keeps_freed(self) -> bool:
        """Whether the allocator in use afterwards keeps what it frees (``Allocator.keeps_freed``): a loop's
        freed batches then stay in this process for the next."""
        return self.allocator is not None and _family.get(self.allocator).keeps_freed


def _runtime_allocator(settings: ProcessSettings, where: str, out: Applied) -> None:
    """Apply what can be applied of the allocator now, in this process; say what was and what was not."""
    active = _family.active()
    out.allocator = active  # until something else takes
    wanted = _family.get(settings.allocator)
    stand_in = ""
    if wanted.preloaded:
        if active == wanted.name:
            out.applied.append(f"{wanted.name} (preloaded at start) in {where}")
            return
        effective, note = _family.resolve(wanted.name)
        if note is None:
            note = f"{wanted.name} needs a preload: {RUN_HINT}"
            effective, _ = _family.resolve(wanted.stand_in)
        out.not_applied.append(note)
        if effective.preloaded or active != _family.DEFAULT:
            return
        wanted, stand_in = effective, f", in place of {settings.allocator}"
    elif active != _family.DEFAULT:
        out.not_applied.append(
            f"allocator {wanted.name}: this process was started with {active} preloaded, "
            f"which stays in use; {RUN_HINT}"
        )
        return
    done = wanted.apply(where)
    if done is None:
        return
    took, line = done
    if took:
        out.applied.append(line + stand_in)
        out.allocator = wanted.name
    elif not stand_in:  # a stand-in that does not take leaves the preload's note as the whole story
        out.not_applied.append(line)


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
    if mine is not None and settings.allocator != _family.DEFAULT:
        out.not_applied.append(f"allocator {settings.allocator}: the user's {mine} kept (set by the user)")
        out.allocator = _family.active()
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
