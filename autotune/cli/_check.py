"""`autotune check [autotune.json]`: does a profile in the recipe match this machine?

Exit 0 with one line when one does; exit 3 with what changed against the nearest profile and the
command that re-tunes when none does (a job script can re-tune before training); exit 2 when the
file is missing or corrupt.
"""

from __future__ import annotations

import argparse

from autotune.errors import AutotuneError, HardwareMismatch, RecipeError
from autotune.machine import _hardware as hardware
from autotune.machine import ranks_per_node
from autotune.recipe._file import RecipeFile, choose_profile, regenerate_command


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        help="exit 0 if the recipe was tuned on this machine, 3 if not",
        description="Exit 0 when a profile in the recipe file matches this machine; exit 3 and "
        "say what changed when none does; exit 2 when the file is missing or corrupt.",
    )
    p.add_argument("recipe", nargs="?", default="autotune.json", help="recipe file (default: autotune.json)")
    p.add_argument("--ranks-per-node", type=int, help="training processes on this node (default: torchrun's "
                   "LOCAL_WORLD_SIZE, else 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rf = RecipeFile.read(args.recipe)
    if not rf.profiles:
        raise RecipeError(f"Recipe file {args.recipe} has no profiles; run `autotune search DATASET` to add one.")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise AutotuneError(f"--ranks-per-node must be at least 1, but got {args.ranks_per_node}.")
    hw = hardware.collect(ranks_per_node=ranks_per_node(args.ranks_per_node))
    profile, changes = choose_profile(rf, hw, on_mismatch="search")
    if not changes and profile.fingerprint == hw["fingerprint"]:
        print(f"{args.recipe}: profile {profile.fingerprint} matches this machine ({hardware.describe(hw)}).")
        return 0
    print(f"{args.recipe}: no profile matches this machine ({hw['fingerprint']}).")
    print(f"This machine: {hardware.describe(hw)}")
    print(f"The nearest profile, {profile.fingerprint}, was tuned on other hardware:")
    for change in changes or ["hardware fingerprint differs"]:
        print(f"  {change}")
    command = regenerate_command(profile)
    if hw.get("ranks_per_node", 1) > 1 and command.startswith("`autotune search "):
        command = command[:-1] + f" --ranks-per-node {hw['ranks_per_node']}`"
    print(f"Re-tune here with {command}.")
    return HardwareMismatch.exit_code
