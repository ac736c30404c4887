"""What a disk cache's samples were made from: recorded while they are read, checked at every open.

The invariant: a disk cache is opened only when every source file its samples were read from still
has the size, mtime_ns, ctime_ns and inode it had when it was opened for that read. "Every source
file" is the union of

- each file a read opened through Python (``open``, ``os.open``, numpy, Pillow; the audit hook of
  ``machine._evict``), in its thread or any thread it started (a pool reading a sample's files), stated
  at the moment of the open, before a byte of it is read, and kept under
  the path as it was opened, so a symbolic link retargeted later reads as another file;
- each regular file a reading process holds open read-only, or maps without write access, at a chunk
  boundary (native readers that bypass Python: an ``h5py.File`` or an LMDB environment opened in
  ``__init__``, a numpy memmap, an Arrow table). Files open before the build are stated before it
  starts; one opened natively inside a read is stated right after it, which leaves a window of one
  read in which an edit goes unseen;
- each regular file a string or path attribute of the dataset (or of a dataset it wraps) names, and
  every file under a folder one names, stated before the first read: what native code opens and
  closes inside every read reads (``with h5py.File(self.path)``, ``h5py.File(f"{self.root}/{i}.h5")``),
  which neither of the above sees;
- every file under ``data_dir`` when the caller names one (files read by native code that opens and
  closes them within one call under a folder, ``cv2.imread(f"{root}/{name}")``, are seen no other way).

Code (imported modules, the standard library, installed packages), /proc, /sys, /dev and autotune's
own cache folders are not sources. The record is a file of the cache, ``sources.bin``, whose digest
the manifest holds, so neither can be changed without the other. Opening checks every entry with one
``stat`` each (threads for large records: ``stat`` releases the GIL).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat as _stat
import struct
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from autotune.caches._key import _datasets
from autotune.caches._own import is_own
from autotune.machine import _evict

log = logging.getLogger("autotune")

FILE_NAME = "sources.bin"
_MAGIC = b"autotune-sources\x001\n"
_HEADER = struct.Struct("<QQ")  # entries, compressed bytes of the paths
_PARALLEL = 4096  # entries from which the open's stats run on threads
_THREADS = 8
TREE_FILES = 200_000  # entries of a folder the dataset names walked into its record (``Sources.add_named``)
_SYSTEM = ("/proc/", "/sys/", "/dev/", "/usr/lib/", "/usr/share/", "/lib/", "/lib64/", "/etc/", "/run/")

Stat = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def stat_of(path: str) -> Stat | None:
    """What a source file is checked against, following symbolic links; None when it is not a file."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not _stat.S_ISREG(st.st_mode):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


class Sources:
    """Source files by the path they were opened with, each stated when first seen.

    Its ``add`` is the audit hook's sink (``machine._evict.recording``), so it must never raise."""

    def __init__(self, exclude: Iterable[str | os.PathLike[str]] = ()):
        self.seen: dict[str, Stat | None] = {}
        self._new: list[tuple[str, Stat | None]] = []  # seen since the last ``take_new``
        self._exclude = tuple(os.path.realpath(os.fspath(p)).rstrip(os.sep) + os.sep for p in exclude)
        self._fds: dict[int, str] = {}
        self._scans = 0
        self.trees: dict[str, dict[str, Stat]] = {}  # a folder the dataset names -> its files, stated before the reads
        self.named: set[str] = set()  # files the dataset's attributes name: in the record, but no sign of a read

    def __len__(self) -> int:
        return len(self.seen)

    def add(self, path: str, /) -> None:
        if path not in self.seen:
            st = self.seen[path] = stat_of(path)
            self._new.append((path, st))

    def take_new(self) -> list[tuple[str, Stat | None]]:
        """The entries seen since the last call (what a worker sends on, without copying the whole record)."""
        new, self._new = self._new, []
        return new

    def add_named(self, dataset: Any) -> None:
        """Add the regular files the dataset's string or path attributes name (and those of the datasets it
        wraps), and state every file under a folder one names (up to ``TREE_FILES``), all before the first
        read. A folder's files are sources only where the reads opened none of its files that the record saw
        (``kept``): then its reads were invisible, a native reader opening and closing a name it joins to the
        folder inside each read (``h5py.File(f"{self.root}/{i}.h5")``, ``cv2.imread``), so the whole folder
        stands for them; a folder of more files is left to ``data_dir=``."""
        for d in _datasets(dataset):
            try:
                values = list(vars(d).values())
            except TypeError:
                continue
            for value in values:
                if not isinstance(value, (str, os.PathLike)):
                    continue
                try:
                    path = os.fspath(value)
                except TypeError:
                    continue
                if not isinstance(path, str) or not path:
                    continue
                if stat_of(path) is not None:
                    self.named.add(os.path.abspath(path))
                    self.add(os.path.abspath(path))
                elif os.path.isdir(path):
                    self._add_tree(os.path.abspath(path))

    def _add_tree(self, folder: str) -> None:
        """Every regular file below ``folder`` (not autotune's own folders), stated now into ``trees``; nothing
        when it holds more than ``TREE_FILES`` entries (a home folder named by the dataset is not walked)."""
        found: list[str] = []
        for top, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if not is_own(os.path.join(top, d))]
            if len(found) + len(files) + len(dirs) > TREE_FILES:
                log.info("autotune: %s holds more than %d files; a cache is not checked against all of them "
                         "unless data_dir= names it", folder, TREE_FILES)
                return
            found.extend(os.path.join(top, f) for f in files)
        tree = self.trees[folder] = {}
        for path in sorted(found):
            st = stat_of(path)
            if st is not None:
                tree[path] = st

    def update(self, entries: dict[str, Stat | None]) -> None:
        for path, st in entries.items():
            self.seen.setdefault(path, st)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record what the block opens for reading in this thread, and in threads that record nothing themselves
        (``machine._evict.recording``: a read may open its files from a thread pool)."""
        with _evict.recording(self):
            yield

    def scan_process(self, *, maps: bool | None = None) -> None:
        """Add the regular files this process holds open read-only or maps without write access
        (what native readers use); each stated now. The descriptors are looked at every call (cheap);
        the mappings (a torch process has thousands) on the first call and every 16th, or as ``maps`` says."""
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            return
        for name in fds:
            fd = int(name)
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if self._fds.get(fd) == target or not target.startswith("/"):
                self._fds[fd] = target
                continue
            self._fds[fd] = target
            if target in self.seen or target.startswith(_SYSTEM) or _read_only(name) is not True:
                continue
            self.add(target)
        if maps or (maps is None and self._scans % 16 == 0):
            self._scan_maps()
        self._scans += 1

    def _scan_maps(self) -> None:
        try:
            with open("/proc/self/maps", "rb") as fh:
                text = fh.read()
        except OSError:
            return
        mapped: dict[bytes, bool] = {}  # path -> whether some mapping of it executes (code: a binary, a library)
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith(b"/") and b"w" not in parts[1]:
                mapped[parts[5]] = mapped.get(parts[5], False) or b"x" in parts[1]
        for raw, code in mapped.items():
            path = os.fsdecode(raw)
            if code or path.endswith(" (deleted)") or path in self.seen or path.startswith(_SYSTEM):
                continue
            self.add(path)

    def kept(self) -> dict[str, Stat]:
        """The sources that are data files (not code, libraries, system files or autotune's caches: the
        folder excluded, and any folder this user's autotune marked as its own, wherever it is, such as
        another cache, or another loader's fill, that this process holds open under another ``cache_dir``;
        a marker in a folder another user made or owns excludes nothing)."""
        modules = _evict.module_files()
        found: dict[str, Stat] = {}
        marked: dict[str, bool] = {}
        read = {path: (st, _evict.data_file(path, modules)) for path, st in self.seen.items() if st is not None}
        for folder, tree in self.trees.items():
            inside = os.path.realpath(folder) + os.sep
            if not any(real is not None and real.startswith(inside) for path, (_, real) in read.items()
                       if path not in self.named):
                for path, st in tree.items():  # no read of it was visible: the folder stands for what they read
                    if path not in read:
                        read[path] = st, _evict.data_file(path, modules)
        for path, (st, real) in read.items():
            if real is None or (self._exclude and (real + os.sep).startswith(self._exclude)):
                continue
            folder = os.path.dirname(real)
            if folder not in marked:  # made by this user's autotune: a marker another user planted blinds nothing
                marked[folder] = is_own(folder)
            if marked[folder]:
                continue
            found[path] = st
        return found


def _read_only(fd_name: str) -> bool | None:
    try:
        with open(f"/proc/self/fdinfo/{fd_name}") as fh:
            for line in fh:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE == os.O_RDONLY
    except (OSError, ValueError):
        return None
    return None


def write(folder: Path, sources: dict[str, Stat]) -> dict[str, Any]:
    """Write ``sources`` as ``folder/sources.bin``; the manifest's entry for it (count and digest)."""
    paths = sorted(sources)
    blob = zlib.compress(b"\0".join(os.fsencode(p) for p in paths), 1)
    table = np.asarray([sources[p] for p in paths], dtype="<i8").reshape(len(paths), 4)
    data = _MAGIC + _HEADER.pack(len(paths), len(blob)) + blob + table.tobytes()
    with open(folder / FILE_NAME, "wb") as fh:
        fh.write(data)
    return {"count": len(paths), "digest": hashlib.blake2b(data, digest_size=16).hexdigest()}


class BadRecord(ValueError):
    """``sources.bin`` is not the file the manifest describes."""


def read(folder: Path, entry: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    """The recorded paths and their (size, mtime_ns, ctime_ns, inode) rows; BadRecord when the file
    is not the one the manifest's ``entry`` describes."""
    try:
        data = (folder / FILE_NAME).read_bytes()
    except OSError as exc:
        raise BadRecord(f"{folder / FILE_NAME} cannot be read ({exc.strerror})") from None
    if hashlib.blake2b(data, digest_size=16).hexdigest() != entry.get("digest") or not data.startswith(_MAGIC):
        raise BadRecord(f"{folder / FILE_NAME} is not the record its manifest names")
    start = len(_MAGIC) + _HEADER.size
    count, size = _HEADER.unpack(data[len(_MAGIC):start])
    text = zlib.decompress(data[start:start + size])
    paths = [os.fsdecode(p) for p in text.split(b"\0")] if count else []
    table = np.frombuffer(data, dtype="<i8", offset=start + size).reshape(-1, 4)
    if len(paths) != count or len(table) != count or count != entry.get("count"):
        raise BadRecord(f"{folder / FILE_NAME} is not the record its manifest names")
    return paths, table


def _stats(paths: list[str]) -> list[Stat | None]:
    if len(paths) < _PARALLEL:
        return [stat_of(p) for p in paths]
    chunks = [paths[i:i + _PARALLEL] for i in range(0, len(paths), _PARALLEL)]
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(chunks))) as pool:
        return [st for part in pool.map(lambda c: [stat_of(p) for p in c], chunks) for st in part]


def changed(folder: Path, entry: dict[str, Any]) -> list[str]:
    """The recorded source files that are gone or differ from the record (sorted; [] when none)."""
    paths, table = read(folder, entry)
    now = _stats(paths)
    missing = np.asarray([st is None for st in now], dtype=bool)
    current = np.asarray([st if st is not None else (-1, -1, -1, -1) for st in now], dtype="<i8").reshape(-1, 4)
    differ = missing | (current != table).any(axis=1)
    return [paths[k] for k in np.flatnonzero(differ)]


def describe(paths: list[str], total: int) -> str:
    names = ", ".join(os.path.basename(p) or p for p in paths[:3])
    more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    return (f"{len(paths)} of its {total} source file{'s' if total != 1 else ''} changed since it was built "
            f"({names}{more})")


__all__ = ["FILE_NAME", "BadRecord", "Sources", "changed", "describe", "read", "stat_of", "write"]
