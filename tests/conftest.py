"""Shared test setup: no test writes to the real per-user cache folder."""

import pytest


@pytest.fixture(autouse=True)
def _private_cache_root(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("autotune-cache")))


_FIRST = ("bench", "integration")  # the longest files: started first, they overlap the rest (make test: -n 2)


def pytest_collection_modifyitems(items):
    """Long-running files first, so that on several workers (``make test`` runs two, one file each at a
    time) the benchmark smoke test does not start last and leave one worker idle while it runs."""
    def rank(item):
        return next((i for i, mark in enumerate(_FIRST) if item.get_closest_marker(mark)), len(_FIRST))

    items.sort(key=rank)  # stable: files keep their tests together and in order
