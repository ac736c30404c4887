"""The machine a recipe is tuned on: hardware facts and fingerprint (``_hardware``), the CPUs this
process may use (``_cpus``), memory, the job's limit and its budget (``_memory``, ``_memory_limit``,
``_memory_file``, ``_first_touch``, ``_populate``, ``_warm_heap``), whom the kernel's OOM killer ends first (``_oom``),
/dev/shm (``_shm``), and page-cache eviction for cold reads (``_evict``).  See docs/architecture.md.
"""

from autotune.machine._cpus import build_workers, ranks_per_node, usable_cpus
from autotune.machine._evict import (
    EvictionReport,
    SourceFiles,
    evict,
    files_under,
    fits_page_cache,
    record_files,
    source_files,
)
from autotune.machine._first_touch import first_touch_seconds
from autotune.machine._memory import (
    TreeMemory,
    default_budget,
    process_uss,
    tree_memory,
    tree_pss,
    tree_rss,
)
from autotune.machine._memory_file import FileColumn
from autotune.machine._memory_limit import BUDGET_SHARE, JobMemory, job_memory
from autotune.machine._oom import make_expendable, oom_kills, oom_score_adj
from autotune.machine._populate import populate
from autotune.machine._shm import batch_bytes, shm_free, shm_rule
from autotune.machine._warm_heap import WARMED_BATCHES, warm_heap

__all__ = [
    "BUDGET_SHARE",
    "WARMED_BATCHES",
    "EvictionReport",
    "FileColumn",
    "JobMemory",
    "SourceFiles",
    "batch_bytes",
    "build_workers",
    "default_budget",
    "evict",
    "files_under",
    "job_memory",
    "make_expendable",
    "oom_kills",
    "oom_score_adj",
    "first_touch_seconds",
    "fits_page_cache",
    "populate",
    "process_uss",
    "ranks_per_node",
    "record_files",
    "shm_free",
    "shm_rule",
    "source_files",
    "TreeMemory",
    "tree_memory",
    "tree_pss",
    "tree_rss",
    "usable_cpus",
    "warm_heap",
]
