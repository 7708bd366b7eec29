"""Evidence for people, in a real Chromium: the flags a real analysis writes (simulated jobs run
through the goodput engine, not hand-written evidence) shown on the job page and the flags page
with the registry's labels and units, integers without decimals, link capacities as GB/s, a
long GPU list folded to "N GPUs", XIDs decoded, the measured cause named with its own
suggestion, nothing wider than its card, no raw snake_case key, no request to another origin."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from apiseed import Seeded
from sqlalchemy import insert
from webpage import Page

from gpufleet.flagkinds import flag_kinds
from gpufleet.storage.db import make_engine
from gpufleet.storage.models import Flag

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "goodput"))
from simjobs import analyze_data, generate

from gpufleet.agent.simulator import make_job

T0 = 1_700_000_000.0
# profile -> GPUs: each gives the evidence shape under test (a map, a long UUID list, per-GPU
# objects with an XID, a measured cause, bytes/s)
PROFILES = {"comm_bound": 16, "oversized_allocation": 16, "hw_fault": 8, "throttled": 2, "input_stall": 2}
SNAKE = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)+\b")


@pytest.fixture(scope="module")
def findings() -> dict[str, Any]:
    out = {}
    for profile, n in PROFILES.items():
        res = analyze_data(generate(make_job(profile, f"ev-{profile}", n, T0 + 17.25, 42 * 60)))
        f = next(f for f in res.findings if f.kind == profile)
        out[profile] = f
    return out


@pytest.fixture
def flagged(web: tuple[Page, Seeded], sqlite_url: str, findings: dict[str, Any]) -> tuple[Page, Seeded]:
    p, s = web
    e = make_engine(sqlite_url)
    with e.begin() as c:
        for f in findings.values():
            c.execute(insert(Flag).values(job_pk=s.jobs["1001"]["pk"], kind=f.kind, scope=f.scope, severity=f.severity,
                                          start_ts=s.start, end_ts=s.now, wasted_gpu_hours=f.wasted_gpu_hours,
                                          evidence=f.evidence, suggestion=f.suggestion, open=True,
                                          opened_at=s.start))
    e.dispose()
    foreign: list[str] = []
    p.page.on("request", lambda r: foreign.append(r.url) if not r.url.startswith(p.base) else None)
    p.foreign = foreign  # type: ignore[attr-defined]
    return p, s


def _card(pg: Any, kind: str) -> Any:
    title = flag_kinds().get(kind).title
    return pg.locator("#flags .flag").filter(has=pg.locator(".k", has_text=title)).first


def _overflowing(pg: Any, selector: str) -> list[str]:
    """Descendants of each matching element that stick out of it, or whose text runs out of their own box."""
    return pg.evaluate("""(sel) => {
      const out = [];
      for (const card of document.querySelectorAll(sel)) {
        const c = card.getBoundingClientRect();
        for (const el of card.querySelectorAll('*')) {
          const r = el.getBoundingClientRect();
          // its box outside the card's, or its text running out of its own box (nowrap)
          if (r.width && (r.right > c.right + 1 || r.left < c.left - 1 || el.scrollWidth > el.clientWidth + 1)) {
            out.push(`${el.tagName}.${el.className}: ${el.textContent.slice(0, 40)}`);
          }
        }
      }
      return out;
    }""", selector)


@pytest.mark.browser
def test_job_page_evidence_reads_as_labels_and_units(flagged: tuple[Page, Seeded], findings: dict[str, Any]) -> None:
    p, _ = flagged
    pg = p.open("/jobs/1001")
    pg.wait_for_selector("#flags table.evidence")
    reg = flag_kinds()

    comm = _card(pg, "comm_bound").inner_text()
    cap = findings["comm_bound"].evidence["link_capacity_bytes_s"]
    assert f"NVLink {cap['nvlink'] / 1e9:.0f} GB/s" in comm and f"InfiniBand {cap['ib'] / 1e9:.0f} GB/s" in comm
    assert "450000000000" not in comm
    nvl = findings["comm_bound"].evidence["nvlink_util"]
    assert f"{nvl * 100:.1f}".rstrip("0").rstrip(".") + "%" in comm
    assert reg.evidence_field("comm_bound", "link_capacity_bytes_s").meaning in comm  # each number's meaning

    over = _card(pg, "oversized_allocation")
    idle = findings["oversized_allocation"].evidence["idle_gpu_uuids"]
    assert len(idle) > 3
    row = over.locator("tr[data-key='idle_gpu_uuids']")
    assert row.locator("summary").inner_text() == f"{len(idle)} GPUs"
    assert not row.locator(".ev-items").is_visible()  # folded until asked
    row.locator("summary").click()
    assert row.locator("a.uuid").count() == len(idle)
    assert row.locator(f"a.uuid[href='/gpus/{idle[0]}']").get_attribute("title") == idle[0]
    n = findings["oversized_allocation"].evidence["n_gpus"]
    assert over.locator("tr[data-key='n_gpus'] td.ev-value").inner_text() == str(n)  # an integer, not "16.000"

    hw = _card(pg, "hw_fault").inner_text()
    xid = findings["hw_fault"].evidence["gpus"][0]["xid"]
    assert f"XID {xid}: " in hw  # decoded with NVIDIA's meaning (gpufleet/xid.toml)
    p.shot("evidence-job-cards")

    thr = _card(pg, "throttled")
    cause = findings["throttled"].evidence["cause"]
    assert thr.locator("tr[data-key='cause'] td.ev-value").inner_text() == cause.replace("_", " ")
    assert thr.locator(".s").inner_text() == dict(reg.get("throttled").suggestion_by_cause)[cause]
    reasons = findings["throttled"].evidence["throttle_reasons"]
    assert thr.locator("tr[data-key='throttle_reasons'] td.ev-value").inner_text() == ", ".join(
        r.replace("_", " ") for r in reasons)  # NVIDIA's reason names in words

    stall = _card(pg, "input_stall").inner_text()
    assert re.search(r"host->GPU traffic\s+\d+(\.\d+)? GB/s", stall), stall

    labels = pg.locator("#flags td.ev-label").all_inner_texts()
    assert labels and [t for t in labels if SNAKE.search(t)] == []
    text = pg.locator("#flags").inner_text()
    keys = {k for f in findings.values() for k in f.evidence if "_" in k}
    assert [k for k in keys if re.search(rf"\b{k}\b", text)] == []
    assert re.search(r"\b\d+\.000\b", text) is None
    assert _overflowing(pg, "#flags .flag") == []
    p.shot("evidence-job-cards-open")
    assert p.errors == [] and p.foreign == []  # type: ignore[attr-defined]


@pytest.mark.browser
def test_flags_page_one_line_evidence_has_units_and_no_raw_keys(flagged: tuple[Page, Seeded],
                                                                 findings: dict[str, Any]) -> None:
    p, _ = flagged
    pg = p.open("/flags?open=true")
    rows = pg.evaluate("""() => [...document.querySelectorAll('table.flagtable tbody tr')].map((tr) =>
      [tr.cells[0].querySelector('[data-kind]').dataset.kind, tr.cells[2].innerText,
       tr.querySelector('.evline').innerText])""")
    lines = {kind: line for kind, job, line in rows if job == "1001"}  # the seed's own flags are on other jobs
    assert set(findings) <= set(lines)
    over = lines["oversized_allocation"]
    assert f"GPUs {findings['oversized_allocation'].evidence['n_gpus']}" in over
    cause = findings["throttled"].evidence["cause"].replace("_", " ")
    assert lines["throttled"].startswith(f"cause {cause}")
    for kind, text in lines.items():
        if kind in findings:
            assert [w for w in SNAKE.findall(text) if w in findings[kind].evidence] == [], (kind, text)
    assert _overflowing(pg, "table.flagtable td.wrap") == []
    p.shot("evidence-flags-page")
    assert p.errors == [] and p.foreign == []  # type: ignore[attr-defined]


@pytest.mark.browser
def test_formatter_rules(web: tuple[Page, Seeded]) -> None:
    """The formatter's number rules, evaluated in the page against the registry it serves."""
    p, _ = web
    pg = p.open("/flags")
    got = pg.evaluate("""() => { const E = window.gpufleetEvidence; const t = (unit, v, of) => E.text({ unit, of }, v);
      return [t('count', 4), t('count', 4.0), t('count', 1234567), t('count', 1.8333), t('ratio', 0.8731),
              t('ratio', 1), t('ratio', 0.0004), t('bytes/s', 450e9), t('bytes/s', 4421674751.779), t('bytes', 4194304),
              t('seconds', 22.2), t('seconds', 5400), t('seconds', 0.0421), t('minutes', 45), t('minutes', 190),
              t('MHz', 1415.258), t('W', 612.4), t('GiB', 5.57), t('per_minute', 5.4), t('count', null),
              t('text', 'high'), t('map', 5e10, 'bytes/s')]; }""")
    assert got == ["4", "4", "1,234,567", "1.83", "87.3%", "100%", "<0.1%", "450 GB/s", "4.42 GB/s", "4 MiB",
                   "22.2 s", "90 min", "42.1 ms", "45 min", "3.17 h", "1,415 MHz", "612 W", "5.57 GiB", "5.4 /min",
                   "not measured", "high", "50 GB/s"]
    assert p.errors == []
