"""The factory: recipe settings, caller overrides, pass-through of the caller's batching, same samples."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from torch.utils.data import DataLoader
from workloads import Numbers, double

import autotune
from autotune.config import LoaderConfig
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile, RecipeFile
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings

pytestmark = pytest.mark.timeout(120)


def write_recipe(path, *, hw=None, config=None, batch_size=8, measured=None):
    profile = Profile(
        hardware=hw or hardware.collect(),
        dataset=DatasetRecord(source="tests/workloads.py:Numbers", length=40, fingerprint="x"),
        settings=RunSettings(batch_size=batch_size, epochs=2),
        config=config or LoaderConfig(num_workers=2, prefetch_factor=4, persistent_workers=True,
                                      multiprocessing_context="fork"),
        measured=Measured.from_json(measured),
    )
    RecipeFile.merge_write(path, profile)
    return path


def labels(loader) -> collections.Counter:
    return collections.Counter(int(i) for _, batch in loader for i in batch)


def test_recipe_settings_are_used(tmp_path):
    path = write_recipe(tmp_path / "autotune.json")
    loader = autotune.dataloader(Numbers(40), path)
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 4, True)
    assert loader.batch_size == 8
    assert loader.autotune.sources["num_workers"] == "recipe"


def test_overrides_win_and_say_so(tmp_path):
    path = write_recipe(tmp_path / "autotune.json")
    loader = autotune.dataloader(Numbers(40), path, num_workers=0)
    assert loader.num_workers == 0 and loader.persistent_workers is False
    assert loader.autotune.sources["num_workers"] == "caller"
    assert loader.autotune.sources["prefetch_factor"] == "not used without workers"
    loader = autotune.load(path).dataloader(Numbers(40), prefetch_factor=2)
    assert (loader.num_workers, loader.prefetch_factor) == (2, 2)


def test_something_that_is_not_a_dataset_is_one_clear_error(tmp_path):
    """The bundled examples name a function that makes the dataset: passing the function itself was a
    TypeError from inside the determinism check."""
    from autotune.errors import DatasetError

    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(cache="memory"))
    with pytest.raises(DatasetError) as err:
        autotune.dataloader(Numbers, path)
    assert str(err.value) == (
        "autotune.dataloader got a type, not a dataset (a function that makes one? call it): it needs "
        "__getitem__(int) and __len__() (map-style), or to be a torch.utils.data.IterableDataset.")
    with pytest.raises(DatasetError, match="got a int, not a dataset: it needs"):
        autotune.dataloader(3, path)
    assert len(autotune.dataloader(Numbers(0), path, cache=None)) == 0  # an empty val set is still a dataset


def test_worker_only_override_without_workers_is_an_error(tmp_path):
    path = write_recipe(tmp_path / "autotune.json")
    with pytest.raises(autotune.AutotuneError, match="prefetch_factor needs num_workers > 0"):
        autotune.dataloader(Numbers(40), path, num_workers=0, prefetch_factor=4)


def test_callers_batching_passes_through(tmp_path):
    path = write_recipe(tmp_path / "autotune.json")

    sampler = torch.utils.data.SequentialSampler(range(40))
    loader = autotune.dataloader(Numbers(40), path, collate_fn=list, sampler=sampler, drop_last=True, batch_size=16)
    assert loader.collate_fn is list and loader.sampler is sampler and loader.drop_last
    assert loader.batch_size == 16
    batches = list(loader)
    assert len(batches) == 2 and all(len(b) == 16 for b in batches)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_same_samples_as_a_plain_dataloader_every_epoch(tmp_path, context):
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(
        num_workers=2, prefetch_factor=2, persistent_workers=True, multiprocessing_context=context))
    dataset = Numbers(37)
    tuned = autotune.dataloader(dataset, path, shuffle=True)
    plain = DataLoader(dataset, batch_size=8, shuffle=True)
    for _ in range(2):
        assert labels(tuned) == labels(plain) == collections.Counter(range(37))


def test_transform_applies_after_the_source(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig())
    loader = autotune.dataloader(Numbers(8), path, transform=double)
    tensors = torch.cat([t for t, _ in loader])
    assert torch.equal(tensors[:, 0], torch.arange(8, dtype=torch.float32) * 2)


def test_missing_transform_is_warned(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(), measured={"has_transform": True})
    with pytest.warns(UserWarning, match="tuned with a per-sample transform"):
        autotune.dataloader(Numbers(8), path)


def test_other_batch_size_is_warned(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig())
    with pytest.warns(UserWarning, match="tuned for batch_size=8, but batch_size=3"):
        autotune.dataloader(Numbers(8), path, batch_size=3)


def test_main_threads_are_applied_and_reported(tmp_path):
    # a recipe that measured a gain: only then does the factory change the process (tests/test_good_guest.py)
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(main_threads=1),
                        measured={"total_seconds": 1.0, "default_total_seconds": 2.0})
    before = torch.get_num_threads()
    import os
    import subprocess
    import sys

    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True, env=dict(os.environ))
    torch.set_num_threads(int(fresh.stdout))  # torch's default: an earlier test in this worker may have left 1
    try:
        loader = autotune.dataloader(Numbers(8), path)
        assert torch.get_num_threads() == 1
        assert any("torch.set_num_threads(1)" in line for line in loader.autotune.applied)
    finally:
        torch.set_num_threads(before)


def test_process_settings_can_be_left_alone(tmp_path):
    path = write_recipe(tmp_path / "autotune.json", config=LoaderConfig(main_threads=1))
    before = torch.get_num_threads()
    loader = autotune.dataloader(Numbers(8), path, apply_process_settings=False)
    assert torch.get_num_threads() == before and loader.autotune.applied == []


def test_recipe_from_other_hardware_warns_and_is_used(tmp_path):
    other = dict(hardware.collect(), cpu_model="Some Other CPU", usable_cpus=64)
    path = write_recipe(tmp_path / "autotune.json", hw=other)
    with pytest.warns(autotune.RecipeMismatchWarning, match="usable CPUs: 64 -> "):
        recipe = autotune.load(path)
    assert not recipe.matches_this_machine and recipe.config.num_workers == 2
    with pytest.raises(autotune.HardwareMismatch, match="Re-tune here with"):
        autotune.load(path, on_mismatch="error")


def test_matching_recipe_does_not_warn(tmp_path):
    path = write_recipe(tmp_path / "autotune.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert autotune.load(path).matches_this_machine


@pytest.mark.timeout(240)
def test_on_mismatch_search_tunes_here_and_keeps_the_other_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    other = dict(hardware.collect(), cpu_model="Some Other CPU", usable_cpus=64)
    path = write_recipe(tmp_path / "autotune.json", hw=other)
    recipe = autotune.load(path, on_mismatch="search", dataset=Numbers(16), budget="15s")
    assert recipe.matches_this_machine
    profiles = RecipeFile.read(path).profiles
    assert set(profiles) == {hardware.fingerprint(other), hardware.collect()["fingerprint"]}
    assert profiles[hardware.collect()["fingerprint"]].settings == RunSettings(batch_size=8, epochs=2)
