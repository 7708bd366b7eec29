"""Fixtures for the REST API tests: a seeded database and a real server on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from apiseed import Seeded, seed


@pytest.fixture
def seeded(database_url: str) -> Iterator[tuple[str, Seeded]]:
    from gpufleet.storage.db import make_engine

    e = make_engine(database_url)
    try:
        yield database_url, seed(e)
    finally:
        e.dispose()


@pytest.fixture
def api(seeded: tuple[str, Seeded], live_server: Callable[..., Any]) -> Iterator[tuple[httpx.Client, Seeded]]:
    """An HTTP client on a real server over the seeded database (anonymous access on)."""
    url, s = seeded
    srv = live_server(url, grafana_url="http://grafana.example:3000")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c, s
