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
import json
import os
import secrets
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from autotune import hardware as _hardware
from autotune.errors import HardwareMismatch, RecipeError

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
VERSION = 1

# version N -> a function that turns a version-N document into a version-(N+1) document.
# Add an entry here (and a saved sample file under tests/data/) whenever VERSION goes up.
_MIGRATIONS: dict[int, Callable[[dict], dict]] = {}

_ON_MISMATCH = ("warn", "error", "search")


class RecipeMismatchWarning(UserWarning):
    """No profile in the recipe file was tuned on this machine; the nearest one is used."""


def _autotune_version() -> str:
    try:
        from autotune import __version__  # type: ignore[attr-defined]

        return str(__version__)
    except ImportError:
        pass
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("autotune")
    except (ImportError, PackageNotFoundError):
        return "unknown"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _default_threads() -> dict[str, int | None]:
    return {"worker": None, "main": None}


# ---------------------------------------------------------------------------- Profile


@dataclass
class Profile:
    """One machine's recipe for one dataset: the fields of a profile in ``autotune.json``."""

    hardware: dict[str, Any]
    dataset: dict[str, Any]
    settings: dict[str, Any]
    loader: dict[str, Any]
    threads: dict[str, Any] = field(default_factory=_default_threads)
    process: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] | None = None
    measured: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=_now)
    autotune_version: str = field(default_factory=_autotune_version)
    # keys a newer autotune of the same format version wrote; kept so a merge does not drop them
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    _FIELDS = (
        "hardware", "dataset", "settings", "loader", "threads", "process", "cache", "measured",
        "created", "autotune_version",
    )

    @property
    def fingerprint(self) -> str:
        """The hardware fingerprint this profile is filed under (computed, not trusted from disk)."""
        return _hardware.fingerprint(self.hardware)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self._FIELDS:
            out[name] = copy.deepcopy(getattr(self, name))
        out["hardware"]["fingerprint"] = self.fingerprint
        for key, value in self.extra.items():
            out.setdefault(key, copy.deepcopy(value))
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "Profile":
        """Build a profile from its JSON form; RecipeError (without a file name) when it is not one."""
        if not isinstance(data, dict):
            raise RecipeError(f"a profile must be a JSON object, but got {type(data).__name__}")
        for name in ("hardware", "dataset", "loader"):
            if not isinstance(data.get(name), dict):
                raise RecipeError(f"a profile has no {name!r} object")
        for name in ("settings", "threads", "process", "measured"):
            if name in data and data[name] is not None and not isinstance(data[name], dict):
                raise RecipeError(f"a profile's {name!r} must be an object")
        if data.get("cache") is not None and not isinstance(data["cache"], dict):
            raise RecipeError("a profile's 'cache' must be an object or null")
        data = copy.deepcopy(data)
        return cls(
            hardware=data["hardware"],
            dataset=data["dataset"],
            settings=data.get("settings") or {},
            loader=data["loader"],
            threads=data.get("threads") or _default_threads(),
            process=data.get("process") or {},
            cache=data.get("cache"),
            measured=data.get("measured") or {},
            created=str(data.get("created") or ""),
            autotune_version=str(data.get("autotune_version") or "unknown"),
            extra={k: v for k, v in data.items() if k not in cls._FIELDS},
        )


# ---------------------------------------------------------------------------- the file


def regenerate_command(profile: Profile | None = None) -> str:
    """The command that re-tunes ``profile``'s dataset on this machine."""
    source = (profile.dataset.get("source") if profile else None) or ""
    if not source or source.startswith("<"):
        # tuned from Python (autotune.search(dataset)): no file to name
        return "`autotune search DATASET.py` (or autotune.search(dataset, ...) in Python)"
    return f"`autotune search {source}`"


def _corrupt(path: Path, problem: str) -> RecipeError:
    return RecipeError(
        f"Recipe file {path} is corrupt: {problem}; restore it from version control, "
        f"or delete it and run `autotune search DATASET` again."
    )


def _migrate(data: dict, path: Path) -> dict:
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _corrupt(path, f"its format version is {version!r}, not a positive integer")
    if version > VERSION:
        raise RecipeError(
            f"Recipe file {path} has format version {version}, newer than this autotune reads "
            f"(up to {VERSION}); upgrade autotune (pip install -U autotune), or run "
            f"`autotune search DATASET --output OTHER.json` to write a separate file."
        )
    while version < VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise RecipeError(
                f"Recipe file {path} has format version {version}, which this autotune can no "
                f"longer convert; run `autotune search DATASET` again to write a new one."
            )
        data = step(copy.deepcopy(data))
        version += 1
        data["version"] = version
    return data


@dataclass
class RecipeFile:
    """The whole ``autotune.json``: profiles by hardware fingerprint."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    path: Path | None = None

    @classmethod
    def read(cls, path: str | os.PathLike) -> "RecipeFile":
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

    def add(self, profile: Profile) -> None:
        """Add ``profile``, replacing any profile of the same hardware fingerprint."""
        self.profiles[profile.fingerprint] = profile

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "profiles": {fp: p.to_dict() for fp, p in self.profiles.items()},
        }

    def write(self, path: str | os.PathLike | None = None) -> Path:
        """Write atomically: a temporary file in the same folder, fsync, then ``Path.replace``.
        A crash at any point leaves either the old file or the new one, never a mix."""
        target = Path(path if path is not None else self.path or "autotune.json")
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
        _atomic_write_text(target, text)
        self.path = target
        return target

    @classmethod
    def merge_write(cls, path: str | os.PathLike, profile: Profile) -> "RecipeFile":
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


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an advisory lock on ``.NAME.lock`` beside the recipe while it is read and rewritten
    (the recipe itself is replaced, so it cannot carry the lock).  No lock where fcntl is absent."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    lock_path = path.parent / f".{path.name}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
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
    profile: Profile, changes: list[str], path: str | os.PathLike | None = None
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
