"""autotune: find the fastest PyTorch DataLoader recipe for a dataset on the machine it runs on.

    recipe = autotune.search(dataset, batch_size=64, epochs=10, budget="2m")
    loader = recipe.dataloader(dataset)
    loader = autotune.dataloader(dataset, "autotune.json")
    loader = autotune.dataloader(dataset, "autotune.json", adapt=True)  # an AdaptiveLoader

``import autotune`` is light: the public API is imported on first use, and the search's own
dependencies (Optuna) only when a search runs, so a training process that only builds loaders never
imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError, DatasetError, HardwareMismatch, RecipeError

__version__ = "0.1.0"

if TYPE_CHECKING:  # the names below, for type checkers; at run time they come from __getattr__
    from autotune._api import Recipe, dataloader, load, search
    from autotune.recipe._adaptive import AdaptiveLoader
    from autotune.recipe._file import RecipeMismatchWarning

_LAZY = {
    "AdaptiveLoader": "autotune.recipe._adaptive",
    "Recipe": "autotune._api",
    "dataloader": "autotune._api",
    "load": "autotune._api",
    "search": "autotune._api",
    "RecipeMismatchWarning": "autotune.recipe._file",
}

__all__ = [
    "AdaptiveLoader",
    "AutotuneError",
    "DatasetError",
    "HardwareMismatch",
    "Recipe",
    "RecipeError",
    "RecipeMismatchWarning",
    "dataloader",
    "load",
    "search",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
