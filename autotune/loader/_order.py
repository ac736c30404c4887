"""Same seed, same batches: a tuned loader's sample order does not depend on its configuration.

A plain ``DataLoader`` draws a base seed for its workers from its generator (torch's global one without)
every time an iterator is made, then its sampler draws the epoch's permutation from the same generator:
two draws an epoch. A persistent loader makes its iterator once and only resets it, so from epoch 2 on
it draws the permutation alone, and with ``shuffle=True, generator=g`` its order leaves the plain
loader's (and consumes torch's global generator differently without one).

``plain_order(loader_cls)`` is ``loader_cls`` with that draw put back: where the loader is about to
reuse its iterator, it draws the base seed the plain loader would have drawn, before the iterator's
reset draws the permutation. So every epoch consumes the generator exactly as a plain loader over the
same sampler does, and any number of workers, persistent or not, and any sequence of loaders sharing
that generator (an adapting loader's switches) yield the plain loader's batches epoch for epoch. The
sampler, batch sampler and generator stay the caller's objects, untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

_CLASSES: dict[type[Any], type[Any]] = {}


def reuses_iterator(loader: Any) -> bool:
    """Whether ``iter(loader)`` will reset its existing iterator rather than make one (which draws the seed):
    DataLoader's rule, and StatefulDataLoader's, whose ``state_dict()`` may have made the iterator the
    next ``iter()`` hands out as it is."""
    if getattr(loader, "_initial_iter_for_state_dict", False):
        return False
    return bool(loader.persistent_workers and loader.num_workers > 0 and loader._iterator is not None)


def draw_base_seed(generator: torch.Generator | None) -> None:
    """The draw ``_BaseDataLoaderIter.__init__`` makes (torch 2.x): one int64 from the loader's generator."""
    torch.empty((), dtype=torch.int64).random_(generator=generator)


def plain_order(loader_cls: type[DataLoader[Any]]) -> type[DataLoader[Any]]:
    """``loader_cls`` (DataLoader, StatefulDataLoader, ...) whose every epoch draws from its generator what a
    plain loader's does (see the module docstring); one class per ``loader_cls``."""
    made = _CLASSES.get(loader_cls)
    if made is None:
        def __iter__(self: Any) -> Any:
            if reuses_iterator(self):
                draw_base_seed(self.generator)
            return super(made, self).__iter__()  # type: ignore[arg-type]

        made = type(loader_cls.__name__, (loader_cls,), {"__iter__": __iter__, "__module__": loader_cls.__module__,
                                                          "__qualname__": loader_cls.__qualname__,
                                                          "__doc__": loader_cls.__doc__})
        _CLASSES[loader_cls] = made
    return made
