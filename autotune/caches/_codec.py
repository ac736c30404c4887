"""Exact sample serialisation shared by every cache backend.

A sample is any nesting of tuple / list / dict (str or int keys) whose leaves are int, float, bool,
str, bytes, None, numpy arrays, torch tensors or PIL images. The codec gives back the same nesting,
the same types, dtypes and shapes, and equal bits (NaN payloads included).

The design is columnar. :func:`infer_schema` looks at the first sample(s) and fixes a tree definition
plus, per leaf, either a fixed-shape numeric *column* (numpy dtype + shape + what the leaf was) or a
*blob* (pickled). A backend stores each column as one contiguous ``(N, *shape)`` array (or a chunked
dataset) and the blobs as variable-length bytes. A sample that does not fit the schema (another
structure, another shape) is stored whole as an *overflow* blob, so it still round-trips exactly.

Two encodings are offered:

- :func:`encode` / :func:`decode`: ``Encoded(columns, blob)`` for columnar backends (memory, hdf5);
  ``columns is None`` marks an overflow sample whose ``blob`` holds the whole sample.
- :func:`pack` / :func:`unpack`: one ``bytes`` record per sample for key-value backends (pickle, lmdb).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import pickle
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

try:  # PIL is optional for users whose samples hold no images.
    from PIL import Image
except ImportError:  # pragma: no cover - pillow is a dependency of the project
    Image = None  # type: ignore[assignment]

SCHEMA_VERSION = 1
PICKLE_PROTOCOL = 5

_COLUMN_KINDS = "biufc"  # bool, signed, unsigned, float, complex: stored as raw numeric columns
_PIL_MODES = {"L": 1, "RGB": 3, "RGBA": 4}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_RAW_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# --------------------------------------------------------------------------------------------- tensors
def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"Unknown torch dtype in cache schema, but got {name=}.")
    return dtype


@functools.cache  # asked twice per tensor of every sample encoded; its probe tensors cost more than the rest
def _tensor_storage(dtype: torch.dtype) -> tuple[np.dtype, torch.dtype | None] | None:
    """How a tensor of ``dtype`` is held in a numpy column: (numpy dtype, raw view dtype or None)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype, None
    except (TypeError, RuntimeError):
        pass
    raw = _RAW_INT.get(torch.empty(0, dtype=dtype).element_size())
    if raw is None:
        return None
    try:  # bfloat16, float8_*: same-size integer view, bits untouched
        probe = torch.zeros(2, dtype=dtype).view(raw)
        return probe.numpy().dtype, raw
    except (TypeError, RuntimeError):
        return None


def _plain_tensor(x: Any) -> bool:
    return (
        type(x) is torch.Tensor
        and x.layout == torch.strided
        and x.device.type == "cpu"
        and not x.requires_grad
        and not x.is_quantized
    )


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes()


# --------------------------------------------------------------------------------------------- schema
@dataclass(frozen=True)
class Leaf:
    """How one leaf is stored: ``store == "column"`` (fixed-shape numeric) or ``"blob"`` (pickled)."""

    store: str
    kind: str = "any"  # ndarray | tensor | int | float | bool | pil | any
    dtype: str = ""  # numpy dtype string of the column (e.g. "<f4", "|b1")
    shape: tuple[int, ...] = ()
    torch_dtype: str = ""  # tensors: the torch dtype name (e.g. "bfloat16")
    mode: str = ""  # PIL images: "L", "RGB" or "RGBA"

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.np_dtype.itemsize

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "torch_dtype": self.torch_dtype,
            "mode": self.mode,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Leaf:
        return cls(
            store=d["store"],
            kind=d.get("kind", "any"),
            dtype=d.get("dtype", ""),
            shape=tuple(int(s) for s in d.get("shape", ())),
            torch_dtype=d.get("torch_dtype", ""),
            mode=d.get("mode", ""),
        )


_BLOB = Leaf("blob")


def _leaf_for(x: Any) -> Leaf:
    """The storage a single leaf value gets when it fixes the schema."""
    t = type(x)
    if t is bool:
        return Leaf("column", "bool", "|b1", ())
    if t is int:
        return Leaf("column", "int", "<i8", ()) if _INT64_MIN <= x <= _INT64_MAX else _BLOB
    if t is float:
        return Leaf("column", "float", "<f8", ())
    if t is np.ndarray:
        if x.dtype.kind in _COLUMN_KINDS and x.dtype.fields is None:
            return Leaf("column", "ndarray", x.dtype.str, tuple(x.shape))
        return _BLOB
    if _plain_tensor(x):
        held = _tensor_storage(x.dtype)
        if held is None:
            return _BLOB
        np_dtype, _ = held
        return Leaf("column", "tensor", np_dtype.str, tuple(x.shape), str(x.dtype).removeprefix("torch."))
    if Image is not None and isinstance(x, Image.Image) and x.mode in _PIL_MODES and not x.info:
        w, h = x.size
        bands = _PIL_MODES[x.mode]
        shape = (h, w) if bands == 1 else (h, w, bands)
        return Leaf("column", "pil", "|u1", shape, mode=x.mode)
    return _BLOB


def _key_json(k: Any) -> list[Any]:
    if type(k) is str:
        return ["s", k]
    if type(k) is int:
        return ["i", k]
    raise TypeError(k)


def _key_value(j: list[Any]) -> Any:
    return j[1] if j[0] == "s" else int(j[1])


class _NoTree(Exception):
    """The sample's container shape cannot be described by a schema tree (odd dict keys)."""


def _build_tree(x: Any, leaves: list[Leaf]) -> Any:
    t = type(x)
    if t is tuple or t is list:
        return {"t": "tuple" if t is tuple else "list", "c": [_build_tree(v, leaves) for v in x]}
    if t is dict:
        try:
            keys = [_key_json(k) for k in x]
        except TypeError:
            raise _NoTree from None
        return {"t": "dict", "k": keys, "c": [_build_tree(v, leaves) for v in x.values()]}
    leaves.append(_leaf_for(x))
    return {"t": "leaf", "i": len(leaves) - 1}


def _flatten(tree: Any, x: Any, out: list[Any]) -> bool:
    """Append ``x``'s leaves in schema order to ``out``; False when its containers differ from ``tree``."""
    kind = tree["t"]
    if kind == "leaf":
        out.append(x)
        return True
    t = type(x)
    if kind == "tuple":
        if t is not tuple or len(x) != len(tree["c"]):
            return False
        return all(_flatten(c, v, out) for c, v in zip(tree["c"], x))
    if kind == "list":
        if t is not list or len(x) != len(tree["c"]):
            return False
        return all(_flatten(c, v, out) for c, v in zip(tree["c"], x))
    if t is not dict or len(x) != len(tree["k"]):
        return False
    for kj, (k, v), c in zip(tree["k"], x.items(), tree["c"]):
        if type(k) is not (str if kj[0] == "s" else int) or k != kj[1]:
            return False
        if not _flatten(c, v, out):
            return False
    return True


def _unflatten(tree: Any, values: Iterator[Any]) -> Any:
    kind = tree["t"]
    if kind == "leaf":
        return next(values)
    if kind == "tuple":
        return tuple(_unflatten(c, values) for c in tree["c"])
    if kind == "list":
        return [_unflatten(c, values) for c in tree["c"]]
    return {_key_value(k): _unflatten(c, values) for k, c in zip(tree["k"], tree["c"])}


@dataclass(frozen=True)
class Schema:
    """Tree definition + per-leaf storage, inferred from the first sample(s)."""

    tree: Any
    leaves: tuple[Leaf, ...]

    @property
    def column_leaves(self) -> list[int]:
        return [i for i, leaf in enumerate(self.leaves) if leaf.store == "column"]

    @property
    def columns(self) -> list[Leaf]:
        """The column specs, in the order :func:`encode` returns their arrays."""
        return [leaf for leaf in self.leaves if leaf.store == "column"]

    @property
    def has_blob_leaves(self) -> bool:
        return any(leaf.store == "blob" for leaf in self.leaves)

    @property
    def row_nbytes(self) -> int:
        """Bytes of all column values of one sample."""
        return sum(leaf.row_nbytes for leaf in self.columns)

    def to_json(self) -> str:
        return json.dumps(
            {"version": SCHEMA_VERSION, "tree": self.tree, "leaves": [leaf.to_dict() for leaf in self.leaves]},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> Schema:
        d = json.loads(text) if isinstance(text, str) else text
        if d.get("version") != SCHEMA_VERSION:
            raise ValueError(f"Cache schema version must be {SCHEMA_VERSION}, but got {d.get('version')!r}.")
        return cls(tree=d["tree"], leaves=tuple(Leaf.from_dict(leaf) for leaf in d["leaves"]))


def infer_schema(samples: Iterable[Any]) -> Schema:
    """Fix the schema from the first sample; later samples demote leaves whose shape/dtype vary to blobs."""
    it = iter(samples)
    try:
        first = next(it)
    except StopIteration:
        raise ValueError("infer_schema needs at least one sample, but got none.") from None
    leaves: list[Leaf] = []
    try:
        tree = _build_tree(first, leaves)
    except _NoTree:
        return Schema({"t": "leaf", "i": 0}, (_BLOB,))
    for sample in it:
        values: list[Any] = []
        if not _flatten(tree, sample, values):
            continue  # another structure: that sample will overflow, the schema stays
        for i, v in enumerate(values):
            if leaves[i].store == "column" and _leaf_for(v) != leaves[i]:
                leaves[i] = _BLOB
    return Schema(tree, tuple(leaves))


# --------------------------------------------------------------------------------------------- encoding
class Encoded(NamedTuple):
    """One encoded sample: column arrays (schema order) and the blob; ``columns is None`` = overflow."""

    columns: list[np.ndarray] | None
    blob: bytes | None


def _column_value(leaf: Leaf, x: Any) -> np.ndarray | None:
    """``x`` as the column's array, or None when ``x`` does not fit the column exactly."""
    if _leaf_for(x) != leaf:
        return None
    kind = leaf.kind
    # Strided views, not C-order copies: every caller copies the value into a column or into bytes once
    # anyway, and a permuted image (HWC decoded, CHW returned) costs a second full copy otherwise (0.4 of
    # the 1.5 ms a 224x224 float sample takes to decode and store, docs/architecture.md §4).
    if kind == "ndarray":
        return np.asarray(x)
    if kind == "tensor":
        t = x.detach().resolve_conj().resolve_neg()
        storage = _tensor_storage(t.dtype)
        if storage is not None and storage[1] is not None:
            t = t.view(storage[1])
        array: np.ndarray = t.numpy()
        return array
    if kind == "pil":
        return np.array(x, dtype=np.uint8, order="C")
    return np.array(x, dtype=leaf.np_dtype)


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)


def encode(schema: Schema, sample: Any) -> Encoded:
    """Split ``sample`` into column arrays and one blob; an ill-fitting sample becomes an overflow blob."""
    values: list[Any] = []
    if _flatten(schema.tree, sample, values):
        columns: list[np.ndarray] = []
        blobs: list[Any] = []
        for leaf, v in zip(schema.leaves, values):
            if leaf.store == "blob":
                blobs.append(v)
                continue
            arr = _column_value(leaf, v)
            if arr is None:
                break
            columns.append(arr)
        else:
            return Encoded(columns, _dumps(blobs) if schema.has_blob_leaves else None)
    return Encoded(None, _dumps(sample))


def _leaf_value(leaf: Leaf, a: np.ndarray) -> Any:
    kind = leaf.kind
    if kind == "ndarray":
        return np.array(a, dtype=leaf.np_dtype, copy=True, order="C")
    if kind == "tensor":
        t = torch.from_numpy(np.array(a, copy=True, order="C"))
        dtype = _torch_dtype(leaf.torch_dtype)
        return t if t.dtype == dtype else t.view(dtype)
    if kind == "int":
        return int(a.reshape(())[()])
    if kind == "float":
        return float(a.reshape(())[()])
    if kind == "bool":
        return bool(a.reshape(())[()])
    if kind == "pil":
        return Image.fromarray(np.array(a, dtype=np.uint8, copy=True, order="C"))
    raise ValueError(f"Unknown leaf kind in cache schema, but got {kind=}.")


def decode(schema: Schema, columns: list[np.ndarray] | None, blob: bytes | memoryview | None) -> Any:
    """Inverse of :func:`encode`. Column arrays may be read-only views into a cache buffer."""
    if columns is None:
        assert blob is not None, "a sample stored whole is a blob"
        return pickle.loads(blob)
    blobs = iter(pickle.loads(blob) if schema.has_blob_leaves and blob is not None else ())
    cols = iter(columns)
    values = [next(blobs) if leaf.store == "blob" else _leaf_value(leaf, next(cols)) for leaf in schema.leaves]
    return _unflatten(schema.tree, iter(values))


def pack(schema: Schema, sample: Any) -> bytes:
    """One record: flag byte, the column bytes (fixed size), then the blob."""
    enc = encode(schema, sample)
    if enc.columns is None:
        return b"\x01" + (enc.blob or b"")
    return b"".join([b"\x00", *(a.tobytes() for a in enc.columns), enc.blob or b""])


def unpack(schema: Schema, record: bytes | memoryview) -> Any:
    """Inverse of :func:`pack`."""
    mv = memoryview(record)
    if mv[0] == 1:
        return pickle.loads(mv[1:])
    pos = 1
    columns = []
    for leaf in schema.columns:
        n = leaf.row_nbytes
        columns.append(np.frombuffer(mv[pos : pos + n], dtype=leaf.np_dtype).reshape(leaf.shape))
        pos += n
    return decode(schema, columns, mv[pos:] if schema.has_blob_leaves else None)


# --------------------------------------------------------------------------------------------- sizes
def sample_nbytes(sample: Any) -> int:
    """An estimate of a sample's payload bytes (array data, string lengths, 8 per scalar)."""
    t = type(sample)
    if t is tuple or t is list:
        return sum(sample_nbytes(v) for v in sample)
    if t is dict:
        return sum(sample_nbytes(k) + sample_nbytes(v) for k, v in sample.items())
    if sample is None:
        return 0
    if t in (int, float, bool):
        return 8
    if t is str:
        return len(sample.encode("utf-8", "surrogatepass"))
    if t is bytes or t is bytearray:
        return len(sample)
    if isinstance(sample, np.ndarray) and sample.dtype != object:
        return int(sample.nbytes)
    if isinstance(sample, torch.Tensor) and sample.layout == torch.strided:
        return int(sample.numel() * sample.element_size())
    if Image is not None and isinstance(sample, Image.Image):
        return sample.size[0] * sample.size[1] * len(sample.getbands())
    try:
        return len(_dumps(sample))
    except Exception:
        return 64


# --------------------------------------------------------------------------------------------- equality
def _tokens(x: Any) -> Iterator[bytes]:
    """A canonical stream of byte tokens for ``x``: equal streams <=> same structure, types and bits."""
    t = type(x)
    if t is tuple or t is list:
        yield (b"T" if t is tuple else b"L") + str(len(x)).encode()
        for v in x:
            yield from _tokens(v)
    elif t is dict:
        yield b"D" + str(len(x)).encode()
        for k, v in x.items():
            yield from _tokens(k)
            yield from _tokens(v)
    elif x is None:
        yield b"N"
    elif t is bool:
        yield b"b1" if x else b"b0"
    elif t is int:
        yield b"i" + str(x).encode()
    elif t is float:
        yield b"f" + struct.pack("<d", x)
    elif t is str:
        yield b"s" + x.encode("utf-8", "surrogatepass")
    elif t is bytes:
        yield b"y" + x
    elif t is np.ndarray and x.dtype.kind in _COLUMN_KINDS + "SUmM" and x.dtype.fields is None:
        yield f"A{x.dtype.str}{x.shape}".encode()
        yield x.tobytes()
    elif isinstance(x, np.generic) and x.dtype.kind in _COLUMN_KINDS + "SUmM":
        yield f"g{type(x).__name__}{x.dtype.str}".encode()
        yield x.tobytes()
    elif isinstance(x, torch.Tensor) and x.layout == torch.strided and not x.is_quantized:
        yield f"t{t.__module__}.{t.__qualname__}{x.dtype}{tuple(x.shape)}{x.device}{x.requires_grad}".encode()
        yield _tensor_bytes(x.cpu())
    elif Image is not None and isinstance(x, Image.Image):
        yield f"P{x.mode}{x.size}".encode()
        yield x.tobytes()
        if x.mode == "P":
            yield bytes(x.getpalette() or [])
    else:  # anything else: its type and its pickle
        yield f"o{t.__module__}.{t.__qualname__}".encode()
        yield _dumps(x)


def samples_equal(a: Any, b: Any) -> bool:
    """Exact structural and bitwise equality (types, dtypes, shapes, NaN payloads)."""
    sentinel = object()
    for ta, tb in itertools.zip_longest(_tokens(a), _tokens(b), fillvalue=sentinel):
        if ta is sentinel or tb is sentinel or ta != tb:
            return False
    return True


def sample_digest(sample: Any) -> bytes:
    """A stable 32-byte hash of the sample's structure and bits."""
    h = hashlib.blake2b(digest_size=32)
    for tok in _tokens(sample):
        h.update(struct.pack("<Q", len(tok)))
        h.update(tok)
    return h.digest()


__all__ = [
    "Encoded",
    "Leaf",
    "Schema",
    "decode",
    "encode",
    "infer_schema",
    "pack",
    "sample_digest",
    "sample_nbytes",
    "samples_equal",
    "unpack",
]
