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
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

from autotune import _api
from autotune.cli._main import main
from autotune.config import LoaderConfig
from autotune.dataset._userfile import UserSpec
from autotune.machine import _hardware as hardware
from autotune.machine._cpus import ranks_per_node, usable_cpus
from autotune.recipe._file import Profile, RecipeFile
from autotune.tuner._measure import Plan, Workload
from autotune.tuner._measurement import Measurement
from autotune.tuner._predict import Prediction
from autotune.tuner._preparation import prepare
from autotune.tuner._runner import Runner, shard
from autotune.tuner._study import SearchOptions

sys.path.insert(0, str(Path(__file__).parent))
from workloads import Numbers  # noqa: E402

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
    profile = Profile(hardware=hw, dataset={"source": "data.py:dataset", "length": 64},
                      settings={"batch_size": 8, "epochs": 1}, config=LoaderConfig(num_workers=1, prefetch_factor=2))
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
