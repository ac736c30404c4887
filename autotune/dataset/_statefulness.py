"""Does the dataset keep per-epoch state that persistent workers would freeze?

With ``persistent_workers=True`` each worker keeps the copy of the dataset it got when it started
(at fork, or unpickled), for the whole run.  What the training loop changes in the main process
between epochs (``dataset.set_epoch(e)``, ``sampler.set_epoch(e)`` for a sampler inside the dataset,
``dataset.difficulty = ...``) never reaches them, so epoch 2 silently behaves like epoch 1.  Without
persistence the workers are started again each epoch from the main process's current copy.

Detectable here: a ``set_epoch`` method on the dataset, on a dataset it wraps, or on its sampler; and
attributes that change while samples are read (a counter, a curriculum step, a list that grows).
Undetectable: state changed only by the training loop through some other method.  Lazy set-up (a
file handle opened on first use) is not reported: the indices are read once to let it happen, and
only changes during a second read of the same indices count.
"""

from __future__ import annotations

import hashlib
from typing import Any

from autotune.dataset._watchdog import reading

__all__ = ["epoch_state_warning"]

_SMALL_ARRAY = 1 << 20  # arrays up to this size are hashed whole; bigger ones by identity and shape
_MAX_ITEMS = 10_000  # containers: element identities up to this many, then length only


def _digest(value: Any) -> Any:
    """A cheap, comparable stand-in for an attribute's value: changes when the value does (shallowly)."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, range)):
        return ("v", type(value).__name__, value if not isinstance(value, bytes) or len(value) < 4096
                else hashlib.blake2b(value, digest_size=16).hexdigest())
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        items = list(value.items()) if isinstance(value, dict) else list(value)
        ids = tuple(id(x) for pair in items[:_MAX_ITEMS]
                    for x in (pair if isinstance(value, dict) else (pair,)))
        return ("c", type(value).__name__, id(value), len(items), ids)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and hasattr(value, "shape"):
        if nbytes <= _SMALL_ARRAY:
            try:
                import numpy as np

                data = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
                # Only the bytes of plain numbers say what the value is: an object array's bytes are the
                # addresses of its elements, new at every conversion (a Hugging Face Arrow table read as a
                # numpy array gave two digests for one unchanged table).
                if not data.dtype.hasobject:
                    return ("a", id(value), tuple(value.shape),
                            hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest())
            except Exception:  # noqa: BLE001 - an exotic array type: identity and shape only
                pass
        return ("a", id(value), tuple(value.shape))
    # Other objects (random generators, file handles, models): by identity. A generator advancing is
    # fine for persistent workers, each worker's copy advances on its own.
    return ("o", type(value).__name__, id(value))


def _attributes(obj: Any) -> dict[str, Any]:
    try:
        return dict(vars(obj))
    except TypeError:
        slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())]
        return {s: getattr(obj, s) for s in slots if isinstance(s, str) and hasattr(obj, s)}


def _is_dataset(value: Any) -> bool:
    return hasattr(value, "__getitem__") and hasattr(value, "__len__") and not isinstance(
        value, (str, bytes, list, tuple, dict, range)) and not hasattr(value, "shape")


def _snapshot(obj: Any, prefix: str = "", depth: int = 2) -> dict[str, Any]:
    """Digests of ``obj``'s attributes, and of the attributes of datasets it wraps (``Subset.dataset``)."""
    out = {}
    for name, value in _attributes(obj).items():
        out[prefix + name] = _digest(value)
        if depth > 1 and _is_dataset(value):
            out.update(_snapshot(value, f"{prefix}{name}.", depth - 1))
    return out


def _set_epoch_owners(dataset: Any, sampler: Any) -> list[str]:
    owners = []
    if callable(getattr(dataset, "set_epoch", None)):
        owners.append(f"{type(dataset).__name__}.set_epoch()")
    if sampler is not None and callable(getattr(sampler, "set_epoch", None)):
        owners.append(f"its sampler {type(sampler).__name__}.set_epoch()")
    for name, value in _attributes(dataset).items():
        if value is not dataset and value is not sampler and callable(getattr(value, "set_epoch", None)):
            owners.append(f"{type(dataset).__name__}.{name}.set_epoch()")
    return owners


def _probe_indices(length: int, count: int) -> list[int]:
    if length <= count:
        return list(range(length))
    step = length / count
    return sorted({int(k * step) for k in range(count)})


def epoch_state_warning(dataset: Any, *, sampler: Any = None, reads: int = 4) -> str | None:
    """A warning when ``dataset`` (or ``sampler``) keeps per-epoch state, else None.

    Reads ``reads`` samples twice in this process (the first pass lets lazy set-up happen) and
    compares its attributes around the second pass.  A failing ``__getitem__`` is not reported here.
    """
    reasons = []
    owners = _set_epoch_owners(dataset, sampler)
    if owners:
        reasons.append(f"it has {', '.join(owners)}")
    try:
        indices = _probe_indices(len(dataset), reads)
        for i in indices:
            with reading(f"dataset[{i}]"):
                dataset[i]
        before = _snapshot(dataset)
        for i in indices:
            with reading(f"dataset[{i}]"):
                dataset[i]
        after = _snapshot(dataset)
    except Exception:  # noqa: BLE001 - reading errors are the probe's to report
        before = after = {}
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        reasons.append(f"reading samples changes its attribute(s) {shown}")
    if not reasons:
        return None
    return (
        f"The dataset keeps per-epoch state ({'; '.join(reasons)}): with persistent_workers=True each worker "
        "keeps its own copy and never sees what the main process changes between epochs, so autotune will not "
        "choose persistent_workers=True for it; pass persistent_workers=True yourself if that is safe."
    )
