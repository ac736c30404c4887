"""The few exceptions autotune raises on purpose.

Each carries a one-line message that names the problem and the fix; the CLI prints it
without a traceback and exits with ``exit_code``.
"""


class AutotuneError(Exception):
    """Bad input from the user: a dataset file, a flag, a recipe file."""

    exit_code = 2


class DatasetError(AutotuneError):
    """The user's dataset cannot be imported, resolved or read."""


class RecipeError(AutotuneError):
    """A recipe file is corrupt, of an unknown version, or has no usable profile."""


class HardwareMismatch(RecipeError):
    """No profile in the recipe file was tuned on this machine."""

    exit_code = 3


class MeasurementError(AutotuneError):
    """A stored trial result (an Optuna study's attributes) is not one this version can read."""
