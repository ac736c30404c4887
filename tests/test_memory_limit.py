"""The job's memory limit: cgroup v2 and v1 readers against fake trees, rlimits in a child process, and one
real cgroup made here as root (skipped with the reason where the machine does not allow it)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.machine._evict import fits_page_cache
from autotune.machine._memory_limit import cgroup_memory, job_memory

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.harness.cgroup import MemoryCgroup  # noqa: E402

GIB = 1 << 30
HOST = (64 * GIB, 60 * GIB)  # total, available


def write(folder: Path, **files: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (folder / name.replace("_", ".", 1)).write_text(f"{value}\n")


def v2(folder: Path, max_: object = "max", high: object = "max", current: int = 0, inactive: int = 0,
       active: int = 0) -> None:
    write(folder, memory_max=max_, memory_high=high, memory_current=current,
          memory_stat=f"anon 1\ninactive_file {inactive}\nactive_file {active}")


def v1(folder: Path, limit: int, usage: int, inactive: int = 0, hierarchical: int | None = None) -> None:
    stat = f"cache 5\ninactive_file {inactive}\ntotal_inactive_file {inactive}\ntotal_active_file 7"
    if hierarchical is not None:
        stat += f"\nhierarchical_memory_limit {hierarchical}"
    write(folder, memory_limit_in_bytes=limit, memory_usage_in_bytes=usage, memory_stat=stat)


def test_v2_max_less_current_plus_inactive_file(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    v2(tmp_path / "job", max_=8 * GIB, current=3 * GIB, inactive=GIB, active=2 * GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/job", host=HOST, rlimits=False)
    assert mem.limit == 8 * GIB
    assert mem.limit_source == str(tmp_path / "job" / "memory.max")
    assert mem.available == 8 * GIB - 3 * GIB + GIB  # inactive file pages count, active ones do not
    assert mem.total == 8 * GIB
    assert "cgroup memory limit of 8.0 GiB" in mem.describe_limit()
    # the one budget the search, the factory and the adapting loader hold a recipe to: 70% of what is left,
    # shared by the ranks of a node
    assert mem.budget() == int(6 * GIB * 0.7)
    assert mem.budget(ranks=4) == int(6 * GIB * 0.7) // 4


def test_v2_high_below_max_binds(tmp_path):
    v2(tmp_path / "job", max_=8 * GIB, high=6 * GIB, current=GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/job", host=HOST, rlimits=False)
    assert mem.limit == 6 * GIB and mem.limit_source.endswith("memory.high")
    assert mem.available == 5 * GIB


def test_v2_max_everywhere_is_the_host(tmp_path):
    v2(tmp_path / "job", current=GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/job", host=HOST, rlimits=False)
    assert mem.limit is None and mem.limit_source is None
    assert mem.available == HOST[1] and mem.available_source == "host"
    assert mem.total == HOST[0]
    assert "no memory limit" in mem.describe_limit()


def test_nested_v2_the_tightest_up_the_hierarchy(tmp_path):
    v2(tmp_path / "slurm", max_=4 * GIB, current=3 * GIB)  # the allocation: siblings use most of it
    v2(tmp_path / "slurm" / "step", max_=16 * GIB, current=GIB)  # the step's own limit is loose
    v2(tmp_path / "slurm" / "step" / "task", current=GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/slurm/step/task", host=HOST, rlimits=False)
    assert mem.limit == 4 * GIB and mem.limit_source == str(tmp_path / "slurm" / "memory.max")
    assert mem.available == GIB and mem.available_source == str(tmp_path / "slurm" / "memory.max")


def test_nested_limit_tightest_but_other_level_fuller(tmp_path):
    # The tightest limit is the child's, but the parent has less left: both are named where each applies.
    v2(tmp_path / "a", max_=10 * GIB, current=9 * GIB)
    v2(tmp_path / "a" / "b", max_=6 * GIB, current=GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/a/b", host=HOST, rlimits=False)
    assert mem.limit == 6 * GIB
    assert mem.available == GIB and mem.available_source.endswith("a/memory.max")


def test_limit_above_host_ram_is_the_host(tmp_path):
    v2(tmp_path / "job", max_=256 * GIB, current=GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/job", host=HOST, rlimits=False)
    assert mem.limit is None
    assert mem.available == HOST[1]


def test_hybrid_unified_mount(tmp_path):
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("memory\n")
    v2(tmp_path / "unified" / "job", max_=2 * GIB, current=GIB // 2)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/job", host=HOST, rlimits=False)
    assert mem.limit == 2 * GIB and mem.available == GIB + GIB // 2


def test_v1_limit_less_usage_plus_total_inactive_file(tmp_path):
    v1(tmp_path / "memory" / "docker" / "abc", limit=int(1.2 * GIB), usage=GIB, inactive=GIB // 4)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/docker/abc", host=HOST, rlimits=False)
    assert mem.limit == int(1.2 * GIB)
    assert mem.limit_source == str(tmp_path / "memory" / "docker" / "abc" / "memory.limit_in_bytes")
    assert mem.available == int(1.2 * GIB) - GIB + GIB // 4


def test_v1_unlimited(tmp_path):
    v1(tmp_path / "memory", limit=9223372036854771712, usage=GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/", host=HOST, rlimits=False)
    assert mem.limit is None and mem.available == HOST[1]
    assert cgroup_memory(tmp_path, cgroup_path="/") == []


def test_v1_nested_parent_binds(tmp_path):
    v1(tmp_path / "memory" / "kube", limit=2 * GIB, usage=int(1.5 * GIB))
    v1(tmp_path / "memory" / "kube" / "pod", limit=9223372036854771712, usage=GIB // 4)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/kube/pod", host=HOST, rlimits=False)
    assert mem.limit == 2 * GIB and mem.available == GIB // 2


def test_v1_hierarchical_limit_of_an_unseen_ancestor(tmp_path):
    # A container mounts its own cgroup as the root: the ancestor's limit shows only in memory.stat.
    v1(tmp_path / "memory", limit=9223372036854771712, usage=GIB, hierarchical=3 * GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/docker/abc", host=HOST, rlimits=False)
    assert mem.limit == 3 * GIB and "hierarchical_memory_limit" in mem.limit_source
    assert mem.available == 2 * GIB


def test_host_tighter_than_the_cgroup(tmp_path):
    v1(tmp_path / "memory", limit=32 * GIB, usage=GIB)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/", host=(64 * GIB, 4 * GIB), rlimits=False)
    assert mem.limit == 32 * GIB  # the job's ceiling ...
    assert mem.available == 4 * GIB and mem.available_source == "host"  # ... but the host has less now


def test_unreadable_files_are_no_limit(tmp_path):
    write(tmp_path / "job", memory_max="garbage", memory_current="x")
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/job", host=HOST, rlimits=False)
    assert mem.limit is None and mem.available == HOST[1]


def test_page_cache_model_uses_the_job_not_the_host(tmp_path):
    v1(tmp_path / "memory", limit=int(1.2 * GIB), usage=GIB // 4)
    mem = job_memory(cgroup_root=tmp_path, cgroup_path="/", host=HOST, rlimits=False)
    # 600 MB of files fit a 64 GiB host's page cache, not a 1.2 GiB job's once its reserve is kept.
    assert fits_page_cache(600 << 20, memory=job_memory(cgroup_root=tmp_path / "none", host=HOST, rlimits=False))
    assert not fits_page_cache(int(0.8 * GIB), memory=mem)
    assert fits_page_cache(300 << 20, memory=mem)


@contextlib.contextmanager
def _memory_cgroup(limit: int):
    """A real cgroup memory limit for the block, or the test skipped with the reason this machine gives."""
    why = MemoryCgroup.why_not()
    if why:
        pytest.skip(why)
    try:
        made = MemoryCgroup.make(limit, name="autotune-test")
        cgroup = made.__enter__()
    except OSError as exc:
        pytest.skip(f"this machine does not allow a memory cgroup here: {exc}")
    try:
        yield cgroup
    finally:
        made.__exit__(None, None, None)


def _child_memory(prefix: str = "", command: list[str] | None = None) -> dict[str, object]:
    code = (prefix + "from autotune.machine._memory_limit import job_memory\n"
            "import json; m = job_memory()\n"
            "print(json.dumps({'limit': m.limit, 'source': m.limit_source, 'available': m.available}))")
    out = subprocess.run([*(command or []), sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True, timeout=60)
    return dict(json.loads(out.stdout))


def test_rlimit_as_and_data_in_a_child():
    import resource

    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        if getattr(resource, name, None) is None:
            pytest.skip(f"{name} not on this OS")
        got = _child_memory(f"import resource; resource.setrlimit(resource.{name}, (6 << 30, resource.RLIM_INFINITY))\n")
        host = job_memory(rlimits=False)
        if host.limit is not None and host.limit < 6 << 30:
            pytest.skip("this job's cgroup limit is below the rlimit tried")
        assert got["limit"] == 6 << 30 and got["source"] == name
        assert 0 < int(got["available"]) < 6 << 30  # less what the process already maps


def test_a_real_cgroup_limit_is_read_from_inside():
    limit = 700 << 20
    with _memory_cgroup(limit) as cgroup:
        got = _child_memory(command=cgroup.prefix())
    assert got["limit"] == limit, got
    assert str(cgroup.folder) in str(got["source"])
    assert 0 < int(got["available"]) < limit
    assert not cgroup.folder.exists()


def test_check_exit_3_inside_a_real_cgroup_for_a_recipe_tuned_outside(tmp_path):
    from test_show_check import make_profile

    from autotune.machine import _hardware as hardware
    from autotune.recipe._file import RecipeFile

    outside = hardware.collect()
    if outside.get("memory_limit_bytes") is not None:
        pytest.skip("this test runs in a job with a memory limit already; the recipe must be tuned without one")
    path = tmp_path / "autotune.json"
    RecipeFile.merge_write(path, make_profile(outside, 2))
    with _memory_cgroup(900 << 20) as cgroup:
        run = subprocess.run([*cgroup.prefix(), sys.executable, "-m", "autotune", "check", str(path)],
                             capture_output=True, text=True, cwd=REPO, timeout=120,
                             env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 3, run.stdout + run.stderr
    assert "  memory limit: none -> 900.0 MiB\n" in run.stdout
    assert run.stderr == ""


_FACTORY_CHILD = """
import sys, torch, autotune
from torch.utils.data import Dataset

class Rows(Dataset):  # 1500 samples of 600 KB: 900 MB, more than the whole cgroup allows
    def __len__(self):
        return 1500
    def __getitem__(self, i):
        return torch.full((150_000,), float(i))

loader = autotune.dataloader(Rows(), sys.argv[1], progress=False)
seen = sum(int(batch.shape[0]) for batch in loader)
res = loader.autotune
print("samples", seen, "cache", res.settings["cache"], "share", res.settings["cache_share"], res.sources["cache_share"])
"""


def test_the_factory_is_not_killed_by_a_recipe_tuned_with_more_memory(tmp_path):
    from test_partial_cache import _profile

    from autotune.config import LoaderConfig
    from autotune.recipe._file import RecipeFile

    path = tmp_path / "autotune.json"
    profile = _profile(LoaderConfig(cache="memory"), peak=1300 << 20, plain=350 << 20)  # tuned outside: it fit
    profile.settings = dataclasses.replace(profile.settings, batch_size=50)
    RecipeFile.merge_write(path, profile)
    with _memory_cgroup(700 << 20) as cgroup:
        run = subprocess.run([*cgroup.prefix(), sys.executable, "-c", _FACTORY_CHILD, str(path)],
                             capture_output=True, text=True, cwd=REPO, timeout=300,
                             env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        kills = cgroup.oom_kills()
    assert run.returncode == 0 and kills == 0, (run.returncode, kills, run.stderr[-2000:])
    assert "samples 1500 cache memory share 0." in run.stdout and "fitted to the memory limit" in run.stdout
    fitted = [line for line in run.stderr.splitlines() if "the recipe adds ~" in line]
    assert len(fitted) == 1 and "cgroup memory limit of 700.0 MiB" in fitted[0], run.stderr


_GREEDY = """
import json, multiprocessing, os, sys
import torch
from torch.utils.data import Dataset

class Greedy(Dataset):
    # Small samples; a trial's DataLoader worker also takes 2 GiB, far over the job's limit (a leaky decoder).
    def __len__(self):
        return 256
    def __getitem__(self, i):
        parent = multiprocessing.parent_process()
        if parent is not None and parent.name.startswith("autotune-trial"):
            with open(os.path.join(os.environ["SCORES"], str(os.getpid())), "w") as f:
                f.write(open("/proc/self/oom_score_adj").read())
            hog = b"x" * (2 << 30)
        return torch.full((64,), float(i))

if __name__ == "__main__":
    from autotune._api import search_spec
    from autotune.dataset._userfile import UserSpec
    from autotune.tuner._options import SearchOptions

    spec = UserSpec(dataset=Greedy(), source=__file__, batch_size=16, epochs=2, sys_path=[os.path.dirname(__file__)])
    # The trial count ends it, not the clock: the default, the usual advice (workers) and one main thread. A
    # budget above the job's limit leaves the worker to the kernel: the runner's own sampled guard would race it.
    opts = SearchOptions(budget=120, max_trials=3, caches="none", workdir="work", progress=False,
                         max_memory=4 << 30)
    recipe, outcome = search_spec(spec, opts, "autotune.json")
    print(json.dumps({"failed": outcome.failed, "config": recipe.config.to_json(),
                      "score": open("/proc/self/oom_score_adj").read().strip()}))
"""


def test_a_trial_killed_by_the_oom_killer_is_a_failed_trial_and_the_search_ends_with_a_recipe(tmp_path):
    """Inside a real 800 MiB cgroup, the candidate with workers has its worker take 2 GiB: the kernel's OOM killer
    ends a process of the trial's tree (each made its first choice), the trial is failed with one line naming
    the limit, and the search goes on to a recipe, exit 0, its own process's score untouched. On the old code
    the trials' processes kept the search's score and the reason named no limit."""
    (tmp_path / "greedy.py").write_text(_GREEDY)
    scores = tmp_path / "scores"
    scores.mkdir()
    with _memory_cgroup(800 << 20) as cgroup:
        run = subprocess.run([*cgroup.prefix(), sys.executable, "greedy.py"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=240,
                             env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "SCORES": str(scores),
                                  "AUTOTUNE_CACHE_DIR": str(tmp_path / "cache")})
        kills = cgroup.oom_kills()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert kills >= 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert (tmp_path / "autotune.json").is_file()
    got = json.loads(run.stdout.strip().splitlines()[-1])
    oom = [r for r in got["failed"] if r.startswith("killed by the kernel's out-of-memory killer inside the cgroup "
                                                     "memory limit of 800.0 MiB (")]
    assert len(oom) == 1 and "\n" not in oom[0], got["failed"]
    assert got["config"]["num_workers"] == 0  # the candidate with workers never finished its trial
    assert got["score"] == "0"  # the search's process (here the user's) keeps its own score
    written = {p.read_text().strip() for p in scores.iterdir()}
    assert written == {"1000"}, written  # the trial's worker was the kernel's first choice


_HANGS_WHILE_ANOTHER_IS_KILLED = """
import subprocess, sys
from workloads import HangsInWorkers
from autotune.config import LoaderConfig
from autotune.tuner._measure import Plan, Workload
from autotune.tuner._runner import Runner, TrialFailed

if __name__ == "__main__":
    # Another job's process, in its own cgroup, is killed by the kernel while this trial hangs in its workers.
    subprocess.Popen([*sys.argv[3:], sys.executable, "-c", "import time; time.sleep(2); b = b'x' * (1 << 30)"])
    runner = Runner(Workload(dataset=HangsInWorkers(64), batch_size=8, epochs=1), [sys.argv[1]])
    plan = Plan(indices=list(range(64)), length=64, batch_timeout=30)
    try:
        runner.run(LoaderConfig(num_workers=2, prefetch_factor=2), plan, timeout=8, log_path=sys.argv[2])
    except TrialFailed as exc:
        print(type(exc).__name__, exc)
"""


def test_another_process_killed_by_the_oom_killer_while_a_trial_hangs_leaves_the_trial_its_own_reason(tmp_path):
    """The kernel's count of OOM kills grows for any process on the host (/proc/vmstat), so on a shared machine
    another job's kill lands in a trial's window: the trial that timed out (no process of its own killed) keeps
    its reason. The CI run of e5d971f (pytest -n 4, a test's cgroup OOM beside it) called a hung trial killed by
    the OOM killer."""
    script = tmp_path / "hangs.py"
    script.write_text(_HANGS_WHILE_ANOTHER_IS_KILLED)
    with _memory_cgroup(200 << 20) as cgroup:
        run = subprocess.run([sys.executable, str(script), str(REPO / "tests"), str(tmp_path / "trial.log"),
                              *cgroup.prefix()], capture_output=True, text=True, cwd=tmp_path, timeout=180,
                             env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin"})
        kills = cgroup.oom_kills()
    assert kills == 1, (kills, run.stderr[-2000:])  # the other process was killed, inside the window
    assert run.stdout.startswith("TrialTimedOut timed out after 8 s"), run.stdout + run.stderr[-2000:]


def test_only_a_process_ended_by_a_signal_can_be_the_oom_killers(tmp_path):
    """The failures a kill produces, as the runner words them (the trial process's death, torch's two messages
    for a worker's, the forkserver's broken pipe), against those that are not kills (a timeout, the guard's stop,
    the user's exception, a MemoryError under an rlimit)."""
    from autotune.tuner._runner import (
        TrialFailed,
        TrialTimedOut,
        _death_reason,
        ended_by_a_kill,
        failure_reason,
        worker_death_in_log,
    )

    log = tmp_path / "trial.log"
    log.write_text("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. \n")
    kills = [TrialFailed(worker_death_in_log(str(log))), TrialFailed(_death_reason(-9)),
             TrialFailed(failure_reason(RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly"))),
             EOFError(), BrokenPipeError()]
    others = [TrialTimedOut("timed out after 8 s: a hung worker or a very slow candidate"),
              TrialFailed("used 429.0 MiB, over the memory budget of 418.0 MiB"),
              TrialFailed(failure_reason(ValueError("bad label"))), TrialFailed(failure_reason(MemoryError())),
              TrialFailed(_death_reason(1)), TrialFailed(_death_reason(-15)), MemoryError()]
    assert [ended_by_a_kill(e) for e in kills] == [True] * len(kills)
    assert [ended_by_a_kill(e) for e in others] == [False] * len(others)
