"""Whether reading a sample drew from a random generator: a sample that did is not one sample.

A cache stores one read of each sample, so it may hold only samples that every read returns alike.
Comparing two reads catches a random sample only where the dice fell differently (a flip with
p=0.1 looks deterministic nine times in ten). Watching the generators does not depend on the dice:
a read that advanced Python's ``random``, numpy's global ``RandomState``, torch's default CPU
generator, or a generator the dataset holds (``self.rng = np.random.default_rng()``, a
``random.Random``, a ``torch.Generator``), drew from it, whatever it drew. Builds and fills read
every sample through ``WatchedReads``, a batch at a time where they read in batches; the determinism
check reads a few with it up front.

Not seen: randomness from the operating system (``os.urandom``, an unseeded ``default_rng()`` made
inside ``__getitem__``); two reads and the probed samples are the defence there.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from autotune.errors import AutotuneError

_DEPTH = 3  # attribute levels searched for generators the dataset holds (dataset.transform.rng)
_MAX_ITEMS = 64  # items of a list, tuple or dict attribute looked into


class RandomSamples(AutotuneError):
    """``dataset[i]`` is not the same on every read (it drew randomness, or two reads differed)."""


def _owned(obj: Any, depth: int, seen: set[int], path: str) -> Iterator[tuple[str, Any]]:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (random.Random, np.random.Generator, np.random.RandomState, np.random.BitGenerator,
                        torch.Generator)):
        yield path, obj
        return
    if depth <= 0 or isinstance(obj, (str, bytes, int, float, bool, type(None), np.ndarray, torch.Tensor, type)):
        return
    if isinstance(obj, dict):
        items: list[tuple[str, Any]] = [(f"{path}[{k!r}]", v) for k, v in list(obj.items())[:_MAX_ITEMS]]
    elif isinstance(obj, (list, tuple)):
        items = [(f"{path}[{k}]", v) for k, v in enumerate(obj[:_MAX_ITEMS])]
    else:
        try:
            items = [(f"{path}.{k}", v) for k, v in vars(obj).items()]
        except TypeError:
            return
    for name, value in items:
        yield from _owned(value, depth - 1, seen, name)


def _state(gen: Any) -> Any:
    if isinstance(gen, random.Random):
        return gen.getstate()
    if isinstance(gen, np.random.Generator):
        return gen.bit_generator.state
    if isinstance(gen, np.random.BitGenerator):
        return gen.state
    if isinstance(gen, np.random.RandomState):
        return gen.get_state(legacy=False)
    return gen.get_state()  # torch.Generator


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        try:  # Python random's state, 625 ints: compared in C, not in one call each (1.8x a JPEG's read)
            return bool(a == b)
        except (ValueError, RuntimeError, TypeError):  # arrays or tensors inside: element by element
            return all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


class DrawWatch:
    """The states of every generator a read of ``dataset`` could draw from, in this process."""

    def __init__(self, dataset: Any):
        self.pid = os.getpid()
        self.generators: list[tuple[str, Callable[[], Any]]] = [
            ("Python's random", random.getstate),
            ("numpy's global random state", lambda: np.random.get_state(legacy=False)),
            ("torch's random generator", torch.random.get_rng_state),
        ]
        for name, gen in _owned(dataset, _DEPTH, set(), "dataset"):
            self.generators.append((f"the generator {name}", functools.partial(_state, gen)))

    def snapshot(self) -> list[Any]:
        return [get() for _, get in self.generators]

    def drew(self, before: list[Any]) -> str | None:
        """The first generator whose state moved since ``before``, or None."""
        for (name, get), state in zip(self.generators, before):
            if not _same(state, get()):
                return name
        return None


def message(i: int, what: str) -> str:
    return (f"dataset[{i}] {what}, so no cache can store it (it would freeze one draw for every epoch): move the "
            "random part (augmentation) into `transform` (transform=... of autotune.dataloader, or a module-level "
            "`transform` in the dataset file), which runs after the cache every epoch, or pass cache=None")


def last_line(exc: BaseException) -> str:
    """The message of ``exc`` as it was raised, also when a DataLoader worker re-raised it in this process
    (its text then carries the worker's whole traceback)."""
    text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    name = f"{type(exc).__name__}: "
    return text.split(name, 1)[1] if name in text else text


class WatchedReads:
    """``read(i)`` is ``dataset[i]``, raising RandomSamples when the read drew from a generator."""

    def __init__(self, dataset: Any):
        self.dataset = dataset
        self._watch: DrawWatch | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "_watch": None}

    def read(self, i: int) -> Any:
        sample, drawn = self.read_noting(i)
        if drawn is not None:
            raise RandomSamples(message(i, f"drew from {drawn}"))
        return sample

    def read_all(self, indices: Sequence[int]) -> list[Any]:
        """``[dataset[i] for i in indices]``, raising RandomSamples when a read drew from a generator."""
        samples, drawn = self.read_all_noting(indices)
        if drawn is not None:
            raise RandomSamples(message(*drawn))
        return samples

    def read_all_noting(self, indices: Sequence[int]) -> tuple[list[Any], tuple[int, str] | None]:
        """``[dataset[i] for i in indices]`` and, when a read drew, ``(i, "drew from <generator>")`` of one
        that did. The generators are compared once around the whole batch, not around each read: a
        draw anywhere in it moves a state for good, so it is seen as surely, and the states' copies and
        comparisons (a quarter of a JPEG read's time, paid per sample) are paid once per batch. Only a
        batch that drew is read again, one sample at a time, to name the index that draws."""
        watch = self._watch_here()
        before = watch.snapshot()
        samples = [self.dataset[i] for i in indices]
        drawn = watch.drew(before)
        if drawn is None:
            return samples, None
        for i in indices:
            _, again = self.read_noting(i)
            if again is not None:
                return samples, (int(i), f"drew from {again}")
        return samples, (int(indices[0]), f"drew from {drawn} (read with the rest of its batch)")

    def _watch_here(self) -> DrawWatch:
        watch = self._watch
        if watch is None or watch.pid != os.getpid():  # a worker watches its own copies of the generators
            watch = self._watch = DrawWatch(self.dataset)
        return watch

    def read_noting(self, i: int) -> tuple[Any, str | None]:
        """``dataset[i]`` and the generator the read drew from (None: it drew from none)."""
        watch = self._watch_here()
        before = watch.snapshot()
        sample = self.dataset[i]
        return sample, watch.drew(before)


__all__ = ["DrawWatch", "RandomSamples", "WatchedReads", "last_line", "message"]
