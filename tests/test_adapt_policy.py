"""The adapting loader's policy: the exact moves it makes for given observations (no clock, no loader).

``explore_share=1`` where a test is about another rule: its slow tries would otherwise exhaust rule 5's
budget (tested on its own)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autotune.config import LoaderConfig
from autotune.recipe._adapt_policy import (
    ASSUMED_START_UP,
    ASSUMED_SWITCH,
    EXPLORE_SHARE,
    LOSS,
    MIN_GAIN,
    Decision,
    EpochObservation,
    Policy,
    moves,
    same_pool,
)

W2 = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork")
W3 = W2.refit(num_workers=3)
W4 = W2.refit(num_workers=4)
W1 = W2.refit(num_workers=1)
Z = W2.refit(num_workers=0)
LOW = 0.05  # a stall under STALL_HIGH (fewer first) and over MIN_GAIN (a move feeding the loader may still pay)


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


def test_a_loader_bound_run_adds_workers_while_each_step_pays_and_never_tries_back_what_it_beat():
    """W3 beat W2 and W4 beat W3, each beyond the noise: the configuration just beaten is not tried back (one
    worker fewer from W4 is W3), so after the two prefetch moves no move is left and the policy settles. A kept
    epoch is the new incumbent's figure: the next move is tried from the next epoch on."""
    policy = Policy(W2, max_workers=4, explore_share=1)
    figures = {W2: 10.0, W3: 8.0, W4: 7.0}  # ms a batch; the step waits (stall 0.5)
    prefetch4 = W4.refit(prefetch_factor=4)
    figures.update({prefetch4: 7.1, W4.refit(prefetch_factor=1): 7.0})
    got = run(policy, [lambda c: obs(c, figures[c])] * 6)
    assert got == [
        ("warm-up", W2), ("try", W3), ("keep", W4), ("keep", prefetch4),  # each kept epoch tries the next move
        ("revert", W4),  # 7.1 is slower
        ("try", W4.refit(prefetch_factor=1)),  # as fast: not beyond the noise
    ]
    assert policy.incumbent == W4 and policy.stats[W4].epochs == [pytest.approx(0.007)] * 2
    assert policy.tried == {W3, prefetch4}
    d = policy.decide(obs(W4.refit(prefetch_factor=1), 7.0))
    assert (d.event, d.config) == ("revert", W4) and policy.rejections == 2
    d = policy.decide(obs(W4, 7.0))
    assert (d.event, d.config) == ("settle", W4) and d.line == "settled: no move left to try" and policy.settled
    assert policy.decide(obs(W4, 7.0)).event == "measure"
    # a drift clears it: W3 may be tried again under the new conditions
    d = policy.decide(obs(W4, 21.0))
    assert d.event == "reopen" and W3 not in policy.tried


def test_a_step_bound_run_tries_fewer_workers_first():
    assert [name for name, _ in moves(W2, 0.01, max_workers=4, cuda=False)] == [
        "fewer workers", "less prefetch", "no workers", "more workers", "more prefetch"]
    assert dict(moves(W2, 0.01, max_workers=4, cuda=False))["no workers"] == Z
    assert "no workers" not in dict(moves(W2, 0.5, max_workers=4, cuda=False))  # the step waits for the loader
    assert "no workers" not in dict(moves(W1, 0.01, max_workers=4, cuda=False))  # fewer workers is that move
    assert [name for name, _ in moves(W2, 0.5, max_workers=4, cuda=True)] == [
        "more workers", "more prefetch", "pin memory", "fewer workers", "less prefetch"]
    plain = LoaderConfig(num_workers=2, prefetch_factor=2, multiprocessing_context="fork")
    assert moves(plain, 0.5, max_workers=2, cuda=False)[0] == ("persistent workers",
                                                              plain.refit(persistent_workers=True))
    assert moves(LoaderConfig(), 0.5, max_workers=2, cuda=False) == [
        ("more workers", LoaderConfig(num_workers=1, prefetch_factor=2, persistent_workers=True))]
    assert moves(W2, 0.5, max_workers=4, cuda=False, first="less prefetch")[0][0] == "less prefetch"
    policy = Policy(W2, max_workers=4, explore_share=1)
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
    policy = Policy(W2, max_workers=4, explore_share=1)
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
    policy = Policy(W2, max_workers=2, explore_share=1)  # no more workers: fewer, less prefetch, none, more prefetch
    figures = iter([10.0, 10.0, 12.0, 10.0, 12.0, 10.0, 12.0])
    got = run(policy, [lambda c: obs(c, next(figures), stall=LOW)] * 7)
    assert [e for e, _ in got] == ["warm-up", "try", "revert", "try", "revert", "try", "settle"]
    assert policy.decide(obs(W2, 10.5, stall=LOW)).event == "measure"  # within DRIFT
    d = policy.decide(obs(W2, 30.0, stall=LOW))  # the step three times heavier
    assert (d.event, d.config) == ("reopen", W1) and not policy.settled
    policy.decide(obs(W1, 40.0, stall=LOW))  # reverted
    assert policy.incumbent == W2
    settled = Policy(W2, max_workers=2, explore_share=1)
    for c in [W2, W2, W1, W2, W2.refit(prefetch_factor=1), W2, Z]:
        settled.decide(obs(c, 10.0 if c == W2 else 12.0, stall=LOW))
    assert settled.settled
    d = settled.decide(obs(W2, 10.0, stall=0.4))  # as fast, but the step now waits
    assert d.event == "reopen" and d.config == W2.refit(prefetch_factor=4)


def test_a_drift_before_settling_clears_the_rejections_judged_before_it():
    """benchmarks/adapt.py's competitor, measured: the moves were rejected on a quiet machine, the
    competitor started on the epoch the policy had left only to settle on, and that slow epoch became the
    reference: the run never reopened, while one move (fewer workers, here) was 1.6x faster by then."""
    policy = Policy(W2, max_workers=2, explore_share=1)  # moves: fewer workers, less prefetch, none, more prefetch
    quiet = {W2: 10.0, W1: 12.0, W2.refit(prefetch_factor=1): 12.0, Z: 12.0, W2.refit(prefetch_factor=4): 12.0}
    got = run(policy, [lambda c: obs(c, quiet[c], stall=LOW)] * 5)
    assert got == [("warm-up", W2), ("try", W1), ("revert", W2), ("try", W2.refit(prefetch_factor=1)),
                   ("revert", W2)]
    d = policy.decide(obs(W2, 30.0, stall=LOW))  # the competitor: three times slower
    assert (d.event, d.config) == ("reopen", W1) and "30.00 ms a batch against 10.00 before" in d.line
    assert policy.decide(obs(W1, 18.0, stall=LOW)).event == "keep" and policy.incumbent == W1
    within = Policy(W2, max_workers=2, explore_share=1)  # a change within DRIFT rejects nothing again
    run(within, [lambda c: obs(c, {W2: 10.0}.get(c, 12.0), stall=LOW)] * 5)
    assert within.decide(obs(W2, 11.0, stall=LOW)) == Decision(Z, "try", "trying no workers: " + Z.describe())


def test_a_drift_inside_an_epoch_is_asked_of_the_incumbents_figure_as_decide_judges_it():
    """The loader asks at its chunk boundaries (``drifting``): the incumbent's steady seconds per batch so far
    against its latest epoch's (or the settled reference), beyond DRIFT and twice the run's noise, the test
    ``decide`` reopens by; never before a measured epoch, never of a move being tried, never in observe mode."""
    policy = Policy(W2, max_workers=2, explore_share=1)
    assert not policy.drifting(W2, 0.030)  # the warm-up measured nothing yet
    run(policy, [lambda c: obs(c, 10.0, stall=LOW)] * 2)  # warm-up, then the incumbent's 10 ms; tries W1
    assert policy.trying is not None and not policy.drifting(W2, 0.030)  # a move under way: rules 2 and 4
    policy.decide(obs(W1, 12.0, stall=LOW))  # reverted
    assert policy.trying is None and policy.incumbent == W2
    assert policy.drifting(W2, 0.030) and policy.drifting(W2, 0.0080)  # three times slower, 20% faster
    assert not policy.drifting(W2, 0.0110)  # 10%: within DRIFT
    assert not policy.drifting(W1, 0.030)  # not the incumbent's part
    noisy = Policy(W2, max_workers=2, explore_share=1)
    run(noisy, [lambda c: obs(c, 10.0, stall=LOW, spread=0.3)] * 2)
    noisy.decide(obs(W1, 12.0, stall=LOW, spread=0.3))
    # chunks ±30%: twice the noise (0.31) is 0.62 needed; 1.5x (0.41) is noise, 2x (0.69) is not
    assert not noisy.drifting(W2, 0.015) and noisy.drifting(W2, 0.020)
    d = noisy.decide(obs(W2, 20.0, stall=LOW, spread=0.3, batches=6))  # the part the loader ended there
    assert d.event == "reopen" and "20.00 ms a batch against 10.00 before" in d.line
    observing = Policy(W2, max_workers=2, observe=True)
    run(observing, [lambda c: obs(c, 10.0, stall=LOW)] * 3)
    assert not observing.drifting(W2, 0.030)


def test_observe_never_moves_and_a_refused_or_callers_setting_is_never_tried():
    observer = Policy(W2, max_workers=4, observe=True)
    assert {d for d, _ in run(observer, [lambda c: obs(c, 10.0)] * 4)} == {"observe"}
    assert observer.stats[W2].epochs == [0.01] * 4
    refused = Policy(W2, max_workers=4, allowed=lambda c: "no room in /dev/shm" if c.num_workers > 2 else None,
                     explore_share=1)
    assert run(refused, [lambda c: obs(c, 10.0)] * 2)[1] == ("try", W2.refit(prefetch_factor=4))
    assert refused.skipped == {W3: "no room in /dev/shm"}
    fixed = Policy(W2, max_workers=4, fixed=frozenset({"num_workers"}), explore_share=1)
    assert run(fixed, [lambda c: obs(c, 10.0)] * 2)[1] == ("try", W2.refit(prefetch_factor=4))


def test_the_thread_split_is_a_move_judged_as_any_other():
    assert [name for name, _ in moves(W2, 0.01, max_workers=4, cuda=False, threads=2)] == [
        "fewer workers", "less prefetch", "more main threads", "no workers", "more workers", "more prefetch",
        "fewer main threads"]
    spawned = W2.refit(multiprocessing_context="spawn", worker_threads=2)
    assert [name for name, _ in moves(spawned, 0.5, max_workers=8, cuda=False, threads=4)] == [
        "more workers", "more prefetch", "fewer main threads", "more worker threads", "fewer workers",
        "less prefetch", "more main threads", "fewer worker threads"]
    assert dict(moves(spawned, 0.5, max_workers=8, cuda=False, threads=4))["more worker threads"].worker_threads == 4
    assert "more worker threads" not in dict(moves(W2, 0.5, max_workers=8, cuda=False, threads=4))  # forked: one
    t4 = W2.refit(main_threads=4)
    pf1 = W2.refit(prefetch_factor=1)
    kept = Policy(W2, max_workers=4, threads=2, explore_share=1)  # the step wants the cores: more main threads pay 20%
    got = run(kept, [lambda c: obs(c, 8.0 if c == t4 else 10.0, stall=0.0)] * 7)
    assert got == [("warm-up", W2), ("try", W1), ("revert", W2), ("try", pf1), ("revert", W2), ("try", t4),
                   ("keep", t4.refit(num_workers=1))]  # kept, and one worker fewer tried from it at once
    assert kept.incumbent == t4 and kept.tried == {W2}
    reverted = Policy(W2, max_workers=4, threads=2, explore_share=1)  # as fast: reverted, the third rejection settles
    got = run(reverted, [lambda c: obs(c, 10.0, stall=0.0)] * 7)
    assert got[-2:] == [("try", t4), ("settle", W2)] and reverted.incumbent == W2
    fixed = Policy(W2, max_workers=4, threads=2, fixed=frozenset({"main_threads"}))
    assert all(c.main_threads is None for _, c in run(fixed, [lambda c: obs(c, 10.0, stall=0.0)] * 8))


def test_a_step_keeping_all_its_threads_busy_tries_more_threads_first():
    """Low stall and a saturated main process: the step is short of cores, and the third move in the low
    stall's order would come after two rejections, one before MAX_REJECTIONS settles the run."""
    assert [name for name, _ in moves(W2, 0.01, max_workers=4, cuda=False, threads=2, cpu_share=1.7)] == [
        "more main threads", "fewer workers", "no workers", "less prefetch", "more workers", "more prefetch",
        "fewer main threads"]
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
    # nothing else is tried from it yet: the pool moves wait for the budget, and two main threads is what it beat
    assert policy.trying is None and "exploration waits" in policy.decide(obs(t4, 8.0, stall=0.0, cpu=1.9)).line
    assert ("fewer main threads", W2.refit(main_threads=2)) in moves(t4, 0.0, max_workers=4, cuda=False, threads=2)


def test_a_crashed_candidate_is_a_rejection_never_tried_again():
    policy = Policy(W2, max_workers=4, explore_share=1)
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
    policy = Policy(W2, max_workers=4, explore_share=1)
    assert run(policy, [lambda c: obs(c, 10.0)] * 2) == [("warm-up", W2), ("try", W3)]
    d = policy.decide(probe(W3, 11.0))  # 10% slower over its first 25 batches: beyond LOSS (6%)
    assert (d.event, d.config) == ("revert", W2) and "first 25 batches" in d.line
    assert policy.rejections == 1 and W3 in policy.tried
    assert policy.spent_seconds == pytest.approx(0.001 * 25)  # a quarter of an epoch at 1 ms over
    # the incumbent's rest of the epoch (its pool restarted: 0.3 s) is not its figure, but its cost is the
    # try's; the next move is tried
    assert policy.decide(part(W2, 10.0, batches=75, start_up=0.3)) == Decision(pf4, "try", "trying more prefetch: "
                                                                              + pf4.describe())
    assert policy.stats[W2].epochs == [0.010]
    assert policy.spent_seconds == pytest.approx(0.025 + 75 * 0.004) == policy.try_costs["pool"]
    d = policy.decide(probe(pf4, 10.3))  # 3% slower on 25 batches: within LOSS, it reads the rest
    assert (d.event, d.config) == ("continue", pf4) and policy.trying == ("more prefetch", pf4)
    d = policy.decide(obs(pf4, 9.0, batches=75))  # judged on all 100: (25 x 10.3 + 75 x 9.0) / 100 ms
    assert (d.event, d.config) == ("keep", W2.refit(prefetch_factor=8)) and policy.incumbent == pf4
    assert policy.stats[pf4].epochs == [pytest.approx((25 * 0.0103 + 75 * 0.009) / 100)]
    # a kept candidate's measured parts count as they were: 25 x 0.3 ms over, 75 x 1 ms under
    assert policy.spent_seconds == pytest.approx(0.325 + 25 * 0.0003 - 75 * 0.001)
    # the noise measured in the run widens the loss a probe is reverted for: 3 x sigma x sqrt(1/8 + 1)
    noisy = Policy(W2, max_workers=4, explore_share=1)
    run(noisy, [lambda c: obs(c, 10.0, spread=0.05)] * 2)
    assert noisy.decide(probe(W3, 11.0)).event == "continue"  # 10% < 3 x 0.052 x 1.06 = 16%


def test_a_probe_leaves_a_fresh_pools_start_up_out_persistent_or_not():
    plain = W3.refit(persistent_workers=False)
    fresh = EpochObservation(config=plain, batches=10, seconds=1.0, wait_seconds=1.0, first_wait_seconds=0.5,
                             fresh_pool=True, probe=True)
    assert fresh.seconds_per_batch == pytest.approx(0.1)  # each epoch of it pays the start-up again
    assert fresh.steady_seconds_per_batch == pytest.approx((1.0 - (0.5 - 0.5 / 9)) / 10)
    policy = Policy(W2, max_workers=4, explore_share=1)
    run(policy, [lambda c: obs(c, 56.0)] * 2)
    policy.trying = ("not persistent", plain)  # a move no rule makes from W2: the probe's figure is the point
    assert policy.decide(fresh).event == "continue"  # steady 55.6 ms a batch: as fast, not the start-up's 100


def part(config, ms_per_batch, batches=100, *, start_up=0.0, overhead=0.0, probe=False, stall=0.5, cpu=0.0):
    """A part as the loader hands it over: each batch waits ``stall`` of its time and the first one a fresh
    pool's ``start_up`` besides; ``overhead``: the loader's own time before it (bookkeeping, a switch)."""
    spb = ms_per_batch / 1e3
    seconds = spb * batches + start_up
    return EpochObservation(config=config, batches=batches, seconds=seconds,
                            wait_seconds=stall * spb * batches + start_up, first_wait_seconds=stall * spb + start_up,
                            chunk_seconds=(spb,) * 8, fresh_pool=start_up > 0, probe=probe,
                            overhead_seconds=overhead, main_cpu_seconds=cpu * seconds)


def drive(policy, rates, epochs, *, start_up, switch, bookkeeping, batches=100):
    """The parts an adapting loader hands over for ``epochs`` epochs: a try's first quarter is its probe, a
    new pool pays ``start_up`` in its first wait and ``switch`` in the loader's own time, every part
    ``bookkeeping``. Returns each decision with the ledger after it, and the run's wall."""
    current, fresh, overhead, probing = policy.incumbent, True, 0.0, False
    wall, trace = 0.0, []
    for _ in range(epochs):
        left = batches
        while left:
            size = batches // 4 if probing else left
            o = part(current, rates[current], size, start_up=start_up if fresh else 0.0, overhead=overhead,
                     probe=probing)
            d = policy.decide(o)
            wall += o.seconds + o.overhead_seconds
            trace.append((d.event, policy.spent_seconds, policy.seen_seconds))
            left -= size
            moved = not same_pool(current, d.config)
            probing = d.event in ("try", "reopen") and d.config != current
            fresh, overhead, current = moved, bookkeeping + (switch if moved else 0.0), d.config
    return trace, wall


def test_the_ledger_is_the_runs_measured_wall_over_the_fixed_runs_and_holds_the_invariant():
    """Where the recipe is the best, every try is a rejection: the ledger counts each try's whole wall (the
    new pool's start-up, the switch there and back, its probe, the incumbent's restart) and the loader's
    bookkeeping, so it equals the adapting run's wall over the fixed run's exactly; a try starts only when
    its price (what nothing stops once started: the switches and start-ups, measured or assumed) and its
    probe at the least loss fit 2% of the run so far, the first one too."""
    rates = {W2: 10.0, W3: 12.0, W2.refit(prefetch_factor=4): 12.0, W1: 12.0}  # ms a batch
    policy = Policy(W2, max_workers=4)
    trace, wall = drive(policy, rates, 200, start_up=0.3, switch=0.1, bookkeeping=0.001)
    fixed = 0.3 + 200 * 100 * 0.010  # the fixed run: its pool's start-up once, every batch at 10 ms
    assert policy.spent_seconds == pytest.approx(wall - fixed)
    tries = [i for i, (event, *_) in enumerate(trace) if event == "try"]
    # the first try (a new pool: the warm-up's measured 0.3 s start-up there and again back, no switch measured
    # yet: 2 x ASSUMED_SWITCH, its probe at the 6% loss: 0.8155 s) waits until 2% of the run reached it plus
    # the bookkeeping so far: epoch 43
    assert policy.start_up == 0.3 and policy.price(W3) == pytest.approx(2 * 0.3 + 2 * 0.101)  # by now measured
    assert tries[0] == 42 and trace[41][0] == "measure"
    # each try's whole cost: 0.1 + 0.001 switching there, 0.3 start-up, 25 x 2 ms probe; 0.101 back, 0.3 restart
    assert policy.try_costs["pool"] == pytest.approx(0.101 + 0.3 + 0.05 + 0.101 + 0.3)
    for i in tries:  # at each start: the ledger and the expectation within 2%
        spent, seen = trace[i][1], trace[i][2]
        expected = 0.8155 if i == tries[0] else 0.852
        assert spent + expected <= EXPLORE_SHARE * seen + 1e-9
    # priced whole before it starts, no try here took the ledger over 2% of the run at any part's end
    assert max(spent - EXPLORE_SHARE * seen for _, spent, seen in trace) <= 0
    assert len(tries) == 3 and policy.settled  # 3 rejections over 200 epochs
    quick = Policy(W2, max_workers=4)  # the same run with pools that start for free: measured, 0.025 + 0.004 a try
    trace, _ = drive(quick, rates, 10, start_up=0.0, switch=0.0, bookkeeping=0.0)
    assert [e for e, *_ in trace][:2] == ["warm-up", "measure"]  # a start-up not measured yet is assumed
    measured = Policy(W2, max_workers=4)  # the warm-up measures a start-up of 1 us; two switches still assumed
    trace, _ = drive(measured, rates, 20, start_up=1e-6, switch=0.0, bookkeeping=0.0)
    events = [e for e, *_ in trace]  # 0.2155 s fits 2% of the 11th epoch; then the switch measured 0 s
    assert events[:14] == ["warm-up"] + ["measure"] * 9 + ["try", "revert", "try", "revert"]


def test_a_move_that_only_feeds_the_loader_is_not_tried_while_the_step_never_waits():
    """No stall worth chasing: a loader the step never waits on cannot make it MIN_GAIN faster by more
    workers, prefetch or persistence; a step-bound run only tries to give the step cores back."""
    none = LoaderConfig()
    assert run(Policy(none, max_workers=2, explore_share=1), [lambda c: obs(c, 10.0, stall=0.01)] * 2) == [
        ("warm-up", none), ("settle", none)]
    assert run(Policy(none, max_workers=2, explore_share=1), [lambda c: obs(c, 10.0, stall=LOW)] * 2) == [
        ("warm-up", none), ("try", W1.refit(multiprocessing_context=None))]
    plain = W2.refit(persistent_workers=False)  # fewer workers still pays for a step-bound run
    assert run(Policy(plain, max_workers=2, explore_share=1), [lambda c: obs(c, 10.0, stall=0.01)] * 2)[1] == (
        "try", plain.refit(num_workers=1))


def test_a_slow_down_that_takes_the_main_processs_cores_tries_fewer_main_threads_first():
    """benchmarks/adapt.py's competitor: two busy processes on 2 CPUs made the step 3x slower with its CPU
    time unchanged (its share of the wall a third), and two parallel main threads waiting for each other
    are the loss: "fewer main threads" (no new pool) leads. A step 3x heavier (its CPU share up) keeps
    the stall's order."""
    t1 = W2.refit(main_threads=1)
    policy = Policy(W2, max_workers=2, threads=2, explore_share=1)
    quiet = [lambda c: part(c, 10.0 if c == W2 else 12.0, stall=LOW, cpu=1.5)] * 4
    assert [e for e, _ in run(policy, quiet)] == ["warm-up", "try", "revert", "try"]  # fewer workers, less prefetch
    policy.decide(part(W2.refit(prefetch_factor=1), 12.0, stall=LOW, cpu=1.5))  # reverted
    d = policy.decide(part(W2, 30.0, stall=LOW, cpu=0.5))  # the same CPU a batch over 3x the wall
    assert (d.event, d.config) == ("reopen", t1)
    heavier = Policy(W2, max_workers=2, threads=2, explore_share=1)
    run(heavier, quiet)
    heavier.decide(part(W2.refit(prefetch_factor=1), 12.0, stall=LOW, cpu=1.5))
    d = heavier.decide(part(W2, 30.0, stall=LOW, cpu=1.8))
    assert (d.event, d.config) == ("reopen", W1)  # the step-bound order: fewer workers first
    lost_a_little = Policy(W2, max_workers=2, threads=2, explore_share=1)  # 0.8 of its share: not starved
    run(lost_a_little, quiet)
    lost_a_little.decide(part(W2.refit(prefetch_factor=1), 12.0, stall=LOW, cpu=1.5))
    assert lost_a_little.decide(part(W2, 30.0, stall=LOW, cpu=1.2)).config == W1
    assert moves(W2, LOW, max_workers=2, cuda=False, threads=2, starved=True)[0] == ("fewer main threads", t1)
    assert moves(W2, LOW, max_workers=2, cuda=False, threads=None, starved=True)[0][0] == "fewer workers"


Z = LoaderConfig()  # no workers: the competitor's recipe
T1 = Z.refit(main_threads=1)
POOL1 = LoaderConfig(num_workers=1, prefetch_factor=2, persistent_workers=True)  # "more workers" from Z


def test_a_try_is_priced_by_its_kind_measured_or_assumed_never_by_another_kinds():
    """Rule 5a: what a try cannot stop once started. A move of the main's threads stays on the pool and goes
    back in place: nothing. A first pool from no workers: a switch there and back (assumed, none measured)
    and its start-up (assumed: forked, or spawned); no incumbent pool to restart. Measured ones replace them."""
    policy = Policy(Z, max_workers=2, threads=2)
    assert policy.price(T1) == 0.0 and policy.way_back(T1) == 0.0
    assert policy.price(POOL1) == pytest.approx(ASSUMED_SWITCH + ASSUMED_START_UP + ASSUMED_SWITCH)
    assert policy.way_back(POOL1) == pytest.approx(ASSUMED_SWITCH)
    spawned = POOL1.refit(multiprocessing_context="spawn")
    assert policy.price(spawned) == pytest.approx(2 * ASSUMED_SWITCH + 2.0)
    pooled = Policy(W2, max_workers=4, threads=2)  # an incumbent pool is restarted after a revert
    pooled.decide(part(W2, 10.0, start_up=0.15, overhead=0.02))  # the warm-up measures its start-up
    assert pooled.start_up == 0.15 and pooled.switch_seconds is None
    assert pooled.price(W3) == pytest.approx(2 * ASSUMED_SWITCH + 2 * 0.15)
    assert pooled.price(W2.refit(main_threads=1)) == 0.0
    # the expectation: the price and the probe (a quarter of the incumbent's part) at the least loss
    pooled.decide(part(W2, 10.0))
    assert pooled.expected_cost(W3, pooled.stats[W2]) == pytest.approx(
        pooled.price(W3) + 25 * 0.010 * (math.exp(LOSS) - 1))


def loader_part(policy, config, ms, batches, *, start_up=0.0, overhead=0.0, probe=False, stall=0.5, cpu=0.0):
    """A try's part as the loader reads it: after each batch it asks ``over_budget`` (rule 5b) and ends the
    part there, ``capped``, when the answer is yes; otherwise the ``batches`` whole (as ``part``)."""
    spb = ms / 1e3
    for n in range(1, batches + 1):
        if n < batches and policy.over_budget(config, start_up + n * spb, n, overhead):
            return dataclasses.replace(part(config, ms, n, start_up=start_up, overhead=overhead, probe=probe,
                                            stall=stall, cpu=cpu), capped=True)
    return part(config, ms, batches, start_up=start_up, overhead=overhead, probe=probe, stall=stall, cpu=cpu)


def test_a_try_that_passes_its_probe_is_ended_where_its_cost_no_longer_fits_the_budget():
    """Rule 5b: a candidate within its probe's loss (4.6% slower, under the 6% reverted for) that is then 40%
    slower for the rest of the epoch would have spent 0.08 s against an allowance of ~0.02 s: the loader ends
    it at the batch where its extra and its way back no longer fit, the policy reverts it (a rejection),
    and the ledger is then within 2% of the run plus that one batch's loss."""
    policy = Policy(Z, max_workers=2, threads=2)
    policy.decide(part(Z, 40.0, batches=32, stall=0.4, cpu=1.5))  # warm-up
    for _ in range(25):  # 25 epochs of 32 ms batches: the first pool's 0.516 s price fits from the 26th
        d = policy.decide(part(Z, 32.0, batches=32, stall=0.4, cpu=1.5))
    assert (d.event, d.config) == ("try", POOL1)
    assert policy.spent_seconds == 0.0 and policy.left() == pytest.approx(0.02 * (1.28 + 25 * 1.024))
    probe_obs = loader_part(policy, POOL1, 32.0 * math.exp(0.045), 8, start_up=0.2, overhead=0.05, probe=True)
    assert not probe_obs.capped
    assert policy.decide(probe_obs).event == "continue"
    spent = 0.05 + 0.2 + 8 * 0.032 * (math.exp(0.045) - 1)
    assert policy.spent_seconds == pytest.approx(spent)
    rest = loader_part(policy, POOL1, 44.8, 24)  # 40% slower: 12.8 ms over a batch
    assert rest.capped and rest.batches < 24
    # it crossed at that batch: its extra and the way back (the switch there, measured: 0.05 s) no longer fit;
    # the batch before they did
    assert policy.way_back(POOL1) == pytest.approx(0.05)
    n = rest.batches
    assert n == 20
    assert spent + n * 0.0128 + 0.05 > 0.02 * (policy.seen_seconds + n * 0.0448)
    assert spent + (n - 1) * 0.0128 + 0.05 <= 0.02 * (policy.seen_seconds + (n - 1) * 0.0448)
    d = policy.decide(rest)
    assert (d.event, d.config) == ("revert", Z) and "over its budget" in d.line
    assert policy.rejections == 1 and POOL1 in policy.tried and policy.trying is None
    policy.decide(part(Z, 32.0, batches=24 - n, overhead=0.05, stall=0.4, cpu=1.5))  # the rest, the way back
    assert policy.spent_seconds == pytest.approx(spent + n * 0.0128 + 0.05)
    # the run's seconds, part by part (warm-up, 25 epochs, the probe, the capped rest, the incumbent's rest)
    seen = 1.28 + 25 * 1.024 + (8 * 0.032 * math.exp(0.045) + 0.2 + 0.05) + n * 0.0448 + ((24 - n) * 0.032 + 0.05)
    assert policy.seen_seconds == pytest.approx(seen)
    # over 2% of the run by exactly what the crossing batch added beyond the allowance the batch before left
    # (the two crossing lines above put it inside that one batch's 12.8 ms loss)
    assert policy.spent_seconds - EXPLORE_SHARE * policy.seen_seconds == pytest.approx(
        spent + n * 0.0128 + 0.05 - EXPLORE_SHARE * seen)
    assert POOL1 not in policy.stats  # a capped part is no figure of its configuration


def test_a_drift_after_an_expensive_first_try_gets_a_try_by_the_epoch_after_it():
    """benchmarks/adapt.py's competitor (the last quiet run): no workers; a first try of a pool spent the whole
    allowance before the competitor; after the drift the cheap move (fewer main threads, in place, 2.4x
    faster) waited three epochs for the allowance to grow. Now the pool's try is priced (assumed start-up)
    and held by the budget as it runs, a thread move's price is nothing, and a drift drops the old tries'
    costs: the thread move starts at the end of the epoch the drift was seen in, and is kept."""
    policy = Policy(Z, max_workers=2, threads=2)
    policy.decide(part(Z, 40.0, batches=32, stall=0.4, cpu=1.5))
    for _ in range(25):
        policy.decide(part(Z, 32.0, batches=32, stall=0.4, cpu=1.5))
    assert policy.trying == ("more workers", POOL1)
    # the expensive try: a start-up of 0.4 s (over the assumed 0.3), then twice as slow: ended by the budget
    first = loader_part(policy, POOL1, 64.0, 8, start_up=0.4, overhead=0.05, probe=True)
    assert first.capped and first.batches == 1
    assert policy.decide(first).event == "revert"
    policy.decide(part(Z, 32.0, batches=31, overhead=0.1, stall=0.4, cpu=1.5))  # the rest, restarted
    # the ledger over 2% by the start-up's excess over its price and the one batch, no more
    over = policy.spent_seconds - EXPLORE_SHARE * policy.seen_seconds
    assert 0 < over <= (0.4 - ASSUMED_START_UP) + 0.032
    assert policy.try_costs["pool"] == pytest.approx(policy.spent_seconds)
    # the competitor, from the 9th batch of an epoch: three times slower, the main's CPU share a third
    # (starved: fewer main threads leads); the loader ends the incumbent's part there (``drifting``)
    assert policy.drifting(Z, 0.096)
    # the part the drift ended, as the loader hands it over (mid-epoch): the probe the cheap move is priced by is
    # a quarter of that part (at least MIN_BATCHES) at the new rate; priced by the whole epoch's quarter, it
    # waited the epoch out (benchmarks/adapt.py's competitor: 56 s for an epoch the adapting run had taken 3.4 s)
    d = policy.decide(at(part(Z, 96.0, batches=8, stall=0.15, cpu=0.5), mid_epoch=True))
    assert (d.event, d.config) == ("reopen", Z) and "fewer main threads would cost 0.02 s" in d.line
    assert policy.try_costs == {}  # the pool's try, measured under the old conditions, is no expectation now
    d = policy.decide(part(Z, 96.0, batches=24, stall=0.15, cpu=0.5))  # the rest of the drift's epoch
    assert (d.event, d.config) == ("try", T1)  # the next epoch starts with it
    assert policy.trying == ("fewer main threads", T1)
    probe_obs = loader_part(policy, T1, 41.0, 8, probe=True, stall=0.3, cpu=0.9)
    assert not probe_obs.capped and policy.decide(probe_obs).event == "continue"
    rest = loader_part(policy, T1, 41.0, 24, stall=0.3, cpu=0.9)
    assert not rest.capped  # faster: its extra only falls
    assert policy.decide(rest).event == "keep" and policy.incumbent == T1


def test_a_kept_moves_gain_is_not_banked_for_losing_to_the_new_incumbent():
    """benchmarks/adapt.py's competitor (loaded): fewer main threads kept at 12x left the ledger at -5 s, which
    then paid a whole probe of the next thread move 12x slower than the new incumbent (2.5 s). Once kept, the
    candidate is the incumbent the extra is counted against: the ledger goes to zero, and the next bad try is
    ended within the allowance. The split the kept move beat (the process's four threads, set or not) is not
    tried back."""
    t2, t1 = Z.refit(main_threads=2), Z.refit(main_threads=1)
    policy = Policy(Z, max_workers=4, threads=4, fixed=frozenset({"num_workers"}))
    policy.decide(part(Z, 30.0, stall=LOW))
    d = policy.decide(part(Z, 30.0, stall=LOW))
    assert (d.event, d.config) == ("try", t2)
    assert policy.decide(loader_part(policy, t2, 10.0, 25, probe=True, stall=LOW)).event == "continue"
    assert policy.spent_seconds == pytest.approx(-0.5)  # 25 batches 20 ms under the incumbent
    d = policy.decide(loader_part(policy, t2, 10.0, 75, stall=LOW))
    assert (d.event, d.config) == ("keep", t1)  # kept, and the next move tried from its epoch at once
    assert policy.spent_seconds == 0.0  # not -2 s
    probe_obs = loader_part(policy, t1, 30.0, 25, probe=True, stall=LOW)
    assert probe_obs.capped and probe_obs.batches == 8  # 0.020 n > 2% of (7 s + 0.030 n) from n = 8
    assert policy.decide(probe_obs).event == "revert"
    # the ledger: the kept move's -2 s not banked (0), then the capped probe's 8 batches 20 ms over the incumbent;
    # the run: 2 x 3 s of Z, 100 batches of T1, the probe's 8 batches
    assert policy.spent_seconds == pytest.approx(8 * 0.020)
    assert policy.seen_seconds == pytest.approx(2 * 3.0 + 100 * 0.010 + 8 * 0.030)
    # over 2% of the run by less than the one batch that crossed it: 0.16 - 0.02 x 7.24 = 0.0152 s
    assert policy.spent_seconds - EXPLORE_SHARE * policy.seen_seconds == pytest.approx(
        8 * 0.020 - EXPLORE_SHARE * (2 * 3.0 + 100 * 0.010 + 8 * 0.030))


NP = W2.refit(persistent_workers=False)  # a pool that restarts every epoch (the competitor's and phase's recipe)


def at(o, *, mid_epoch):
    """``o`` ended mid-epoch (at a chunk boundary) or at its epoch's end: where the next part starts."""
    return dataclasses.replace(o, mid_epoch=mid_epoch)


def test_a_part_a_drift_ended_spreads_its_pools_start_up_over_the_epoch_as_the_fixed_run_pays_it():
    """The loader ends the incumbent's part on a drift in a pool that restarts every epoch too. Its figure holds
    the pool's start-up once an epoch, as the fixed run pays it: 0.3 s over the 100 batches of the incumbent's
    epoch, not over the 20 of the part (15 ms a batch more: a slow-down the fixed run does not have, which
    would reopen the search where nothing changed, or make the next try look faster)."""
    def measured():
        policy = Policy(NP, max_workers=2, explore_share=0.0)  # it measures, and never tries a move
        policy.decide(part(NP, 10.0, start_up=0.3))
        assert policy.decide(part(NP, 10.0, start_up=0.3)).event == "measure"
        assert policy.stats[NP].epochs == [pytest.approx(0.013)] and policy.stats[NP].steady == pytest.approx(0.010)
        return policy

    same = measured()
    assert not same.drifting(NP, 0.0102)  # the loader's steady rate from the part's first batch on
    ended = dataclasses.replace(part(NP, 10.0, batches=20, start_up=0.3), mid_epoch=True, span=100)
    d = same.decide(ended)  # the loader ended it after 20 of the epoch's 100 batches
    assert d.event == "measure" and same.stats[NP].epochs[-1] == pytest.approx(0.013)
    slower = measured()
    assert slower.drifting(NP, 0.030)
    d = slower.decide(dataclasses.replace(part(NP, 30.0, batches=20, start_up=0.3), mid_epoch=True, span=100))
    assert d.event == "reopen" and slower.stats[NP].epochs[-1] == pytest.approx(0.033)


def test_a_tries_price_is_what_the_run_pays_beyond_the_fixed_run_at_the_same_point():
    """Rule 5a's invariant, for every kind of move, at an epoch boundary and mid-epoch, from a pool that restarts
    every epoch and from a persistent one: the switch there and back (assumed: 0.1 s each), the new pool's
    start-up and the incumbent's again (measured: 0.15 s), less the incumbent's restart, which a
    non-persistent pool's fixed run pays at an epoch boundary too. A thread move is nothing anywhere."""
    s, w = 0.15, ASSUMED_SWITCH
    restarts = Policy(NP, max_workers=4, cuda=True, threads=2)
    restarts.decide(part(NP, 10.0, start_up=s))  # the warm-up measures the start-up
    persistent = Policy(W2, max_workers=4, cuda=True, threads=2)
    persistent.decide(part(W2, 10.0, start_up=s))
    assert restarts.start_up == persistent.start_up == s and restarts.switch_seconds is None
    for policy in (restarts, persistent):
        inc = policy.incumbent
        pool_moves = {"more workers": inc.refit(num_workers=3), "more prefetch": inc.refit(prefetch_factor=4),
                      "less prefetch": inc.refit(prefetch_factor=1), "pin memory": inc.refit(pin_memory=True),
                      "persistence": inc.refit(persistent_workers=not inc.persistent_workers)}
        for name, config in pool_moves.items():
            mid = policy.price(config, epoch_start=False)
            assert mid == pytest.approx(2 * w + 2 * s), name  # mid-epoch: only the adapting run restarts
            assert policy.price(config, epoch_start=True) == pytest.approx(
                2 * w + s if policy is restarts else 2 * w + 2 * s), name
        no_workers = inc.refit(num_workers=0, prefetch_factor=None, persistent_workers=False)
        assert policy.price(no_workers, epoch_start=False) == pytest.approx(2 * w + s)  # the way back's start-up
        assert policy.price(no_workers, epoch_start=True) == pytest.approx(2 * w if policy is restarts else 2 * w + s)
        for epoch_start in (True, False):
            assert policy.price(inc.refit(main_threads=1), epoch_start=epoch_start) == 0.0
    # without an incumbent pool there is no restart to pay, at an epoch boundary or not
    bare = Policy(Z, max_workers=2, threads=2)
    assert bare.price(POOL1, epoch_start=True) == bare.price(POOL1, epoch_start=False) == pytest.approx(
        2 * w + ASSUMED_START_UP)
    # unstated, the point is where the next part starts: the last observation's end
    restarts.decide(at(part(NP, 10.0, batches=50), mid_epoch=True))
    assert restarts.price(W3) == pytest.approx(2 * w + 2 * s)
    restarts.decide(at(part(NP, 10.0, batches=50), mid_epoch=False))
    assert restarts.price(W3) == pytest.approx(2 * w + s)


def test_a_try_from_a_pool_that_restarts_every_epoch_is_charged_as_priced_where_it_starts():
    """The ledger follows the price: a try starting an epoch from a non-persistent pool is charged its wall
    over the fixed run's from the same point (the incumbent's restart, 0.15 s, then its 10 ms batches), so its
    own start-up is not extra; started mid-epoch, it is. Each try is afforded at its price: at the epoch
    boundary the first move, persistence, fits 2% of the run from the 16th epoch (0.35 s and the probe's
    0.0178 s), not the 23rd its old price (0.5 s) waited for, and the budget check does not end it at once."""
    policy = Policy(NP, max_workers=4)
    events = [policy.decide(part(NP, 10.0, start_up=0.15)).event for _ in range(16)]  # 1.15 s an epoch
    assert events == ["warm-up"] + ["measure"] * 14 + ["try"]
    assert policy.trying == ("persistent workers", W2)
    expected = 0.35 + 25 * 0.0115 * (math.exp(LOSS) - 1)  # the probe at the incumbent's figure, 11.5 ms a batch
    assert policy.expected_cost(W2, policy.stats[NP]) == pytest.approx(expected)
    assert EXPLORE_SHARE * 15 * 1.15 < expected <= EXPLORE_SHARE * 16 * 1.15
    probe_obs = loader_part(policy, W2, 10.0, 25, start_up=0.15, overhead=0.1, probe=True)
    assert not probe_obs.capped  # 0.35 s reserved against 0.368 s allowed: fits, as priced
    assert policy.decide(probe_obs).event == "continue"
    assert policy.spent_seconds == pytest.approx(0.1)  # the switch alone: the start-up replaced the restart
    d = policy.decide(part(W2, 10.0, batches=75))
    assert (d.event, d.config) == ("keep", W2) and policy.spent_seconds == pytest.approx(0.1)
    # the same try mid-epoch (a long epoch's chunk boundary): its start-up is beyond the fixed run's
    mid = Policy(NP, max_workers=4, explore_share=1)
    mid.decide(part(NP, 10.0, start_up=0.15))
    mid.decide(part(NP, 10.0, start_up=0.15))
    d = mid.decide(at(part(NP, 10.0, batches=50), mid_epoch=True))  # the incumbent's second part, no restart
    assert (d.event, d.config) == ("try", W2)
    mid.decide(part(W2, 10.0, batches=12, start_up=0.15, overhead=0.1, probe=True))
    assert mid.spent_seconds == pytest.approx(0.1 + 0.15)


def test_an_unaffordable_move_leaves_the_next_affordable_one_to_be_tried():
    """Rule 5a: the moves in their order of promise; one the budget cannot pay for yet does not hold up the
    next that it can. With a step that barely waits, fewer workers and less prefetch lead (new pools: 0.5 s and
    the probe) and more main threads follows (in place: the probe alone, 25 batches at 6% over 10 ms); after
    the warm-up (1.15 s) and one epoch (1 s), 2% of the run (0.043 s) pays the third only, so it is tried."""
    policy = Policy(W2, max_workers=4, threads=2)
    policy.decide(part(W2, 10.0, start_up=0.15, stall=LOW))
    floor = 25 * 0.010 * (math.exp(LOSS) - 1)
    d = policy.decide(part(W2, 10.0, stall=LOW))
    more_main = W2.refit(main_threads=4)
    assert (d.event, d.config) == ("try", more_main) and d.line.startswith("trying more main threads")
    assert policy.expected_cost(W1, policy.stats[W2]) == pytest.approx(2 * ASSUMED_SWITCH + 2 * 0.15 + floor)
    assert policy.expected_cost(more_main, policy.stats[W2]) == pytest.approx(floor)
    assert policy.spent_seconds == 0.0 and policy.left() == pytest.approx(EXPLORE_SHARE * 2.15)
    # the try, 2% slower throughout: within its probe's loss, then judged whole and reverted; the ledger holds
    # its 100 batches' 0.2 ms each, the run 2.15 s and its 1.02 s
    probe_obs = loader_part(policy, more_main, 10.2, 25, probe=True, stall=LOW)
    assert not probe_obs.capped and policy.decide(probe_obs).event == "continue"
    rest = loader_part(policy, more_main, 10.2, 75, stall=LOW)
    assert not rest.capped and policy.decide(rest).event == "revert"
    assert policy.spent_seconds == pytest.approx(100 * 0.0002)
    assert policy.seen_seconds == pytest.approx(2.15 + 1.02)
    assert policy.left() == pytest.approx(EXPLORE_SHARE * 3.17 - 0.02)


def test_exploration_waits_only_when_no_move_is_affordable_and_the_ledger_stays_in_budget():
    """With the thread split fixed, every move is a new pool (0.5 s and the probe): none fits 2% of the first
    epochs, so the policy waits, saying the most promising one's cost, the ledger untouched; the first try
    starts at the epoch whose 2% pays it, and the ledger then holds exactly what it spent."""
    # no workers refused: the one move without a pool of its own to start (priced lower, it would go first)
    policy = Policy(W2, max_workers=4, threads=2, fixed=frozenset({"main_threads"}),
                    allowed=lambda c: None if c.num_workers else "refused here")
    policy.decide(part(W2, 10.0, start_up=0.15, stall=LOW))
    expected = 2 * ASSUMED_SWITCH + 2 * 0.15 + 25 * 0.010 * (math.exp(LOSS) - 1)
    d = policy.decide(part(W2, 10.0, stall=LOW))
    assert (d.event, d.config) == ("measure", W2)
    assert d.line == (f"exploration waits: fewer workers would cost {expected:.2f} s, 0.04 s of its 2% of "
                      "2.15 s left")
    epochs = 2
    while d.event == "measure":
        d = policy.decide(part(W2, 10.0, stall=LOW))
        epochs += 1
        assert policy.spent_seconds == 0.0
    # the first epoch whose 2% covers the expectation: 1.15 s and 1 s an epoch after it
    assert epochs == 1 + math.ceil((expected / EXPLORE_SHARE - 1.15) / 1.0)
    assert (d.event, d.config) == ("try", W1)
    seen = policy.seen_seconds
    assert seen == pytest.approx(1.15 + (epochs - 1) * 1.0)
    # its probe as fast as the incumbent, its pool's start-up 0.15 s and the switch there 0.1 s: charged exactly
    probe_obs = loader_part(policy, W1, 10.0, 25, start_up=0.15, overhead=0.1, probe=True, stall=LOW)
    assert not probe_obs.capped
    policy.decide(probe_obs)
    assert policy.spent_seconds == pytest.approx(0.25)
    assert policy.left() == pytest.approx(EXPLORE_SHARE * (seen + 0.25 + 0.25) - 0.25)


def test_persistence_is_tried_only_where_the_restart_it_saves_could_be_worth_a_switch():
    """Rule 5: a pool that restarts every epoch is made persistent only where its measured start-up reaches
    MIN_GAIN of the epoch: 0.02 s of a 1 s epoch could never pay 3%, 0.15 s could; before a start-up was
    measured, it is tried as before."""
    small = Policy(NP, max_workers=2, explore_share=1)
    small.decide(part(NP, 10.0, start_up=0.02, stall=LOW))
    d = small.decide(part(NP, 10.0, start_up=0.02, stall=LOW))
    assert small.stats[NP].start_up is not None and small.stats[NP].start_up == pytest.approx(0.02)
    assert (d.event, d.config) == ("try", NP.refit(num_workers=1))  # fewer workers: persistence skipped
    large = Policy(NP, max_workers=2, explore_share=1)
    large.decide(part(NP, 10.0, start_up=0.15, stall=LOW))
    d = large.decide(part(NP, 10.0, start_up=0.15, stall=LOW))
    assert (d.event, d.config) == ("try", W2)
    unmeasured = Policy(NP, max_workers=2, explore_share=1)  # parts that started no pool: no start-up known
    unmeasured.decide(part(NP, 10.0, stall=LOW))
    d = unmeasured.decide(part(NP, 10.0, stall=LOW))
    assert unmeasured.stats[NP].start_up is None and (d.event, d.config) == ("try", W2)


def test_a_step_short_of_cores_reaches_no_workers_where_one_worker_fewer_is_no_faster():
    """benchmarks/adapt.py's phase change, as its run measured it (2 CPUs, ms a batch): two workers and one
    main thread 33 ms, two main threads 28, one worker 30 (no faster), no workers 20. The main keeps its
    thread busy, so more main threads lead, then fewer workers, then no workers, which is kept."""
    start = NP.refit(main_threads=1)
    t2 = start.refit(main_threads=2)
    rates = {start: 33.0, t2: 28.0, t2.refit(num_workers=1): 30.0, t2.refit(num_workers=0): 20.0}
    policy = Policy(start, max_workers=2, threads=2, explore_share=1)
    got = run(policy, [lambda c: part(c, rates.get(c, 40.0), start_up=0.03 if c.num_workers else 0.0, stall=LOW,
                                      cpu=0.9 * (c.main_threads or 2))] * 5)
    assert got == [("warm-up", start), ("try", t2), ("keep", t2.refit(num_workers=1)), ("revert", t2),
                   ("try", t2.refit(num_workers=0))]
    d = policy.decide(part(t2.refit(num_workers=0), 20.0, stall=LOW, cpu=1.8))
    assert d.event == "keep" and policy.incumbent == t2.refit(num_workers=0)


def test_a_kept_thread_move_weighs_persistence_by_its_pools_start_up():
    """A move of the main's threads kept mid-epoch starts no pool of its own, so its figures hold no start-up;
    the pool's, measured under the old split (0.02 s an epoch of 3 s, under the 3% a switch is kept for), still
    says persistence cannot pay, and the next move tried is one worker fewer (benchmarks/adapt.py's phase change
    tried persistence there, and kept it on noise)."""
    start = NP.refit(main_threads=1)
    t2 = start.refit(main_threads=2)
    policy = Policy(start, max_workers=2, threads=2, explore_share=1)
    policy.decide(part(start, 30.0, start_up=0.02, stall=LOW, cpu=0.9))
    d = policy.decide(at(part(start, 30.0, start_up=0.02, stall=LOW, cpu=0.9), mid_epoch=False))
    assert (d.event, d.config) == ("try", t2)  # the step keeps its one thread busy
    d = policy.decide(at(part(t2, 20.0, stall=LOW, cpu=1.8), mid_epoch=False))  # in place: no start-up of its own
    assert policy.stats[t2].start_up is None
    assert (d.event, d.config) == ("keep", t2.refit(num_workers=1)), d.line


def test_the_rest_a_revert_gave_back_that_drifted_reopens_and_its_slowdown_is_not_the_trys_cost():
    """A competitor that starts while a move is tried: the try is reverted (its probe slower than the old
    figure), and the incumbent's rest of the epoch runs three times slower, beyond DRIFT and its restart. That
    rest is the incumbent's figure now (the fixed run pays the slowdown too): the rejections judged before are
    cleared and the search reopens from it, the ledger charged the rest's restart only; ``drifting`` asks
    the same of it mid-part."""
    policy = Policy(W2, max_workers=4, explore_share=1)
    assert run(policy, [lambda c: obs(c, 10.0)] * 2) == [("warm-up", W2), ("try", W3)]
    assert policy.decide(probe(W3, 30.0)).event == "revert"
    spent = policy.spent_seconds
    assert spent == pytest.approx(25 * 0.020) and policy.rejections == 1
    assert policy.drifting(W2, 0.030) and not policy.drifting(W2, 0.011)
    d = policy.decide(part(W2, 30.0, batches=75, start_up=0.3))
    assert d.event == "reopen" and "30.00 ms a batch against 10.00 before" in d.line
    assert policy.stats[W2].epochs == [pytest.approx(0.030)] and policy.rejections == 0 and not policy.tried
    assert policy.spent_seconds == pytest.approx(spent + 0.3)  # the restart, not 75 batches at 20 ms over


def test_a_revert_of_a_pool_that_restarts_every_epoch_is_judged_steady_against_steady():
    """The incumbent restarts every epoch (0.3 s of a 1.3 s epoch, in its figure of 13 ms a batch). A try is
    reverted at its probe mid-epoch and the incumbent's pool starts again for the rest: at its steady 10 ms that
    rest is no drift (steady against the figure's steady, not against 13 ms), is not the figure, and is charged
    its restart (mid-epoch the fixed run pays none); three times slower, it reopens, charged the restart only."""
    def reverted():
        policy = Policy(NP, max_workers=4, explore_share=1)
        for _ in range(2):
            policy.decide(part(NP, 10.0, start_up=0.3, stall=LOW))
        assert policy.stats[NP].epochs == [pytest.approx(0.013)] and policy.trying is not None
        assert policy.decide(part(policy.trying[1], 30.0, batches=25, start_up=0.3, probe=True)).event == "revert"
        return policy, policy.spent_seconds

    same, before = reverted()
    rest = at(part(NP, 10.0, batches=75, start_up=0.3, stall=LOW), mid_epoch=True)
    assert not same.drifting(NP, rest.steady_seconds_per_batch)
    assert same.decide(rest).event == "try" and same.stats[NP].epochs == [pytest.approx(0.013)]
    assert same.spent_seconds == pytest.approx(before + 0.3)
    slower, before = reverted()
    d = slower.decide(at(part(NP, 30.0, batches=75, start_up=0.3, stall=LOW), mid_epoch=True))
    assert d.event == "reopen" and slower.rejections == 0
    assert slower.spent_seconds == pytest.approx(before + 0.3)


def test_a_drift_in_the_rest_after_the_revert_that_settled_the_run_reopens_it():
    """The third rejection settles the run at its probe's revert; the incumbent's rest of that epoch then runs
    three times slower (a competitor): the settled reference is left beyond DRIFT, so the run reopens there,
    with the rejections cleared, as a whole epoch's drift would (one mechanism for both)."""
    policy = Policy(W2, max_workers=2, explore_share=1)
    policy.decide(obs(W2, 10.0, stall=LOW))  # warm-up
    d = policy.decide(obs(W2, 10.0, stall=LOW))
    for _ in range(2):
        assert d.event == "try"
        assert policy.decide(probe(d.config, 30.0, stall=LOW)).event == "revert"
        d = policy.decide(obs(W2, 10.0, batches=75, stall=LOW))
    assert d.event == "try" and policy.decide(probe(d.config, 30.0, stall=LOW)).event == "settle"
    assert policy.settled and policy.rejections == 3
    d = policy.decide(obs(W2, 30.0, batches=75, stall=LOW))
    assert d.event == "reopen" and "30.00 ms a batch against 10.00 before" in d.line
    assert not policy.settled and policy.rejections == 0 and policy.stats[W2].epochs == [pytest.approx(0.030)]
