"""Property tests: whatever the cut, journal recovery returns a prefix of the cycles, and the
spool hands batches back in the order they were written, within its bound."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.agent.batching import Journal, OpenBatch, Row
from gpufleet.agent.spool import Spool
from gpufleet.protocol import AgentInfo, GpuInfo

values = st.dictionaries(st.sampled_from(["sm_active", "power_w", "temp_c"]),
                         st.floats(0, 1, allow_nan=False), max_size=3)


@settings(max_examples=60, deadline=None)
@given(cycles=st.lists(st.lists(values, min_size=1, max_size=4), min_size=1, max_size=8), cut=st.floats(0, 1))
def test_journal_recovery_is_a_prefix(cycles: list[list[dict[str, float]]], cut: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "open.journal"
        j = Journal(p)
        info = AgentInfo(boot_id="b", seq=3, node="n")
        j.start(info)
        ob = OpenBatch(info, 0.0)
        for t, rows in enumerate(cycles):
            part = ob.new_part(float(t), [Row(f"GPU-{i}", None, v) for i, v in enumerate(rows)],
                               [GpuInfo(index=i, uuid=f"GPU-{i}") for i in range(len(rows))], [], [], [])
            j.append(part)
            ob.add(part)
        j.close()
        data = p.read_bytes()
        p.write_bytes(data[: int(len(data) * cut)])
        rec = Journal(p).recover()
        if rec is None:
            return
        assert rec.agent == info
        assert rec.rows == ob.rows[: len(rec.rows)]
        # only whole cycles come back
        total = 0
        for rows in cycles:
            if total + len(rows) > len(rec.rows):
                break
            total += len(rows)
        assert len(rec.rows) == total


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 400_000), min_size=1, max_size=25), acks=st.integers(0, 25))
def test_spool_order_and_bound(sizes: list[int], acks: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        s = Spool(Path(d), 1024 * 1024, fsync=False)
        for i, n in enumerate(sizes):
            s.put(b"x" * n, {}, f"k{i}", rows=i)
            assert s.pending_bytes <= s.max_bytes
        for _ in range(acks):
            it = s.peek()
            if it is None:
                break
            s.ack(it)
        left = [i.rows for i in Spool(Path(d), 1024 * 1024)._items]
        assert left == sorted(left), "replay order is write order"
        assert len(left) + s.dropped_batches + min(acks, len(sizes) - s.dropped_batches) == len(sizes)
