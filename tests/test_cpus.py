"""usable_cpus / cpu_limits against fake cgroup v1 and v2 trees and explicit affinity sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.machine._cpus import cgroup_quota, cpu_limits, usable_cpus


def v2(root: Path, cpu_max: str, rel: str = "") -> Path:
    folder = root / rel if rel else root
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.max").write_text(cpu_max + "\n")
    return root


def v1(root: Path, quota: int, period: int = 100000, mount: str = "cpu", rel: str = "") -> Path:
    folder = root / mount / rel if rel else root / mount
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


EIGHT = set(range(8))


def test_v2_quota_limits(tmp_path):
    root = v2(tmp_path, "200000 100000")
    assert usable_cpus(cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 2
    limits = cpu_limits(cgroup_root=root, affinity=EIGHT, cgroup_path="/")
    assert limits["limited_by"] == "cgroup"
    assert limits["cgroup_quota"] == 2.0
    assert limits["cgroup_source"] == str(root / "cpu.max")
    assert limits["affinity"] == 8


def test_v2_max_means_no_quota(tmp_path):
    root = v2(tmp_path, "max 100000")
    assert usable_cpus(cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 8
    assert cpu_limits(cgroup_root=root, affinity=EIGHT, cgroup_path="/")["limited_by"] == "affinity"


def test_fractional_quota_rounds_down(tmp_path):
    root = v2(tmp_path, "250000 100000")  # 2.5 CPUs
    assert usable_cpus(cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 2


def test_quota_below_one_cpu_gives_one(tmp_path):
    root = v2(tmp_path, "50000 100000")
    assert usable_cpus(cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 1


def test_affinity_tighter_than_quota(tmp_path):
    root = v2(tmp_path, "800000 100000")
    limits = cpu_limits(cgroup_root=root, affinity={0, 3, 5}, cgroup_path="/")
    assert limits["usable_cpus"] == 3
    assert limits["limited_by"] == "affinity"


def test_v2_nested_cgroup_and_parent(tmp_path):
    v2(tmp_path, "max 100000")
    v2(tmp_path, "600000 100000", rel="job")
    v2(tmp_path, "300000 100000", rel="job/step")
    assert usable_cpus(cgroup_root=tmp_path, affinity=EIGHT, cgroup_path="/job/step") == 3
    # a parent's quota binds its children too
    v2(tmp_path, "100000 100000", rel="job")
    assert usable_cpus(cgroup_root=tmp_path, affinity=EIGHT, cgroup_path="/job/step") == 1


@pytest.mark.parametrize("mount", ["cpu", "cpu,cpuacct"])
def test_v1_quota(tmp_path, mount):
    root = v1(tmp_path, 400000, 100000, mount=mount)
    limits = cpu_limits(cgroup_root=root, affinity=EIGHT, cgroup_path="/")
    assert limits["usable_cpus"] == 4
    assert limits["limited_by"] == "cgroup"
    assert limits["cgroup_quota"] == 4.0


def test_v1_minus_one_means_no_quota(tmp_path):
    root = v1(tmp_path, -1)
    assert usable_cpus(cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 8
    assert cgroup_quota(root, cgroup_path="/") == (None, None)


def test_v1_other_period(tmp_path):
    root = v1(tmp_path, 150000, 50000)  # 3 CPUs
    assert usable_cpus(cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 3


def test_garbage_and_missing_files_are_ignored(tmp_path):
    v2(tmp_path, "not numbers")
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("oops")
    assert usable_cpus(cgroup_root=tmp_path, affinity=EIGHT, cgroup_path="/") == 8
    assert usable_cpus(cgroup_root=tmp_path / "absent", affinity=EIGHT, cgroup_path="/") == 8


def test_ranks_per_node_divides(tmp_path):
    root = v2(tmp_path, "max 100000")
    limits = cpu_limits(4, cgroup_root=root, affinity=EIGHT, cgroup_path="/")
    assert limits["usable_cpus"] == 2
    assert limits["limited_by"] == "ranks"
    assert "4 ranks" in limits["reason"]
    assert usable_cpus(16, cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 1
    assert usable_cpus(3, cgroup_root=root, affinity=EIGHT, cgroup_path="/") == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_ranks_per_node(bad, tmp_path):
    with pytest.raises(ValueError, match="ranks_per_node"):
        usable_cpus(bad, cgroup_root=tmp_path, affinity=EIGHT)


def test_empty_affinity_still_one(tmp_path):
    assert usable_cpus(cgroup_root=tmp_path, affinity=set(), cgroup_path="/") == 1


def test_real_machine_is_within_bounds():
    n = usable_cpus()
    assert 1 <= n <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert n <= len(os.sched_getaffinity(0))
