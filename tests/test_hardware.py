"""collect_* facts, the fingerprint, differences and distance."""

from __future__ import annotations

import re

import pytest
import torch

from autotune.machine import _hardware as hardware

GIB = 1024**3


def machine(**changes):
    hw = {
        "cpu_model": "AMD EPYC 7763 64-Core Processor",
        "usable_cpus": 8,
        "logical_cpus": 16,
        "memory_bytes": 32 * GIB - 300 * 1024**2,
        "gpus": [],
        "torch": "2.13.0+cpu",
        "cuda": None,
        "python": "3.11.7",
        "platform": "Linux-6.5.0-x86_64-with-glibc2.36",
        "shm_bytes": 16 * GIB,
    }
    hw.update(changes)
    return hw


def test_collect_has_every_key_with_sane_types():
    hw = hardware.collect()
    assert set(hw) == {
        "cpu_model", "usable_cpus", "logical_cpus", "memory_bytes", "gpus", "torch", "cuda",
        "python", "platform", "shm_bytes", "fingerprint", "ranks_per_node", "memory_limit_bytes",
    }
    assert hw["memory_limit_bytes"] is None or 0 < hw["memory_limit_bytes"] < hw["memory_bytes"]
    assert hw["ranks_per_node"] == 1
    assert isinstance(hw["usable_cpus"], int) and hw["usable_cpus"] >= 1
    assert isinstance(hw["memory_bytes"], int) and hw["memory_bytes"] > 0
    assert isinstance(hw["gpus"], list)
    assert hw["torch"] == torch.__version__
    assert hw["cuda"] == torch.version.cuda
    assert re.fullmatch(r"[0-9a-f]{12}", hw["fingerprint"])
    assert hw["fingerprint"] == hardware.fingerprint(hw)


def test_collect_is_stable_across_calls():
    assert hardware.collect()["fingerprint"] == hardware.collect()["fingerprint"]


def test_cpu_model_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD  EPYC 7763 \n")
    assert hardware.collect_cpu_model(str(info)) == "AMD EPYC 7763"


def test_cpu_model_falls_back_without_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware.platform, "processor", lambda: "")
    monkeypatch.setattr(hardware.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(hardware.sys, "platform", "linux")
    assert hardware.collect_cpu_model(str(tmp_path / "absent")) == "aarch64"


def test_shm_missing_is_none(tmp_path):
    assert hardware.collect_shm_bytes(str(tmp_path / "absent")) is None
    assert hardware.collect_shm_bytes(str(tmp_path)) > 0


def test_gpus_without_cuda_is_empty(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.collect_gpus() == []


def test_gpus_branch_with_cuda(monkeypatch):
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: names[i])
    assert hardware.collect_gpus() == names
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    hw = hardware.collect()
    assert hw["gpus"] == names and hw["cuda"] == "12.4"
    assert "2x NVIDIA H100 80GB HBM3" in hardware.describe(hw)
    assert "CUDA 12.4" in hardware.describe(hw)


def test_gpus_broken_driver_is_empty(monkeypatch):
    def boom():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", boom)
    assert hardware.collect_gpus() == []


def test_fingerprint_ignores_unstable_fields():
    base = hardware.fingerprint(machine())
    assert base == hardware.fingerprint(machine(python="3.11.9", platform="other", shm_bytes=1))
    assert base == hardware.fingerprint(machine(logical_cpus=64))
    assert base == hardware.fingerprint(machine(torch="2.13.1+cpu"))  # patch level
    assert base == hardware.fingerprint(machine(memory_bytes=32 * GIB + 100 * 1024**2))  # same GiB
    assert base == hardware.fingerprint(dict(machine(), fingerprint="stale"))


@pytest.mark.parametrize(
    "change",
    [
        {"cpu_model": "Intel Xeon"},
        {"usable_cpus": 4},
        {"memory_bytes": 64 * GIB},
        {"gpus": ["NVIDIA A100"]},
        {"torch": "2.14.0"},
        {"cuda": "12.4"},
    ],
)
def test_fingerprint_sensitive_to_identity(change):
    assert hardware.fingerprint(machine()) != hardware.fingerprint(machine(**change))


def test_fingerprint_is_a_known_value():
    # pinned: a change here orphans every profile in every existing autotune.json
    assert hardware.fingerprint(machine()) == "e6c80d66b5f7"
    ident = hardware.identity(machine())
    assert ident == {
        "cpu_model": "AMD EPYC 7763 64-Core Processor",
        "usable_cpus": 8,
        "memory_gib": 32,
        "gpus": [],
        "torch": "2.13",
        "cuda": None,
    }


def test_memory_limit_is_in_the_identity_only_when_there_is_one():
    # No limit, and profiles written before the field: the fingerprint pinned above, unchanged.
    assert hardware.fingerprint(machine(memory_limit_bytes=None)) == "e6c80d66b5f7"
    limited = machine(memory_limit_bytes=int(1.2 * GIB))
    assert hardware.identity(limited)["memory_limit_mib"] == 1229
    assert hardware.fingerprint(limited) != hardware.fingerprint(machine())
    assert hardware.fingerprint(limited) != hardware.fingerprint(machine(memory_limit_bytes=GIB))  # not whole GiB
    assert hardware.fingerprint(limited) == hardware.fingerprint(machine(memory_limit_bytes=int(1.2 * GIB) + 4096))
    assert hardware.differences(machine(memory_limit_bytes=64 * GIB), machine(memory_limit_bytes=8 * GIB)) == [
        "memory limit: 64.0 GiB -> 8.0 GiB"]
    assert hardware.differences(machine(), limited) == ["memory limit: none -> 1.2 GiB"]
    assert "job limit 1.2 GiB" in hardware.describe(limited)
    assert "job limit" not in hardware.describe(machine())


def test_distance_weighs_the_limit_as_memory():
    here = machine(memory_limit_bytes=8 * GIB)
    assert hardware.distance(here, machine(memory_limit_bytes=8 * GIB)) == 0.0
    near, far = machine(memory_limit_bytes=16 * GIB), machine(memory_limit_bytes=64 * GIB)
    assert 0 < hardware.distance(here, near) < hardware.distance(here, far)
    assert hardware.distance(here, machine()) == pytest.approx(2.0)  # 8 GiB of limit against a 32 GiB host


def test_differences_wording():
    old = machine(usable_cpus=2)
    new = machine(usable_cpus=8, gpus=["NVIDIA H100"], torch="2.14.0", cuda="12.4",
                  memory_bytes=64 * GIB, cpu_model="Intel Xeon")
    assert hardware.differences(old, new) == [
        "CPU model: AMD EPYC 7763 64-Core Processor -> Intel Xeon",
        "usable CPUs: 2 -> 8",
        "memory: 32 GiB -> 64 GiB",
        "GPUs: none -> 1x NVIDIA H100",
        "torch: 2.13 -> 2.14",
        "CUDA: none -> 12.4",
    ]


def test_differences_gpu_counts_and_empty():
    a = machine(gpus=["NVIDIA A100"] * 4 + ["NVIDIA T4"])
    b = machine(gpus=[])
    assert hardware.differences(a, b) == ["GPUs: 4x NVIDIA A100, 1x NVIDIA T4 -> none"]
    assert hardware.differences(a, a) == []
    assert hardware.differences(machine(), machine(python="3.12.0")) == []


def test_differences_empty_iff_same_fingerprint():
    variants = [machine(), machine(usable_cpus=4), machine(gpus=["X"]), machine(shm_bytes=1)]
    for a in variants:
        for b in variants:
            same = hardware.fingerprint(a) == hardware.fingerprint(b)
            assert (hardware.differences(a, b) == []) == same


def test_differences_with_missing_fields():
    assert hardware.differences({}, machine(usable_cpus=4))[1] == "usable CPUs: none -> 4"


def test_distance_orders_machines():
    here = machine(usable_cpus=8)
    assert hardware.distance(here, machine(python="3.12.1")) == 0.0
    same_cpus_other_torch = machine(torch="2.14.0")
    more_cpus = machine(usable_cpus=32)
    with_gpu = machine(gpus=["NVIDIA H100"], cuda="12.4")
    d_torch = hardware.distance(here, same_cpus_other_torch)
    d_cpus = hardware.distance(here, more_cpus)
    d_gpu = hardware.distance(here, with_gpu)
    assert 0 < d_torch < d_cpus < d_gpu
    # closer CPU count is nearer
    assert hardware.distance(here, machine(usable_cpus=6)) < hardware.distance(here, machine(usable_cpus=2))
    # symmetric
    assert hardware.distance(here, with_gpu) == hardware.distance(with_gpu, here)


def test_distance_positive_whenever_identity_differs():
    base = machine()
    for change in [{"memory_bytes": 33 * GIB}, {"cpu_model": "x"}, {"cuda": "12.1"},
                   {"gpus": ["A"]}, {"usable_cpus": 9}, {"memory_bytes": 0}]:
        assert hardware.distance(base, machine(**change)) > 0


def test_format_helpers():
    assert hardware.format_gpus([]) == "none"
    assert hardware.format_gpus(["A", "B", "A"]) == "2x A, 1x B"
    assert hardware.format_bytes(3 * GIB // 2) == "1.5 GiB"
    assert hardware.format_bytes(None) == "unknown"
