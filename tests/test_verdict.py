"""The diagnose verdict on constructed measurements: who bounds training, which stage, what can help."""

from __future__ import annotations

import json

import pytest

from autotune.diagnose._breakdown import format_table, measure_device, to_json
from autotune.diagnose._verdict import LOADER_STAGES, Breakdown, judge


def measurements(**kw) -> Breakdown:
    """A balanced loader (batch of 32 on 4 CPUs) with a light consumer; tests change one thing."""
    base = dict(batch_size=32, usable_cpus=4, sample_cold=1e-3, sample_warm=5e-4, read_cold=2e-4, read_warm=5e-5,
                collate=1e-3, transfer=1e-3, consumer=1e-3, files=64, length=1000, samples=64,
                sample_bytes=10_000, batch_bytes=320_000, source="constructed.py:dataset")
    base.update(kw)
    return Breakdown(**base)


def test_consumer_bound_says_no_loader_setting_helps():
    v = judge(measurements(consumer=0.5, consumer_on_cpu=True))
    assert v.bound == "consumer"
    text = " ".join([v.summary, *v.explanation])
    assert "no loader setting will make training faster" in text.lower()
    assert any("num_workers" in c for c in v.cannot_help)
    assert any("train_step" in h for h in v.helps)
    assert not any("more workers" in h for h in v.helps)
    assert v.ceilings["expected"] == pytest.approx(32 / 0.5)
    assert v.loader_cpus == 3  # the CPU consumer keeps one CPU busy


def test_consumer_bound_with_a_heavy_serial_loader_offers_only_overlap():
    # Loader work 32 * 5 ms = 160 ms on one CPU, 40 ms on four; the consumer 200 ms.
    v = judge(measurements(sample_warm=5e-3, read_warm=1e-4, consumer=0.2))
    assert v.bound == "consumer"
    assert any("overlap" in h for h in v.helps)
    assert v.ceilings["serial"] < v.ceilings["no_stall"]


def test_storage_bound_when_files_do_not_fit_in_memory():
    v = judge(measurements(sample_cold=20e-3, sample_warm=19e-3, read_cold=18e-3, read_warm=17e-3,
                           fits_in_memory=False, consumer=1e-3))
    assert v.bound == "loader"
    assert v.stage == "storage"
    assert any("cache" in h for h in v.helps)
    assert any("faster format" in h for h in v.helps)
    assert any("prefetch_factor" in c for c in v.cannot_help)


def test_cold_first_epoch_is_storage_bound_while_steady_epochs_decode():
    v = judge(measurements(sample_cold=30e-3, read_cold=28e-3, sample_warm=3e-3, read_warm=1e-5))
    assert v.stage == "decode"
    assert v.first_epoch_stage == "storage"
    assert any("first epoch" in line for line in v.explanation)
    assert v.ceilings["cold"] < v.ceilings["prepared"]


def test_decode_bound():
    v = judge(measurements(sample_warm=10e-3, sample_cold=10.2e-3, read_warm=1e-5, read_cold=2e-4))
    assert v.bound == "loader"
    assert v.stage == "decode"
    assert any("more workers" in h for h in v.helps)
    assert any("a cache" in h for h in v.helps)
    assert any("faster storage" in c for c in v.cannot_help)


def test_transform_bound_says_a_cache_cannot_help():
    v = judge(measurements(transform=10e-3))
    assert v.stage == "transform"
    assert any(c.startswith("a cache") for c in v.cannot_help)


def test_collate_bound():
    v = judge(measurements(collate=0.5))
    assert v.bound == "loader" and v.stage == "collate"
    assert any("collate_fn" in h for h in v.helps)


def test_transfer_bound_says_more_workers_cannot_help():
    v = judge(measurements(transfer=0.2, batch_bytes=40 << 20))
    assert v.bound == "loader" and v.stage == "transfer"
    assert any(c.startswith("more workers") for c in v.cannot_help)
    assert any("fewer bytes" in h for h in v.helps)
    # transfer does not spread over workers: the loader can go no faster than one batch per transfer
    assert v.loader_batch == pytest.approx(0.2)


def test_nothing_to_consume_is_loader_bound_with_an_unbounded_ceiling():
    v = judge(measurements(consumer=None, consumer_kind="none"))
    assert v.bound == "loader"
    assert v.ceilings["no_stall"] is None
    assert v.ceilings["expected"] == v.ceilings["prepared"]


def test_stages_and_shares_cover_the_loader():
    v = judge(measurements())
    assert set(v.stages) == set(LOADER_STAGES) == set(v.shares)
    assert sum(v.shares.values()) == pytest.approx(1.0)


def test_verdict_and_measurements_round_trip_through_json():
    m = measurements(consumer=None, pin=None, h2d=None, notes=("a note",))
    doc = json.loads(json.dumps(to_json(m, judge(m)), allow_nan=False))
    assert Breakdown.from_dict(doc["measurements"]) == m
    assert doc["verdict"]["ceilings"]["no_stall"] is None


def test_table_shows_no_cuda_and_the_verdict():
    m = measurements(consumer=0.5)
    text = format_table(m, judge(m))
    assert "n/a (no CUDA)" in text
    assert "Verdict: consumer-bound" in text
    assert "no stalls (consumer alone)" in text


def test_device_measurement_without_cuda_is_not_available():
    assert measure_device([object()], cuda=False) == (None, None)


def test_device_measurement_with_cuda_times_pin_and_copy():
    calls = []
    pin, h2d = measure_device(["batch"], cuda=True, pin=lambda b: calls.append("pin") or b,
                              copy_to=lambda b: calls.append("copy") or b, sync=lambda: calls.append("sync"))
    assert pin is not None and pin >= 0 and h2d is not None and h2d >= 0
    assert calls[:3] == ["pin", "copy", "sync"]  # warm-up first
    assert calls.count("pin") == calls.count("copy") == 4


def test_table_with_cuda_shows_pin_and_copy():
    m = measurements(cuda=True, pin=2e-3, h2d=3e-3)
    text = format_table(m, judge(m))
    assert "pin memory" in text and "host-to-device copy" in text and "n/a (no CUDA)" not in text


def test_a_close_second_stage_is_named():
    # decode 32 * 1.9 ms / 4 CPUs = 15.2 ms per batch against a transfer of 16 ms
    v = judge(measurements(sample_warm=1.9e-3, read_warm=0.0, collate=0.0, transfer=16e-3))
    assert v.stage == "transfer"
    assert any("close behind" in line and "decode" in line.lower() for line in v.explanation)
    v = judge(measurements(transfer=0.2))
    assert not any("close behind" in line for line in v.explanation)
