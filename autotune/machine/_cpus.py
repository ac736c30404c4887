"""How many CPUs this process may really use: affinity, cgroup quota, ranks sharing the node.

``os.cpu_count()`` counts the machine's logical CPUs; a process in a container, a Slurm job or a
``taskset`` sees fewer.  Two limits apply and the tighter one wins:

- the affinity mask (``os.sched_getaffinity``): the CPUs the scheduler may run us on at all;
- the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``): how much
  CPU time per period the group may burn, across any CPUs.

A fractional quota is rounded *down* (at least 1).  Going over a CFS quota is not gently slower: the
whole group is throttled until the next period once the quota is spent, so planning ``ceil(2.5) = 3``
busy workers on 2.5 CPUs of quota makes every period end in a stall.  Rounding down is what Go's
automaxprocs and most container-aware runtimes do, and the DataLoader bound built from this number
errs on the side that cannot hurt.

With several ranks on one node (``torchrun --nproc-per-node``) each rank gets its share:
the count is divided by ``ranks_per_node``, again at least 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

__all__ = ["usable_cpus", "cpu_limits", "cgroup_quota", "ranks_per_node"]

# cgroup v1 mounts the cpu controller under one of these names, depending on the distribution.
_V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def _affinity_count(affinity: set[int] | None) -> int:
    if affinity is not None:
        return max(1, len(affinity))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows: no affinity API
        return max(1, os.cpu_count() or 1)


def _own_cgroup_paths(proc_cgroup: str | Path = "/proc/self/cgroup") -> dict[str, str]:
    """Map controller -> this process's cgroup path ("" is the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        return paths
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def _dirs_up(root: Path, relative: str | None) -> list[Path]:
    """The process's own cgroup folder under ``root`` and every parent up to ``root`` (a parent's
    quota also binds).  Folders that are not there (a fake root in tests, a container that mounts
    its own cgroup as the root) are skipped."""
    dirs = [root]
    if relative:
        parts = [p for p in relative.strip("/").split("/") if p and p != ".."]
        for i in range(1, len(parts) + 1):
            candidate = root.joinpath(*parts[:i])
            if candidate.is_dir():
                dirs.append(candidate)
    return dirs


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _v2_quota(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(folder: Path) -> float | None:
    quota_text = _read(folder / "cpu.cfs_quota_us")
    period_text = _read(folder / "cpu.cfs_period_us")
    if quota_text is None or period_text is None:
        return None
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None  # -1 means no quota


def cgroup_quota(
    cgroup_root: str | Path = "/sys/fs/cgroup", *, cgroup_path: str | None = None
) -> tuple[float | None, str | None]:
    """The tightest CPU quota (in CPUs, maybe fractional) over this process's cgroup and its
    parents, and the file it came from; ``(None, None)`` when there is none.

    ``cgroup_path`` is the process's cgroup relative to the root (read from /proc/self/cgroup
    when None).
    """
    root = Path(cgroup_root)
    own = _own_cgroup_paths() if cgroup_path is None else {"": cgroup_path, "cpu": cgroup_path}
    best: tuple[float | None, str | None] = (None, None)

    def consider(quota: float | None, source: Path) -> None:
        nonlocal best
        if quota is not None and (best[0] is None or quota < best[0]):
            best = (quota, str(source))

    # v2: cpu.max directly in the unified hierarchy.
    for folder in _dirs_up(root, own.get("")):
        consider(_v2_quota(folder), folder / "cpu.max")
    # v1 (or hybrid): the cpu controller's own mount.
    for name in _V1_CPU_DIRS:
        mount = root / name
        if mount.is_dir():
            for folder in _dirs_up(mount, own.get("cpu")):
                consider(_v1_quota(folder), folder / "cpu.cfs_quota_us")
            break
    return best


def cpu_limits(
    ranks_per_node: int = 1,
    *,
    cgroup_root: str | Path = "/sys/fs/cgroup",
    affinity: set[int] | None = None,
    cgroup_path: str | None = None,
) -> dict[str, Any]:
    """The usable CPU count and where it came from.

    Returns a dict with ``usable_cpus`` (int), ``logical_cpus`` (``os.cpu_count()``),
    ``affinity`` (CPUs in the affinity mask), ``cgroup_quota`` (CPUs, float or None),
    ``cgroup_source`` (the file, or None), ``ranks_per_node``, ``limited_by``
    (``"affinity"``, ``"cgroup"`` or ``"ranks"``: the last limit that cut the number) and
    ``reason`` (one plain sentence for messages).
    """
    if not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be a positive integer, but got {ranks_per_node=}.")
    logical = os.cpu_count() or 1
    by_affinity = _affinity_count(affinity)
    quota, source = cgroup_quota(cgroup_root, cgroup_path=cgroup_path)
    by_cgroup = max(1, math.floor(quota)) if quota is not None else None

    if by_cgroup is not None and by_cgroup < by_affinity:
        node, limited_by = by_cgroup, "cgroup"
        reason = f"cgroup quota of {quota:g} CPUs ({source}), rounded down"
    else:
        node, limited_by = by_affinity, "affinity"
        reason = f"{by_affinity} CPUs in this process's affinity mask"
    usable = max(1, node // ranks_per_node)
    if ranks_per_node > 1:
        limited_by = "ranks"
        reason += f", shared by {ranks_per_node} ranks on this node"
    return {
        "usable_cpus": usable,
        "logical_cpus": logical,
        "affinity": by_affinity,
        "cgroup_quota": quota,
        "cgroup_source": source,
        "ranks_per_node": ranks_per_node,
        "limited_by": limited_by,
        "reason": f"{usable} usable of {logical} logical CPUs: {reason}",
    }


def build_workers(cpus: int | None = None) -> int:
    """Processes that decode in parallel while a cache is built: every usable CPU, none on one CPU
    (a single worker would only add a process hop to the main process's work)."""
    cpus = usable_cpus() if cpus is None else cpus
    return cpus if cpus > 1 else 0


def usable_cpus(
    ranks_per_node: int = 1,
    *,
    cgroup_root: str | Path = "/sys/fs/cgroup",
    affinity: set[int] | None = None,
    cgroup_path: str | None = None,
) -> int:
    """CPUs this process may use: min(affinity, floor(cgroup quota)) // ranks_per_node, at least 1."""
    return int(cpu_limits(
        ranks_per_node, cgroup_root=cgroup_root, affinity=affinity, cgroup_path=cgroup_path
    )["usable_cpus"])


def ranks_per_node(explicit: int | None = None, environ: dict[str, Any] | None = None) -> int:
    """Training processes sharing this node: ``explicit`` when given, else torchrun's ``LOCAL_WORLD_SIZE``
    (set in every rank it starts), else 1."""
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 1:
            raise ValueError(f"ranks_per_node must be a positive integer, but got {explicit!r}.")
        return explicit
    text = (os.environ if environ is None else environ).get("LOCAL_WORLD_SIZE", "")
    try:
        value = int(text)
    except ValueError:
        return 1
    return value if value >= 1 else 1
