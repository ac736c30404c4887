"""What a recipe sets on a whole process: the memory allocator and the CPU thread counts.

``_allocator`` finds the allocators this machine has and switches them on; ``_settings`` decides what
to apply where (at run time in the main process and each worker, or at start through the
environment for ``autotune run``). Below the search and the factory alike: a trial applies exactly
what the user's training process will.  See docs/architecture.md.
"""

from autotune.process._allocator import ALLOCATORS, availability
from autotune.process._settings import (
    PRELOAD_ALLOCATORS,
    Applied,
    ProcessSettings,
    apply_at_runtime,
    command_line,
    launch_env,
    users_threads,
    worker_init,
)

__all__ = [
    "ALLOCATORS",
    "PRELOAD_ALLOCATORS",
    "Applied",
    "ProcessSettings",
    "apply_at_runtime",
    "availability",
    "command_line",
    "launch_env",
    "users_threads",
    "worker_init",
]
