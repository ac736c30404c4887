"""Streams (IterableDataset): the sharding check, bounded measurement, the stream's preparation, and one
real search whose recipe then builds a loader that yields every sample once."""

from __future__ import annotations

import collections
import json

import pytest
from workloads import Numbers, SizedStream, Stream, UnshardedStream, double

import autotune
from autotune.cli import main
from autotune.config import LoaderConfig
from autotune.dataset._stream import check_sharding, is_stream, stream_length
from autotune.dataset._userfile import UserSpec
from autotune.errors import DatasetError
from autotune.tuner._measure import Plan, Workload, measure
from autotune.tuner._preparation import prepare
from autotune.tuner._study import SearchOptions

pytestmark = pytest.mark.timeout(240)

WORKERS = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork")


def test_streams_are_told_from_map_style_datasets():
    assert is_stream(Stream()) and not is_stream(Numbers(4))
    assert stream_length(Stream()) is None and stream_length(SizedStream(30)) == 30


def test_a_sharded_stream_passes_and_an_unsharded_one_is_refused():
    assert check_sharding(Stream(100)) is None
    with pytest.raises(DatasetError) as err:
        check_sharding(UnshardedStream(100))
    text = str(err.value)
    assert "16 of the first 32 samples were duplicates" in text
    assert "torch.utils.data.get_worker_info()" in text and "split_by_worker" in text


def test_the_unsharded_stream_is_one_line_and_exit_2_before_any_recipe(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dup_stream.py").write_text("from workloads import UnshardedStream\ndataset = UnshardedStream(100)\n")
    assert main(["search", "dup_stream.py", "--budget", "10s", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("autotune: error: The stream does not split its data")
    assert not (tmp_path / "autotune.json").exists()


@pytest.mark.parametrize("config", [LoaderConfig(), WORKERS], ids=["main", "workers"])
def test_an_endless_stream_is_measured_over_a_bounded_number_of_batches(config):
    workload = Workload(dataset=Stream(None), batch_size=8, epochs=3)
    plan = Plan(indices=list(range(64)), length=640, stream=True, sample_memory=False)
    figures = measure(workload, config, plan)
    assert [e.batches for e in figures.epochs] == [8, 8]
    assert figures.measured_samples == 64
    assert figures.prediction.extrapolated is True


@pytest.mark.parametrize("config, batches", [(LoaderConfig(), 5), (WORKERS, 6)], ids=["main", "workers"])
def test_a_stream_shorter_than_the_bound_is_read_whole(config, batches):
    """Two workers batch their own halves: 8, 8 and a partial 4 each."""
    workload = Workload(dataset=Stream(40), batch_size=8, epochs=2)
    plan = Plan(indices=list(range(64)), length=64, stream=True, sample_memory=False)
    figures = measure(workload, config, plan)
    assert [e.batches for e in figures.epochs] == [batches, batches]
    assert figures.prediction.extrapolated is False


def test_a_stream_is_prepared_without_caches_and_with_its_length(tmp_path):
    opts = SearchOptions(budget=10, workdir=tmp_path, progress=False, allocators=("glibc",))
    spec = UserSpec(dataset=Stream(None), source="<test>", batch_size=8, epochs=2)
    setup = prepare(spec, opts)
    assert setup.space.caches == (None,) and setup.plan.stream
    assert any(n.startswith("caches left out: a stream") for n in setup.limits.notes)
    assert any("the stream has no length" in n for n in setup.limits.notes)
    assert setup.plan.length == len(setup.plan.indices) and len(setup.plan.indices) % 8 == 0
    spec.samples_per_epoch = 100_000
    setup = prepare(spec, opts)
    assert setup.plan.length == 100_000 and setup.probe.length_known


def test_a_real_stream_search_and_its_recipe(tmp_path):
    out = tmp_path / "autotune.json"
    recipe = autotune.search(Stream(400, delay=0.001), batch_size=8, epochs=2, budget=12, output=out,
                             workdir=tmp_path / ".autotune", progress=False, samples_per_epoch=400)
    assert recipe.config.cache is None
    (profile,) = json.loads(out.read_text())["profiles"].values()
    assert profile["dataset"]["stream"] is True and profile["dataset"]["length"] == 400
    assert any(n.startswith("caches left out: a stream") for n in profile["measured"]["notes"])
    for workers in (0, 2):
        loader = autotune.dataloader(Stream(400), out, transform=double, num_workers=workers, progress=False)
        seen = collections.Counter(int(i) for _, labels in loader for i in labels)
        assert seen == collections.Counter(range(400))
    with pytest.raises(autotune.AutotuneError, match="cannot be cached"):
        autotune.dataloader(Stream(400), out, cache="memory")


def test_a_stream_file_loads_with_its_samples_per_epoch(tmp_path):
    from autotune.dataset._userfile import load_user_file

    path = tmp_path / "stream_file.py"
    path.write_text("from workloads import Stream\ndataset = Stream(None)\nsamples_per_epoch = 500\n")
    spec = load_user_file(str(path))
    assert is_stream(spec.dataset) and spec.samples_per_epoch == 500
    assert load_user_file(str(path), samples_per_epoch=64).samples_per_epoch == 64
