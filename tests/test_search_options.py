"""SearchOptions is the one home of a search's options: `autotune search`'s flags and autotune.search()'s
keywords are built from it and are the same set; each value is checked there, whichever road it came by;
autotune.search() leaves the multiprocessing start method as it found it."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import typing

import pytest

import autotune
from autotune.cli._main import build_parser
from autotune.dataset import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS
from autotune.errors import AutotuneError
from autotune.tuner._options import SearchKeywords, SearchOptions, user_fields


def _search_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["search"]


def test_the_cli_and_the_api_offer_the_same_options_with_one_set_of_defaults():
    """On 9eac6c3 autotune.search() lacked max_workers, ranks_per_node and data_dir."""
    names = {f.name for f in user_fields()}
    assert {"budget", "max_workers", "ranks_per_node", "data_dir", "storage", "caches", "max_trials",
            "max_rounds", "trial_seconds"} <= names
    flags = {a.dest for a in _search_parser()._actions}
    assert names <= flags
    assert set(typing.get_type_hints(SearchKeywords)) == names
    api = inspect.signature(autotune.search).parameters
    assert api["options"].kind is inspect.Parameter.VAR_KEYWORD  # typed by SearchKeywords
    # no flag has a default of its own: an unset flag is SearchOptions' default
    args = _search_parser().parse_args(["x.py"])
    assert all(getattr(args, n) is None for n in names)
    # nor has the API: the batch and epochs the command line reads from a file without them, the search
    # that load(on_mismatch="search") runs
    assert (api["batch_size"].default, api["epochs"].default) == (DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS)
    assert inspect.signature(autotune.load).parameters["budget"].default == SearchOptions().budget


@pytest.mark.parametrize("kw, message", [
    ({"budget": "inf"}, "--budget must be a finite duration"),
    ({"budget": "soon"}, "Budget must be a duration"),
    ({"max_memory": "0.5"}, "under 1 MiB"),
    ({"max_memory": 10}, "at least 1 MiB"),
    ({"caches": "memory,tape"}, "Unknown cache backend 'tape'"),
    ({"caches": ("tape",)}, "Unknown cache backend 'tape'"),
    ({"max_workers": -1}, "--max-workers must be an integer of at least 0"),
    ({"ranks_per_node": 0}, "--ranks-per-node must be an integer of at least 1"),
    ({"max_trials": 0}, "--max-trials must be an integer of at least 1"),
    ({"max_trials": 2.5}, "--max-trials must be an integer of at least 1"),
    ({"max_rounds": 1}, "--max-rounds must be an integer of at least 2"),
    ({"max_rounds": 2.5}, "--max-rounds must be an integer of at least 2"),
    ({"max_rounds": None}, "--max-rounds must be an integer of at least 2"),
    ({"trial_seconds": 0}, "--trial-seconds must be a duration such as 1s or 5s, but got 0"),
    ({"trial_seconds": "-1s"}, "--trial-seconds must be a duration such as 1s or 5s, but got '-1s'"),
    ({"trial_seconds": "inf"}, "--trial-seconds must be a duration such as 1s or 5s, but got 'inf'"),
    ({"trial_seconds": "soon"}, "--trial-seconds must be a duration such as 1s or 5s, but got 'soon'"),
    ({"storage": "sqlite:///:memory:"}, "in-memory SQLite database"),
    ({"storage": "sqlite://"}, "in-memory SQLite database"),
    ({"storage": "sqlite:///file::memory:?cache=shared"}, "in-memory SQLite database"),
    ({"storage": "studies.db"}, "is not a database URL"),
])
def test_each_option_is_checked_in_one_place(kw, message):
    with pytest.raises(AutotuneError, match=message.replace("(", r"\(").replace("?", r"\?")):
        SearchOptions(**kw)


def test_max_trials_is_a_flag_and_a_keyword_read_as_one_integer():
    """A search that needs a few trials ends when they are done, not at the budget's end (Optuna's n_trials);
    before, only the library's tests could set it."""
    from autotune.cli._search import options_from

    assert options_from(_search_parser().parse_args(["x.py", "--max-trials", "3"])).max_trials == 3
    assert SearchOptions().max_trials is None  # the budget alone ends a search by default
    assert "--max-trials" in _search_parser().format_help()
    assert options_from(_search_parser().parse_args(["x.py", "--max-rounds", "3"])).max_rounds == 3
    assert SearchOptions().max_rounds == 8  # the finalists' rounds stop at 8 by default, or sooner once settled


def test_text_and_python_values_read_the_same():
    a = SearchOptions(budget="1m30s", max_memory="2G", caches="memory, pickle")
    b = SearchOptions(budget=90, max_memory=2 << 30, caches=("memory", "pickle"))
    assert (a.budget, a.max_memory, a.caches) == (b.budget, b.max_memory, b.caches) == (90.0, 2 << 30,
                                                                                        ("memory", "pickle"))


def test_the_finalists_share_is_stated_in_help():
    text = _search_parser().format_help()
    assert "measurement may add 25% of it (at least 5 s), then the search returns" in " ".join(text.split())
    # the search's own work ends EXIT_S (2 s) before the promise: the recipe's write and the exit follow it
    clock = SearchOptions(budget=100).clock()
    assert clock.wall - clock.budget_end == 23.0
    assert clock.promise() == "within 100.00 s plus 25.00 s for the finalists"
    clock = SearchOptions(budget=8).clock()
    assert clock.wall - clock.budget_end == 3.0


def test_an_in_memory_storage_is_refused_by_the_cli_with_one_line(tmp_path):
    (tmp_path / "tiny.py").write_text("dataset = list(range(16))\n")
    run = subprocess.run([sys.executable, "-m", "autotune", "search", "tiny.py", "--storage", "sqlite:///:memory:",
                          "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "in-memory SQLite database" in run.stderr


def test_search_leaves_the_start_method_unset_as_it_found_it(tmp_path):
    """On 9eac6c3 a search fixed the default context (fork): the caller's set_start_method then raised."""
    code = textwrap.dedent(f"""
        import multiprocessing, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import torch, autotune
        assert multiprocessing.get_start_method(allow_none=True) is None
        # one trial ends it; the budget is only a loaded machine's wall (10 s ran out reading the dataset at a
        # load of 18)
        autotune.search(torch.arange(64.0).reshape(32, 2), batch_size=8, epochs=1, budget=120, max_trials=1,
                        output=None, workdir={str(tmp_path / 'w')!r}, progress=False, caches="none", max_workers=0)
        assert multiprocessing.get_start_method(allow_none=True) is None, multiprocessing.get_start_method()
        multiprocessing.set_start_method("spawn")  # the caller's choice is still theirs
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
