"""The durable spool: order, restarts, the size bound, dead letters."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.agent.spool import Spool


def _put(s: Spool, i: int, size: int = 100) -> None:
    s.put(bytes([i % 256]) * size, {"Content-Type": "application/msgpack"}, f"boot:{i}", rows=i)


def test_replays_in_order_across_restarts(tmp_path: Path) -> None:
    s = Spool(tmp_path, 10**6)
    for i in range(1, 6):
        _put(s, i)
    first = s.peek()
    assert first is not None
    header, body = first.read()
    assert header["key"] == "boot:1" and body == b"\x01" * 100
    s.ack(first)
    # a new process finds the rest, oldest first, and appends after them
    s2 = Spool(tmp_path, 10**6)
    assert [i.rows for i in s2._items] == [2, 3, 4, 5]
    _put(s2, 6)
    keys = []
    while (it := s2.peek()) is not None:
        keys.append(it.read()[0]["key"])
        s2.ack(it)
    assert keys == [f"boot:{i}" for i in range(2, 7)]


def test_full_spool_drops_oldest_and_counts(tmp_path: Path) -> None:
    drops: list[tuple[int, int]] = []
    s = Spool(tmp_path, 1024 * 1024, on_drop=lambda b, r: drops.append((b, r)))
    for i in range(1, 13):
        _put(s, i, size=100 * 1024)  # ~100 KiB each: 10 fit in 1 MiB
    assert s.pending_bytes <= s.max_bytes
    kept = [i.rows for i in s._items]
    assert kept == list(range(13 - len(kept), 13)), "the newest are kept, in order"
    assert s.dropped_batches == len(drops) == 12 - len(kept) >= 2
    assert s.dropped_rows == sum(r for _, r in drops) == sum(range(1, 13 - len(kept)))


def test_batch_in_flight_is_not_dropped(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1024 * 1024)
    for i in range(1, 10):
        _put(s, i, size=100 * 1024)
    inflight = s.peek()
    assert inflight is not None and inflight.rows == 1
    for i in range(10, 14):
        _put(s, i, size=100 * 1024)
    assert inflight.path.exists() and s._items[0] is inflight


def test_oversized_batch_is_dropped_not_stored(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1024 * 1024)
    assert s.put(b"x" * (2 * 1024 * 1024), {}, "k", 5) is None
    assert len(s) == 0 and s.dropped_rows == 5


def test_crash_leftovers_are_ignored(tmp_path: Path) -> None:
    s = Spool(tmp_path, 10**6)
    _put(s, 1)
    (tmp_path / "queue" / "0000000000000002-9.batch.tmp").write_bytes(b"half")
    (tmp_path / "queue" / "notes.txt").write_text("not ours")
    s2 = Spool(tmp_path, 10**6)
    assert [i.rows for i in s2._items] == [1]
    assert not (tmp_path / "queue" / "0000000000000002-9.batch.tmp").exists()


def test_dead_letter_keeps_batch_and_reason(tmp_path: Path) -> None:
    s = Spool(tmp_path, 10**6)
    _put(s, 3)
    it = s.peek()
    assert it is not None
    target = s.dead_letter(it, 422, "samples.ts[0]: outside the accepted window")
    assert len(s) == 0 and target.exists()
    reasons = [json.loads(line) for line in (tmp_path / "dead" / "reasons.jsonl").read_text().splitlines()]
    assert reasons == [{"file": target.name, "key": "boot:3", "rows": 3, "status": 422,
                        "reason": "samples.ts[0]: outside the accepted window", "at": reasons[0]["at"]}]
    assert Spool(tmp_path, 10**6).pending_batches == 0, "a dead letter is never replayed"


def test_dead_letters_are_bounded(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1024 * 1024)
    for i in range(1, 9):
        _put(s, i, size=100 * 1024)
        it = s.peek()
        assert it is not None
        s.dead_letter(it, 400, "bad")
    kept = sorted(p.name for p in (tmp_path / "dead").glob("*.batch"))
    assert sum((tmp_path / "dead" / n).stat().st_size for n in kept) <= 1024 * 1024 // 4
    assert kept and kept[-1].endswith("-8.batch"), "the newest dead letter is kept"
    assert len((tmp_path / "dead" / "reasons.jsonl").read_text().splitlines()) == 8
