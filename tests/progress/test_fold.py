"""Folding a process's events into 10 s windows: the time accounting is exact on a known
timeline (synthetic datagrams with explicit monotonic times; no sockets, no sleeps)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.progress_fold import EXPIRE_S, WINDOW_S, Folder, hist_quantile

WALL0 = 1_800_000_000.0  # a window boundary
MONO0 = 5000.0


def dgram(evs: list[list[Any]], now: float, *, pid: int = 42, rank: int = 0, job: str = "j1",
          mono0: float = MONO0, wall0: float = WALL0, dropped: int = 0) -> dict[str, Any]:
    return {"v": 1, "pid": pid, "wall0": wall0, "mono0": mono0, "id": {"job": job, "rank": rank, "host": "h"},
            "meta": {}, "dropped": dropped, "now": now, "ev": evs}


def feed_timeline(f: Folder, evs: list[list[Any]], **kw: Any) -> None:
    """One datagram per event, as a client flushing often would send them."""
    for ev in evs:
        f.feed(dgram([ev], ev[1], **kw), ev[1])


def close(f: Folder, at_rel: float) -> list[dict[str, Any]]:
    return f.close_due(WALL0 + at_rel, MONO0 + at_rel)


def total(ws: list[dict[str, Any]], key: str) -> float:
    return sum(w[key] for w in ws)


def test_steps_and_spans_split_time_exactly_across_windows() -> None:
    f = Folder()
    t = MONO0
    evs: list[list[Any]] = [["b", t, "init"], ["e", t + 3.0, "init", 3.0]]
    t += 3.0
    for i in range(1, 26):  # 25 steps of 0.5 s, with 0.1 s of data wait inside each
        evs += [["b", t, "data_wait"], ["e", t + 0.1, "data_wait", 0.1], ["s", t + 0.5, i, 1000, 8]]
        t += 0.5
    evs += [["b", t, "checkpoint_save"], ["e", t + 2.0, "checkpoint_save", 2.0]]
    t += 2.0
    evs += [["s", t + 0.5, 26, 1000, 8]]
    feed_timeline(f, evs)
    ws = close(f, 40.0)
    assert [w["start"] for w in ws] == [WALL0, WALL0 + WINDOW_S]  # 18 s of activity: two windows
    assert total(ws, "steps") == 26
    assert sum(w["tokens"] for w in ws) == 26000 and sum(w["samples"] for w in ws) == 208
    assert total(ws, "productive_s") == pytest.approx(25 * 0.4 + 0.5)
    spans: dict[str, float] = {}
    for w in ws:
        for k, v in w["spans"].items():
            spans[k] = spans.get(k, 0.0) + v
    assert spans == pytest.approx({"init": 3.0, "data_wait": 2.5, "checkpoint_save": 2.0})
    accounted = total(ws, "productive_s") + sum(spans.values()) + total(ws, "stall_s")
    assert accounted == pytest.approx(t + 0.5 - MONO0)  # every second is classified once
    assert ws[0]["process_start"] == WALL0 and ws[1]["process_start"] is None
    assert ws[0]["first_step"] == 1 and ws[-1]["last_step"] == 26
    assert ws[0]["step_time_p50_s"] == pytest.approx(0.4)


def test_a_long_gap_without_span_is_a_stall_and_a_long_checkpoint_is_not() -> None:
    f = Folder()
    evs: list[list[Any]] = [["s", MONO0 + i, i] for i in range(1, 6)]  # 1 s steps
    # 10 minutes of checkpoint, then steps again
    evs += [["b", MONO0 + 5.0, "checkpoint_save"], ["e", MONO0 + 605.0, "checkpoint_save", 600.0]]
    evs += [["s", MONO0 + 606.0, 6]]
    feed_timeline(f, evs)
    # heartbeats during the checkpoint arrive (the client's flusher keeps sending)
    ws = close(f, 700.0)
    assert total(ws, "stall_s") == 0.0
    f2 = Folder()
    feed_timeline(f2, [["s", MONO0 + i, i] for i in range(1, 6)])
    for k in range(1, 60):  # alive (heartbeats), no steps, no span: blocked in a collective
        f2.feed(dgram([], MONO0 + 5 + 2 * k), MONO0 + 5 + 2 * k)
    ws2 = close(f2, 130.0)
    assert total(ws2, "stall_s") > 60.0
    last = ws2[-1]
    assert last["alive"] and last["open_span"] is None and last["since_step_s"] > 100
    # the open checkpoint was reported while it lasted
    f3 = Folder()
    feed_timeline(f3, [["s", MONO0 + 1, 1], ["b", MONO0 + 2, "checkpoint_save"]])
    f3.feed(dgram([], MONO0 + 35), MONO0 + 35)
    ws3 = close(f3, 36.0)
    assert ws3[-1]["open_span"] == "checkpoint_save" and ws3[-1]["open_span_s"] == pytest.approx(28.0)


def test_stalled_time_after_a_hang_is_not_productive_when_steps_resume() -> None:
    f = Folder()
    feed_timeline(f, [["s", MONO0 + i, i] for i in range(1, 11)] + [["s", MONO0 + 200.0, 11]])
    ws = close(f, 215.0)
    assert total(ws, "productive_s") == pytest.approx(10 + 1.0)  # the resumed step counts as a typical one
    assert total(ws, "stall_s") == pytest.approx(189.0)


def test_step_counter_going_back_inside_one_process_counts_lost_steps() -> None:
    f = Folder()
    feed_timeline(f, [["s", MONO0 + i, i] for i in range(1, 31)] + [["s", MONO0 + 31 + i, 20 + i] for i in range(1, 5)])
    ws = close(f, 50.0)
    assert total(ws, "restarts") == 1
    assert total(ws, "lost_steps") == 30 - 21 + 1


def test_a_process_that_disappears_ends_its_stream_with_the_unfinished_step() -> None:
    f = Folder()
    feed_timeline(f, [["s", MONO0 + i * 0.5, i] for i in range(1, 9)])
    f.feed(dgram([], MONO0 + 4.3), MONO0 + 4.3)  # last heartbeat, 0.3 s into step 9
    ws = f.close_due(WALL0 + 4.3 + EXPIRE_S + 1, MONO0 + 4.3 + EXPIRE_S + 1)
    assert ws[-1]["ended"] and not ws[-1]["alive"]
    assert total(ws, "unfinished_s") == pytest.approx(0.3)
    assert not f.streams


def test_a_new_process_with_the_same_pid_is_a_new_stream() -> None:
    f = Folder()
    feed_timeline(f, [["s", MONO0 + 1, 1]])
    f.feed(dgram([["s", MONO0 + 50, 1]], MONO0 + 50, mono0=MONO0 + 45, wall0=WALL0 + 45), MONO0 + 50)
    f.feed(dgram([], MONO0 + 58, mono0=MONO0 + 45, wall0=WALL0 + 45), MONO0 + 58)
    ws = close(f, 62.0)
    assert sum(1 for w in ws if w["ended"]) == 1  # the first process; the second one is still alive
    assert total(ws, "steps") == 2


def test_bad_datagrams_are_counted_and_never_raise() -> None:
    f = Folder()
    for bad in ({}, {"pid": "x"}, {"pid": 1, "wall0": 1, "mono0": 1, "ev": [["s"]]}, {"pid": 1, "mono0": None}):
        assert f.feed(bad, 0.0) is False  # type: ignore[arg-type]
    assert f.bad == 4


def test_histogram_quantiles_are_within_a_bucket() -> None:
    f = Folder()
    feed_timeline(f, [["s", MONO0 + 0.2 * i, i] for i in range(1, 40)])
    (w,) = close(f, 30.0)
    hist = {int(k): v for k, v in w["step_hist"].items()}
    assert hist_quantile(hist, 0.5) == pytest.approx(0.2, rel=0.06)


def test_a_process_silent_past_the_expiry_continues_as_the_same_process() -> None:
    """An import holding the GIL for 20 s starves the heartbeat: the stream expires, then the
    same process (same start clock) speaks again: no restart, and its init span counts once."""
    f = Folder()
    feed_timeline(f, [["b", MONO0 + 0.1, "init"]])
    ws = f.close_due(WALL0 + 15.0, MONO0 + 15.0)  # silent 15 s: expired
    assert not f.streams
    feed_timeline(f, [["e", MONO0 + 20.0, "init", 19.9]] + [["s", MONO0 + 20 + i, i] for i in range(1, 6)])
    ws += close(f, 40.0)
    assert sum(1 for w in ws if w["process_start"] is not None) == 1
    assert sum(w["spans"].get("init", 0.0) for w in ws) == pytest.approx(19.9, abs=0.2)
    assert total(ws, "steps") == 5
