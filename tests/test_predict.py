"""autotune.predict: from a measured subset to the whole run, exactly."""

from __future__ import annotations

import pytest

from autotune.tuner._predict import EpochTiming, batches_in, predict, scale_epoch


def test_batches_in():
    assert batches_in(640, 64) == 10
    assert batches_in(641, 64) == 11
    assert batches_in(641, 64, drop_last=True) == 10
    assert batches_in(10, 64) == 1


def test_per_batch_is_the_steady_part():
    t = EpochTiming(seconds=5.0, first_batch=1.4, batches=10)
    assert t.per_batch == pytest.approx(0.4)
    assert EpochTiming(seconds=2.0, first_batch=2.0, batches=1).per_batch == 2.0


def test_scale_epoch_keeps_startup_and_scales_steady_batches():
    t = EpochTiming(seconds=5.0, first_batch=1.4, batches=10)
    assert scale_epoch(t, 10) == 5.0  # the whole epoch: as measured
    assert scale_epoch(t, 100) == pytest.approx(1.4 + 0.4 * 99)
    assert scale_epoch(t, 1) == pytest.approx(1.4)


def test_predict_on_the_whole_dataset_is_unchanged():
    first = EpochTiming(seconds=6.0, first_batch=2.0, batches=10)
    warm = EpochTiming(seconds=3.0, first_batch=0.3, batches=10)
    p = predict(first=first, warm=warm, build_seconds=4.0, measured_samples=640, length=640, batch_size=64, epochs=5)
    assert (p.first_epoch_seconds, p.epoch_seconds, p.build_seconds) == (6.0, 3.0, 4.0)
    assert p.total_seconds == 4.0 + 6.0 + 3.0 * 4
    assert p.extrapolated is False and p.epochs == 5


def test_predict_extrapolates_a_subset():
    first = EpochTiming(seconds=6.0, first_batch=2.0, batches=10)  # 640 samples, 10 batches of 64
    warm = EpochTiming(seconds=3.0, first_batch=0.3, batches=10)
    p = predict(first=first, warm=warm, build_seconds=4.0, measured_samples=640, length=6400, batch_size=64, epochs=3)
    assert p.first_epoch_seconds == pytest.approx(2.0 + (4.0 / 9) * 99)
    assert p.epoch_seconds == pytest.approx(0.3 + (2.7 / 9) * 99)
    assert p.build_seconds == pytest.approx(40.0)  # build scaled by length / measured_samples
    assert p.total_seconds == pytest.approx(p.build_seconds + p.first_epoch_seconds + 2 * p.epoch_seconds)
    assert p.extrapolated is True
    assert p.to_dict()["extrapolated"] is True


def test_a_partial_last_batch_counts_as_a_batch():
    first = warm = EpochTiming(seconds=1.0, first_batch=0.1, batches=10)
    p = predict(first=first, warm=warm, build_seconds=0.0, measured_samples=640, length=6401, batch_size=64, epochs=1)
    assert p.epoch_seconds == pytest.approx(0.1 + 0.1 * 100)  # 101 batches
    assert p.total_seconds == pytest.approx(p.first_epoch_seconds)


def test_ten_million_samples():
    warm = EpochTiming(seconds=2.0, first_batch=0.5, batches=16)
    p = predict(first=warm, warm=warm, build_seconds=1.0, measured_samples=256, length=10_000_000, batch_size=16,
                epochs=2)
    assert p.epoch_seconds == pytest.approx(0.5 + 0.1 * (625_000 - 1))
    assert p.build_seconds == pytest.approx(10_000_000 / 256)


def test_the_head_of_an_epoch_is_its_first_two_batches_when_known():
    # A slow second batch (a first large allocation) is start-up, not the steady rate.
    t = EpochTiming(seconds=1.0, first_batch=0.2, batches=6, head_seconds=0.6)
    assert t.head() == (0.6, 2)
    assert t.per_batch == pytest.approx(0.1)
    assert scale_epoch(t, 16) == pytest.approx(0.6 + 0.1 * 14)
    assert scale_epoch(t, 6) == 1.0
    two = EpochTiming(seconds=0.5, first_batch=0.2, batches=2, head_seconds=0.5)
    assert two.head() == (0.2, 1) and two.per_batch == pytest.approx(0.3)


def test_a_builds_start_up_is_paid_once_and_the_factorys_fixed_steps_added_unscaled():
    from autotune.tuner._predict import scale_build

    # 256 samples built in 1.3 s, 16 of them in 0.34 s: 0.004 s a sample after 0.28 s of start-up
    assert scale_build(1.3, 256, 2000, (0.34, 16)) == pytest.approx(0.34 + (1.3 - 0.34) / 240 * 1984)
    assert scale_build(1.3, 256, 2000) == pytest.approx(1.3 * 2000 / 256)  # no head: scaled whole
    assert scale_build(1.3, 2000, 2000, (0.34, 16)) == 1.3  # the whole dataset was built: as measured
    t = EpochTiming(seconds=1.0, first_batch=0.1, batches=4)
    p = predict(first=t, warm=t, build_seconds=1.3, measured_samples=256, length=2000, batch_size=64, epochs=3,
                build_fixed_seconds=0.2, build_head=(0.34, 16))
    assert p.build_seconds == pytest.approx(0.2 + scale_build(1.3, 256, 2000, (0.34, 16)))
    assert p.build_fixed_seconds == 0.2
    assert p.total_seconds == pytest.approx(p.build_seconds + p.first_epoch_seconds + 2 * p.epoch_seconds)
