"""Each issue-5 benchmark's --quick mode end to end, in subprocesses: it runs, prints a table, and writes
JSON with the expected keys. Timing values are not checked (they are only meaningful on a quiet machine).

Slow on a loaded machine; ``-m "not bench"`` skips it. The four scripts run two at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
MACHINE_KEYS = {"cpu_model", "usable_cpus", "memory_bytes", "torch"}


def _run(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick", *args],
                          capture_output=True, text=True, timeout=500, cwd=str(REPO))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")

    def article_then_cost():
        a = _run("article_table", "--workdir", str(tmp / "article"), "--output", str(tmp / "article_table.json"))
        s = _run("search_cost", "--reuse", str(tmp / "article"), "--output", str(tmp / "search_cost.json"))
        return {"article_table": a, "search_cost": s}

    def the_others():
        return {name: _run(name, "--workdir", str(tmp / name), "--output", str(tmp / f"{name}.json"))
                for name in ("cpu_lstm", "accelerator")}

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(article_then_cost), pool.submit(the_others)]
        procs = {k: v for f in futures for k, v in f.result().items()}
    out = {}
    for name, proc in procs.items():
        path = tmp / f"{name}.json"
        out[name] = (proc, json.loads(path.read_text()) if path.exists() else None)
    return out


def _check(results, name):
    proc, data = results[name]
    assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-3000:]}"
    assert "|---" in proc.stdout, "a Markdown table is printed"
    assert data is not None
    assert data["benchmark"] == name and data["quick"] is True
    assert MACHINE_KEYS <= set(data["machine"])
    assert {"repeats", "table_markdown", "notes", "wall_s"}.issubset(data)
    return data


ROW_KEYS = {"epoch_s", "setup_s", "total_s", "first_over_steady", "runs", "repeats"}


def test_article_table(results):
    data = _check(results, "article_table")
    assert set(data["rows"]) == {"A", "B", "C", "D", "autotune", "oracle"}
    for name, row in data["rows"].items():
        assert ROW_KEYS <= set(row), name
        assert len(row["epoch_s"]) == 3
        assert row["peak_pss_bytes"], f"{name}: the memory pass gave a peak"
        assert row["runs"][0]["eviction"]["before_epoch1"]["files"] > 0
    assert "autotune_over_row" in data["rows"]["A"]
    assert {"wall_s", "config", "trial_log", "study"}.issubset(data["search"])
    assert {"points", "cost_s", "best", "evaluated"}.issubset(data["grid"])


def test_search_cost(results):
    data = _check(results, "search_cost")
    assert {"value_s", "config"}.issubset(data["oracle"])
    assert {"points", "cost_s"}.issubset(data["grid"])
    for method in ("autotune", "random"):
        assert {"seconds_to_within", "share_of_grid", "trials"}.issubset(data[method])
    assert data["random"]["trials"], "the random sampler measured something"


def test_cpu_lstm(results):
    data = _check(results, "cpu_lstm")
    assert set(data["rows"]) == {"default", "autotune"}
    for row in data["rows"].values():
        assert ROW_KEYS | {"later_epochs_s", "torch_threads"} <= set(row)
    assert {"wall_s", "config"}.issubset(data["search"])


def test_accelerator(results):
    data = _check(results, "accelerator")
    assert data["compute"]
    for entry in data["compute"]:
        assert set(entry["rows"]) == {"default", "B", "autotune"}
        for row in entry["rows"].values():
            assert {"utilisation", "utilisation_epochs_only", "total_s"}.issubset(row)
            assert 0 < row["utilisation"]["median"] <= 1.0
