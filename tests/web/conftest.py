"""Fixtures for the dashboard tests: one headless Debian Chromium per session (Playwright),
a fresh context per test, and a seeded database served by the real app."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))  # the shared seed module

from apiseed import Seeded, seed
from webpage import Page

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def web(browser: Any, sqlite_url: str, live_server: Callable[..., Any]) -> Iterator[tuple[Page, Seeded]]:
    from gpufleet.storage.db import make_engine

    e = make_engine(sqlite_url)
    s = seed(e)
    e.dispose()
    srv = live_server(sqlite_url, grafana_url="http://grafana.example:3000")
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    page = Page(ctx.new_page(), srv.url)
    yield page, s
    ctx.close()
