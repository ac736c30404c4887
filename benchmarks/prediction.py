"""The recipe's figure against the run the user gets, before and after the search learns from the factory.

For each bundled example, as a user runs it: ``autotune search`` (``--budget``), then ``--repeats`` runs of
``autotune validate`` (a fresh process, the factory from a cold start, the recipe's epochs), each stored in
the recipe, so the machine's profile keeps what the factory took; then ``autotune search`` again, which
predicts from those runs, and ``--repeats`` validations of copies of its recipe (not stored back, so
they check the learned figure without teaching it). Per phase: the prediction, the median measured, and
the error ``(measured - predicted) / predicted``.

    python benchmarks/prediction.py [--budget 60] [--repeats 3] [--examples jpeg_folder hf_arrow ...] [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import EXAMPLES, REPO, output

NAME = "prediction"
EXAMPLE_TARGETS = {"jpeg_folder": "jpeg_folder.py", "hf_arrow": "hf_arrow.py",
                   "lightning_datamodule": "lightning_datamodule.py:MyDataModule"}
PHASES = ("build", "first_epoch", "epoch", "total")


def _autotune(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "autotune", *args], cwd=str(REPO), env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"autotune {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")
    return done


def _profile(path: Path) -> dict:
    (profile,) = json.loads(path.read_text())["profiles"].values()
    return profile


def _validations(target: str, recipe: Path, repeats: int, store: bool, env: dict[str, str]) -> list[dict]:
    runs = []
    for r in range(repeats):
        path = recipe if store else recipe.with_name(f"check-{r}.json")
        if not store:
            shutil.copy(recipe, path)
        _autotune(["validate", target, "--recipe", str(path)], env)
        v = _profile(path)["measured"]["validation"]
        runs.append({k: (v.get(f"predicted_{k}_seconds"), v[f"measured_{k}_seconds"]) for k in PHASES})
    return runs


def _summary(runs: list[dict]) -> dict:
    out = {}
    for k in PHASES:
        predicted = runs[0][k][0]
        measured = statistics.median(r[k][1] for r in runs)
        out[k] = {"predicted_s": predicted, "measured_s": measured, "measured_runs": [r[k][1] for r in runs],
                  "error_percent": (measured - predicted) / predicted * 100 if predicted else None}
    return out


def one_example(name: str, args, work: Path, env: dict[str, str]) -> dict:
    target = str(EXAMPLES / EXAMPLE_TARGETS[name])
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    recipe = folder / "autotune.json"
    search = ["search", target, "--budget", f"{args.budget}s", "--output", str(recipe), "--no-progress",
              "--workdir", str(folder / ".autotune")]
    result = {}
    for stage in ("first", "learned"):
        output.say(f"{name}: {stage} search ...")
        _autotune(search, env)
        profile = _profile(recipe)
        notes = [n for n in profile["measured"].get("notes", []) if n.startswith("predicted from runs of the factory")]
        output.say(f"{name}: {stage} validations ...")
        runs = _validations(target, recipe, args.repeats, store=stage == "first", env=env)
        result[stage] = {"config": profile["config"], "factory_note": notes[0] if notes else None,
                         "phases": _summary(runs)}
    result["factory_runs_kept"] = len(_profile(recipe).get("factory_runs", []))
    return result


def _cell(phase: dict) -> str:
    err = phase["error_percent"]
    return f"{phase['predicted_s']:.2f} → {phase['measured_s']:.2f}" + (f" ({err:+.0f}%)" if err is not None else "")


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--budget", type=float, default=60.0, help="each search's budget, seconds")
    p.add_argument("--examples", nargs="+", choices=sorted(EXAMPLE_TARGETS), default=list(EXAMPLE_TARGETS))
    args = p.parse_args(argv)
    started = time.perf_counter()
    work = output.workdir(args.workdir, NAME)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if args.quick:
        args.budget, args.examples = min(args.budget, 30.0), ["jpeg_folder"]
        env.update(AUTOTUNE_EXAMPLE_IMAGES="64", AUTOTUNE_EXAMPLE_DIR=str(work / "data"))
    args.repeats = args.repeats or (1 if args.quick else 3)
    results = {name: one_example(name, args, work, env) for name in args.examples}
    rows = [[name, stage, *(_cell(r[stage]["phases"][k]) for k in PHASES)]
            for name, r in results.items() for stage in ("first", "learned")]
    table = output.markdown_table(["example", "search", "build, s", "first epoch, s", "steady epoch, s",
                                   "whole run, s"], rows)
    notes = [f"predicted → measured (median of {args.repeats} fresh-process validations), error = (measured − "
             f"predicted) / predicted; each search {args.budget:.0f} s. 'first': a search with no factory runs; "
             "'learned': the next search, after the first search's validations were stored"]
    for name, r in results.items():
        note = r["learned"]["factory_note"]
        notes.append(f"{name}: " + (note if note else "the learned search chose a configuration no run stands for"))
    return output.finish(NAME, args, started, [table], notes, {"budget_s": args.budget, "repeats": args.repeats,
                                                               "examples": results})


if __name__ == "__main__":
    sys.exit(main())
