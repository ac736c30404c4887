"""The backend registry, the need estimate, open-or-build, and the on-disk cache directory."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Sequence

from autotune.caches._base import (
    Cache, CorruptCache, StaleCache, as_json, indices_digest, read_manifest,
)
from autotune.caches._hdf5 import Hdf5Cache
from autotune.caches._lmdb import LmdbCache, record_disk_bytes
from autotune.caches._memory import MemoryCache
from autotune.caches._pickle import PickleCache
from autotune.errors import AutotuneError

BACKENDS = ("memory", "pickle", "hdf5", "lmdb")
_CLASSES: dict[str, type[Cache]] = {
    "memory": MemoryCache, "pickle": PickleCache, "hdf5": Hdf5Cache, "lmdb": LmdbCache,
}
DEFAULT_ROOT = Path(".autotune/cache")


class CacheRebuildWarning(UserWarning):
    """A cache on disk was stale or corrupt and is being rebuilt."""


def get_backend(name: str) -> type[Cache]:
    try:
        return _CLASSES[name]
    except (KeyError, TypeError):
        raise AutotuneError(f"Unknown cache backend {name!r}. Valid backends: {', '.join(BACKENDS)}.") from None


def estimate_need(name: str, bytes_per_sample: float, n: int) -> tuple[int, int]:
    """(RAM bytes, disk bytes) a ``name`` cache of ``n`` samples of ``bytes_per_sample`` needs."""
    get_backend(name)
    payload = float(bytes_per_sample) * n
    if name == "memory":  # the buffers, offsets, and the build's one-time copy of the blob bytes
        return int(payload * 1.05 + 17 * n + (1 << 20)), 0
    if name == "pickle":
        return 0, int(payload * 1.02 + 16 * n + (1 << 20))
    if name == "hdf5":
        return 0, int(payload * 1.1 + 64 * n + (4 << 20))
    return 0, int(record_disk_bytes(bytes_per_sample + 32) * n * 1.1 + (4 << 20))


def expected_manifest(manifest: dict, indices: Sequence[int]) -> dict:
    """The caller's manifest plus the length and a hash of the stored indices."""
    return {**as_json(manifest), "length": len(indices), "indices": indices_digest(indices)}


def cache_path(name: str, root: Path | str, manifest: dict, full: bool = True) -> Path:
    """``root/<backend>-<key>``: key is ``manifest['key']`` (a stable dataset identity: a changed dataset
    then replaces its old cache), else the fingerprint; a subset of indices gets its own directory."""
    key = str(manifest.get("key") or manifest.get("fingerprint") or indices_digest([len(str(manifest))]))
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("._")[:64] or "cache"
    if not full:
        key += "-" + str(manifest.get("indices", ""))[:8]
    return Path(root) / f"{name}-{key}"


def open_or_build(name: str, dataset: Any, *, root: Path | str = DEFAULT_ROOT, manifest: dict,
                  indices: Sequence[int] | None = None, progress: bool = True, workers: int = 0) -> Cache:
    """Reuse the valid ``name`` cache under ``root``; build it when missing, stale or corrupt (with a
    warning that says why). The memory backend always builds."""
    cls = get_backend(name)
    full = indices is None
    indices = range(len(dataset)) if indices is None else indices
    expected = expected_manifest(manifest, indices)
    if cls is MemoryCache:
        return cls.build(dataset, indices, None, manifest=expected, progress=progress, workers=workers)
    path = cache_path(name, root, expected, full=full)
    if path.exists():
        try:
            return cls.open(path, manifest=expected)
        except StaleCache as exc:
            warnings.warn(f"{exc} Rebuilding it.", CacheRebuildWarning, stacklevel=2)
        except CorruptCache as exc:
            warnings.warn(f"{exc} Rebuilding it.", CacheRebuildWarning, stacklevel=2)
    return cls.build(dataset, indices, path, manifest=expected, progress=progress, workers=workers)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _entry(path: Path) -> dict | None:
    name = path.name
    if name.startswith("."):
        m = re.match(r"\.(\w+)-.*\.(tmp|old)-[^.]+$", name)
        if not m or m.group(1) not in BACKENDS:
            return None
        return {"backend": m.group(1), "path": str(path), "samples": None, "nbytes": _dir_bytes(path),
                "fingerprint": None, "built": None, "status": "partial",
                "reason": "an unfinished or interrupted build"}
    backend = name.split("-", 1)[0]
    if backend not in BACKENDS or backend == "memory":
        return None
    entry = {"backend": backend, "path": str(path), "samples": None, "nbytes": _dir_bytes(path),
             "fingerprint": None, "built": None, "status": "valid", "reason": ""}
    try:
        stored = read_manifest(path)
        entry.update(samples=stored.get("length"), fingerprint=stored["expected"].get("fingerprint"),
                     built=stored.get("built"))
        get_backend(backend).open(path, manifest=stored["expected"])
    except StaleCache as exc:
        entry.update(status="stale", reason=str(exc))
    except (CorruptCache, AttributeError, OSError) as exc:
        entry.update(status="corrupt", reason=str(exc))
    return entry


def list_caches(root: Path | str = DEFAULT_ROOT) -> list[dict]:
    """Every cache directory under ``root``: backend, path, samples, nbytes, fingerprint, built, status
    (valid / stale / corrupt / partial) and reason."""
    root = Path(root)
    if not root.is_dir():
        return []
    entries = (_entry(p) for p in sorted(root.iterdir()) if p.is_dir())
    return [e for e in entries if e is not None]


def clear_caches(root: Path | str = DEFAULT_ROOT, backend: str | None = None) -> int:
    """Delete the caches (and leftovers of interrupted builds) under ``root``; how many were removed."""
    if backend is not None:
        get_backend(backend)
    removed = 0
    for entry in list_caches(root):
        if backend is None or entry["backend"] == backend:
            shutil.rmtree(entry["path"], ignore_errors=True)
            removed += 1
    return removed
