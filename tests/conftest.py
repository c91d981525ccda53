"""Fixtures shared by several test files."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fedapp.features.embeddings import CACHE_DIR_ENV


@pytest.fixture(scope="session")
def text_embedding_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One embedding cache for every text test of the session (texts-demo is embedded once), away from
    the user's cache."""
    saved = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("fedapp-cache"))
    yield
    if saved is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = saved


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with end-to-end runs or long computations (marker `long`) first (a stable sort; the rest keep
    their order): pytest-xdist's `--dist loadfile --no-loadscope-reorder` (scripts/test.sh) hands files out
    in this order, so the long ones start early and the short ones fill the gaps, instead of one long file
    running alone at the end."""
    heavy = {item.path for item in items if item.get_closest_marker("e2e") or item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in heavy)
