"""Issue 38 finding 2: the progress relay's socket was world-writable (0666); any local user
sent {"now": Infinity} (sampling stopped while the agent grew ~30 MB/s) or "wall0": Infinity
(the relay thread died and a legitimate trainer's windows were lost). Now the socket is 0660
with a configurable group, every datagram is checked, the finished windows are bounded in
bytes, and no input stops the relay."""

from __future__ import annotations

import grp
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

from gpufleet.agent.progress_relay import ProgressRelay, sane
from gpufleet.progress import Reporter


def sock_path(tmp_path: Path) -> str:
    d = Path("/tmp") / f"gpf-r-{os.getpid()}-{abs(hash(tmp_path)) % 10**8}"  # AF_UNIX: 108 bytes at most
    d.mkdir(exist_ok=True)
    return str(d / "p.sock")


def wait_for(cond: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def send_raw(path: str, payloads: list[bytes]) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for p in payloads:
            s.sendto(p, path)
    finally:
        s.close()


def header(**kw: Any) -> dict[str, Any]:
    m = time.monotonic()
    base: dict[str, Any] = {"v": 1, "pid": 999, "wall0": time.time(), "mono0": m, "id": {"job": "evil", "rank": 0},
                            "meta": {}, "dropped": 0, "now": m, "ev": []}
    base.update(kw)
    return base


ATTACKS: list[bytes] = [
    json.dumps(header(now=float("inf"))).encode(),
    json.dumps(header(wall0=float("inf"), pid=1000)).encode(),
    json.dumps(header(mono0=float("nan"), pid=1001)).encode(),
    json.dumps(header(now=1e300, pid=1002)).encode(),
    json.dumps(header(pid=2**40)).encode(),
    json.dumps(header(pid=1003, id={"job": "j\x00b", "rank": 2**31})).encode(),
    json.dumps(header(pid=1004, ev=[["s", time.monotonic(), 2**70], ["v", time.monotonic(), "x\x00", {}],
                                    ["e", float("inf"), "fwd", 1.0], ["b", 1e308, "x"], "junk", [None]])).encode(),
    json.dumps(header(pid=1005, ev=[["s", time.monotonic() + 1e8, 1]])).encode(),
    b"\x00\xff not json", b"[1, 2, 3]", b"null", b"{" * 100_000, json.dumps({"pid": "1"}).encode(),
]


def test_the_socket_is_0660_with_the_configured_group(tmp_path: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    r = ProgressRelay(sock_path(tmp_path), group=group)
    try:
        st = os.stat(r.path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    finally:
        r.close()


def test_no_datagram_stops_the_relay_or_costs_a_trainer_its_windows(tmp_path: Path) -> None:
    path = sock_path(tmp_path)
    relay = ProgressRelay(path, expire_s=3600)
    try:
        send_raw(path, ATTACKS * 3)
        wait_for(lambda: relay.received >= 3 * (len(ATTACKS) - 1))  # the 100 kB one may arrive too
        assert relay._thread.is_alive()
        rep = Reporter(path)
        rep.init(job_id="legit", rank=0)
        for i in range(1, 21):
            rep.step(i, tokens=8)
        rep.shutdown()
        got: list[Any] = []
        wait_for(lambda: got.extend(relay.drain(time.time() + 60)) or any(w.job_id == "legit" for w in got))
        legit = [w for w in got if w.job_id == "legit"]
        assert sum(w.steps for w in legit) == 20
        assert all(w.job_id != "j\x00b" for w in got)
        assert relay._thread.is_alive() and relay.folder.bad >= 3 * 6
    finally:
        relay.close()


def test_sane_keeps_a_good_datagram_and_fixes_nan_fields() -> None:
    h = header(ev=[["s", time.monotonic(), 5, 10, None], ["v", time.monotonic(), "loss", {"loss": float("nan")}]])
    out = sane(h)
    assert out is not None and out["ev"][0][:3] == ["s", h["ev"][0][1], 5]
    assert out["ev"][1][3] == {"loss": None}  # not known: a loss=nan keeps its window
    assert sane(header(now=float("inf"))) is None and sane(header(wall0=float("inf"))) is None


def test_finished_windows_are_bounded_in_bytes(tmp_path: Path) -> None:
    """Many streams whose clocks jump minutes ahead: the fold makes windows fast; the relay keeps
    at most max_ready_bytes of them between drains and counts the rest as dropped."""
    path = sock_path(tmp_path)
    relay = ProgressRelay(path, expire_s=3600, max_ready_bytes=50_000)
    try:
        m = time.monotonic()
        payloads = [json.dumps(header(pid=5000 + i, now=m + 590, ev=[["s", m + 1, 1]])).encode()
                    for i in range(50)]
        send_raw(path, payloads)
        wait_for(lambda: relay.received >= 50 and relay._lock.acquire(timeout=1) and (relay._lock.release() or True))
        with relay._lock:
            assert relay.ready_bytes <= 50_000 and relay.dropped > 0
        assert relay._thread.is_alive()
    finally:
        relay.close()


def test_a_stream_from_long_ago_does_not_stall_the_agent_loop(tmp_path: Path) -> None:
    """Found by the fuzz suite: a datagram whose wall0 read 2000-01-01 made the next drain()
    close every 10 s window since, one by one (82 M iterations: the agent's loop hung)."""
    path = sock_path(tmp_path)
    relay = ProgressRelay(path, expire_s=3600, wall=lambda: 946684900.0 + 3600)  # the relay's clock: 2000
    try:
        relay._receive(json.dumps(header(wall0=946684801.0)).encode())
        relay.wall = time.time  # the node's clock is right again: 26 years later
        t0 = time.monotonic()
        relay.drain()
        assert time.monotonic() - t0 < 30
        relay._receive(json.dumps(header(pid=4, wall0=946684801.0)).encode())  # now a year off: refused
        assert relay.folder.bad == 1
    finally:
        relay.close()
