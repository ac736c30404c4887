"""``recipe/_write_back``'s exit write: the exit hook holds a WriteBack exactly while its record is not on disk."""

from __future__ import annotations

import atexit
import gc
import weakref

import pytest
from test_adaptive import batches
from test_factory import write_recipe
from workloads import Numbers, run_recipe_script

import autotune
from autotune.recipe import _write_back
from autotune.recipe._file import RecipeFile
from autotune.recipe._write_back import WriteBack

pytestmark = pytest.mark.timeout(120)


class Ticks:
    """A clock a second further on at each read: a write costs 1 s, so the next is due 1 / SHARE s later."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_a_write_back_with_nothing_pending_is_collected_and_a_pending_one_is_held_until_flushed(tmp_path):
    """Each WriteBack registered its own flush at exit: every adapting loader's (a Trainer makes one at each
    evaluate()) lived, with its profile and last record, until the interpreter exited."""
    path = write_recipe(tmp_path / "autotune.json")
    loader = autotune.dataloader(Numbers(40), path, adapt="observe")
    write_back = loader._on_epoch
    write_back._clock = Ticks()
    batches(loader, 2)  # the first epoch written at once, the second left for later
    assert write_back.writes == 1 and _write_back._pending.get(id(write_back)) is write_back
    loader.close()  # writes it
    assert write_back.writes == 2 and id(write_back) not in _write_back._pending
    ref = weakref.ref(write_back)
    del loader, write_back
    gc.collect()
    assert ref() is None


def test_many_write_backs_leave_the_exit_hooks_as_they_were(tmp_path):
    path = write_recipe(tmp_path / "autotune.json")
    profile, = RecipeFile.read(path).profiles.values()
    loader = autotune.dataloader(Numbers(40), path, adapt="observe")
    batches(loader, 1)
    hooks, pending = atexit._ncallbacks(), len(_write_back._pending)
    for _ in range(20):
        write_back = WriteBack(path, profile, "observe", 8, 40, clock=Ticks())
        write_back(None, loader)  # written at once
        write_back(None, loader)  # pending
        write_back.flush()
    assert (atexit._ncallbacks(), len(_write_back._pending)) == (hooks, pending)
    loader.close()


def test_a_pending_record_is_written_at_the_interpreters_exit(tmp_path):
    """No close(): the second epoch's record, not yet due, is what the exit hook writes."""
    path = write_recipe(tmp_path / "autotune.json")
    run_recipe_script("import itertools\nimport autotune\nfrom workloads import Numbers\n"
                      "loader = autotune.dataloader(Numbers(40), sys.argv[1], adapt='observe')\n"
                      "write_back = loader._on_epoch\nwrite_back._clock = itertools.count(1.0).__next__  # Ticks\n"
                      "for _ in range(2):\n    for _ in loader: pass\n"
                      "assert write_back.writes == 1 and write_back._latest.epochs == 2\n", path, timeout=100)
    assert RecipeFile.read(path).profiles.popitem()[1].learned.epochs == 2
