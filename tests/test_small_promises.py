"""Small promises a new user checks first: hints name the package that installs autotune, the recipe's lock
never lands in the user's repository, `show` finds a torchrun rank's profile as `check` does, trial logs
are kept per study, and a Hugging Face Arrow dataset is not taken for one with per-epoch state."""

from __future__ import annotations

import re
from pathlib import Path

from test_search_core import FakeRunner, _opts, _setup, _spec
from test_show_check import make_profile

from autotune.cli._main import main
from autotune.dataset._statefulness import epoch_state_warning
from autotune.machine import _hardware as hardware
from autotune.recipe._file import RecipeFile, recipe_lock_path
from autotune.tuner._study import search

ROOT = Path(__file__).resolve().parents[1]


def test_every_install_hint_names_dataloader_autotune():
    """On 9eac6c3: `pip install 'autotune[report]'`, `pip install -U autotune` (another PyPI package)."""
    hints = []
    for path in [*(ROOT / "autotune").rglob("*.py"), ROOT / "README.md"]:
        hints += re.findall(r"pip install[^`\"\n)]*", path.read_text())
    ours = [h for h in hints if re.search(r"\bautotune\b|\.\[|\"\.", h) and "optuna" not in h]
    assert ours and all("dataloader-autotune" in h or h.strip().startswith("pip install .") for h in ours), ours


def test_the_recipe_lock_lives_beside_the_cache_root_not_the_repository(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache" / "autotune"))
    RecipeFile.merge_write(repo / "autotune.json", make_profile(hardware.collect(), 1))
    assert sorted(p.name for p in repo.iterdir()) == ["autotune.json"]  # 9eac6c3 left .autotune.json.lock
    lock = recipe_lock_path(repo / "autotune.json")
    assert lock.is_file() and lock.parent == tmp_path / "cache" / "autotune-locks"
    assert not (tmp_path / "cache" / "autotune").exists()  # the cache root itself is left alone


def test_show_finds_a_torchrun_ranks_profile(tmp_path, monkeypatch, capsys):
    """Inside a torchrun job of 2 ranks per node: 9eac6c3's `show` said "No profile matches" while `check` found it."""
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(hardware.collect(ranks_per_node=2), 1))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "<- this machine" in out and "No profile matches" not in out
    assert main(["check", str(path)]) == 0


def test_trial_logs_are_kept_per_study(tmp_path):
    """Two studies in one work folder (two datasets): 9eac6c3 wrote both studies' trial 0 to logs/trial-0.log."""
    runner = FakeRunner()
    logs = []

    class Logged(FakeRunner):
        def run(self, config, plan, *, log_path=None, **kw):
            logs.append(log_path)
            return runner.run(config, plan, **kw)

    one = search(_spec(), _opts(tmp_path, max_trials=1), setup=_setup(), runner=Logged())
    other_setup = _setup()
    other_setup.probe = type(other_setup.probe)(**{**other_setup.probe.__dict__, "fingerprint": "e" * 16})
    two = search(_spec(), _opts(tmp_path, max_trials=1), setup=other_setup, runner=Logged())
    first, second = [Path(p) for p in logs if p]
    assert first != second and first.name == second.name == "trial-0.log"
    assert first.parent.name == one.study["name"] and second.parent.name == two.study["name"]


def test_a_hugging_face_arrow_dataset_keeps_no_per_epoch_state():
    """Its table read as an array of objects gave two digests for one unchanged table (9eac6c3: a false
    "keeps per-epoch state (_data)" note, and persistent workers never tried)."""
    import datasets

    # under 1 MiB, so its table is digested, not taken by identity; floats and nested rows are new objects
    # at every conversion (ints and interned strings happened to be the same ones)
    ds = datasets.Dataset.from_dict({"x": [i + 0.5 for i in range(64)], "pair": [[1.5, 2.5]] * 64})
    assert epoch_state_warning(ds) is None
    assert epoch_state_warning(ds.with_format("torch")) is None


def test_an_object_attribute_that_really_changes_is_still_seen():
    """The neighbour: a dataset that appends to a list or bumps a small array as it reads keeps state."""
    import numpy as np

    class Counts:
        def __init__(self):
            self.seen = np.zeros(8)

        def __len__(self):
            return 8

        def __getitem__(self, i):
            self.seen[i] += 1
            return i

    assert "seen" in (epoch_state_warning(Counts()) or "")
