"""Issue 38's findings on the receivers (remote write, import). Finding 8: remote write
answered some malformed series with a 5xx on every retry (gpu="1e30": 500; an NCCL Inspector
series with rank 2^40: 503), so a Prometheus shard stalled on them. A series the database
cannot store is a 4xx or dropped and counted, never a 5xx; the request's good series are
stored. Finding 10: sender-fed caches bounded in bytes. Finding 11: a 2.0 body under 1.0's
Content-Type; an import of blank lines."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import text

from gpufleet.storage.db import make_engine
from tests.prometheus import test_nccl as tn
from tests.prometheus.captures import body, exposition_series
from tests.prometheus.rwclient import post


def _nccl_series(t: int, **override: str) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    snaps = tn._snapshots(tn._job(), 1)
    out = []
    for labs, v, _k in exposition_series(tn._textfile(snaps[0]), instance=f"{tn.NODE}:9100", job="node"):
        out.append(({**labs, **{k: x for k, x in override.items() if k in labs}}, [(t, v)]))
    return out


GOOD = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-rw-0", "gpu": "0", "Hostname": "rw-node"}


@pytest.mark.parametrize("bad", [
    [({**GOOD, "UUID": "GPU-rw-9", "gpu": "1e30", "Hostname": "rw-bad"}, "v")],
    [({**GOOD, "UUID": "GPU-rw-9", "gpu": str(2**40), "Hostname": "rw-bad"}, "v")],
    [({**GOOD, "UUID": "GPU-rw-9", "gpu": "-3", "Hostname": "rw-bad"}, "v")],
    [({**GOOD, "UUID": "GPU-rw-9", "gpu": "1" + "0" * 30, "Hostname": "rw-bad"}, "v")],  # 1e30 as digits
    [({**GOOD, "UUID": "GPU-\x00rw", "Hostname": "rw-bad"}, "v")],
    [({**GOOD, "Hostname": "rw\x00node"}, "v")],
    "rank", "comm", "nranks",
], ids=["gpu-1e30", "gpu-2^40", "gpu-neg", "gpu-10^30", "uuid-nul", "host-nul", "nccl-rank-2^40", "nccl-comm-nul",
        "nccl-nranks-2^40"])
def test_a_malformed_series_is_never_a_5xx(database_url: str, live_server: Any, bad: Any) -> None:
    srv = live_server(database_url)
    engine = make_engine(database_url)
    t = int(time.time() * 1000) - 30_000
    series: list[tuple[dict[str, str], list[tuple[int, float]]]] = [(GOOD, [(t, 50.0)])]
    if isinstance(bad, str):
        value = {"rank": str(2**40), "comm": "0x\x00bad", "nranks": str(2**40)}[bad]
        series += _nccl_series(t, **{bad: value, "comm_id": value} if bad == "comm" else {bad: value})
    else:
        series += [(labs, [(t, 1.0)]) for labs, _ in bad]
    for _ in range(2):  # Prometheus retries what got a 5xx: the answer must be the same, and not 5xx
        r = post(srv.url, body(series))
        assert r.status_code < 500, r.text
    with engine.connect() as c:
        assert c.execute(text("select count(*) from gpus where uuid = 'GPU-rw-0'")).scalar_one() == 1
    engine.dispose()


def _metric(text_: str, name: str, cache: str) -> float:
    prefix = f'{name}{{cache="{cache}"}} '
    return float(next(line[len(prefix):] for line in text_.splitlines() if line.startswith(prefix)))


def test_sender_chosen_names_are_bounded_in_bytes(sqlite_url: str, live_server: Any) -> None:
    """Finding 10: metadata family names (and series label sets) that senders choose were kept
    for good (60 bodies of 100k names: 119 -> 1,037 MB). Every such cache has a byte bound,
    shown on /metrics with its evictions, and is emptied past it."""
    import httpx

    from gpufleet.collector.remote_write import budget

    srv = live_server(sqlite_url)
    t = int(time.time() * 1000) - 30_000
    per_body = 20_000
    bodies = (budget.FAMILY_BYTES // (per_body * budget.entry_bytes("x" * 120))) + 2
    for b in range(bodies):
        meta = [(f"fam_{b}_{i:06d}_" + "x" * 100, 1) for i in range(per_body)]
        series = [({"__name__": f"junk_{b}_{i}_" + "y" * 200, "instance": "a"}, [(t, 1.0)]) for i in range(2000)]
        r = post(srv.url, body([(GOOD, [(t, 50.0)]), *series], metadata=meta))
        assert r.status_code == 200, r.text
    rw = srv.app.state.remote_write if hasattr(srv.app.state, "remote_write") else None
    m = httpx.get(srv.url + "/metrics", timeout=30).text
    for cache in ("series", "families", "dims", "label_values"):
        assert _metric(m, "gpufleet_remote_write_cache_bytes", cache) <= _metric(
            m, "gpufleet_remote_write_cache_limit_bytes", cache)
    assert _metric(m, "gpufleet_remote_write_cache_evictions_total", "families") >= 1
    if rw is not None:
        assert len(rw.rates.counter_families) * budget.ENTRY_OVERHEAD <= budget.FAMILY_BYTES


def test_a_2_0_body_with_the_1_0_content_type_is_refused_not_dropped(sqlite_url: str, live_server: Any) -> None:
    """Finding 11: a 2.0 body under 1.0's Content-Type decoded as an empty 1.0 request, was
    answered 200 and nothing was stored; the sender never learned. Now 415, naming the fix."""
    from tests.prometheus.prompb import request_v2

    srv = live_server(sqlite_url)
    t = int(time.time() * 1000) - 30_000
    r = post(srv.url, request_v2([(GOOD, [(t, 50.0)])]))  # post() sends 1.0's Content-Type
    assert r.status_code == 415 and "2.0" in r.text, r.text


def test_an_import_of_blank_lines_is_bounded_by_lines(sqlite_url: str, live_server: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 11: a 254 KB gzip of blank lines (254 M lines) cost minutes of import CPU per
    pass. Lines count against a bound whether blank or not (MAX_LINES, lowered here)."""
    import gzip

    import httpx

    from gpufleet.collector import ndjson

    monkeypatch.setattr(ndjson, "MAX_LINES", 100_000)
    srv = live_server(sqlite_url)
    body = gzip.compress(b"\n" * 1_000_000)
    r = httpx.post(srv.url + "/api/v1/import", content=body, headers={"Content-Encoding": "gzip"}, timeout=60)
    assert r.status_code == 413 and "lines" in r.json()["detail"], r.text
