"""CachedDataset: the cache, then the user's ``transform`` on every access (random augmentation stays random).

It is the same wrapper the loader puts around any source, under the name cache users look for.
"""

from autotune._loader import Transformed as CachedDataset

__all__ = ["CachedDataset"]
