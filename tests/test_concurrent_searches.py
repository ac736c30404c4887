"""Any number of searches may start at once on one new work folder or database: creating the storage is
serialised (SQLite: a file lock) or retried (PostgreSQL: the unique violation of two creators), every
search runs, and the one recipe file they share ends with one whole profile. On 9eac6c3 one of three exited
2 ("table alembic_version already exists"; PostgreSQL: UniqueViolation on pg_type)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from postgres import postgres_url  # noqa: E402,F401 - the session fixture

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(400)

DATASET = """
import torch
from torch.utils.data import Dataset

class Tiny(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return torch.full((8,), float(i)), i

dataset = Tiny()
batch_size = 8
epochs = 1
"""


def _three_at_once(tmp_path: Path, *flags: str) -> list[subprocess.CompletedProcess[str]]:
    # Two trials each end them (what is raced is the storage's creation at the start and the recipe's write at
    # the end, not the trials between); the budget is only a generous wall: three interpreters importing torch
    # at once on 2 loaded CPUs spent all of 60 s preparing before any of them measured the default
    (tmp_path / "tiny.py").write_text(textwrap.dedent(DATASET))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-m", "autotune", "search", "tiny.py", "--budget", "240s", "--caches",
                               "none", "--max-workers", "1", "--max-trials", "2", "--no-progress", *flags],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=300), *p.communicate()) for p in procs]


def _trials_per_search(storage: str) -> list[int]:
    (summary,) = optuna.study.get_all_study_summaries(storage=storage)
    trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)
    per: dict[str, int] = {}
    for t in trials:
        if "search" in t.user_attrs:  # asked by a search (enqueued priors nobody asked for have none)
            per[t.user_attrs["search"]] = per.get(t.user_attrs["search"], 0) + 1
    return sorted(per.values())


def _check(tmp_path: Path, runs: list[subprocess.CompletedProcess[str]], storage: str) -> None:
    assert [r.returncode for r in runs] == [0, 0, 0], [r.stderr[-600:] for r in runs]
    assert not any("Traceback" in r.stderr for r in runs)
    per = _trials_per_search(storage)
    assert len(per) == 3 and min(per) >= 1, per
    profiles = json.loads((tmp_path / "autotune.json").read_text())["profiles"]
    assert len(profiles) == 1  # one machine, one profile, written whole by each in turn
    print(f"exit codes {[r.returncode for r in runs]}, trials per search {per}")


def test_three_searches_at_once_on_a_new_workdir(tmp_path):
    runs = _three_at_once(tmp_path, "--workdir", "fresh")
    _check(tmp_path, runs, f"sqlite:///{tmp_path / 'fresh' / 'studies.db'}")


def test_three_searches_at_once_on_a_new_postgresql_database(tmp_path, postgres_url):  # noqa: F811
    """``postgresql://`` is SQLAlchemy's psycopg 3 (the fleet extra); the other tests spell psycopg2."""
    import sqlalchemy

    server = postgres_url.rsplit("/", 1)[0]
    engine = sqlalchemy.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text("CREATE DATABASE fresh_three"))
    engine.dispose()
    url = f"{server}/fresh_three".replace("postgresql+psycopg2://", "postgresql://")
    runs = _three_at_once(tmp_path, "--storage", url)
    _check(tmp_path, runs, url)
