"""The codec round-trips every leaf kind bit for bit; equality and digests are exact."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from PIL import Image

from autotune.caches import _codec as codec

NAN_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]


def zoo_sample(i: int, big_endian: bool = True):
    """One sample holding every leaf kind the caches promise to keep exactly; deterministic in ``i``.

    A DataLoader worker hands a big-endian array back as little-endian (its transport, not the cache),
    so the loader tests leave that leaf out."""
    g = np.random.default_rng(i)
    t = torch.from_numpy(g.standard_normal((4, 6)).astype(np.float32))
    f32 = g.standard_normal(5).astype(np.float32)
    f32[1] = np.frombuffer(struct.pack("<I", 0x7FC0_1234), dtype=np.float32)[0]  # NaN with payload
    sample = {
        "int": i,
        "big_int": 2**70 + i,
        "neg": -(i + 1),
        "float": float(i) / 3.0,
        "nan": NAN_PAYLOAD,
        "bool": bool(i % 2),
        "str": f"sample-{i}-é",
        "bytes": bytes([i % 256]) * 3,
        "none": None,
        3: "int key",
        "np_f32": f32,
        "np_u8": g.integers(0, 255, (3, 4), dtype=np.uint8),
        "np_i64": np.arange(i, i + 3, dtype=np.int64),
        "np_bool": g.integers(0, 2, (2, 3)).astype(bool),
        "np_0d": np.array(i, dtype=np.int16),
        "np_f16": g.standard_normal(3).astype(np.float16),
        "np_c64": (g.standard_normal(2) + 1j).astype(np.complex64),
        "np_be": np.arange(3, dtype=">i4"),
        "t_f32": t,
        "t_noncontig": t.t(),
        "t_0d": torch.tensor(float(i)),
        "t_bf16": torch.randn(3, 2, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16),
        "t_bool": torch.tensor([True, False, bool(i % 2)]),
        "t_i8": torch.arange(4, dtype=torch.int8) - i,
        "t_f16": torch.ones(2, dtype=torch.float16) * i,
        "pil_L": Image.fromarray(g.integers(0, 255, (5, 7), dtype=np.uint8)),
        "pil_RGB": Image.fromarray(g.integers(0, 255, (4, 3, 3), dtype=np.uint8)),
        "pil_RGBA": Image.fromarray(g.integers(0, 255, (2, 2, 4), dtype=np.uint8)),
        "nested": ([i, (float(i), "x")], [np.zeros(0, dtype=np.float32)]),
    }
    if not big_endian:
        del sample["np_be"]
    return sample


def varying_sample(i: int):
    """Samples whose shapes and structures vary: exercises blob leaves and the overflow path."""
    g = np.random.default_rng(100 + i)
    if i % 3 == 2:
        return [np.ones(i, dtype=np.float64), "different structure"]
    return (g.standard_normal((i + 1, 2)).astype(np.float32), torch.arange(i + 2), i)


class ZooDataset(torch.utils.data.Dataset):
    def __init__(self, n: int = 6, kind: str = "zoo", big_endian: bool = True):
        self.n, self.kind, self.big_endian = n, kind, big_endian

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return zoo_sample(i, self.big_endian) if self.kind == "zoo" else varying_sample(i)


def _roundtrip_encode(schema, s):
    enc = codec.encode(schema, s)
    return codec.decode(schema, enc.columns, enc.blob)


def test_zoo_roundtrips_exactly_both_encodings():
    samples = [zoo_sample(i) for i in range(4)]
    schema = codec.infer_schema(samples[:2])
    schema = codec.Schema.from_json(schema.to_json())
    for s in samples:
        for out in (_roundtrip_encode(schema, s), codec.unpack(schema, codec.pack(schema, s))):
            assert codec.samples_equal(out, s)
            assert codec.sample_digest(out) == codec.sample_digest(s)
            assert type(out["int"]) is int and type(out["bool"]) is bool and type(out["nested"]) is tuple
            assert out["t_bf16"].dtype == torch.bfloat16 and out["t_0d"].dim() == 0
            assert out["np_0d"].shape == () and out["np_be"].dtype == np.dtype(">i4")
            assert isinstance(out["pil_RGB"], Image.Image) and out["pil_RGBA"].mode == "RGBA"
            assert struct.pack("<d", out["nan"]) == struct.pack("<d", NAN_PAYLOAD)


def test_fixed_shape_numeric_leaves_are_columns():
    schema = codec.infer_schema([zoo_sample(0), zoo_sample(1)])
    kinds = {leaf.kind for leaf in schema.columns}
    assert kinds == {"ndarray", "tensor", "int", "float", "bool", "pil"}
    bf16 = [leaf for leaf in schema.columns if leaf.torch_dtype == "bfloat16"]
    assert bf16 and bf16[0].np_dtype.itemsize == 2
    enc = codec.encode(schema, zoo_sample(2))
    assert enc.columns is not None and len(enc.columns) == len(schema.columns)
    for arr, leaf in zip(enc.columns, schema.columns):
        assert arr.dtype == leaf.np_dtype and arr.shape == leaf.shape


def test_varying_shapes_and_structures_roundtrip():
    samples = [varying_sample(i) for i in range(7)]
    schema = codec.infer_schema(samples[:3])
    assert all(leaf.store == "blob" for leaf in schema.leaves[:2])  # shapes vary in the first samples
    overflowed = 0
    for s in samples:
        enc = codec.encode(schema, s)
        overflowed += enc.columns is None
        assert codec.samples_equal(codec.decode(schema, enc.columns, enc.blob), s)
        assert codec.samples_equal(codec.unpack(schema, codec.pack(schema, s)), s)
    assert overflowed == 2


@pytest.mark.parametrize(
    "first, other",
    [
        (1, 2**64),  # int that no longer fits the int64 column
        (1, True),  # bool is not int
        ((1, 2), [1, 2]),  # a list is not a tuple
        ({"a": 1}, {"b": 1}),
        ({1: 1}, {"1": 1}),
        (np.zeros(3, np.float32), np.zeros(3, np.float64)),
        (torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)),
        (torch.zeros(2), torch.zeros(3)),
    ],
)
def test_mismatching_sample_overflows_and_keeps_its_type(first, other):
    schema = codec.infer_schema([first])
    assert codec.encode(schema, other).columns is None
    assert codec.samples_equal(codec.unpack(schema, codec.pack(schema, other)), other)


def test_samples_equal_is_exact():
    a = zoo_sample(1)
    assert codec.samples_equal(a, zoo_sample(1))
    assert not codec.samples_equal(a, zoo_sample(2))
    assert not codec.samples_equal(1, True)
    assert not codec.samples_equal(1, 1.0)
    assert not codec.samples_equal((1,), [1])
    assert not codec.samples_equal(np.zeros(2, np.float32), np.zeros(2, np.float64))
    assert not codec.samples_equal(torch.zeros(2), np.zeros(2, np.float32))
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0001))[0]
    assert not codec.samples_equal(NAN_PAYLOAD, other_nan)
    assert codec.samples_equal(float("nan"), float("nan"))
    assert codec.sample_digest(a) == codec.sample_digest(zoo_sample(1))
    assert codec.sample_digest(a) != codec.sample_digest(zoo_sample(2))


def test_unusual_samples_are_blobs():
    samples = [
        {(1, 2): "tuple key"},
        torch.zeros(2, requires_grad=True),
        np.array(["a", "bc"]),
        np.array([1, "x"], dtype=object),
        Image.new("P", (2, 2)),
        np.float32(1.5),
    ]
    for s in samples:
        schema = codec.infer_schema([s])
        out = codec.unpack(schema, codec.pack(schema, s))
        assert type(out) is type(s)
        assert codec.samples_equal(out, s)


def test_sample_nbytes():
    assert codec.sample_nbytes((np.zeros((3, 4), np.float32), torch.zeros(5, dtype=torch.int64), "ab")) == 48 + 40 + 2
