"""Bad samples get one line naming the sample and exit 2, before any trial: None, a sample no collate can
batch, a __len__ larger than what __getitem__ serves (9eac6c3: tracebacks from default_collate and from the
determinism check)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from autotune.cli._main import main

pytestmark = pytest.mark.timeout(120)

DATASET = """
import torch
from torch.utils.data import Dataset

class Bad(Dataset):
    def __len__(self):
        return {length}
    def __getitem__(self, i):
        if i >= 40:
            raise IndexError("list index out of range")
        return {sample}

dataset = Bad()
batch_size = 8
"""


@pytest.mark.parametrize("length, sample, message", [
    (40, "None", "returned None, which no DataLoader can batch"),
    (40, "(torch.zeros(2), None)", "torch's default_collate cannot batch dataset["),
    (40, "torch.zeros(i % 3 + 1)", "torch's default_collate cannot batch dataset["),
    (64, "torch.zeros(2)", "] raised IndexError: list index out of range. Does __len__ (64) promise more"),
])
def test_a_bad_sample_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, length, sample, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "bad", raising=False)
    (tmp_path / "bad.py").write_text(textwrap.dedent(DATASET.format(length=length, sample=sample)))
    code = main(["search", "bad.py", "--budget", "30s", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / ".autotune" / "logs").exists() or not any((tmp_path / ".autotune" / "logs").rglob("*.log"))
