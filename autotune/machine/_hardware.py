"""Facts about this machine, its fingerprint, and how two machines differ.

Each ``collect_*`` function gathers one fact and copes with a platform that lacks it (no
/proc/cpuinfo on macOS, no CUDA, no /dev/shm), returning None or an empty value rather than
raising.  ``collect()`` puts them together; ``fingerprint()`` hashes only the facts that decide
what the fastest DataLoader recipe is and that do not drift between runs on the same machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from collections import Counter
from typing import Any

from autotune._units import format_bytes as _format_bytes
from autotune.machine._cpus import ranks_per_node as ranks
from autotune.machine._cpus import usable_cpus
from autotune.machine._memory_limit import job_memory

__all__ = [
    "collect",
    "collect_cpu_model",
    "collect_usable_cpus",
    "collect_logical_cpus",
    "collect_memory_bytes",
    "collect_memory_limit",
    "collect_gpus",
    "collect_torch",
    "collect_cuda",
    "collect_python",
    "collect_platform",
    "collect_shm_bytes",
    "identity",
    "fingerprint",
    "differences",
    "distance",
    "describe",
    "format_gpus",
    "format_bytes",
]

_GIB = 1024**3


# ---------------------------------------------------------------------------- collect_* facts


def collect_cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU model name: /proc/cpuinfo "model name" (Linux x86), sysctl (macOS), else
    ``platform.processor()`` / ``platform.machine()``."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                    if value.strip():
                        return " ".join(value.split())
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True, text=True, timeout=5, check=False,
            ).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or None


def collect_usable_cpus(ranks_per_node: int = 1) -> int:
    """CPUs this process may use (affinity and cgroup quota), see ``autotune.machine._cpus``."""
    return usable_cpus(ranks_per_node)


def collect_logical_cpus() -> int | None:
    return os.cpu_count()


def collect_memory_bytes() -> int | None:
    """Total physical memory (psutil; sysconf when psutil is missing)."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil absent or unsupported platform
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def collect_memory_limit() -> int | None:
    """The job's memory limit in bytes (the tightest cgroup limit or rlimit below the host's RAM,
    ``machine._memory_limit``); None when only the host's RAM bounds it."""
    try:
        return job_memory().limit
    except Exception:  # psutil absent or an unsupported platform: no limit known
        return None


def collect_gpus() -> list[str]:
    """Names of the CUDA devices torch can see, in device order; [] without CUDA."""
    try:
        import torch
    except ImportError:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        return [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver reports through exceptions of many kinds
        return []


def collect_torch() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def collect_cuda() -> str | None:
    """The CUDA version torch was built with (None for a CPU build)."""
    try:
        import torch
    except ImportError:
        return None
    return getattr(torch.version, "cuda", None)


def collect_python() -> str:
    return platform.python_version()


def collect_platform() -> str:
    return platform.platform()


def collect_shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of /dev/shm, where DataLoader workers pass tensors (a small one causes bus errors).
    Informative only: not part of the fingerprint."""
    try:
        return int(shutil.disk_usage(path).total)
    except OSError:
        return None


def collect(ranks_per_node: int | None = 1) -> dict[str, Any]:
    """All facts about this machine as one of ``ranks_per_node`` training processes on it (None: torchrun's
    ``LOCAL_WORLD_SIZE``, else 1), plus their ``fingerprint``."""
    ranks_per_node = ranks(ranks_per_node)
    hw: dict[str, Any] = {
        "cpu_model": collect_cpu_model(),
        "usable_cpus": collect_usable_cpus(ranks_per_node),
        "logical_cpus": collect_logical_cpus(),
        "memory_bytes": collect_memory_bytes(),
        "memory_limit_bytes": collect_memory_limit(),
        "gpus": collect_gpus(),
        "torch": collect_torch(),
        "cuda": collect_cuda(),
        "python": collect_python(),
        "platform": collect_platform(),
        "shm_bytes": collect_shm_bytes(),
        "ranks_per_node": ranks_per_node,
    }
    hw["fingerprint"] = fingerprint(hw)
    return hw


# ---------------------------------------------------------------------------- identity


def _torch_minor(version: str | None) -> str | None:
    """"2.13.0+cu124" -> "2.13": patch releases do not change DataLoader behaviour."""
    if not version:
        return None
    parts = str(version).split("+")[0].split(".")
    return ".".join(parts[:2])


def _memory_gib(memory_bytes: int | None) -> int | None:
    """Whole GiB: the total reported by the kernel moves by a few MiB between boots."""
    if memory_bytes is None:
        return None
    return int(round(memory_bytes / _GIB))


def _limit_mib(limit_bytes: Any) -> int | None:
    """Whole MiB: a limit is set by hand or by a scheduler, exactly, and does not drift; a 1.2 GiB limit
    must not round to the same figure as a 1 GiB one."""
    if not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or limit_bytes <= 0:
        return None
    return int(round(limit_bytes / (1 << 20)))


def _effective_gib(ident: dict[str, Any]) -> float | None:
    """What the job may hold, in GiB: its limit where it has one, else the host's RAM."""
    if ident.get("memory_limit_mib") is not None:
        return float(ident["memory_limit_mib"]) / 1024
    return None if ident["memory_gib"] is None else float(ident["memory_gib"])


def identity(hw: dict[str, Any]) -> dict[str, Any]:
    """The stable facts that define a machine for the recipe: two runs on the same machine give
    the same identity; python patch level, platform string, /dev/shm size are left out. The job's
    memory limit is in it only when there is one, so a profile tuned without one (and every profile
    written before the field) keeps its fingerprint, and one tuned with 64 GiB is not this job's in 8."""
    out = {
        "cpu_model": hw.get("cpu_model"),
        "usable_cpus": hw.get("usable_cpus"),
        "memory_gib": _memory_gib(hw.get("memory_bytes")),
        "gpus": list(hw.get("gpus") or []),
        "torch": _torch_minor(hw.get("torch")),
        "cuda": hw.get("cuda"),
    }
    if (hw.get("ranks_per_node") or 1) > 1:  # only then: one rank's fingerprint stays what it always was
        out["ranks_per_node"] = hw["ranks_per_node"]
    limit = _limit_mib(hw.get("memory_limit_bytes"))
    if limit is not None:
        out["memory_limit_mib"] = limit
    return out


def fingerprint(hw: dict[str, Any]) -> str:
    """12 hex characters of sha256 over ``identity(hw)``."""
    blob = json.dumps(identity(hw), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


# ---------------------------------------------------------------------------- comparing


def format_gpus(gpus: list[str] | None) -> str:
    """["A", "A", "B"] -> "2x A, 1x B"; [] -> "none"."""
    if not gpus:
        return "none"
    return ", ".join(f"{count}x {name}" for name, count in Counter(gpus).items())


def format_bytes(n: int | float | None) -> str:
    return "unknown" if n is None else _format_bytes(n)


def _show(value: Any) -> str:
    return "none" if value is None else str(value)


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed from ``old`` to ``new``, in plain words, over the identity facts only, so the
    list is empty exactly when the fingerprints are equal.  e.g. ``["usable CPUs: 2 -> 8",
    "GPUs: none -> 1x NVIDIA H100", "torch: 2.13 -> 2.14"]``."""
    a, b = identity(old), identity(new)
    out: list[str] = []
    if a["cpu_model"] != b["cpu_model"]:
        out.append(f"CPU model: {_show(a['cpu_model'])} -> {_show(b['cpu_model'])}")
    if a["usable_cpus"] != b["usable_cpus"]:
        out.append(f"usable CPUs: {_show(a['usable_cpus'])} -> {_show(b['usable_cpus'])}")
    if a["memory_gib"] != b["memory_gib"]:
        old_mem = "unknown" if a["memory_gib"] is None else f"{a['memory_gib']} GiB"
        new_mem = "unknown" if b["memory_gib"] is None else f"{b['memory_gib']} GiB"
        out.append(f"memory: {old_mem} -> {new_mem}")
    if a.get("memory_limit_mib") != b.get("memory_limit_mib"):
        out.append(f"memory limit: {_show_limit(a)} -> {_show_limit(b)}")
    if a["gpus"] != b["gpus"]:
        out.append(f"GPUs: {format_gpus(a['gpus'])} -> {format_gpus(b['gpus'])}")
    if a["torch"] != b["torch"]:
        out.append(f"torch: {_show(a['torch'])} -> {_show(b['torch'])}")
    if a["cuda"] != b["cuda"]:
        out.append(f"CUDA: {_show(a['cuda'])} -> {_show(b['cuda'])}")
    if a.get("ranks_per_node", 1) != b.get("ranks_per_node", 1):
        out.append(f"ranks per node: {a.get('ranks_per_node', 1)} -> {b.get('ranks_per_node', 1)}")
    return out


def _show_limit(ident: dict[str, Any]) -> str:
    mib = ident.get("memory_limit_mib")
    return "none" if mib is None else _format_bytes(mib << 20)


def _log_ratio(x: Any, y: Any) -> float:
    """|log2(x / y)|, 1.0 when either side is unknown."""
    if not isinstance(x, (int, float)) or not isinstance(y, (int, float)) or x <= 0 or y <= 0:
        return 0.0 if x == y else 1.0
    return abs(math.log2(x / y))


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far apart two machines are for the purpose of reusing a recipe; 0.0 exactly when the
    identities are equal.  What decides the best loader most weighs most:

    - GPUs present on one side only: 8 (pinning, the consumer, everything changes); same count
      but other models: 1; other count: 2 plus the log2 of the count ratio;
    - usable CPUs: 3 per doubling or halving (the bound on ``num_workers``);
    - memory: 1 per doubling or halving (which caches fit), of what the job may hold (its limit, else
      the host's RAM); at least 0.1 when only the limit differs;
    - CPU model: 1; CUDA version: 0.5; torch minor version: 0.5.
    """
    x, y = identity(a), identity(b)
    d = 0.0
    gx, gy = x["gpus"], y["gpus"]
    if bool(gx) != bool(gy):
        d += 8.0
    elif len(gx) != len(gy):
        d += 2.0 + _log_ratio(len(gx), len(gy))
    elif gx != gy:
        d += 1.0
    d += 3.0 * _log_ratio(x["usable_cpus"], y["usable_cpus"])
    if x["memory_gib"] != y["memory_gib"]:
        # whole GiB, 0 GiB counts as 0.5 so a tiny machine still has a ratio; at least 0.1 so a
        # differing identity is never at distance 0
        mx = x["memory_gib"] if x["memory_gib"] != 0 else 0.5
        my = y["memory_gib"] if y["memory_gib"] != 0 else 0.5
        d += max(0.1, _log_ratio(mx, my))
    if x.get("memory_limit_mib") != y.get("memory_limit_mib"):
        d += max(0.1, _log_ratio(_effective_gib(x), _effective_gib(y)))
    if x["cpu_model"] != y["cpu_model"]:
        d += 1.0
    if x["cuda"] != y["cuda"]:
        d += 0.5
    if x["torch"] != y["torch"]:
        d += 0.5
    d += 3.0 * _log_ratio(x.get("ranks_per_node", 1), y.get("ranks_per_node", 1))  # like a CPU share
    return d


def describe(hw: dict[str, Any]) -> str:
    """One line: "AMD EPYC, 2 usable of 2 CPUs, 7.8 GiB, no GPU, torch 2.13 (CPU)"."""
    cpus = f"{_show(hw.get('usable_cpus'))} usable"
    if hw.get("logical_cpus"):
        cpus += f" of {hw['logical_cpus']}"
    gpus = format_gpus(hw.get("gpus"))
    gpus = "no GPU" if gpus == "none" else gpus
    torch = f"torch {_show(_torch_minor(hw.get('torch')))}"
    torch += f" (CUDA {hw['cuda']})" if hw.get("cuda") else " (CPU)"
    memory = format_bytes(hw.get("memory_bytes"))
    if _limit_mib(hw.get("memory_limit_bytes")) is not None:
        memory += f" (job limit {format_bytes(hw['memory_limit_bytes'])})"
    parts = [hw.get("cpu_model") or "unknown CPU", f"{cpus} CPUs", memory, gpus, torch]
    if (hw.get("ranks_per_node") or 1) > 1:
        parts.append(f"{hw['ranks_per_node']} ranks per node")
    return ", ".join(parts)
