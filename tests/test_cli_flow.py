"""A user's whole path through the CLI: search a dataset file, show the recipe, check it."""

from __future__ import annotations

import json
import textwrap

import pytest

from autotune.cli._main import main

pytestmark = pytest.mark.timeout(240)

DATASET = """
import torch
from torch.utils.data import Dataset

class Ramp(Dataset):
    def __len__(self):
        return 48
    def __getitem__(self, i):
        return torch.arange(16, dtype=torch.float32) + i, i % 3

dataset = Ramp()
batch_size = 8
epochs = 2
"""


def test_search_show_check(tmp_path, monkeypatch, capsys):
    (tmp_path / "ramp_cli.py").write_text(textwrap.dedent(DATASET))
    monkeypatch.chdir(tmp_path)
    code = main(["search", "ramp_cli.py", "--budget", "12s", "--caches", "none", "--no-progress", "--validate"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Best DataLoader settings" in out
    # a tuned recipe compares its epoch with the default's; a default recipe says it is the default's
    assert "x the default's time" in out or "the default's (num_workers=0)" in out
    assert "1.00x" not in out
    assert "Recipe written to autotune.json" in out
    data = json.loads((tmp_path / "autotune.json").read_text())
    (profile,) = data["profiles"].values()
    assert profile["dataset"]["source"] == "ramp_cli.py:dataset"
    assert profile["settings"] == {"batch_size": 8, "epochs": 2}
    # --validate ran the recipe for real and stored predicted against measured.
    assert "first epoch (cold)" in out and "later epoch (warm)" in out
    validation = profile["measured"]["validation"]
    assert validation["predicted_epoch_seconds"] == profile["measured"]["epoch_seconds"]
    assert validation["batches_measured"] == validation["full_batches"] and not validation["extrapolated"]
    assert [e["batches"] for e in validation["epochs"]] == [validation["full_batches"]] * 2

    assert main(["show", "autotune.json"]) == 0
    shown = capsys.readouterr().out
    assert "ramp_cli.py:dataset" in shown and "this machine" in shown

    assert main(["check", "autotune.json"]) == 0
    assert "matches this machine" in capsys.readouterr().out
