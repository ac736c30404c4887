"""`autotune run [--recipe autotune.json] [--dry-run] -- CMD...`: start CMD with the recipe's
process settings applied.

Reads this machine's profile from the recipe, builds the environment with
:func:`autotune.process._settings.launch_env` (allocator preload or glibc thresholds, OpenMP/MKL thread
counts) and replaces itself with CMD, the way ``python -m torch.backends.xeon.run_cpu`` does, so
CMD's exit status is autotune's. What could not be applied (a library missing here) is said in one
line each on stderr, with the fallback used; what is applied is said in one line too.
``--dry-run`` prints the environment changes and the command instead of starting it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import warnings
from collections.abc import Mapping
from typing import TextIO

from autotune.cli._options import add_json, add_ranks_per_node, add_recipe, print_json
from autotune.errors import AutotuneError
from autotune.machine import _hardware as hardware
from autotune.machine import ranks_per_node
from autotune.process import ProcessSettings, allocator_names, get_allocator, launch_env
from autotune.recipe._file import RecipeFile, choose_profile, mismatch_message


class CommandNotFound(AutotuneError):
    """CMD cannot be started; 127 like a shell."""

    exit_code = 127


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="start a command with the recipe's process settings (allocator, threads) applied",
        description="Start CMD with this machine's process settings from the recipe applied: the "
        f"memory allocator (LD_PRELOAD of {'/'.join(n for n in allocator_names() if get_allocator(n).preloaded)}, "
        "or glibc thresholds) and OpenMP/MKL "
        "thread counts. A library missing here falls back with a message. Example: "
        "autotune run -- python train.py",
    )
    add_recipe(p)
    add_ranks_per_node(p)
    add_json(p)
    p.add_argument(
        "--dry-run", action="store_true", help="print the environment and command instead of running it"
    )
    p.add_argument(
        "--on-mismatch",
        choices=("warn", "error"),
        default="warn",
        help="when no profile was tuned on this machine: use the nearest and say so (warn, the "
        "default) or stop with exit 3 (error)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to start")
    p.set_defaults(func=run)


def load_settings(path: str, on_mismatch: str = "warn",
                  ranks: int | None = None) -> tuple[ProcessSettings, list[str]]:
    """This machine's process settings from the recipe at ``path``, and notes (a hardware mismatch)."""

    rf = RecipeFile.read(path)
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said below as one note, not as a warning with a source line
        profile, changes = choose_profile(rf, hardware.collect(ranks_per_node=ranks_per_node(ranks)),
                                          "error" if on_mismatch == "error" else "search")
    if changes:
        notes.append(mismatch_message(profile, changes, path))
    return profile.config.process_settings(), notes


def env_changes(env: Mapping[str, str], base_env: Mapping[str, str]) -> dict[str, str]:
    """The variables ``env`` sets or changes against ``base_env``, in ``env``'s order."""
    return {k: v for k, v in env.items() if base_env.get(k) != v}


def start(
    settings: ProcessSettings,
    cmd: list[str],
    *,
    base_env: Mapping[str, str] | None = None,
    dry_run: bool = False,
    as_json: bool = False,
    notes: list[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Start ``cmd`` with ``settings`` applied (exec: does not return), or print what would run.

    Returns 0 only for ``dry_run``.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if not cmd:
        raise AutotuneError("autotune run needs a command after `--`, e.g. `autotune run -- python train.py`")
    base_env = os.environ if base_env is None else base_env
    env, launch_notes = launch_env(settings, base_env)
    if dry_run and as_json:
        print_json({"env": env_changes(env, base_env), "command": cmd, "settings": settings.describe(),
                    "notes": list(notes or []) + launch_notes}, out)
        return 0
    for note in list(notes or []) + launch_notes:
        print(f"autotune run: note: {note}", file=err)
    changes = env_changes(env, base_env)
    what = " ".join(f"{k}={shlex.quote(v)}" for k, v in changes.items()) or "no environment changes"
    if dry_run:
        for k, v in changes.items():
            print(f"{k}={shlex.quote(v)}", file=out)
        print(shlex.join(cmd), file=out)
        return 0
    print(f"autotune run: {what} ({settings.describe()})", file=err)
    err.flush()
    out.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        raise CommandNotFound(f"cannot start {cmd[0]!r}: {exc.strerror}; check the command after `--`") from None
    return 0  # pragma: no cover - exec does not return


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise AutotuneError("autotune run needs a command after `--`, e.g. `autotune run -- python train.py`")
    settings, notes = load_settings(args.recipe, args.on_mismatch, args.ranks_per_node)
    if args.json and not args.dry_run:
        raise AutotuneError("autotune run --json reports what would run: add --dry-run (a started command's "
                            "output is its own).")
    return start(settings, cmd, dry_run=args.dry_run, as_json=args.json, notes=notes)
