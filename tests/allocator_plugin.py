"""An allocator that exists only in the tests: glibc's malloc-debugging library (``libc_malloc_debug.so.0``,
glibc 2.34 and later), a real library made to be preloaded, that wraps glibc's malloc. It is registered here
and nowhere else: the proof that the list of allocators, ``LoaderConfig``'s check, the search's choices and
what is applied at start and at run time all come from the registered classes (tests/test_allocator_family.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from autotune import process


class MallocDebug(process.Preloaded):
    name = "malloc-debug"
    order = 90
    title = "glibc's malloc debugging (LD_PRELOAD)"
    libraries = ("libc_malloc_debug.so.0",)
    package = "libc6"


def registered() -> Iterator[None]:
    """The test-only allocator registered for the duration of a test (a fixture's body)."""
    process.register(MallocDebug)
    try:
        yield
    finally:
        process.unregister(MallocDebug.name)
