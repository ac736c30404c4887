"""How many samples a trial measures: about the trial's seconds of loading and training, whole batches."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from autotune.dataset._probe import Probe, probe_dataset, time_step
from autotune.dataset._userfile import UserSpec
from autotune.tuner._preparation import subset_size


def probe(length: int, sample_seconds: float) -> Probe:
    return Probe(length=length, sample_seconds=sample_seconds, sample_bytes=16.0, batch_bytes=128,
                 deterministic=True, determinism_note="", fingerprint="f")


class Rows(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.full((3,), float(i))


class RecordingStep:
    def __init__(self):
        self.batches = []

    def __call__(self, batch):
        self.batches.append(batch.clone())


class FailingStep:
    def __call__(self, batch):
        raise RuntimeError("needs a GPU")


def test_loading_alone_sizes_the_subset_without_a_train_step():
    assert subset_size(probe(512, 0.001), 8, 1.0) == 512  # 1000 samples' worth: everything
    assert subset_size(probe(5000, 0.001), 8, 1.0) == 1000
    assert subset_size(probe(5000, 0.01), 64, 1.0) == 256  # at least four batches


def test_a_slow_step_shrinks_the_subset_so_several_trials_fit():
    # 1 ms to load a sample, 60 ms a step of 8: 8.5 ms a sample, so a 1 s trial reads 117 -> 14 batches of 8.
    assert subset_size(probe(512, 0.001), 8, 1.0, step_seconds=0.060) == 112
    assert subset_size(probe(512, 0.001), 8, 1.0, step_seconds=10.0) == 32  # never under four batches


def test_the_probe_times_the_step_on_the_batch_it_collated():
    step = RecordingStep()
    probe_dataset(UserSpec(dataset=Rows(), source="rows.py", batch_size=4, train_step=step))
    assert len(step.batches) == 2  # a warm-up call, then the one timed against it
    rows = sorted(int(b[0]) for b in step.batches[0])  # the probe's eight seeded samples, collated once
    assert len(rows) == 8 and len(set(rows)) == 8
    assert all(torch.equal(b, torch.stack([torch.full((3,), float(i)) for i in b[:, 0].tolist()])) for b in step.batches)
    assert torch.equal(step.batches[0], step.batches[1])


def test_no_step_or_a_failing_one_counts_as_free():
    batch = torch.zeros(8, 3)
    assert time_step(None, batch) == 0.0
    assert time_step(FailingStep(), batch) == 0.0
    assert probe_dataset(UserSpec(dataset=Rows(), source="rows.py")).step_seconds == 0.0


def test_trial_seconds_is_the_budgets_share_unless_given(tmp_path):
    """--trial-seconds sizes the default's trial (and so the subset) whatever the budget; without it a trial is
    the budget / 50, 1 to 10 s. A generous wall with short trials is what the tests' searches need."""
    from autotune.cli._main import build_parser
    from autotune.cli._search import options_from
    from autotune.tuner._options import SearchOptions
    from autotune.tuner._preparation import prepare

    assert [SearchOptions(budget=b).default_trial_seconds for b in (20, 300, 3600)] == [1.0, 6.0, 10.0]
    assert SearchOptions(budget=300, trial_seconds="2s").default_trial_seconds == 2.0
    assert SearchOptions(budget=20, trial_seconds=0.5).default_trial_seconds == 0.5
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["search"]
    assert options_from(sub.parse_args(["x.py", "--trial-seconds", "1m"])).trial_seconds == 60.0
    setup = prepare(UserSpec(dataset=Rows(), source="rows.py", batch_size=4),
                    SearchOptions(budget=300, trial_seconds="2s", workdir=tmp_path / "w", progress=False,
                                  allocators=("glibc",)))
    assert setup.trial_seconds == 2.0
    assert setup.plan.batch_timeout == 60.0  # 20 trials' worth, at least a minute: not the budget's 6 s trial's
    # the memory plan counts a trial's cache writer for the samples its build stores: the subset, also after
    # a shared study sets another one (with_subset)
    assert setup.limits.trial_memory.build_samples == len(setup.plan.indices) > 0
    from autotune.tuner._preparation import with_subset

    smaller = with_subset(setup, UserSpec(dataset=Rows(), source="rows.py", batch_size=4),
                          SearchOptions(budget=300, workdir=tmp_path / "w", progress=False), 8)
    assert smaller.limits.trial_memory.build_samples == len(smaller.plan.indices) == 8
