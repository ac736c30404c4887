"""`autotune check [autotune.json]`: does a profile in the recipe match this machine?

Exit 0 with one line when one does; exit 3 with what changed against the nearest profile and the
command that re-tunes when none does (a job script can re-tune before training); exit 2 when the
file is missing or corrupt.
"""

from __future__ import annotations

import argparse

from autotune.cli._options import add_profile_options, print_json
from autotune.errors import HardwareMismatch, RecipeError
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
    add_profile_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rf = RecipeFile.read(args.recipe)
    if not rf.profiles:
        raise RecipeError(f"Recipe file {args.recipe} has no profiles; run `autotune search DATASET` to add one.")
    hw = hardware.collect(ranks_per_node=ranks_per_node(args.ranks_per_node))
    profile, changes = choose_profile(rf, hw, on_mismatch="search")
    matches = not changes and profile.fingerprint == hw["fingerprint"]
    command = regenerate_command(profile)
    if hw.get("ranks_per_node", 1) > 1 and command.startswith("`autotune search "):
        command = command[:-1] + f" --ranks-per-node {hw['ranks_per_node']}`"
    if args.json:
        print_json({"recipe": str(args.recipe), "matches": matches, "machine": hw["fingerprint"],
                    "profile": profile.fingerprint, "changes": [] if matches else (changes or
                                                                                   ["hardware fingerprint differs"]),
                    "retune": None if matches else command.strip("`")})
        return 0 if matches else HardwareMismatch.exit_code
    if matches:
        print(f"{args.recipe}: profile {profile.fingerprint} matches this machine ({hardware.describe(hw)}).")
        return 0
    print(f"{args.recipe}: no profile matches this machine ({hw['fingerprint']}).")
    print(f"This machine: {hardware.describe(hw)}")
    print(f"The nearest profile, {profile.fingerprint}, was tuned on other hardware:")
    for change in changes or ["hardware fingerprint differs"]:
        print(f"  {change}")
    print(f"Re-tune here with {command}.")
    return HardwareMismatch.exit_code
