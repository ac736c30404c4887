"""The C library's malloc and the means to switch allocators: finding a preload library, ``mallopt``,
reading which libraries this process has mapped.

torch allocates tensors with ``posix_memalign``; its alignment slack leaves a freed block a little
too small for the next request of the same size, so with raised thresholds the reuse settles only
after the heap has grown a few blocks' worth (a handful of batches), then no batch faults again.
With glibc's defaults every block of 32 MB or more is mmapped and unmapped, so every batch faults.

The allocators themselves (which exist, what each needs and does) are the classes of
:mod:`autotune.process._family`; :mod:`autotune.process._settings` decides what to apply where.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import subprocess

# mallopt(3) parameter numbers from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

DEFAULT_MMAP_THRESHOLD = 1 << 30  # 1 GiB: any batch below this comes from the heap, not mmap
DEFAULT_TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of freed heap top instead of returning it

# glibc reads these at start (they are aliases of the glibc.malloc.* tunables).
ENV_MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
ENV_TRIM_THRESHOLD = "MALLOC_TRIM_THRESHOLD_"

# Setting this (os.pathsep-separated folders) makes find_library look only there: for machines
# with libraries in odd places, and for tests that need a library to be absent.
ENV_LIBRARY_PATH = "AUTOTUNE_LIBRARY_PATH"

_LIBRARY_DIRS = (
    "/usr/local/lib",
    "/usr/lib",
    "/lib",
    "/usr/lib64",
    "/lib64",
)


def _multiarch_dirs() -> list[str]:
    machine = platform.machine()
    triples = {
        "x86_64": "x86_64-linux-gnu",
        "aarch64": "aarch64-linux-gnu",
        "ppc64le": "powerpc64le-linux-gnu",
        "s390x": "s390x-linux-gnu",
    }
    triple = triples.get(machine)
    if triple is None:
        return []
    return [f"/usr/lib/{triple}", f"/lib/{triple}", f"/usr/local/lib/{triple}"]


@functools.lru_cache(maxsize=1)
def _ldconfig_cache() -> dict[str, str]:
    """File name -> path from ``ldconfig -p``, for this machine's word size; empty if unavailable."""
    found: dict[str, str] = {}
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run(
                [exe, "-p"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        want_64 = ctypes.sizeof(ctypes.c_void_p) == 8
        for line in out.splitlines():
            # "\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2"
            m = re.match(r"\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", line)
            if not m:
                continue
            name, flags, path = m.groups()
            is_64 = "64" in flags
            if is_64 == want_64 and name not in found:
                found[name] = path
        if found:
            break
    return found


def library_dirs() -> list[str]:
    """The folders find_library looks in, in order (without the ldconfig cache)."""
    override = os.environ.get(ENV_LIBRARY_PATH)
    if override is not None:
        return [d for d in override.split(os.pathsep) if d]
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    dirs += _multiarch_dirs() + list(_LIBRARY_DIRS)
    return list(dict.fromkeys(dirs))


def find_library(filenames: tuple[str, ...]) -> str | None:
    """The path of the first of ``filenames`` (preferred first) found here, or None.

    Looks in ``ldconfig -p`` and then in the usual library folders (with the multiarch ones);
    with ``AUTOTUNE_LIBRARY_PATH`` set, only in the folders it names.
    """
    use_cache = ENV_LIBRARY_PATH not in os.environ
    dirs = library_dirs()
    for filename in filenames:  # the preferred file first, wherever it is
        if use_cache:
            path = _ldconfig_cache().get(filename)
            if path and os.path.exists(path):
                return path
        for d in dirs:
            path = os.path.join(d, filename)
            if os.path.isfile(path):
                return path
    return None


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:  # pragma: no cover - every POSIX Python can do this
        return None


def is_glibc() -> bool:
    """True where the C library is glibc and has ``mallopt``."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = _libc()
    return libc is not None and hasattr(libc, "mallopt")


def not_glibc() -> str | None:
    """None where glibc's mallopt can be used, else why not (for an allocator that needs it)."""
    if is_glibc():
        return None
    return f"not available: needs glibc's mallopt, but this C library is {platform.libc_ver()[0] or 'unknown'}"


def apply_mallopt(
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD,
    trim_threshold: int = DEFAULT_TRIM_THRESHOLD,
    top_pad: int | None = None,
) -> bool:
    """Raise glibc's mmap and trim thresholds in this process; True when glibc accepted them all.

    False (and nothing changed) where the C library is not glibc. Setting either threshold also
    turns off glibc's dynamic threshold adjustment, as mallopt(3) documents.
    """
    if not is_glibc():
        return False
    libc = _libc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    params = [(M_MMAP_THRESHOLD, mmap_threshold), (M_TRIM_THRESHOLD, trim_threshold)]
    if top_pad is not None:
        params.append((M_TOP_PAD, top_pad))
    ok = True
    for param, value in params:
        if not 0 <= value < 1 << 31:
            raise ValueError(f"mallopt values must be in [0, 2 GiB), but got {value}")
        ok = mallopt(param, value) == 1 and ok
    return ok


def mapped_paths(maps_path: str = "/proc/self/maps") -> set[str]:
    """The files this process has mapped (its shared libraries among them); empty where unreadable."""
    paths = set()
    try:
        with open(maps_path) as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    paths.add(parts[5].strip())
    except OSError:
        pass
    return paths


def format_size(n: int) -> str:
    """1073741824 -> "1 GiB"; for the human-readable notes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
