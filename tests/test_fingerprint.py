"""Fingerprints are stable and change with length, sample bits or the source text."""

from __future__ import annotations

import numpy as np
import torch
from test_codec import ZooDataset

from autotune.dataset._fingerprint import dataset_fingerprint, probe_indices


class Arrays(torch.utils.data.Dataset):
    def __init__(self, n, bump=None):
        self.n, self.bump = n, bump

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        a = np.full(3, i, dtype=np.float32)
        if i == self.bump:
            a[0] = np.nextafter(a[0], np.float32(1e9))  # one bit
        return a


def test_probe_indices():
    assert probe_indices(100, 4) == [0, 33, 66, 99]
    assert probe_indices(1, 4) == [0]
    assert probe_indices(0, 4) == []


def test_fingerprint_is_stable_and_sensitive():
    fp = dataset_fingerprint(Arrays(100))
    assert fp == dataset_fingerprint(Arrays(100)) and len(fp) == 16
    assert fp != dataset_fingerprint(Arrays(101))
    assert fp != dataset_fingerprint(Arrays(100, bump=99))
    assert fp != dataset_fingerprint(Arrays(100), source_text="x = 1")
    assert dataset_fingerprint(Arrays(100), "x = 1") != dataset_fingerprint(Arrays(100), "x = 2")
    assert dataset_fingerprint(ZooDataset(4)) == dataset_fingerprint(ZooDataset(4))
