"""Searches sharing one study: heartbeats keep a live search's trials alive and fail a dead one's, and two
real searches on a real PostgreSQL server (a throw-away cluster, tests/postgres.py) lose, duplicate or
wrongly fail no trial and write the same recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import optuna
import pytest

from autotune.diagnose._report import load_trials
from autotune.tuner import _storage
from autotune.tuner._study import _study_name, search

sys.path.insert(0, str(Path(__file__).parent))
from postgres import postgres_url  # noqa: E402,F401 - the session fixture
from test_search_core import FakeRunner, _opts, _setup, _spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
States = optuna.trial.TrialState


def test_a_search_fails_only_dead_searches_trials(tmp_path, monkeypatch):
    monkeypatch.setattr(_storage, "HEARTBEAT_S", 1)
    monkeypatch.setattr(_storage, "GRACE_S", 2)
    setup, spec = _setup(), _spec()
    name = _study_name(setup.probe, setup.hardware, spec, setup.space)
    url = _storage.storage_url(None, tmp_path)
    study = optuna.create_study(study_name=name, storage=_storage.open_storage(url), direction="minimize")
    dead, live = _storage.ask(study), _storage.ask(study)
    study._storage.record_heartbeat(dead._trial_id)  # then nothing: its search was killed
    stop = threading.Event()

    def beat() -> None:  # another search, alive, measuring `live` the whole time
        while not stop.wait(0.5):
            study._storage.record_heartbeat(live._trial_id)

    study._storage.record_heartbeat(live._trial_id)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        time.sleep(2.5)
        outcome = search(spec, _opts(tmp_path), setup=setup, runner=FakeRunner())
        states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
        assert states[dead.number] == States.FAIL
        assert states[live.number] == States.RUNNING  # the old _fail_interrupted failed this one too
        assert outcome.trials >= 1
    finally:
        stop.set()
        thread.join()
    _storage.tell(study, live, 1.0)  # the live search finishes normally
    assert study.get_trials(deepcopy=False)[live.number].state == States.COMPLETE


def test_a_trial_failed_by_another_search_is_not_an_error(tmp_path):
    study = optuna.create_study(storage=_storage.open_storage(_storage.storage_url(None, tmp_path)))
    trial = _storage.ask(study)
    study._storage.set_trial_state_values(trial._trial_id, States.FAIL)  # another search gave up on it
    _storage.set_attr(trial, "reason", "x")
    assert _storage.report(trial, 1.0, 0) is True  # stop measuring
    _storage.tell(study, trial, 1.0)
    assert study.get_trials(deepcopy=False)[0].state == States.FAIL


DATASET = """
import time
import torch
from torch.utils.data import Dataset

class Slowish(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.full((8,), float(i)), i

dataset = Slowish()
batch_size = 8
epochs = 2
"""


def _search(tmp_path: Path, url: str, node: str, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "search", "slowish.py", "--storage", url, "--workdir", f"w-{node}",
         "--output", f"{node}.json", "--caches", "none", "--no-progress", *flags],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _config(path: Path) -> dict:
    (profile,) = json.loads(path.read_text())["profiles"].values()
    return profile["config"]


@pytest.mark.timeout(400)
def test_two_searches_share_one_study_on_postgresql(tmp_path, postgres_url):  # noqa: F811
    (tmp_path / "slowish.py").write_text(textwrap.dedent(DATASET))
    # Four trials each, most of them while the other searches too, and two finalist rounds end each search; the
    # budget is only a loaded machine's wall (40 s ran out at a load of 6 before the default was measured).
    counts = ("--budget", "240s", "--max-trials", "4", "--max-rounds", "2", "--trial-seconds", "1s")
    a = _search(tmp_path, postgres_url, "a", *counts)
    time.sleep(2)
    b = _search(tmp_path, postgres_url, "b", *counts)
    finished: list[str] = []
    deadline = time.monotonic() + 300
    while len(finished) < 2 and time.monotonic() < deadline:
        finished += [node for node, proc in (("a", a), ("b", b)) if node not in finished and proc.poll() is not None]
        time.sleep(0.1)
    for proc in (a, b):
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "leaked" not in err, err

    storage = optuna.storages.RDBStorage(postgres_url)
    (summary,) = optuna.study.get_all_study_summaries(storage=storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    by_search: dict[str, int] = {}
    for t in trials:
        if "search" in t.user_attrs:
            by_search[t.user_attrs["search"]] = by_search.get(t.user_attrs["search"], 0) + 1
    assert len(by_search) == 2 and min(by_search.values()) >= 1, by_search  # both searched the one study
    assert not [t for t in trials if t.state == States.RUNNING]  # none lost
    assert not [t for t in trials if t.state == States.FAIL and "reason" not in t.user_attrs]  # none failed by the other
    measured = [t.user_attrs["config_key"] for t in trials if t.state == States.COMPLETE and not t.user_attrs.get("repeat")]
    assert len(measured) == len(set(measured))  # no point measured twice

    # Either node writes the recipe from the shared study alone, and both write the same one.
    c = _search(tmp_path, postgres_url, "a", "--resume-only", "--output", "a2.json")
    d = _search(tmp_path, postgres_url, "b", "--resume-only", "--output", "b2.json")
    for proc in (c, d):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert _config(tmp_path / "a2.json") == _config(tmp_path / "b2.json")
    # The search that finished last saw every search's finalist runs: its recipe is the study's.
    assert _config(tmp_path / f"{finished[-1]}.json") == _config(tmp_path / "a2.json")
    assert len(study.get_trials(deepcopy=False)) == len(trials)  # --resume-only measured nothing
    print(f"trials per search: {sorted(by_search.values())}; states: "
          f"{sorted((s.name, sum(t.state == s for t in trials)) for s in {t.state for t in trials})}; reasons: "
          f"{sorted({str(t.user_attrs.get('reason', ''))[:60] for t in trials if t.state != States.COMPLETE})}")

    # `autotune report` on a recipe naming a database without Optuna tables creates none there.
    other = postgres_url.rsplit("/", 1)[0] + "/postgres"
    rows, why = load_trials({"name": summary.study_name, "storage": other})
    assert rows is None and "holds no Optuna studies" in why
    import sqlalchemy

    engine = sqlalchemy.create_engine(other)
    with engine.connect() as connection:
        assert sqlalchemy.inspect(connection).get_table_names() == []
    engine.dispose()

