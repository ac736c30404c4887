"""Module-level datasets over real files for the eviction and validation tests (they pickle into workers)."""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset

from autotune.machine._evict import resident_fraction


class FileSamples(Dataset):
    """Sample i is the bytes of ``paths[i]`` as a uint8 tensor, and i."""

    def __init__(self, paths):
        self.paths = [str(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)[:64].clone(), i


class OneBigFile(Dataset):
    """Every sample is a slice of one shared file, as with an HDF5 or npy container."""

    def __init__(self, path, n: int, size: int = 4096):
        self.path, self.n, self.size = str(path), n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        with open(self.path, "rb") as f:
            f.seek(i * self.size)
            return torch.frombuffer(bytearray(f.read(self.size)), dtype=torch.uint8)[:8].clone()


class HiddenPaths(Dataset):
    """Paths built from a name pattern, not kept in a list: only recording every read finds them."""

    def __init__(self, folder, n: int):
        self.folder, self.n = str(folder), n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        with open(os.path.join(self.folder, f"s{i:03d}.bin"), "rb") as f:
            return len(f.read())


def write_files(folder, count: int, size: int, prefix: str = "s") -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(folder, f"{prefix}{i:03d}.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(size))
            f.flush()
            os.fsync(f.fileno())  # clean pages: eviction can drop them
        paths.append(path)
    return paths


def page_cache_is_droppable(path) -> bool:
    """False on tmpfs/ramfs, where file pages are memory and posix_fadvise cannot drop them."""
    best, fstype = "", ""
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount = parts[1]
            if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fstype = mount, parts[2]
    return fstype not in ("tmpfs", "ramfs")


class ColdnessLog(FileSamples):
    """FileSamples that appends, for every read, the index and whether its file was still out of the
    page cache (under half resident) just before the read, to ``log`` (one line each, any process)."""

    def __init__(self, paths, log):
        super().__init__(paths)
        self.log = str(log)

    def __getitem__(self, i: int):
        fraction = resident_fraction(self.paths[i])
        with open(self.log, "a") as f:
            f.write(f"{i} {'cold' if fraction is not None and fraction < 0.5 else 'warm'}\n")
        return super().__getitem__(i)
