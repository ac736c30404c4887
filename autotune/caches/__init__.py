"""Sample caches: one exact store of ``dataset[i]`` per backend (memory, pickle, hdf5, lmdb).

A plugin family: the abstract :class:`Cache` in ``_base``, one private module per backend, and the
registry (:func:`get_backend`, :func:`open_or_build`) in ``_registry``.
"""

from autotune.caches._base import FORMAT_VERSION, Cache, CorruptCache, DiskCache, StaleCache
from autotune.caches._disk_fill import DiskFill
from autotune.caches._draws import RandomSamples, last_line
from autotune.caches._fill import FirstEpochCache, GatheringFill
from autotune.caches._gather import GatherDataset, can_gather, collate_gathered
from autotune.caches._hdf5 import Hdf5Cache
from autotune.caches._key import CacheKeyWarning, dataset_key
from autotune.caches._lmdb import LmdbCache
from autotune.caches._memory import MemoryCache
from autotune.caches._partial import GatheringPartial, PartialCache, build_partial
from autotune.caches._pickle import PickleCache
from autotune.caches._registry import (
    BACKENDS,
    CacheRebuildWarning,
    cache_path,
    clear_caches,
    estimate_need,
    expected_manifest,
    get_backend,
    list_caches,
    open_or_build,
    open_or_fill,
)
from autotune.caches._trials import TRIAL_LOCK, remove_leftovers, trial_folder
from autotune.caches._trust import UntrustedCache, default_root, ensure_root

__all__ = [
    "BACKENDS",
    "FORMAT_VERSION",
    "Cache",
    "CacheKeyWarning",
    "CacheRebuildWarning",
    "CorruptCache",
    "DiskCache",
    "DiskFill",
    "FirstEpochCache",
    "RandomSamples",
    "GatherDataset",
    "GatheringFill",
    "GatheringPartial",
    "Hdf5Cache",
    "LmdbCache",
    "MemoryCache",
    "PartialCache",
    "PickleCache",
    "StaleCache",
    "TRIAL_LOCK",
    "UntrustedCache",
    "can_gather",
    "collate_gathered",
    "build_partial",
    "cache_path",
    "clear_caches",
    "dataset_key",
    "default_root",
    "ensure_root",
    "estimate_need",
    "expected_manifest",
    "get_backend",
    "list_caches",
    "open_or_build",
    "last_line",
    "open_or_fill",
    "remove_leftovers",
    "trial_folder",
]
