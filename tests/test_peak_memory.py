"""The peak memory a recipe reports is the whole run's: a memory cache holds every sample, not the subset's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from autotune.config import LoaderConfig
from autotune.machine._memory import tree_pss
from autotune.tuner._measure import Plan, Workload, measure, whole_run_peak

MIB = 1 << 20


class MebibyteRows(Dataset):
    """1000 samples of exactly 1 MiB (float32), so a cache of all of them holds 1000 MiB."""

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return torch.full((MIB // 4,), float(i))


def test_only_the_cache_scales_with_the_length():
    # 300 MiB measured with a 50-sample cache of 50 MiB: the whole run's cache holds 1000 MiB
    assert whole_run_peak(300 * MIB, 50 * MIB, 50, 1000) == 1250 * MIB
    assert whole_run_peak(300 * MIB, 0, 50, 1000) == 300 * MIB  # no memory cache: nothing grows
    assert whole_run_peak(300 * MIB, 50 * MIB, 1000, 1000) == 300 * MIB  # measured on everything
    assert whole_run_peak(0, 50 * MIB, 50, 1000) == 0  # memory not sampled


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fill", ["build", "first_epoch"])
def test_a_memory_cache_on_a_subset_reports_the_whole_datasets_bytes(fill):
    config = LoaderConfig(cache="memory", cache_fill=fill, num_workers=2 if fill == "first_epoch" else 0,
                          prefetch_factor=2 if fill == "first_epoch" else None,
                          multiprocessing_context="fork" if fill == "first_epoch" else None)
    plan = Plan(indices=list(range(0, 1000, 20)), length=1000, epochs_measured=2)
    figures = measure(Workload(dataset=MebibyteRows(), batch_size=10, epochs=2), config, plan)
    # the subset's cache held 50 MiB; the whole run's holds all 1000 samples
    assert figures.peak_memory_bytes >= 1000 * MIB


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fill", ["build", "first_epoch"])
def test_a_partial_memory_cache_on_a_subset_reports_its_share_of_the_whole(fill):
    # The run caches indices 0..299 (30%); the subset of every 20th index holds 15 of them in memory.
    config = LoaderConfig(cache="memory", cache_share=0.3, cache_fill=fill)
    plan = Plan(indices=list(range(0, 1000, 20)), length=1000, epochs_measured=2)
    before = tree_pss()  # the peak is this process's: in a suite's worker it holds what earlier tests left
    figures = measure(Workload(dataset=MebibyteRows(), batch_size=10, epochs=2), config, plan)
    assert figures.measured_samples == 50
    # 15 of the subset's 50 samples held: 300 of the whole run's 1000, not all of them. The whole run's 285 MiB
    # beyond the subset's are added (unscaled, the peak would be ~15-50 MiB over the process's memory before;
    # scaled as a whole cache, over 950 MiB); that memory may shrink a few MiB meanwhile in a suite's worker.
    assert 200 * MIB <= figures.peak_memory_bytes - before < 950 * MIB, (figures.peak_memory_bytes, before)


@pytest.mark.timeout(120)
def test_a_candidate_whose_whole_run_is_over_the_budget_fails():
    # The subset's trial holds 50 MiB of cache and fits 900 MiB; the whole run would hold 1000 MiB. The search
    # must never pick it: where the budget is a job's limit, the recipe would be OOM-killed.
    from pathlib import Path

    from autotune.tuner._runner import Runner, TrialFailed

    runner = Runner(Workload(dataset=MebibyteRows(), batch_size=10, epochs=1), [str(Path(__file__).parent)],
                    memory_limit=900 * MIB)
    plan = Plan(indices=list(range(0, 1000, 20)), length=1000, epochs_measured=1)
    with pytest.raises(TrialFailed, match=r"its whole run needs 1\.\d GiB .*over the memory budget of 900\.0 MiB"):
        runner.run(LoaderConfig(cache="memory"), plan, timeout=90)
    fits = runner.run(LoaderConfig(cache="memory", cache_share=0.3), plan, timeout=90)
    assert fits.peak_memory_bytes <= 900 * MIB
    # The budget holds what the trial adds to the job: the forkserver's interpreter, resident before the budget
    # was read and shared by the forked trial, is in the PSS (~n/(n+1) of it) but not in what the trial adds.
    assert fits.added_memory_bytes is not None
    assert 300 * MIB <= fits.added_memory_bytes <= fits.peak_memory_bytes - 50 * MIB, fits
