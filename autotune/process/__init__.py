"""What a recipe sets on a whole process: the memory allocator and the CPU thread counts.

``_family`` holds the allocators, a family of classes (``Allocator``; ``register`` adds one), each knowing
whether this machine has it and how it is switched on; ``_allocator`` is the means (finding a preload
library, mallopt); ``_settings`` decides what to apply where (at run time in the main process and each
worker, or at start through the environment for ``autotune run``). Below the search and the factory alike:
a trial applies exactly what the user's training process will.  See docs/architecture.md.
"""

from autotune.process._allocator import mapped_paths
from autotune.process._family import DEFAULT as DEFAULT_ALLOCATOR
from autotune.process._family import Allocator, Mallopt, Preloaded, availability, register, unregister
from autotune.process._family import get as get_allocator
from autotune.process._family import names as allocator_names
from autotune.process._family import searched_names as searched_allocators
from autotune.process._settings import (
    Applied,
    ProcessSettings,
    apply_at_runtime,
    command_line,
    launch_env,
    users_threads,
    worker_init,
)

__all__ = [
    "DEFAULT_ALLOCATOR",
    "Allocator",
    "Applied",
    "Mallopt",
    "Preloaded",
    "ProcessSettings",
    "allocator_names",
    "apply_at_runtime",
    "availability",
    "command_line",
    "get_allocator",
    "launch_env",
    "mapped_paths",
    "register",
    "searched_allocators",
    "unregister",
    "users_threads",
    "worker_init",
]
