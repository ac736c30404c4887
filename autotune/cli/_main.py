"""Command line entry point: parse, dispatch to one module per subcommand, turn errors into one line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback

from autotune import __version__
from autotune.cli._options import settle
from autotune.errors import AutotuneError
from autotune.tuner._lifecycle import Stopped

# One module per subcommand in this package (_NAME.py); each has register(subparsers) and run(args) -> int.
COMMANDS = ("search", "show", "check", "cache", "run", "validate", "diagnose", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Find the fastest PyTorch DataLoader recipe for a dataset on this machine.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"autotune.cli._{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"autotune.cli._{name}":
                continue  # a subcommand not built yet
            raise
        module.register(sub)
    return parser


def process_started() -> float:
    """When this process started, on time.monotonic()'s clock (Linux: /proc/self/stat's start time against
    /proc/uptime); now where that cannot be read. The command's budget runs from here, so `time autotune
    search --budget 2m` sees the promise `--help` states, the interpreter's and torch's imports included."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - min(max(age, 0.0), 120.0)  # a process older than that was not started for this



def main(argv: list[str] | None = None) -> int:
    started = None
    command = argv is None  # the command itself (console script, python -m autotune), not a call from Python
    argv = list(sys.argv[1:] if argv is None else argv)
    if [a for a in argv if a != "--debug"] == ["--version"]:  # before the subcommands and the watchdog load torch
        print(f"autotune {__version__}")
        return 0
    if command:
        from autotune.dataset._watchdog import own_the_process

        own_the_process()
        started = process_started()
    # --debug is accepted anywhere before `--`, so `autotune search x.py --debug` works too, while
    # `autotune run -- python train.py --debug` leaves it to the user's program.
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut]
    argv = [a for a in argv[:cut] if a != "--debug"] + argv[cut:]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.debug = debug
    args.started = started
    try:
        settle(args)
        return int(args.func(args) or 0)
    except AutotuneError as exc:
        if debug:  # the traceback too, and the same exit status as without --debug
            traceback.print_exc()
        print(f"autotune: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
    except Stopped as exc:  # SIGTERM, SIGHUP: the search stopped its trials and removed their folders
        print(f"autotune: {exc}", file=sys.stderr)
        return exc.exit_code


