"""A hand-edited or hostile recipe gets one line and exit 2 from every command that reads it, and a
RecipeError (never a traceback from deep inside) from the factory."""

from __future__ import annotations

import json

import pytest

import autotune
from autotune.cli import main
from autotune.errors import RecipeError
from autotune.machine import _hardware as hardware


def _recipe(path, measured=None, **config_changes):
    hw = hardware.collect()
    config = {"num_workers": 0, "cache": None, "allocator": "glibc", **config_changes}
    path.write_text(json.dumps({"format": "autotune-recipe", "version": 2, "profiles": {hw["fingerprint"]: {
        "hardware": hw, "dataset": {"source": "data.py", "length": 10}, "settings": {"batch_size": 4},
        "config": config, "measured": measured or {}}}}))
    return path


HOSTILE = {
    "workers a word": ({"num_workers": "two"}, "num_workers must be an integer from 0 to 1024, but got 'two'"),
    "a billion threads": ({"main_threads": 10**9}, "main_threads must be an integer from 1 to 4096"),
    "a path for a cache": ({"cache": "/etc/passwd"}, "cache must be one of memory, pickle, hdf5, lmdb"),
    "an escape sequence": ({"allocator": "glibc\u001b[2J"}, "control characters"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("command", [["show"], ["check"], ["run", "--dry-run", "--recipe"], ["report"]])
def test_every_command_says_one_line_and_exits_2(tmp_path, capsys, name, command):
    changes, message = HOSTILE[name]
    path = _recipe(tmp_path / "autotune.json", **changes)
    argv = [*command, str(path)] + (["--", "true"] if command[0] == "run" else [])
    if command[0] == "report":
        argv += ["--output", str(tmp_path / "report.html")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autotune: error: ") and message in err
    assert "Traceback" not in err


def test_measured_figures_are_checked_too(tmp_path, capsys):
    path = _recipe(tmp_path / "autotune.json", measured={"peak_memory_bytes": "lots"})
    assert main(["show", str(path)]) == 2
    assert "measured.peak_memory_bytes must be a non-negative integer, but got 'lots'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_factory_raises_a_recipe_error(tmp_path, name):
    changes, message = HOSTILE[name]
    path = _recipe(tmp_path / "autotune.json", **changes)
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        autotune.dataloader(list(range(10)), path)


def _deep(path, depth: int, where: str):
    """A recipe ~200 KB deep in ``where`` (brackets only): json's decoder or a later walk runs out of stack."""
    hw = hardware.collect()
    nested = "[" * depth + "]" * depth
    profile = {"hardware": hw, "dataset": {"source": "data.py", "length": 10}, "settings": {"batch_size": 4},
               "config": {"num_workers": 0}, "measured": {}}
    text = json.dumps({"format": "autotune-recipe", "version": 2, "profiles": {hw["fingerprint"]: profile}})
    marker = json.dumps(profile[where]) if where != "profiles" else None
    if marker is None:
        text = text.replace('"profiles": {', '"profiles": {"x": ' + nested + ", ", 1)
    else:
        text = text.replace(f'"{where}": {marker}', f'"{where}": {nested}', 1)
    path.write_text(text)
    return path


@pytest.mark.parametrize("depth, where", [(100_000, "profiles"), (100_000, "settings"), (900, "measured")])
@pytest.mark.parametrize("command", [["show"], ["check"], ["search", "tiny.py", "--no-progress", "-o"]])
def test_a_deeply_nested_recipe_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, depth, where, command):
    """On 9eac6c3 a RecursionError traceback from show, check, search -o and the factory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.py").write_text("dataset = list(range(8))\n")
    path = _deep(tmp_path / "autotune.json", depth, where)
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autotune: error: ") and "autotune.json" in err, err
    with pytest.raises(RecipeError):
        autotune.dataloader(list(range(8)), path)
