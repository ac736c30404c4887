"""Lightning: tune a ``LightningDataModule``'s training loader, and keep Lightning's worker-count advice
quiet when the recipe chose ``num_workers=0`` by measurement.

``autotune search module.py:MyDataModule`` calls ``setup("fit")`` and then ``train_dataloader()``, and
tunes that loader's dataset, batch size and collate_fn. While it does, ``autotune.dataloader`` (the one
line in ``train_dataloader()`` that applies the recipe) hands back a plain loader and records what it
was given, so no recipe is needed yet and none is applied to the search process. Lightning is never
imported here: a datamodule is recognised by its class names.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from autotune._loader import with_transform
from autotune.dataset._stream import is_stream
from autotune.errors import DatasetError

log = logging.getLogger("autotune")

# Lightning's message (lightning/pytorch/trainer/connectors/data_connector.py, ``_worker_check``);
# its category is PossibleUserWarning, a UserWarning from ``lightning`` or ``lightning_fabric``.
WORKER_WARNING = r"The '\w+' does not have many workers"


@dataclass
class Resolved:
    """What the training loader of a datamodule reads, and how."""

    dataset: Any
    batch_size: int | None = None
    collate_fn: Callable[..., Any] | None = None
    transform: Callable[..., Any] | None = None


_RESOLVING: ContextVar[list[Resolved] | None] = ContextVar("autotune_resolving", default=None)


def resolving() -> list[Resolved] | None:
    """Inside ``resolve_datamodule``: the list ``autotune.dataloader`` records its calls in, else None."""
    return _RESOLVING.get()


@contextlib.contextmanager
def _recording() -> Iterator[list[Resolved]]:
    calls: list[Resolved] = []
    token = _RESOLVING.set(calls)
    try:
        yield calls
    finally:
        _RESOLVING.reset(token)


def plain_loader(dataset: Any, calls: list[Resolved], *, transform: Callable[..., Any] | None = None,
                 **kwargs: Any) -> Any:
    """What ``autotune.dataloader`` returns while a datamodule is resolved: torch's defaults."""
    from torch.utils.data import DataLoader


    for key in ("cache", "cache_dir", "progress", "apply_process_settings", "on_mismatch", "loader_cls"):
        kwargs.pop(key, None)
    calls.append(Resolved(dataset, kwargs.get("batch_size"), kwargs.get("collate_fn"), transform))
    return DataLoader(with_transform(dataset, transform, is_stream(dataset)), **kwargs)


def is_datamodule(obj: Any) -> bool:
    return any(c.__name__ == "LightningDataModule" and c.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
               for c in type(obj).__mro__)


def resolve_datamodule(module: Any, where: str) -> Resolved:
    """``setup("fit")``, then ``train_dataloader()``: its dataset, batch size and collate_fn."""
    from torch.utils.data import DataLoader, default_collate

    try:
        with _recording() as calls:
            module.prepare_data()
            module.setup("fit")
            loader = module.train_dataloader()
    except Exception as exc:  # noqa: BLE001 - the user's datamodule can raise anything
        raise DatasetError(
            f"{where}: setup('fit') or train_dataloader() raised {type(exc).__name__}: {exc}. "
            "Fix the datamodule (run with --debug for the traceback)."
        ) from exc
    if not isinstance(loader, DataLoader):
        raise DatasetError(f"{where}.train_dataloader() returned a {type(loader).__name__}; autotune tunes one "
                           "torch DataLoader. Return a single DataLoader for training.")
    if calls:  # built by autotune.dataloader: the dataset before any transform
        found = calls[-1]
        found.batch_size = found.batch_size or loader.batch_size
        return found
    collate = loader.collate_fn if loader.collate_fn is not default_collate else None
    return Resolved(loader.dataset, loader.batch_size, collate)


def quiet_worker_warning(profile: Any) -> None:
    """Filter exactly Lightning's "does not have many workers" warning when the recipe chose no workers by
    measurement; said once in the log, with the figure that justifies it."""
    if "lightning" not in sys.modules and "pytorch_lightning" not in sys.modules:
        return
    for action, message, *_ in warnings.filters:
        if action == "ignore" and message is not None and message.pattern == WORKER_WARNING:
            return
    warnings.filterwarnings("ignore", message=WORKER_WARNING, category=UserWarning)
    note = profile.measured.note
    log.info("autotune: Lightning's 'does not have many workers' warning is filtered: this machine's recipe "
             "chose num_workers=0 by measurement%s", f" ({note})" if note else "")
