"""Shared test setup: no test writes to the real per-user cache folder."""

import pytest


@pytest.fixture(autouse=True)
def _private_cache_root(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("autotune-cache")))


@pytest.fixture
def closes_loaders(monkeypatch):
    """Every loader a test makes through the factory is closed after it, as a training script's would be: an
    adapting loader gives the process's threads back on ``close()`` (a later test must find torch's own
    count), and a pool left to the garbage collector can outlive the test and hold a later one up."""
    import autotune

    made = []
    real = autotune.dataloader

    def dataloader(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(autotune, "dataloader", dataloader)
    yield
    for loader in reversed(made):
        if callable(getattr(loader, "close", None)):
            loader.close()
        elif callable(getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)):
            loader._iterator._shutdown_workers()  # a pool: a single-process iterator has none


_FIRST = ("bench", "integration")  # the longest files: started first, they overlap the rest (make test: -n 2)


def pytest_collection_modifyitems(items):
    """Long-running files first, so that on several workers (``make test`` runs two, one file each at a
    time) the benchmark smoke test does not start last and leave one worker idle while it runs."""
    def rank(item):
        return next((i for i, mark in enumerate(_FIRST) if item.get_closest_marker(mark)), len(_FIRST))

    items.sort(key=rank)  # stable: files keep their tests together and in order
