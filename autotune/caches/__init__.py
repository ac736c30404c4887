"""Sample caches: one exact store of ``dataset[i]`` per backend (memory, pickle, hdf5, lmdb).

A plugin family: the abstract :class:`Cache` in ``_base``, one private module per backend, each
class registered in ``_family`` (:func:`register`, :func:`get_backend`, :func:`backend_names`), and
open-or-build, list and clear in ``_registry``.
"""

from autotune.caches._base import FORMAT_VERSION, Cache, CorruptCache, DiskCache, StaleCache
from autotune.caches._dataset import CachedDataset
from autotune.caches._family import backend as get_backend
from autotune.caches._family import disk_names, register, unregister
from autotune.caches._family import names as backend_names
from autotune.caches._hdf5 import Hdf5Cache
from autotune.caches._key import dataset_key
from autotune.caches._lmdb import LmdbCache
from autotune.caches._memory import MemoryCache
from autotune.caches._pickle import PickleCache
from autotune.caches._registry import (
    CacheRebuildWarning,
    cache_path,
    clear_caches,
    estimate_need,
    expected_manifest,
    list_caches,
    open_or_build,
)
from autotune.caches._trust import UntrustedCache, default_root, ensure_root

__all__ = [
    "FORMAT_VERSION",
    "Cache",
    "CacheRebuildWarning",
    "CachedDataset",
    "CorruptCache",
    "DiskCache",
    "Hdf5Cache",
    "LmdbCache",
    "MemoryCache",
    "PickleCache",
    "StaleCache",
    "UntrustedCache",
    "backend_names",
    "cache_path",
    "clear_caches",
    "dataset_key",
    "default_root",
    "disk_names",
    "ensure_root",
    "estimate_need",
    "expected_manifest",
    "get_backend",
    "list_caches",
    "open_or_build",
    "register",
    "unregister",
]
