"""The recipe file: round trip, merge, atomic write, bad files, migrations, choosing a profile."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest

from autotune.config import LoaderConfig
from autotune.errors import HardwareMismatch, RecipeError
from autotune.machine import _hardware as hardware
from autotune.recipe import _file as recipe
from autotune.recipe._file import Profile, RecipeFile, RecipeMismatchWarning, choose_profile
from autotune.recipe._measured import Measured, RunFigures, Subset
from autotune.recipe._records import DatasetRecord, RunSettings

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "recipe_v1.json"
GIB = 1024**3


def hw(**changes) -> dict:
    h = {
        "cpu_model": "AMD EPYC 7763 64-Core Processor",
        "usable_cpus": 8,
        "logical_cpus": 16,
        "memory_bytes": 32 * GIB,
        "gpus": [],
        "torch": "2.13.0+cpu",
        "cuda": None,
        "python": "3.11.7",
        "platform": "Linux",
        "shm_bytes": 16 * GIB,
    }
    h.update(changes)
    h["fingerprint"] = hardware.fingerprint(h)
    return h


def profile(hardware_: dict | None = None, workers: int = 4, **kw) -> Profile:
    return Profile(
        hardware=hardware_ or hw(),
        dataset=DatasetRecord(source="examples/jpeg_folder.py:dataset", length=2000, fingerprint="abc123"),
        settings=RunSettings(batch_size=64, epochs=3),
        config=LoaderConfig(num_workers=workers, prefetch_factor=2, persistent_workers=True,
                            multiprocessing_context="fork", cache="memory") if workers else LoaderConfig(),
        measured=Measured.from_json({"epoch_seconds": 1.5, "default_epoch_seconds": 6.0, "speedup": 4.0,
                  "trials": 20, "failed_trials": 1, "subset": None, "is_default": False}),
        created="2026-05-01T10:00:00+00:00",
        autotune_version="0.1.0",
        **kw,
    )


# ---------------------------------------------------------------------------- round trip


def test_round_trip(tmp_path):
    path = tmp_path / "autotune.json"
    rf = RecipeFile()
    p = profile()
    rf.add(p)
    rf.write(path)
    back = RecipeFile.read(path)
    assert list(back.profiles) == [p.fingerprint]
    assert back.profiles[p.fingerprint] == p
    assert back.path == path
    data = json.loads(path.read_text())
    assert data["format"] == "autotune-recipe" and data["version"] == 2
    assert data["profiles"][p.fingerprint]["hardware"]["fingerprint"] == p.fingerprint


def test_profile_dict_round_trip_keeps_unknown_keys():
    d = profile().to_dict()
    d["added_by_a_newer_autotune"] = {"x": 1}
    p = Profile.from_dict(d)
    assert p.to_dict() == d


def test_profile_defaults():
    p = Profile(hardware=hw(), dataset=DatasetRecord(source="<python object: Foo>", length=3), settings=RunSettings())
    assert p.config == LoaderConfig() and p.measured == Measured()
    assert p.created.startswith("20")
    assert p.fingerprint == hw()["fingerprint"]


def test_add_replaces_same_fingerprint_keeps_others():
    rf = RecipeFile()
    a, b = profile(workers=2), profile(hw(usable_cpus=2), workers=1)
    rf.add(a)
    rf.add(b)
    rf.add(profile(workers=6))
    assert len(rf) == 2
    assert rf.profiles[a.fingerprint].config.num_workers == 6
    assert rf.profiles[b.fingerprint].config.num_workers == 1


def test_merge_write_keeps_other_machine(tmp_path):
    path = tmp_path / "autotune.json"
    laptop = profile(hw(usable_cpus=4), workers=3)
    node = profile(hw(usable_cpus=32, gpus=["NVIDIA A100"], cuda="12.4"), workers=16)
    RecipeFile.merge_write(path, laptop)
    RecipeFile.merge_write(path, node)
    rf = RecipeFile.read(path)
    assert set(rf.profiles) == {laptop.fingerprint, node.fingerprint}
    assert rf.profiles[laptop.fingerprint] == laptop
    # re-searching the laptop replaces only its own profile
    RecipeFile.merge_write(path, profile(hw(usable_cpus=4), workers=2))
    rf = RecipeFile.read(path)
    assert rf.profiles[laptop.fingerprint].config.num_workers == 2
    assert rf.profiles[node.fingerprint] == node
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_merge_write_refuses_to_clobber_corrupt_file(tmp_path):
    path = tmp_path / "autotune.json"
    path.write_text("{not json")
    before = path.read_bytes()
    with pytest.raises(RecipeError, match="corrupt"):
        RecipeFile.merge_write(path, profile())
    assert path.read_bytes() == before


def test_write_keeps_file_mode(tmp_path):
    path = tmp_path / "autotune.json"
    RecipeFile({"x": profile()}).write(path)
    os.chmod(path, 0o640)
    RecipeFile.merge_write(path, profile(hw(usable_cpus=2)))
    assert path.stat().st_mode & 0o777 == 0o640


# ---------------------------------------------------------------------------- atomic write


@pytest.mark.parametrize("where", ["fsync", "replace", "dumps"])
def test_crash_mid_write_leaves_old_file(tmp_path, monkeypatch, where):
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile())
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk on fire")

    target = {"fsync": (os, "fsync"), "replace": (os, "replace"), "dumps": (recipe.json, "dumps")}[where]
    monkeypatch.setattr(*target, boom)
    with pytest.raises(OSError, match="disk on fire"):
        RecipeFile.merge_write(path, profile(hw(usable_cpus=2)))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["autotune.json"]


def test_crash_on_first_write_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("nope")))
    with pytest.raises(OSError):
        RecipeFile.merge_write(path, profile())
    assert not path.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ---------------------------------------------------------------------------- bad files


def test_missing_file():
    with pytest.raises(RecipeError) as e:
        RecipeFile.read("/nonexistent/autotune.json")
    assert str(e.value) == (
        "No recipe file at /nonexistent/autotune.json; run `autotune search DATASET` to create one."
    )


BAD = {
    "not json": ("{\"format\": \"autotune-recipe\", ", "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "wrong format": (json.dumps({"format": "something-else", "version": 1}), "not an autotune recipe"),
    "a list": ("[1, 2]", "not an autotune recipe"),
    "no version": (json.dumps({"format": "autotune-recipe", "profiles": {}}), "format version is None"),
    "version string": (json.dumps({"format": "autotune-recipe", "version": "1", "profiles": {}}), "format version"),
    "version zero": (json.dumps({"format": "autotune-recipe", "version": 0, "profiles": {}}), "format version is 0"),
    "future": (json.dumps({"format": "autotune-recipe", "version": 99, "profiles": {}}),
               "format version 99, newer than this autotune reads .*upgrade autotune"),
    "profiles list": (json.dumps({"format": "autotune-recipe", "version": 1, "profiles": []}), "'profiles' is not an object"),
    "profile no config": (json.dumps({"format": "autotune-recipe", "version": 2,
                                      "profiles": {"x": {"hardware": {}, "dataset": {}}}}), "profile 'x'.*'config'"),
    "v1 cache a string": (json.dumps({"format": "autotune-recipe", "version": 1, "profiles": {"x": {
        "hardware": {}, "dataset": {}, "loader": {}, "cache": "memory"}}}), "must be objects"),
}


def _v2(**changes) -> str:
    """A version-2 file whose one profile has ``changes`` applied (dotted keys reach inside)."""
    d = profile().to_dict()
    for key, value in changes.items():
        where, _, name = key.rpartition(".")
        target = d
        for part in filter(None, where.split(".")):
            target = target[part]
        target[name] = value
    return json.dumps({"format": "autotune-recipe", "version": 2, "profiles": {"x": d}})


# A hand-edited or hostile recipe: each gets one line naming the problem, never a traceback.
BAD.update({
    "workers a string": (_v2(**{"config.num_workers": "two"}), "num_workers must be an integer from 0 to 1024, but got 'two'"),
    "memory a string": (_v2(**{"hardware.memory_bytes": "lots"}), "hardware.memory_bytes must be a int, but got 'lots'"),
    "a billion threads": (_v2(**{"config.main_threads": 10**9}), "main_threads must be an integer from 1 to 4096"),
    "negative workers": (_v2(**{"config.num_workers": -1}), "num_workers must be an integer from 0"),
    "unknown backend": (_v2(**{"config.cache": "../../etc"}), "cache must be one of memory, pickle, hdf5, lmdb"),
    "unknown config key": (_v2(**{"config.timeout": 5}), "unknown keys 'timeout'"),
    "escape sequence": (_v2(**{"dataset.source": "data.py\u001b[2J"}), "control characters"),
    "fork with threads": (_v2(**{"config.worker_threads": 4}), "forked workers must keep one intra-op thread"),
    "batch zero": (_v2(**{"settings.batch_size": 0}), "batch_size must be a positive integer"),
    "workers bool": (_v2(**{"config.num_workers": True}), "num_workers must be an integer"),
})


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_file_is_a_one_line_error_and_untouched(tmp_path, name):
    text, pattern = BAD[name]
    path = tmp_path / "autotune.json"
    path.write_text(text)
    before = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    with pytest.raises(RecipeError, match=pattern) as e:
        RecipeFile.read(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert "autotune" in msg  # names the fix
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime
    with pytest.raises(RecipeError):
        RecipeFile.merge_write(path, profile())
    assert path.read_bytes() == before


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(RecipeError, match="is a folder"):
        RecipeFile.read(tmp_path)


def test_non_finite_measurement_is_refused_before_writing(tmp_path):
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, profile())
    before = path.read_bytes()
    bad = profile(hw(usable_cpus=2))
    bad.measured = Measured(chosen=RunFigures(epoch_seconds=float("nan")))
    with pytest.raises(ValueError):
        RecipeFile.merge_write(path, bad)
    assert path.read_bytes() == before


# ---------------------------------------------------------------------------- versions


def test_saved_v1_sample_loads():
    rf = RecipeFile.read(SAMPLE)
    assert len(rf) == 2
    by_cpu = {p.hardware["cpu_model"]: p for p in rf.profiles.values()}
    laptop = by_cpu["Intel(R) Core(TM) i7-1185G7 @ 3.00GHz"]
    node = by_cpu["AMD EPYC 7763 64-Core Processor"]
    assert laptop.config == LoaderConfig(num_workers=6, prefetch_factor=4, persistent_workers=True,
                                         multiprocessing_context="fork")
    assert node.hardware["gpus"] == ["NVIDIA A100-SXM4-80GB"] * 4
    assert node.config.cache == "memory"
    assert node.measured.subset == Subset(measured=512, length=2000) and node.measured.subset.extrapolated
    # the keys on disk are the fingerprints the hardware gives today
    raw = json.loads(SAMPLE.read_text())
    assert set(raw["profiles"]) == set(rf.profiles)


def test_saved_v1_sample_rewrites_as_v2_keeping_everything_else(tmp_path):
    copy = tmp_path / "autotune.json"
    shutil.copy(SAMPLE, copy)
    RecipeFile.read(copy).write(copy)
    old, new = json.loads(SAMPLE.read_text()), json.loads(copy.read_text())
    assert new["version"] == 2 and set(new["profiles"]) == set(old["profiles"])
    for fp, p in new["profiles"].items():
        before = old["profiles"][fp]
        assert {k: v for k, v in p.items() if k not in ("config", "measured")} == {
            k: v for k, v in before.items() if k not in ("loader", "threads", "process", "cache", "measured")}
        assert Measured.from_json(p["measured"]) == Measured.from_json(before["measured"])
        assert LoaderConfig.from_json(p["config"]).loader_kwargs() == {
            k: v for k, v in before["loader"].items() if before["loader"]["num_workers"] or k in ("num_workers", "pin_memory")}


def test_migration_table_converts_older_versions(tmp_path, monkeypatch):
    # pretend the current format is 3 and the sample is an old v1 file
    def v2_to_v3(d):
        for p in d["profiles"].values():
            p["config"]["main_threads"] = 2
            p["added_in_v3"] = True
        return d

    monkeypatch.setattr(recipe, "VERSION", 3)
    monkeypatch.setattr(recipe, "_MIGRATIONS", {**recipe._MIGRATIONS, 2: v2_to_v3})
    path = tmp_path / "autotune.json"
    shutil.copy(SAMPLE, path)
    before = path.read_bytes()
    rf = RecipeFile.read(path)
    assert all(p.config.main_threads == 2 and p.extra["added_in_v3"] for p in rf.profiles.values())
    assert path.read_bytes() == before  # reading never rewrites
    rf.write(path)
    assert json.loads(path.read_text())["version"] == 3


def test_old_version_without_migration_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe, "VERSION", 2)
    monkeypatch.setattr(recipe, "_MIGRATIONS", {})
    with pytest.raises(RecipeError, match="can no longer convert"):
        RecipeFile.read(SAMPLE)


# ---------------------------------------------------------------------------- choosing


def three_machines() -> RecipeFile:
    rf = RecipeFile(path=Path("autotune.json"))
    rf.add(profile(hw(usable_cpus=4), workers=3))
    rf.add(profile(hw(usable_cpus=16), workers=12))
    rf.add(profile(hw(usable_cpus=16, gpus=["NVIDIA H100"], cuda="12.4"), workers=14))
    return rf


def test_choose_exact_match_no_warning():
    rf = three_machines()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p, changes = choose_profile(rf, hw(usable_cpus=16))
    assert changes == [] and p.config.num_workers == 12


def test_choose_nearest_warns_with_changes_and_command():
    rf = three_machines()
    with pytest.warns(RecipeMismatchWarning) as record:
        p, changes = choose_profile(rf, hw(usable_cpus=12))
    assert p.config.num_workers == 12  # 16 CPUs is nearer to 12 than 4 is
    assert changes == ["usable CPUs: 16 -> 12"]
    msg = str(record[0].message)
    assert "autotune.json" in msg
    assert "usable CPUs: 16 -> 12" in msg
    assert "`autotune search examples/jpeg_folder.py:dataset`" in msg
    assert record[0].filename == __file__  # points at the caller


def test_choose_nearest_prefers_gpu_match():
    rf = three_machines()
    with pytest.warns(RecipeMismatchWarning, match="usable CPUs: 16 -> 8"):
        p, _ = choose_profile(rf, hw(usable_cpus=8, gpus=["NVIDIA H100"], cuda="12.4"))
    assert p.config.num_workers == 14


def test_choose_error_raises_same_text():
    rf = three_machines()
    with pytest.raises(HardwareMismatch) as e:
        choose_profile(rf, hw(usable_cpus=12), on_mismatch="error")
    assert e.value.exit_code == 3
    with pytest.warns(RecipeMismatchWarning) as record:
        choose_profile(rf, hw(usable_cpus=12))
    assert str(e.value) == str(record[0].message)


def test_choose_search_mode_is_silent():
    rf = three_machines()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p, changes = choose_profile(rf, hw(usable_cpus=12), on_mismatch="search")
    assert changes == ["usable CPUs: 16 -> 12"]


def test_choose_bad_mode_and_empty_file():
    with pytest.raises(ValueError, match="on_mismatch must be one of"):
        choose_profile(three_machines(), hw(), on_mismatch="ignore")
    with pytest.raises(RecipeError, match="has no profiles"):
        choose_profile(RecipeFile(), hw())


def test_regenerate_command_for_python_object():
    p = profile()
    p.dataset = dataclasses.replace(p.dataset, source="<python object: MyDataset>")
    assert "autotune.search(dataset" in recipe.regenerate_command(p)
    assert recipe.regenerate_command(profile()) == "`autotune search examples/jpeg_folder.py:dataset`"


def test_choose_against_this_machine_with_sample():
    rf = RecipeFile.read(SAMPLE)
    here = hardware.collect()
    p, changes = choose_profile(rf, here, on_mismatch="search")
    assert (changes == []) == (here["fingerprint"] in rf.profiles)
    assert p.fingerprint in rf.profiles


def test_measured_round_trips_exactly_and_derives_the_speedup():
    m = profile().measured
    assert m.chosen.epoch_seconds == 1.5 and m.default.epoch_seconds == 6.0
    assert m.speedup is None  # no whole-run figures: nothing to divide (the 4.0 on disk was not trusted)
    again = Measured.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m


@pytest.mark.parametrize("key, value, message", [
    ("total_seconds", "fast", "measured.total_seconds must be a non-negative number of seconds, but got 'fast'"),
    ("peak_memory_bytes", "lots", "measured.peak_memory_bytes must be a non-negative integer, but got 'lots'"),
    ("trials", -3, "measured.trials must be a non-negative integer, but got -3"),
    ("is_default", "yes", "measured.is_default must be true or false, but got 'yes'"),
    ("finalists", [{"config": {"num_workers": "two"}}], "num_workers must be an integer from 0 to 1024"),
])
def test_bad_measured_figures_are_one_line_recipe_errors(key, value, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        Measured.from_json({key: value})


@pytest.mark.parametrize("record", [
    DatasetRecord(source="data.py:dataset", length=2000, fingerprint="abc"),
    DatasetRecord(source="data.py:stream", length=400, stream=True, length_known=True),
    DatasetRecord(source="data.py:stream", stream=True),
    DatasetRecord(),
])
def test_a_dataset_record_reads_back_what_it_wrote(record):
    assert DatasetRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_records_keep_a_newer_autotunes_keys_and_refuse_wrong_types():
    data = {"source": "d.py", "length": 3, "shards": 4}
    assert DatasetRecord.from_json(data).to_json() == data
    assert RunSettings.from_json({"batch_size": 8, "warmup": 2}).to_json() == {"batch_size": 8, "warmup": 2}
    for bad, field in (({"length": -1}, "dataset.length"), ({"length": True}, "dataset.length"),
                       ({"stream": "yes"}, "dataset.stream"), ({"source": 3}, "dataset.source")):
        with pytest.raises(RecipeError, match=field):
            DatasetRecord.from_json(bad)
    for bad in ({"batch_size": 0}, {"epochs": 1.5}, {"batch_size": "8"}):
        with pytest.raises(RecipeError, match="must be a positive integer"):
            RunSettings.from_json(bad)
