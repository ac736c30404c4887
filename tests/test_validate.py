"""autotune validate: the recipe run for real over real files, predicted against measured, stored."""

from __future__ import annotations

import functools
import json
import math
import uuid

import pytest
from evict_workloads import FileSamples, page_cache_is_droppable, write_files

import autotune
from autotune import cli
from autotune._validate import error_percent, store, validate
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings
from autotune.tuner._predict import EpochTiming, scale_epoch

pytestmark = pytest.mark.timeout(120)

MEASURED = {"first_epoch_seconds": 2.0, "epoch_seconds": 0.5, "build_seconds": 0.0, "total_seconds": 3.0,
            "speedup": 1.0}


def write_recipe(path, *, config=None, batch_size=8):
    profile = Profile(
        hardware=hardware.collect(),
        dataset=DatasetRecord(source="<python object: FileSamples>", length=40, fingerprint="x"),
        settings=RunSettings(batch_size=batch_size, epochs=2),
        config=config or LoaderConfig(),
        measured=Measured.from_json(dict(MEASURED)),
    )
    RecipeFile.merge_write(path, profile)
    return path


@pytest.fixture
def files(tmp_path):
    return write_files(tmp_path / "data", 40, 64 << 10)


def _extend(seen: list[int], batch) -> None:
    seen.extend(batch[1].tolist())


def test_error_percent():
    assert error_percent(3.0, 2.0) == 50.0
    assert error_percent(1.0, 2.0) == -50.0
    assert error_percent(1.0, None) is None
    assert error_percent(1.0, 0.0) is None


def test_validate_whole_epochs(tmp_path, files):
    recipe = autotune.load(write_recipe(tmp_path / "autotune.json"))
    v = validate(recipe, FileSamples(files), epochs=3)
    assert (v.batches_measured, v.full_batches, v.extrapolated) == (5, 5, False)
    assert [e["batches"] for e in v.epochs] == [5, 5, 5]
    assert v.measured_first_epoch_seconds == v.epochs[0]["seconds"]
    assert v.measured_epoch_seconds == pytest.approx((v.epochs[1]["seconds"] + v.epochs[2]["seconds"]) / 2)  # median
    assert v.predicted_first_epoch_seconds == 2.0 and v.predicted_epoch_seconds == 0.5
    assert v.first_epoch_error_percent == pytest.approx((v.measured_first_epoch_seconds - 2.0) / 2.0 * 100)
    assert v.epoch_error_percent == pytest.approx((v.measured_epoch_seconds - 0.5) / 0.5 * 100)
    assert v.files_found_by == "path list"
    assert v.eviction.files == 40 and v.eviction.bytes == 40 * (64 << 10)
    if page_cache_is_droppable(tmp_path):
        assert v.eviction.effective and v.eviction.resident_after <= 0.1
    assert v.fits_page_cache is True
    assert v.loader["num_workers"] == 0 and v.batch_size == 8
    assert v.on_this_machine and v.profile_fingerprint == recipe.profile.fingerprint
    json.dumps(v.to_dict())  # plain JSON


def test_validate_bounded_and_extrapolated_with_workers(tmp_path, files):
    config = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context="fork")
    recipe = autotune.load(write_recipe(tmp_path / "autotune.json", config=config, batch_size=4))
    seen = []
    v = validate(recipe, FileSamples(files), train_step=lambda batch: seen.append(batch[1].tolist()), max_batches=3)
    assert (v.batches_measured, v.full_batches, v.extrapolated) == (3, 10, True)
    assert [e["batches"] for e in v.epochs] == [3, 3]
    assert len(seen) == 6 and all(len(b) == 4 for b in seen)
    assert seen[:3] != seen[3:], "each epoch is shuffled anew"
    first = EpochTiming(**v.epochs[0])
    assert v.measured_first_epoch_seconds == pytest.approx(scale_epoch(first, 10))
    assert v.eviction.files == 12, "only the files of the batches the cold epoch reads"
    assert v.loader["num_workers"] == 2 and v.loader["persistent_workers"] is True


def test_validate_with_given_files_and_seeded_order(tmp_path, files):
    recipe = autotune.load(write_recipe(tmp_path / "autotune.json"))
    orders = []
    for _ in range(2):
        seen: list[int] = []
        v = validate(recipe, FileSamples(files), evict_paths=files[:3], train_step=functools.partial(_extend, seen))
        orders.append(seen)
        assert v.files_found_by == "given" and v.eviction.files == 3
    assert orders[0] == orders[1] and sorted(orders[0][:40]) == list(range(40))


def test_store_writes_the_validation_and_keeps_the_rest(tmp_path, files):
    path = write_recipe(tmp_path / "autotune.json")
    before = json.loads(path.read_text())
    recipe = autotune.load(path)
    v = validate(recipe, FileSamples(files))
    store(path, v)
    after = json.loads(path.read_text())
    (fp,) = after["profiles"]
    stored = after["profiles"][fp]["measured"]["validation"]
    assert stored == json.loads(json.dumps(v.to_dict()))
    after["profiles"][fp]["measured"].pop("validation")
    assert after == before
    assert autotune.load(path).measured.validation["first_epoch_error_percent"] == v.first_epoch_error_percent


def test_bad_arguments(tmp_path, files):
    recipe = autotune.load(write_recipe(tmp_path / "autotune.json"))
    with pytest.raises(autotune.AutotuneError, match="at least 2 epochs"):
        validate(recipe, FileSamples(files), epochs=1)
    with pytest.raises(autotune.AutotuneError, match="--max-batches must be at least 2"):
        validate(recipe, FileSamples(files), max_batches=1)


def dataset_file(tmp_path, files) -> str:
    name = f"valds_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(
        "from evict_workloads import FileSamples\n"
        f"dataset = FileSamples({[str(f) for f in files]!r})\n"
        "batch_size = 8\n"
    )
    return str(path)


def test_cli_prints_and_stores(tmp_path, files, capsys):
    recipe_path = write_recipe(tmp_path / "autotune.json")
    status = cli.main(["validate", dataset_file(tmp_path, files), "--recipe", str(recipe_path)])
    out = capsys.readouterr().out
    assert status == 0
    assert "first epoch (cold)" in out and "later epoch (warm)" in out and "%" in out
    assert "eviction" in out and "resident" in out
    assert "measured whole epochs of 5 batches" in out
    assert "Stored in" in out
    (profile,) = json.loads(recipe_path.read_text())["profiles"].values()
    assert "validation" in profile["measured"]
    v = profile["measured"]["validation"]
    # no cache: no build to hold against a bare decode, but the floor is there (decode of the samples the run
    # read, here all 40, plus the epochs' gathers from memory)
    assert v["bare_decode_seconds"] is None and "build vs bare decode" not in out
    assert v["floor_decode_seconds"] is not None and v["floor_seconds"] == pytest.approx(
        v["floor_decode_seconds"] + v["floor_gathers_seconds"])
    assert "this machine's floor for the run" in out and "x the floor" in out
    assert v["keep_seconds"] is None and v["keep_bytes"] is None and "keeping the samples" not in out  # no cache


def test_cli_bad_input_is_one_line_exit_2(tmp_path, files, capsys):
    recipe_path = write_recipe(tmp_path / "autotune.json")
    target = dataset_file(tmp_path, files)
    assert cli.main(["validate", target, "--recipe", str(recipe_path), "--max-batches", "1"]) == 2
    assert cli.main(["validate", target, "--recipe", str(tmp_path / "absent.json")]) == 2
    assert cli.main(["validate", str(tmp_path / "nope.py"), "--recipe", str(recipe_path)]) == 2
    assert cli.main(["validate", target, "--recipe", str(recipe_path), "--data-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("autotune: error: ") for line in err)
    (profile,) = json.loads(recipe_path.read_text())["profiles"].values()
    assert "validation" not in profile["measured"]


def test_fresh_process_validation_record(tmp_path, files, capsys):
    """`autotune validate` runs the factory in a new process from a cold start, for the recipe's epochs,
    and stores build, first epoch, steady epoch and total against the prediction, typed."""
    import os

    from autotune.recipe._measured import ValidationRecord

    recipe_path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(cache="memory"))
    before = set(os.listdir(__import__("tempfile").gettempdir()))
    assert cli.main(["validate", dataset_file(tmp_path, files), "--recipe", str(recipe_path)]) == 0
    out = capsys.readouterr().out
    assert "build (dataloader())" in out and "whole run, 2 epochs" in out and "build vs bare decode" in out
    leftover = set(os.listdir(__import__("tempfile").gettempdir())) - before
    assert not [n for n in leftover if n.startswith("autotune-validate-")], "the empty cache folder is removed"
    v = autotune.load(recipe_path).measured.validation
    assert isinstance(v, ValidationRecord)
    assert v.fresh_process and v.epochs_run == 2 and not v.extrapolated and v.cache_fill == "build"
    assert v["loader"]["cache"] == "memory" and v["files_found_by"] == "path list"
    assert [e["batches"] for e in v["epochs"]] == [5, 5]
    assert (v.build.predicted, v.first_epoch.predicted, v.epoch.predicted, v.total.predicted) == (0.0, 2.0, 0.5, 3.0)
    assert v.total.measured == pytest.approx(v.build.measured + v.first_epoch.measured + v.epoch.measured
                                             + v["finish_seconds"])
    assert v.first_epoch.measured == v["epochs"][0]["seconds"] and v.epoch.measured == v["epochs"][1]["seconds"]
    assert v.total.error_percent == pytest.approx((v.total.measured - 3.0) / 3.0 * 100)
    assert v["total_error_percent"] == pytest.approx(v.total.error_percent)
    # a bare decode pass and the child's start were timed (not left unmeasured)
    assert v.bare_decode_seconds is not None
    assert set(v["build_parts"]) == {"recipe_load", "determinism_check", "schema_head"}  # no workers to start
    assert v["process_start_seconds"] is not None and v["eviction"]["files"] == 40
    # this machine's floor beside the run: the same bare decode plus the epochs' gathers from memory
    assert v["floor_decode_seconds"] == v.bare_decode_seconds and v["floor_gathers_seconds"] is not None
    assert v["floor_seconds"] == pytest.approx(v["floor_decode_seconds"] + v["floor_gathers_seconds"])
    assert v["over_floor"] == pytest.approx(v.total.measured / v["floor_seconds"])
    assert f"the whole run is {v['over_floor']:.2f}x the floor" in out
    # what keeping the samples costs beside it: the memory cache's bytes written into fresh memory once
    from evict_workloads import FileSamples

    from autotune.caches._codec import sample_nbytes

    assert v["keep_bytes"] == 40 * sample_nbytes(FileSamples(files)[0])
    assert isinstance(v["keep_seconds"], float) and math.isfinite(v["keep_seconds"])  # measured, not left out
    held = v["floor_seconds"] + v["keep_seconds"]
    assert f"the whole run is {v.total.measured / held:.2f}x the floor plus keeping" in out
    assert f"cache's {v['keep_bytes'] / (1 << 20):.0f} MiB into fresh memory once" in out


def test_a_fresh_validation_keeps_what_the_factory_cost_for_the_next_search(tmp_path, files, capsys):
    """Each run through the factory in a fresh process is kept in the profile's factory_runs, filed under the
    dataset's fingerprint as a search computes it, and a search replacing the profile keeps them."""
    from autotune.dataset._probe import probe_dataset
    from autotune.dataset._userfile import load_user_file
    from autotune.machine._cpus import build_workers

    recipe_path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(cache="memory"))
    target = dataset_file(tmp_path, files)
    for _ in range(2):
        assert cli.main(["validate", target, "--recipe", str(recipe_path)]) == 0
    capsys.readouterr()
    profile = autotune.load(recipe_path).profile
    first, second = profile.factory_runs
    v = profile.measured.validation
    assert second.dataset == probe_dataset(load_user_file(target)).fingerprint
    assert (second.length, second.batch_size, second.config, second.build_workers) == (
        40, 8, LoaderConfig(cache="memory"), build_workers())
    assert (second.build_seconds, second.first_epoch_seconds, second.epoch_seconds) == (
        v.build.measured, v.first_epoch.measured, v.epoch.measured)
    assert first != second and first.dataset == second.dataset
    # --no-store writes nothing, so it adds no run
    assert cli.main(["validate", target, "--recipe", str(recipe_path), "--no-store"]) == 0
    assert len(autotune.load(recipe_path).profile.factory_runs) == 2
    # a new search of this machine replaces the profile and keeps the runs
    write_recipe(recipe_path, config=LoaderConfig())
    again = autotune.load(recipe_path).profile
    assert again.config == LoaderConfig() and again.factory_runs == (first, second)
    stored = json.loads(recipe_path.read_text())
    (raw,) = stored["profiles"].values()
    assert [r["build_seconds"] for r in raw["factory_runs"]] == [first.build_seconds, second.build_seconds]


def test_a_disk_cache_filled_by_the_first_epoch_is_validated_with_its_commit(tmp_path, files, capsys):
    """The fresh process runs the fill the recipe chose, and the whole run counts the commit its exit waits for."""
    config = LoaderConfig(num_workers=2, prefetch_factor=2, multiprocessing_context="fork", persistent_workers=True,
                          cache="pickle", cache_fill="first_epoch")
    recipe_path = write_recipe(tmp_path / "autotune.json", config=config)
    assert cli.main(["validate", dataset_file(tmp_path, files), "--recipe", str(recipe_path)]) == 0
    out = capsys.readouterr().out
    v = autotune.load(recipe_path).measured.validation
    assert v.cache_fill == "first_epoch" and v["loader"]["cache"] == "pickle" and v["loader"]["cache_fill"] == "first_epoch"
    # the fixed steps a disk cache pays, and the recipe's two workers' start-up, each timed
    assert set(v["build_parts"]) == {"recipe_load", "determinism_check", "cache_key", "worker_start"}
    assert v["build_parts"]["worker_start"] > 0 and "worker_start" in out
    assert v.total.measured == pytest.approx(
        v.build.measured + v.first_epoch.measured + v.epoch.measured + v["finish_seconds"])
    assert "whole run, 2 epochs" in out
    assert v["keep_seconds"] is None and "keeping the samples" not in out  # a disk cache's files, not fresh memory
