"""The backend registry, the need estimate, open-or-build, and the caches under a root (list, clear)."""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune._units import format_bytes
from autotune.caches import _hdf5, _lmdb, _memory, _pickle  # noqa: F401  # the built-in backends register
from autotune.caches._base import (
    MANIFEST_NAME,
    TEMP_KINDS,
    Cache,
    as_json,
    indices_digest,
    is_manifest,
    place_for,
    set_aside,
    takes,
    try_open,
)
from autotune.caches._codec import sample_nbytes
from autotune.caches._disk_fill import LOCK as FILL_LOCK
from autotune.caches._disk_fill import DiskFill, active_fill
from autotune.caches._family import backend as get_backend
from autotune.caches._family import folder_pattern, names
from autotune.caches._key import describe_change, kinship
from autotune.caches._lease import in_use
from autotune.caches._lock import BuildLock, is_free, lock_path
from autotune.caches._own import MARKER, is_marked, is_own, remove_own
from autotune.caches._trials import TRIAL_LOCK, is_leftover
from autotune.caches._trust import (
    KEY_NAME,
    KEY_TMP_PREFIX,
    TAG_NAME,
    TAG_TMP_PREFIX,
    default_root,
    ensure_root,
    trust_problem,
)

log = logging.getLogger("autotune")


class CacheRebuildWarning(UserWarning):
    """A cache on disk was stale or corrupt and is being rebuilt."""


def estimate_need(name: str, bytes_per_sample: float, n: int) -> tuple[int, int]:
    """(RAM bytes, disk bytes) a ``name`` cache of ``n`` samples of ``bytes_per_sample`` needs."""
    return get_backend(name).estimate_need(bytes_per_sample, n)


def expected_manifest(manifest: dict[str, Any], indices: Sequence[int]) -> dict[str, Any]:
    """The caller's manifest plus the length and a hash of the stored indices."""
    return {**as_json(manifest), "length": len(indices), "indices": indices_digest(indices)}


def _label(manifest: dict[str, Any]) -> str:
    key = str(manifest.get("key") or manifest.get("fingerprint") or "cache")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("._-")[:64] or "cache"


def cache_path(name: str, root: Path | str, expected: dict[str, Any]) -> Path:
    """``root/<backend>-<label>-<digest>``: the label is the manifest's ``key`` (else its fingerprint),
    the digest covers the whole expected manifest, so another dataset, another version of one, or
    another subset of indices never shares a directory (see NOTE [cache build lock] in ``_lock``)."""
    digest = hashlib.blake2b(json.dumps(as_json(expected), sort_keys=True).encode(), digest_size=6).hexdigest()
    return Path(root) / f"{name}-{_label(expected)}-{digest}"


def _age(built: str | None) -> str:
    try:
        then = _dt.datetime.fromisoformat(str(built))
    except ValueError:
        return "at an unknown time"
    seconds = max(0.0, (_dt.datetime.now(_dt.UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _read_json(path: Path) -> Any:
    try:
        return json.loads((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def _previous(path: Path, name: str, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The other cache of the same backend and dataset class (same label) that this dataset most looks
    like a changed version of, if any: a train and a val set of one class share nothing (``kinship``)."""
    prefix = f"{name}-{_label(expected)}-"
    found = []
    for other in path.parent.glob(prefix + "*"):
        if other == path or not other.is_dir() or other.name.count("-") != path.name.count("-"):
            continue
        stored = _read_json(other)  # JSON only: a manifest is never decoded as a payload
        if is_manifest(stored) and isinstance(stored.get("expected"), dict):
            shared = kinship(stored["expected"], expected)
            if shared or "probes" not in expected:
                found.append((shared, str(stored.get("built")), stored))
    return max(found, key=lambda x: x[:2])[2] if found else None


def _remove_dead_builds(root: Path, name: str) -> None:
    """Temp directories of ``name``'s builders, and staging folders of its fills, whose processes
    died; call only holding its build lock (a live fill holds no build lock, but its own: ``_busy``)."""
    for leftover in root.glob(f".{name}.*-*"):
        m = _temp_match(leftover.name)
        if not (m and m.group(1) == name and is_own(leftover)):
            continue
        if m.group(2) != "fill" or not _busy(leftover, m):  # the build lock is ours: a tmp's builder died
            remove_own(leftover)


def _busy(path: Path, m: re.Match[str]) -> bool:
    """Whether the temp folder ``path`` (matched by ``_temp_match``) is in use: a build holding the cache's
    build lock, or a first-epoch fill holding its own lock (``_disk_fill``)."""
    if m.group(2) == "fill":
        return not is_free(path / FILL_LOCK)
    return not is_free(lock_path(path.parent, m.group(1)))


def open_or_fill(name: str, dataset: Any, *, root: Path | str | None = None,
                 manifest: dict[str, Any]) -> Cache | DiskFill:
    """The ``name`` disk cache of the whole ``dataset`` under ``root``, opened when one is there (as
    ``open_or_build`` would), else a fill of it that the loader's first epoch performs (``_disk_fill``);
    this process's fill in progress when there is one, so two loaders of one dataset share it."""
    cls = get_backend(name)
    if cls.in_memory:
        raise ValueError(f"The {name} cache's first-epoch fill is autotune.caches._fill.FirstEpochCache.")
    expected = expected_manifest(manifest, range(len(dataset)))
    root = ensure_root(root)
    path = cache_path(name, root, expected)
    cache, why = try_open(cls, path, expected)
    if cache is not None:
        return _reused(cache, name, path)
    fill = active_fill(path)
    if fill is not None:
        return fill
    _warn_anew(why, path, name, expected, "filling", "during the first epoch")
    return DiskFill(name, dataset, path, expected)


def _reused(cache: Cache, name: str, path: Path) -> Cache:
    cache.origin = "reused"
    log.info("autotune: reusing the %s cache %s (%d samples, built %s)", name, path, len(cache),
             _age(cache.manifest.get("built")))
    return cache


def _warn_anew(why: str, path: Path, name: str, expected: dict[str, Any], doing: str, when: str = "") -> None:
    """Say why a cache is made anew: the one there was invalid (``why``), or the dataset changed since
    a cache of what looks like its earlier version was made."""
    when = f" {when}" if when else ""
    if why:
        warnings.warn(f"{why} {doing.capitalize()} it anew{when}.", CacheRebuildWarning, stacklevel=3)
        return
    previous = _previous(path, name, expected)
    if previous is not None:
        warnings.warn(
            f"The dataset changed since its {name} cache was built {_age(previous.get('built'))} "
            f"({describe_change(previous['expected'], expected)}): {doing} a new cache{when}; "
            "`autotune cache clear` removes the old one.", CacheRebuildWarning, stacklevel=3)


def open_or_build(name: str, dataset: Any, *, root: Path | str | None = None, manifest: dict[str, Any],
                  indices: Sequence[int] | None = None, progress: bool = True, workers: int = 0,
                  meanwhile: Callable[[list[int]], None] | None = None) -> Cache:
    """Open the ``name`` cache of ``dataset`` under ``root`` (default: the per-user cache folder) or
    build it, once however many processes ask (NOTE [cache build lock] in ``_lock``).

    ``manifest`` is what the cache is checked against (``_key.dataset_key`` for a whole dataset); its
    ``probes`` are compared with the cache's samples at every open. A changed dataset gets a new
    directory, with a warning naming what changed. The memory backend always builds; ``meanwhile`` goes to
    its build (what this process does while the build's workers decode; a disk build writes then)."""
    cls = get_backend(name)
    full = indices is None
    indices = range(len(dataset)) if indices is None else indices
    expected = expected_manifest(manifest, indices)
    if not full:
        expected.pop("probes", None)  # probes are indices of the whole dataset
    if cls.in_memory:
        extra = {"meanwhile": meanwhile} if meanwhile is not None and takes(cls.build, "meanwhile") else {}
        return cls.build(dataset, indices, None, manifest=expected, progress=progress, workers=workers, **extra)
    root = ensure_root(root)
    path = cache_path(name, root, expected)
    cache, _ = try_open(cls, path, expected)
    if cache is not None:
        return _reused(cache, name, path)
    lock = BuildLock(lock_path(root, path.name))
    bar: Any = None

    def waiting(holder: str, seconds: float) -> None:
        nonlocal bar
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(desc=f"Waiting for {holder} to build the {name} cache", unit="s", leave=False,
                       bar_format="{desc}: {elapsed}")
        bar.refresh()

    lock.acquire(on_wait=waiting if progress else None)
    try:
        if bar is not None:
            bar.close()
        cache, why = try_open(cls, path, expected)
        if cache is not None:  # built by the process we waited for
            cache.origin = "waited"
            log.info("autotune: opened the %s cache %s another process built", name, path)
            return cache
        _remove_dead_builds(root, path.name)
        _warn_anew(why, path, name, expected, "building")
        target = place_for(path) if why else path
        _check_room(name, dataset, indices, root)
        return cls.build(dataset, indices, target, manifest=expected, progress=progress, workers=workers)
    finally:
        lock.release()


def _check_room(name: str, dataset: Any, indices: Sequence[int], root: Path) -> None:
    """Refuse (OSError ENOSPC, nothing written) a build whose estimated size, from one sample, exceeds the free
    space of ``root``: a library that runs out of disk mid-write does not always fail cleanly (h5py prints
    its destructors' errors, and HDF5 itself crashed here on a full tmpfs)."""
    need = estimate_need(name, sample_nbytes(dataset[indices[0]]), len(indices))[1]
    free = shutil.disk_usage(root).free
    if need > free:
        raise OSError(errno.ENOSPC, f"No space left on device: the {name} cache needs ~{format_bytes(need)}, "
                      f"{format_bytes(free)} free in {root}")


# -------------------------------------------------------------------------------- list and clear
def _temp_match(name: str) -> re.Match[str] | None:
    """``_base.temp_name``'s parts (cache, kind, pid) of a registered disk backend's temporary folder."""
    return re.match(rf"^\.({folder_pattern()})\.({'|'.join(TEMP_KINDS)})-(-?\d+)-[0-9a-f]+$", name)


def _lock_match(name: str) -> re.Match[str] | None:
    """``_lock.lock_path``'s cache name of a registered disk backend's build lock."""
    return re.match(rf"^\.({folder_pattern()})\.lock$", name)


_TRIAL = re.compile(r"^trial-[A-Za-z0-9_.-]+$")  # caches/_trials.py names them


def _dir_bytes(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:
            st = f.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def _trial_bookkeeping(path: Path) -> bool:
    """A trial folder's own small files: the trial's lock and, where its ranks share a disk cache built
    through ``open_or_build``, the folder's tag and the cache's build lock."""
    if path.name in (TRIAL_LOCK, TAG_NAME, KEY_NAME, MARKER) or path.name.startswith((TAG_TMP_PREFIX, KEY_TMP_PREFIX)):
        return path.is_file() and not path.is_symlink()
    return bool(_lock_match(path.name)) and path.is_file() and not path.is_symlink()


def _owned(path: Path) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _classify(path: Path) -> dict[str, Any]:
    """What ``path`` is, from names, modes and manifests only: no payload is ever read."""
    entry: dict[str, Any] = {"backend": None, "path": str(path), "samples": None, "nbytes": None,
                             "dataset": None, "built": None, "status": "foreign", "reason": "", "kind": "foreign"}
    if path.is_symlink() or not path.is_dir():
        entry["reason"] = "not a folder autotune made"
        return entry
    m = _temp_match(path.name)
    if m and not is_marked(path):
        entry["reason"] = "named like autotune's temporary folders, but not marked as its own"
        return entry
    if m:
        busy = _busy(path, m)
        what = "fill during a first epoch" if m.group(2) == "fill" else "build"
        entry.update(kind="temp", backend=m.group(1).split("-", 1)[0], nbytes=_dir_bytes(path),
                     status="building" if busy else "partial",
                     reason=f"a {what} in progress" if busy else f"an unfinished or interrupted {what}")
        return entry
    if _TRIAL.match(path.name) and not is_marked(path):
        entry["reason"] = "named like autotune's trial folders, but not marked as its own"
        return entry
    if _TRIAL.match(path.name):
        inner = [_classify(p) for p in sorted(path.iterdir()) if not _trial_bookkeeping(p)]
        if all(e["kind"] != "foreign" for e in inner):
            # held by its trial, or made by a search still running (before its trial took the lock)
            busy = not is_free(path / TRIAL_LOCK) or not is_leftover(path)
            entry.update(kind="trial", nbytes=_dir_bytes(path), status="trial running" if busy else "trial leftover",
                         backend=",".join(sorted({e["backend"] for e in inner if e["backend"]})) or None)
            return entry
        entry["reason"] = "a trial folder holding files autotune did not write"
        return entry
    stored = _read_json(path)  # JSON, never a payload
    if not is_manifest(stored):
        entry["reason"] = "no autotune manifest"
        return entry
    backend = stored.get("backend")
    expected = stored.get("expected") if isinstance(stored.get("expected"), dict) else {}
    entry.update(kind="cache", backend=backend if backend in names() else None, samples=stored.get("length"),
                 nbytes=_dir_bytes(path), dataset=expected.get("key") or expected.get("fingerprint"),
                 built=stored.get("built"), status="valid")
    problem = trust_problem(path)
    if problem is not None:
        entry.update(status="untrusted", reason=problem)
        return entry
    files = stored.get("files") if isinstance(stored.get("files"), dict) else {}
    for name, size in files.items():
        f = path / str(name)
        actual = f.stat().st_size if f.is_file() and not f.is_symlink() else None
        if actual != size:
            entry.update(status="corrupt", reason=f"{f} has {actual} bytes, the manifest says {size}")
            break
    entry["in_use"] = in_use(path)  # a loader reads it: `cache clear` leaves it
    return entry


def list_caches(root: Path | str | None = None) -> list[dict[str, Any]]:
    """Everything in ``root`` (default: the per-user cache folder), judged from names, modes and JSON
    manifests only: backend, path, samples, nbytes, dataset, built, status (valid / corrupt / untrusted
    / partial / building / trial leftover / trial running / foreign), reason, and for a cache whether a
    loader reads it now (``in_use``: its lease is held)."""

    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        return []
    return [_classify(p) for p in sorted(root.iterdir())
            if p.name not in (TAG_NAME, KEY_NAME) and not (_lock_match(p.name) and p.is_file())]


def clear_caches(root: Path | str | None = None, backend: str | None = None) -> dict[str, list[str]]:
    """Delete autotune's own folders under ``root``: caches (with a manifest), unfinished builds and
    trial leftovers nobody holds, and lock files left alone. Returns {"removed": paths, "foreign":
    folders that are not autotune's (untouched), "busy": builds or trials in progress (untouched),
    "in_use": caches a loader is reading (their lease is held: untouched),
    "not_owned": autotune folders of another user (untouched)}."""

    if backend is not None:
        get_backend(backend)
    root = Path(root) if root is not None else default_root()
    result: dict[str, list[str]] = {"removed": [], "foreign": [], "busy": [], "in_use": [], "not_owned": []}
    for entry in list_caches(root):
        path = Path(entry["path"])
        if entry["kind"] == "foreign":
            result["foreign"].append(str(path))
            continue
        if backend is not None and backend not in str(entry["backend"] or "").split(","):
            continue
        if entry["status"] in ("building", "trial running"):
            result["busy"].append(str(path))
            continue
        if not _owned(path):
            result["not_owned"].append(str(path))
            continue
        if entry["kind"] == "cache":
            if not set_aside(path):  # a loader holds its lease (``_lease``)
                result["in_use"].append(str(path))
                continue
        elif not remove_own(path):
            result["foreign"].append(str(path))
            continue
        result["removed"].append(str(path))
    if root.is_dir():
        for f in root.iterdir():  # lock files of caches that are gone, taken first (NOTE [cache build lock])
            m = _lock_match(f.name)
            if m and f.is_file() and not (root / m.group(1)).exists() and _owned(f):
                lock = BuildLock(f)
                if lock.try_acquire():
                    try:
                        f.unlink()
                    finally:
                        lock.release()
    return result
