"""The adapting loader's policy: the exact moves it makes for given observations (no clock, no loader).

``explore_share=1`` where a test is about another rule: its slow tries would otherwise exhaust rule 5's
budget (tested on its own)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autotune.config import LoaderConfig
from autotune.recipe._adapt_policy import EXPLORE_SHARE, MIN_GAIN, Decision, EpochObservation, Policy, moves

W2 = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork")
W3 = W2.refit(num_workers=3)
W4 = W2.refit(num_workers=4)
W1 = W2.refit(num_workers=1)


def obs(config, ms_per_batch, *, stall=0.5, batches=100, spread=0.0, fresh=False, first_wait=None, cpu=0.0):
    """An epoch of ``batches`` at ``ms_per_batch``; ``spread``: its chunks alternate ±spread (log scale);
    ``cpu``: the main process's CPU seconds per wall second."""
    spb = ms_per_batch / 1e3
    chunks = tuple(spb * math.exp(spread if i % 2 else -spread) for i in range(8))
    seconds = spb * batches
    wait = stall * seconds
    return EpochObservation(config=config, batches=batches, seconds=seconds, wait_seconds=wait,
                            first_wait_seconds=wait / batches if first_wait is None else first_wait,
                            chunk_seconds=chunks, fresh_pool=fresh, main_cpu_seconds=cpu * seconds)


def run(policy, observations):
    """Feed the epochs; each is measured under the configuration the policy chose for it (checked)."""
    out = []
    current = policy.incumbent
    for make in observations:
        o = make(current)
        d = policy.decide(o)
        out.append((d.event, d.config))
        current = d.config
    return out


def test_a_loader_bound_run_adds_workers_while_each_step_pays_and_settles_after_three_rejections():
    policy = Policy(W2, max_workers=4)
    figures = {W2: 10.0, W3: 8.0, W4: 7.0}  # ms a batch; the step waits (stall 0.5)
    prefetch4 = W4.refit(prefetch_factor=4)
    less = W4.refit(num_workers=3)
    figures.update({prefetch4: 7.1, less: 8.0, W4.refit(prefetch_factor=1): 7.0})
    got = run(policy, [lambda c: obs(c, figures[c])] * 10)
    assert got == [
        ("warm-up", W2), ("try", W3), ("keep", W3), ("try", W4), ("keep", W4),
        ("try", prefetch4), ("revert", W4),  # 7.1 is slower
        ("try", less), ("revert", W4),  # fewer workers: slower
        ("try", W4.refit(prefetch_factor=1)),  # as fast: not beyond the noise
    ]
    d = policy.decide(obs(W4.refit(prefetch_factor=1), 7.0))
    assert (d.event, d.config) == ("settle", W4) and policy.settled
    assert policy.decide(obs(W4, 7.0)).event == "measure"


def test_a_step_bound_run_tries_fewer_workers_first():
    assert [name for name, _ in moves(W2, 0.01, max_workers=4, cuda=False)] == [
        "fewer workers", "less prefetch", "more workers", "more prefetch"]
    assert [name for name, _ in moves(W2, 0.5, max_workers=4, cuda=True)] == [
        "more workers", "more prefetch", "pin memory", "fewer workers", "less prefetch"]
    plain = LoaderConfig(num_workers=2, prefetch_factor=2, multiprocessing_context="fork")
    assert moves(plain, 0.5, max_workers=2, cuda=False)[0] == ("persistent workers",
                                                              plain.refit(persistent_workers=True))
    assert moves(LoaderConfig(), 0.5, max_workers=2, cuda=False) == [
        ("more workers", LoaderConfig(num_workers=1, prefetch_factor=2, persistent_workers=True))]
    assert moves(W2, 0.5, max_workers=4, cuda=False, first="less prefetch")[0][0] == "less prefetch"
    policy = Policy(W2, max_workers=4)
    got = run(policy, [lambda c: obs(c, 10.0, stall=0.0)] * 3)
    assert got == [("warm-up", W2), ("try", W1), ("revert", W2)]


def test_a_switch_is_kept_only_beyond_the_noise_measured_in_the_run():
    faster = 10.0 * math.exp(-0.05)  # 5% faster
    quiet = Policy(W2, max_workers=4, explore_share=1)
    assert [e for e, _ in run(quiet, [lambda c: obs(c, 10.0 if c == W2 else faster)] * 3)] == [
        "warm-up", "try", "keep"]
    noisy = Policy(W2, max_workers=4, explore_share=1)  # chunks ±10%: 5% over 8 chunks each is within the noise
    assert [e for e, _ in run(noisy, [lambda c: obs(c, 10.0 if c == W2 else faster, spread=0.1)] * 3)] == [
        "warm-up", "try", "revert"]
    assert noisy.noise() == pytest.approx(0.1 * math.sqrt(16 / 15))  # 2 epochs of 8 chunks (not the warm-up)
    # the incumbent's own change between its epochs is noise too
    drifting = Policy(W2, max_workers=4, explore_share=1)
    # after the warm-up: 10.0, a slower try, 10.6 (the incumbent moved 6%), then a try 5% faster than 10.6
    seq = iter([10.0, 10.0, 12.0, 10.6, 10.6 * math.exp(-0.05)])
    assert [e for e, _ in run(drifting, [lambda c: obs(c, next(seq))] * 5)] == [
        "warm-up", "try", "revert", "try", "revert"]
    assert MIN_GAIN == 0.03
    tiny = Policy(W2, max_workers=4, explore_share=1)  # 2% is under the least gain a switch is made for
    assert [e for e, _ in run(tiny, [lambda c: obs(c, 10.0 if c == W2 else 9.8)] * 3)][-1] == "revert"


def test_the_warm_up_epoch_is_not_the_incumbents_figure():
    policy = Policy(W2, max_workers=4)
    seq = iter([40.0, 10.0, 9.0])  # a cold first epoch (a cache filling), then steady; W3 10% faster
    assert [e for e, _ in run(policy, [lambda c: obs(c, next(seq))] * 3)] == ["warm-up", "try", "keep"]
    assert policy.stats[W2].epochs == [0.01]


def test_a_fresh_persistent_pools_start_up_is_paid_once_and_left_out():
    fresh = obs(W3, 100.0, stall=1.0, batches=10, fresh=True, first_wait=0.5)
    # 1 s in all, 0.5 s waited for the first batch and 0.5 s for the other 9 (0.0556 each)
    assert fresh.seconds_per_batch == pytest.approx((1.0 - (0.5 - 0.5 / 9)) / 10)
    again = obs(W3, 100.0, stall=1.0, batches=10, fresh=False, first_wait=0.5)  # a reset's refill recurs
    assert again.seconds_per_batch == pytest.approx(0.1)
    not_persistent = W3.refit(persistent_workers=False)
    restarted = obs(not_persistent, 100.0, stall=1.0, batches=10, fresh=True, first_wait=0.5)
    assert restarted.seconds_per_batch == pytest.approx(0.1)


def test_a_settled_policy_reopens_on_a_drift_and_on_a_new_bottleneck():
    policy = Policy(W2, max_workers=2, explore_share=1)  # no more workers: only fewer, less prefetch, more prefetch
    figures = iter([10.0, 10.0, 12.0, 10.0, 12.0, 10.0, 12.0])
    got = run(policy, [lambda c: obs(c, next(figures), stall=0.0)] * 7)
    assert [e for e, _ in got] == ["warm-up", "try", "revert", "try", "revert", "try", "settle"]
    assert policy.decide(obs(W2, 10.5, stall=0.0)).event == "measure"  # within DRIFT
    d = policy.decide(obs(W2, 30.0, stall=0.0))  # the step three times heavier
    assert (d.event, d.config) == ("reopen", W1) and not policy.settled
    policy.decide(obs(W1, 40.0, stall=0.0))  # reverted
    assert policy.incumbent == W2
    settled = Policy(W2, max_workers=2, explore_share=1)
    for c in [W2, W2, W1, W2, W2.refit(prefetch_factor=1), W2, W2.refit(prefetch_factor=4)]:
        settled.decide(obs(c, 10.0 if c == W2 else 12.0, stall=0.0))
    assert settled.settled
    d = settled.decide(obs(W2, 10.0, stall=0.4))  # as fast, but the step now waits
    assert d.event == "reopen" and d.config == W2.refit(prefetch_factor=4)


def test_a_drift_before_settling_clears_the_rejections_judged_before_it():
    """benchmarks/adapt.py's competitor, measured: the moves were rejected on a quiet machine, the
    competitor started on the epoch the policy had left only to settle on, and that slow epoch became the
    reference: the run never reopened, while one move (fewer workers, here) was 1.6x faster by then."""
    policy = Policy(W2, max_workers=2, explore_share=1)  # moves: fewer workers, less prefetch, more prefetch
    quiet = {W2: 10.0, W1: 12.0, W2.refit(prefetch_factor=1): 12.0, W2.refit(prefetch_factor=4): 12.0}
    got = run(policy, [lambda c: obs(c, quiet[c], stall=0.0)] * 5)
    assert got == [("warm-up", W2), ("try", W1), ("revert", W2), ("try", W2.refit(prefetch_factor=1)),
                   ("revert", W2)]
    d = policy.decide(obs(W2, 30.0, stall=0.0))  # the competitor: three times slower
    assert (d.event, d.config) == ("reopen", W1) and "30.00 ms a batch against 10.00 before" in d.line
    assert policy.decide(obs(W1, 18.0, stall=0.0)).event == "keep" and policy.incumbent == W1
    within = Policy(W2, max_workers=2, explore_share=1)  # a change within DRIFT rejects nothing again
    run(within, [lambda c: obs(c, {W2: 10.0}.get(c, 12.0), stall=0.0)] * 5)
    assert within.decide(obs(W2, 11.0, stall=0.0)) == Decision(
        W2.refit(prefetch_factor=4), "try", "trying more prefetch: " + W2.refit(prefetch_factor=4).describe())


def test_observe_never_moves_and_a_refused_or_callers_setting_is_never_tried():
    observer = Policy(W2, max_workers=4, observe=True)
    assert {d for d, _ in run(observer, [lambda c: obs(c, 10.0)] * 4)} == {"observe"}
    assert observer.stats[W2].epochs == [0.01] * 4
    refused = Policy(W2, max_workers=4, allowed=lambda c: "no room in /dev/shm" if c.num_workers > 2 else None)
    assert run(refused, [lambda c: obs(c, 10.0)] * 2)[1] == ("try", W2.refit(prefetch_factor=4))
    assert refused.skipped == {W3: "no room in /dev/shm"}
    fixed = Policy(W2, max_workers=4, fixed=frozenset({"num_workers"}))
    assert run(fixed, [lambda c: obs(c, 10.0)] * 2)[1] == ("try", W2.refit(prefetch_factor=4))


def test_the_thread_split_is_a_move_judged_as_any_other():
    assert [name for name, _ in moves(W2, 0.01, max_workers=4, cuda=False, threads=2)] == [
        "fewer workers", "less prefetch", "more main threads", "more workers", "more prefetch", "fewer main threads"]
    spawned = W2.refit(multiprocessing_context="spawn", worker_threads=2)
    assert [name for name, _ in moves(spawned, 0.5, max_workers=8, cuda=False, threads=4)] == [
        "more workers", "more prefetch", "fewer main threads", "more worker threads", "fewer workers",
        "less prefetch", "more main threads", "fewer worker threads"]
    assert dict(moves(spawned, 0.5, max_workers=8, cuda=False, threads=4))["more worker threads"].worker_threads == 4
    assert "more worker threads" not in dict(moves(W2, 0.5, max_workers=8, cuda=False, threads=4))  # forked: one
    t4 = W2.refit(main_threads=4)
    pf1 = W2.refit(prefetch_factor=1)
    kept = Policy(W2, max_workers=4, threads=2)  # the step wants the cores: more main threads pay 20%
    got = run(kept, [lambda c: obs(c, 8.0 if c == t4 else 10.0, stall=0.0)] * 7)
    assert got == [("warm-up", W2), ("try", W1), ("revert", W2), ("try", pf1), ("revert", W2), ("try", t4),
                   ("keep", t4)]
    reverted = Policy(W2, max_workers=4, threads=2)  # as fast: reverted, the third rejection settles
    got = run(reverted, [lambda c: obs(c, 10.0, stall=0.0)] * 7)
    assert got[-2:] == [("try", t4), ("settle", W2)] and reverted.incumbent == W2
    fixed = Policy(W2, max_workers=4, threads=2, fixed=frozenset({"main_threads"}))
    assert all(c.main_threads is None for _, c in run(fixed, [lambda c: obs(c, 10.0, stall=0.0)] * 8))


def test_a_step_keeping_all_its_threads_busy_tries_more_threads_first():
    """Low stall and a saturated main process: the step is short of cores, and the third move in the low
    stall's order would come after two rejections, one before MAX_REJECTIONS settles the run."""
    assert [name for name, _ in moves(W2, 0.01, max_workers=4, cuda=False, threads=2, cpu_share=1.7)] == [
        "more main threads", "fewer workers", "less prefetch", "more workers", "more prefetch", "fewer main threads"]
    one = W2.refit(main_threads=1)
    assert moves(one, 0.01, max_workers=2, cuda=False, threads=2, cpu_share=0.85)[0] == (
        "more main threads", W2.refit(main_threads=2))
    # not saturated (the step sleeps, or waits on a device), or waiting on the loader: the order of the stall
    assert moves(W2, 0.01, max_workers=4, cuda=False, threads=2, cpu_share=1.5)[0][0] == "fewer workers"
    assert moves(W2, 0.5, max_workers=4, cuda=False, threads=2, cpu_share=2.0)[0][0] == "more workers"
    assert moves(W2, 0.01, max_workers=4, cuda=False, cpu_share=2.0)[0][0] == "fewer workers"  # split fixed
    t4 = W2.refit(main_threads=4)
    policy = Policy(W2, max_workers=4, threads=2)
    got = run(policy, [lambda c: obs(c, 8.0 if c == t4 else 10.0, stall=0.0, cpu=1.9)] * 3)
    assert got == [("warm-up", W2), ("try", t4), ("keep", t4)]


def test_a_crashed_candidate_is_a_rejection_never_tried_again():
    policy = Policy(W2, max_workers=4)
    assert run(policy, [lambda c: obs(c, 10.0)] * 2)[1] == ("try", W3)
    policy.crashed(W3, "RuntimeError: DataLoader worker (pid 1) is killed by signal: Killed.")
    assert policy.trying is None and policy.rejections == 1 and W3 in policy.failed
    d = policy.decide(obs(W2, 10.0))  # the incumbent took the epoch back
    assert d == Decision(W2.refit(prefetch_factor=4), "try", d.line)
    policy.decide(obs(W2.refit(prefetch_factor=4), 12.0))
    assert all(c != W3 for _, c in run(policy, [lambda c: obs(c, 10.0)] * 4))


def probe(config, ms_per_batch, batches=25, **kw):
    """A candidate's first part (the loader's probe: a quarter of a 100-batch epoch)."""
    return dataclasses.replace(obs(config, ms_per_batch, batches=batches, **kw), probe=True)


def test_a_candidate_clearly_slower_on_its_probe_is_reverted_there_and_one_within_the_loss_is_judged_whole():
    pf4 = W2.refit(prefetch_factor=4)
    policy = Policy(W2, max_workers=4)
    assert run(policy, [lambda c: obs(c, 10.0)] * 2) == [("warm-up", W2), ("try", W3)]
    d = policy.decide(probe(W3, 11.0))  # 10% slower over its first 25 batches: beyond LOSS (6%)
    assert (d.event, d.config) == ("revert", W2) and "first 25 batches" in d.line
    assert policy.rejections == 1 and W3 in policy.tried
    assert policy.lost_seconds == pytest.approx(0.001 * 25)  # a quarter of an epoch at 1 ms over
    # the incumbent's rest of the epoch (its pool restarted) is not its figure; the next move is tried
    assert policy.decide(obs(W2, 14.0, batches=75)) == Decision(pf4, "try", "trying more prefetch: "
                                                                 + pf4.describe())
    assert policy.stats[W2].epochs == [0.010]
    d = policy.decide(probe(pf4, 10.3))  # 3% slower on 25 batches: within LOSS, it reads the rest
    assert (d.event, d.config) == ("continue", pf4) and policy.trying == ("more prefetch", pf4)
    d = policy.decide(obs(pf4, 9.0, batches=75))  # judged on all 100: (25 x 10.3 + 75 x 9.0) / 100 ms
    assert (d.event, d.config) == ("keep", pf4)
    assert policy.stats[pf4].epochs == [pytest.approx((25 * 0.0103 + 75 * 0.009) / 100)]
    assert policy.lost_seconds == pytest.approx(0.025)  # a kept candidate cost nothing
    # the noise measured in the run widens the loss a probe is reverted for: 3 x sigma x sqrt(1/8 + 1)
    noisy = Policy(W2, max_workers=4)
    run(noisy, [lambda c: obs(c, 10.0, spread=0.05)] * 2)
    assert noisy.decide(probe(W3, 11.0)).event == "continue"  # 10% < 3 x 0.052 x 1.06 = 16%


def test_a_probe_leaves_a_fresh_pools_start_up_out_persistent_or_not():
    plain = W3.refit(persistent_workers=False)
    fresh = EpochObservation(config=plain, batches=10, seconds=1.0, wait_seconds=1.0, first_wait_seconds=0.5,
                             fresh_pool=True, probe=True)
    assert fresh.seconds_per_batch == pytest.approx(0.1)  # each epoch of it pays the start-up again
    assert fresh.steady_seconds_per_batch == pytest.approx((1.0 - (0.5 - 0.5 / 9)) / 10)
    policy = Policy(W2, max_workers=4)
    run(policy, [lambda c: obs(c, 56.0)] * 2)
    policy.trying = ("not persistent", plain)  # a move no rule makes from W2: the probe's figure is the point
    assert policy.decide(fresh).event == "continue"  # steady 55.6 ms a batch: as fast, not the start-up's 100


def test_where_every_move_is_slower_the_rejected_tries_cost_at_most_the_explore_share_of_the_run():
    """The recipe is the best: each try is a rejection, and a new one starts only while what the rejected
    cost (seconds per batch over the incumbent's, times their batches) is within 2% of the run so far."""
    policy = Policy(W2, max_workers=4)
    got = []
    at_tries = []  # (lost, seen) of the policy's own ledger when each try starts: observed seconds, no clock
    current = W2
    for _ in range(40):
        d = policy.decide(obs(current, 10.0 if current == W2 else 12.0))
        if d.event == "try":
            at_tries.append((round(policy.lost_seconds, 9), round(policy.seen_seconds, 9)))
        got.append(d.event)
        current = d.config
    assert EXPLORE_SHARE == 0.02
    # the first try costs 0.2 s (100 batches at 2 ms over): the next waits until the run reached 10 s, the
    # third until 20 s; the third rejection settles
    assert got[:21] == (["warm-up", "try", "revert"] + ["measure"] * 6 + ["try", "revert"] + ["measure"] * 8
                        + ["try", "settle"])
    assert got.count("try") == 3 and policy.settled
    # each try starts exactly when the loss so far is within 2% of the run so far (0/2, 0.2/10.2, 0.4/20.4)
    assert at_tries == [(0.0, 2.0), (0.2, 10.2), (0.4, 20.4)]
    assert policy.lost_seconds == pytest.approx(0.6) and policy.seen_seconds == pytest.approx(40.6)
    unbounded = Policy(W2, max_workers=4, explore_share=1)
    assert [e for e, _ in run(unbounded, [lambda c: obs(c, 10.0 if c == W2 else 12.0)] * 7)] == [
        "warm-up", "try", "revert", "try", "revert", "try", "settle"]
