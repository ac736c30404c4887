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


class OwnedBatches:
    """The batches a plain DataLoader would make of ``sampler`` (or of a ``RandomSampler`` drawing from
    ``generator`` when ``shuffle``), drawn from the generator as it draws them, for a loader class whose own
    samplers draw otherwise (StatefulDataLoader's draw the permutation when its iterator is made, which its
    multi-worker iterator does twice, so its order depends on ``num_workers``). Each epoch's draws happen
    at its first batch, so an iterator made and dropped draws nothing; its state (the epoch's start and the
    batches handed out) resumes the same epoch exactly."""

    def __init__(self, dataset: Any, *, batch_size: int, drop_last: bool, shuffle: bool, sampler: Any,
                 generator: torch.Generator | None):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.shuffle, self.sampler, self.generator = shuffle, sampler, generator

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> _EpochBatches:
        return _EpochBatches(self)

    def batches(self, seed: int | None) -> Any:
        from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

        sampler = self.sampler
        if sampler is None and self.shuffle:
            generator = self.generator if seed is None else torch.Generator().manual_seed(seed)
            sampler = RandomSampler(self.dataset, generator=generator)
        elif sampler is None:
            sampler = SequentialSampler(self.dataset)
        return iter(BatchSampler(sampler, self.batch_size, self.drop_last))


class _EpochBatches:
    """One epoch of ``OwnedBatches``; Stateful (``state_dict``/``load_state_dict``) for StatefulDataLoader."""

    def __init__(self, owner: OwnedBatches):
        self.owner = owner
        self.batches: Any = None
        self.start: Any = None  # the generator's state at the epoch's start, or the epoch's own seed
        self.yielded = 0
        self.skip = 0

    def __iter__(self) -> _EpochBatches:
        return self

    def _begin(self) -> None:
        owner = self.owner
        seed = None
        if self.start is not None and owner.generator is not None:
            owner.generator.set_state(self.start)  # a resumed epoch: drawn again from where it began
        elif self.start is None and owner.generator is not None:
            self.start = owner.generator.get_state()
        draw_base_seed(owner.generator)
        if owner.generator is None and owner.shuffle and owner.sampler is None:
            # a plain RandomSampler without a generator draws its seed from torch's global one: drawn as it
            # would be, and kept, so a resume makes the same permutation without touching the global one
            seed = int(self.start) if self.start is not None else int(
                torch.empty((), dtype=torch.int64).random_().item())
            self.start = seed
        self.batches = owner.batches(seed)
        for _ in range(self.skip):
            next(self.batches)

    def __next__(self) -> list[int]:
        if self.batches is None:
            self._begin()
        batch: list[int] = next(self.batches)
        self.yielded += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start, self.yielded, self.skip, self.batches = state["start"], state["yielded"], state["yielded"], None


def own_batches(dataset: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the caller's batching (batch_size, shuffle, sampler, drop_last, generator) made into an
    ``OwnedBatches`` batch sampler, the loader given a private generator for its workers' seeds; unchanged
    where the caller chose a batch sampler or no batching."""
    if "batch_sampler" in kwargs or kwargs.get("batch_size", 1) is None or not hasattr(dataset, "__len__"):
        return kwargs
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        return kwargs
    out = dict(kwargs)
    generator = out.pop("generator", None)
    out["batch_sampler"] = OwnedBatches(dataset, batch_size=out.pop("batch_size", 1),
                                        drop_last=out.pop("drop_last", False), shuffle=bool(out.pop("shuffle", False)),
                                        sampler=out.pop("sampler", None), generator=generator)
    seed = generator.initial_seed() if generator is not None else torch.initial_seed()
    out["generator"] = torch.Generator().manual_seed(seed)  # the workers' seeds, the caller's generator untouched
    return out
