"""MLPerf Storage's regime: a dataset at least 5x the memory the job may use, inside a cgroup memory limit.

A training job usually runs under a memory limit (a Slurm allocation, a Kubernetes pod, ``docker run
--memory``) and its data, decoded, is larger than that limit. This script makes the limit itself: a cgroup of
its own (v2 where the memory controller is enabled, else v1; it needs root, and says so and exits cleanly
when it cannot), a fresh one for every process it starts, so each run's peak and OOM kills are its own.

Cases (``--case``):
  decoded  10,000 of the article's JPEGs (``examples/jpeg_folder.py``: ~390 MB of files, ~6 GB decoded as float
           tensors) under 1.2 GiB: the files fit in the job's page cache, the decoded samples do not;
  files    40,000 JPEGs (~1.5 GB of files, ~24 GB decoded) under 1.2 GiB: not even the files fit, so every
           epoch reads storage.

Rows, each a fresh process in its own cgroup with the case's limit, the JPEGs evicted before setup and
before epoch 1, interleaved (plain A B C D autotune grid, repeated), median (min-max) of ``--repeats``:
  plain     ``num_workers=0``;
  A-D       the article's rows (``article_table.py``): A is plain; B 4 workers + pin + persistent; C an
            in-memory list of decoded PIL images; D one pickle file of decoded arrays loaded whole (C and D
            hold the whole decoded dataset: inside the limit the kernel kills them, and the row says so);
  autotune  the recipe of ``autotune``'s own search, run inside the same limit (``--budget``);
  grid      the best point of a small grid measured inside the limit on the search's plan: workers {0, 2}
            (persistent) x prefetch 2 x cache {none, memory (the partial shares the budget allows), pickle}
            x fill {before, during epoch 1}.
The recipe and the grid's point run through the same factory. Every batch is consumed by an emulated
accelerator step (``--compute-ms``, ``time.sleep``), and AU is reported as ``accelerator.py`` reports it:
steps x compute time over the whole run's wall time, and steady (from the first batch on). The table also
gives each row's cgroup peak and whether the kernel killed it; the notes give the partial cache's share.

The limit must let the search run: a search inside it holds an interpreter with torch and a trial forkserver
(~330 MiB here) and plans each trial within 70% of what is left (``autotune/tuner/_memory_plan.py``), and in a
job too small for its smallest trial it exits 2 saying how much more it needs. So before each case a child in a
roomy cgroup measures that footprint (``--footprint``); a case's limit below what the search and its smallest
trial need is raised to it, and raised again by what the search itself says it lacks (at most twice), each
step in the output and the notes. For ``files`` the notes say whether the JPEGs plus the processes exceed the
limit, so that the files cannot stay in the page cache. The 10,000 JPEGs (368 MiB) asked under 0.3 GiB, below
any search here, ran under 896-928 MiB in smoke runs (300 JPEGs, loaded machine):

    sudo python benchmarks/memory_limit.py --case files --images 10000 --limit-gib 0.3 --repeats 1 --budget 60 \
        --rows plain autotune grid    # ~8-10 minutes on a quiet 2-CPU machine (estimated)

Full mode, about 2 hours on a quiet 2-CPU machine (estimated: decoding is ~2.5 ms a JPEG; the files case is
4x the decoded one):

    sudo python benchmarks/memory_limit.py [--case decoded files] [--repeats 3] [--budget 120] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import article_table  # benchmarks/: the article's rows and their datasets
from accelerator import au_figures, pct
from harness import BENCHMARKS, EXAMPLES, oracle, output, recipes, stats
from harness.cgroup import MemoryCgroup
from harness.child import Setup, child_main
from harness.fresh import RunFailed, allocator_env, base_env
from harness.workloads import BATCH, EPOCHS, SleepConsumer, jpeg_dataset, jpeg_files, seeded_loader

# After harness, which puts the checkout's autotune first on sys.path.
from autotune.config import LoaderConfig
from autotune.dataset._userfile import UserSpec
from autotune.errors import AutotuneError
from autotune.tuner._space import Space

NAME = "memory_limit"
GIB = 1 << 30
CASES = {"decoded": {"images": 10_000, "limit": int(1.2 * GIB)},
         "files": {"images": 40_000, "limit": int(1.2 * GIB)}}
ROWS = {"plain": "plain (`num_workers=0`)", "B": "B: 4 workers + pin + persistent",
        "C": "C: in-memory PIL list + 2 workers", "D": "D: pickle file loaded whole + 2 workers",
        "autotune": "autotune recipe", "grid": "grid's best"}
COMPUTE_MS = 20.0


# ------------------------------------------------------------------------------------------ cells (child)


def _sleeping(setup: Setup, compute_s: float) -> Setup:
    """The article's cell, its batches consumed by the emulated accelerator step instead."""
    inner = setup.prepare

    def prepare():
        loader, _ = inner()
        return loader, SleepConsumer(compute_s)

    setup.prepare = prepare
    return setup


def cell_plain(params: dict) -> Setup:
    ds = jpeg_dataset(params["images"])
    return Setup(jpeg_files(ds), lambda: (seeded_loader(ds, num_workers=0), SleepConsumer(params["compute_s"])))


def _article(name: str):
    return lambda params: _sleeping(article_table.CELLS[name](params), params["compute_s"])


def cell_recipe(params: dict) -> Setup:
    return recipes.recipe_setup(params["profile"], lambda: jpeg_dataset(params["images"]), jpeg_files,
                                cache_dir=str(Path(params["workdir"]) / f"cache-{time.monotonic_ns()}"),
                                consumer=lambda config: SleepConsumer(params["compute_s"]))


CELLS = {"plain": cell_plain, "B": _article("B"), "C": _article("C"), "D": _article("D"),
         "autotune": cell_recipe, "grid": cell_recipe}


def grid_space(shares: tuple[float, ...], whole_fits: bool) -> Space:
    """The small grid; its memory cache is whole where that fits the budget, else of ``shares`` (none: no
    memory cache)."""
    memory = whole_fits or bool(shares)
    return Space(max_workers=2, contexts=("fork",), prefetch_factors=(2,), persistent=(True,),
                 caches=(None, "memory", "pickle") if memory else (None, "pickle"),
                 cache_shares=() if whole_fits else shares,
                 cache_fills=("build", "first_epoch"), filled_caches=("memory",), allocators=("glibc",))


def _spec(images: int, compute_s: float) -> UserSpec:
    return UserSpec(dataset=jpeg_dataset(images), source=str(EXAMPLES / "jpeg_folder.py"), batch_size=BATCH,
                    epochs=EPOCHS, train_step=SleepConsumer(compute_s), sys_path=[str(EXAMPLES), str(BENCHMARKS)])


def footprint_child(payload: str) -> int:
    """Inside a roomy cgroup: what a search holds before its first trial (this process and its trial forkserver,
    imports done) and what its smallest trial needs by the search's own plan; prints them as JSON."""
    import autotune.tuner._study  # noqa: F401 - what a search imports (Optuna), before its figures are read
    from autotune.config import DEFAULT
    from autotune.machine import process_uss
    from autotune.machine._memory_limit import job_memory
    from autotune.tuner._preparation import trial_memory
    from autotune.tuner._runner import waiting_forkserver, warm_forkserver

    p = json.loads(payload)
    spec = _spec(p["images"], 0.0)
    sample = spec.dataset[0][0]
    warm_forkserver()
    deadline = time.monotonic() + 300
    while waiting_forkserver() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    plan = trial_memory(spec, BATCH * sample.numel() * sample.element_size(), 1, None)
    server = waiting_forkserver()
    # The search may plan before its forkserver is ready: then its own private memory stands for the server's
    # and for a trial's interpreter (an upper bound), as here.
    own = process_uss()
    plan = dataclasses.replace(plan, interpreter=max(plan.interpreter, own))
    memory = job_memory()
    resident = memory.total - memory.available - (process_uss(server) if server else 0) + own
    print(json.dumps({"resident_bytes": resident, "default_need_bytes": plan.need(DEFAULT),
                      "interpreter_bytes": plan.interpreter}))
    return 0


def search_child(payload: str) -> int:
    """Inside the cgroup: autotune's search, then the small grid on its plan; writes the profiles as JSON."""
    from autotune.caches import estimate_need
    from autotune.config import DEFAULT
    from autotune.machine._memory_limit import job_memory
    from autotune.tuner._candidates import Limits, partial_shares

    p = json.loads(payload)
    work = Path(p["workdir"])
    spec = _spec(p["images"], p["compute_s"])
    memory = job_memory()
    output.say(f"  inside: {memory.describe_limit()}, {memory.available / 2**20:.0f} MiB available")
    try:
        recipe, outcome, timing = recipes.autotune_search(spec, budget=p["budget"], workdir=work)
    except AutotuneError as exc:  # the search's own one line (a job too small for any trial): no traceback
        output.say(f"autotune: error: {exc}")
        return exc.exit_code
    output.say(f"  -> {recipe.config.describe()} in {timing['wall_s']:.1f} s ({outcome.trials} trials)")
    whole = estimate_need("memory", outcome.probe.sample_bytes, outcome.probe.length)[0]
    # The grid is judged by the search's own plan (its budget, what a trial's processes hold beside a cache), so the
    # grid's partial shares are the search's and a point is refused, or stopped by the guard, as the search's trial
    # would be (benchmarks/harness/oracle.py); a budget read again after the search differs from the one it used.
    plan = outcome.memory
    limits = Limits(usable_cpus=1, memory_budget=plan.budget, disk_free=0, process_memory=plan.need(DEFAULT))
    whole_fits = whole <= limits.memory_budget
    shares = () if whole_fits else partial_shares(whole, limits)
    space = grid_space(shares, whole_fits)
    points = oracle.grid_points(space, p["quick"])
    held = "whole" if whole_fits else f"partial, shares {shares}" if shares else "none: not 1% fits"
    output.say(f"  grid: {len(points)} points (memory cache {held}) on the search's plan")
    t0 = time.perf_counter()
    grid = oracle.evaluate_points(spec, outcome, points, log=output.say)
    best = oracle.best_point(grid)
    result: dict[str, Any] = {
        "search": {**recipes.search_record(recipe, outcome, timing), "notes": outcome.notes},
        "limit": {"limit": memory.limit, "source": memory.limit_source, "available": memory.available},
        "memory_budget": plan.budget,
        "whole_cache_bytes": whole, "whole_fits": whole_fits, "grid_shares": list(shares),
        "grid": {"space": repr(space), "points": len(points), "complete": not p["quick"],
                 "wall_s": time.perf_counter() - t0, "cost_s": sum(e["duration_s"] for e in grid), "best": best,
                 "evaluated": grid},
        "profiles": {"autotune": recipe.profile.to_dict()},
    }
    if best is not None:
        result["profiles"]["grid"] = recipes.profile_for(LoaderConfig.from_json(best["config"]), batch_size=BATCH,
                                                         epochs=EPOCHS, source=spec.source).to_dict()
    Path(p["out"]).write_text(json.dumps(result, default=str))
    return 0


# ------------------------------------------------------------------------------------------ driver (parent)


def in_cgroup(limit: int, command: list[str], *, env: dict[str, str] | None = None, timeout: float = 7200
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``command`` in a fresh cgroup of ``limit`` bytes; the result and the cgroup's peak and OOM kills."""
    with MemoryCgroup.make(limit, name="autotune-bench") as cgroup:
        out = subprocess.run([*cgroup.prefix(), *command], env=env or base_env(), capture_output=True, text=True,
                             timeout=timeout, cwd=str(BENCHMARKS.parent), check=False)
        facts = {"oom_kills": cgroup.oom_kills(), "peak_bytes": cgroup.peak(), "cgroup": cgroup.describe()}
    return out, facts


def run_row(limit: int, cell: str, params: dict, epochs: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    payload = json.dumps({"cell": cell, "params": params, "epochs": epochs, "memory": False})
    out, facts = in_cgroup(limit, [sys.executable, str(Path(__file__).resolve()), "--cell", payload], env=env)
    lines = [line for line in out.stdout.strip().splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        killed = facts["oom_kills"] > 0
        tail = "\n".join(out.stderr.strip().splitlines()[-8:])
        why = (f"killed by the kernel's OOM killer (exit {out.returncode}, {facts['oom_kills']} kill(s))" if killed
               else f"failed (exit {out.returncode})")
        raise RunFailed(f"{cell} {why}:\n{tail}")
    return {**json.loads(lines[-1]), "cgroup": facts}


def summarise(runs: list[dict], compute_s: float) -> dict[str, Any]:
    s = stats.summarise_runs(runs)
    good = stats.ok(runs)
    figures = [au_figures(r, compute_s) for r in good]
    for key in ("steps", "first_step_s", "au", "au_steady"):
        s[key] = stats.spread([f[key] for f in figures])
    s["cgroup_peak_bytes"] = stats.spread([r["cgroup"]["peak_bytes"] for r in good if r["cgroup"]["peak_bytes"]])
    s["oom_killed"] = sum("OOM killer" in f for f in s["failed"])
    return s


MIB = 1 << 20
_TOO_SMALL = re.compile(r"Raise the memory limit by at least ~([\d.]+) (B|KiB|MiB|GiB)")


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * {"B": 1, "KiB": 1 << 10, "MiB": MIB, "GiB": GIB}[unit])


def fit_limit(requested: int, footprint: dict[str, int], files_bytes: int, case: str) -> tuple[int, list[str]]:
    """The case's limit, raised where the search and its smallest trial cannot fit it, and the notes saying so;
    for ``files``, whether the JPEGs can stay in the page cache under it."""
    from autotune.machine import BUDGET_SHARE

    resident, need = footprint["resident_bytes"], footprint["default_need_bytes"]
    least = int(resident + need / BUDGET_SHARE)
    least = -(-least // (32 * MIB)) * 32 * MIB  # a round figure, up
    notes = []
    limit = requested
    if requested < least:
        limit = least
        notes.append(f"{case}: the requested {requested / GIB:.2f} GiB is below any search: the search and its trial "
                     f"server hold {resident / MIB:.0f} MiB and its smallest trial plans ~{need / MIB:.0f} MiB within "
                     f"{BUDGET_SHARE:.0%} of what is left; the limit is raised to {limit / MIB:.0f} MiB")
    if case == "files":
        notes.append(files_note(files_bytes, footprint, limit))
    return limit, notes


def files_note(files_bytes: int, footprint: dict[str, int], limit: int) -> str:
    """Whether the JPEGs can stay in the page cache beside the search's processes under ``limit``."""
    processes = footprint["resident_bytes"] + footprint["default_need_bytes"]
    fits = files_bytes + processes <= limit
    then = ("may stay in the page cache: not this case's regime, pass a smaller --limit-gib or more --images"
            if fits else "cannot stay in the page cache")
    return (f"files: {files_bytes / MIB:.0f} MiB of JPEGs + {processes / MIB:.0f} MiB of processes "
            f"{'fit' if fits else 'exceed'} the {limit / MIB:.0f} MiB limit: the files {then}")


def one_case(args, name: str, case: dict, work: Path, repeats: int) -> tuple[dict, list[list[str]]]:
    images, requested = case["images"], case["limit"]
    compute_s = args.compute_ms / 1000
    here = work / name
    here.mkdir(parents=True, exist_ok=True)
    dataset = jpeg_dataset(images)  # written once, outside every measurement
    files_bytes = sum(Path(p).stat().st_size for p in dataset.paths)
    out, _ = in_cgroup(8 * GIB, [sys.executable, str(Path(__file__).resolve()), "--footprint",
                                 json.dumps({"images": images})], timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{name}: measuring the search's footprint failed (exit {out.returncode}):\n"
                         f"{out.stderr[-3000:]}")
    footprint = json.loads(out.stdout.strip().splitlines()[-1])
    limit, limit_notes = fit_limit(requested, footprint, files_bytes, name)
    for note in limit_notes:
        output.say(note)
    output.say(f"{name}: {images} JPEGs ({files_bytes / 2**20:.0f} MiB of files) under {limit / GIB:.2f} GiB; "
               f"search ({args.budget:.0f} s) and grid inside the limit ...")
    payload = json.dumps({"images": images, "workdir": str(here), "budget": args.budget, "compute_s": compute_s,
                          "quick": args.quick, "out": str(here / "search.json")})
    for _attempt in range(3):
        out, facts = in_cgroup(limit, [sys.executable, str(Path(__file__).resolve()), "--search", payload])
        more = _TOO_SMALL.search(out.stderr) if out.returncode == 2 else None
        if more is None:
            break
        # The search's own plan says how much more its smallest trial needs: that figure, and a quarter more (its
        # own figures move a little from one start to the next); a round figure, up.
        raised = -(-int(limit + 1.25 * _bytes(more.group(1), more.group(2))) // (32 * MIB)) * 32 * MIB
        limit_notes.append(f"{name}: the search found {limit / MIB:.0f} MiB too small for its smallest trial "
                           f"(\"{more.group(0)}\"); the limit is raised to {raised / MIB:.0f} MiB")
        output.say(limit_notes[-1])
        limit = raised
        if name == "files":
            limit_notes.append(files_note(files_bytes, footprint, limit))
    if out.returncode != 0:
        raise SystemExit(f"{name}: the search inside the limit failed (exit {out.returncode}, "
                         f"{facts['oom_kills']} OOM kill(s)):\n{out.stderr[-3000:]}")
    sys.stderr.write(out.stderr)
    tuned = json.loads((here / "search.json").read_text())
    tuned["search"]["cgroup"] = facts
    base = {"images": images, "compute_s": compute_s, "workdir": str(here)}

    def row(cell: str):
        if cell in ("autotune", "grid"):
            profile = tuned["profiles"].get(cell)
            if profile is None:
                return lambda: {"failed": f"{cell}: no grid point could be measured"}
            env = allocator_env(profile["config"]["allocator"])
            return lambda: run_row(limit, cell, {**base, "profile": profile}, EPOCHS, env)
        return lambda: run_row(limit, cell, base, EPOCHS)

    runs = stats.interleaved({cell: row(cell) for cell in args.rows}, repeats, log=output.say)
    for folder in here.glob("cache-*"):  # the rows' caches (a disk cache a recipe may pick)
        shutil.rmtree(folder, ignore_errors=True)
    rows = {cell: summarise(rr, compute_s) for cell, rr in runs.items()}
    describe = {"autotune": tuned["search"]["describe"],
                "grid": (tuned["grid"]["best"] or {}).get("describe", "–")}
    table_rows = []
    for cell, s in rows.items():
        killed = f"killed ({s['oom_killed']} of {s['repeats']})" if s["oom_killed"] else "no"
        table_rows.append([name, f"{images}", ROWS[cell], describe.get(cell, "–"), output.fmt(s.get("total_s")),
                           pct(s.get("au")), pct(s.get("au_steady")),
                           output.fmt_bytes((s.get("cgroup_peak_bytes") or {}).get("median")), killed])
    decoded = tuned["whole_cache_bytes"]
    return {"case": name, "images": images, "limit_bytes": limit, "limit_requested_bytes": requested,
            "footprint": footprint, "limit_notes": limit_notes, "files_bytes": files_bytes,
            "decoded_bytes": decoded, "decoded_over_limit": decoded / limit, "rows": rows, **tuned}, table_rows


def main(argv: list[str] | None = None) -> int:
    p = output.parser(__doc__, NAME)
    p.add_argument("--case", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--images", type=int, default=None, help="JPEGs (default: the case's)")
    p.add_argument("--limit-gib", type=float, default=None, help="the cgroup's limit (default: the case's)")
    p.add_argument("--compute-ms", type=float, default=COMPUTE_MS, help="emulated accelerator step per batch")
    p.add_argument("--budget", type=float, default=120.0, help="autotune search budget, seconds")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--search", help=argparse.SUPPRESS)
    p.add_argument("--footprint", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cell:
        return child_main(CELLS, args.cell)
    if args.search:
        return search_child(args.search)
    if args.footprint:
        return footprint_child(args.footprint)
    started = time.perf_counter()
    why = MemoryCgroup.why_not()
    if why:
        note = f"memory_limit: cannot make a memory cgroup here ({why}); nothing measured."
        print(note)
        return output.finish(NAME, args, started, ["| skipped |\n|---|\n| " + why + " |"], [note],
                             {"repeats": 0, "skipped": why, "cases": []})
    cases = {name: dict(CASES[name]) for name in args.case}
    if args.quick:
        cases = {"decoded": {"images": 128, "limit": int(1.2 * GIB)}}
        args.budget, args.rows = min(args.budget, 30.0), [r for r in args.rows if r in ("plain", "C", "autotune",
                                                                                     "grid")]
    for case in cases.values():
        if args.images:
            case["images"] = args.images
        if args.limit_gib:
            case["limit"] = int(args.limit_gib * GIB)
    repeats = args.repeats or (1 if args.quick else 3)
    work = output.workdir(args.workdir, NAME)
    results, table_rows = [], []
    for name, case in cases.items():
        result, rows = one_case(args, name, case, work, repeats)
        results.append(result)
        table_rows += rows
    table = output.markdown_table(
        ["case", "JPEGs", "loader", "configuration", "whole run, s", "AU, whole run", "AU, steady",
         "cgroup peak", "OOM-killed"], table_rows)
    notes = [f"batch {BATCH}, {EPOCHS} epochs, the first cold; {args.compute_ms:g} ms of emulated accelerator "
             f"step per batch; median (min–max) of {repeats} interleaved fresh-process run(s), each in a cgroup of "
             "its own with the case's limit."]
    for r in results:
        notes.extend(r["limit_notes"])
        share = r["search"]["config"].get("cache_share")
        held = (f"a partial memory cache of the first {share:.0%} of the samples" if share
                else f"cache {r['search']['config'].get('cache') or 'none'}")
        notes.append(f"{r['case']}: {r['files_bytes'] / 2**20:.0f} MiB of JPEGs, ~{r['decoded_bytes'] / 2**30:.1f} "
                     f"GiB decoded ({r['decoded_over_limit']:.1f}x the {r['limit_bytes'] / GIB:.2f} GiB limit); the "
                     f"recipe holds {held}; grid shares {r['grid_shares'] or 'none'}; limit read inside: "
                     f"{r['limit']['source']}.")
    if args.quick:
        notes.append("--quick: 128 JPEGs (not 5x the limit), a 2-point grid, rows plain, C, autotune, grid.")
    return output.finish(NAME, args, started, [table], notes, {
        "repeats": repeats, "batch_size": BATCH, "epochs": EPOCHS, "compute_ms": args.compute_ms,
        "budget_s": args.budget, "cases": results, "labels": {r: ROWS[r] for r in args.rows}})


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
