"""Shared test setup: no test writes to the real per-user cache folder."""

import pytest


@pytest.fixture(autouse=True)
def _private_cache_root(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("autotune-cache")))
