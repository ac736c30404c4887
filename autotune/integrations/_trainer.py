"""The Hugging Face Trainer: which of a recipe's settings ``TrainingArguments`` can carry, and which not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from autotune.process import DEFAULT_ALLOCATOR

if TYPE_CHECKING:
    from autotune.config import LoaderConfig


class TrainerArguments(NamedTuple):
    """``arguments`` go to ``TrainingArguments(**arguments)``; ``not_carried`` says, one line each, what
    the recipe holds that those arguments cannot carry, and how to apply it instead."""

    arguments: dict[str, Any]
    not_carried: list[str]


def trainer_arguments(config: LoaderConfig) -> TrainerArguments:
    """The recipe's loader settings as ``TrainingArguments`` fields (LoaderConfig's rules already leave the
    worker-only ones unset without workers)."""
    workers = config.num_workers
    arguments = {
        "dataloader_num_workers": workers,
        "dataloader_pin_memory": config.pin_memory,
        "dataloader_persistent_workers": config.persistent_workers,
        "dataloader_prefetch_factor": config.prefetch_factor,
    }
    lost = []
    if config.cache is not None:
        lost.append(f"cache={config.cache}: override Trainer.get_train_dataloader() to return "
                    "recipe.dataloader(train_dataset, ...), which builds and reads the cache")
    if workers and config.multiprocessing_context not in (None, "fork"):
        lost.append(f"multiprocessing_context={config.multiprocessing_context}: the Trainer's DataLoader uses the "
                    "default start method; set it with torch.multiprocessing.set_start_method")
    if config.allocator != DEFAULT_ALLOCATOR:
        lost.append(f"allocator={config.allocator}: start training with `autotune run -- python train.py`")
    if config.main_threads is not None:
        lost.append(f"main_threads={config.main_threads}: call torch.set_num_threads({config.main_threads}) "
                    "in the training script, or start it with `autotune run`")
    if config.worker_threads is not None:
        lost.append(f"worker_threads={config.worker_threads}: the Trainer's DataLoader takes no worker_init_fn; "
                    "override Trainer.get_train_dataloader() to return recipe.dataloader(train_dataset, ...), "
                    "which sets it in each worker")
    return TrainerArguments(arguments, lost)
