"""autotune: find the fastest PyTorch DataLoader recipe for a dataset on the machine it runs on.

    recipe = autotune.search(dataset, batch_size=64, epochs=10, budget="2m")
    loader = recipe.dataloader(dataset)
    loader = autotune.dataloader(dataset, "autotune.json")
"""

from autotune._api import Recipe, dataloader, load, search
from autotune.errors import AutotuneError, DatasetError, HardwareMismatch, RecipeError
from autotune.recipe._file import RecipeMismatchWarning

__version__ = "0.1.0"

__all__ = [
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
