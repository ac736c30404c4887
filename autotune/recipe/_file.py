"""The recipe file ``autotune.json``: versioned, written atomically, one profile per machine.

::

    {"format": "autotune-recipe", "version": 1, "profiles": {"<fingerprint>": PROFILE, ...}}

A profile is what one search found on one machine (``Profile``).  Searching on a new machine adds its
profile and keeps the others (``RecipeFile.merge_write``), so a repository shared by a laptop, a
workstation and a cluster node keeps each machine's recipe.  ``choose_profile`` picks this machine's
profile, or the nearest one with a warning that says what changed and how to re-tune.

Files of an older format version are converted on read through ``_MIGRATIONS``; a file of a newer
version, or one that is not valid, raises ``RecipeError`` and is never written over.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import os
import secrets
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import __version__
from autotune.caches import default_root
from autotune.config import LoaderConfig
from autotune.errors import HardwareMismatch, RecipeError
from autotune.machine import _hardware
from autotune.process import DEFAULT_ALLOCATOR
from autotune.recipe import _factory_runs
from autotune.recipe._factory_runs import FactoryRun
from autotune.recipe._learned import Learned
from autotune.recipe._measured import Measured
from autotune.recipe._records import DatasetRecord, RunSettings

__all__ = [
    "FORMAT",
    "VERSION",
    "Profile",
    "RecipeFile",
    "RecipeMismatchWarning",
    "choose_profile",
    "mismatch_message",
    "regenerate_command",
]

FORMAT = "autotune-recipe"
VERSION = 2

_ON_MISMATCH = ("warn", "error", "search")


class RecipeMismatchWarning(UserWarning):
    """No profile in the recipe file was tuned on this machine; the nearest one is used."""


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


# ---------------------------------------------------------------------------- Profile

# Facts a profile's "hardware" may hold, with the JSON types each may take (None: unknown here).
_HARDWARE_TYPES: dict[str, tuple[type, ...]] = {
    "cpu_model": (str,), "usable_cpus": (int,), "logical_cpus": (int,), "memory_bytes": (int,),
    "memory_limit_bytes": (int,), "gpus": (list,), "torch": (str,), "cuda": (str,), "python": (str,),
    "platform": (str,),
    "shm_bytes": (int,), "fingerprint": (str,), "ranks_per_node": (int,),
}
_MAX_INT = 2**62  # larger than any real count of bytes or CPUs; rejects absurd hand-edits
_MAX_TEXT = 4096


@dataclass
class Profile:
    """One machine's recipe for one dataset: the fields of a profile in ``autotune.json``."""

    hardware: dict[str, Any]
    dataset: DatasetRecord = field(default_factory=DatasetRecord)
    settings: RunSettings = field(default_factory=RunSettings)
    config: LoaderConfig = field(default_factory=LoaderConfig)
    measured: Measured = field(default_factory=Measured)
    created: str = field(default_factory=_now)
    autotune_version: str = __version__
    # what the factory cost on this machine, from `autotune validate` (recipe/_factory_runs.py)
    factory_runs: tuple[FactoryRun, ...] = ()
    # what an adapting run measured on this machine, where the next run starts (recipe/_learned.py)
    learned: Learned | None = None
    # keys a newer autotune of the same format version wrote; kept so a merge does not drop them
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    _FIELDS = ("hardware", "dataset", "settings", "config", "measured", "created", "autotune_version",
               "factory_runs", "learned")

    @property
    def fingerprint(self) -> str:
        """The hardware fingerprint this profile is filed under (computed, not trusted from disk)."""
        return _hardware.fingerprint(self.hardware)

    @property
    def ranks_per_node(self) -> int:
        """The training processes per node this profile was tuned for (1 unless searched with several)."""
        value = self.hardware.get("ranks_per_node")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self._FIELDS:
            value = getattr(self, name)
            if name == "factory_runs":
                if value:  # written once a validation has measured the factory
                    out[name] = [run.to_json() for run in value]
            elif name == "learned":
                if value is not None:  # written once an adapting run has measured
                    out[name] = value.to_json()
            else:
                out[name] = (value.to_json() if isinstance(value, (LoaderConfig, Measured, DatasetRecord, RunSettings))
                             else copy.deepcopy(value))
        out["hardware"]["fingerprint"] = self.fingerprint
        for key, value in self.extra.items():
            out.setdefault(key, copy.deepcopy(value))
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        """Build a profile from its JSON form, every value checked for type and bounds; RecipeError
        (without a file name) naming the first problem when it is not a valid profile."""
        if not isinstance(data, dict):
            raise RecipeError(f"a profile must be a JSON object, but got {type(data).__name__}")
        _check_text(data, "profile")
        for name in ("hardware", "dataset", "config"):
            if not isinstance(data.get(name), dict):
                raise RecipeError(f"a profile has no {name!r} object")
        _check_hardware(data["hardware"])
        data = copy.deepcopy(data)
        return cls(
            hardware=data["hardware"],
            dataset=DatasetRecord.from_json(data["dataset"]),
            settings=RunSettings.from_json(data.get("settings")),
            config=LoaderConfig.from_json(data["config"]),
            measured=Measured.from_json(data.get("measured")),
            created=str(data.get("created") or ""),
            autotune_version=str(data.get("autotune_version") or "unknown"),
            factory_runs=_factory_runs.read(data.get("factory_runs")),
            learned=Learned.from_json(data.get("learned")),
            extra={k: v for k, v in data.items() if k not in cls._FIELDS},
        )


def _check_hardware(hw: dict[str, Any]) -> None:
    for name, types in _HARDWARE_TYPES.items():
        value = hw.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            raise RecipeError(f"a profile's hardware.{name} must be a {types[0].__name__}, but got {value!r}")
        if isinstance(value, int) and not 0 <= value <= _MAX_INT:
            raise RecipeError(f"a profile's hardware.{name} is out of range: {value!r}")
    if not all(isinstance(g, str) for g in hw.get("gpus") or []):
        raise RecipeError("a profile's hardware.gpus must be a list of names")


def _check_text(value: Any, where: str) -> None:
    """No string in a profile may carry control characters (they would rewrite a terminal's
    screen when ``autotune show`` prints it) or be unreasonably long."""
    if isinstance(value, str):
        if len(value) > _MAX_TEXT or any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in value):
            raise RecipeError(f"{where} holds a string with control characters or over {_MAX_TEXT} characters")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, where)
            _check_text(v, f"{where}.{k}")
    elif isinstance(value, list):
        for item in value:
            _check_text(item, where)


def _v1_to_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 1 kept a profile's configuration in four objects (loader, threads, process, cache);
    version 2 keeps one "config" (autotune/config.py) and no cache path."""
    for profile in (doc.get("profiles") or {}).values():
        if not isinstance(profile, dict):
            continue
        loader = profile.pop("loader", None) or {}
        threads = profile.pop("threads", None) or {}
        process = profile.pop("process", None) or {}
        cache = profile.pop("cache", None) or {}
        if not all(isinstance(x, dict) for x in (loader, threads, process, cache)):
            raise RecipeError("a version-1 profile's loader, threads, process and cache must be objects")
        workers = loader.get("num_workers", 0)
        profile["config"] = {
            "num_workers": workers,
            "prefetch_factor": loader.get("prefetch_factor") if workers else None,
            "persistent_workers": bool(loader.get("persistent_workers")) if workers else False,
            "pin_memory": loader.get("pin_memory", False),
            "multiprocessing_context": loader.get("multiprocessing_context") if workers else None,
            "worker_threads": threads.get("worker") if workers else None,
            "main_threads": threads.get("main"),
            "cache": cache.get("backend"),
            "allocator": process.get("allocator", DEFAULT_ALLOCATOR),
        }
    return doc


# ---------------------------------------------------------------------------- the file

# version N -> a function that turns a version-N document into a version-(N+1) document.
# Add an entry here (and a saved sample file under tests/data/) whenever VERSION goes up.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def regenerate_command(profile: Profile | None = None) -> str:
    """The command that re-tunes ``profile``'s dataset on this machine."""
    source = profile.dataset.source if profile else ""
    if not source or source.startswith("<"):
        # tuned from Python (autotune.search(dataset)): no file to name
        return "`autotune search DATASET.py` (or autotune.search(dataset, ...) in Python)"
    return f"`autotune search {source}`"


def _corrupt(path: Path, problem: str) -> RecipeError:
    return RecipeError(
        f"Recipe file {path} is corrupt: {problem}; restore it from version control, "
        f"or delete it and run `autotune search DATASET` again."
    )


def _migrate(data: dict[str, Any], path: Path) -> dict[str, Any]:
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _corrupt(path, f"its format version is {version!r}, not a positive integer")
    if version > VERSION:
        raise RecipeError(
            f"Recipe file {path} has format version {version}, newer than this autotune reads "
            f"(up to {VERSION}); upgrade autotune (pip install -U dataloader-autotune), or run "
            f"`autotune search DATASET --output OTHER.json` to write a separate file."
        )
    while version < VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise RecipeError(
                f"Recipe file {path} has format version {version}, which this autotune can no "
                f"longer convert; run `autotune search DATASET` again to write a new one."
            )
        try:
            data = step(copy.deepcopy(data))
        except RecipeError as exc:
            raise _corrupt(path, str(exc)) from None
        version += 1
        data["version"] = version
    return data


@dataclass
class RecipeFile:
    """The whole ``autotune.json``: profiles by hardware fingerprint."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    path: Path | None = None

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RecipeFile:
        """Read and validate a recipe file, converting an older format version.  RecipeError, one
        line naming the file and the fix, for a missing, unreadable, corrupt or future file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RecipeError(
                f"No recipe file at {path}; run `autotune search DATASET` to create one."
            ) from None
        except IsADirectoryError:
            raise RecipeError(
                f"Recipe path {path} is a folder; pass the autotune.json file inside it."
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise RecipeError(f"Cannot read recipe file {path}: {exc}; check its permissions.") from exc
        try:
            return cls._parse(text, path)
        except RecursionError:
            # json and every walk of the parsed values recurse: a file nested deeper than Python's stack allows
            # is refused whole, wherever the walk gives out
            raise _corrupt(path, "nested too deeply to be a recipe") from None

    @classmethod
    def _parse(cls, text: str, path: Path) -> RecipeFile:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _corrupt(path, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise RecipeError(
                f"File {path} is not an autotune recipe (no \"format\": \"{FORMAT}\"); pass the "
                f"autotune.json that `autotune search` wrote."
            )
        data = _migrate(data, path)
        raw = data.get("profiles")
        if not isinstance(raw, dict):
            raise _corrupt(path, "'profiles' is not an object")
        profiles: dict[str, Profile] = {}
        for key, item in raw.items():
            try:
                profile = Profile.from_dict(item)
            except RecipeError as exc:
                raise _corrupt(path, f"profile {key!r}: {exc}") from exc
            # filed under the fingerprint its hardware gives, whatever the key said
            profiles[profile.fingerprint] = profile
        return cls(profiles=profiles, path=path)

    @classmethod
    def check_target(cls, path: str | os.PathLike[str]) -> None:
        """Raise RecipeError now when ``merge_write(path, ...)`` would fail later: an existing file that is
        unreadable, corrupt, of a newer version or not writable, or a folder that is missing or read-only."""
        path = Path(path)
        if path.exists() or path.is_symlink():
            cls.read(path)
            if not os.access(path, os.W_OK):
                raise RecipeError(
                    f"Recipe file {path} is not writable; fix its permissions or pass --output OTHER.json.")
        folder = path.parent
        if not folder.is_dir():
            raise RecipeError(f"The folder of the recipe file {path} does not exist; create it or pass another path.")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise RecipeError(f"Cannot write the recipe file {path}: its folder {folder} is not writable; pass "
                              "--output a path in a writable folder.")

    def add(self, profile: Profile) -> None:
        """Add ``profile``, replacing any profile of the same hardware fingerprint; what the factory cost
        on that machine (``factory_runs``) is kept: a new search of it predicts from those runs."""
        old = self.profiles.get(profile.fingerprint)
        if old is not None and old.factory_runs:
            profile.factory_runs = _factory_runs.merged(old.factory_runs, profile.factory_runs)
        self.profiles[profile.fingerprint] = profile

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "profiles": {fp: p.to_dict() for fp, p in self.profiles.items()},
        }

    def write(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write atomically: a temporary file in the same folder, fsync, then ``Path.replace``.
        A crash at any point leaves either the old file or the new one, never a mix."""
        target = Path(path if path is not None else self.path or "autotune.json")
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
        _atomic_write_text(target, text)
        self.path = target
        return target

    @classmethod
    def merge_write(cls, path: str | os.PathLike[str], profile: Profile) -> RecipeFile:
        """Re-read the file now on disk (if any), add ``profile``, and write it back atomically,
        keeping the other machines' profiles.  A corrupt or future file raises RecipeError and is
        not written over.  Concurrent writers are serialised by an advisory lock where the OS has
        one."""
        path = Path(path)
        with _locked(path):
            rf = cls.read(path) if path.exists() else cls(path=path)
            rf.add(profile)
            rf.write(path)
        return rf

    @classmethod
    def learn(cls, path: str | os.PathLike[str], profile: Profile, learned: Learned) -> None:
        """Store what an adapting run learned in ``profile``'s place in the file now on disk (the profile itself
        where the file or its place is empty), atomically under the recipe's lock; the rest is kept."""
        path = Path(path)
        with _locked(path):
            rf = cls.read(path) if path.exists() else cls(path=path)
            # a copy where the place is empty: the caller's profile is the run's previous record, kept as read
            rf.profiles.setdefault(profile.fingerprint, copy.copy(profile)).learned = learned
            rf.write(path)

    def __len__(self) -> int:
        return len(self.profiles)


def _atomic_write_text(target: Path, text: str) -> None:
    folder = target.parent
    tmp = folder / f".{target.name}.{secrets.token_hex(4)}.tmp"
    # os.open with 0o666 lets the umask decide the mode, as for a plain open(); keep an old mode.
    try:
        mode = target.stat().st_mode & 0o777
    except OSError:
        mode = 0o666
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode != 0o666:
            os.chmod(tmp, mode)
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    # make the rename itself durable (POSIX); not possible on every OS
    with contextlib.suppress(OSError, AttributeError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def recipe_lock_path(path: Path) -> Path:
    """Where the lock of the recipe at ``path`` lives: ``autotune-locks`` beside the cache root."""
    name = hashlib.sha256(str(Path(path).resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return default_root().parent / "autotune-locks" / f"recipe-{name}.lock"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an advisory lock for the recipe while it is read and rewritten (the recipe itself is replaced,
    so it cannot carry the lock).  The lock file lies beside the user's cache folder, named by the recipe's
    real path, never in the user's repository.  No lock where fcntl is absent."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    lock_path = recipe_lock_path(path)
    try:
        lock_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield  # read-only folder etc.: the write below reports the real problem
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# ---------------------------------------------------------------------------- choosing


def mismatch_message(
    profile: Profile, changes: list[str], path: str | os.PathLike[str] | None = None
) -> str:
    """One line: which file, what changed against the nearest profile, how to re-tune."""
    where = str(path) if path is not None else "the recipe file"
    what = "; ".join(changes) if changes else "hardware fingerprint differs"
    return (
        f"No profile in {where} was tuned on this machine; the nearest "
        f"({profile.fingerprint}) differs: {what}. Re-tune here with "
        f"{regenerate_command(profile)}."
    )


def _nearest(rf: RecipeFile, hw: dict[str, Any]) -> Profile:
    def key(item: tuple[str, Profile]) -> tuple[float, str, str]:
        fp, p = item
        # nearest first; among equals the newest, then a stable order
        return (_hardware.distance(p.hardware, hw), _invert(p.created), fp)

    return min(rf.profiles.items(), key=key)[1]


def _invert(s: str) -> str:
    """A key that sorts strings in reverse (newest ISO date first)."""
    return "".join(chr(0x10FFFF - ord(c)) for c in s)


def choose_profile(
    rf: RecipeFile, hw: dict[str, Any], on_mismatch: str = "warn", *, stacklevel: int = 2
) -> tuple[Profile, list[str]]:
    """This machine's profile and ``[]``, or the nearest profile and what changed.

    ``on_mismatch``: ``"warn"`` warns ``RecipeMismatchWarning`` and returns the nearest;
    ``"error"`` raises ``HardwareMismatch`` with the same text; ``"search"`` returns the nearest
    and the differences without warning (the caller searches).  ``stacklevel`` is passed to
    ``warnings.warn`` so the warning points at the user's call.
    """
    if on_mismatch not in _ON_MISMATCH:
        raise ValueError(
            f"on_mismatch must be one of {', '.join(map(repr, _ON_MISMATCH))}, but got {on_mismatch=}."
        )
    if not rf.profiles:
        where = rf.path if rf.path is not None else "the recipe file"
        raise RecipeError(f"Recipe file {where} has no profiles; run `autotune search DATASET` to add one.")
    fp = _hardware.fingerprint(hw)
    if fp in rf.profiles:
        return rf.profiles[fp], []
    nearest = _nearest(rf, hw)
    changes = _hardware.differences(nearest.hardware, hw)
    if on_mismatch == "search":
        return nearest, changes
    message = mismatch_message(nearest, changes, rf.path)
    if on_mismatch == "error":
        raise HardwareMismatch(message)
    warnings.warn(RecipeMismatchWarning(message), stacklevel=stacklevel)
    return nearest, changes
