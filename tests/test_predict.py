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


def test_a_partial_build_is_scaled_to_the_samples_its_share_stores_not_to_the_length():
    from autotune.tuner._predict import scale_build

    # a head of 16 in 0.2 s, a probe of 64 in 0.5 s: 0.00625 s a sample after 0.1 s of start-up
    per_sample = (0.5 - 0.2) / 48
    assert scale_build(0.5, 64, 200, (0.2, 16)) == pytest.approx(0.2 + per_sample * 184)  # a 2% share of 10,000
    assert scale_build(0.5, 64, 200, (0.2, 16)) == pytest.approx(0.1 + per_sample * 200)  # start-up once + 200
    # fewer stored than probed: still start-up once, plus the 10 samples
    assert scale_build(0.5, 64, 10, (0.2, 16)) == pytest.approx(0.1 + per_sample * 10)
    assert scale_build(0.5, 64, 64, (0.2, 16)) == 0.5  # the run stores what the probe did: as measured
    # the old projection of the same trial (6 samples of a 256 subset in 0.12 s, scaled by 10,000 / 256)
    assert 0.12 * 10_000 / 256 == pytest.approx(4.6875)
    assert scale_build(0.12, 6, 200) == pytest.approx(0.12 * 200 / 6)  # no probe: the trial's 6 scaled to 200


def _site(share=None, *, subset=256, length=10_000, cache_indices=None, cache_length=None):
    from autotune.tuner._measure import Plan, TrialSite, Workload

    plan = Plan(indices=list(range(0, length, length // subset))[:subset], length=length,
                cache_indices=cache_indices, cache_length=cache_length)
    return plan, TrialSite(Workload(dataset=None, batch_size=64, epochs=3), plan)


def test_build_cost_by_path_start_up_once_plus_per_sample_times_what_the_run_stores():
    from autotune.config import LoaderConfig, partial_count
    from autotune.tuner._measure import build_cost
    from autotune.tuner._predict import scale_build

    steps = {"check": 0.25, "key": 0.0, "cache": 0.12}
    # a partial built before epoch 1, probed: the probe scaled to partial_count(0.02, 10,000) = 200 samples
    plan, site = _site()
    site.build_head, site.build_probe = (0.2, 16), (0.5, 64)
    site.build_stores, site.trial_stores = partial_count(0.02, 10_000), 6
    cost = build_cost(LoaderConfig(cache="memory", cache_share=0.02), plan, site, steps)
    assert (cost.fixed, cost.seconds, cost.samples, cost.stores, cost.head) == (0.25, 0.5, 64, 200, (0.2, 16))
    assert cost.predicted == pytest.approx(0.25 + 0.2 + (0.3 / 48) * 184)
    # unprobed (a small subset): the trial's own build of 6 scaled to the 200 the run stores
    site.build_head = site.build_probe = None
    cost = build_cost(LoaderConfig(cache="memory", cache_share=0.02), plan, site, steps)
    assert cost.predicted == pytest.approx(0.25 + 0.12 * 200 / 6)
    # filled by the first epoch: the cache step only set up (the schema head), paid once, unscaled
    plan, site = _site()
    cost = build_cost(LoaderConfig(cache="memory", cache_share=0.02, cache_fill="first_epoch"), plan, site, steps)
    assert (cost.fixed, cost.seconds) == (0.25 + 0.12, 0.0) and cost.predicted == 0.25 + 0.12
    cost = build_cost(LoaderConfig(cache="pickle", cache_fill="first_epoch"), plan, site, steps)
    assert cost.predicted == 0.25 + 0.12
    # a full build: the subset's, its head's start-up once, scaled to the length
    site.build_head = (0.05, 16)
    cost = build_cost(LoaderConfig(cache="pickle"), plan, site, steps)
    assert (cost.samples, cost.stores) == (256, 10_000)
    assert cost.predicted == pytest.approx(0.25 + scale_build(0.12, 256, 10_000, (0.05, 16)))
    # ranks sharing a cache: every rank's 512 samples, standing for 20,000
    plan, site = _site(cache_indices=list(range(512)), cache_length=20_000)
    site.build_head = (0.05, 16)
    cost = build_cost(LoaderConfig(cache="pickle"), plan, site, steps)
    assert (cost.samples, cost.stores) == (512, 20_000)
    assert build_cost(LoaderConfig(), plan, site, steps).predicted == 0.25


def test_a_trial_partial_stores_its_share_of_the_subset_and_the_run_its_share_of_every_rank():
    import torch

    from autotune.config import partial_count

    data = [(torch.full((2,), float(i)), i) for i in range(2000)]
    plan, site = _site(subset=100, length=2000)
    site.workload.dataset = data
    cache = site.partial(data, 0.1, "build")  # the subset is every 20th index: 10 of them below 200
    assert (site.build_stores, site.trial_stores, cache.cached) == (200, 10, 10)
    plan, site = _site(subset=100, length=2000, cache_indices=list(range(0, 4000, 20)), cache_length=4000)
    data = [(torch.full((2,), float(i)), i) for i in range(4000)]
    cache = site.partial(data, 0.1, "build")
    assert site.build_stores == partial_count(0.1, 4000) == 400 and site.trial_stores == cache.cached == 20


def test_a_partials_probe_never_holds_more_samples_than_the_run_stores():
    """The memory plan counts a partial trial's cache as the run's share (``partial_count`` samples): the probe
    builds no more than that. A run storing more than a probe: a head and a probe; one storing no more: one
    build of exactly what it stores, whose time is the prediction (unscaled)."""
    import torch

    from autotune.config import LoaderConfig, partial_count
    from autotune.tuner._measure import _BUILD_HEAD, _BUILD_PROBE, build_cost

    data = [(torch.full((2,), float(i)), i) for i in range(10_000)]
    plan, site = _site(subset=256, length=10_000)
    site.before("partial", LoaderConfig(cache="memory", cache_share=0.02), data)  # the run stores 200
    assert site.build_head is not None and site.build_probe is not None
    assert (site.build_head[1], site.build_probe[1]) == (_BUILD_HEAD, _BUILD_PROBE)
    assert partial_count(0.002, 10_000) == 20 < _BUILD_PROBE
    plan, site = _site(subset=256, length=10_000)
    config = LoaderConfig(cache="memory", cache_share=0.002)
    site.before("partial", config, data)
    assert site.build_head is None and site.build_probe is not None and site.build_probe[1] == 20
    site.partial(data, 0.002, "build")
    cost = build_cost(config, plan, site, {"cache": 0.5})
    assert cost.predicted == site.build_probe[0]  # built as the run builds it: its own time
    # a subset smaller than what the run stores: no probe (the trial's own build is scaled)
    plan, site = _site(subset=16, length=10_000)
    site.before("partial", config, data)
    assert site.build_head is None and site.build_probe is None
