"""Recipe glue: autotune's own search, a Profile for any LoaderConfig, and a cell that runs a recipe."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune._api import Recipe, search_spec
from autotune.config import LoaderConfig
from autotune.loader import DeviceConsumer
from autotune.machine import _hardware as hardware
from autotune.recipe._file import Profile
from autotune.tuner._options import SearchOptions
from harness import SEED
from harness.child import Setup


def autotune_search(spec: Any, *, budget: float, workdir: Path, **options: Any) -> tuple[Recipe, Any, dict]:
    """Run autotune's own search in-process; return (recipe, outcome, timing) with the wall time."""
    opts = SearchOptions(budget=budget, workdir=workdir / ".autotune", progress=False, **options)
    workdir.mkdir(parents=True, exist_ok=True)  # the recipe's folder must exist before a search starts
    started_wall = time.time()
    t0 = time.perf_counter()
    recipe, outcome = search_spec(spec, opts, workdir / "autotune.json")
    wall = time.perf_counter() - t0
    return recipe, outcome, {"wall_s": wall, "started_epoch_s": started_wall, "budget_s": budget}


def search_record(recipe: Recipe, outcome: Any, timing: dict) -> dict[str, Any]:
    """What a result keeps of a search: its timing, the chosen config and the recipe's measured figures."""
    return {**timing, "config": recipe.config.to_json(), "describe": recipe.config.describe(),
            "trials": outcome.trials, "measured": recipe.measured.to_json()}


def profile_for(config: LoaderConfig, *, batch_size: int, epochs: int, source: str) -> Profile:
    """A recipe Profile for an arbitrary LoaderConfig (the oracle's point), so it runs through the same factory."""
    return Profile(hardware=hardware.collect(), dataset={"source": source},
                   settings={"batch_size": batch_size, "epochs": epochs}, config=config)


def recipe_setup(profile_dict: dict, dataset_fn: Callable[[], Any], files_fn: Callable[[Any], set[str]], *,
                 cache_dir: str, collate_fn: Callable | None = None,
                 consumer: Callable[[LoaderConfig], Callable[[Any], Any]] | None = None) -> Setup:
    """A cell that builds its loader with ``Recipe.dataloader`` (cache built on first use, timed).

    ``consumer(config)`` gives the consumer of each batch (default: autotune's own, a device copy).
    """
    profile = Profile.from_dict(profile_dict)
    dataset = dataset_fn()

    def prepare():
        recipe = Recipe(profile)
        kwargs: dict[str, Any] = {"shuffle": True, "generator": torch.Generator().manual_seed(SEED)}
        if collate_fn is not None:
            kwargs["collate_fn"] = collate_fn
        loader = recipe.dataloader(dataset, cache_dir=cache_dir, progress=False, **kwargs)
        consume = consumer(recipe.config) if consumer is not None else DeviceConsumer(recipe.config.pin_memory)
        return loader, consume

    from autotune.caches._disk_fill import close_all  # what the process's exit would do: a fill's commit

    return Setup(files=files_fn(dataset), prepare=prepare, finish=close_all,
                 info={"config": Recipe(profile).config.describe(), "allocator": profile.config.allocator})
