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

from collections import deque
from itertools import islice
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

    def batches(self, seed: int | None, resume: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        """The epoch's batches, and the sampler's state they are drawn from (``resume``: that state, saved by
        the epoch being resumed, restored first): its own generator's (torch's samplers move it every epoch),
        and its iterator's where that is Stateful (torchdata's samplers). A plain ``BatchSampler``'s batches,
        made here because its iterator hides the sampler's."""
        from torch.utils.data import RandomSampler, SequentialSampler

        sampler = self.sampler
        if sampler is None and self.shuffle:
            generator = self.generator if seed is None else torch.Generator().manual_seed(seed)
            sampler = RandomSampler(self.dataset, generator=generator)
        elif sampler is None:
            sampler = SequentialSampler(self.dataset)
        own = self._own_generator()
        state = dict(resume) if resume is not None else self.sampler_state()
        if resume is not None and own is not None and "generator" in state:
            own.set_state(state["generator"])
        indices = iter(sampler)
        if resume is not None and _stateful(indices) and "iterator" in state:
            indices.load_state_dict(state["iterator"])
        elif resume is None and _stateful(indices):
            state["iterator"] = indices.state_dict()
        return _batched(indices, self.batch_size, self.drop_last), state

    def _own_generator(self) -> torch.Generator | None:
        own = getattr(self.sampler, "generator", None)
        return own if isinstance(own, torch.Generator) and own is not self.generator else None

    def sampler_state(self) -> dict[str, Any]:
        """The user sampler's state now, as ``batches`` records it (its iterator's apart)."""
        own = self._own_generator()
        return {"generator": own.get_state()} if own is not None else {}

    def length(self) -> int | None:
        """``len(self)``, or None for a sampler without a length (a plain loader has none then either)."""
        try:
            return len(self)
        except TypeError:
            return None


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _batched(indices: Any, batch_size: int, drop_last: bool) -> Any:
    """``BatchSampler(sampler, batch_size, drop_last)``'s batches of ``indices``."""
    while batch := list(islice(indices, batch_size)):
        if len(batch) < batch_size and drop_last:
            return
        yield batch


class _EpochBatches:
    """One epoch of ``OwnedBatches``; Stateful (``state_dict``/``load_state_dict``) for StatefulDataLoader.
    ``yielded`` counts the batches handed out: the epoch's position, which a resume skips to."""

    def __init__(self, owner: OwnedBatches):
        self.owner = owner
        self.batches: Any = None
        self.start: Any = None  # the generator's state at the epoch's start, or the epoch's own seed
        self.sampler_start: dict[str, Any] | None = None  # the user sampler's state at the epoch's start
        self.yielded = 0
        self.skip = 0
        self.in_flight: deque[list[int]] = deque()  # handed out, not yet delivered (an ``EpochStream``'s)
        self.again: deque[list[int]] = deque()  # to hand out before the next drawn one (``EpochStream.rewind``)
        self.delivered = 0  # batches the training loop received (an ``EpochStream``'s)
        # The epoch's start is fixed: drawn (``_begin``) or loaded. Until then a state saved of it is where the
        # generators are now; after, it is that start, however often it is saved and loaded again.
        self.pinned = False
        self.resumed = False  # loaded and nothing delivered since: the epoch a loop starting now goes on with
        self.exhausted = False  # its batches ran out: every one was handed out

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
        self.batches, self.sampler_start = owner.batches(seed, self.sampler_start)
        self.pinned = True
        for _ in range(self.skip):
            next(self.batches)

    def __next__(self) -> list[int]:
        if self.again:
            batch = self.again.popleft()
        else:
            try:
                if self.batches is None:
                    self._begin()  # a resumed epoch saved whole runs out in its skip
                batch = next(self.batches)
            except StopIteration:
                self.exhausted = True
                raise
        self.yielded += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        if not self.pinned:
            # not begun (an iterator made for ``state_dict`` after a switch, before its priming): its draws
            # will start from where the generators are now, which a fresh process's are not
            owner = self.owner
            start = owner.generator.get_state() if owner.generator is not None else None
            return {"start": start, "sampler_start": owner.sampler_state() or None, "yielded": self.yielded}
        return {"start": self.start, "sampler_start": self.sampler_start, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start, self.yielded, self.skip, self.batches = state["start"], state["yielded"], state["yielded"], None
        self.sampler_start = state.get("sampler_start")
        self.in_flight.clear()
        self.again.clear()
        self.delivered = self.yielded
        self.pinned = self.resumed = True
        self.exhausted = False
        length = self.owner.length()
        if length is not None and self.yielded >= length and (self.owner.generator is not None or self.sampler_start):
            # saved once the epoch was whole: its draws are made again now, as the saved run made them, so the
            # next epoch (another iterator: StatefulDataLoader makes one for a finished state, after priming
            # this one) draws from where the saved run's would; this one has nothing left, and drawing the
            # next epoch's here would move the generators twice
            self._begin()
            for _ in self.batches:
                pass
            self.exhausted = True


class _Current:
    """What an ``EpochStream`` hands a loader as its sampler iterator: its current epoch, whichever that
    is when asked (a loader may hold its iterator across epochs: a persistent one, a StatefulDataLoader's
    made for ``state_dict``). Tracks what was handed out and not delivered."""

    def __init__(self, stream: EpochStream):
        self.stream = stream

    def __iter__(self) -> _Current:
        return self

    def __next__(self) -> list[int]:
        epoch = self.stream.epoch
        batch = next(epoch)
        epoch.in_flight.append(batch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self.stream.epoch.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.epoch.load_state_dict(state)


class EpochStream:
    """An adapting loader's batch sampler: the batches of ``OwnedBatches`` (a plain loader's, drawn from the
    caller's generator as it draws them), in epochs that outlive the loader iterating them. The adapting
    loader says when an epoch begins and when a batch reached the training loop; a pool stopped mid-epoch
    (a switch, a crash) leaves its undelivered batches to ``rewind``, and the next loader continues the
    same epoch's permutation from the first of them: no batch is lost or repeated, whatever the loaders.
    ``sampler`` is the caller's (Lightning's ``set_epoch`` looks for it here)."""

    def __init__(self, owner: OwnedBatches):
        self.owner = owner
        self.sampler = owner.sampler
        self.epoch = _EpochBatches(owner)

    def __len__(self) -> int:
        return len(self.owner)

    def __iter__(self) -> _Current:
        self.rewind()  # a loader starting over (a persistent pool's reset) dropped what it had in flight
        if self.whole():
            # starting over on a whole epoch (a finished state resumed, an iterator made for ``state_dict``
            # between epochs): the next one, whose draws a loader priming its prefetch makes now
            self.epoch = _EpochBatches(self.owner)
        return _Current(self)

    def whole(self) -> bool:
        """Whether the present epoch delivered all its batches: by its length where the sampler has one (a
        loop that knows it never asks past the last), else by its batches having run out."""
        epoch, length = self.epoch, self.owner.length()
        if length is not None:
            return epoch.delivered >= length
        return epoch.exhausted and not epoch.again and not epoch.in_flight

    def begin(self) -> None:
        """A new epoch, unless the present one delivered nothing yet (an iterator made for ``state_dict``
        may have drawn and prefetched it: those draws are this epoch's) or was resumed and goes on now (an
        iterator made for a ``state_dict`` taken right after ``load_state_dict`` loaded it)."""
        if self.epoch.delivered and not self.epoch.resumed:
            self.epoch = _EpochBatches(self.owner)

    def delivered(self) -> None:
        """The oldest batch handed out reached the training loop (a loader delivers in order)."""
        epoch = self.epoch
        if epoch.in_flight:
            epoch.in_flight.popleft()
        epoch.delivered += 1
        epoch.resumed = False  # iterated since: a loop starting later starts a new epoch

    def rewind(self) -> None:
        """The batches handed out and not delivered are handed out again first, in order: their loader's
        pool is gone. The epoch's position goes back to what was delivered."""
        epoch = self.epoch
        epoch.again = deque([*epoch.in_flight, *epoch.again])
        epoch.yielded -= len(epoch.in_flight)
        epoch.in_flight.clear()


def stream_batches(dataset: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], EpochStream | None]:
    """``kwargs`` with the caller's batching made into an ``EpochStream`` (the stream too); unchanged, and
    no stream, where ``own_batches`` leaves them (a batch sampler, no batching, a Stateful sampler, a stream
    of samples) or the loader may deliver out of order (``in_order=False``)."""
    if kwargs.get("in_order", True) is False:
        return kwargs, None
    out = own_batches(dataset, kwargs)
    owner = out.get("batch_sampler")
    if not isinstance(owner, OwnedBatches) or owner is kwargs.get("batch_sampler"):
        return kwargs, None
    stream = EpochStream(owner)
    return {**out, "batch_sampler": stream}, stream


def own_batches(dataset: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the caller's batching (batch_size, shuffle, sampler, drop_last, generator) made into an
    ``OwnedBatches`` batch sampler, the loader given a private generator for its workers' seeds; unchanged
    where the caller chose a batch sampler, no batching or a Stateful sampler (below)."""
    if "batch_sampler" in kwargs or kwargs.get("batch_size", 1) is None or not hasattr(dataset, "__len__"):
        return kwargs
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        return kwargs
    if kwargs.get("sampler") is not None and kwargs.get("shuffle"):
        raise ValueError("sampler option is mutually exclusive with shuffle")  # what a plain DataLoader says
    if _stateful(kwargs.get("sampler")):
        # A Stateful sampler (torchdata's StatefulDistributedSampler) saves where its next ``__iter__`` resumes,
        # not where its epoch began: only the loader class that asks it at each batch can resume it exactly,
        # as it does for a plain loader. Its order does not depend on the workers: it draws nothing eagerly.
        return kwargs
    out = dict(kwargs)
    generator = out.pop("generator", None)
    out["batch_sampler"] = OwnedBatches(dataset, batch_size=out.pop("batch_size", 1),
                                        drop_last=out.pop("drop_last", False), shuffle=bool(out.pop("shuffle", False)),
                                        sampler=out.pop("sampler", None), generator=generator)
    seed = generator.initial_seed() if generator is not None else torch.initial_seed()
    out["generator"] = torch.Generator().manual_seed(seed)  # the workers' seeds, the caller's generator untouched
    return out
