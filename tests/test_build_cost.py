"""A partial memory cache built before the first epoch: the trial's predicted build against the factory's
real build of that share, in the same process. Before the fix the trial's few cached samples' start-up was
multiplied by length / subset (a 2% share of 10,000 JPEGs predicted at 275-330 s; its real build ~1 s)."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import Dataset

from autotune.config import LoaderConfig, partial_count
from autotune.loader import FactorySite
from autotune.tuner._measure import Plan, Workload, measure


class Decoded(Dataset):
    """Costs real, deterministic CPU work per sample, as a decode does."""

    def __len__(self):
        return 20_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(128, 128, generator=g)
        for _ in range(24):
            x = torch.tanh(x @ x.T / 128)
        return x, i % 10


@pytest.mark.timeout(240)
def test_a_partial_build_first_trial_predicts_the_build_of_its_share_within_3x(tmp_path):
    torch.set_num_threads(1)
    dataset, share, workers = Decoded(), 0.01, 2
    stores = partial_count(share, len(dataset))  # 200 of 20,000: what the run's build holds
    root = tmp_path / "trial"
    root.mkdir(mode=0o700)
    plan = Plan(indices=list(range(0, 20_000, 78))[:256], length=20_000, epochs_measured=1, cache_root=str(root),
                build_workers=workers, sample_memory=False)
    config = LoaderConfig(cache="memory", cache_share=share)
    figures = measure(Workload(dataset=dataset, batch_size=32, epochs=3), config, plan)
    predicted = figures.prediction.build_seconds - figures.prediction.build_fixed_seconds
    old = figures.build_seconds_subset * plan.length / len(plan.indices)  # the projection before the fix

    start = time.perf_counter()
    cache = FactorySite(progress=False, workers=workers).partial(dataset, share, "build")
    real = time.perf_counter() - start
    assert cache.cached == stores == 200

    side_by_side = f"predicted {predicted:.3f} s, real {real:.3f} s, old projection {old:.3f} s"
    print(side_by_side)
    assert real / 3 <= predicted <= 3 * real, side_by_side


def test_a_trial_starts_its_dataloaders_as_the_search_does_not_as_the_forkserver_that_forked_it():
    """A process the forkserver starts defaults to the forkserver; a cache build's read workers (a
    DataLoader without a context) then started a fresh forkserver in the trial (3.1-3.6 s) where the
    user's process forks them (0.06 s)."""
    import multiprocessing

    from autotune.tuner import _runner

    _runner.warm_forkserver()  # the trials' own server (its preload), which later tests of this process share
    ctx = multiprocessing.get_context("forkserver")
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=_start_method_after, args=(queue, _runner.search_start_method()))
    proc.start()
    proc.join(60)
    assert queue.get() == ("forkserver", multiprocessing.get_start_method(allow_none=True)
                           or multiprocessing.get_all_start_methods()[0])


def _start_method_after(queue, method):
    import multiprocessing

    from autotune.tuner import _runner

    before = multiprocessing.get_start_method()
    _runner._start_as_the_search(method)
    queue.put((before, multiprocessing.get_start_method()))
