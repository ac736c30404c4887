"""What the factory cost on this machine (``autotune validate``'s runs, kept in the profile) and the search
predicting from it: the records read strictly, each run standing only for the phases it decides, and a
search's figures and choice learned from them. In memory: the search core with its fake runner."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_search_core import FakeRunner, _opts, _result, _setup, _spec

from autotune.cli import main
from autotune.config import LoaderConfig
from autotune.errors import RecipeError
from autotune.machine import _hardware as hardware
from autotune.machine._evict import EvictionReport
from autotune.recipe import _factory_runs
from autotune.recipe._factory_runs import KEEP, FactoryRun, from_validation, merged
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._factory_costs import FactoryCosts
from autotune.tuner._study import search

MEMORY = LoaderConfig(cache="memory")
WORKERS = LoaderConfig(num_workers=2)


def _run(config: LoaderConfig = MEMORY, *, build: float = 2.5, first: float = 0.3, epoch: float = 0.2,
         dataset: str = "f" * 16, length: int = 1000, batch_size: int = 64, workers: int = 0,
         at: str = "2026-11-30T00:00:00+00:00") -> FactoryRun:
    return FactoryRun(dataset=dataset, length=length, batch_size=batch_size, config=config,
                      build_workers=workers if config.cache else 0, build_seconds=build, first_epoch_seconds=first,
                      epoch_seconds=epoch, validated_at=at)


def test_a_factory_run_round_trips_exactly_through_json():
    run = _run(LoaderConfig(num_workers=2, cache="lmdb", persistent_workers=True), workers=2)
    assert FactoryRun.from_json(json.loads(json.dumps(run.to_json()))) == run
    assert _factory_runs.read(None) == ()


@pytest.mark.parametrize("key, value, message", [
    ("build_seconds", True, "factory_runs[].build_seconds must be a non-negative number of seconds, but got True"),
    ("epoch_seconds", -1.0, "factory_runs[].epoch_seconds must be a non-negative number of seconds, but got -1.0"),
    ("first_epoch_seconds", "0.3", "must be a non-negative number of seconds, but got '0.3'"),
    ("length", 2.5, "factory_runs[].length must be a non-negative integer, but got 2.5"),
    ("dataset", 7, "factory_runs[].dataset must be a string, but got 7"),
    ("config", {"cache": "/etc/passwd"}, "cache must be one of memory, pickle, hdf5, lmdb"),
])
def test_a_bad_factory_run_is_a_recipe_error_naming_it(key, value, message):
    data = {**_run().to_json(), key: value}
    with pytest.raises(RecipeError, match=None) as err:
        FactoryRun.from_json(data)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RecipeError, match="factory_runs must be a list of objects"):
        _factory_runs.read({"build_seconds": 1.0})


def test_a_hostile_factory_runs_list_is_one_line_and_exit_2(tmp_path, capsys):
    hw = hardware.collect()
    profile = Profile(hardware=hw, dataset=DatasetRecord(source="data.py", length=10), settings=RunSettings(batch_size=4))
    doc = {"format": "autotune-recipe", "version": 2, "profiles": {profile.fingerprint: {
        **profile.to_dict(), "factory_runs": [{**_run().to_json(), "build_seconds": float("inf")}]}}}
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps(doc).replace("Infinity", "1e999"))
    assert main(["show", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("autotune: error: ") and "factory_runs[].build_seconds" in line


def test_merged_keeps_the_newest_runs_once_each():
    runs = tuple(_run(build=float(k)) for k in range(KEEP + 3))
    assert merged(runs[:4], runs[2:6]) == runs[:6]
    assert merged(runs[:5], runs[5:]) == runs[-KEEP:]
    assert merged((), ()) == ()


def _validation(**changes):
    values = dict(fresh_process=True, on_this_machine=True, dataset_fingerprint="d" * 16, dataset_length=40,
                  profile_fingerprint=None, batch_size=8, bare_decode_workers=2, measured_build_seconds=1.5,
                  measured_first_epoch_seconds=0.4, measured_epoch_seconds=0.1, validated_at="2026-11-30T01:00:00",
                  eviction=EvictionReport(files=3, bytes=300, resident_before=1.0, resident_after=0.0, effective=True,
                                          note=""))
    values.update(changes)
    return SimpleNamespace(**values)


def _profile(config: LoaderConfig = MEMORY, ranks: int | None = None) -> Profile:
    hw = hardware.collect(ranks_per_node=ranks) if ranks else hardware.collect()
    return Profile(hardware=hw, dataset=DatasetRecord(source="data.py", length=40, fingerprint="d" * 16),
                   settings=RunSettings(batch_size=8, epochs=3), config=config)


def test_a_validation_is_a_factory_run_only_where_it_stands_for_this_machines_factory():
    profile = _profile()
    ok = _validation(profile_fingerprint=profile.fingerprint)
    assert from_validation(ok, profile) == FactoryRun(
        dataset="d" * 16, length=40, batch_size=8, config=MEMORY, build_workers=2, build_seconds=1.5,
        first_epoch_seconds=0.4, epoch_seconds=0.1, validated_at="2026-11-30T01:00:00")
    plain = _profile(LoaderConfig())
    assert from_validation(replace_ns(ok, profile_fingerprint=plain.fingerprint), plain).build_workers == 0
    assert from_validation(replace_ns(ok, fresh_process=False), profile) is None  # in the caller's process
    assert from_validation(replace_ns(ok, on_this_machine=False), profile) is None  # another machine's recipe
    assert from_validation(replace_ns(ok, dataset_fingerprint=None), profile) is None
    warm = EvictionReport(files=3, bytes=300, resident_before=1.0, resident_after=1.0, effective=False,
                          note="the page cache kept the files")
    assert from_validation(replace_ns(ok, eviction=warm), profile) is None  # not a cold start
    assert from_validation(replace_ns(ok, eviction=None), profile) is not None
    generated = EvictionReport(files=0, bytes=0, resident_before=None, resident_after=None, effective=False,
                               note="no files to evict")
    assert from_validation(replace_ns(ok, eviction=generated), profile) is not None  # read alike by trials
    assert from_validation(replace_ns(ok, profile_fingerprint="0" * 12), profile) is None
    ranked = _profile(ranks=2)
    assert from_validation(replace_ns(ok, profile_fingerprint=ranked.fingerprint), ranked) is None


def replace_ns(ns: SimpleNamespace, **changes) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(ns), **changes})


COSTS = dict(dataset="f" * 16, length=1000, batch_size=64, build_workers=0)


def test_the_build_is_learned_from_runs_of_the_same_data_cache_and_build_workers():
    measured = _result(6.0)  # build 0, first 2, epoch 2, 3 epochs
    runs = (_run(build=2.0), _run(build=3.0), _run(build=7.0),  # the median: 3.0
            _run(build=50.0, dataset="e" * 16), _run(build=50.0, length=999), _run(build=50.0, workers=2),
            _run(LoaderConfig(cache="pickle"), build=50.0))
    costs = FactoryCosts(runs=runs, **COSTS)
    learned, note = costs.learned(LoaderConfig(num_workers=2, cache="memory"), measured)
    p = learned.prediction
    assert (p.build_seconds, p.first_epoch_seconds, p.epoch_seconds, p.total_seconds) == (3.0, 2.0, 2.0, 9.0)
    assert learned.runs == measured.runs and learned.peak_memory_bytes == measured.peak_memory_bytes
    assert note == ("predicted from runs of the factory on this machine (autotune validate): the build from 3 "
                    "(trials: 0.00 s, factory: 3.00 s); whole run 6.00 s -> 9.00 s")
    # a cache filled while the first epoch trains has no build of its own to learn; no cache, no build
    filled = LoaderConfig(cache="memory", cache_fill="first_epoch")
    assert costs.learned(filled, measured) == (measured, None)
    assert costs.learned(WORKERS, measured) == (measured, None)


def test_the_epochs_are_learned_only_from_runs_of_the_same_configuration_and_batch():
    measured = _result(6.0)
    runs = (_run(WORKERS, first=1.0, epoch=0.5), _run(WORKERS, first=1.2, epoch=0.7),
            _run(WORKERS, first=9.0, epoch=9.0, batch_size=32), _run(LoaderConfig(num_workers=1), first=9.0))
    learned, note = FactoryCosts(runs=runs, **COSTS).learned(WORKERS, measured)
    p = learned.prediction
    assert (p.build_seconds, p.first_epoch_seconds, p.epoch_seconds) == (0.0, 1.1, 0.6)
    assert p.total_seconds == pytest.approx(0.0 + 1.1 + 0.6 * 2)
    assert note is not None and "the epochs from 2 (trials: 2.00 s then 2.00 s, factory: 1.10 s then 0.60 s)" in note
    assert FactoryCosts(runs=runs, **COSTS).learned(LoaderConfig(num_workers=3), measured) == (measured, None)


def _hw_fingerprint() -> str:
    return hardware.fingerprint(_setup().hardware)


def test_a_search_chooses_on_what_the_factory_costs_here(tmp_path):
    """The fake gives a memory cache 4 s off every run and no build. The factory, validated on this machine,
    took 7 s to build it: the search learns that, and workers without the memory cache win (the fake gives
    the pickle cache nothing: with or without it, 8 s). Without the runs the memory cache wins."""
    plain = search(_spec(), _opts(tmp_path / "a", max_trials=8), setup=_setup(), runner=FakeRunner())
    assert plain.config.cache == "memory"
    assert not any("factory" in n for n in plain.notes)

    runs = {_hw_fingerprint(): (_run(build=7.0), _run(build=6.0), _run(build=8.0))}
    learned = search(_spec(), _opts(tmp_path / "b", factory_runs=runs, max_trials=8), setup=_setup(),
                     runner=FakeRunner())
    assert learned.config.cache != "memory" and learned.config.num_workers and not learned.is_default
    assert int(learned.figures.total_seconds) == 8  # the fake's figure for workers: 8 s plus 0.01 s a run
    assert not any("factory" in n for n in learned.notes)


def test_the_winners_figures_are_the_factorys_where_it_ran_that_configuration(tmp_path):
    first = search(_spec(), _opts(tmp_path / "a", max_trials=8), setup=_setup(), runner=FakeRunner())
    winner = first.config
    runs = {_hw_fingerprint(): (_run(winner, build=1.0, first=0.9, epoch=0.4),
                                _run(winner, build=1.2, first=1.1, epoch=0.6))}
    again = search(_spec(), _opts(tmp_path / "b", factory_runs=runs, max_trials=8), setup=_setup(),
                   runner=FakeRunner())
    assert again.config == winner
    p = again.figures.prediction
    assert (p.build_seconds, p.first_epoch_seconds, p.epoch_seconds) == pytest.approx((1.1, 1.0, 0.5))
    assert p.total_seconds == pytest.approx(1.1 + 1.0 + 0.5 * 2)
    (note,) = [n for n in again.notes if "factory" in n]
    assert note.startswith("predicted from runs of the factory on this machine (autotune validate): the build from 2")


def test_a_search_reads_the_recipe_files_factory_runs_and_keeps_them(tmp_path, monkeypatch):
    """Through the public path: search_spec reads the output file's runs, the winner's figure is learned,
    and the profile written back still holds the runs."""
    from autotune._api import search_spec
    from autotune.tuner import _study

    out = tmp_path / "autotune.json"
    hw = _setup().hardware
    hw = {**hardware.collect(), **hw}
    setup = replace(_setup(), hardware=hw)
    fp = hardware.fingerprint(hw)
    first = _study.search(_spec(), _opts(tmp_path / "a", max_trials=8), setup=setup, runner=FakeRunner())
    run = _run(first.config, build=1.0, first=1.0, epoch=1.0)
    profile = Profile(hardware=hw, dataset=DatasetRecord(source="<test>", length=1000, fingerprint="f" * 16),
                      settings=RunSettings(batch_size=64, epochs=3), config=first.config, factory_runs=(run,))
    RecipeFile.merge_write(out, profile)

    real = _study.search
    monkeypatch.setattr(_study, "search", lambda spec, opts: real(spec, opts, setup=setup, runner=FakeRunner()))
    recipe, outcome = search_spec(_spec(), _opts(tmp_path / "b", max_trials=8), out)
    assert outcome.figures.total_seconds == pytest.approx(4.0)
    assert recipe.profile.measured.chosen.total_seconds == pytest.approx(4.0)
    (stored,) = RecipeFile.read(out).profiles.values()
    assert stored.fingerprint == fp and stored.factory_runs == (run,)
    assert any("factory" in n for n in stored.measured.notes)


def test_factory_runs_are_left_out_of_a_profile_that_has_none(tmp_path):
    doc = _profile().to_dict()
    assert "factory_runs" not in doc
    assert Profile.from_dict(doc).factory_runs == ()
    with_runs = Profile.from_dict({**doc, "factory_runs": [_run().to_json()]})
    assert with_runs.factory_runs == (_run(),) and with_runs.to_dict()["factory_runs"] == [_run().to_json()]
    assert Path(RecipeFile.merge_write(tmp_path / "r.json", with_runs).path).exists()


def test_a_stream_several_ranks_or_another_machine_learn_nothing_here(tmp_path):
    from autotune.tuner._study import _factory_costs

    setup = _setup()
    runs = {_hw_fingerprint(): (_run(),)}
    opts = _opts(tmp_path, factory_runs=runs)
    costs = _factory_costs(opts, setup.hardware, setup.probe, setup.plan, _spec(), ranks=1)
    assert costs == FactoryCosts(runs=(_run(),), dataset="f" * 16, length=1000, batch_size=64, build_workers=0)
    assert _factory_costs(opts, setup.hardware, setup.probe, setup.plan, _spec(), ranks=2) == FactoryCosts()
    elsewhere = _opts(tmp_path, factory_runs={"0" * 12: (_run(),)})  # another machine's runs
    assert _factory_costs(elsewhere, setup.hardware, setup.probe, setup.plan, _spec(), ranks=1).runs == ()
    stream = replace(setup.probe, stream=True)
    assert _factory_costs(opts, setup.hardware, stream, setup.plan, _spec(), ranks=1) == FactoryCosts()
