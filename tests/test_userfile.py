"""The dataset-file contract (docs/architecture.md §1) and every bad input, through the real CLI."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from autotune.cli._main import main
from autotune.dataset._userfile import load_user_file

GOOD = """
import torch
from torch.utils.data import Dataset

class Squares(Dataset):
    def __len__(self):
        return 10
    def __getitem__(self, i):
        return torch.tensor([i * i])

{body}
"""


def write(tmp_path: Path, body: str, name: str | None = None) -> Path:
    # A unique module name per test: the file is imported by name, and sys.modules remembers it.
    name = name or f"ds_{abs(hash(body)) % 10**8}_{tmp_path.name[-12:].replace('-', '_')}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture(autouse=True)
def _forget_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("ds_"):
            del sys.modules[name]


def test_instance_and_hooks_are_read(tmp_path):
    path = write(tmp_path, GOOD.format(body="""
dataset = Squares()
batch_size = 4
epochs = 3
def collate_fn(batch): return batch
def transform(sample): return sample + 1
def train_step(batch): return None
"""))
    spec = load_user_file(str(path))
    assert len(spec.dataset) == 10
    assert (spec.batch_size, spec.epochs) == (4, 3)
    assert spec.collate_fn([1]) == [1]
    assert spec.transform(1) == 2
    assert spec.source == f"{path}:dataset"
    assert spec.sys_path == [str(tmp_path.resolve())]


def test_callable_is_called_and_flags_override(tmp_path):
    path = write(tmp_path, GOOD.format(body="def make():\n    return Squares()\nbatch_size = 4\n"))
    spec = load_user_file(f"{path}:make", batch_size=2, epochs=7)
    assert type(spec.dataset).__name__ == "Squares"
    assert (spec.batch_size, spec.epochs) == (2, 7)


def test_class_is_instantiated(tmp_path):
    path = write(tmp_path, GOOD.format(body=""))
    spec = load_user_file(f"{path}:Squares")
    assert len(spec.dataset) == 10


def test_defaults_without_hooks(tmp_path):
    path = write(tmp_path, GOOD.format(body="dataset = Squares()"))
    spec = load_user_file(str(path))
    assert (spec.batch_size, spec.epochs, spec.collate_fn, spec.transform, spec.train_step) == (32, 10, None, None, None)


BAD = {
    "syntax": ("dataset = (", "does not import: SyntaxError"),
    "import": ("import no_such_module_xyz\ndataset = []", "does not import: ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    "no_attribute": (GOOD.format(body="train_set = Squares()\n"), "has no attribute 'dataset'. Dataset-like names in the file: Squares, train_set."),
    "not_map_style": ("dataset = 42", "is a int, not a dataset: it needs __getitem__(int) and __len__() (map-style), "
                      "or __iter__ as a torch.utils.data.IterableDataset (a stream)."),
    "empty": ("dataset = []", "is empty (len 0)"),
    "getitem_raises": (
        "class D:\n    def __len__(self): return 5\n    def __getitem__(self, i): raise ValueError('broken jpeg')\ndataset = D()",
        "dataset[0] raised ValueError: broken jpeg. Fix the dataset's __getitem__",
    ),
    "bad_batch_size": (GOOD.format(body="dataset = Squares()\nbatch_size = 'big'"), "batch_size in"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_dataset_files_fail_in_one_line(tmp_path, capsys, monkeypatch, case):
    body, expected = BAD[case]
    path = write(tmp_path, body)
    monkeypatch.chdir(tmp_path)
    code = main(["search", str(path), "--budget", "5s", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "autotune.json").exists()


def test_missing_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["search", "nowhere.py"]) == 2
    err = capsys.readouterr().err
    assert err == "autotune: error: No such dataset file: 'nowhere.py'. Pass the path of a Python file that defines 'dataset'.\n"


def test_bad_budget(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, GOOD.format(body="dataset = Squares()"))
    monkeypatch.chdir(tmp_path)
    assert main(["search", str(path), "--budget", "soon"]) == 2
    assert capsys.readouterr().err == (
        "autotune: error: Budget must be a duration such as 90s, 2m, 1m30s or 1h, but got 'soon'.\n"
    )
    assert not (tmp_path / "autotune.json").exists()


def test_debug_shows_the_traceback_and_keeps_the_exit_status(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "dataset = []")
    monkeypatch.chdir(tmp_path)
    assert main(["search", str(path), "--debug"]) == 2  # as without --debug: scripts see one status
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "raise DatasetError(" in err
    assert err.endswith(f"autotune: error: 'dataset' in {path} is empty (len 0); point it at some data before tuning.\n")
