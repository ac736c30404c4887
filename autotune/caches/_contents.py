"""A digest of everything a dataset holds in memory, whatever its container.

Labels read into a dict in ``__init__`` (``json.load(open("labels.json"))``), a pandas frame of a
CSV, nested lists of (path, label) pairs, numpy object arrays, tensors, a transform's parameters: a
change to any of them changes the samples without touching a file a read opens, so all of it is
part of a cache's key. The digest is canonical (dicts and sets in sorted order, no ``id`` or
``repr`` of an object anywhere), so the same contents give the same digest in every process.

Bounded: at most ``MAX_BYTES`` of array bytes are hashed whole (beyond that a strided sample, said
so), and what cannot be read at all (a C extension object, a socket) is named in ``unreadable``
rather than guessed at; a file object or an HDF5/LMDB handle is read as the file it holds open, so
its path is part of the digest and the file itself a source of the cache (``_provenance``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import struct
import types
from collections.abc import Iterable
from pathlib import PurePath
from typing import Any

import numpy as np
import torch

from autotune.caches._draws import _state

MAX_BYTES = 256 << 20  # array bytes hashed whole, per dataset
_MAX_NODES = 2_000_000  # values walked one by one (containers that JSON cannot take whole)
_MAX_DEPTH = 24
_SAMPLE_BYTES = 1 << 20  # of an array beyond the budget: this many bytes, strided over the whole
_SCALARS = (str, int, float, bool, type(None))


class Contents:
    """One walk over a dataset's attributes: ``digest(value)`` per attribute, and what it could not read."""

    def __init__(self) -> None:
        self.budget = MAX_BYTES
        self.nodes = 0
        self.unreadable: list[str] = []  # "name (type)"
        self.partial: list[str] = []  # arrays hashed in part
        self.held_files: list[str] = []  # files held open by objects of the dataset
        self._active: set[int] = set()

    def digest(self, value: Any, name: str) -> str:
        h = hashlib.blake2b(digest_size=8)
        self._feed(h, value, name, 0)
        return h.hexdigest()

    # ------------------------------------------------------------------------------------------ the walk
    def _feed(self, h: Any, value: Any, name: str, depth: int) -> None:
        self.nodes += 1
        if isinstance(value, _SCALARS):
            h.update(_scalar(value))
            return
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            h.update(b"B" + struct.pack("<Q", len(data)) + data)
            return
        if isinstance(value, PurePath):
            h.update(b"P" + os.fsencode(str(value)) + b"\0")
            return
        if id(value) in self._active or depth > _MAX_DEPTH or self.nodes > _MAX_NODES:
            h.update(b"^" if id(value) in self._active else b"~")  # a cycle, or past the bounds: named below
            if id(value) not in self._active:
                self.partial.append(name)
            return
        self._active.add(id(value))
        try:
            self._feed_object(h, value, name, depth)
        finally:
            self._active.discard(id(value))

    def _feed_object(self, h: Any, value: Any, name: str, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            self._tensor(h, value, name)
        elif isinstance(value, np.ndarray):
            self._array(h, value, name, depth)
        elif isinstance(value, (list, tuple)):
            h.update(b"L" if isinstance(value, list) else b"T")
            if not _json(h, value):
                h.update(struct.pack("<Q", len(value)))
                for k, item in enumerate(value):
                    self._feed(h, item, f"{name}[{k}]", depth + 1)
        elif isinstance(value, dict):
            h.update(b"D")
            if not _json(h, value, sort_keys=True):
                self._unordered(h, ((k, v) for k, v in value.items()), name, depth, pairs=True)
        elif isinstance(value, (set, frozenset)):
            h.update(b"S")
            self._unordered(h, ((v, None) for v in value), name, depth, pairs=False)
        elif isinstance(value, (random.Random, np.random.Generator, np.random.RandomState, torch.Generator)):
            h.update(b"R" + type(value).__name__.encode())
            self._feed(h, _state(value), name, depth + 1)
        elif isinstance(value, (types.FunctionType, types.MethodType, types.CodeType, type, types.ModuleType,
                                types.BuiltinFunctionType)):
            self._code(h, value, name, depth)
        elif _pandas(value):
            self._pandas(h, value, name)
        elif _hugging_face(value):
            h.update(b"H" + str(value._fingerprint).encode())
        elif (held := _held_file(value)) is not None:
            h.update(b"F" + os.fsencode(held) + b"\0")
            self.held_files.append(held)
        else:
            self._generic(h, value, name, depth)

    def _unordered(self, h: Any, items: Iterable[tuple[Any, Any]], name: str, depth: int, pairs: bool) -> None:
        parts = []
        for k, v in items:
            sub = hashlib.blake2b(digest_size=16)
            self._feed(sub, k, f"{name}[key]", depth + 1)
            if pairs:
                self._feed(sub, v, f"{name}[{k!r}]" if isinstance(k, _SCALARS) else f"{name}[...]", depth + 1)
            parts.append(sub.digest())
        h.update(struct.pack("<Q", len(parts)) + b"".join(sorted(parts)))

    def _array(self, h: Any, value: np.ndarray, name: str, depth: int) -> None:
        h.update(b"A" + value.dtype.str.encode() + repr(value.shape).encode())
        if value.dtype.hasobject:  # objects (or records holding some): their values, never their addresses
            for k, item in enumerate(value.reshape(-1).tolist()):
                self._feed(h, item, f"{name}[{k}]", depth + 1)
            return
        if value.nbytes <= self.budget:
            self.budget -= value.nbytes
            h.update(np.ascontiguousarray(value).view(np.uint8).reshape(-1) if value.size else b"")
            return
        flat = value.reshape(-1)  # a copy only when it is not contiguous
        step = max(1, flat.size * flat.itemsize // _SAMPLE_BYTES)
        h.update(np.ascontiguousarray(flat[::step]).tobytes())
        self.partial.append(name)

    def _tensor(self, h: Any, value: torch.Tensor, name: str) -> None:
        if value.layout != torch.strided or value.is_meta:
            self.unreadable.append(f"{name} ({value.layout} tensor)")
            h.update(b"?")
            return
        flat = value.detach().cpu().contiguous().view(-1)
        h.update(b"t" + str(value.dtype).encode() + repr(tuple(value.shape)).encode())
        self._array(h, flat.view(torch.uint8).numpy() if value.numel() else np.zeros(0, np.uint8), name, 0)

    def _code(self, h: Any, value: Any, name: str, depth: int) -> None:
        if isinstance(value, types.MethodType):
            h.update(b"M")
            self._code(h, value.__func__, name, depth)
            self._feed(h, value.__self__, f"{name}.__self__", depth + 1)
            return
        if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
            label = value.__name__ if isinstance(value, types.ModuleType) else \
                f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value.__name__)}"
            h.update(b"N" + label.encode() + b"\0")
            return
        code = value if isinstance(value, types.CodeType) else value.__code__
        h.update(b"C" + code.co_code + "\0".join(code.co_names).encode())
        for k, const in enumerate(code.co_consts):
            self._feed(h, const, f"{name}.<const {k}>", depth + 1)
        if isinstance(value, types.FunctionType):
            h.update(f"{value.__module__}.{value.__qualname__}".encode())
            self._feed(h, value.__defaults__, f"{name}.__defaults__", depth + 1)
            self._feed(h, value.__kwdefaults__, f"{name}.__kwdefaults__", depth + 1)
            for k, cell in enumerate(value.__closure__ or ()):
                try:
                    contents = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                self._feed(h, contents, f"{name}.<closure {k}>", depth + 1)

    def _pandas(self, h: Any, value: Any, name: str) -> None:
        import pandas as pd

        try:
            hashed = pd.util.hash_pandas_object(value, index=True).to_numpy()
        except TypeError:  # cells pandas cannot hash (lists, dicts): the frame's values walked
            self._feed(h, value.to_numpy(dtype=object), name, 1)
            return
        h.update(b"pd" + type(value).__name__.encode())
        columns = list(value.columns) if hasattr(value, "columns") else [getattr(value, "name", None)]
        dtypes = [str(d) for d in (value.dtypes if hasattr(value, "columns") else [value.dtype])]
        h.update(json.dumps([str(c) for c in columns] + dtypes).encode())
        h.update(np.ascontiguousarray(hashed).tobytes())

    def _generic(self, h: Any, value: Any, name: str, depth: int) -> None:
        cls = type(value)
        h.update(b"O" + f"{cls.__module__}.{cls.__qualname__}".encode() + b"\0")
        try:
            items = sorted(vars(value).items())
        except TypeError:
            slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if isinstance(s, str)]
            if not slots:
                self.unreadable.append(f"{name} ({cls.__module__}.{cls.__qualname__})")
                h.update(b"?")
                return
            items = sorted((s, getattr(value, s, None)) for s in set(slots))
        for key, item in items:
            h.update(key.encode() + b"=")
            self._feed(h, item, f"{name}.{key}", depth + 1)


def _scalar(value: Any) -> bytes:
    if isinstance(value, bool) or value is None:
        return b"b" + repr(value).encode()
    if isinstance(value, int):
        return b"i" + str(value).encode() + b";"
    if isinstance(value, float):
        return b"f" + struct.pack("<d", value)
    return b"s" + str(value).encode("utf-8", "surrogatepass") + b"\0"


def _flat(x: Any) -> bool:
    return isinstance(x, _SCALARS) or (isinstance(x, (list, tuple)) and all(isinstance(y, _SCALARS) for y in x))


def _json(h: Any, value: Any, sort_keys: bool = False) -> bool:
    """Hash ``value`` as one JSON text when that text says all of it (C speed for the common case: a
    list of scalars or of (path, label) pairs, a dict of str keys to such values); False when it would
    not (nested containers, non-str keys, other objects), and nothing was hashed."""
    if not value:
        h.update(b"[]")
        return True
    if isinstance(value, dict):
        if not (all(type(k) is str for k in value) and all(_flat(v) for v in value.values())):
            return False
    elif not all(_flat(x) for x in value):
        return False
    try:
        text = json.dumps(value, sort_keys=sort_keys, allow_nan=True)
    except (TypeError, ValueError):
        return False
    h.update(b"J" + text.encode("utf-8", "surrogatepass"))
    return True


def _pandas(value: Any) -> bool:
    module = type(value).__module__
    return module.split(".")[0] == "pandas" and type(value).__name__ in ("DataFrame", "Series", "Index")


def _hugging_face(value: Any) -> bool:
    return type(value).__module__.startswith("datasets.") and isinstance(getattr(value, "_fingerprint", None), str)


def _held_file(value: Any) -> str | None:
    """The file an object holds open: a file object, an ``h5py.File``/dataset, an LMDB environment."""
    path: Any = None
    if isinstance(value, io.IOBase):
        path = getattr(value, "name", None)
    elif type(value).__module__.startswith("h5py"):
        path = getattr(getattr(value, "file", None), "filename", None)
    elif type(value).__module__ == "lmdb" and hasattr(value, "path"):
        try:
            path = value.path()
        except Exception:  # noqa: BLE001 - a closed environment
            path = None
    return os.path.abspath(path) if isinstance(path, str) else None


__all__ = ["MAX_BYTES", "Contents"]
