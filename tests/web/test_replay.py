"""While `gpufleet up` replays its simulated past the page says "replaying history: N%"
instead of looking empty, and says when it is done. The progress object's arithmetic, then the
banner in a real Chromium against the real app (whose ``app.state.replay`` the test drives)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from webpage import Page

from gpufleet.api.web import ReplayProgress


def test_progress_counts_every_agent_and_never_passes_100() -> None:
    p = ReplayProgress()
    assert p.as_json()["active"] is False and p.as_json()["percent"] is None  # nothing planned: unknown
    p.plan(2400)
    p.plan(2400)  # two agents, 40 min each
    threads = [threading.Thread(target=lambda: [p.step(60) for _ in range(20)]) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.as_json() == {"active": True, "percent": 50.0, "cycles_done": 2400, "cycles_total": 4800}
    p.step(10_000)
    assert p.as_json() == {"active": False, "percent": 100.0, "cycles_done": 4800, "cycles_total": 4800}


@pytest.fixture
def served(browser: Any, sqlite_url: str, live_server: Callable[..., Any]) -> Iterator[tuple[Page, Any]]:
    srv = live_server(sqlite_url)
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    yield Page(ctx.new_page(), srv.url), srv
    ctx.close()


@pytest.mark.browser
def test_banner_shows_replay_progress_then_done(served: tuple[Page, Any]) -> None:
    p, srv = served
    progress = ReplayProgress()
    progress.plan(1000)
    progress.step(370)
    srv.app.state.replay = progress
    p.page.goto(p.base + "/")
    banner = p.page.locator("#replay")
    banner.wait_for()
    assert banner.inner_text().startswith("replaying history: 37%")
    progress.step(300)
    p.page.wait_for_function("() => document.querySelector('#replay').textContent.includes('67%')")
    progress.step(1000)
    p.page.wait_for_function("() => document.querySelector('#replay.done') !== null")
    assert "history replayed" in banner.inner_text()
    p.shot("replay-banner")
    assert p.errors == []


@pytest.mark.browser
def test_no_banner_without_a_replay(served: tuple[Page, Any]) -> None:
    p, _ = served
    assert p.page.context.request.get(p.base + "/web/replay").json()["active"] is False
    p.page.goto(p.base + "/")
    p.page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
    p.page.wait_for_load_state("networkidle")
    assert p.page.locator("#replay").count() == 0
    assert p.errors == []
