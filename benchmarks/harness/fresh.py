"""The parent side of a fresh-process run: the environment a run starts with, and the launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune.process import ProcessSettings, get_allocator, launch_env
from harness import REPO


class RunFailed(RuntimeError):
    pass


def base_env() -> dict[str, str]:
    """This environment without allocator settings, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def allocator_env(allocator: str, *, at_start: bool = False) -> dict[str, str]:
    """The environment a run with ``allocator`` starts with.

    By default only a preload is set there (it only exists from the start; the recipe's factory applies
    glibc-tuned at run time). ``at_start=True`` sets every allocator in the environment, glibc-tuned's
    thresholds included, and refuses a fallback: for a run that measures the allocator itself.
    """
    if not at_start and not get_allocator(allocator).preloaded:
        return base_env()
    env, notes = launch_env(ProcessSettings(allocator=allocator), base_env())
    if notes and at_start:  # a fallback would measure the wrong thing
        raise SystemExit(f"{allocator}: {'; '.join(notes)}")
    if notes:
        print(f"note: {'; '.join(notes)}", file=sys.stderr)
    return env


def run_fresh(script: str | Path, cell: str, params: dict, *, epochs: int, memory: bool = False,
              env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    """Run one cell of ``script`` in a fresh Python process and return what it measured."""
    payload = json.dumps({"cell": cell, "params": params, "epochs": epochs, "memory": memory})
    out = subprocess.run([sys.executable, str(Path(script).resolve()), "--cell", payload], env=env or base_env(),
                         capture_output=True, text=True, timeout=timeout, cwd=str(REPO), check=False)
    lines = [line for line in out.stdout.strip().splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RunFailed(f"{cell} failed (exit {out.returncode}):\n{tail}")
    return json.loads(lines[-1])
