"""Resident memory of the receiver and of the agent's progress relay under issue 38's attacks,
in separate processes (RSS from /proc/<pid>/status):

* receiver (``gpufleet serve`` on SQLite): ``--bodies`` remote-write bodies of ``--names``
  metadata family names each (the finding: 60 x 100k took it from 119 to 1,037 MB), then as
  many bodies of 2,000 new series with 200-byte label values each;
* relay (a ProgressRelay in a child process): ``{"now": Infinity}``, ``"wall0": Infinity``,
  clocks jumping 5 h ahead from 4,000 streams, and 1 MB datagrams of events, none drained.

    .venv/bin/python bench/reliability/intake_memory.py [--bodies 60] [--names 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpufleet.collector.remote_write import wire  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, raw: bytes) -> int:
    r = httpx.post(url + "/api/v1/write", content=wire.snappy(raw), timeout=120, headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Write-Version": "0.1.0"})
    return r.status_code


def receiver(bodies: int, names: int) -> None:
    d = tempfile.mkdtemp(prefix="gpf-mem-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "serve", "--database-url", f"sqlite:///{d}/m.db",
                             "--host", "127.0.0.1", "--port", str(port), "--allow-anonymous", "--migrate"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                httpx.get(url + "/metrics", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        t = int(time.time() * 1000) - 30_000
        gpu = (wire.encode_labels([("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("Hostname", "mem-node"),
                                   ("UUID", "GPU-mem-0"), ("gpu", "0")]), [(t, 50.0)])
        post(url, wire.encode([gpu], []))
        start = rss_mb(proc.pid)
        print(f"receiver: {start:.0f} MB after start and one body")
        for b in range(bodies):
            meta = [(f"family_{b}_{i:07d}_padding_to_sixty_bytes_of_name_xxxxxxxxxx", 1) for i in range(names)]
            status = post(url, wire.encode([gpu], meta))
            assert status < 500, status
        fam = rss_mb(proc.pid)
        print(f"receiver: {fam:.0f} MB after {bodies} bodies of {names} metadata family names")
        for b in range(bodies):
            series = [(wire.encode_labels([("__name__", f"junk_{b}_{i}"), ("instance", "x" * 200), ("a", str(i))]),
                       [(t, 1.0)]) for i in range(2000)]
            status = post(url, wire.encode([gpu, *series], []))
            assert status < 500, status
        ser = rss_mb(proc.pid)
        print(f"receiver: {ser:.0f} MB after {bodies} more bodies of 2,000 new series (200-byte label values)")
        m = httpx.get(url + "/metrics", timeout=30).text
        for line in m.splitlines():
            if line.startswith("gpufleet_remote_write_cache_") and not line.startswith("#"):
                print("  " + line)
    finally:
        proc.terminate()
        proc.wait(30)


RELAY_CHILD = r"""
import sys, time, json
from gpufleet.agent.progress_relay import ProgressRelay
r = ProgressRelay(sys.argv[1], expire_s=3600)
print("ready", flush=True)
for line in sys.stdin:
    with r._lock:
        print(json.dumps(r.stats()), flush=True)
"""


def relay() -> None:
    path = f"/tmp/gpf-mem-{os.getpid()}.sock"
    proc = subprocess.Popen([sys.executable, "-c", RELAY_CHILD, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdout.readline()

    def stats() -> dict[str, object]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        return dict(json.loads(proc.stdout.readline()))

    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    try:
        print(f"relay: {rss_mb(proc.pid):.0f} MB at start")
        m = time.monotonic()

        def send(msg: dict[str, object]) -> None:
            while True:
                try:
                    s.sendto(json.dumps(msg).encode(), path)
                    return
                except BlockingIOError:
                    time.sleep(0.001)

        hdr = {"v": 1, "wall0": time.time(), "mono0": m, "id": {"job": "evil", "rank": 0}, "meta": {}, "dropped": 0}
        for i in range(200):
            send({**hdr, "pid": i, "now": float("inf"), "ev": []})
            send({**hdr, "pid": 10_000 + i, "wall0": float("inf"), "now": m, "ev": []})
        for i in range(4000):
            send({**hdr, "pid": 20_000 + i, "now": m + 5 * 3600, "ev": [["s", m + 1, 1]]})
        big = [["v", m + 1, "e", {"k": "x" * 1500}] for _ in range(600)]
        for i in range(200):
            send({**hdr, "pid": 30_000 + i, "now": m + 2, "ev": big})
        for _ in range(600):
            st = stats()
            if int(st["received"]) >= 200 * 2 + 4000 + 200 - 50:  # type: ignore[call-overload]
                break
            time.sleep(0.5)
        time.sleep(2)
        st = stats()
        print(f"relay: {rss_mb(proc.pid):.0f} MB after {st['received']} attack datagrams (bad {st['bad']}, "
              f"windows dropped {st['dropped']}, ready {int(st['ready_bytes']) / 2**20:.1f} MiB "  # type: ignore[call-overload]
              f"of {int(st['max_ready_bytes']) / 2**20:.0f} MiB)")  # type: ignore[call-overload]
    finally:
        s.close()
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bodies", type=int, default=60)
    ap.add_argument("--names", type=int, default=100_000)
    ap.add_argument("--only", choices=("receiver", "relay"))
    a = ap.parse_args()
    if a.only != "relay":
        receiver(a.bodies, a.names)
    if a.only != "receiver":
        relay()


if __name__ == "__main__":
    main()
