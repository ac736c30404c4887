"""Every benchmark's --quick mode end to end, through ``benchmarks/run_all.py --quick`` (what ``make bench``
runs, in smoke-test sizes): each script runs, prints a table, and writes JSON with the expected keys.
Timing values are not checked (they are only meaningful on a quiet machine).

Slow on a loaded machine; ``-m "not bench"`` skips it. The scripts run in two groups side by side.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autotune._units import format_bytes
from autotune.machine import usable_cpus
from autotune.process import _family as allocators

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
_spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
run_all = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_all)

# search_cost reuses article_table's search, so they share a group; the groups take about as long (2026-12-01,
# load average 9: 970 s and 1036 s before accelerator, 117 s, moved to the first; since then article_table runs 7
# fewer processes). cpu_lstm writes no JPEGs while article_table does; accelerator's 64 are among its 128.
GROUPS = (("article_table", "search_cost", "accelerator", "cache_memory", "prediction", "adapt"),
          ("cpu_lstm", "allocators", "process_settings", "cache_fill", "memory_limit", "provenance", "epoch_one"))
MACHINE_KEYS = {"cpu_model", "usable_cpus", "memory_bytes", "torch", "described", "fingerprint"}
TIMEOUT = 1200  # a hang's limit; on a quiet 2-CPU machine the whole module takes a few minutes
ROW_KEYS = {"epoch_s", "setup_s", "total_s", "first_over_steady", "runs", "repeats"}


def test_run_all_runs_every_script():
    scripts = {p.stem for p in BENCH.glob("*.py")} - {"run_all"}
    assert set(run_all.ORDER) == scripts
    assert {name for group in GROUPS for name in group} == scripts


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")

    def group(names):
        proc = subprocess.Popen([sys.executable, str(BENCH / "run_all.py"), "--quick", "--results", str(tmp),
                                 "--only", *names], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=str(REPO), start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT - 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # run_all and the script it was running, with its workers
            out, err = proc.communicate()
        print(out.rstrip().split("\n\n")[-1], flush=True)  # run_all's seconds per script
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    with ThreadPoolExecutor(len(GROUPS)) as pool:
        procs = dict(zip(GROUPS, pool.map(group, GROUPS), strict=True))
    out = {}
    for names, proc in procs.items():
        for name in names:
            path = tmp / f"{name}.json"
            out[name] = (proc, json.loads(path.read_text()) if path.exists() else None)
    return out


def _check(results, name):
    proc, data = results[name]
    assert data is not None, f"{name} wrote no JSON:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert f"{name} FAILED" not in proc.stdout, f"{name} failed:\n{proc.stderr[-3000:]}"
    assert f"## {name}" in proc.stdout
    assert data["benchmark"] == name and data["quick"] is True
    assert MACHINE_KEYS <= set(data["machine"])
    assert set(data).issuperset({"repeats", "table_markdown", "notes", "wall_s", "date"})
    assert "|---" in data["table_markdown"] and data["table_markdown"] in proc.stdout
    return data


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_article_table(results):
    data = _check(results, "article_table")
    assert set(data["rows"]) == {"A", "B", "C", "D", "autotune", "oracle", "floor"}
    for name, row in data["rows"].items():
        assert ROW_KEYS <= set(row), name
        assert len(row["epoch_s"]) == 3
        assert row["peak_pss_bytes"], f"{name}: the memory pass gave a peak"
        assert row["runs"][0]["eviction"]["before_epoch1"]["files"] > 0
    assert "autotune_over_row" in data["rows"]["A"]
    floor = data["rows"]["floor"]
    assert floor["over_floor"] == 1.0 and floor["runs"][0]["parts_s"]["decode"] > 0
    assert all(row["over_floor"] == row["total_s"]["median"] / floor["total_s"]["median"]
               for row in data["rows"].values())
    assert "row total ÷ floor" in data["table_markdown"]
    keep = floor["keep"]  # what the floor does not count: the samples' bytes written into fresh memory once
    assert keep["keep_s"] > 0 and keep["floor_plus_keep_s"] == floor["total_s"]["median"] + keep["keep_s"]
    assert any(note.startswith("floor plus keeping the samples: ") for note in data["notes"])
    assert set(data["search"]).issuperset({"wall_s", "config", "trial_log", "study", "measured"})
    assert {"points", "cost_s", "best", "evaluated"} <= set(data["grid"])


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_search_cost(results):
    data = _check(results, "search_cost")
    assert {"value_s", "config"} <= set(data["oracle"])
    assert {"points", "cost_s"} <= set(data["grid"])
    for method in ("autotune", "random"):
        assert set(data[method]).issuperset({"seconds_to_within", "share_of_grid", "seconds_to_found", "trials"})
    assert data["random"]["trials"], "the random sampler measured something"


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_process_settings(results):
    data = _check(results, "process_settings")
    assert data["paths"], "--quick searches one loading path"
    for path in data["paths"]:
        assert {"path", "picked", "allocator", "epoch_s", "default_epoch_s", "search_s"} <= set(path)
    assert set(data["article"]["rows"]) == {"with process settings", "glibc defaults only"}
    for row in data["article"]["rows"].values():
        assert ROW_KEYS <= set(row)


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_cpu_lstm(results):
    data = _check(results, "cpu_lstm")
    assert set(data["rows"]) == {"default", "autotune"}
    for row in data["rows"].values():
        assert ROW_KEYS | {"later_epochs_s", "torch_threads"} <= set(row)
    assert set(data["search"]).issuperset({"wall_s", "config", "measured"})


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_accelerator(results):
    data = _check(results, "accelerator")
    assert data["compute"]
    assert data["steps_per_run"] == 16  # --quick: 64 JPEGs at batch 8, 2 epochs
    for entry in data["compute"]:
        assert set(entry["rows"]) == {"default", "grid", "autotune"}
        assert set(entry["grid"]).issuperset({"best", "points", "evaluated"})
        assert set(entry["search"]).issuperset({"wall_s", "config", "measured"})
        for row in entry["rows"].values():
            assert set(row).issuperset({"au", "au_steady", "first_step_s", "steps", "total_s", "epoch_s"})
            assert row["steps"]["median"] == data["steps_per_run"]
            assert 0 < row["au"]["median"] <= row["au_steady"]["median"] <= 1.0
    for verdict in data["verdict"].values():
        assert set(verdict) == {"grid_reaches_at_ms", "recipe_short_at_ms", "holds"}
    assert sum("AU where the grid's best does" in note for note in data["notes"]) == 2  # whole run, steady


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_memory_limit(results):
    data = _check(results, "memory_limit")
    if data.get("skipped"):  # not root, or no memory controller: said, and nothing measured
        assert data["cases"] == [] and "cannot make a memory cgroup here" in data["notes"][0]
        return
    [case] = data["cases"]
    assert case["case"] == "decoded" and case["images"] == 128 and case["limit_bytes"] == int(1.2 * 2**30)
    assert set(case["rows"]) == {"plain", "C", "autotune", "grid"}
    assert "memory.limit_in_bytes" in case["limit"]["source"] or "memory.max" in case["limit"]["source"]
    assert set(case["search"]).issuperset({"wall_s", "config", "measured", "cgroup"})
    assert {"points", "best", "evaluated"} <= set(case["grid"])
    budget = format_bytes(case["memory_budget"])  # the search's: the grid is judged by the search's own plan
    for point in case["grid"]["evaluated"]:
        assert "memory budget" not in point.get("failed", "") or f"memory budget of {budget}" in point["failed"]
    for name, row in case["rows"].items():
        assert set(row).issuperset({"au", "au_steady", "total_s", "epoch_s", "cgroup_peak_bytes", "oom_killed"}), name
        assert row["oom_killed"] == 0, name  # 128 JPEGs fit: nothing is killed
        assert 0 < row["au"]["median"] <= row["au_steady"]["median"] <= 1.0
        assert 0 < row["cgroup_peak_bytes"]["median"] <= case["limit_bytes"]


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_adapt(results):
    data = _check(results, "adapt")
    assert set(data["scenarios"]) == {"mismatch", "competitor", "phase", "no_regret"}
    assert data["search"]["note"] == "--quick: the usual advice, no search"
    for name, scenario in data["scenarios"].items():
        assert set(scenario["rows"]) == {"fixed recipe", "adapt=True", "grid best"}, name
        assert scenario["grid"]["points"] == len(data["grid"][name]) and scenario["grid"]["best"]["total_s"] > 0
        for row, runs in scenario["rows"].items():
            assert len(runs) == 1 and len(runs[0]["epoch_s"]) == 4, (name, row)
        assert [h["epoch"] for h in scenario["rows"]["adapt=True"][0]["history"]] == [0, 1, 2, 3]
        assert scenario["rows"]["adapt=True"][0]["history"][0]["decision"] == "warm-up"
        assert scenario["adapt_over_best"]["n"] == scenario["adapt_over_fixed"]["n"] == 1
        assert scenario["adapt_over_best"]["median"] > 0 and scenario["adapt_over_fixed"]["median"] > 0
        assert scenario["goal"]["verdict"] in {"met", "not met", "tie within noise"}
        assert scenario["goal"]["bound"] == (1.03 if scenario["recipe_is_best"] else 1.10)
        fixed, adapting = scenario["rows"]["fixed recipe"][0], scenario["rows"]["adapt=True"][0]
        assert len(set(fixed["main_threads"])) == 1, name  # a fixed run's split stays
        assert adapting["main_threads"][0] == fixed["main_threads"][0], name  # adapt starts where fixed runs
    # --quick's searched recipe is the usual advice (a worker per CPU, torch's threads): the competitor's grid is
    # the cross through it, held at its cache and allocator, the recipe's own point first
    n = usable_cpus()
    grid = [(c["num_workers"], c["main_threads"], c["cache"], c["allocator"]) for c in data["grid"]["competitor"]]
    assert grid == [(n, None, None, "glibc"), (0, None, None, "glibc")] + ([(n, 1, None, "glibc")] if n > 1 else [])
    # the mismatch's recipe is the proxy's (the fastest worker count with no step), its grid's first point
    mismatch = data["scenarios"]["mismatch"]
    assert mismatch["fixed"] == data["grid"]["mismatch"][0] == mismatch["grid"]["evaluated"][0]["config"]
    no_regret = data["scenarios"]["no_regret"]
    assert no_regret["fixed"] == no_regret["grid"]["best"]["config"] and no_regret["recipe_is_best"]


def test_adapt_grid_is_what_adapt_can_reach_from_the_recipe():
    from autotune.config import LoaderConfig, usual_advice

    grid = _script("adapt").grid

    def points(recipe, cpus, quick=False):
        out = grid(recipe, cpus, quick)
        held = {(c.cache, c.allocator, c.cache_fill) for c in out}
        assert out[0] == recipe and len(set(out)) == len(out) and held == {(recipe.cache, recipe.allocator,
                                                                              recipe.cache_fill)}
        return [(c.num_workers, c.main_threads, c.prefetch_factor) for c in out]

    # the last measurement's recipe: no workers, a memory cache, glibc-tuned; the grid keeps both
    searched = LoaderConfig(cache="memory", allocator="glibc-tuned")
    assert points(searched, 2) == [(0, None, None), (1, None, 2), (2, None, 2), (0, 1, None), (1, 1, 2), (2, 1, 2)]
    assert all(c.persistent_workers for c in grid(searched, 2, False) if c.num_workers)  # as adapt's move adds them
    one = usual_advice(2, main_threads=1)  # the other split of a recipe with one main thread: torch's own
    assert points(one, 2) == [(2, 1, 2), (0, 1, None), (1, 1, 2), (0, None, None), (1, None, 2), (2, None, 2)]
    assert points(one, 2, quick=True) == [(2, 1, 2), (0, 1, None), (2, None, 2)]
    assert points(usual_advice(1), 1) == [(1, None, 2), (0, None, None)]  # one CPU: no split to move
    three = usual_advice(8).refit(num_workers=3, prefetch_factor=4)  # its own count joins 0, 1, half, all
    assert [n for n, m, _ in points(three, 8) if m is None] == [3, 0, 1, 4, 8, 8]
    assert points(three, 8)[-1] == (8, None, 8)  # beyond 2 CPUs: the most workers with prefetch doubled


def test_adapt_regret_over_interleaved_pairs():
    regret = _script("adapt").regret
    # repeat i of each row ran side by side: the ratios pair them; a failed run (None) drops its pair
    totals = {"fixed recipe": [10.0, 12.0, None], "adapt=True": [10.5, 10.8, 9.0], "grid best": [10.0, 10.0, 10.0]}
    out = regret(totals, recipe_is_best=False)
    assert out["adapt_over_best"] == {"median": pytest.approx(1.05), "min": pytest.approx(0.9),
                                      "max": pytest.approx(1.08), "n": 3, "values": pytest.approx([1.05, 1.08, 0.9])}
    assert out["adapt_over_fixed"]["values"] == pytest.approx([1.05, 0.9]) and out["adapt_over_fixed"]["n"] == 2
    assert out["goal"] == {"ratio": "adapt ÷ grid best", "bound": 1.10, "verdict": "met"}  # every pair ≤ 1.10
    totals["adapt=True"] = [10.5, 11.5, 9.0]  # one pair over 1.10, two within: the run shows neither
    assert regret(totals, recipe_is_best=False)["goal"]["verdict"] == "tie within noise"
    totals["adapt=True"] = [11.2, 11.5, 12.0]  # every pair over
    assert regret(totals, recipe_is_best=False)["goal"]["verdict"] == "not met"
    # where the recipe is the grid's best the bound is 3% of the fixed run, over its own pairs
    totals = {"fixed recipe": [10.0, 10.0, 10.0], "adapt=True": [10.2, 9.9, 10.25], "grid best": [10.0, 10.0, 10.0]}
    assert regret(totals, recipe_is_best=True)["goal"] == {"ratio": "adapt ÷ fixed", "bound": 1.03, "verdict": "met"}
    totals["adapt=True"] = [10.2, 10.4, 10.25]
    assert regret(totals, recipe_is_best=True)["goal"]["verdict"] == "tie within noise"
    totals["adapt=True"] = [10.31, 10.4, 11.0]
    assert regret(totals, recipe_is_best=True)["goal"]["verdict"] == "not met"
    totals["adapt=True"] = [None, None, None]  # every adapting run failed: nothing is claimed
    out = regret(totals, recipe_is_best=True)
    assert out["adapt_over_fixed"] is None and out["goal"]["verdict"] == "not measured"


def test_adapt_sizes_each_run_by_time_from_a_calibration_run():
    """--seconds: the epoch's samples make 12 epochs that long at the calibration's second epoch's seconds per
    sample (its first warms up), in whole batches of 16, never under 512 (a probe of 8 batches)."""
    adapt = _script("adapt")
    assert adapt.sized(0.001, 60.0, 12) == 16 * 312  # 5 s an epoch at 16 ms a batch: 312.5 batches
    assert adapt.sized(0.001, 6.0, 12) == 512  # 31 batches: the least
    seen = []

    def run(config, samples):
        seen.append((config, samples))
        return {"epoch_s": [2.0, 0.512]}  # 1 ms a sample after the warm-up

    recipe = adapt.LoaderConfig(num_workers=2)
    samples, record = adapt.calibrate(run, recipe, 60.0, 12)
    assert samples == 16 * 312 and seen == [(recipe, 512)]
    assert record == {"config": recipe.to_json(), "epoch_s": [2.0, 0.512], "seconds_per_sample": 0.001,
                      "samples": 16 * 312}


def _script(name):
    """A benchmark script as a module (its ``harness`` package importable)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_accelerator_utilisation_figures():
    acc = _script("accelerator")
    run = {"batches": [10, 10], "setup_s": 0.5, "first_batch_s": [0.25, 0.01], "epoch_s": [1.25, 1.0],
           "total_s": 2.75}
    assert acc.au_figures(run, 0.1) == pytest.approx(
        {"steps": 20, "first_step_s": 0.75, "au": 2.0 / 2.75, "au_steady": 2.0 / 2.0})


def test_accelerator_verdict():
    acc = _script("accelerator")

    def au(value):  # a row summary; a row whose runs all failed has no AU
        return {} if value is None else {"au": {"median": value}}

    def entry(ms, grid, recipe):
        return {"compute_ms": ms, "rows": {"grid": au(grid), "autotune": au(recipe)}}

    results = [entry(5, 0.7, 0.6), entry(20, 0.95, 0.92), entry(60, 0.97, 0.85), entry(150, 0.99, None)]
    assert acc.verdict(results, "au") == {"grid_reaches_at_ms": [20, 60, 150], "recipe_short_at_ms": [60, 150],
                                          "holds": False}
    assert acc.verdict(results[:2], "au") == {"grid_reaches_at_ms": [20], "recipe_short_at_ms": [], "holds": True}
    assert acc.verdict(results[:1], "au")["holds"] is False
    assert "**yes**" in acc.verdict_line(results[:2], "au", "x")
    assert "falls short at 60, 150 ms" in acc.verdict_line(results, "au", "x")
    assert "not tested" in acc.verdict_line(results[:1], "au", "x")


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_allocators(results):
    data = _check(results, "allocators")
    assert [r["row"] for r in data["rows"]] == ["jpeg-0", "memory-0", "memory-2p"]
    assert {"glibc", "glibc-tuned"} <= set(data["columns"])
    assert {"libc", "libraries"} <= set(data["machine"])
    for row in data["rows"]:
        assert set(row["cells"]) == set(data["columns"])
        for column, cell in row["cells"].items():
            assert {"median_s", "min_s", "max_s", "main_cpu_s", "main_faults"} <= set(cell)
            assert [len(epochs) for epochs in cell["epoch_s"]] == [2]
            assert cell["active_allocator"] == (column if allocators.get(column).preloaded else allocators.DEFAULT)


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_cache_memory(results):
    data = _check(results, "cache_memory")
    assert set(data["runs"]) == {"memory cache", "naive list"}
    for run in data["runs"].values():
        assert run["single"]["processes"] == 1
        assert run["workers"]["processes"] == 1 + run["workers"]["workers"]
        assert run["ratio"] > 0


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_prediction(results):
    data = _check(results, "prediction")
    (name,) = data["examples"]  # --quick: jpeg_folder only
    example = data["examples"][name]
    assert example["factory_runs_kept"] == data["repeats"] == 1  # the first validation, kept through the re-search
    for stage in ("first", "learned"):
        phases = example[stage]["phases"]
        assert set(phases) == {"build", "first_epoch", "epoch", "total"}
        assert all(len(p["measured_runs"]) == 1 for p in phases.values())


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_cache_fill(results):
    data = _check(results, "cache_fill")
    assert list(data["rows"]) == ["none/build/0", "none/build/2", "memory/build/0", "memory/build/2",
                                  "memory/first_epoch/2", "pickle/build/0", "pickle/build/2",
                                  "pickle/first_epoch/2"]  # --quick: the memory cache and one disk backend
    for name, row in data["rows"].items():
        assert row["failed"] == [] and len(row["epoch_s"]) == 3 and row["finish_s"]["n"] == 1, name
        assert row["total_s"]["median"] >= row["finish_s"]["median"] >= 0
        run = row["runs"][0]
        assert row["first_over_second"]["median"] == run["epoch_s"][0] / run["epoch_s"][1], name
    assert data["rows"]["pickle/first_epoch/2"]["over_best_build"] > 0
    assert data["rows"]["memory/first_epoch/2"]["over_best_build"] > 0
    assert "epoch 1 ÷ epoch 2" in data["table_markdown"]


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_epoch_one(results):
    data = _check(results, "epoch_one")
    assert list(data["rows"]) == ["cold", "warmed"]
    for name, row in data["rows"].items():
        assert row["failed"] == [] and len(row["epoch_s"]) == 3, name
        run = row["runs"][0]
        assert row["first_over_second"]["median"] == run["epoch_s"][0] / run["epoch_s"][1], name
        assert any(line.startswith("mallopt(") for line in run["info"]["applied"]), name
    cold, warmed = (data["rows"][c]["runs"][0] for c in ("cold", "warmed"))
    assert data["paired"]["total"]["median"] == warmed["total_s"] / cold["total_s"]
    assert "warmed ÷ cold" in data["table_markdown"]


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
def test_provenance(results):
    data = _check(results, "provenance")
    assert sorted(data["checks"]) == ["2000", "20000"]  # --quick
    for runs in data["checks"].values():
        assert len(runs["warm"]) == 1 and len(runs["warm, one thread"]) == 1 and runs["warm"][0] > 0
    assert data["images"] == 64 and [len(v) for v in data["builds"].values()] == [1, 1]
