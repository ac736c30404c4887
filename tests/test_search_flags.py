"""Bad flags to `autotune search`: one line naming the problem, exit 2, before any time is spent; and
`autotune report` never creates anything in the storage a recipe names."""

from __future__ import annotations

import json
import sqlite3
import sys
import textwrap

import pytest

from autotune.cli._main import main
from autotune.diagnose._report import load_trials

pytestmark = pytest.mark.timeout(120)

DATASET = """
import torch
from torch.utils.data import Dataset

class Tiny(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.full((4,), float(i)), i

dataset = Tiny()
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "tiny.py").write_text(textwrap.dedent(DATASET))
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "corrupt.json").write_text("{not json")
    (tmp_path / "future.json").write_text(json.dumps({"format": "autotune-recipe", "version": 99, "profiles": {}}))
    (tmp_path / "a_folder.json").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "tiny", raising=False)  # each test's tiny.py is another file
    return tmp_path


@pytest.mark.parametrize("flags, message", [
    (["--storage", "postgresql://nobody@127.0.0.1:1/none"], "Cannot open the study storage postgresql://nobody@"),
    (["--storage", "sqlite:////no/such/folder/studies.db"], "Cannot open the study storage sqlite:"),
    (["--storage", "studies.db"], "is not a database URL"),
    (["--workdir", "a_file"], "--workdir a_file is a file"),
    (["--budget", "inf"], "--budget must be a finite duration"),
    (["--max-memory", "inf"], "Memory size must be a finite size"),
    (["--max-memory", "nan"], "Memory size must be a finite size"),
    (["--max-memory", "0.5"], "under 1 MiB"),
    (["--max-trials", "0"], "--max-trials must be an integer of at least 1, but got 0"),
    (["--max-rounds", "1"], "--max-rounds must be an integer of at least 2, but got 1"),
    (["--trial-seconds", "0"], "--trial-seconds must be a duration such as 1s or 5s, but got '0'"),
    (["--output", "corrupt.json"], "corrupt.json is corrupt: not valid JSON"),
    (["--output", "future.json"], "format version 99, newer than this autotune reads"),
    (["--output", "a_folder.json"], "is a folder"),
    (["--output", "no/such/folder/autotune.json"], "does not exist"),
])
def test_a_bad_flag_is_one_line_and_exit_2_before_searching(folder, capsys, flags, message):
    code = main(["search", "tiny.py", "--budget", "10m", "--no-progress", *flags])  # the last --budget wins
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("autotune: error: ") and message in err, err
    assert "Traceback" not in err
    assert not (folder / ".autotune" / "logs").exists()  # no trial ran


def test_report_creates_no_tables_in_a_foreign_database(tmp_path, capsys):
    """A recipe naming an SQLite file that holds something else: the report reads nothing, writes nothing."""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("create table mine (x int)")
    before = other.read_bytes()
    rows, why = load_trials({"name": "autotune-x", "storage": f"sqlite:///{other}"})
    assert rows is None and "holds no Optuna studies" in why
    missing = tmp_path / "missing.db"
    rows, why = load_trials({"name": "autotune-x", "storage": f"sqlite:///{missing}"})
    assert rows is None and "not on this machine" in why
    assert other.read_bytes() == before and not missing.exists()
    with sqlite3.connect(other) as db:
        assert [r[0] for r in db.execute("select name from sqlite_master")] == ["mine"]
