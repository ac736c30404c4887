"""The factory's memory check: a recipe never takes more memory than the job has when the loader is built.

A recipe's peak was measured where it was tuned; the job that runs it may have less (a smaller cgroup limit,
a process that already holds a model, other ranks on the node). Over a cgroup limit the kernel's OOM killer
ends the job, with no word of why. So before any cache is built, what the recipe adds to the process (its
measured peak less the plain default's: the cache, the workers, their prefetched batches) is checked
against the budget of the memory this job may still take now (``machine._memory``, per rank on the node),
and where it does not fit, the recipe is fitted:

1. a memory cache shrinks to the first samples that fit (a partial cache, ``LoaderConfig.cache_share``),
   or goes when even a batch's worth would not;
2. then, if the workers alone do not fit, fewer workers (unless the caller chose ``num_workers``).

Each change is said in one line that names the limit (``machine._memory_limit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune._units import format_bytes
from autotune.caches._codec import sample_nbytes
from autotune.config import LoaderConfig, cache_backend, partial_count
from autotune.machine._memory_limit import JobMemory, job_memory


@dataclass(frozen=True)
class Fit:
    config: LoaderConfig
    line: str | None  # what was changed and why, naming the limit; None when the recipe fits as it is
    budget: int
    need: int  # what the recipe as given adds to the process


def _cache_need(backend: str, sample_bytes: float, count: int) -> int:
    """The RAM an in-memory ``backend`` cache of ``count`` samples needs (``Cache.estimate_need``)."""
    return int(cache_backend(backend).estimate_need(sample_bytes, count)[0])


def _largest_count(backend: str, sample_bytes: float, room: int, length: int) -> int:
    """The most samples whose memory cache needs at most ``room`` bytes (0 when none fit)."""
    low, high = 0, length
    while low < high:
        mid = (low + high + 1) // 2
        if _cache_need(backend, sample_bytes, mid) <= room:
            low = mid
        else:
            high = mid - 1
    return low


def fit_memory(config: LoaderConfig, measured: Any, dataset: Any, *, batch_size: int = 1, ranks: int = 1,
               memory: JobMemory | None = None, sample_bytes: float | None = None, keep_workers: bool = False) -> Fit:
    """``config`` fitted to the memory this job may take now (see the module docstring).

    ``measured``: the profile's figures (``peak_memory_bytes`` and ``default_peak_memory_bytes``; either may be
    None in an older recipe, and then only the cache is counted). ``sample_bytes``: one sample's payload
    (read from ``dataset[0]`` when None and the recipe has a memory cache). ``keep_workers``: the caller chose
    ``num_workers`` itself, and it is never changed.
    """
    memory = memory or job_memory()
    budget = memory.budget(ranks)
    backend = config.cache if config.cache_in_memory else None  # only a cache in memory counts here
    length = len(dataset) if backend is not None else 0
    cache = 0
    if backend is not None:
        if sample_bytes is None:
            sample_bytes = float(sample_nbytes(dataset[0]))
        cache = _cache_need(backend, sample_bytes, partial_count(config.cache_share, length))
    peak = getattr(measured, "peak_memory_bytes", None)
    plain = getattr(measured, "default_peak_memory_bytes", None)
    added = max(cache, peak - plain) if isinstance(peak, int) and isinstance(plain, int) else cache
    other = max(0, added - cache)  # workers and their batches: what does not scale with the cache
    if added <= budget:
        return Fit(config, None, budget, added)
    where = f"{memory.describe_limit()} leaves {format_bytes(budget)} for the loader now"
    if ranks > 1:
        where += f" (a share of {ranks} ranks on this node)"
    changes: list[str] = []
    fitted = config
    if backend is not None:
        assert sample_bytes is not None
        count = _largest_count(backend, sample_bytes, budget - other, partial_count(config.cache_share, length))
        if count >= max(1, batch_size) and count / max(1, length) >= 0.01:
            fitted = config.refit(cache_share=count / length)
            changes.append(f"caching the first {count} of {length} samples in memory "
                           f"({format_bytes(_cache_need(backend, sample_bytes, count))})")
            cache = _cache_need(backend, sample_bytes, count)
        else:
            fitted = config.refit(cache=None)
            changes.append("no memory cache")
            cache = 0
    if other + cache > budget and fitted.num_workers and not keep_workers:
        per_worker = other / fitted.num_workers
        workers = max(0, min(fitted.num_workers - 1, int((budget - cache) // max(1.0, per_worker))))
        fitted = fitted.refit(num_workers=workers)
        changes.append(f"{workers} workers instead of {config.num_workers}")
    what = f"the recipe adds ~{format_bytes(added)} to the process"
    return Fit(fitted, f"{what}, but {where}: {', '.join(changes) or 'nothing smaller to use'}", budget, added)
