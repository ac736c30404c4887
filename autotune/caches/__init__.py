"""Sample caches: one exact store of ``dataset[i]`` per backend (memory, pickle, hdf5, lmdb).

A plugin family: the abstract :class:`Cache` in ``_base``, one private module per backend, each
class registered in ``_family`` (:func:`register`, :func:`get_backend`, :func:`backend_names`), and
open-or-build, list and clear in ``_registry``.
"""

from autotune.caches._base import FORMAT_VERSION, READ_CHUNK, Cache, CorruptCache, DiskCache, StaleCache, takes
from autotune.caches._disk_fill import DiskFill
from autotune.caches._draws import RandomSamples, last_line
from autotune.caches._family import backend as get_backend
from autotune.caches._family import disk_names, register, unregister
from autotune.caches._family import names as backend_names
from autotune.caches._fill import FirstEpochCache, GatheringFill
from autotune.caches._gather import GatherDataset, can_gather, collate_gathered
from autotune.caches._hdf5 import Hdf5Cache
from autotune.caches._key import CacheKeyWarning, dataset_key
from autotune.caches._lmdb import LmdbCache
from autotune.caches._memory import MemoryCache
from autotune.caches._partial import GatheringPartial, PartialCache, build_partial
from autotune.caches._pickle import PickleCache
from autotune.caches._registry import (
    CacheRebuildWarning,
    cache_path,
    clear_caches,
    estimate_need,
    expected_manifest,
    list_caches,
    open_or_build,
    open_or_fill,
)
from autotune.caches._trials import TRIAL_LOCK, remove_leftovers, remove_trial_folder, trial_folder
from autotune.caches._trust import UntrustedCache, default_root, ensure_root

__all__ = [
    "FORMAT_VERSION",
    "READ_CHUNK",
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
    "backend_names",
    "build_partial",
    "cache_path",
    "can_gather",
    "takes",
    "clear_caches",
    "collate_gathered",
    "dataset_key",
    "default_root",
    "disk_names",
    "ensure_root",
    "estimate_need",
    "expected_manifest",
    "get_backend",
    "list_caches",
    "open_or_build",
    "last_line",
    "open_or_fill",
    "register",
    "remove_leftovers",
    "remove_trial_folder",
    "trial_folder",
    "unregister",
]
