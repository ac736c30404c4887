"""Lightning: while a ``LightningDataModule`` is read (``autotune.dataset._datamodule``),
``autotune.dataloader`` hands back a plain loader and records what it was given; and Lightning's
worker-count advice is kept quiet when the recipe chose ``num_workers=0`` by measurement. Lightning is
never imported here.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

from autotune.dataset import Resolved, is_stream
from autotune.loader import with_transform

log = logging.getLogger("autotune")

# Lightning's message (lightning/pytorch/trainer/connectors/data_connector.py, ``_worker_check``), naming the
# loader it checks; its category is PossibleUserWarning, a UserWarning from ``lightning`` or
# ``lightning_fabric``. Only the training loader's is filtered: the recipe measured the training data, not
# the validation set a val_dataloader reads.
WORKER_WARNING = r"The 'train_dataloader' does not have many workers"


def plain_loader(dataset: Any, calls: list[Resolved], *, transform: Callable[..., Any] | None = None,
                 **kwargs: Any) -> Any:
    """What ``autotune.dataloader`` returns while a datamodule is resolved: torch's defaults."""
    from torch.utils.data import DataLoader


    for key in ("cache", "cache_dir", "progress", "apply_process_settings", "on_mismatch", "loader_cls"):
        kwargs.pop(key, None)
    calls.append(Resolved(dataset, kwargs.get("batch_size"), kwargs.get("collate_fn"), transform))
    return DataLoader(with_transform(dataset, transform, is_stream(dataset)), **kwargs)


def quiet_worker_warning(note: str = "") -> None:
    """Filter exactly Lightning's "does not have many workers" warning of the training loader when the recipe
    chose no workers by measurement; said once in the log, with the figure that justifies it (the recipe's
    ``note``)."""
    if "lightning" not in sys.modules and "pytorch_lightning" not in sys.modules:
        return
    for action, message, *_ in warnings.filters:
        if action == "ignore" and message is not None and message.pattern == WORKER_WARNING:
            return
    warnings.filterwarnings("ignore", message=WORKER_WARNING, category=UserWarning)
    log.info("autotune: Lightning's 'train_dataloader does not have many workers' warning is filtered (not "
             "another loader's): this machine's recipe chose num_workers=0 by measurement%s",
             f" ({note})" if note else "")
