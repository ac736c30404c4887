"""The adapting loader: the same batches as a plain loader across every switch, one pool at a time, the
measured epochs handed to the policy, and the stall clock."""

from __future__ import annotations

import gc
import multiprocessing
import time
import warnings
from pathlib import Path

import psutil
import pytest
import torch
from test_factory import write_recipe
from torch.utils.data import DataLoader
from workloads import Numbers, take

import autotune
from autotune.config import LoaderConfig, usual_advice
from autotune.machine import usable_cpus
from autotune.recipe._adapt_policy import Decision, Policy
from autotune.recipe._adaptive import AdaptiveLoader, rate_so_far
from autotune.recipe._stall_clock import DeviceClock, HostClock

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("closes_loaders")]

P2 = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork")
SCRIPT = [LoaderConfig(), LoaderConfig(num_workers=2, multiprocessing_context="fork"), P2,
          P2.refit(num_workers=1, prefetch_factor=4), P2, LoaderConfig()]


class Scripted(Policy):
    """Moves through ``SCRIPT`` one epoch each: every kind of switch the real policy can make."""

    def __init__(self, script):
        super().__init__(script[0], max_workers=2)
        self.script = list(script)
        self.seen = []

    def decide(self, obs):
        self.seen.append(obs)
        self._record(obs)
        return Decision(self.script[len(self.seen) % len(self.script)], "scripted", "scripted")  # not "try": no probe part


def batches(loader, epochs, check=None):
    out = []
    for _ in range(epochs):
        epoch = []
        for batch in loader:
            if check is not None:
                check(loader)
            epoch.append(batch[1].tolist())
        out.append(epoch)
    return out


def _helpers() -> set[int]:
    """Children that are not a loader's workers: a forkserver or resource tracker an earlier test in this
    process started (their command line is multiprocessing's, a forked worker's is ours)."""
    me = psutil.Process()
    found = set()
    for p in me.children():
        try:
            if p.cmdline() != me.cmdline():
                found.add(p.pid)
        except psutil.Error:  # gone meanwhile: counted by no one
            found.add(p.pid)
    return found


_BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before_the_test():
    """An earlier test's pool can still be shutting down when the next test starts (on a loaded machine, a
    dropped loader's workers take seconds to exit): only children started during this test are counted."""
    _BEFORE.clear()
    _BEFORE.update(p.pid for p in psutil.Process().children())
    yield


def workers_alive() -> int:
    ignored = _helpers() | _BEFORE
    return sum(1 for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE and p.pid not in ignored)


def test_the_batches_are_a_plain_loaders_across_every_switch_and_one_pool_lives_at_a_time(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=SCRIPT[0])
    dataset = Numbers(45)
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(11))
    assert isinstance(loader, autotune.AdaptiveLoader) and len(loader) == 6 and loader.batch_size == 8
    loader.policy = Scripted(SCRIPT)
    alive = []
    got = batches(loader, len(SCRIPT), check=lambda lo: alive.append((lo.config.num_workers, workers_alive())))
    plain = DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(11))
    assert got == batches(plain, len(SCRIPT))
    assert [o.config for o in loader.policy.seen] == SCRIPT
    assert all(n == workers for workers, n in alive), alive  # never the old pool beside the new one
    assert [e.config for e in loader.history.switches()] == SCRIPT[:-1]


def test_an_epoch_left_at_its_last_batch_ends_before_the_next_begins(tmp_path):
    """A loop that counts to len(loader) (Lightning's) never asks past the last batch: that epoch is whole, and
    it is ended, and any switch made, when its generator is closed or the next epoch asks for its first
    batch, whichever comes first, before the next loader is chosen; one pool at a time still."""
    path = write_recipe(tmp_path / "autotune.json", config=SCRIPT[0])
    dataset = Numbers(45)
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(3))
    loader.policy = Scripted(SCRIPT)
    got, alive = [], []
    for _ in range(len(SCRIPT)):
        epoch = []
        for _, batch in zip(range(len(loader)), loader, strict=False):
            alive.append((loader.config.num_workers, workers_alive()))
            epoch.append(batch[1].tolist())
        got.append(epoch)
    plain = DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3))
    assert got == batches(plain, len(SCRIPT))
    assert [o.config for o in loader.policy.seen] == SCRIPT  # the last one ended as its generator was closed
    assert all(o.batches == 6 for o in loader.policy.seen)  # each epoch counted whole; its seconds are timing
    assert all(n == workers for workers, n in alive), alive
    # the next epoch first: the held generator of the last is still open
    loader.policy = Scripted(SCRIPT)
    held = [iter(loader)]
    first = [next(held[0])[1].tolist() for _ in range(len(loader))]
    assert len(loader.policy.seen) == 0
    held.append(iter(loader))
    second = next(held[1])[1].tolist()
    assert [o.config for o in loader.policy.seen] == [SCRIPT[0]] and loader.config == SCRIPT[1]
    want = batches(plain, 2)  # the plain loader's next two epochs
    assert first == want[0] and second == want[1][0]
    held[0].close()
    assert len(loader.policy.seen) == 1  # ended once


def test_each_measured_epoch_is_handed_over_and_a_broken_one_is_not(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=P2)
    loader = autotune.dataloader(Numbers(40), path, adapt="observe")
    for _ in range(2):
        assert len([b for b in loader]) == 5
    for i, _ in enumerate(loader):
        if i == 2:
            break
    seen = loader.policy.stats[P2]
    assert len(seen.epochs) == 2 and all(s > 0 for s in seen.epochs) and 0 <= seen.stall <= 1
    assert [e.decision for e in loader.history.events] == ["observe", "observe"]
    assert loader.config == P2 and not loader.history.switches()
    assert loader.memory.batch_bytes == 8 * 4 * 4 + 8 * 8  # the first batch: 8x4 float32, 8 int64 labels


def test_the_real_policy_keeps_the_batches_whatever_it_decides(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=P2)
    dataset = Numbers(48, delay=0.001)
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(2))
    loader.policy.explore_share = 1  # the tries are the point: a 5-epoch run of 6 batches affords none in 2%
    got = batches(loader, 5)
    assert got == batches(DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2)),
                          5)
    events = loader.history.events
    assert [e.decision for e in events][:2] == ["warm-up", "try"] and len(events) == 5


def test_without_a_recipe_it_starts_from_the_usual_advice(tmp_path):
    path = tmp_path / "autotune.json"
    with pytest.raises(autotune.RecipeError, match="No recipe file"):
        autotune.dataloader(Numbers(40), path, batch_size=8)
    with pytest.raises(autotune.AutotuneError, match="adapt must be True, False or 'observe'"):
        autotune.dataloader(Numbers(40), path, batch_size=8, adapt="yes")
    loader = autotune.dataloader(Numbers(40), path, batch_size=8, adapt=True)
    assert isinstance(loader, AdaptiveLoader)
    assert loader.config == usual_advice(usable_cpus(), context="fork")
    assert not path.exists()
    assert len(loader) == 5 and sorted(i for b in batches(loader, 1)[0] for i in b) == list(range(40))
    assert autotune.load(path).profile.learned.epochs == 1  # the run made this machine's profile


def test_a_callers_setting_never_moves(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=P2)
    loader = autotune.dataloader(Numbers(40), path, adapt=True, num_workers=2)
    assert loader.policy.fixed == frozenset({"num_workers"})


class FakeEvent:
    """Stands for torch.cuda.Event: its time is what the test says the device reached."""

    times = iter([0.0, 5.0, 10.0, 10.0])  # ms: idle 5 ms waiting for batch 1, busy through batch 2's wait

    def __init__(self):
        self.t = None

    def record(self):
        self.t = next(FakeEvent.times)

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.t - self.t


def test_the_device_clock_counts_the_devices_idle_time_not_the_hosts_wait():
    clock = DeviceClock(event=FakeEvent)
    for _ in range(2):
        clock.enter()
        clock.leave()
    clock.waits = [0.008, 0.004]  # what the host waited (s)
    assert clock.epoch_waits() == [0.005, 0.0]
    assert clock.epoch_waits() == []
    host = HostClock()
    host.enter()
    assert host.leave() >= host.now() - 1 and len(host.epoch_waits()) == 1


# ------------------------------------------------------------------------------ written back

def test_what_the_run_learned_is_written_back_and_the_next_run_starts_from_it(tmp_path, capsys):
    import json

    from autotune.cli import main
    from autotune.recipe._file import RecipeFile

    path = write_recipe(tmp_path / "autotune.json", config=SCRIPT[0])
    other = write_recipe(tmp_path / "other.json", hw={"cpu_model": "another machine", "usable_cpus": 64})
    RecipeFile.merge_write(path, RecipeFile.read(other).profiles.popitem()[1])  # a second machine's profile
    before = json.loads(path.read_text())["profiles"]
    loader = autotune.dataloader(Numbers(40), path, adapt=True, shuffle=True)
    loader.policy = Scripted(SCRIPT[:3])
    batches(loader, 3)
    loader.close()  # what the last epochs learned is written at the latest here (``_write_back``)
    after = json.loads(path.read_text())["profiles"]
    here, = (fp for fp in after if "learned" in after[fp])
    assert {fp: p for fp, p in after.items() if fp != here} == {fp: p for fp, p in before.items() if fp != here}
    learned = RecipeFile.read(path).profiles[here].learned
    assert (learned.mode, learned.batch_size, learned.length, learned.epochs) == ("adapt", 8, 40, 3)
    assert [c.config for c in learned.configs] == SCRIPT[:3]
    assert [(s.epoch, s.before, s.after) for s in learned.switches] == [(1, SCRIPT[0], SCRIPT[1]),
                                                                          (2, SCRIPT[1], SCRIPT[2]),
                                                                          (3, SCRIPT[2], SCRIPT[0])]
    assert learned.best == SCRIPT[0]  # the scripted policy never moved its incumbent

    # a policy that kept a move: the next loader, adapting or not, starts there
    loader = autotune.dataloader(Numbers(40), path, adapt=True)
    loader.policy.incumbent = P2
    batches(loader, 1)
    plain = autotune.dataloader(Numbers(40), path)
    assert (plain.num_workers, plain.persistent_workers) == (2, True)
    assert plain.autotune.sources["num_workers"] == "learned by an adapting run"
    assert autotune.dataloader(Numbers(40), path, adapt=True).config == P2
    with pytest.warns(UserWarning, match="tuned for batch_size=8"):
        assert autotune.dataloader(Numbers(40), path, batch_size=4).num_workers == 0  # other batches: the recipe's
    assert autotune.dataloader(Numbers(41), path).num_workers == 0  # another length
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "    learned     adapted to num_workers=2, pin_memory=False, prefetch_factor=2,\n" in out
    assert "persistent_workers=True over 1 epochs of batch 8, 4 switch(es);" in out  # the first run's 3 kept
    assert ("the next run starts there; the search's forecast missed the real step: re-search with it as "
            "train_step") in " ".join(out.split())


def test_an_observing_run_is_recorded_but_moves_nothing_and_no_recipe_makes_one(tmp_path):
    from autotune.recipe._file import RecipeFile

    path = tmp_path / "autotune.json"
    loader = autotune.dataloader(Numbers(40), path, batch_size=8, adapt="observe")
    batches(loader, 2)
    loader.close()
    profile, = RecipeFile.read(path).profiles.values()
    assert profile.learned.mode == "observe" and profile.learned.epochs == 2
    assert [c.config for c in profile.learned.configs] == [loader.config] and not profile.learned.switches
    assert autotune.dataloader(Numbers(40), path).autotune.sources["num_workers"] == "recipe"


def test_without_a_recipe_each_switch_is_recorded_once(tmp_path):
    """The first write makes the file from the loader's own profile: the record written after each later
    epoch must not take the run's own earlier record for a previous run's (its switches doubled every epoch)."""
    from autotune.recipe._file import RecipeFile

    path = tmp_path / "autotune.json"
    loader = autotune.dataloader(Numbers(40), path, batch_size=8, adapt=True)
    start = loader.config
    script = [start, *(c for c in SCRIPT[:3] if c != start)]
    loader.policy = Scripted(script)
    batches(loader, 3)
    loader.close()
    learned, = (p.learned for p in RecipeFile.read(path).profiles.values())
    assert [(s.epoch, s.before, s.after) for s in learned.switches] == [
        (1, script[0], script[1]), (2, script[1], script[2]), (3, script[2], script[3 % len(script)])]


class _Clock:
    t = 100.0

    def __call__(self):
        return self.t


def test_writing_back_takes_at_most_its_share_of_the_run_and_the_record_is_whole_at_the_end(tmp_path, monkeypatch):
    """Each write costs 20 ms of the clock (real writes, the clock the loader's): the first epoch is written at
    once, each later write waits until the run went on 1 / SHARE times the last write's cost and is made at the
    first epoch end after that, the writes between the first and the last take within SHARE of the run, and close()
    writes the rest. Written
    after every epoch, the 16-40 ms writes were 1-3% of a 1.3 s epoch's run."""
    from autotune.recipe import _write_back
    from autotune.recipe._file import RecipeFile

    clock, cost, written = _Clock(), 0.02, []
    real = RecipeFile.learn.__func__

    def learn(cls, path, profile, learned):
        real(cls, path, profile, learned)
        clock.t += cost
        written.append((clock.t, learned.epochs))

    monkeypatch.setattr(RecipeFile, "learn", classmethod(learn))
    path = tmp_path / "autotune.json"
    loader = autotune.dataloader(Numbers(40), path, batch_size=8, adapt="observe")
    write_back = loader._on_epoch
    write_back._clock = clock
    told = []
    loader._on_epoch = lambda event, it: (told.append(clock.t), write_back(event, it))
    for _ in range(12):
        clock.t += 1.0  # an epoch's second
        batches(loader, 1)
    ends = len(told)
    loader.close()
    assert ends >= 11 and written[0][1] == 1  # every epoch end but a pending last one was told; the first written
    due, expected = float("-inf"), []
    for at in told[:ends]:
        if at >= due:
            expected.append(at)
            due = at + cost + cost / _write_back.SHARE
    assert [t - cost for t, _ in written[:len(expected)]] == pytest.approx(expected)
    assert len(written) == len(expected) + 1 and written[-1][1] == 12  # close() wrote the rest: the whole run
    assert RecipeFile.read(path).profiles.popitem()[1].learned.epochs == 12
    assert cost * (len(written) - 2) <= _write_back.SHARE * (clock.t - told[0])  # the first and the last aside


def test_a_run_that_returns_without_closing_its_loader_leaves_its_whole_record(tmp_path):
    """The training script ends with the loop (no close(), as most do): the interpreter's exit writes the rest."""
    from workloads import run_recipe_script

    from autotune.recipe._file import RecipeFile

    path = tmp_path / "autotune.json"
    run_recipe_script("import autotune\nfrom workloads import Numbers\n"
                      "loader = autotune.dataloader(Numbers(400), sys.argv[1], batch_size=8, adapt='observe')\n"
                      "for _ in range(6):\n    for _ in loader: pass\n", path)
    assert RecipeFile.read(path).profiles.popitem()[1].learned.epochs == 6


@pytest.mark.parametrize("learned, problem", [
    ({"mode": "guess"}, "learned.mode must be one of adapt, observe"),
    ({"mode": "adapt", "epochs": -1, "best": {}}, "learned.epochs must be a non-negative integer"),
    ({"mode": "adapt", "epochs": 1, "best": {"num_workers": "many"}}, "learned.best: a profile's 'config' is invalid"),
    ({"mode": "adapt", "epochs": 1, "best": {}, "configs": [{"config": {}, "epochs": 1, "seconds_per_batch": "nan",
                                                              "stall": 0}]},
     "learned.configs\\[\\].seconds_per_batch must be a non-negative number"),
])
def test_a_hand_edited_record_is_refused_naming_the_field(tmp_path, learned, problem):
    import json

    from autotune.recipe._file import RecipeFile

    path = write_recipe(tmp_path / "autotune.json")
    doc = json.loads(path.read_text())
    next(iter(doc["profiles"].values()))["learned"] = learned
    path.write_text(json.dumps(doc))
    with pytest.raises(autotune.RecipeError, match=problem):
        RecipeFile.read(path)


# ------------------------------------------------------------------------------ StatefulDataLoader

def test_a_stateful_resume_carries_its_configuration_and_yields_exactly_the_remaining_samples(tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=SCRIPT[0])

    def make():
        loader = autotune.dataloader(Numbers(40), path, adapt=True, loader_cls=StatefulDataLoader, shuffle=True,
                                     generator=torch.Generator().manual_seed(5))
        loader.policy = Scripted([SCRIPT[0], P2])
        return loader

    # a plain torch DataLoader's batches (StatefulDataLoader's own order depends on its num_workers)
    want = batches(DataLoader(Numbers(40), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(5)), 3)
    loader = make()
    assert isinstance(loader.loader, StatefulDataLoader)
    assert batches(loader, 1) == want[:1] and loader.config == P2  # switched after epoch 1
    iterator = iter(loader)
    head = [next(iterator)[1].tolist() for _ in range(2)]
    state = loader.state_dict()
    assert LoaderConfig.from_json(state["autotune_config"]) == P2
    del iterator
    resumed = make()
    assert resumed.config == SCRIPT[0]
    resumed.load_state_dict(state)
    assert resumed.config == P2 and resumed.loader.num_workers == 2 and resumed.policy.incumbent == P2
    assert head + batches(resumed, 1)[0] == want[1]
    assert batches(resumed, 1) == want[2:]  # and the epochs after it
    from autotune.recipe._file import RecipeFile

    learned = next(iter(RecipeFile.read(path).profiles.values())).learned
    assert (learned.batch_size, learned.length) == (8, 40)  # the caller's batches, though the loader's are owned


# ------------------------------------------------------------------------------ torchrun

def two_ranks(tmp_path, *args):
    """adapt_ranks.py under torchrun, two ranks: what each saw."""
    import json
    import os
    import subprocess
    import sys

    from autotune.machine import _hardware as hardware

    config = LoaderConfig(num_workers=1, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork")
    path = write_recipe(tmp_path / "autotune.json", hw=hardware.collect(ranks_per_node=2), config=config,
                        batch_size=4)
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(here / "adapt_ranks.py"), str(tmp_path), str(path), *args], env=env,
                         capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stderr[-3000:]
    return path, [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_ranks_switch_together_at_the_parts_of_a_long_epoch(tmp_path):
    _, ranks = two_ranks(tmp_path, "4")  # 8 batches a rank an epoch: a part ends after batch 4
    assert ranks[0]["events"] == ranks[1]["events"]  # every part under the same configuration, on both
    assert [mid for _, _, mid in ranks[0]["events"]] == [True, False] * 4
    assert ranks[0]["decisions"] == ranks[1]["decisions"] and ranks[0]["decisions"][:2] == ["warm-up", "try"]
    seen = [sorted(i for b in ranks[0]["seen"][e] + ranks[1]["seen"][e] for i in b) for e in range(4)]
    assert seen == [list(range(64))] * 4


def test_two_ranks_under_torchrun_decide_together_from_the_slowest_ranks_epoch(tmp_path):
    from autotune.recipe._file import RecipeFile

    path, ranks = two_ranks(tmp_path)
    assert ranks[0]["configs"] == ranks[1]["configs"]  # every epoch under the same configuration
    assert ranks[0]["decisions"] == ranks[1]["decisions"] and ranks[0]["decisions"][:2] == ["warm-up", "try"]
    assert ranks[0]["configs"][2] != ranks[0]["configs"][1]  # the try: both switched after epoch 2
    # one figure for both: the slowest rank's (rank 1 sleeps 4 ms a sample)
    assert ranks[0]["seconds_per_batch"] == ranks[1]["seconds_per_batch"]
    assert ranks[0]["decided"] >= 2 and ranks[1]["decided"] == 0  # configurations rank 0's policy measured
    seen = [sorted(i for b in ranks[0]["seen"][e] + ranks[1]["seen"][e] for i in b) for e in range(4)]
    assert seen == [list(range(64))] * 4  # each epoch's shards together: the whole dataset once
    learned = next(iter(RecipeFile.read(path).profiles.values())).learned
    assert learned is not None and learned.epochs == 4  # written by rank 0


def test_a_move_must_fit_dev_shm_and_the_jobs_memory_budget():
    from autotune.machine import job_memory, shm_free
    from autotune.recipe._adaptive import Memory

    more = P2.refit(num_workers=3)
    free = shm_free()
    if free is not None:
        why = Memory(batch_bytes=free // 4).allowed(more, P2)  # 3 x 2 in flight + 2 held: over the free space
        assert why is not None and why.startswith("needs ~") and "of /dev/shm for 3 workers x prefetch 2" in why
    assert Memory(batch_bytes=1, per_worker_bytes=1 << 20).allowed(more, P2) is None
    huge = job_memory().available  # one more worker of all the job may take: over 70% of it
    why = Memory(batch_bytes=1, per_worker_bytes=huge).allowed(more, P2)
    assert why is not None and why.startswith(f"needs {huge + 2} more bytes, over the memory budget of")
    assert Memory(batch_bytes=1, per_worker_bytes=huge).allowed(P2.refit(num_workers=1), P2) is None  # fewer: fine


# ------------------------------------------------------------------------------ Lightning

def test_lightning_trains_on_an_adapting_loader_with_a_plain_loaders_batches(tmp_path):
    import lightning as L

    path = write_recipe(tmp_path / "autotune.json", config=P2)
    seen = []

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            seen.append(batch[1].tolist())
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):  # the one line, as with a fixed recipe
            loader = autotune.dataloader(Numbers(40), path, adapt=True, shuffle=True,
                                         generator=torch.Generator().manual_seed(8))
            loader.policy.explore_share = 1  # a switch under Lightning is the point: no budget for it in 3 epochs
            return loader

    model = Model()
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model)
    plain = DataLoader(Numbers(40), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(8))
    assert seen == [b for epoch in batches(plain, 3) for b in epoch]
    loader = trainer.train_dataloader
    assert isinstance(loader, AdaptiveLoader) and [e.decision for e in loader.history.events][:2] == ["warm-up", "try"]


# ------------------------------------------------------------------------------ a long epoch's parts

P1 = P2.refit(num_workers=1)
PLAIN2 = LoaderConfig(num_workers=2, multiprocessing_context="fork")


def test_a_long_epoch_switches_at_its_parts_with_a_plain_loaders_batches_and_one_pool_at_a_time(tmp_path):
    """Every kind of switch mid-epoch (0 and 2 workers, persistent or not, the pool's prefetch in flight):
    the epoch's permutation goes on from the first batch the training loop had not received."""
    path = write_recipe(tmp_path / "autotune.json", config=SCRIPT[0])
    dataset = Numbers(200)  # 25 batches of 8: parts end after batches 4, 8, 12, 16, 20 (the last is 5 long)
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(4))
    loader.policy, loader.part_batches = Scripted(SCRIPT), 4
    alive = []
    got = batches(loader, 3, check=lambda lo: alive.append((lo.config.num_workers, workers_alive())))
    plain = DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(4))
    assert got == batches(plain, 3)
    assert all(n == workers for workers, n in alive), alive
    events = loader.history.events
    assert [e.mid_epoch for e in events[:6]] == [True] * 5 + [False] and len(events) == 18
    # the policy is told where each part ended, so a try's price knows where it starts (rule 5a)
    assert [o.mid_epoch for o in loader.policy.seen] == [e.mid_epoch for e in events]
    assert [e.config for e in events[:6]] == SCRIPT  # each part under the configuration chosen for it
    assert all(e.next_config != e.config for e in events[:5])  # five switches inside the first epoch
    assert loader.epoch == 3 and len(loader) == 25 and loader.batch_size == 8


def test_the_loaders_own_time_between_parts_reaches_the_policy_as_overhead(tmp_path, monkeypatch):
    """Rule 5 counts what no part's clock does: the time from one part's end to the next one's start (the
    bookkeeping and a switch: the old pool shut down, the new loader made) is the next observation's
    overhead_seconds, and no second of the loop is counted twice."""
    path = write_recipe(tmp_path / "autotune.json", config=SCRIPT[0])
    loader = autotune.dataloader(Numbers(48), path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(5))
    loader.policy = Scripted(SCRIPT)  # a new pool every epoch
    make = loader._make

    import types

    import autotune.recipe._adaptive as adaptive

    own = [100.0]  # the loader's own clock (the time it spends outside the parts): only a switch moves it
    monkeypatch.setattr(adaptive, "time", types.SimpleNamespace(perf_counter=lambda: own[0],
                                                                process_time=time.process_time))

    def slow_make(config):
        own[0] += 0.2  # a loader that takes 0.2 s to make: the switch's cost
        return make(config)

    loader._make = slow_make
    batches(loader, 4)
    seen = loader.policy.seen
    assert len(seen) == 4 and seen[0].overhead_seconds == 0.0  # nothing of the loader's before the first part
    # the loader's own clock moved only by the switches' 0.2 s: each reaches the next part's observation, once
    assert [o.overhead_seconds for o in seen[1:]] == [pytest.approx(0.2)] * 3


def test_a_pools_memory_is_read_once_not_every_epoch(tmp_path, monkeypatch):
    """A reading walks every page table of the tree (tens of milliseconds, the run's own time): the memory
    rule needs a worker's PSS once a pool, read at the end of its first epoch."""
    import autotune.recipe._adaptive as adaptive

    readings = []
    real = adaptive.tree_pss
    monkeypatch.setattr(adaptive, "tree_pss", lambda *a, **k: readings.append(1) or real(*a, **k))
    path = write_recipe(tmp_path / "autotune.json", config=P2)
    loader = autotune.dataloader(Numbers(48), path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(3))
    loader.policy = Scripted([P2, P2, P2, P1])  # epochs under P2, P2, P2, P1, P2
    batches(loader, 5)
    assert [o.config for o in loader.policy.seen] == [P2, P2, P2, P1, P2]
    assert len(readings) == 3 and loader.memory.per_worker_bytes is not None  # P2's, P1's, P2's again
    loader.close()


class SlowsDown(Numbers):
    """``delay`` seconds a sample, shared with forked workers: the training loop makes it heavier mid-run (a
    competitor, a heavier step, as the loader sees either)."""

    def __init__(self, n, delay):
        super().__init__(n)
        self.shared = multiprocessing.get_context("fork").Value("d", delay, lock=False)

    def __getitem__(self, i):
        time.sleep(self.shared.value)
        return super().__getitem__(i)


class Quiet(Policy):
    """The real policy on a run whose chunks it reads as noiseless: under pytest -n 4 on 2 vCPUs one
    descheduled 2-batch chunk (4 ms) of the fast epoch made the run's measured noise exceed even a forty-fold
    slowdown, and the policy rightly held that for noise (CI, persistent pool). How the noise bounds a drift is
    ``test_a_drift_inside_an_epoch_is_asked_of_the_incumbents_figure_as_decide_judges_it``'s; here it is where
    the loader ends the part."""

    def noise(self) -> float:
        return 0.0

    def decide(self, obs):
        self.parts = [*getattr(self, "parts", []), obs.batches]  # where each part ended
        return super().decide(obs)


@pytest.mark.parametrize("config", [LoaderConfig(), P2, PLAIN2],
                         ids=["main process", "persistent pool", "pool restarted every epoch"])
def test_a_drift_inside_an_epoch_ends_the_incumbents_part_there_with_a_plain_loaders_batches(tmp_path, config):
    """Ten times slower a sample from epoch 3 on: the part ends at the first chunk boundary MIN_BATCHES in
    (batch 4 of 20: chunks of 2), in a pool that started with the part too, and the policy reopens there instead
    of at the epoch's end; at most one such end an epoch; the batches are a plain loader's."""
    path = write_recipe(tmp_path / "autotune.json", config=config)
    dataset = SlowsDown(160, 0.0005)
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(6))
    loader.policy = Quiet(config, max_workers=2, explore_share=0.0)  # it measures, and never tries a move
    got = []
    for epoch in range(4):
        dataset.shared.value = 0.005 if epoch >= 2 else 0.0005
        got.append([batch[1].tolist() for batch in loader])
    plain = DataLoader(Numbers(160), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(6))
    assert got == batches(plain, 4)
    events = [(e.epoch, e.mid_epoch, e.decision) for e in loader.history.events]
    assert events[:3] == [(0, False, "warm-up"), (1, False, "measure"), (2, True, "reopen")], [
        (e.epoch, e.mid_epoch, e.decision, e.line, round(e.seconds_per_batch * 1e3, 2)) for e in loader.history.events]
    mid = [e[0] for e in events if e[1]]
    assert len(mid) == len(set(mid))  # at most one drift an epoch
    assert [e.config for e in loader.history.events if e.mid_epoch][:1] == [config]
    assert loader.history.events[2].line.startswith("conditions changed") and loader.policy.parts[2] == 4
    loader.close()


class Probing(Policy):
    """Tries P2 and reverts it at its probe, then tries P1 and lets it go on after its probe."""

    def __init__(self):
        super().__init__(LoaderConfig(), max_workers=2)
        self.seen = []
        self.script = [Decision(P2, "try", "s"), Decision(LoaderConfig(), "revert", "s"), Decision(P1, "try", "s"),
                       Decision(P1, "continue", "s"), Decision(P1, "keep", "s")]

    def decide(self, obs):
        self.seen.append(obs)
        return self.script[len(self.seen) - 1] if len(self.seen) <= len(self.script) else Decision(
            obs.config, "measure", "s")


def test_a_candidates_probe_ends_a_quarter_into_its_epoch_and_a_revert_there_keeps_a_plain_loaders_batches(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig())
    dataset = Numbers(160)  # 20 batches of 8: a candidate's probe is its first 5
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(9))
    loader.policy = Probing()
    alive = []
    got = batches(loader, 3, check=lambda lo: alive.append((lo.config.num_workers, workers_alive())))
    plain = DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(9))
    assert got == batches(plain, 3)
    assert all(n == workers for workers, n in alive), alive  # the probe's pool stopped before the incumbent's
    seen = [(o.config, o.batches, o.probe) for o in loader.policy.seen]
    assert seen == [(LoaderConfig(), 20, False), (P2, 5, True), (LoaderConfig(), 15, False), (P1, 5, True),
                    (P1, 15, False)]
    assert [e.mid_epoch for e in loader.history.events] == [False, True, False, True, False]
    assert loader.epoch == 3


class Capping(Policy):
    """Tries P2, whose budget runs out after its third batch (``over_budget``, the policy's rule 5b, answered
    from the batch count alone), then measures."""

    def __init__(self):
        super().__init__(LoaderConfig(), max_workers=2)
        self.seen, self.asked = [], []

    def over_budget(self, config, seconds, batches, overhead=0.0):
        self.asked.append((config, batches))
        return batches == 3

    def decide(self, obs):
        self.seen.append(obs)
        if len(self.seen) == 1:
            self.trying = ("more workers", P2)
            return Decision(P2, "try", "s")
        self.trying = None
        return Decision(LoaderConfig(), "revert" if obs.capped else "measure", "s")


def test_a_try_whose_budget_runs_out_ends_at_that_batch_and_the_incumbent_reads_the_rest(tmp_path):
    """Rule 5b in the loader: after each batch of a try (its probe and its rest alike) the loader asks whether
    it still fits the budget; at the first no, the part ends there, handed over ``capped`` however short, and
    the incumbent takes the epoch on at the next batch: a plain loader's batches, one pool at a time. Nothing
    is asked outside a try."""
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig())
    dataset = Numbers(160)  # 20 batches of 8: the probe would be 5; the budget ends the try at 3
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(4))
    loader.policy = Capping()
    alive = []
    got = batches(loader, 3, check=lambda lo: alive.append((lo.config.num_workers, workers_alive())))
    plain = DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(4))
    assert got == batches(plain, 3)
    assert all(n == workers for workers, n in alive), alive
    seen = [(o.config, o.batches, o.capped) for o in loader.policy.seen]
    assert seen == [(LoaderConfig(), 20, False), (P2, 3, True), (LoaderConfig(), 17, False),
                    (LoaderConfig(), 20, False)]
    assert loader.policy.asked == [(P2, 1), (P2, 2), (P2, 3)]
    assert [e.mid_epoch for e in loader.history.events] == [False, True, False, False]
    loader.close()


def test_a_stateful_resume_after_a_mid_epoch_switch_yields_exactly_the_remaining_batches(tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=SCRIPT[0], batch_size=4)

    def make(script):
        loader = autotune.dataloader(Numbers(64), path, adapt=True, loader_cls=StatefulDataLoader, shuffle=True,
                                     generator=torch.Generator().manual_seed(9))
        loader.policy, loader.part_batches = Scripted(script), 4  # 16 batches: parts end after 4, 8 and 12
        return loader

    want = batches(DataLoader(Numbers(64), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(9)), 2)
    loader = make([SCRIPT[0], P2])
    iterator = iter(loader)
    head = [next(iterator)[1].tolist() for _ in range(6)]  # 0 workers for 4, then P2 (switched after batch 4)
    assert loader.config == P2 and loader.history.switches()[0].mid_epoch
    state = loader.state_dict()
    assert LoaderConfig.from_json(state["autotune_config"]) == P2
    del iterator
    resumed = make([P2, PLAIN2, LoaderConfig()])
    resumed.load_state_dict(state)
    assert resumed.config == P2
    rest = batches(resumed, 1)[0]  # batches 7-8 teach nothing; it switches after batch 12 and at the end
    assert head + rest == want[0]
    assert [(e.config, e.mid_epoch) for e in resumed.history.switches()] == [(P2, True), (PLAIN2, False)]
    between = resumed.state_dict()  # saved between epochs: the next one resumes whole
    assert batches(resumed, 1) == want[1:]
    again = make([LoaderConfig()])
    again.load_state_dict(between)
    assert again.config == LoaderConfig() and batches(again, 1) == want[1:]


@pytest.mark.parametrize("config", [LoaderConfig(), P2])
def test_a_stateful_state_saved_between_epochs_resumes_the_next_epoch_whole(tmp_path, config):
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=config, batch_size=4)

    def make():
        return autotune.dataloader(Numbers(32), path, adapt="observe", loader_cls=StatefulDataLoader, shuffle=True,
                                   generator=torch.Generator().manual_seed(9))

    want = batches(DataLoader(Numbers(32), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(9)), 3)
    loader = make()
    assert batches(loader, 1) == want[:1]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert batches(resumed, 2) == want[1:]


def _sampler(kind, seed):
    from torch.utils.data import RandomSampler
    from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

    cls = {"torch": RandomSampler, "stateful": StatefulRandomSampler}[kind]
    return cls(Numbers(32), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["torch", "stateful"])
@pytest.mark.parametrize("adapt", [False, True])
def test_a_resume_in_a_later_epoch_restores_the_state_a_samplers_own_generator_drew_the_epoch_from(tmp_path, kind,
                                                                                                   adapt):
    """A sampler with its own generator (torch's RandomSampler, torchdata's stateful one) moves it every epoch;
    a run resumed in a fresh process with a fresh sampler (seeded as the first was) yields the saved epoch's
    rest and then the next epoch, exactly as the saved run would have."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=P2, batch_size=4)

    def make():
        loader = autotune.dataloader(Numbers(32), path, adapt=adapt, loader_cls=StatefulDataLoader,
                                     sampler=_sampler(kind, 4))
        if adapt:
            loader.policy = Scripted([P2, LoaderConfig()])
        return loader

    want = batches(DataLoader(Numbers(32), batch_size=4, sampler=_sampler(kind, 4)), 3)
    loader = make()
    assert batches(loader, 1) == want[:1]
    iterator = iter(loader)
    head = [next(iterator)[1].tolist() for _ in range(3)]
    assert head == want[1][:3]
    state = loader.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    assert batches(resumed, 1) == [want[1][3:]]
    between = resumed.state_dict()  # saved between epochs: the next one resumes whole
    again = make()
    again.load_state_dict(between)
    assert batches(again, 1) == want[2:]

@pytest.mark.parametrize("kind", ["shuffle", "torch"])
def test_a_state_saved_between_epochs_after_a_switch_goes_on_in_the_same_loader_and_in_a_fresh_one(tmp_path, kind):
    """A switch at epoch 1's end leaves the new inner loader without an iterator; ``state_dict()`` then makes
    one, which primes epoch 2 before it began. The loader goes on with epoch 2, and a fresh loader resumed
    from that state yields epoch 2 too: the state pins the generators where epoch 2's draws start."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(), batch_size=4)

    def order():
        if kind == "shuffle":
            return {"shuffle": True, "generator": torch.Generator().manual_seed(3)}
        return {"sampler": _sampler(kind, 3)}

    def make():
        loader = autotune.dataloader(Numbers(32), path, adapt=True, loader_cls=StatefulDataLoader, **order())
        loader.policy = Scripted([LoaderConfig(), P2, P2])
        return loader

    want = batches(DataLoader(Numbers(32), batch_size=4, **order()), 3)
    loader = make()
    assert batches(loader, 1) == want[:1] and loader.config == P2
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert batches(loader, 2) == want[1:]
    assert batches(resumed, 2) == want[1:]
    loader.close()
    resumed.close()


# ------------------------------------------------------------------------------ a candidate that fails

class KillsTwoWorkerPools(Numbers):
    """The first worker of a two-worker pool is killed (SIGKILL, as the OOM killer does) at its first sample."""

    def __getitem__(self, i):
        import os
        import signal

        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None and info.num_workers == 2 and info.id == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class ShmFullInTwoWorkerPools(Numbers):
    """A two-worker pool's workers fail as when /dev/shm is full; one worker is fine."""

    def __getitem__(self, i):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None and info.num_workers == 2:
            raise RuntimeError("unable to write to file </torch_123_456_0>: No space left on device (28)")
        return super().__getitem__(i)


class BadSample(Numbers):
    """Sample 37 is broken, in every process: the plain loader raises too."""

    def __getitem__(self, i):
        if i == 37:
            raise ValueError("sample 37 is corrupt")
        return super().__getitem__(i)


@pytest.mark.parametrize("kind", [KillsTwoWorkerPools, ShmFullInTwoWorkerPools])
@pytest.mark.parametrize("part_batches", [0, 4])  # the switch at the epoch's end, or after batch 4 of epoch 2
def test_a_candidate_whose_workers_fail_hands_the_epoch_back_with_one_warning(tmp_path, kind, part_batches):
    path = write_recipe(tmp_path / "autotune.json", config=P1)
    dataset = kind(64)  # 8 batches of 8
    loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(6))
    # P2 from epoch 3 (epoch boundaries only), or from batch 5 of epoch 2 (its prefetch handed back)
    loader.policy = Scripted([P1] * (3 if part_batches else 2) + [P2] + [P1] * 4)
    loader.part_batches = part_batches
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = batches(loader, 3)
    plain = DataLoader(Numbers(64), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(6))
    assert got == batches(plain, 3)  # none lost or repeated: the incumbent went on at the failed batch
    said = [str(w.message) for w in caught if "autotune adapt" in str(w.message)]
    assert len(said) == 1 and said[0].startswith(f"autotune adapt: {P2.describe()} failed (") and (
        f"back to {P1.describe()}, the epoch goes on at batch " in said[0])
    crash, = (e for e in loader.history.events if e.decision == "crash")
    assert (crash.config, crash.next_config) == (P2, P1) and P2 in loader.policy.failed
    gc.collect()  # a pool whose start failed is cleaned up when its traceback goes
    assert loader.config == P1 and workers_alive() == 1


class ShmFullLate(Numbers):
    """A two-worker pool fails from sample 40 on (/dev/shm filling up as the epoch goes)."""

    def __getitem__(self, i):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None and info.num_workers == 2 and i >= 40:
            raise RuntimeError("unable to write to file </torch_123_456_1>: No space left on device (28)")
        return super().__getitem__(i)


def test_a_candidate_that_fails_after_reading_a_part_still_hands_the_epoch_back(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=P1, batch_size=4)
    loader = autotune.dataloader(ShmFullLate(64), path, adapt=True)
    loader.policy, loader.part_batches = Scripted([P1, P2, P2, P1]), 4  # P2 reads samples 16-31, then fails
    with pytest.warns(UserWarning, match="the epoch goes on at batch 11"):
        got = batches(loader, 1)[0]
    assert got == [list(range(i, i + 4)) for i in range(0, 64, 4)]
    assert [e.decision for e in loader.history.events].count("crash") == 1 and loader.config == P1


def test_a_dataset_error_the_plain_loader_meets_too_is_raised_after_any_switch(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=P1)
    plain = DataLoader(BadSample(64), batch_size=8, num_workers=1)
    with pytest.raises(ValueError, match="sample 37 is corrupt"):
        batches(plain, 1)
    loader = autotune.dataloader(BadSample(64), path, adapt=True)
    loader.policy, loader.part_batches = Scripted([P1, P2]), 4  # P2 from batch 5, the one with sample 37
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="sample 37 is corrupt"):
        warnings.simplefilter("always")
        batches(loader, 1)  # P2 hands the epoch back, and P1 meets the same sample
    assert loader.config == P1 and P2 in loader.policy.failed
    assert not [w for w in caught if "autotune adapt" in str(w.message)]  # no word of a recovery
    # the starting configuration has no incumbent behind it: its error is the user's at once
    first = autotune.dataloader(BadSample(64), path, adapt=True)
    with pytest.raises(ValueError, match="sample 37 is corrupt"):
        batches(first, 1)
    assert not first.policy.failed


# ------------------------------------------------------------------------------ the thread split

def test_the_thread_split_moves_the_main_processs_threads_in_place_and_gives_them_back(tmp_path, monkeypatch):
    from autotune.process._settings import torch_default_threads

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    default = max(torch_default_threads())
    try:
        torch.set_num_threads(default)  # torch's own count: not the user's
        path = write_recipe(tmp_path / "autotune.json", config=P1)
        loader = autotune.dataloader(Numbers(48), path, adapt=True)
        assert loader.policy.threads == default and "main_threads" not in loader.policy.fixed
        one = P1.refit(main_threads=1)
        loader.policy = Scripted([P1, one, P1.refit(main_threads=2), one])
        pool = loader.loader
        seen = []
        batches(loader, 2, check=lambda lo: seen.append(torch.get_num_threads()))
        assert seen == [default] * 6 + [1] * 6 and loader.loader is pool  # the same workers went on
        loader.close()
        assert torch.get_num_threads() == default  # given back as found
        # the user set the count while the loader ran: theirs wins, the split stops moving
        loader = autotune.dataloader(Numbers(48), path, adapt=True)
        loader.policy = Scripted([P1, one, P1.refit(main_threads=2)])
        batches(loader, 1)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(3)
        batches(loader, 1)
        assert torch.get_num_threads() == 3 and "main_threads" in loader.policy.fixed
        loader.close()
        assert torch.get_num_threads() == 3
        # the user set it before: the split never moves
        user = default + 1
        torch.set_num_threads(user)
        loader = autotune.dataloader(Numbers(48), path, adapt=True)
        assert loader.policy.threads is None and {"main_threads", "worker_threads"} <= loader.policy.fixed
        batches(loader, 3)  # the real policy: its moves leave the threads alone
        assert torch.get_num_threads() == user and all(e.next_config.main_threads is None
                                                       for e in loader.history.events)
    finally:
        torch.set_num_threads(before)


def test_a_thread_count_the_run_kept_starts_the_next_run_unless_the_user_set_one(tmp_path, monkeypatch):
    from autotune.process._settings import torch_default_threads

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    default = max(torch_default_threads())
    try:
        torch.set_num_threads(default)
        path = write_recipe(tmp_path / "autotune.json", config=P1)  # no measured gain: threads left alone
        one = P1.refit(main_threads=1)
        with autotune.dataloader(Numbers(40), path, adapt=True) as loader:
            loader.policy = Scripted([P1, one])
            loader.policy.incumbent = one  # as if the move was kept
            batches(loader, 2)
        assert torch.get_num_threads() == default
        plain = autotune.dataloader(Numbers(40), path)  # the next run starts from what the real step measured
        assert torch.get_num_threads() == 1 and "torch.set_num_threads(1) in main process" in " ".join(
            plain.autotune.applied)
        torch.set_num_threads(default + 1)  # the user's count wins over what was learned
        with pytest.warns(UserWarning, match="main_threads=1: the user's torch.set_num_threads"):
            autotune.dataloader(Numbers(40), path)
        assert torch.get_num_threads() == default + 1
    finally:
        torch.set_num_threads(before)


def test_a_parts_rate_so_far_leaves_its_first_wait_out_as_its_chunks_do():
    """A persistent pool's first batch of an epoch waits for a load (40 ms here), the next eleven 10 ms each:
    the drift check reads 10 ms a batch, not 12.5 (which a settled 10.3 ms figure read as a drift)."""
    marks = [0.040 + 0.010 * k for k in range(12)]
    assert rate_so_far(marks, marks[-1]) == pytest.approx(0.010)


@pytest.mark.parametrize("at", [2, 5, 10])
def test_a_resume_from_a_snapshot_behind_the_save_goes_on_without_repeating_a_batch(tmp_path, at):
    """``snapshot_every_n_steps=3``: a state saved one or two batches after the inner loader's last snapshot is
    that snapshot plus the batches the resumed iterator draws again and drops. The stream counts them delivered,
    so the epoch's parts still end where they should and a switch there hands out nothing twice (before: the
    resumed epoch repeated them, saved after batch 1, 2, 4, 5, 9 or 10 of 16)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    path = write_recipe(tmp_path / "autotune.json", config=P2, batch_size=4)
    dataset = Numbers(64)  # 16 batches of 4: parts end after batches 4, 8 and 12

    def make():
        loader = autotune.dataloader(dataset, path, adapt=True, shuffle=True, generator=torch.Generator().manual_seed(6),
                                     loader_cls=StatefulDataLoader, snapshot_every_n_steps=3)
        loader.policy, loader.part_batches = Scripted([P2, P1]), 4
        return loader

    want = batches(DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(6)), 2)
    loader = make()
    got = take(loader, at)
    state = loader.state_dict()
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert got == want[0][:at] and batches(resumed, 2) == [want[0][at:], want[1]]
    resumed.close()
