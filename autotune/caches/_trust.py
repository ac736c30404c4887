"""Where caches live and when one may be read: a per-user root, and folders only their owner can write.

A cache's payload is decoded with pickle for whatever the codec cannot store as raw columns, so a
cache is code as much as data: it is read only from a folder the current user owns and nobody else
can write. The root is ``$AUTOTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/autotune``, else
``~/.cache/autotune`` (where pip, torch hub and Hugging Face datasets keep theirs), created 0700
and tagged with a ``CACHEDIR.TAG`` (https://bford.info/cachedir/) so backup tools skip it. A folder
that exists, holds something, and carries no such tag is somebody's data: autotune never writes there.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from autotune.caches._own import MARKER
from autotune.errors import AutotuneError

TAG_NAME = "CACHEDIR.TAG"
TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
       "# This file is a cache directory tag created by autotune (its sample caches).\n"
       "# For information about cache directory tags, see https://bford.info/cachedir/\n")


class UntrustedCache(AutotuneError):
    """A cache folder another user could have written: it is never decoded."""


def default_root() -> Path:
    """``$AUTOTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``."""
    explicit = os.environ.get("AUTOTUNE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "autotune"
    return Path.home() / ".cache" / "autotune"


def trust_problem(path: Path | str, *, follow: bool = False) -> str | None:
    """Why ``path`` must not be read (one line, with the fix), or None when only its owner can write it.

    ``follow``: judge what a symbolic link points at (for the root); a cache directory itself must be
    a real directory."""
    path = Path(path)
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link, not a folder autotune made; remove it"
    uid = os.geteuid()
    if st.st_uid != uid:
        return (f"{path} is owned by uid {st.st_uid}, not by you (uid {uid}); remove it or set "
                "AUTOTUNE_CACHE_DIR to a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{path} is writable by {'group and others' if st.st_mode & stat.S_IWOTH else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):o}); run `chmod go-w {path}` or set AUTOTUNE_CACHE_DIR "
                "to a private folder")
    return None


def check_trusted(path: Path | str, what: str = "Cache folder", *, follow: bool = False) -> None:
    """Raise UntrustedCache when ``path`` could have been written by someone else."""
    problem = trust_problem(path, follow=follow)
    if problem is not None:
        raise UntrustedCache(f"{what} not used: {problem}.")


def is_tagged(root: Path | str) -> bool:
    try:
        return (Path(root) / TAG_NAME).read_text(errors="replace").startswith(TAG.split("\n")[0])
    except OSError:
        return False


def ensure_root(root: Path | str | None = None) -> Path:
    """The cache root, created 0700 and tagged when new; UntrustedCache when someone else could write
    it, AutotuneError when it is a folder of other files (never written to)."""
    root = Path(root) if root is not None else default_root()
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir(mode=0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(root, 0o700)  # whatever the umask
    if not root.is_dir():
        raise AutotuneError(f"The cache folder {root} is not a folder; pass cache_dir= a new or empty "
                            "folder, or set AUTOTUNE_CACHE_DIR.")
    check_trusted(root, "Cache folder", follow=True)
    if not is_tagged(root):
        # Other processes may be creating this root at the same moment: one may be between writing its
        # tag's temporary file and renaming it (that file is ours), another may have tagged the root and
        # put its lock beside the tag since we looked. Autotune writes the tag before anything else, so
        # entries found with the tag in place afterwards are autotune's.
        others = [entry for entry in root.iterdir()  # autotune's marker too: a trial folder made to be a root
                  if not entry.name.startswith(TAG_TMP_PREFIX) and entry.name != MARKER]
        if others and not is_tagged(root):
            raise AutotuneError(f"The cache folder {root} holds files autotune did not put there, so autotune "
                                "will not write in it; pass cache_dir= a new or empty folder, or omit it.")
        _write_tag(root)
    return root


TAG_TMP_PREFIX = f".{TAG_NAME}.tmp-"


def _write_tag(root: Path) -> None:
    tmp = root / f"{TAG_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    tmp.write_text(TAG)
    os.replace(tmp, root / TAG_NAME)


# ------------------------------------------------------------------------------------ signed manifests
# A manifest says how each leaf is decoded (its schema names the leaves stored as pickles), so it is
# code too. Owner and mode checks keep other users out; the signature goes further: a manifest is
# believed only when it carries the keyed digest that this user's autotune wrote with it, under a key
# only this user can read, so no manifest made elsewhere (copied in, planted, edited) can make autotune
# unpickle bytes its backend did not write itself.
KEY_NAME = ".autotune-key"
KEY_TMP_PREFIX = f"{KEY_NAME}.tmp-"
SIGNATURE = "signature"


def _read_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UntrustedCache(f"Cache key not used: {path} cannot be opened ({exc.strerror}); remove it.") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UntrustedCache(f"Cache key not used: {path} is not a private file of yours (owner uid "
                                 f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it.")
        key = os.read(fd, 64)
    finally:
        os.close(fd)
    return key if len(key) == 32 else None


def signing_key(root: Path | str, *, create: bool) -> bytes | None:
    """The key this user's manifests under ``root`` are signed with (``root/.autotune-key``, 0600),
    made when ``create`` and there is none; None when there is none."""
    path = Path(root) / KEY_NAME
    key = _read_key(path)
    if key is not None or not create:
        return key
    tmp = Path(root) / f"{KEY_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(32))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic and never replacing: two first builders agree on one key
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return _read_key(path)


def _digest(manifest: dict[str, Any], key: bytes) -> str:
    body = {k: v for k, v in manifest.items() if k != SIGNATURE}
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(text, key=key, digest_size=32).hexdigest()


def sign(manifest: dict[str, Any], root: Path | str) -> None:
    """Add the signature of ``manifest`` (JSON-ready) under ``root``'s key, made if need be."""
    key = signing_key(root, create=True)
    assert key is not None, "signing_key(create=True) makes one"
    manifest[SIGNATURE] = _digest(manifest, key)


def signature_problem(manifest: dict[str, Any], root: Path | str) -> str | None:
    """Why ``manifest`` (as read from a cache under ``root``) is not one this user's autotune signed."""
    key = signing_key(root, create=False)
    if key is None:
        return f"no signing key in {root}"
    if not secrets.compare_digest(str(manifest.get(SIGNATURE, "")), _digest(manifest, key)):
        return "its manifest is not signed by your autotune (copied, planted or edited)"
    return None


__all__ = ["KEY_NAME", "KEY_TMP_PREFIX", "SIGNATURE", "TAG_NAME", "TAG_TMP_PREFIX", "UntrustedCache", "check_trusted",
           "default_root", "ensure_root", "is_tagged", "sign", "signature_problem", "signing_key", "trust_problem"]
