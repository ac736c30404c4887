"""One command-line vocabulary: the recipe path spelled the same in every subcommand (the older
spellings still work, hidden), ``--json`` wherever a command reports, ``--no-progress`` wherever there
is progress, ``--ranks-per-node`` wherever a profile is chosen; an error's exit status never depends on
``--debug``."""

from __future__ import annotations

import json

import pytest
from test_show_check import make_profile, other_machine

from autotune.cli._main import build_parser, main
from autotune.cli._options import settle
from autotune.machine import _hardware as hardware
from autotune.recipe._file import RecipeFile

# every subcommand that reads or writes a recipe, with what else it needs to parse
READS_A_RECIPE = {"search": ["data.py"], "show": [], "check": [], "report": [], "run": ["--", "true"],
                  "validate": ["data.py"]}
REPORTS = [["search", "data.py"], ["show"], ["check"], ["report"], ["run", "--dry-run", "--", "true"],
           ["validate", "data.py"], ["diagnose", "data.py"], ["cache", "list"], ["cache", "clear"]]
CHOOSES_A_PROFILE = [["show"], ["check"], ["run", "--", "true"], ["validate", "data.py"], ["search", "data.py"],
                     ["report"], ["diagnose", "data.py", "--recipe", "autotune.json"]]
HAS_PROGRESS = [["search", "data.py"], ["diagnose", "data.py"]]


def _parse(argv):
    args = build_parser().parse_args(argv)
    settle(args)
    return args


def _with(command, rest, *flags):
    """``flags`` after the subcommand (before a ``--`` that starts run's command)."""
    cut = rest.index("--") if "--" in rest else len(rest)
    return [*command, *rest[:cut], *flags, *rest[cut:]]


@pytest.mark.parametrize("command", sorted(READS_A_RECIPE))
@pytest.mark.parametrize("flag", ["-r", "--recipe"])
def test_every_subcommand_takes_the_recipe_as_dash_r_or_recipe(command, flag):
    assert _parse(_with([command], READS_A_RECIPE[command], flag, "mine.json")).recipe == "mine.json"
    assert _parse(_with([command], READS_A_RECIPE[command])).recipe == "autotune.json"


@pytest.mark.parametrize("argv", [["show", "old.json"], ["check", "old.json"], ["report", "old.json"],
                                  ["search", "data.py", "-o", "old.json"], ["search", "data.py", "--output", "old.json"]])
def test_the_older_spellings_still_name_the_recipe_and_are_not_advertised(argv, capsys):
    assert _parse(argv).recipe == "old.json"
    with pytest.raises(SystemExit):
        build_parser().parse_args([argv[0], "--help"])
    shown = capsys.readouterr().out
    assert "-r PATH, --recipe PATH" in shown and "--output" not in shown and "RECIPE" not in shown


def test_dash_o_is_nobodys_visible_option_and_reports_html_is_named_html(capsys):
    assert _parse(["report", "--html", "r.html"]).html == "r.html"
    assert _parse(["report", "-o", "r.html"]).html == "r.html"  # the older spelling
    for command in ("search", "report"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        assert " -o" not in capsys.readouterr().out


def test_two_different_recipe_files_are_refused_in_one_line(tmp_path, capsys):
    assert main(["show", "a.json", "--recipe", "b.json"]) == 2
    assert "Two recipe files given (a.json and --recipe b.json)" in capsys.readouterr().err


@pytest.mark.parametrize("argv", REPORTS, ids=lambda a: " ".join(a[:2]))
def test_json_wherever_a_command_reports(argv):
    assert _parse(_with(argv[:2] if argv[0] == "cache" else argv[:1], argv[2:] if argv[0] == "cache" else argv[1:],
                        "--json")).json is True


@pytest.mark.parametrize("argv", CHOOSES_A_PROFILE, ids=lambda a: a[0])
def test_ranks_per_node_wherever_a_profile_is_chosen(argv, capsys):
    assert _parse(_with(argv[:1], argv[1:], "--ranks-per-node", "4")).ranks_per_node == 4
    assert main(_with(argv[:1], argv[1:], "--ranks-per-node", "0")) == 2
    assert "--ranks-per-node must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv", HAS_PROGRESS, ids=lambda a: a[0])
def test_no_progress_wherever_there_is_progress(argv):
    assert _parse([*argv, "--no-progress"]).progress is False


def test_show_and_check_report_in_json_for_the_profile_of_the_ranks_asked(tmp_path, capsys):
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(hardware.collect(ranks_per_node=2), 1))
    assert main(["check", "-r", str(path), "--json"]) == 3  # one process alone is another setting
    alone = json.loads(capsys.readouterr().out)
    assert alone["matches"] is False and "--ranks-per-node 1" not in alone["retune"]
    assert main(["check", "-r", str(path), "--ranks-per-node", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matches"] is True
    assert main(["show", "-r", str(path), "--ranks-per-node", "2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["machine"] == hardware.collect(ranks_per_node=2)["fingerprint"]
    assert shown["machine"] in shown["profiles"]


def test_run_dry_run_json_names_the_environment_and_the_command(tmp_path, capsys):
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(hardware.collect(), 1))
    assert main(["run", "-r", str(path), "--dry-run", "--json", "--", "python", "train.py"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["command"] == ["python", "train.py"] and isinstance(out["env"], dict)
    assert main(["run", "-r", str(path), "--json", "--", "true"]) == 2  # a started command's output is its own


@pytest.mark.parametrize("debug", [[], ["--debug"]], ids=["plain", "debug"])
def test_an_errors_exit_status_is_the_same_with_debug(tmp_path, capsys, debug):
    assert main([*debug, "check", "-r", str(tmp_path / "missing.json")]) == 2  # RecipeError
    mismatched = tmp_path / "other.json"
    RecipeFile.merge_write(mismatched, make_profile(other_machine(), 8))
    assert main([*debug, "run", "-r", str(mismatched), "--on-mismatch", "error", "--dry-run", "--", "true"]) == 3
    err = capsys.readouterr().err
    assert err.count("autotune: error:") == 2
    assert ("Traceback (most recent call last)" in err) == bool(debug)


def test_report_shows_the_profile_of_the_ranks_asked(tmp_path, capsys):
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(hardware.collect(ranks_per_node=2), 1))
    html = str(tmp_path / "r.html")
    assert main(["report", "-r", str(path), "--html", html, "--json"]) == 0  # one process alone: the nearest
    assert any(n.startswith("No profile was tuned on this machine") for n in json.loads(capsys.readouterr().out)["notes"])
    assert main(["report", "-r", str(path), "--html", html, "--ranks-per-node", "2", "--json"]) == 0
    assert not any(n.startswith("No profile") for n in json.loads(capsys.readouterr().out)["notes"])
