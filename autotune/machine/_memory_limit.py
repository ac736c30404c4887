"""How much memory this job may use: its cgroup's limit, its resource limits, and the host's RAM.

A Slurm allocation, a Kubernetes pod or ``docker run --memory`` sets a cgroup memory limit; going over
it does not slow the job, the kernel's OOM killer ends it. ``psutil.virtual_memory()`` reads the host
and knows nothing of it. The limits read here, and the tightest wins:

- cgroup v2: ``memory.max`` and ``memory.high`` (above ``high`` the group is throttled into reclaim),
  less ``memory.current``;
- cgroup v1: ``memory.limit_in_bytes`` less ``memory.usage_in_bytes`` (and ``memory.stat``'s
  ``hierarchical_memory_limit``, which names an ancestor's limit a container cannot see);
- each of these in the process's own cgroup and in every parent up to the root (a parent's limit
  binds its children: its usage is theirs together);
- ``RLIMIT_AS`` less this process's address space, ``RLIMIT_DATA`` less its data segment;
- the host's available memory.

The page cache is charged to the cgroup, so a job that has read its files shows them in its usage. The
kernel reclaims inactive file pages before it kills anything, so they count as available (``memory.stat``
``inactive_file``, v1 ``total_inactive_file``), as Docker's and Kubernetes' working-set figures count
them. Active file pages are not counted: they hold the process's own mapped libraries and the data it
is reading now, and reclaiming those thrashes instead of freeing memory.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from autotune._units import format_bytes
from autotune.machine._cpus import _dirs_up, _own_cgroup_paths, _read

BUDGET_SHARE = 0.7  # of what is available: the rest is the training's own growth and the kernel's

__all__ = ["JobMemory", "job_memory", "cgroup_memory"]

# v1 writes "no limit" as the largest page-aligned signed 64-bit number; anything this large is none.
_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class Level:
    """One limit: what it allows in all, what is available under it now, and where it was read."""

    limit: int
    available: int
    source: str


@dataclass(frozen=True)
class JobMemory:
    """The job's memory: the tightest limit (None: only the host's RAM), what is available now under every
    limit together, and where the binding one was read."""

    host_total: int
    host_available: int
    limit: int | None  # the tightest limit below the host's RAM, in bytes
    limit_source: str | None  # the file or rlimit it came from
    available: int  # bytes this job may still take now: the least of every level's and the host's
    available_source: str  # "host" or the file of the level that allows least now

    @property
    def total(self) -> int:
        """What the job may hold in all: its limit, else the host's RAM."""
        return self.limit if self.limit is not None else self.host_total

    def budget(self, ranks: int = 1) -> int:
        """A safe share of what the job may still take, for one of ``ranks`` processes of a node: what a search
        lets one candidate add and what the factory and the adapting loader let a recipe add."""
        return int(self.available * BUDGET_SHARE) // max(1, ranks)

    def describe_limit(self) -> str:
        """One phrase naming the limit: "the cgroup memory limit of 1.2 GiB (/sys/fs/cgroup/.../memory.max)"."""

        if self.limit is None:
            return f"the host's {format_bytes(self.host_total)} of RAM (no memory limit)"
        kind = "resource limit" if (self.limit_source or "").startswith("RLIMIT") else "cgroup memory limit"
        return f"the {kind} of {format_bytes(self.limit)} ({self.limit_source})"


def _int(text: str | None) -> int | None:
    if text is None or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value < _UNLIMITED else None


def _stat(folder: Path) -> dict[str, int]:
    text = _read(folder / "memory.stat") or ""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def _v2_levels(folder: Path) -> list[Level]:
    limits = [(v, folder / name) for name in ("memory.max", "memory.high")
              if (v := _int(_read(folder / name))) is not None]
    if not limits:
        return []
    usage = _int(_read(folder / "memory.current")) or 0
    reclaimable = _stat(folder).get("inactive_file", 0)
    return [Level(limit, max(0, limit - usage + min(reclaimable, usage)), str(source)) for limit, source in limits]


def _v1_levels(folder: Path) -> list[Level]:
    stat = _stat(folder)
    usage = _int(_read(folder / "memory.usage_in_bytes"))
    if usage is None:
        return []
    reclaimable = min(stat.get("total_inactive_file", stat.get("inactive_file", 0)), usage)
    levels = []
    own = _int(_read(folder / "memory.limit_in_bytes"))
    if own is not None:
        levels.append(Level(own, max(0, own - usage + reclaimable), str(folder / "memory.limit_in_bytes")))
    inherited = _int(str(stat["hierarchical_memory_limit"])) if "hierarchical_memory_limit" in stat else None
    if inherited is not None and (own is None or inherited < own):
        # An ancestor's limit the mount does not show (a container sees its own cgroup as the root). Its usage
        # is at least ours; ours is all that can be read.
        levels.append(Level(inherited, max(0, inherited - usage + reclaimable),
                            f"{folder / 'memory.stat'}: hierarchical_memory_limit"))
    return levels


def cgroup_memory(cgroup_root: str | Path = "/sys/fs/cgroup", *, cgroup_path: str | None = None) -> list[Level]:
    """Every memory limit over this process's cgroup and its parents, v2 and v1 (``cgroup_path``: the
    process's cgroup relative to the root; read from /proc/self/cgroup when None)."""
    root = Path(cgroup_root)
    own = _own_cgroup_paths() if cgroup_path is None else {"": cgroup_path, "memory": cgroup_path}
    levels: list[Level] = []
    # v2: at the root itself, or at the unified mount of a hybrid host (where the memory controller may be on).
    for unified in (root, root / "unified"):
        if (unified / "cgroup.controllers").is_file() or unified == root:
            for folder in _dirs_up(unified, own.get("")):
                levels += _v2_levels(folder)
    mount = root / "memory"
    if mount.is_dir():
        for folder in _dirs_up(mount, own.get("memory")):
            levels += _v1_levels(folder)
    return levels


def _status_kib(field: str, status: str | Path = "/proc/self/status") -> int | None:
    try:
        text = Path(status).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def rlimit_levels(status: str | Path = "/proc/self/status") -> list[Level]:
    """RLIMIT_AS against this process's address space (VmSize), RLIMIT_DATA against its data (VmData)."""
    levels = []
    for name, field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        number = getattr(resource, name, None)
        if number is None:
            continue
        soft, _hard = resource.getrlimit(number)
        if soft == resource.RLIM_INFINITY or soft < 0 or soft >= _UNLIMITED:
            continue
        used = _status_kib(field, status) or 0
        levels.append(Level(int(soft), max(0, int(soft) - used), name))
    return levels


def _host() -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def job_memory(*, cgroup_root: str | Path = "/sys/fs/cgroup", cgroup_path: str | None = None,
               host: tuple[int, int] | None = None, rlimits: bool = True) -> JobMemory:
    """This job's memory: the tightest of its cgroup limits (up the hierarchy, v2 and v1), its rlimits and
    the host's RAM. ``host`` is (total, available), read from psutil when None."""
    total, host_available = _host() if host is None else host
    levels = cgroup_memory(cgroup_root, cgroup_path=cgroup_path) + (rlimit_levels() if rlimits else [])
    binding = [lv for lv in levels if lv.limit < total]  # a limit above the host's RAM never binds first
    tightest = min(binding, key=lambda lv: lv.limit, default=None)
    least = min(levels, key=lambda lv: lv.available, default=None)
    if least is not None and least.available < host_available:
        available, where = least.available, least.source
    else:
        available, where = host_available, "host"
    return JobMemory(host_total=total, host_available=host_available,
                     limit=tightest.limit if tightest else None, limit_source=tightest.source if tightest else None,
                     available=available, available_source=where)
