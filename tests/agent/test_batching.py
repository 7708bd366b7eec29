"""Open batches: columnar output and recovery of the journal a killed agent left."""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.batching import Journal, OpenBatch, Row
from gpufleet.protocol import AgentInfo, Allocation, Batch, Event, GpuInfo, JobInfo, decode, encode


def _batch(journal: Journal | None = None) -> OpenBatch:
    info = AgentInfo(boot_id="b0", seq=7, node="n1")
    ob = OpenBatch(info, started=0.0)
    if journal:
        journal.start(info)
    g = [GpuInfo(index=0, uuid="GPU-a"), GpuInfo(index=1, uuid="GPU-b")]
    for t in range(3):
        rows = [Row("GPU-a", "j1", {"sm_active": 0.5, "xid_last": 0.0}), Row("GPU-b", None, {"power_w": 70.0 + t})]
        part = ob.new_part(1000.0 + t, rows, g, [JobInfo(job_id="j1")], [Allocation("GPU-a", "j1", 900.0)],
                           [Event(ts=1000.0 + t, kind="xid", gpu_uuid="GPU-a", code=79)] if t == 1 else [])
        if journal:
            journal.append(part)
        ob.add(part)
    return ob


def test_columnar_build_roundtrips_through_the_protocol() -> None:
    b = _batch().build(sent_at=2000.0)
    assert b.idempotency_key == "b0:7" and b.agent.sent_at == 2000.0
    assert b.samples["ts"] == [1000.0, 1000.0, 1001.0, 1001.0, 1002.0, 1002.0]
    assert b.samples["gpu"] == ["GPU-a", "GPU-b"] * 3
    assert b.samples["job"] == ["j1", None] * 3
    assert b.samples["sm_active"] == [0.5, None] * 3
    assert b.samples["power_w"] == [None, 70.0, None, 71.0, None, 72.0]
    assert b.samples["xid_last"] == [0, None] * 3 and isinstance(b.samples["xid_last"][0], int)
    assert list(b.samples)[:3] == ["ts", "gpu", "job"]
    assert len(b.gpus) == 2 and len(b.jobs) == 1 and len(b.allocations) == 1 and len(b.events) == 1
    body, headers = encode(b)
    import zstandard

    assert decode(zstandard.ZstdDecompressor().decompress(body), headers["Content-Type"]) == b


def test_journal_parts_carry_only_what_is_new(tmp_path: Path) -> None:
    j = Journal(tmp_path / "open.journal")
    ob = _batch(j)
    j.close()
    again = ob.new_part(1003.0, [], [GpuInfo(index=0, uuid="GPU-a"), GpuInfo(index=1, uuid="GPU-b", model="X")],
                        [JobInfo(job_id="j1")], [Allocation("GPU-a", "j1", 900.0)], [])
    assert [g.uuid for g in again.gpus] == ["GPU-b"], "only a changed GPU is journaled again"
    assert again.jobs == [] and again.allocations == []
    rec = Journal(tmp_path / "open.journal").recover()
    assert rec is not None
    assert rec.build(0.0) == ob.build(0.0)


def test_journal_recovery_ignores_a_torn_last_record(tmp_path: Path) -> None:
    p = tmp_path / "open.journal"
    j = Journal(p)
    ob = _batch(j)
    j.close()
    data = p.read_bytes()
    p.write_bytes(data[:-5])  # killed in the middle of writing the third cycle
    rec = Journal(p).recover()
    assert rec is not None
    assert rec.agent == AgentInfo(boot_id="b0", seq=7, node="n1"), "the batch keeps its idempotency key"
    assert rec.n_rows == ob.n_rows - 2


def test_unreadable_journal_is_set_aside(tmp_path: Path) -> None:
    p = tmp_path / "open.journal"
    p.write_bytes(b"\x00\x00\x00\x03abc")
    assert Journal(p).recover() is None
    assert (tmp_path / "open.journal.bad").exists()


def test_empty_batch_has_no_columns() -> None:
    ob = OpenBatch(AgentInfo(boot_id="b", seq=0, node="n"), 0.0)
    assert ob.empty()
    assert isinstance(ob.build(0.0), Batch) and ob.build(0.0).samples == {}
