"""A ``LoaderConfig`` made into a real torch DataLoader, the same way for a trial and for the factory.

``_dataloader`` builds the DataLoader (the process settings reach each worker through its
``worker_init_fn``) and wraps a source in the user's per-sample ``transform``; ``_source`` decides what
the loader reads: the dataset, or a cache of it.  See docs/architecture.md.
"""

from autotune.loader._dataloader import (
    READING,
    DeviceConsumer,
    Transformed,
    TransformedStream,
    make_loader,
    move_to,
    with_transform,
)
from autotune.loader._order import EpochStream, reuses_iterator, stream_batches
from autotune.loader._source import (
    CacheSite,
    FactorySite,
    Prepared,
    Timer,
    cached_source,
    filling_source,
    partial_source,
    prepare_source,
    reading,
)

__all__ = [
    "READING",
    "CacheSite",
    "DeviceConsumer",
    "EpochStream",
    "FactorySite",
    "Prepared",
    "Timer",
    "Transformed",
    "TransformedStream",
    "cached_source",
    "filling_source",
    "make_loader",
    "move_to",
    "partial_source",
    "prepare_source",
    "reading",
    "reuses_iterator",
    "stream_batches",
    "with_transform",
]
