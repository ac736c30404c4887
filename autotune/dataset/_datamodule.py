"""A ``LightningDataModule`` read as the user's dataset: ``setup("fit")``, then ``train_dataloader()``.

``autotune search module.py:MyDataModule`` tunes that loader's dataset, batch size and collate_fn.
While it is read, ``autotune.dataloader`` (the one line in ``train_dataloader()`` that applies the
recipe) hands back a plain loader and records what it was given (``resolving``), so no recipe is
needed yet and none is applied to the search process. Lightning is never imported here: a datamodule
is recognised by its class names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from autotune.errors import DatasetError


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
