"""Cold means cold (docs/architecture.md §3): find the files a dataset reads, drop them from the page cache, check it.

- ``record_files(fn)`` runs ``fn`` and returns the regular files it opened for reading, seen through
  ``sys.addaudithook`` "open" events.  Audit hooks cannot be removed, so one hook is installed once,
  at the first recording, and it returns at once unless the current context is recording.
- ``files_under(folder)`` is the ``--data-dir`` way: every regular file below a folder.
- ``dataset_files(dataset, indices)`` finds the files behind a set of indices cheaply (see there).
- ``evict(paths)`` calls ``posix_fadvise(POSIX_FADV_DONTNEED)`` on each file (no root needed) and
  checks with ``mincore`` how much stayed resident.  The source is opened read-only and never written:
  no ``fdatasync``, so dirty pages of a file still being written simply stay, and the report says so.
- ``fits_page_cache(total_bytes)``: whether the data can stay cached between epochs at all; when it
  cannot, every epoch is cold.

What the hook cannot see: files opened by native code that bypasses Python's ``open`` (h5py, lmdb,
``cv2.imread``) and files opened in other processes.  Use ``--data-dir`` (``files_under``) for those.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
import mmap
import os
import stat
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from autotune.errors import AutotuneError
from autotune.machine._memory_limit import JobMemory, job_memory

__all__ = [
    "EvictionReport",
    "dataset_files",
    "evict",
    "files_under",
    "fits_page_cache",
    "record_files",
    "resident_fraction",
]

# After eviction at most this share of the bytes may still be resident for the cold figure to count.
EFFECTIVE_MAX_RESIDENT = 0.05

# ------------------------------------------------------------------------------------------ recording

class Sink(Protocol):
    """Where "open" events go while recording: a set of paths, or anything with ``add(path)``."""

    def add(self, path: str, /) -> None: ...


# The sinks that "open" events go to in this context; None (the default) means not recording.
_recording: contextvars.ContextVar[tuple[Sink, ...] | None] = contextvars.ContextVar(
    "autotune_evict_recording", default=None
)
# Sinks recording now in this process, by id: what threads without a recording of their own open goes to them
# too (a read that opens its files from a thread pool, or on a library's IO thread, opens them in a thread
# that never entered ``recording``). The pid: a forked child's copy is not its own.
_everywhere: dict[int, tuple[int, Sink]] = {}
_hook_lock = threading.Lock()
_hook_installed = False

_SKIP_PREFIXES = ("/proc/", "/sys/", "/dev/")
_WRITE_MODE = frozenset("wax")


def _library_roots() -> tuple[str, ...]:
    """Folders whose files are Python itself or installed packages, never a dataset's data."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    return tuple(sorted(r.rstrip("/") + "/" for r in roots))


_LIBRARY_ROOTS = _library_roots()


def _reads(mode: Any, flags: Any) -> bool:
    """Whether an "open" event opened for reading: a mode string ('r', 'rb', 'r+'), or os.open flags."""
    if isinstance(mode, str):
        return "r" in mode or "+" in mode or not (_WRITE_MODE & set(mode))
    if isinstance(flags, int):
        return flags & os.O_ACCMODE in (os.O_RDONLY, os.O_RDWR)
    return True


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "open":
        return
    sinks = _recording.get()
    if not sinks:
        if not _everywhere:
            return
        pid = os.getpid()
        sinks = tuple(sink for owner, sink in list(_everywhere.values()) if owner == pid)
        if not sinks:
            return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if path is None or isinstance(path, int) or not _reads(mode, flags):
        return
    try:
        text = os.fsdecode(path)
        for sink in sinks:
            sink.add(os.path.abspath(text))  # relative to the cwd now; resolved after the run
    except Exception:  # noqa: BLE001 - an audit hook must never make the user's open() fail
        pass


def _install_hook() -> None:
    global _hook_installed
    with _hook_lock:
        if not _hook_installed:
            sys.addaudithook(_hook)
            _hook_installed = True


def _keep(path: str, module_files: set[str]) -> str | None:
    """The resolved path when it is a regular data file worth evicting, else None."""
    try:
        real = os.path.realpath(path)
        if real.startswith(_SKIP_PREFIXES) or real in module_files:
            return None
        if real.startswith(_LIBRARY_ROOTS) or "/site-packages/" in real or "/dist-packages/" in real:
            return None
        if "/__pycache__/" in real:
            return None
        return real if stat.S_ISREG(os.stat(real).st_mode) else None
    except (OSError, ValueError):
        return None


_modules_seen: tuple[int, set[str]] = (-1, set())


def _module_files() -> set[str]:
    """Files of imported modules: an import inside ``__getitem__`` opens them, but they are code. Resolved
    once per set of imported modules (a process holds ~1,600 of them: resolving them all on every recorded
    read cost ~1 s per read on a loaded machine); modules are only ever added, so their count tells."""
    global _modules_seen
    count, files = _modules_seen
    if count == len(sys.modules):
        return files
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            files.add(os.path.realpath(path))
    _modules_seen = (len(sys.modules), files)
    return files


@contextlib.contextmanager
def recording(sink: Sink) -> Iterator[None]:
    """Every path opened for reading in this context (thread, task), and in every thread of this process
    that records nothing itself (the block's reads may open their files from threads they start), goes to
    ``sink.add`` until the block ends, as it was passed to ``open`` made absolute (not resolved: a symbolic
    link retargeted later must read as another file). Nothing is filtered: ``data_file`` tells the data
    files. Another thread's unrelated reads meanwhile are recorded too: a source too many makes a cache
    rebuilt needlessly, one too few serves stale samples."""
    _install_hook()
    token = _recording.set((_recording.get() or ()) + (sink,))
    key = id(token)
    _everywhere[key] = (os.getpid(), sink)
    try:
        yield
    finally:
        _everywhere.pop(key, None)
        _recording.reset(token)


def data_file(path: str, module_files: set[str]) -> str | None:
    """The resolved path when ``path`` is a regular file that is data (not code, a library, /proc...)."""
    return _keep(path, module_files)


def module_files() -> set[str]:
    """Files of imported modules (code, never data)."""
    return _module_files()


def record_files(fn: Callable[[], Any]) -> tuple[Any, set[str]]:
    """Run ``fn()`` and return its result and the regular files it opened for reading, resolved.

    Only opens made through Python (``open``, ``io.open``, ``os.open``, and libraries built on them,
    such as Pillow and numpy) in this thread or context, or in a thread of this process that records
    nothing itself (``recording``), are seen.  Directories, /proc, /sys, /dev,
    the standard library, installed packages and imported module files are left out.
    """
    seen: set[str] = set()
    with recording(seen):  # the threads ``fn`` starts too: a read on a pool's thread is no less a read
        result = fn()
    if not seen:
        return result, set()
    modules = _module_files()
    files = {kept for kept in (_keep(p, modules) for p in seen) if kept is not None}
    return result, files


def files_under(folder: str | os.PathLike[str]) -> set[str]:
    """Every regular file below ``folder`` (symbolic links followed to their files), resolved."""
    root = os.fspath(folder)
    if not os.path.isdir(root):
        raise AutotuneError(f"--data-dir must be an existing folder, but got {root!r}.")
    found = set()
    for base, _dirs, names in os.walk(root):
        for name in names:
            real = os.path.realpath(os.path.join(base, name))
            try:
                if stat.S_ISREG(os.stat(real).st_mode):
                    found.add(real)
            except OSError:
                continue
    return found


def _path_lists(obj: Any, length: int, depth: int = 2) -> Iterable[list[Any] | tuple[Any, ...]]:
    """Lists or tuples of ``length`` items among ``obj``'s attributes (and those of wrapped datasets)."""
    try:
        items = vars(obj)
    except TypeError:
        return
    for value in items.values():
        if isinstance(value, (list, tuple)) and len(value) == length:
            yield value
        elif depth > 1 and hasattr(value, "__getitem__") and hasattr(value, "__len__") and not isinstance(
                value, (str, bytes, list, tuple, dict)):
            yield from _path_lists(value, length, depth - 1)


def _as_path(value: Any) -> str | None:
    if isinstance(value, (tuple, list)) and value:
        value = value[0]  # (path, label) pairs, as torchvision's ImageFolder keeps them
    if isinstance(value, (str, bytes, os.PathLike)):
        try:
            return os.path.realpath(os.fsdecode(os.fspath(value)))
        except (TypeError, ValueError):
            return None
    return None


def dataset_files(dataset: Any, indices: Iterable[int], *, probe: int = 8) -> tuple[set[str], str]:
    """The files ``dataset[i]`` reads for ``i`` in ``indices``, and how they were found.

    Cheapest first, each checked against what a few recorded reads really opened:

    1. "shared": every probed sample opened the same files (one HDF5, LMDB, npy or tar file);
    2. "path list": an attribute of the dataset is a list with one path per index (``self.paths``,
       ``self.samples`` of ``(path, label)``), and the probed reads opened exactly that index's file;
    3. "recorded": otherwise every index in ``indices`` is read once in this process, recording.

    When the probed reads open no file at all, nothing more is read and the set is empty.
    """
    indices = list(indices)
    probed = indices[:: max(1, len(indices) // probe)][:probe] if indices else []
    per_read: list[tuple[int, set[str]]] = []
    for i in probed:
        per_read.append((i, record_files(functools.partial(dataset.__getitem__, i))[1]))
    if not per_read:
        return set(), "no indices"
    first = per_read[0][1]
    if not any(files for _, files in per_read):
        return set(), "none opened (generated data, or files read by native code: pass --data-dir)"
    if len(per_read) > 1 and first and all(files == first for _, files in per_read):
        return set(first), "shared"
    try:
        length = len(dataset)
    except TypeError:
        length = -1
    for candidates in _path_lists(dataset, length):
        if all(files == {_as_path(candidates[i])} for i, files in per_read):
            found = {_as_path(candidates[i]) for i in indices}
            return {p for p in found if p is not None}, "path list"
    files: set[str] = set()
    for i in indices:
        files |= record_files(functools.partial(dataset.__getitem__, i))[1]
    return files, "recorded"


# ------------------------------------------------------------------------------------------ residency

_libc: Any = None
_PAGE = mmap.PAGESIZE
_WINDOW = 1 << 30  # map and check large files 1 GiB at a time


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.mmap.restype = ctypes.c_void_p
            lib.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_long)
            lib.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
            lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
            _libc = lib
        except (OSError, AttributeError, TypeError):
            _libc = False
    return _libc


def _resident_pages(fd: int, size: int) -> int | None:
    libc = _load_libc()
    if not libc:
        return None
    failed = ctypes.c_void_p(-1).value
    resident = 0
    for offset in range(0, size, _WINDOW):
        length = min(_WINDOW, size - offset)
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr is None or addr == failed:
            return None
        try:
            pages = -(-length // _PAGE)
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), length, vec) != 0:
                return None
            resident += sum(b & 1 for b in bytes(vec))
        finally:
            libc.munmap(ctypes.c_void_p(addr), length)
    return resident


def resident_fraction(path: str | os.PathLike[str]) -> float | None:
    """The share of ``path``'s pages in the page cache now (0.0 to 1.0), read with ``mincore``.

    Mapping a file and asking ``mincore`` reads nothing from it.  None where the OS has no mincore or
    the file cannot be mapped; 1.0 for an empty file (nothing to read from disk).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 1.0
        pages = _resident_pages(fd, size)
        return None if pages is None else pages / -(-size // _PAGE)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------ eviction


@dataclass(frozen=True)
class EvictionReport:
    """What an eviction did: how many files and bytes, resident share (byte-weighted) before and after."""

    files: int
    bytes: int
    resident_before: float | None
    resident_after: float | None
    effective: bool
    note: str
    failed: tuple[str, ...] = ()  # "path: reason", at most a few

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        def pct(x: float | None) -> str:
            return "unknown" if x is None else f"{100 * x:.0f}%"

        head = (f"evicted {self.files} file(s), {self.bytes / (1 << 20):.1f} MiB: resident {pct(self.resident_before)}"
                f" before, {pct(self.resident_after)} after")
        return f"{head} ({self.note})" if self.note else head


def _weighted(pairs: list[tuple[int, float | None]]) -> float | None:
    known = [(size, frac) for size, frac in pairs if frac is not None]
    total = sum(size for size, _ in known)
    if not known:
        return None
    if total == 0:
        return 0.0
    return sum(size * frac for size, frac in known) / total


def evict(paths: Iterable[str | os.PathLike[str]]) -> EvictionReport:
    """Drop ``paths`` from the page cache with ``posix_fadvise(POSIX_FADV_DONTNEED)`` and check it."""
    paths = sorted({os.fspath(p) for p in paths})
    advise = getattr(os, "posix_fadvise", None)
    dontneed = getattr(os, "POSIX_FADV_DONTNEED", None)
    before: list[tuple[int, float | None]] = []
    after: list[tuple[int, float | None]] = []
    failed: list[str] = []
    total = 0
    done = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror}")
            continue
        try:
            size = os.fstat(fd).st_size
            total += size
            before.append((size, _fraction_fd(fd, size)))
            if advise is not None and dontneed is not None:
                advise(fd, 0, 0, dontneed)
            after.append((size, _fraction_fd(fd, size)))
            done += 1
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror}")
        finally:
            os.close(fd)
    resident_before, resident_after = _weighted(before), _weighted(after)
    notes = []
    if advise is None or dontneed is None:
        effective = False
        notes.append("posix_fadvise not available on this OS: cold figures are warm")
    elif resident_after is None:
        effective = done > 0 and not failed
        notes.append("mincore not available: eviction done but not verified")
    else:
        effective = done > 0 and not failed and resident_after <= EFFECTIVE_MAX_RESIDENT
        if resident_after > EFFECTIVE_MAX_RESIDENT:
            notes.append(f"{100 * resident_after:.0f}% of pages still resident after eviction "
                         "(dirty pages not yet written back, locked or mapped by a process)")
    if failed:
        notes.append(f"{len(failed)} file(s) could not be evicted, e.g. {failed[0]}")
    if not paths:
        effective = False
        notes.append("no files to evict: the dataset's files were not found (pass --data-dir)")
    return EvictionReport(files=done, bytes=total, resident_before=resident_before, resident_after=resident_after,
                          effective=effective, note="; ".join(notes), failed=tuple(failed[:5]))


def _fraction_fd(fd: int, size: int) -> float | None:
    if size == 0:
        return 1.0
    pages = _resident_pages(fd, size)
    return None if pages is None else pages / -(-size // _PAGE)


def fits_page_cache(total_bytes: int, *, available: int | None = None, reserve: int | None = None,
                    memory: JobMemory | None = None) -> bool:
    """Whether ``total_bytes`` of data can stay in the page cache from one epoch to the next.

    The page cache is charged to the job's cgroup, so what can stay is what fits in the job, not in the
    host (``machine._memory_limit``). ``available`` is the memory the job could take now (the host's
    "available", or less under a limit: free plus reclaimable cache, which counts the data's own cached
    pages). ``reserve`` is kept for the training process, its workers and everything else: a fifth of
    what the job may hold, at least 1 GiB or a quarter of it, whichever is less.
    """
    if available is None or reserve is None:
        memory = memory or job_memory()
        if available is None:
            available = memory.available
        if reserve is None:
            reserve = max(min(1 << 30, memory.total // 4), memory.total // 5)
    return total_bytes <= available - reserve


@dataclass(frozen=True)
class SourceFiles:
    """The files a measured subset reads, how they were found, and what the whole dataset's weigh."""

    files: tuple[str, ...]
    how: str
    total_bytes: int  # estimated for the whole dataset

    @property
    def cold_every_epoch(self) -> bool:
        """Data larger than the page cache is read from storage every epoch, not only the first."""
        return bool(self.files) and not fits_page_cache(self.total_bytes)


def source_files(dataset: Any, indices: list[int], length: int, data_dir: str | os.PathLike[str] | None = None
                 ) -> SourceFiles:
    """What to evict before a cold measurement of ``indices``: ``--data-dir``'s files, else those
    ``dataset[i]`` opens; with the whole dataset's size scaled from the subset's."""
    if data_dir is not None:
        files = files_under(data_dir)
        return SourceFiles(tuple(sorted(files)), "--data-dir", _size(files))
    arrow = arrow_files(dataset)
    if arrow:  # memory-mapped, not opened per sample: no read would reveal them
        return SourceFiles(tuple(sorted(arrow)), "Arrow files (Dataset.cache_files)", _size(arrow))
    files, how = dataset_files(dataset, indices)
    size = _size(files)
    total = size if how == "shared" else int(size * length / max(1, len(indices)))
    return SourceFiles(tuple(sorted(files)), how, total)


def arrow_files(obj: Any, depth: int = 2) -> set[str]:
    """The Arrow files a Hugging Face ``datasets.Dataset`` memory-maps (its ``cache_files``), found on the
    dataset or on a dataset it wraps; empty for one held in memory."""
    found: set[str] = set()
    entries = getattr(obj, "cache_files", None) if type(obj).__module__.startswith("datasets.") else None
    if isinstance(entries, list):
        for entry in entries:
            name = entry.get("filename") if isinstance(entry, dict) else None
            if isinstance(name, str) and os.path.isfile(name):
                found.add(os.path.realpath(name))
        return found
    if depth > 1:
        try:
            values = list(vars(obj).values())
        except TypeError:
            return found
        for value in values:
            if type(value).__module__.startswith("datasets."):
                found |= arrow_files(value, depth - 1)
    return found


def _size(files: Iterable[str]) -> int:
    total = 0
    for path in files:
        try:
            total += os.path.getsize(path)
        except OSError:
            continue
    return total
