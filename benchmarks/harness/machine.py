"""The facts a result is quoted with, from autotune's own ``machine._hardware.collect`` (never re-collected)."""

from __future__ import annotations

import os
import platform
from typing import Any

from autotune.machine import _hardware as hardware
from autotune.process import availability


def facts(**extra: Any) -> dict[str, Any]:
    """CPU model, usable CPUs, memory, GPUs, torch, the one-line description, allocators, load; plus ``extra``."""
    hw = hardware.collect()
    keys = ("cpu_model", "usable_cpus", "logical_cpus", "memory_bytes", "gpus", "torch", "cuda", "platform",
            "fingerprint")
    return {**{k: hw.get(k) for k in keys}, "python": platform.python_version(), "described": hardware.describe(hw),
            "allocators": availability(), "load_average_1_5_15": list(os.getloadavg()), **extra}
