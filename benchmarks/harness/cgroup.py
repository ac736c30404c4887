"""A memory-limited cgroup of our own, as a container runtime makes one: v2 where the memory controller is
enabled, else v1; as root. ``MemoryCgroup.make`` says why it cannot (not root, no controller, a read-only
mount) instead of raising; the folder is always removed on leaving, after its processes are gone."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own(controller: str) -> str | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path
    return None


def _v2_parent() -> Path | None:
    """A v2 folder whose children may have the memory controller (the own cgroup's, else the mount's)."""
    for mount in (ROOT, ROOT / "unified"):
        if not (mount / "cgroup.controllers").is_file():
            continue
        rel = (_own("") or "/").strip("/")
        for folder in (mount / rel, mount):
            try:
                if "memory" in (folder / "cgroup.subtree_control").read_text().split():
                    return folder
            except OSError:
                continue
    return None


def _v1_parent() -> Path | None:
    mount = ROOT / "memory"
    if not (mount / "memory.limit_in_bytes").is_file():
        return None
    rel = (_own("memory") or "/").strip("/")
    folder = mount / rel
    return folder if folder.is_dir() else mount


@dataclass
class MemoryCgroup:
    folder: Path
    version: int  # 1 or 2
    limit: int

    @property
    def procs(self) -> Path:
        return self.folder / "cgroup.procs"

    def prefix(self) -> list[str]:
        """A command prefix that moves the process into this cgroup before it execs the command."""
        return ["sh", "-c", f'echo $$ > "{self.procs}" && exec "$@"', "sh"]

    def oom_kills(self) -> int:
        """The kernel's OOM kills in this cgroup so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.folder / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.folder / name).read_text())
        except (OSError, ValueError):
            return None

    def describe(self) -> str:
        kind = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        return f"cgroup v{self.version} {self.folder} ({kind} = {self.limit / (1 << 30):.2f} GiB)"

    @staticmethod
    def why_not() -> str | None:
        """Why this machine cannot make a memory cgroup here, or None when it can."""
        if os.geteuid() != 0:
            return "not root: making a cgroup needs root"
        if _v2_parent() is None and _v1_parent() is None:
            return "no cgroup memory controller (neither v2 with memory enabled nor a v1 memory mount)"
        return None

    @classmethod
    @contextlib.contextmanager
    def make(cls, limit: int, name: str = "autotune") -> Iterator[MemoryCgroup]:
        """A child cgroup limited to ``limit`` bytes (swap too, so the limit is the memory's); removed after."""
        why = cls.why_not()
        if why:
            raise OSError(why)
        parent, version = (_v2_parent(), 2)
        if parent is None:
            parent, version = _v1_parent(), 1
        assert parent is not None
        folder = parent / f"{name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        try:
            if version == 2:
                (folder / "memory.max").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (folder / "memory.swap.max").write_text("0")
            else:
                (folder / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (folder / "memory.memsw.limit_in_bytes").write_text(str(limit))
            yield cls(folder, version, limit)
        finally:
            cls._remove(folder)

    @staticmethod
    def _remove(folder: Path) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                for pid in (folder / "cgroup.procs").read_text().split():  # a straggler of our own command
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
                time.sleep(0.1)
