"""What a full cache of a dataset is checked against: the dataset's identity and a content key.

- identity: the dataset's class and its scalar attributes (``root="…/train"``, ``split="val"``);
- content: the length, the text of the dataset's file and of the user's modules it imports,
  everything else it holds in memory (dicts of labels, frames, arrays, a transform's parameters:
  ``_contents``), the source files its probed reads open (path, size, mtime_ns), and the digests of
  a seeded random sample of indices, read from the live dataset every time a cache is opened.

The cache's directory name hashes all of it (see NOTE [cache build lock] in ``_lock``), so a train
and a val set, or two versions of one dataset, never share a directory. The key is the first line;
the second is the cache's own record of every source file its samples were read from, checked at
every open (``_provenance``). What neither sees is said once (``CacheKeyWarning``): objects whose
contents cannot be read, and files read by native code that opens and closes them inside one call,
unless ``data_dir`` names their folder.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import sys
import sysconfig
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autotune.caches._codec import sample_digest
from autotune.caches._contents import Contents
from autotune.machine import _evict

PROBES = 16  # indices read live at every open; a dataset this small is checked whole
_MAX_LISTED = 2000  # source files listed one by one in the manifest (more: a digest and totals)
_MAX_MODULES = 64
_SCALARS = (str, int, float, bool, type(None), Path)
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1]) + os.sep


def probe_indices(length: int, count: int = PROBES) -> list[int]:
    """A seeded random sample of ``count`` indices (all of them when the dataset is that small)."""
    if length <= count:
        return list(range(length))
    return sorted(random.Random(f"autotune-probe:{length}").sample(range(length), count))


def _digest(obj: Any, size: int = 8) -> str:
    return hashlib.blake2b(json.dumps(obj, sort_keys=True, default=str).encode(), digest_size=size).hexdigest()


def _library_roots() -> tuple[str, ...]:
    roots = {os.path.realpath(p) for k, p in sysconfig.get_paths().items()
             if k in ("stdlib", "platstdlib", "purelib", "platlib") and p}
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots))


_LIBRARY_ROOTS = _library_roots()


def _user_file(module: Any) -> str | None:
    """The module's source file when it is the user's code (not Python's, a package's or autotune's)."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    real = os.path.realpath(path)
    if real.startswith((*_LIBRARY_ROOTS, _PACKAGE_DIR)) or "-packages" + os.sep in real:
        return None
    return real if os.path.isfile(real) else None


def _datasets(dataset: Any, depth: int = 2) -> Iterable[Any]:
    """The dataset and the datasets it wraps (``Subset.dataset``, ``ConcatDataset.datasets``)."""
    yield dataset
    if depth <= 0:
        return
    try:
        items = vars(dataset)
    except TypeError:
        return
    for value in items.values():
        values = value if isinstance(value, (list, tuple)) and len(value) <= 16 else [value]
        for v in values:
            if _is_dataset(v):
                yield from _datasets(v, depth - 1)


# Containers of data, never datasets wrapped by another: their contents are read whole (``_contents``).
_DATA_PACKAGES = frozenset({"numpy", "torch", "pandas", "datasets", "pyarrow", "h5py", "lmdb", "builtins"})


def _is_dataset(v: Any) -> bool:
    import torch.utils.data

    if isinstance(v, torch.utils.data.Dataset):
        return True
    return (hasattr(v, "__getitem__") and hasattr(v, "__len__") and not isinstance(v, (*_SCALARS, bytes))
            and type(v).__module__.split(".")[0] not in _DATA_PACKAGES)


def source_files(dataset: Any) -> dict[str, str]:
    """{path: sha256 of its text} for the files defining the dataset's classes and the user's modules
    they import (followed through their imports)."""
    seen: dict[str, str] = {}
    queue = [sys.modules.get(type(d).__module__) for d in _datasets(dataset)]
    visited: set[int] = set()
    while queue and len(seen) < _MAX_MODULES:
        module = queue.pop()
        if module is None or id(module) in visited:
            continue
        visited.add(id(module))
        path = _user_file(module)
        if path is None:
            continue
        try:
            seen[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
        except OSError:
            continue
        for value in list(vars(module).values()):
            owner = getattr(value, "__module__", None) or ""
            target = value if type(value).__name__ == "module" else sys.modules.get(owner)
            if target is not None and id(target) not in visited:
                queue.append(target)
    return dict(sorted(seen.items()))


def identity(dataset: Any) -> dict[str, Any]:
    """The dataset's class and its scalar attributes: what tells a train set from a val set."""
    cls = type(dataset)
    try:
        attrs = {k: (str(v) if isinstance(v, Path) else v) for k, v in sorted(vars(dataset).items())
                 if isinstance(v, _SCALARS) and not k.startswith("__")}
    except TypeError:
        attrs = {}
    inner = [f"{type(d).__module__}.{type(d).__qualname__}" for d in list(_datasets(dataset))[1:]]
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "attrs": attrs, "wraps": inner}


def in_memory_data(dataset: Any) -> tuple[dict[str, str], Contents]:
    """{attribute: digest} for everything the dataset (and each dataset it wraps) holds in memory beyond
    its scalar attributes (those are its identity), whatever the container (``_contents``): a change
    anywhere in it, not only at the probed samples, is seen. Also the walk, saying what it could not read."""
    contents = Contents()
    found: dict[str, str] = {}
    datasets = list(_datasets(dataset))
    inner = {id(d) for d in datasets[1:]}
    for depth, d in enumerate(datasets):
        try:
            items = sorted(vars(d).items())
        except TypeError:
            continue
        for name, value in items:
            if isinstance(value, _SCALARS) or id(value) in inner:
                continue
            found[f"{depth}.{name}"] = contents.digest(value, name)
    return found, contents


_said: set[str] = set()


def _say_unread(dataset: Any, contents: Contents) -> None:
    """One line, once per dataset class and process, naming what its key could not read."""
    cls = type(dataset).__qualname__
    parts = [*contents.unreadable, *(f"{n} (too large: sampled)" for n in contents.partial)]
    if not parts or cls in _said:
        return
    _said.add(cls)
    shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
    warnings.warn(f"autotune cannot read all that {cls} holds in memory ({shown}), so its cache would not see a "
                  "change there: pass data_dir= naming the folder its data comes from, or cache=None.",
                  CacheKeyWarning, stacklevel=3)


class CacheKeyWarning(UserWarning):
    """Part of a dataset cannot be part of its cache's key."""


def _stat(paths: Iterable[str]) -> dict[str, list[int]]:
    found = {}
    for p in sorted(set(paths)):
        try:
            st = os.stat(p)
        except OSError:
            continue
        found[p] = [st.st_size, st.st_mtime_ns]
    return found


def _files(dataset: Any, length: int, per_read: list[set[str]], data_dir: str | os.PathLike[str] | None
           ) -> tuple[dict[str, list[int]], str]:
    """The source files and how they were found (the rules of ``machine._evict.dataset_files``)."""

    if data_dir is not None:
        return _stat(_evict.files_under(data_dir)), "data_dir"
    if not any(per_read):
        return {}, "none found"
    if len(per_read) > 1 and all(files == per_read[0] for files in per_read):
        return _stat(per_read[0]), "shared"
    indices = probe_indices(length)
    for candidates in _evict._path_lists(dataset, length):
        if all(files == {_evict._as_path(candidates[i])} for i, files in zip(indices, per_read)):
            return _stat(p for p in map(_evict._as_path, candidates) if p is not None), "path list"
    return _stat(set().union(*per_read)), "probed reads only"


def _recorded_reads(dataset: Any, indices: list[int]) -> tuple[list[Any], list[set[str]]]:
    """``dataset[i]`` for each index and the data files each read opened (``machine._evict.record_files``)."""
    samples, files = [], []
    for i in indices:
        sample, opened = _evict.record_files(functools.partial(dataset.__getitem__, i))
        samples.append(sample)
        files.append(opened)
    return samples, files


def dataset_key(dataset: Any, *, data_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The manifest a full cache of ``dataset`` is stored under and checked against (JSON-ready):
    ``key`` (a readable, unique label), ``identity``, ``facts`` (what may change) and ``probes``."""
    length = len(dataset)
    indices = probe_indices(length)
    samples, per_read = _recorded_reads(dataset, indices)
    probes = {str(i): sample_digest(sample).hex()[:32] for i, sample in zip(indices, samples)}
    files, how = _files(dataset, length, per_read, data_dir)
    ident = identity(dataset)
    data, contents = in_memory_data(dataset)
    _say_unread(dataset, contents)
    facts: dict[str, Any] = {"length": length, "code": source_files(dataset), "data": data,
                             "files_found": how,
                             "files_count": len(files), "files_bytes": sum(s for s, _ in files.values()),
                             "files_digest": _digest(files, 16)}
    if len(files) <= _MAX_LISTED:
        facts["files"] = files
    if data_dir is not None:
        facts["data_dir"] = os.path.abspath(os.fspath(data_dir))
    label = type(dataset).__name__[:32]
    return {"key": f"{label}-{_digest(ident)}", "identity": ident, "facts": facts, "probes": probes}


def kinship(old: dict[str, Any], new: dict[str, Any]) -> int:
    """How much two ``dataset_key`` manifests share (source files, equal probed samples): 0 means two
    different datasets of one class (a train and a val set), more means one dataset that changed."""
    a, b = old.get("facts", {}), new.get("facts", {})
    files = len(set(a.get("files") or {}) & set(b.get("files") or {}))
    if not files and a.get("files_count") and a.get("files_digest") == b.get("files_digest"):
        files = int(a["files_count"])
    pa, pb = old.get("probes", {}), new.get("probes", {})
    return files + sum(1 for i in set(pa) & set(pb) if pa[i] == pb[i])


def describe_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between two ``dataset_key`` manifests, in a few words ("labels.json modified; …")."""
    parts: list[str] = []
    a, b = old.get("facts", {}), new.get("facts", {})
    if a.get("length") != b.get("length"):
        parts.append(f"length {a.get('length')} -> {b.get('length')}")
    for what, key in (("code", "code"), ("file", "files"), ("in-memory data", "data")):
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            continue
        changed = sorted(p for p in set(x) & set(y) if x[p] != y[p])
        added, removed = sorted(set(y) - set(x)), sorted(set(x) - set(y))
        for label, names in (("modified", changed), ("added", added), ("removed", removed)):
            if names:
                shown = ", ".join(os.path.basename(n).split(".", 1)[-1] if key == "data" else os.path.basename(n)
                                  for n in names[:3])
                more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                plural = "s" if len(names) > 1 and key != "data" else ""
                parts.append(f"{what}{plural} {label}: {shown}{more}")
    if a.get("files_digest") != b.get("files_digest") and ("files" not in a or "files" not in b):
        parts.append(f"source files changed ({a.get('files_count')} -> {b.get('files_count')} files, "
                     f"{a.get('files_bytes')} -> {b.get('files_bytes')} bytes)")
    pa, pb = old.get("probes", {}), new.get("probes", {})
    differ = sorted(int(i) for i in set(pa) & set(pb) if pa[i] != pb[i])
    if differ:
        shown = ", ".join(map(str, differ[:8])) + (" …" if len(differ) > 8 else "")
        parts.append(f"sample{'s' if len(differ) > 1 else ''} {shown} differ{'s' if len(differ) == 1 else ''}")
    if old.get("identity") != new.get("identity"):
        parts.append("the dataset's attributes differ")
    if not parts:
        keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        parts = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:3]]
    return "; ".join(parts) or "the cache's manifest differs"


__all__ = ["PROBES", "CacheKeyWarning", "dataset_key", "describe_change", "identity", "in_memory_data", "kinship",
           "probe_indices", "source_files"]
