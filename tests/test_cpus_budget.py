"""The CPU budget with all three limits at once: affinity, a cgroup quota file, ranks per node."""

from __future__ import annotations

import pytest

from autotune.machine._cpus import cpu_limits, usable_cpus


def quota(root, cpus_x100k: int, period: int = 100000):
    (root / "cpu.max").write_text(f"{cpus_x100k} {period}\n")
    return root


@pytest.mark.parametrize("affinity,quota_us,ranks,expected,limited_by", [
    (set(range(16)), 800000, 2, 4, "ranks"),  # quota 8 < affinity 16, shared by 2
    (set(range(6)), 800000, 2, 3, "ranks"),  # affinity 6 < quota 8, shared by 2
    (set(range(16)), 250000, 2, 1, "ranks"),  # quota 2.5 -> 2, by 2 ranks -> 1
    (set(range(16)), 800000, 3, 2, "ranks"),  # 8 // 3
    (set(range(16)), 800000, 16, 1, "ranks"),  # never below one
    (set(range(16)), 800000, 1, 8, "cgroup"),
    ({0, 2}, 800000, 1, 2, "affinity"),
])
def test_affinity_quota_and_ranks_together(tmp_path, affinity, quota_us, ranks, expected, limited_by):
    root = quota(tmp_path, quota_us)
    limits = cpu_limits(ranks, cgroup_root=root, affinity=affinity, cgroup_path="/")
    assert limits["usable_cpus"] == expected
    assert limits["limited_by"] == limited_by
    assert usable_cpus(ranks, cgroup_root=root, affinity=affinity, cgroup_path="/") == expected


def test_reason_names_every_limit_that_applied(tmp_path):
    root = quota(tmp_path, 400000)
    limits = cpu_limits(2, cgroup_root=root, affinity=set(range(16)), cgroup_path="/")
    assert limits["usable_cpus"] == 2
    assert "cgroup quota of 4 CPUs" in limits["reason"] and str(root / "cpu.max") in limits["reason"]
    assert "shared by 2 ranks" in limits["reason"]
    assert limits["affinity"] == 16 and limits["cgroup_quota"] == 4.0 and limits["ranks_per_node"] == 2
