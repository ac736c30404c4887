"""machine._first_touch: the fresh memory is really written, in this process or in forked workers."""

from __future__ import annotations

import resource

import pytest

from autotune.machine._first_touch import first_touch_seconds

NBYTES = 64 << 20
FEWEST_FAULTS = NBYTES // (2 << 20)  # every 2 MiB is faulted at least once, even in huge pages


def _faults(who: int) -> int:
    return resource.getrusage(who).ru_minflt


def test_in_this_process_every_page_is_faulted_in():
    before = _faults(resource.RUSAGE_SELF)
    seconds = first_touch_seconds(NBYTES, workers=0)
    assert _faults(resource.RUSAGE_SELF) - before >= FEWEST_FAULTS
    assert isinstance(seconds, float)


@pytest.mark.timeout(60)
def test_forked_workers_fault_in_the_pages_and_are_reaped():
    before = _faults(resource.RUSAGE_CHILDREN)  # counts only children already waited for
    first_touch_seconds(NBYTES, workers=2)
    assert _faults(resource.RUSAGE_CHILDREN) - before >= FEWEST_FAULTS
