"""Every number the fleet, jobs, job, flags and node pages render, read back from a real Chromium
and checked against the JSON API with the pages' one rounding rule (api/static/fmt.js), and
severity before waste (issue 35 item 3): a critical hardware fault that claims no GPU-hours is
first on the flags page and in the fleet's open flags, its node and only its faulted GPU are
marked, and the node page gives the drain advice. Screenshots at 1440 px go to
artifacts/screenshots/."""

from __future__ import annotations

from typing import Any

import pytest
from apiseed import Seeded
from webpage import SCREENSHOTS, Page, fleet_waste, gh, pct, rounded

pytestmark = pytest.mark.browser


def _fault(sqlite_url: str, s: Seeded) -> str:
    """A critical XID 79 on node-a's GPU 2 (job 1001), claiming no waste, and a warning that
    claims more than any flag: ordered by waste, the fault would come last."""
    from sqlalchemy import insert

    from gpufleet.flagkinds import flag_kinds
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Flag

    uuid = s.gpu_uuids["node-a"][2]
    ev = {"gpus": [{"gpu_uuid": uuid, "xid": 79, "event_fell_off_bus": 1}], "critical_xids": [79],
          "cause": "fell_off_bus"}
    e = make_engine(sqlite_url)
    with e.begin() as c:
        c.execute(insert(Flag).values(job_pk=s.jobs["1001"]["pk"], kind="hw_fault", scope="node-a", severity="critical",
                                      start_ts=s.now - 600, end_ts=s.now, wasted_gpu_hours=0.0, evidence=ev,
                                      suggestion=flag_kinds().get("hw_fault").suggestion_with(ev), open=True,
                                      opened_at=s.now - 600))
        c.execute(insert(Flag).values(job_pk=s.jobs["1001"]["pk"], kind="straggler", scope="node-a",
                                      severity="warning", start_ts=s.start, end_ts=s.now, wasted_gpu_hours=5.0,
                                      evidence={"gpus": s.gpu_uuids["node-a"]}, suggestion="drain or check the node",
                                      open=True, opened_at=s.start))
        c.execute(insert(Flag).values(job_pk=s.jobs["1002"]["pk"], kind="link_errors", scope="node-b",
                                      severity="warning",
                                      start_ts=s.now - 900, end_ts=s.now, wasted_gpu_hours=0.0,
                                      evidence={"nic": "mlx5_0/1", "errors": 12, "judged_from": ["nic_counters"]},
                                      suggestion="check the cable", open=True, opened_at=s.now - 900))
    e.dispose()
    return uuid


def _col(pg: Any, table: str, name: str) -> list[str]:
    heads = [t.strip().lower() for t in pg.locator(f"{table} thead th").all_inner_texts()]
    i = heads.index(name.lower())
    return [t.strip() for t in pg.locator(f"{table} tbody tr td:nth-child({i + 1})").all_inner_texts()]


def _get(p: Page, path: str) -> Any:
    r = p.page.context.request.get(p.base + path)
    assert r.ok, (path, r.status)
    return r.json()


def test_severity_first_and_numbers_match_the_api(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    p, s = web
    faulted = _fault(sqlite_url, s)
    flags = _get(p, "/api/v1/flags?open=true&limit=200")["data"]
    rank = {"critical": 0, "warning": 1, "info": 2}
    assert [rank[f["severity"]] for f in flags] == sorted(rank[f["severity"]] for f in flags)
    assert "hw_fault" in [f["kind"] for f in flags if f["severity"] == "critical"]
    by_waste = _get(p, "/api/v1/flags?open=true&limit=200&sort=waste")["data"]
    assert by_waste[0]["kind"] == "straggler" and by_waste[-1]["kind"] == "hw_fault"  # the old order buried it
    page1 = _get(p, "/api/v1/flags?open=true&limit=2")  # the keyset pages through the same order
    page2 = _get(p, f"/api/v1/flags?open=true&limit=200&cursor={page1['next_cursor']}")
    assert [f["id"] for f in page1["data"] + page2["data"]] == [f["id"] for f in flags]

    # ---- flags page: the API's rows in the API's order, every number as the API has it
    pg = p.open("/flags")
    assert [x.lower() for x in _col(pg, "table.flagtable", "Severity")] == [f["severity"] for f in flags]
    assert pg.locator("table.flagtable tbody tr td:first-child .chip").evaluate_all(
        "els => els.map(e => e.dataset.kind)") == [f["kind"] for f in flags]
    assert _col(pg, "table.flagtable", "Job") == [f["job_id"] for f in flags]
    assert _col(pg, "table.flagtable", "Wasted GPU-h") == [gh(f["wasted_gpu_hours"]) for f in flags]
    link = pg.locator("table.flagtable tbody tr", has=pg.locator(".chip[data-kind=link_errors]")).inner_text()
    assert "nic counters" in link and "nic_counters" not in link  # signal names read as words
    p.shot("numbers-flags")

    # ---- fleet page: KPIs, waste by cause, open flags (most severe first), the grid's marks
    summ = _get(p, "/api/v1/fleet/summary?window=24h")
    pg = p.open("/")
    kpis = {k.locator(".l").inner_text().strip().lower(): k.locator(".v").inner_text().strip()
            for k in pg.locator(".kpi").all()}
    assert kpis["sm active now"] == pct(summ["current"]["sm_active"])
    assert kpis["tensor active 24 h"] == pct(summ["window"]["tensor_active"])
    assert kpis["gpus reporting"] == f"{summ['gpus_reporting']} / {summ['gpus']}"
    assert kpis["gpus allocated"] == str(summ["gpus_allocated"])
    wasted, alloc, by_cause = fleet_waste(pg, p.base, "24h")  # the ledger's once it holds time
    assert kpis["wasted gpu-h 24 h (of allocated)"].startswith(f"{gh(wasted)} of {gh(alloc)}")
    assert kpis["open flags"].startswith(str(sum(summ["open_flags"].values())))
    assert f"{summ['open_flags']['critical']} critical" in kpis["open flags"].lower()
    bars = {b.get_attribute("data-kind"): b.locator(".n").inner_text() for b in pg.locator(".bars .bar").all()}
    assert bars == {k: gh(v) for k, v in by_cause.items() if gh(v) != "0.0"}
    kinds = "els => els.map(e => e.dataset.kind)"
    shown = pg.locator("table.openflags tbody tr td:first-child .chip").evaluate_all(kinds)
    assert shown == [f["kind"] for f in flags[:15]] and shown[0] in ("hw_fault", "idle_gpu")
    assert _col(pg, "table.openflags", "Wasted GPU-h") == [gh(f["wasted_gpu_hours"]) for f in flags[:15]]
    cells = pg.locator("#gpu-grid .cell.flagged.sev-critical")
    assert cells.evaluate_all("els => els.map(e => e.dataset.gpu)") == [faulted]  # only the faulted GPU
    assert pg.locator('#gpu-grid .node.sev-critical').evaluate_all("els => els.map(e => e.dataset.node)") == ["node-a"]
    p.shot("numbers-fleet")

    # ---- jobs page: wasted GPU-h and score per row
    jobs = _get(p, "/api/v1/jobs?limit=100&sort=start&order=desc")["data"]
    pg = p.open("/jobs")
    assert _col(pg, "table.jobs", "Job") == [j["job_id"] for j in jobs]
    assert _col(pg, "table.jobs", "Wasted GPU-h") == [gh(j["wasted_gpu_hours"]) for j in jobs]
    assert _col(pg, "table.jobs", "Goodput") == [pct(j["goodput_score"]) for j in jobs]
    assert _col(pg, "table.jobs", "GPUs") == [str(j["n_gpus"]) for j in jobs]
    p.shot("numbers-jobs")

    # ---- job page: its KPIs; the fault marks GPU node-a:2 alone (the straggler names the node's GPUs)
    j = _get(p, "/api/v1/jobs/1001?cluster=default")
    pg = p.open("/jobs/1001?cluster=default")
    kp = {k.locator(".l").inner_text().strip().lower(): k.locator(".v").inner_text().strip()
          for k in pg.locator(".kpis").first.locator(".kpi").all()}
    led = _get(p, "/api/v1/jobs/1001/ledger?cluster=default")
    if led["allocated_gpu_hours"] > 0:  # the job's ledger, as the page reads it once it holds time
        want = (led["allocated_gpu_hours"], led["wasted_gpu_hours"], led["goodput"])
        assert kp["coverage"] == pct(led["coverage"])
    else:
        want = (j["summary"]["allocated_gpu_hours"], j["summary"]["wasted_gpu_hours"], j["summary"]["goodput_score"])
    assert (kp["allocated gpu-h"], kp["wasted gpu-h"], kp["goodput"]) == (gh(want[0]), gh(want[1]), pct(want[2]))
    fault_marks = pg.locator("#gpu-legend .lg", has_text="Hardware fault").evaluate_all(
        "els => els.map(e => e.dataset.gpu)")
    assert fault_marks == [faulted]
    width = pg.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"the job page scrolls sideways at 1440 px: {width}"
    p.shot("numbers-job")

    # ---- node page: the open flags on its GPUs, the drain advice, only GPU 2 marked
    node = _get(p, "/api/v1/nodes/node-a?cluster=default")
    assert node["flags"][0]["kind"] == "hw_fault" and node["drain"]["kind"] == "hw_fault"
    assert [g["index"] for g in node["drain"]["gpus"]] == [2]
    pg = p.open("/nodes/node-a?cluster=default")
    assert pg.locator("#node-flags tbody tr").evaluate_all("els => els.map(e => e.dataset.kind)") == \
        [f["kind"] for f in node["flags"]]
    assert _col(pg, "#node-flags", "Where")[0] == "GPU 2"
    drain = pg.locator("#drain-advice").inner_text()
    assert "scontrol update nodename=node-a state=drain" in drain and "GPU 2" in drain
    flag_cells = _col(pg, "table.gpus", "Flags")
    assert ["Hardware fault" in c for c in flag_cells] == [g["index"] == 2 for g in node["gpus"]]
    p.shot("numbers-node")
    assert p.errors == []


def test_one_rounding_rule(web: tuple[Page, Seeded]) -> None:
    """fmt.js in the browser and its Python mirror (tests, Slack) agree on every value, edge
    cases included: 0.2795 is 28.0% (toFixed alone says 27.9%), 0.125 is 13%."""
    assert pct(0.2795, 1) == "28.0%" and pct(0.125) == "13%" and rounded(2.25, 1) == "2.3" and gh(123.5) == "124"
    p, _ = web
    pg = p.open("/flags")
    values = [0.2795, 0.125, 0.005, 0.995, 0.0049999, 1.0, 0.0, 0.33333, 0.66665, 0.1 + 0.2,
              *[i / 2000 for i in range(0, 2001, 7)]]
    js = pg.evaluate("(vs) => vs.map((v) => [window.gpufleetFmt.pct(v), window.gpufleetFmt.pct(v, 1), "
                     "window.gpufleetFmt.gh(v * 250)])", values)
    assert js == [[pct(v), pct(v, 1), gh(v * 250)] for v in values]
    from gpufleet.alerts.render import pct_text

    assert [pct_text(v) for v in values] == [pct(v) for v in values]  # Slack too


def test_multi_node_job_page_does_not_scroll_sideways(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    """A 16-node job with 8 NIC ports per node at 1440 px: every chart key wraps, no element
    widens the page, and the sticky time bar sits below the header (it covered chart titles)."""
    from apiseed import seed_big_job
    from sqlalchemy import insert, select

    from gpufleet.storage.collectives_models import NicSampleRow
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Node

    p, s = web
    e = make_engine(sqlite_url)
    seed_big_job(e, n_gpus=128, hours=2.0, job_id="wide", now=s.now)
    with e.begin() as c:
        nodes = list(c.execute(select(Node.id).where(Node.name.like("big-%"))).scalars())
        c.execute(insert(NicSampleRow), [
            {"node_id": nid, "ts": s.now - 60 * m, "nic": f"mlx5_{k}", "interval_s": 60.0, "link_layer": "InfiniBand",
             "state": "ACTIVE", "rate_gbps": 400.0, "tx_bytes_s": 2.0e10, "rx_bytes_s": 1.5e10, "xmit_wait": 0.0,
             "errors": 0.0, "counters": {}}
            for nid in nodes for k in range(8) for m in range(0, 30, 5)])
    e.dispose()
    pg = p.open("/jobs/wide")
    pg.locator("#nic-charts").scroll_into_view_if_needed()
    pg.wait_for_function("() => window.__gpufleet.nicCharts === 128")
    pg.evaluate("() => window.gpufleetCharts.flush()")
    width = pg.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"the job page scrolls sideways at 1440 px: {width}"
    # the sticky time bar sits under the sticky header, not behind it
    pg.locator("#chart-power_w").scroll_into_view_if_needed()
    header = pg.evaluate("() => document.querySelector('header').getBoundingClientRect().bottom")
    bar = pg.evaluate("() => document.querySelector('.sticky-range').getBoundingClientRect().top")
    assert bar >= header - 1, (bar, header)
    pg.screenshot(path=str(SCREENSHOTS / "numbers-job-multinode-scrolled.png"))  # the viewport: bar under header
    pg.locator("#nic-charts").screenshot(path=str(SCREENSHOTS / "numbers-job-multinode-nics.png"))
    p.shot("numbers-job-multinode")
    assert p.errors == []


def _serving_replica(sqlite_url: str, s: Seeded) -> None:
    """Job 666 serves a deployment: replica-minutes for its last 30 minutes (through the storage the
    intake writes with), and its ledger in those minutes as the analysis folds a replica's
    (tests/serving/test_serving_ledger_db.py runs that fold for real): 10 s of each GPU-minute
    served outside the SLOs, 15 s with no request, the rest as before."""
    from sqlalchemy import delete, insert, select

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.gpu_ledger import GpuLedgerMinute
    from gpufleet.storage.serving import write_minutes

    pk = s.jobs["666"]["pk"]
    m1 = int(s.start // 60) + s.minutes
    minutes = range(m1 - 30, m1)
    e = make_engine(sqlite_url)
    with e.begin() as c:
        write_minutes(c, "default", [{"deployment": "chat", "replica": "chat-0", "minute": m * 60, "engine": "vllm",
                                      "gpus": 1, "job_id": "666", "measures": {"requests": 12.0}} for m in minutes])
        t = GpuLedgerMinute.__table__
        old = {(m, cat): v for m, cat, v in c.execute(select(t.c.minute, t.c.category, t.c.gpu_s).where(
            t.c.job_pk == pk, t.c.minute >= minutes[0]))}
        c.execute(delete(t).where(t.c.job_pk == pk, t.c.minute >= minutes[0]))
        rows = []
        for m in minutes:
            thr = old.get((m, "throttled"), 0.0)
            rows += [{"job_pk": pk, "minute": m, "category": k, "gpu_s": v} for k, v in (
                ("productive", 60.0 - thr - 25.0), ("throttled", thr), ("slo_missed", 10.0), ("idle_replica", 15.0))
                if v > 0]
        c.execute(insert(GpuLedgerMinute), rows)
    e.dispose()


def test_serving_waste_beside_training_waste(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    """The fleet page's waste by workload (issue 39): training and serving, each with the API's
    jobs, allocated, productive and wasted GPU-h and its causes; the serving causes among the bars."""
    p, s = web
    _serving_replica(sqlite_url, s)
    summ = _get(p, "/api/v1/fleet/summary?window=24h")
    w = summ["wasted_by_workload"]
    assert w["serving"]["jobs"] == 1 and w["training"]["jobs"] == 3
    assert w["serving"]["wasted_gpu_hours"]["idle_replica"] == round(30 * 15 / 3600, 4)
    assert w["serving"]["wasted_gpu_hours"]["slo_missed"] == round(30 * 10 / 3600, 4)
    assert "idle_replica" not in w["training"]["wasted_gpu_hours"]
    total = w["training"]["wasted_gpu_hours_total"] + w["serving"]["wasted_gpu_hours_total"]
    assert abs(total - summ["wasted_gpu_hours_total"]) < 1e-3  # the two add up to the fleet's waste
    pg = p.open("/")
    assert _col(pg, "table.workloads", "Workload") == ["training", "serving"]
    for col, key in (("Jobs", "jobs"), ("Allocated GPU-h", "allocated_gpu_hours"),
                     ("Productive GPU-h", "productive_gpu_hours"), ("Wasted GPU-h", "wasted_gpu_hours_total")):
        want = [str(w[k][key]) if key == "jobs" else gh(w[k][key]) for k in ("training", "serving")]
        assert _col(pg, "table.workloads", col) == want, col
    for i, k in enumerate(("training", "serving")):
        row = pg.locator("table.workloads tbody tr").nth(i)
        shown = {c.get_attribute("data-kind"): c.locator("b").inner_text()
                 for c in row.locator(".cause").all()}
        assert shown == {c: gh(v) for c, v in w[k]["wasted_gpu_hours"].items() if gh(v) != "0.0"}, k
    _, _, by_cause = fleet_waste(pg, p.base, "24h")
    bars = {b.get_attribute("data-kind"): b.locator(".n").inner_text() for b in pg.locator(".bars .bar").all()}
    assert bars == {k: gh(v) for k, v in by_cause.items() if gh(v) != "0.0"} and "idle_replica" in bars
    p.shot("numbers-fleet-serving")
