"""A (GPU, ts) row whose fields arrive in two writes (a remote-write sender's shards, issue 17):
every field stored once, read back as one row, and folded into the rollups and minute
features as the same data in one write folds; a retried or repeated write stores nothing
twice. In-process through ``write_batches`` on SQLite and PostgreSQL.

The one-write and split-write data go to the same database under two clusters (so two sets
of GPUs and jobs) and the stored rows are compared with their keys mapped to (GPU index,
minute)."""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from gpufleet.catalog import CATALOG
from gpufleet.collector.columns import prepare
from gpufleet.protocol import Batch
from gpufleet.storage.db import make_engine
from gpufleet.storage.minute_features import STATE
from gpufleet.storage.raw_compact import compact_windows
from gpufleet.storage.raw_read import count_raw_samples, raw_records
from gpufleet.storage.writes import write_batches
from tests.collector.conftest import make_batch

# sm_active (busy) with the first shard, SM clock and throttle reasons with the second: the
# cross-field features (clock while busy, throttle share) need both.
SECOND = ("sm_clock_mhz", "clock_event_reasons", "power_w", "fb_used_bytes", "xid_last", "tensor_active",
          "dram_active", "pcie_replay_count")
# 60 s from :20 of a minute (two minutes per GPU), in the second half of a raw-block window
# (compaction once numbered such blocks as the next window on PostgreSQL: CAST rounds).
START = (time.time() // 600 - 3) * 600 + 440


def _full(cluster: str) -> Batch:
    return make_batch(f"node-{cluster}", cluster=cluster, boot_id=f"boot-{cluster}", gpus=2, seconds=60,
                      start=START, seed=7)


def _part(b: Batch, names: tuple[str, ...], boot: str) -> Batch:
    p = copy.deepcopy(b)
    p.agent.boot_id = boot
    p.samples = {k: v for k, v in p.samples.items() if k in ("ts", "gpu", "job") or k in names}
    return p


def _split(cluster: str) -> tuple[Batch, Batch]:
    b = _full(cluster)
    first = tuple(n for n in CATALOG.names if n not in SECOND)
    return _part(b, first, f"{cluster}-a"), _part(b, SECOND, f"{cluster}-b")


def _write(e: Any, *batches: Batch) -> list[tuple[int, bool]]:
    with e.begin() as c:
        res = write_batches(c, [prepare(b) for b in batches], time.time())
    return [(r.stored, r.duplicate) for r in res.results]


def _stored(e: Any, cluster: str) -> dict[str, Any]:
    """What is stored for ``cluster``'s node, keyed by (GPU index, ...) instead of primary keys."""
    out: dict[str, Any] = {}
    with e.connect() as c:
        gpus = dict(c.execute(text(
            'SELECT g.id, g."index" FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE n.name = :n'),
            {"n": f"node-{cluster}"}).all())
        job = c.execute(text("SELECT j.id FROM jobs j JOIN clusters k ON k.id = j.cluster_id WHERE k.name = :k"),
                        {"k": cluster}).scalar_one()
        idx = gpus
        out["raw"] = sorted((idx[r["gpu_pk"]], r["ts"], tuple(sorted((k, v) for k, v in r.items()
                                                                      if k not in ("gpu_pk", "job_pk"))))
                            for r in raw_records(c, gpu_pks=list(gpus)))
        out["raw_count"] = count_raw_samples(c, gpu_pks=list(gpus))
        for table, key in (("gpu_samples_1m", "gpu_pk"), ("job_samples_1m", "job_pk")):
            where = f"gpu_pk IN ({', '.join(map(str, gpus))})" if key == "gpu_pk" else f"job_pk = {job}"
            rows = c.execute(text(f"SELECT * FROM {table} WHERE {where}")).mappings().all()
            out[table] = sorted((idx[r[key]] if key == "gpu_pk" else -1, r["bucket"], tuple(sorted(
                (k, v) for k, v in r.items() if k not in ("gpu_pk", "job_pk", "id")))) for r in rows)
        rows = c.execute(text(f"SELECT * FROM gpu_minute_features WHERE job_pk = {job}")).mappings().all()
        out["features"] = sorted((idx[r["gpu_pk"]], r["bucket"], tuple((k, r[k]) for k in STATE)) for r in rows)
        h = c.execute(text(f"SELECT hour, h FROM job_hist_features WHERE job_pk = {job}")).all()
        out["hist"] = sorted((hr, bytes(v) if isinstance(v, bytes | memoryview) else tuple(v)) for hr, v in h)
    return out


def _close(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-12 relative (a fold difference ``after - before`` is exact for
    these data; the tolerance only guards the mean's reassociation)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _differences(one: dict[str, Any], two: dict[str, Any]) -> list[str]:
    bad = []
    for k in one:
        if not _close(one[k], two[k]):
            bad.append(k)
    return bad


@pytest.fixture
def e(database_url: str) -> Any:
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


def test_a_row_split_over_two_writes_stores_every_field_once_as_one_write_does(e: Any) -> None:
    assert _write(e, _full("one")) == [(120, False)]
    a, b = _split("two")
    assert _write(e, a) == [(120, False)]
    assert _write(e, b) == [(120, False)]  # every row brought fields: stored, not "already stored"
    one, two = _stored(e, "one"), _stored(e, "two")
    assert len(two["raw"]) == 120 and two["raw_count"] == 120  # one row per (GPU, ts), counted once
    assert all(v is not None for _, _, row in two["raw"] for k, v in row if k in SECOND)
    assert _differences(one, two) == []
    # Exactly: the cross-field sums come from the second write folded against the first's sm_active.
    assert [r[2] for r in one["features"]] == [r[2] for r in two["features"]]


def test_the_split_in_one_write_is_coalesced(e: Any) -> None:
    _write(e, _full("one"))
    a, b = _split("two")
    assert _write(e, a, b) == [(120, False), (120, False)]
    assert _differences(_stored(e, "one"), _stored(e, "two")) == []


def test_a_retried_or_repeated_split_stores_nothing_twice(e: Any) -> None:
    a, b = _split("two")
    _write(e, a)
    _write(e, b)
    before = _stored(e, "two")
    assert _write(e, b) == [(0, True)]  # the same bytes again: the ledger's duplicate
    again = _part(_full("two"), SECOND, "two-c")  # the second shard's fields under a new key ...
    other = make_batch("node-two", cluster="two", gpus=2, seconds=60, start=START, seed=99)
    for k in SECOND:
        again.samples[k] = other.samples[k]  # ... other values
    assert again.samples["power_w"] != b.samples["power_w"]
    assert _write(e, again) == [(0, False)]  # rows already stored: nothing new, nothing overwritten
    whole = _full("two")
    whole.agent.boot_id = "two-d"
    assert _write(e, whole) == [(0, False)]
    assert _stored(e, "two") == before


def test_a_third_write_brings_the_last_fields_of_some_rows(e: Any) -> None:
    """Three pieces, the last only for the first 10 s: only those rows count as stored."""
    _write(e, _full("one"))
    b = _full("two")
    head = tuple(n for n in CATALOG.names if n not in SECOND)
    _write(e, _part(b, head, "two-a"))
    _write(e, _part(b, SECOND[:4], "two-b"))
    last = _part(b, SECOND, "two-c")  # SECOND[:4] again (stored) and SECOND[4:] (new)
    assert _write(e, last) == [(120, False)]
    assert _differences(_stored(e, "one"), _stored(e, "two")) == []


def test_a_late_busy_bit_is_marked_not_guessed(e: Any) -> None:
    """sm_active in the second write: every sum and count as one write folds them; the switch
    count is kept and the minute marked ``interior`` (unknown switches), not recomputed."""
    _write(e, _full("one"))
    b = _full("two")
    late = ("sm_active",)
    _write(e, _part(b, tuple(n for n in CATALOG.names if n not in late), "two-a"))
    assert _write(e, _part(b, late, "two-b")) == [(120, False)]
    one, two = _stored(e, "one"), _stored(e, "two")
    assert _differences(one, two) == ["features"]
    cols = list(STATE)
    for (g1, b1, r1), (g2, b2, r2) in zip(one["features"], two["features"], strict=True):
        assert (g1, b1) == (g2, b2)
        diff = {cols[k] for k, (x, y) in enumerate(zip(r1, r2, strict=True)) if not _close(x[1], y[1])}
        assert diff <= {"interior", "trans", "first_busy", "last_busy"}, diff
        assert dict(r2)["interior"] == dict(r1)["interior"] + (1 if dict(r1)["nb"] else 0)


def test_compaction_coalesces_a_supplement_into_its_row(e: Any) -> None:
    a, b = _split("two")
    _write(e, a)
    _write(e, b)
    before = _stored(e, "two")
    assert compact_windows(e, time.time() + 3600 * 6 - 3 * 3600) >= 1
    with e.connect() as c:
        blocks = c.execute(text("SELECT count(*), sum(n) FROM gpu_sample_blocks")).one()
    assert tuple(blocks) == (2, 120)  # one block per GPU, each row once
    assert _stored(e, "two") == before
    assert np.isfinite([v for _, _, row in before["raw"] for k, v in row if k == "sm_clock_mhz"]).all()


def test_coalesce_takes_each_fields_first_present_value() -> None:
    from gpufleet.storage.fields import NF
    from gpufleet.storage.sample_codec import coalesce

    ts = np.array([1.0, 1.0, 1.0, 2.0])
    gpu = np.array([3, 3, 3, 3])
    job = np.array([7, 8, 9, 7])
    vals = np.full((NF, 4), np.nan)
    vals[0] = [np.nan, 5.0, 6.0, 1.0]  # the first copy lacks it: the second's
    vals[1] = [2.0, 9.0, np.nan, np.nan]  # the first copy's wins; absent stays absent at ts 2
    t, g, j, v = coalesce(ts, gpu, job, vals)
    assert t.tolist() == [1.0, 2.0] and g.tolist() == [3, 3] and j.tolist() == [7, 7]
    assert v[0].tolist() == [5.0, 1.0] and v[1, 0] == 2.0 and np.isnan(v[1, 1]) and np.isnan(v[2]).all()
    same = coalesce(ts[2:], gpu[2:], job[2:], vals[:, 2:])
    assert same[3] is not None and same[0] is not ts  # distinct keys: returned as they are
    assert np.shares_memory(same[3], vals)


def _near(a: Any, b: Any) -> bool:
    """Equal, floats to float32's precision: a rollup mean merged from two writes is rounded
    to PostgreSQL's ``real`` once per write."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 2e-7 * max(abs(a), abs(b))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_near(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _same_but_switches(one: dict[str, Any], two: dict[str, Any],
                       rollups: tuple[str, ...] = ("gpu_samples_1m", "job_samples_1m")) -> None:
    """Equal stored data, but for what rows landing inside a minute's stored span cannot know
    (docs/protocol.md): its busy/idle switches, marked ``interior``; the rollups' means to
    float32 precision (and only ``rollups`` of them)."""
    assert [k for k in _differences(one, two) if k not in ("features", "gpu_samples_1m", "job_samples_1m")] == []
    for table in rollups:
        assert _near(one[table], two[table]), table
    cols = list(STATE)
    for (g1, b1, r1), (g2, b2, r2) in zip(one["features"], two["features"], strict=True):
        assert (g1, b1) == (g2, b2)
        diff = {cols[k] for k, (x, y) in enumerate(zip(r1, r2, strict=True)) if not _close(x[1], y[1])}
        assert diff <= {"interior", "trans", "first_busy", "last_busy"}, diff


def _rows(b: Batch, keep: Any, names: tuple[str, ...], boot: str) -> Batch:
    """``b``'s rows ``keep(second, gpu index)`` with the fields ``names``, under key ``boot``."""
    p = _part(b, names, boot)
    idx = [i for i, t in enumerate(p.samples["ts"]) if keep(int(t - START), i % 2)]
    p.samples = {k: [v[i] for i in idx] for k, v in p.samples.items()}
    return p


def test_late_rows_at_times_nobody_stored_decode_no_field(e: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scrape delivered after the next one lands in stored GPU-minutes at new times: the
    overlap check reads the stored blocks' timestamps only, and the rows are stored as new."""
    import gpufleet.storage.raw_read as raw_read

    _write(e, _full("one"))
    b = _full("two")
    _write(e, _rows(b, lambda s, g: s % 2 == 0, CATALOG.names, "two-even"))
    decoded: list[int] = []
    timed: list[int] = []
    real_blocks, real_times = raw_read.decode_blocks, raw_read.decode_times
    monkeypatch.setattr(raw_read, "decode_blocks", lambda bl: decoded.append(len(bl)) or real_blocks(bl))
    monkeypatch.setattr(raw_read, "decode_times", lambda bl: timed.append(len(bl)) or real_times(bl))
    assert _write(e, _rows(b, lambda s, g: s % 2 == 1, CATALOG.names, "two-odd")) == [(60, False)]
    assert timed and not decoded  # the stored minutes were looked at, no value was decoded
    monkeypatch.undo()
    _same_but_switches(_stored(e, "one"), _stored(e, "two"))


def test_a_write_of_late_rows_and_of_pieces_of_stored_rows(e: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One write holding both kinds for the same minutes: GPU 0's odd seconds complete stored
    rows (their second shard's fields), GPU 1's odd seconds are late rows nobody stored. Only
    GPU 0's blocks are decoded with values; every raw row and GPU rollup is the one-write
    data's."""
    _write(e, _full("one"))
    b = _full("two")
    first = tuple(n for n in CATALOG.names if n not in SECOND)
    assert _write(e, _rows(b, lambda s, g: s % 2 == 0, CATALOG.names, "two-a"),
                  _rows(b, lambda s, g: s % 2 == 1 and g == 0, first, "two-b")) == [(60, False), (30, False)]
    second = _rows(b, lambda s, g: s % 2 == 1 and g == 0, SECOND, "two-c")
    late = _rows(b, lambda s, g: s % 2 == 1 and g == 1, CATALOG.names, "two-d")
    import gpufleet.storage.unique_rows as unique_rows

    valued: list[set[int]] = []
    real = unique_rows.samples_of
    monkeypatch.setattr(unique_rows, "samples_of", lambda bl, **kw: valued.append({b[0] for b in bl}) or real(bl, **kw))
    assert _write(e, second, late) == [(30, False), (30, False)]
    monkeypatch.undo()
    with e.connect() as c:
        gpu0 = c.execute(text('SELECT g.id FROM gpus g JOIN nodes n ON n.id = g.node_id '
                              'WHERE n.name = :n AND g."index" = 0'), {"n": "node-two"}).scalar_one()
    assert valued == [{gpu0}]  # GPU 1's stored blocks: timestamps only
    # The job's rollup mean is not compared: GPU 0's supplement fields merge into a job minute
    # whose other rows lack them by the rows-weighted approximation docs/prometheus.md states.
    _same_but_switches(_stored(e, "one"), _stored(e, "two"), rollups=("gpu_samples_1m",))
    # and a copy of everything under new keys stores nothing
    again = _full("two")
    again.agent.boot_id = "two-e"
    assert _write(e, again) == [(0, False)]
