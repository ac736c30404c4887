"""Several ranks per node: profiles filed under (hardware, ranks per node) and found from torchrun's
LOCAL_WORLD_SIZE, ranks' shards with DistributedSampler semantics, N trial processes measured together,
and the torchrun example training with the factory while `autotune check` passes in both ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

from autotune import _api
from autotune._units import format_bytes
from autotune.caches import estimate_need, remove_leftovers
from autotune.caches._registry import clear_caches, list_caches
from autotune.cli._main import main
from autotune.cli._show import render
from autotune.config import LoaderConfig
from autotune.dataset._userfile import UserSpec
from autotune.machine import _hardware as hardware
from autotune.machine._cpus import ranks_per_node, usable_cpus
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._measure import Plan, Workload
from autotune.tuner._measurement import Measurement
from autotune.tuner._predict import Prediction
from autotune.tuner._preparation import prepare
from autotune.tuner._runner import Runner, shard
from autotune.tuner._study import SearchOptions

sys.path.insert(0, str(Path(__file__).parent))
from workloads import CheckExact, Exact, Numbers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_ranks_come_from_the_argument_then_torchrun():
    assert ranks_per_node(None, {}) == 1
    assert ranks_per_node(None, {"LOCAL_WORLD_SIZE": "4"}) == 4
    assert ranks_per_node(2, {"LOCAL_WORLD_SIZE": "4"}) == 2
    assert ranks_per_node(None, {"LOCAL_WORLD_SIZE": "junk"}) == 1
    with pytest.raises(ValueError, match="ranks_per_node"):
        ranks_per_node(0)


def test_a_profile_is_filed_under_hardware_and_ranks(monkeypatch):
    one, two = hardware.collect(1), hardware.collect(2)
    assert one["fingerprint"] != two["fingerprint"]
    assert "ranks_per_node" not in hardware.identity(one)  # one rank's fingerprint is what it always was
    assert hardware.differences(one, two)[-1] == "ranks per node: 1 -> 2"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert hardware.collect(None)["fingerprint"] == two["fingerprint"]


def _recipe(path: Path, ranks: int) -> Path:
    hw = hardware.collect(ranks)
    profile = Profile(hardware=hw, dataset=DatasetRecord(source="data.py:dataset", length=64),
                      settings=RunSettings(batch_size=8, epochs=1), config=LoaderConfig(num_workers=1, prefetch_factor=2))
    RecipeFile.merge_write(path, profile)
    return path


def test_a_rank_finds_its_profile_without_a_warning(tmp_path, monkeypatch, capsys):
    path = _recipe(tmp_path / "autotune.json", 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # as torchrun --nproc-per-node 2 sets it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recipe = _api.load(path, on_mismatch="error")
        loader = _api.dataloader(Numbers(16), path, on_mismatch="error", batch_size=8)
    assert recipe.matches_this_machine and loader.num_workers == 1
    assert main(["check", str(path)]) == 0
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert main(["check", str(path)]) == 3  # one process alone is another setting
    assert main(["check", str(path), "--ranks-per-node", "2"]) == 0
    capsys.readouterr()


def test_shards_follow_distributed_sampler():
    plan = Plan(indices=list(range(100, 110)), length=1000)
    shards = [shard(plan, r, 3) for r in range(3)]
    for r, part in enumerate(shards):
        expected = list(DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False))
        assert part.indices == [100 + i for i in expected]
        assert part.length == 334  # each rank's whole run reads a third of the dataset
    assert shard(plan, 0, 1) is plan


def test_ranks_together_report_the_slowest_and_the_sum_of_memory():
    def result(total, memory):
        prediction = Prediction(build_seconds=0.0, first_epoch_seconds=total / 2, epoch_seconds=total / 2,
                                total_seconds=total, epochs=2, extrapolated=False)
        return Measurement(prediction=prediction, epochs=(), measured_samples=8, peak_memory_bytes=memory)

    slow = result(3.0, 50)
    combined = Measurement.slowest_rank([result(2.0, 100), slow])
    assert combined.prediction == slow.prediction and combined.ranks == (2.0, 3.0)
    assert combined.peak_memory_bytes == 150 and combined.measured_samples == 16
    assert combined.added_memory_bytes is None and combined.charged_bytes == 150  # an older study's: the peaks
    assert Measurement.slowest_rank([replace(slow, added_memory_bytes=20), result(2.0, 100)]).charged_bytes == 120
    built = replace(result(2.0, 1), cache_origins=("built",), cache_builders=("b1",))
    waited = replace(result(2.5, 1), cache_origins=("waited",), cache_builders=("b1",))
    both = Measurement.slowest_rank([built, waited])
    assert both.cache_origins == ("built", "waited") and both.cache_builders == ("b1", "b1")  # in rank order
    assert Measurement.from_json(both.to_json()) == both


@pytest.mark.timeout(180)
def test_two_ranks_run_at_once_each_on_its_shard(tmp_path):
    runner = Runner(Workload(dataset=Numbers(64), batch_size=8, epochs=2), [str(Path(__file__).parent)], ranks=2)
    plan = Plan(indices=list(range(64)), length=64, batch_timeout=60, cache_root=str(tmp_path / "trials"))
    result = runner.run(LoaderConfig(num_workers=1, prefetch_factor=2), plan, timeout=120,
                        log_path=str(tmp_path / "trial-0.log"))
    assert len(result.ranks) == 2 and result.total_seconds == max(result.ranks)
    assert result.measured_samples == 64  # 32 per rank
    assert (tmp_path / "trial-0.rank1.log").exists()
    assert list((tmp_path / "trials").iterdir()) == []


@pytest.mark.timeout(300)
def test_the_torchrun_example_trains_and_check_passes_in_both_ranks(tmp_path):
    if shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun not installed")
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    recipe = _recipe(tmp_path / "autotune.json", 2)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "AUTOTUNE_RECIPE": str(recipe), "AUTOTUNE_REPORT": str(tmp_path / "rank{rank}.json")}
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "ddp_train.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tuned on other hardware" not in done.stderr and "RecipeMismatchWarning" not in done.stderr
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["check_exit"] == 0  # `autotune check` inside the rank
        assert report["matches_this_machine"] is True
        assert report["num_workers"] == 1 and report["steps"] > 0


def test_ranks_may_try_up_to_the_nodes_cpus_per_rank(tmp_path):
    """Each rank's CPU share sizes its threads and fingerprint, but workers per rank are searched up to the
    node's CPUs: the ranks run together in each trial, so the measurement decides."""
    spec = UserSpec(dataset=Numbers(64), source="<test>", batch_size=8, epochs=2)
    one = prepare(spec, SearchOptions(budget=30, workdir=tmp_path, ranks_per_node=1, progress=False))
    two = prepare(spec, SearchOptions(budget=30, workdir=tmp_path, ranks_per_node=2, progress=False))
    assert one.space.max_workers == usable_cpus(1) == two.space.max_workers
    assert two.limits.usable_cpus == max(1, usable_cpus(1) // 2) and two.ranks == 2
    assert any(f"up to the node's {usable_cpus(1)} CPUs" in n for n in two.limits.notes)


def _two_ranks_reading_exactly(tmp_path, length, measured, config):
    """One candidate run as 2 ranks on the first ``measured`` of ``length`` samples: every sample a rank's
    step sees is checked bit for bit against dataset[i] (CheckExact), each rank read exactly its shard,
    and the shared trial folder is gone afterwards. Returns the combined Measurement."""
    dataset, seen = Exact(length), tmp_path / "seen"
    seen.mkdir()
    workload = Workload(dataset=dataset, batch_size=8, epochs=1, train_step=CheckExact(dataset, str(seen)))
    runner = Runner(workload, [str(Path(__file__).parent)], ranks=2)
    plan = Plan(indices=list(range(measured)), length=length, batch_timeout=60,
                cache_root=str(tmp_path / "trials"), epochs_measured=1)
    result = runner.run(config, plan, timeout=240, log_path=str(tmp_path / "trial-0.log"))
    read = sorted(sorted({int(i) for i in f.read_text().split()}) for f in seen.iterdir())
    assert read == sorted(sorted(set(shard(plan, r, 2).indices)) for r in range(2))  # each rank its shard
    assert list((tmp_path / "trials").iterdir()) == []
    return result

@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["pickle", "hdf5", "lmdb"])
def test_two_ranks_build_one_shared_disk_cache_and_read_it_exactly(tmp_path, backend):
    """The ranks of one candidate share its folder: the disk cache (and the few-sample build that measures
    a build's start-up) is built once under the factory's build lock; each rank reads its shard of it,
    every sample bit for bit dataset[i]; the folder is gone afterwards."""
    result = _two_ranks_reading_exactly(tmp_path, 96, 80, LoaderConfig(num_workers=1, prefetch_factor=2,
                                                                       cache=backend))
    origins = result.cache_origins
    assert origins.count("built") == 1 and set(origins).issubset({"built", "waited", "reused"}), origins
    assert len(result.cache_builders) == 2 and len(set(result.cache_builders)) == 1  # both read the one build


@pytest.mark.timeout(300)
def test_two_ranks_each_build_their_own_memory_cache_of_every_rank_samples(tmp_path):
    result = _two_ranks_reading_exactly(tmp_path, 48, 40, LoaderConfig(cache="memory"))
    assert result.cache_origins == ("built", "built") and len(set(result.cache_builders)) == 2  # one copy in each rank, as each rank's factory holds


def test_a_shard_reads_from_a_cache_of_every_ranks_samples():
    plan = Plan(indices=[5, 9, 11, 20, 31], length=50)
    part = shard(plan, 1, 2)
    assert part.indices == [9, 20, 5] and part.cached() == ([5, 9, 11, 20, 31], 50) and part.shares_cache
    assert plan.cached() == ([5, 9, 11, 20, 31], 50) and not plan.shares_cache


def test_the_memory_budget_counts_a_memory_cache_once_per_rank(tmp_path, monkeypatch):
    """A memory cache that fits the budget once but not twice is offered to one rank, not to two; a disk
    cache, built once per node, stays. The trials' own processes are planned elsewhere (test_memory_plan.py):
    here they cost nothing, so the budget is the cache's alone."""
    from autotune.tuner import _preparation, _runner

    monkeypatch.setattr(_preparation, "fork_charges", lambda: _runner.ForkCharges(interpreter=0, forked=0))
    monkeypatch.setattr(_preparation, "pickled_size", lambda value: 0)
    spec = UserSpec(dataset=Numbers(64), source="<test>", batch_size=8, epochs=2)
    probe = prepare(spec, SearchOptions(budget=30, workdir=tmp_path, progress=False)).probe
    need, _ = estimate_need("memory", probe.sample_bytes, probe.length)
    budget = need * 3 // 2
    opts = {"budget": 30, "workdir": tmp_path, "progress": False, "max_memory": budget, "caches": ("memory", "hdf5")}
    one = prepare(spec, SearchOptions(**opts, ranks_per_node=1))
    two = prepare(spec, SearchOptions(**opts, ranks_per_node=2))
    assert one.space.caches == (None, "memory", "hdf5") and one.space.cache_shares == ()  # the whole fits once
    # not twice: each rank is offered a partial memory cache instead (the first samples that fit)
    assert two.space.caches == (None, "memory", "hdf5") and two.space.cache_shares
    prefix = (f"cache memory of the whole dataset left out: needs ~{format_bytes(need)} of RAM in each of the node's "
              f"2 ranks, ~{format_bytes(need * 2)} together, over the budget of {format_bytes(budget)} (--max-memory)")
    assert sum(n.startswith(prefix) for n in two.limits.notes) == 1, two.limits.notes
    assert two.limits.memory_budget == budget  # the node's, which the runner checks all ranks against


def _profile(ranks: int, config: LoaderConfig) -> Profile:
    return Profile(hardware=hardware.collect(ranks), dataset=DatasetRecord(source="data.py:dataset", length=64),
                   settings=RunSettings(batch_size=8, epochs=1), config=config)


@pytest.mark.parametrize("cache,words", [
    ("memory", "memory cache, one per rank (x2 in memory)"),
    ("hdf5", "hdf5 cache, shared by the node's 2 ranks"),
])
def test_show_and_the_recipe_say_who_holds_the_cache(tmp_path, cache, words):
    config = LoaderConfig(num_workers=1, prefetch_factor=2, cache=cache)
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, _profile(2, config))
    RecipeFile.merge_write(path, _profile(1, config))
    shown = render(RecipeFile.read(path), hardware.collect(2), str(path))
    cache_rows = [line.split(None, 1)[1] for line in shown.splitlines() if line.strip().startswith("cache ")]
    assert sorted(cache_rows) == sorted([words, cache])  # the 2-rank profile says it; one rank's: the backend
    held = "one per rank, x2 in memory" if cache == "memory" else "shared by the node's 2 ranks"
    assert f"cache={cache} ({held})" in repr(_api.Recipe(_profile(2, config), path))
    assert f"cache={cache})" not in repr(_api.Recipe(_profile(2, config), path))
    assert repr(_api.Recipe(_profile(1, config), path)).startswith(f"Recipe({config.describe()};")


def test_a_killed_searchs_shared_trial_folder_is_a_leftover_that_clear_and_the_next_search_remove(tmp_path):
    """A shared trial folder holds the tag and the build lock open_or_build writes beside its cache: still
    a trial folder, removed whole by `cache clear` and by the next search once its search is gone."""
    from autotune.caches import open_or_build
    from autotune.caches._own import make_own
    from autotune.caches._trust import ensure_root

    for root in (tmp_path / "a", tmp_path / "b"):
        folder = root / "trial-abcdefgh"  # an older autotune's unnamed folder (no host, no pid): a leftover
        root.mkdir()
        make_own(folder, "trial")  # as trial_folder marks it: only a marked folder is ever removed
        ensure_root(folder)
        open_or_build("hdf5", Exact(8), root=folder, manifest={"key": "trial", "dataset": "x"}, indices=range(8),
                      progress=False)
        (folder / ".trial.lock").write_text("")
        assert [e["status"] for e in list_caches(root)] == ["trial leftover"]
    assert clear_caches(tmp_path / "a")["removed"] == [str(tmp_path / "a" / "trial-abcdefgh")]
    assert remove_leftovers(tmp_path / "b") == [tmp_path / "b" / "trial-abcdefgh"]
    assert list((tmp_path / "a").iterdir()) == [] and list((tmp_path / "b").iterdir()) == []
