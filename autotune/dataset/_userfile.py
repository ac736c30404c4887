"""Import the user's dataset file and resolve the dataset and the optional hooks it declares
(docs/architecture.md §1)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.dataset._datamodule import Resolved, is_datamodule, resolve_datamodule
from autotune.dataset._stream import is_stream
from autotune.dataset._watchdog import reading
from autotune.errors import DatasetError

DEFAULT_BATCH_SIZE = 32
DEFAULT_EPOCHS = 10


@dataclass
class UserSpec:
    """A dataset and the hooks that shape how it is loaded and consumed."""

    dataset: Any
    source: str
    batch_size: int = DEFAULT_BATCH_SIZE
    epochs: int = DEFAULT_EPOCHS
    collate_fn: Callable[..., Any] | None = None
    transform: Callable[..., Any] | None = None
    train_step: Callable[..., Any] | None = None
    # Samples in one epoch of a stream without __len__ (an IterableDataset is measured over a bounded
    # number of batches, and the epoch extrapolated from them when its length is known).
    samples_per_epoch: int | None = None
    source_text: str | None = None
    # Folders child processes must put on sys.path to unpickle what the file defines.
    sys_path: list[str] = field(default_factory=list)


def looks_like_dataset(obj: Any) -> bool:
    return is_stream(obj) or (hasattr(obj, "__getitem__") and hasattr(obj, "__len__"))


def check_dataset(obj: Any, where: str) -> None:
    """Raise DatasetError unless ``obj`` is a stream (an IterableDataset) or a non-empty map-style dataset."""
    if not is_stream(obj):
        check_map_style(obj, where)


def require_map_style(spec: UserSpec, command: str) -> None:
    """For the commands that read samples by index: a stream gets one line saying what to do instead."""
    if is_stream(spec.dataset):
        raise DatasetError(f"{spec.source} is a stream (IterableDataset); `autotune {command}` reads samples by "
                           "index, so it needs a map-style dataset. `autotune search` tunes streams.")


def check_map_style(obj: Any, where: str) -> None:
    """Raise DatasetError unless ``obj`` is a non-empty map-style dataset."""
    if not (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")):
        raise DatasetError(
            f"{where} is a {type(obj).__name__}, not a dataset: it needs __getitem__(int) and __len__() "
            "(map-style), or __iter__ as a torch.utils.data.IterableDataset (a stream)."
        )
    try:
        with reading(f"len() of {where}"):
            length = len(obj)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's __len__ is reported the same way
        raise DatasetError(f"len() of {where} raised {type(exc).__name__}: {exc}. Fix its __len__().") from exc
    if length == 0:
        raise DatasetError(f"{where} is empty (len 0); point it at some data before tuning.")


def read_sample(dataset: Any, index: int) -> Any:
    """``dataset[index]``, with a failure turned into a one-line DatasetError naming the index."""
    try:
        with reading(f"dataset[{index}]"):
            return dataset[index]
    except Exception as exc:  # noqa: BLE001 - the user's __getitem__ can raise anything
        hint = "Fix the dataset's __getitem__ (run with --debug for the traceback)."
        if isinstance(exc, IndexError):
            with contextlib.suppress(Exception):
                hint = (f"Does __len__ ({len(dataset)}) promise more samples than __getitem__ serves? Make the "
                        "two agree (run with --debug for the traceback).")
        raise DatasetError(f"dataset[{index}] raised {type(exc).__name__}: {exc}. {hint}") from exc


def _int_hook(module: Any, name: str, default: int, where: str) -> int:
    value = getattr(module, name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DatasetError(f"{name} in {where} must be a positive int, but got {value!r}.")
    return value


def _callable_hook(module: Any, name: str, where: str) -> Callable[..., Any] | None:
    value = getattr(module, name, None)
    if value is not None and not callable(value):
        raise DatasetError(f"{name} in {where} must be callable, but got a {type(value).__name__}.")
    return value


def _dataset_like_names(module: Any) -> list[str]:
    """Names a user may have meant: dataset objects, and dataset classes or factories defined in the file."""
    names = []
    for key, value in vars(module).items():
        if key.startswith("_") or isinstance(value, type(sys)):
            continue
        if not isinstance(value, type) and looks_like_dataset(value):
            names.append(key)
        elif callable(value) and getattr(value, "__module__", None) == module.__name__:
            is_dataset_class = isinstance(value, type) and looks_like_dataset_class(value)
            if is_dataset_class or "data" in key.lower():
                names.append(key)
    return sorted(names)


def looks_like_dataset_class(cls: type) -> bool:
    return hasattr(cls, "__getitem__") and hasattr(cls, "__len__")


def import_file(path: Path) -> Any:
    """Import ``path`` as a top-level module named after the file, its folder on sys.path.

    Importing by name (not from a spec) keeps classes defined there picklable into workers.
    """
    folder = str(path.parent.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != path.resolve():
        raise DatasetError(
            f"{path} is named like the module {name!r} that is already imported from elsewhere; "
            "rename the dataset file."
        )
    try:
        return importlib.import_module(name)
    except SyntaxError as exc:
        raise DatasetError(
            f"{path} does not import: SyntaxError: {exc.msg} (line {exc.lineno}). Fix the file."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - anything the user's module raises at import
        raise DatasetError(
            f"{path} does not import: {type(exc).__name__}: {exc}. "
            "Fix the file or install what it needs (run with --debug for the traceback)."
        ) from exc


def load_user_file(target: str, *, batch_size: int | None = None, epochs: int | None = None,
                   samples_per_epoch: int | None = None) -> UserSpec:
    """Resolve ``PATH[:NAME]`` into a UserSpec; flags given here override the file's values."""
    path_text, _, name = target.partition(":") if not Path(target).exists() else (target, "", "")
    name = name or "dataset"
    path = Path(path_text)
    if not path.is_file():
        raise DatasetError(
            f"No such dataset file: {path_text!r}. Pass the path of a Python file that defines {name!r}."
        )
    module = import_file(path)
    where = f"{name!r} in {path}"
    if not hasattr(module, name):
        found = _dataset_like_names(module)
        hint = (f"Dataset-like names in the file: {', '.join(found)}." if found
                else "It defines none that look like a dataset.")
        raise DatasetError(f"{path} has no attribute {name!r}. {hint} Pass one as {path}:NAME.")
    obj = getattr(module, name)
    if callable(obj) and (isinstance(obj, type) or not looks_like_dataset(obj)):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001
            raise DatasetError(
                f"Calling {name}() from {path} raised {type(exc).__name__}: {exc}. "
                "Fix it (run with --debug for the traceback)."
            ) from exc
    # A LightningDataModule: its training loader's dataset, batch size and collate_fn (the file's hooks win).
    resolved = resolve_datamodule(obj, where) if is_datamodule(obj) else Resolved(obj)
    obj = resolved.dataset
    check_dataset(obj, where)
    stream = is_stream(obj)
    spec = UserSpec(
        dataset=obj,
        source=f"{path}:{name}",
        batch_size=batch_size or _int_hook(module, "batch_size", resolved.batch_size or DEFAULT_BATCH_SIZE, str(path)),
        epochs=epochs or _int_hook(module, "epochs", DEFAULT_EPOCHS, str(path)),
        collate_fn=_callable_hook(module, "collate_fn", str(path)) or resolved.collate_fn,
        transform=_callable_hook(module, "transform", str(path)) or resolved.transform,
        train_step=_callable_hook(module, "train_step", str(path)),
        samples_per_epoch=samples_per_epoch or (
            _int_hook(module, "samples_per_epoch", 1, str(path)) if hasattr(module, "samples_per_epoch") else None),
        source_text=path.read_text(errors="replace"),
        sys_path=[str(path.parent.resolve())],
    )
    if not stream:
        read_sample(obj, 0)
    return spec
