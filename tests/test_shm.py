"""The /dev/shm rule: workers x prefetch x batch bytes against free shared memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autotune.machine._shm import EXTRA_BATCHES, SLACK_BYTES, batch_bytes, shm_free, shm_need, shm_rule

MIB = 1 << 20


def test_need_arithmetic():
    assert shm_need(0, None, 38 * MIB) == 0
    assert shm_need(0, 8, 38 * MIB) == 0
    raw = (4 * 8 + EXTRA_BATCHES) * 38 * MIB
    assert shm_need(4, 8, 38 * MIB) == int(raw * 17 / 16) + SLACK_BYTES
    # prefetch_factor None means torch's default of 2
    assert shm_need(3, None, MIB) == shm_need(3, 2, MIB) == int((3 * 2 + 2) * MIB * 17 / 16) + SLACK_BYTES


def test_rule_message_and_fit():
    need = shm_need(4, 8, 38 * MIB)
    assert shm_rule(4, 8, 38 * MIB, need) is None
    assert shm_rule(4, 8, 38 * MIB, None) is None, "unknown free space rules nothing out"
    assert shm_rule(0, None, 38 * MIB, 0) is None, "no workers, no shared memory"
    reason = shm_rule(4, 8, 38 * MIB, 64 * MIB)
    assert reason == (
        "needs ~1.4 GiB of /dev/shm for 4 workers x prefetch 8 x 38.0 MiB batches, only 64.0 MiB free: "
        "the classic Docker 'bus error'; raise it with --shm-size or use fewer workers/prefetch"
    )
    assert shm_rule(4, 8, 38 * MIB, need - 1) is not None


def test_batch_bytes_of_nested_batches():
    images = torch.zeros(64, 3, 224, 224)
    labels = torch.zeros(64, dtype=torch.int64)
    assert batch_bytes((images, labels)) == 64 * 3 * 224 * 224 * 4 + 64 * 8
    nested = {"x": [images, {"y": labels}], "meta": "text", "n": 3, "arr": np.zeros(10, dtype=np.float64)}
    assert batch_bytes(nested) == images.nbytes + labels.nbytes + 80
    # views of one storage are shared once, whole (it is the storage that crosses processes)
    base = torch.zeros(100, dtype=torch.float32)
    assert batch_bytes([base[:10], base[10:20]]) == 400
    assert batch_bytes([]) == 0


def test_batch_bytes_of_a_real_collated_batch():
    batch = torch.utils.data.default_collate([(torch.ones(3, 8, 8), i) for i in range(4)])
    assert batch_bytes(batch) == 4 * 3 * 8 * 8 * 4 + 4 * 8


def test_shm_free_on_this_machine(tmp_path):
    free = shm_free()
    import os

    if not os.path.isdir("/dev/shm"):
        assert free is None
    else:
        st = os.statvfs("/dev/shm")  # other processes write there too: free space is bounded, not fixed
        assert free is not None and 0 <= free <= st.f_blocks * st.f_frsize
    assert shm_free(tmp_path / "absent") is None
    st = os.statvfs(tmp_path)
    free_here = shm_free(tmp_path)
    assert free_here is not None and 0 <= free_here <= st.f_blocks * st.f_frsize


@pytest.mark.parametrize("workers,prefetch", [(1, 1), (2, 4), (8, 8)])
def test_rule_agrees_with_need(workers, prefetch):
    need = shm_need(workers, prefetch, 10 * MIB)
    assert shm_rule(workers, prefetch, 10 * MIB, need) is None
    assert f"{workers} workers x prefetch {prefetch} x 10.0 MiB batches" in shm_rule(workers, prefetch, 10 * MIB, need // 2)
