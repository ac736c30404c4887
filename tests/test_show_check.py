"""`autotune show` and `autotune check`, run in-process through autotune.cli.main."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autotune.cli._main import main
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings

SAMPLE = Path(__file__).parent / "data" / "recipe_v1.json"


def make_profile(hw: dict, workers: int) -> Profile:
    return Profile(
        hardware=hw,
        dataset=DatasetRecord(source="examples/jpeg_folder.py:dataset", length=2000, fingerprint="f00d"),
        settings=RunSettings(batch_size=64, epochs=3),
        config=LoaderConfig(num_workers=workers, prefetch_factor=4 if workers else None, persistent_workers=workers > 0,
                            multiprocessing_context="forkserver" if workers else None, cache="pickle"),
        measured=Measured.from_json({"epoch_seconds": 2.5, "first_epoch_seconds": 4.0, "total_seconds": 9.0,
                  "default_epoch_seconds": 10.0, "default_total_seconds": 30.0, "speedup": 3.33,
                  "peak_memory_bytes": 3 * 1024**3, "trials": 17, "failed_trials": 2,
                  "subset": {"measured": 256, "length": 2000, "extrapolated": True}, "is_default": False}),
        created="2026-05-09T08:00:00+00:00",
        autotune_version="0.1.0",
    )


def other_machine() -> dict:
    hw = dict(hardware.collect())
    hw.update(cpu_model="Imaginary CPU 9000", usable_cpus=hw["usable_cpus"] + 6,
              gpus=["NVIDIA H100 80GB HBM3"], cuda="12.4")
    return hw


@pytest.fixture
def matching(tmp_path) -> Path:
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(other_machine(), 8))
    RecipeFile.merge_write(path, make_profile(hardware.collect(), 1))
    return path


@pytest.fixture
def mismatching(tmp_path) -> Path:
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(other_machine(), 8))
    return path


# ---------------------------------------------------------------------------- check


def test_check_match_exit_0(matching, capsys):
    assert main(["check", str(matching)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "matches this machine" in out
    assert hardware.collect()["fingerprint"] in out


def test_check_mismatch_exit_3(mismatching, capsys):
    assert main(["check", str(mismatching)]) == 3
    out = capsys.readouterr().out
    assert "no profile matches this machine" in out
    assert "CPU model: Imaginary CPU 9000 -> " in out
    assert "GPUs: 1x NVIDIA H100 80GB HBM3 -> " in out
    assert "usable CPUs: " in out
    assert "Re-tune here with `autotune search examples/jpeg_folder.py:dataset`." in out


def test_check_exit_3_for_a_recipe_tuned_under_another_memory_limit(tmp_path, capsys):
    # Tuned in a job of 64 GiB, read here (no limit, or another): the limit alone makes it another machine.
    here = hardware.collect()
    tuned = dict(here, memory_limit_bytes=64 * 1024**3 if here.get("memory_limit_bytes") != 64 * 1024**3 else None)
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(tuned, 2))
    assert main(["check", str(path)]) == 3
    out = capsys.readouterr().out
    assert [line.strip() for line in out.splitlines() if "memory limit" in line] == [
        f"memory limit: 64.0 GiB -> {hardware._show_limit(hardware.identity(here))}"]


def test_check_missing_file_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "autotune.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert err.startswith("autotune: error: No recipe file at ")
    assert "autotune search" in err


@pytest.mark.parametrize("text", ["{broken", '{"format": "autotune-recipe", "version": 42, "profiles": {}}'])
def test_check_corrupt_or_future_exit_2_untouched(tmp_path, capsys, text):
    path = tmp_path / "autotune.json"
    path.write_text(text)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err
    assert path.read_text() == text


def test_check_empty_profiles_exit_2(tmp_path, capsys):
    path = tmp_path / "autotune.json"
    RecipeFile().write(path)
    assert main(["check", str(path)]) == 2
    assert "has no profiles" in capsys.readouterr().err


def test_check_default_path_is_autotune_json(tmp_path, monkeypatch, capsys, matching):
    monkeypatch.chdir(matching.parent)
    assert main(["check"]) == 0
    monkeypatch.chdir(tmp_path.parent)
    if not (tmp_path.parent / "autotune.json").exists():
        assert main(["check"]) == 2


# ---------------------------------------------------------------------------- show


def test_show_marks_this_machine_and_fits_100_columns(matching, capsys):
    assert main(["show", str(matching)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    here = hardware.collect()["fingerprint"]
    assert f"* {here}  <- this machine" in lines
    assert out.count("<- this machine") == 1
    assert lines[0].startswith("2 profiles (format version 2) in")
    for text in ["Imaginary CPU 9000", "1x NVIDIA H100 80GB HBM3", "examples/jpeg_folder.py:dataset",
                 "2000 samples", "batch 64", "num_workers=1,", "num_workers=8,",
                 "multiprocessing_context='forkserver'", "worker default, main default", "cache pickle",
                 "2.50 s per epoch vs 10.0 s for the default", "3.33x", "peak 3.0 GiB", "17 trials (2 failed)",
                 "seeded subset of 256 of 2000 samples, extrapolated"]:
        assert text in " ".join(out.split()), text


def test_show_sample_file(tmp_path, capsys):
    path = tmp_path / "autotune.json"
    shutil.copy(SAMPLE, path)
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    for text in ["Intel(R) Core(TM) i7-1185G7", "4x NVIDIA A100-SXM4-80GB", "torch 2.13 (CUDA 12.4)",
                 "measured on all 2000 samples", "allocator=jemalloc", "cache       none",
                 "cache       memory", "10.14x", "48 trials (3 failed)"]:
        assert text in out, text
    if hardware.collect()["fingerprint"] not in RecipeFile.read(path).profiles:
        assert "No profile matches this machine" in out


def test_show_default_profile_says_so(tmp_path, capsys):
    path = tmp_path / "autotune.json"
    p = make_profile(hardware.collect(), 0)
    p.config = LoaderConfig()
    p.measured = Measured.from_json({"is_default": True, "trials": 5, "subset": None})
    RecipeFile.merge_write(path, p)
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no candidate was measurably faster than the plain default" in out and "1.00x" not in out
    assert "1 profile (format version 2)" in out


def test_show_missing_and_corrupt_exit_2(tmp_path, capsys):
    assert main(["show", str(tmp_path / "nope.json")]) == 2
    assert "No recipe file at" in capsys.readouterr().err
    bad = tmp_path / "autotune.json"
    bad.write_text("[]")
    assert main(["show", str(bad)]) == 2
    assert "not an autotune recipe" in capsys.readouterr().err
    assert bad.read_text() == "[]"


def test_show_tells_the_validation_and_what_the_factory_taught(tmp_path, capsys):
    from autotune.recipe._factory_runs import FACTORY_NOTE, FactoryRun

    path = tmp_path / "autotune.json"
    p = make_profile(hardware.collect(), 1)
    run = FactoryRun(dataset="f00d", length=2000, batch_size=64, config=p.config, build_workers=2,
                     build_seconds=2.0, first_epoch_seconds=4.0, epoch_seconds=2.5)
    p.factory_runs = (run,)
    RecipeFile.merge_write(path, p)
    assert main(["show", str(path)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "factory 1 validated run(s) kept; the next search on this machine predicts from them" in said
    assert "validated" not in said.replace("validated run", "")

    p.measured = Measured.from_json({
        **p.measured.to_json(), "notes": [f"{FACTORY_NOTE}: the build from 1 (trials: 1.00 s, factory: 2.00 s); "
                                          "whole run 8.00 s -> 9.00 s"],
        "validation": {"predicted_total_seconds": 9.0, "measured_total_seconds": 9.9, "fresh_process": True,
                       "validated_at": "2026-11-30T01:02:03+00:00"}})
    RecipeFile.merge_write(path, p)
    assert main(["show", str(path)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert ("validated 9.90 s in all through the factory in a fresh process vs 9.00 s predicted (+10%), "
            "2026-11-30T01:02:03+00:00") in said
    assert ("factory 1 validated run(s) kept; figures learned from them: the build from 1 (trials: 1.00 s, "
            "factory: 2.00 s); whole run 8.00 s -> 9.00 s") in said
