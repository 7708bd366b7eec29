#!/usr/bin/env python
"""Ingest, storage and query benchmark for the collector, side by side with references
measured in the same run on the same machine:

  1. end-to-end ingest over real HTTP into PostgreSQL (`gpufleet serve --workers N`), load
     from `wrk` with >= 1,000 connections (simulated nodes) posting 80-row batches
     (8 GPUs x 10 s, every catalog field), each request a distinct (boot_id, seq);
  2. the same rows into VictoriaMetrics' /api/v1/import/prometheus (one sample per field);
  3. raw binary COPY (asyncpg copy_records_to_table) of the same rows into a table with the
     same columns and indexes: the database's own limit;
  4. the same HTTP bench against SQLite;
  5. storage: bytes per GPU-sample (raw) and per GPU-day including rollups, for a 64-GPU
     job at 1 Hz, beside VictoriaMetrics holding the same samples;
  6. query: that job's whole window as 1-minute series of every field, from the rollups,
     p50 latency beside VictoriaMetrics answering the same question.

Run:  .venv/bin/python bench/ingest/run.py [--quick]
      .venv/bin/python bench/ingest/run.py --only query [--query-gpus 8]   # parts 5 and 6 alone
      .venv/bin/python bench/ingest/run.py --pg tuned,existing ...   # both servers, interleaved
PostgreSQL (--pg): by default a throwaway instance with production write settings
(bench/pg_instance.py: shared_buffers 1/4 RAM, max_wal_size 16GB, checkpoint_timeout 15min,
wal_compression lz4; fsync and synchronous_commit on), started for the run and removed after;
`--pg existing` uses the server at --pg-admin (default the local service) as before, `--pg URL`
any server. gpufleet and the raw COPY reference always run on the same server. It creates and
drops its own databases (gpufleet_bench_<pid>_*) and its own VictoriaMetrics data directory;
it never touches anything else.
Needs `wrk` and `victoria-metrics` (Debian packages); installs them with apt-get when run
as root, otherwise says what is missing and skips those parts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import pg_instance  # noqa: E402
from pgscratch import scratch_database  # noqa: E402

from gpufleet.catalog import CATALOG  # noqa: E402
from gpufleet.protocol import AgentInfo, Batch, GpuInfo, JobInfo, encode  # noqa: E402

HERE = Path(__file__).resolve().parent
LUA = HERE / "post_bodies.lua"
RW_LUA = REPO / "bench" / "remote_write" / "post_snappy.lua"  # the same framing, remote write's headers
PY = sys.executable
FIELDS = CATALOG.fields
NAMES = CATALOG.names
PLACEHOLDER = "@@@@BOOTKEY@@@@@"  # 16 characters, replaced per request by the wrk script
GPUS_PER_NODE = 8
SECONDS_PER_BATCH = 10


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on port {port} after {timeout:.0f} s")


# --- tools -----------------------------------------------------------------------------------

def locate_tools() -> dict[str, str | None]:
    need = {"wrk": "wrk", "victoria-metrics": "victoria-metrics"}
    found = {k: shutil.which(k) for k in need}
    missing = [need[k] for k, v in found.items() if v is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"installing {' '.join(missing)} with apt-get")
        subprocess.run(["apt-get", "install", "-y", *missing], capture_output=True, timeout=600)
        found = {k: shutil.which(k) for k in need}
    for k, v in found.items():
        if v is None:
            log(f"MISSING: {k} (Debian package {need[k]}); the parts needing it are skipped")
    return found


# --- data --------------------------------------------------------------------------------------

def field_values(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """``n`` consecutive 1-Hz samples of one GPU that look like real telemetry to a compressor:
    noisy activity ratios around a slowly wandering level, integer percentages where NVML
    reports them, power that follows activity (mW resolution), a random-walk temperature in
    whole degrees, clocks that sometimes drop, memory in steps, and counters that count
    (energy always, error counters now and then). Not constants, not random bytes."""
    t = np.arange(n, dtype=np.float64)
    level = np.clip(rng.uniform(0.35, 0.9) + 0.08 * np.sin(t / rng.uniform(200, 900) + rng.uniform(0, 6))
                    + np.cumsum(rng.normal(0, 0.002, n)), 0.02, 0.99)

    def ratio(scale: float, noise: float) -> np.ndarray:
        return np.clip(scale * level + rng.normal(0, noise, n), 0, 1)

    drop = rng.random(n) < 0.02
    v: dict[str, np.ndarray] = {
        "gr_engine_active": ratio(1.05, 0.02), "sm_active": ratio(1.0, 0.03), "sm_occupancy": ratio(0.6, 0.03),
        "tensor_active": ratio(0.55, 0.04), "dram_active": ratio(0.4, 0.03), "fp64_active": ratio(0.0, 0.0),
        "fp32_active": ratio(0.08, 0.01), "fp16_active": ratio(0.3, 0.03),
        "gpu_util": np.round(ratio(1.1, 0.02), 2), "mem_copy_util": np.round(ratio(0.35, 0.03), 2),
        "fb_total_bytes": np.full(n, 80.0 * 2**30),
        "fb_used_bytes": (40 + 2 * np.floor(np.cumsum(rng.random(n) < 0.002))) * 2**30 % (79 * 2**30),
        "power_w": np.round(90 + 580 * level + rng.normal(0, 8, n), 3),
        "temp_c": np.round(np.clip(48 + 22 * level + np.cumsum(rng.normal(0, 0.15, n)), 30, 90)),
        "sm_clock_mhz": np.where(drop, 1755.0, 1980.0), "mem_clock_mhz": np.full(n, 2619.0),
        "clock_event_reasons": np.where(drop, 4.0, 0.0),
        "pcie_tx_bytes_s": np.round(np.abs(rng.normal(2e8, 3e7, n))),
        "pcie_rx_bytes_s": np.round(np.abs(rng.normal(6e8, 8e7, n))),
        "nvlink_tx_bytes_s": np.round(1.2e11 * ratio(0.5, 0.05)),
        "nvlink_rx_bytes_s": np.round(1.2e11 * ratio(0.5, 0.05)),
        "ib_tx_bytes_s": np.round(2.4e10 * ratio(0.4, 0.05)), "ib_rx_bytes_s": np.round(2.4e10 * ratio(0.4, 0.05)),
        "xid_last": np.zeros(n), "ecc_dbe_volatile": np.zeros(n),
        "ecc_sbe_volatile": np.cumsum(rng.random(n) < 0.001).astype(np.float64), "row_remap_failure": np.zeros(n),
        "nvlink_error_count": np.cumsum(rng.random(n) < 0.0005).astype(np.float64),
        "pcie_replay_count": np.cumsum(rng.random(n) < 0.0002).astype(np.float64),
    }
    v["energy_j"] = np.round(2e7 + rng.uniform(0, 1e7) + np.cumsum(v["power_w"]), 3)
    out: dict[str, np.ndarray] = {}
    for f in FIELDS:
        x = v[f.name] if f.name in v else ratio(0.5, 0.05)  # a field added to the catalog later
        out[f.name] = np.clip(x, f.min, f.max)
    return out


def gpu_uuid(node: str, g: int) -> str:
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{node}/{g}')}"


class Templates:
    """One 80-row batch per simulated node: the protocol body (msgpack with a boot id
    placeholder), the same rows in VictoriaMetrics' three inputs (Prometheus text, JSON lines,
    remote write), and as COPY tuples."""

    def __init__(self, nodes: int, now: float, seed: int = 1, windows: int = 1) -> None:
        rng = np.random.default_rng(seed)
        self.nodes = nodes
        self.batches: list[Batch] = []
        start = now - 900
        # Body k is node k % nodes in time window k // nodes: rotating through the bodies,
        # each node's successive batches move forward in time like a real agent's, so a
        # GPU's 1-minute rollup row is folded into by ~6 batches, not by every request.
        for k in range(nodes * windows):
            i, w = k % nodes, k // nodes
            node = f"bench-{i:05d}"
            job = f"bjob-{i // 8}"
            n = GPUS_PER_NODE * SECONDS_PER_BATCH
            vals = field_values(rng, n)
            ts = [start + (i % 60) + w * SECONDS_PER_BATCH + s for s in range(SECONDS_PER_BATCH)
                  for _ in range(GPUS_PER_NODE)]
            gpus = [gpu_uuid(node, g) for _ in range(SECONDS_PER_BATCH) for g in range(GPUS_PER_NODE)]
            samples: dict[str, list[Any]] = {"ts": ts, "gpu": gpus, "job": [job] * n}
            for f in FIELDS:
                v = vals[f.name]
                samples[f.name] = [int(x) for x in v] if f.dtype == "i8" else v.tolist()
            self.batches.append(Batch(
                agent=AgentInfo(boot_id=PLACEHOLDER, seq=0, node=node, version="bench"),
                gpus=[GpuInfo(index=g, uuid=gpu_uuid(node, g), model="NVIDIA H100 80GB HBM3")
                      for g in range(GPUS_PER_NODE)],
                # One user per job, as every node of a real job reports it (a different user
                # per node made every group commit rewrite the job row).
                jobs=[JobInfo(job_id=job, source="simulator", user=f"user{(i // 8) % 50}")],
                samples=samples,
            ))
        self.rows_per_batch = GPUS_PER_NODE * SECONDS_PER_BATCH
        self.fields = len(NAMES)

    def write_protocol(self, path: Path, packed: bool = True) -> int:
        """The bodies as the agent sends them (packed binary columns unless ``packed`` is
        False), uncompressed like the Prometheus text bodies."""
        size = 0
        with path.open("wb") as f:
            for b in self.batches:
                body, _ = encode(b, compress=None, packed=packed)
                assert body.count(PLACEHOLDER.encode()) == 1
                f.write(b"%010d" % len(body) + body)
                size += len(body)
        return size // len(self.batches)

    @staticmethod
    def labels(b: Batch, u: str, j: str) -> dict[str, str]:
        """The labels every VictoriaMetrics input carries for one GPU's series (plus __name__)."""
        return {"cluster": "default", "node": b.agent.node, "gpu": u[-4:], "uuid": u, "job": j}

    @staticmethod
    def per_gpu(b: Batch) -> list[tuple[str, str, list[int]]]:
        """(uuid, job, the batch's row indexes of that GPU in time order) per GPU."""
        rows: dict[tuple[str, str], list[int]] = {}
        for r, (u, j) in enumerate(zip(b.samples["gpu"], b.samples["job"], strict=True)):
            rows.setdefault((u, j), []).append(r)
        return [(u, j, idx) for (u, j), idx in rows.items()]

    def prom_lines(self, b: Batch) -> list[str]:
        s = b.samples
        labels = ["{" + ",".join(f'{k}="{v}"' for k, v in self.labels(b, u, j).items()) + "}"
                  for u, j in zip(s["gpu"], s["job"], strict=True)]
        tms = [int(t * 1000) for t in s["ts"]]
        lines = []
        for f in NAMES:
            for lab, v, t in zip(labels, s[f], tms, strict=True):
                lines.append(f"gpu_{f}{lab} {v} {t}")
        return lines

    def write_prometheus(self, path: Path) -> int:
        """Prometheus text, one line per field sample (/api/v1/import/prometheus)."""
        return self._write(path, lambda b: ("\n".join(self.prom_lines(b)) + "\n").encode())

    def write_jsonl(self, path: Path) -> int:
        """VictoriaMetrics' JSON lines (/api/v1/import): one line per GPU and field holding its
        10 points (the batch's 10 seconds)."""
        enc = msgspec.json.Encoder()

        def body(b: Batch) -> bytes:
            s = b.samples
            lines = []
            for u, j, idx in self.per_gpu(b):
                tms = [int(s["ts"][r] * 1000) for r in idx]
                for f in NAMES:
                    lines.append(enc.encode({"metric": {"__name__": f"gpu_{f}", **self.labels(b, u, j)},
                                             "values": [s[f][r] for r in idx], "timestamps": tms}))
            return b"\n".join(lines) + b"\n"

        return self._write(path, body)

    def write_remote_write(self, path: Path) -> int:
        """Prometheus remote write 1.0 (/api/v1/write): one WriteRequest per batch, a TimeSeries
        per GPU and field with its 10 samples, protobuf then snappy (what vmagent and Prometheus
        send), encoded by the collector's own remote-write module."""
        from gpufleet.collector.remote_write import wire

        def body(b: Batch) -> bytes:
            s = b.samples
            series = []
            for u, j, idx in self.per_gpu(b):
                lab = list(self.labels(b, u, j).items())
                tms = [int(s["ts"][r] * 1000) for r in idx]
                for f in NAMES:
                    series.append((wire.encode_labels([("__name__", f"gpu_{f}"), *lab]),
                                   [(t, float(s[f][r])) for t, r in zip(tms, idx, strict=True)]))
            return wire.snappy(wire.encode(series))

        return self._write(path, body)

    def _write(self, path: Path, body: Any) -> int:
        """Bodies framed "<10-digit length><body>" (the wrk scripts' format); mean size back."""
        size = 0
        with path.open("wb") as f:
            for b in self.batches:
                data = body(b)
                f.write(b"%010d" % len(data) + data)
                size += len(data)
        return size // len(self.batches)

    def copy_records(self) -> list[tuple[Any, ...]]:
        recs = []
        for i, b in enumerate(self.batches):
            s = b.samples
            n = len(s["ts"])
            cols = [s["ts"], [i * GPUS_PER_NODE + r % GPUS_PER_NODE + 1 for r in range(n)], [i // 8 + 1] * n]
            cols += [s[f] for f in NAMES]
            recs.extend(zip(*cols, strict=True))
        return recs


# --- processes ----------------------------------------------------------------------------------

class Proc:
    def __init__(self, args: list[str], env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        self.log = open(log_path or os.devnull, "wb")  # noqa: SIM115
        self.p = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def stop(self) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGTERM)  # our own session: the server and its workers
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(10)
        self.log.close()


def throwaway_db(admin: str, tag: str) -> contextlib.AbstractContextManager[str]:
    """A scratch database on ``admin``: a URL, or "tuned" / "existing" (pg_instance.admin_url:
    "tuned" starts the process-wide tuned instance on first use)."""
    return scratch_database(pg_instance.admin_url(admin), f"gpufleet_bench_{os.getpid()}_{tag}")


def session_cpu_s(sid: int | None = None, user: str | None = None) -> float:
    """CPU seconds (user + system) of the live processes in session ``sid`` or run by
    ``user``, from /proc. CPU per request is the figure that survives a noisy shared box:
    throughput ratios move with whatever else runs, CPU per request much less."""
    import pwd

    uid = pwd.getpwnam(user).pw_uid if user else None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid, st in pg_instance.proc_stats():
        if sid is not None and int(st[3]) != sid:
            continue
        try:
            if uid is not None and os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue  # the process ended meanwhile
        total += int(st[11]) + int(st[12])
    return total / tick


def profile_workers(sid: int, out: Path, seconds: float, name: str) -> list[subprocess.Popen[bytes]]:
    """py-spy (``--gil``: the thread holding the GIL, i.e. the Python work) on each process of the
    server's session but its supervisor, for the measured run: raw folded stacks in ``out``, one
    file per worker (``py-spy`` from the venv; the box's 2 cores share its sampling too)."""
    spy = str(Path(PY).with_name("py-spy"))
    out.mkdir(parents=True, exist_ok=True)
    tag = "".join(ch if ch.isalnum() else "_" for ch in name)
    pids = [pid for pid, st in pg_instance.proc_stats() if int(st[3]) == sid and pid != sid]
    return [subprocess.Popen([spy, "record", "--gil", "-r", "100", "-f", "raw", "-d", str(int(seconds)),
                              "-o", str(out / f"{tag}-{pid}.txt"), "-p", str(pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]


def _keep_failing_logs(tmp: Path) -> None:
    """A collector log that recorded an error outlives the run's temp folder (a 500 among
    thousands of 200s must be explainable afterwards)."""
    keep = Path(tempfile.gettempdir()) / f"gpufleet-bench-logs-{os.getpid()}"
    for f in sorted(tmp.glob("collector-*.log")):
        text = f.read_text(errors="replace")
        if "Traceback" in text or " ERROR " in text or "ERROR:" in text:
            keep.mkdir(exist_ok=True)
            shutil.copy(f, keep / f.name)
            log(f"collector log with errors kept: {keep / f.name}")


@contextlib.contextmanager
def collector(url: str, workers: int, tmp: Path) -> Iterator[tuple[int, int]]:
    port = free_port()
    env = {"GPUFLEET_DATABASE_URL": url, "GPUFLEET_ALLOW_ANONYMOUS": "true"}
    p = Proc([PY, "-m", "gpufleet.cli", "serve", "--database-url", url, "--port", str(port), "--workers",
              str(workers), "--allow-anonymous"], env, tmp / f"collector-{port}.log")
    try:
        wait_port(port)
        wait_healthy(port)
        time.sleep(1.0 + 0.5 * workers)  # every worker has bound and started its writer
        yield port, p.p.pid  # the server leads its own session (start_new_session)
    finally:
        p.stop()


@contextlib.contextmanager
def victoria(binary: str, tmp: Path) -> Iterator[int]:
    port = free_port()
    d = Path(tempfile.mkdtemp(prefix="vm-", dir=tmp))
    p = Proc([binary, f"-storageDataPath={d}", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
              "-search.latencyOffset=0s", "-loggerLevel=ERROR", "-search.maxSamplesPerQuery=2000000000",
              "-search.maxPointsPerTimeseries=100000"], None, tmp / f"vm-{port}.log")
    try:
        wait_port(port)
        yield port
    finally:
        p.stop()
        shutil.rmtree(d, ignore_errors=True)


def wait_healthy(port: int, timeout: float = 180.0) -> None:
    """Until the server answers /healthz: the supervisor binds the port before its workers have
    imported the app (tens of seconds on a loaded box), so an open port is not a server."""
    import httpx

    end = time.time() + timeout
    while time.time() < end:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"no answer from /healthz on port {port} after {timeout:.0f} s")


_RUN = 0  # distinct idempotency keys across the wrk runs of one bench


def run_wrk(wrk: str, port: int, bodies: Path, path: str, ctype: str, *, conns: int, seconds: float,
            threads: int, placeholder: str | None, reverse: bool = False, lua: Path = LUA) -> dict[str, Any]:
    """``reverse``: deal the bodies from the end (the warm-up), so that the measured run, dealt
    from the front, never repeats its rows. ``lua``: the wrk script (RW_LUA for remote write's
    snappy headers)."""
    args = [wrk, f"-t{threads}", f"-c{conns}", f"-d{seconds:.0f}s", "--timeout", "30s", "-s", str(lua),
            f"http://127.0.0.1:{port}", "--", str(bodies), path, ctype]
    if placeholder:
        global _RUN
        _RUN += 1
        args += [placeholder, f"{os.getpid() % 100:02d}{_RUN:02d}", "0", str(threads),
                 "reverse" if reverse else "forward"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
    for line in out.stdout.splitlines():
        if line.startswith("WRKJSON "):
            return json.loads(line[8:])
    raise RuntimeError(f"wrk said: {out.stdout[-2000:]} {out.stderr[-2000:]}")


def _cpu_busy(interval: float) -> float:
    """Cores busy over ``interval`` seconds, the whole box (/proc/stat)."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # all, idle + iowait

    a = read()
    time.sleep(interval)
    b = read()
    total = b[0] - a[0]
    return (os.cpu_count() or 1) * (1.0 - (b[1] - a[1]) / total) if total else 0.0


def settle(what: str, busy_cores: float = 0.25, limit_s: float = 30.0) -> float:
    """Wait until the box is quiet (under ``busy_cores`` busy for 1 s), at most ``limit_s``,
    before a measured run: what the previous run left (its server's queued requests, the
    PostgreSQL instance's background writes, VictoriaMetrics' merges) must not be charged to
    the next one, whichever it is. Returns the cores busy when the run starts."""
    end = time.time() + limit_s
    busy = _cpu_busy(1.0)
    while busy > busy_cores and time.time() < end:
        busy = _cpu_busy(1.0)
    if busy > busy_cores:
        log(f"{what}: the box is still busy ({busy:.2f} cores) after {limit_s:.0f} s; measuring anyway")
    return busy


def conns_list(ap: argparse.ArgumentParser, value: str) -> list[int]:
    """--vm-conns "200,1000" -> [200, 1000] (sorted, each once), or the parser's error."""
    try:
        out = sorted({int(x) for x in str(value).split(",") if x.strip()})
    except ValueError:
        ap.error(f"--vm-conns takes connection counts separated by commas, not {value!r}")
    if not out or min(out) < 1:
        ap.error("--vm-conns needs at least one connection count >= 1")
    return out


def count_rows(url: str) -> int:
    """Raw GPU-samples stored, counted by the storage's own reader (whatever the raw layout)."""
    from sqlalchemy import text

    from gpufleet.storage.db import make_engine

    e = make_engine(url)
    try:
        with e.connect() as c:
            try:
                from gpufleet.storage.raw_read import count_raw_samples
            except ImportError:  # before the compact raw layout: one row per GPU-sample
                return int(c.execute(text("select count(*) from gpu_samples")).scalar_one())
            return count_raw_samples(c)
    finally:
        e.dispose()


def server_cost(d: dict[str, Any] | None, rows: int, requests: int) -> dict[str, Any]:
    """What a run cost its PostgreSQL server (a pg_instance.stats_delta around it), per unit:
    WAL bytes per GPU-sample (from the WAL position: exact), full-page images per 1,000
    GPU-samples, the checkpoints that ran, the server's CPU per request. Server-wide: on a shared
    server other databases' work is in it (an upper bound); on the bench's own instance it is the
    run's alone. Unknown stays None."""
    if d is None:
        return {"postgres_cpu_ms_per_req": None, "wal_bytes_per_gpu_sample": None}
    rows = max(rows, 1)
    cpu = d.get("cpu_s")
    return {"postgres_cpu_ms_per_req": 1e3 * cpu / max(requests, 1) if cpu is not None else None,
            "wal_bytes_per_gpu_sample": d["wal_lsn_bytes"] / rows,
            "wal_kib_per_gpu_minute": 60 * d["wal_lsn_bytes"] / rows / 1024,
            "wal_fpi_per_1k_gpu_samples": 1e3 * d["wal_fpi"] / rows,
            "wal_records_per_gpu_sample": d["wal_records"] / rows,
            "checkpoints": {"timed": d["checkpoints_timed"], "requested": d["checkpoints_req"]},
            "server_delta": d}


def http_ingest(name: str, url: str, tools: dict[str, str | None], bodies: Path, tpl: Templates, args: Any,
                tmp: Path, workers: int) -> dict[str, Any] | None:
    from gpufleet.storage.migrate import upgrade

    if not tools["wrk"]:
        return None
    upgrade(url)
    with collector(url, workers, tmp) as (port, sid):
        log(f"{name}: warm-up")
        warm = run_wrk(tools["wrk"], port, bodies, "/api/v1/ingest", "application/msgpack", conns=args.nodes,
                       seconds=args.warmup, threads=args.wrk_threads, placeholder=PLACEHOLDER, reverse=True)
        settle(name)
        before = count_rows(url)
        log(f"{name}: measuring {args.duration:.0f} s with {args.nodes} connections")
        pg0 = pg_instance.server_stats(url) if url.startswith("postgresql") else None
        spies = profile_workers(sid, args.profile, args.duration, name) if args.profile else []
        cpu0 = session_cpu_s(sid)
        w = run_wrk(tools["wrk"], port, bodies, "/api/v1/ingest", "application/msgpack", conns=args.nodes,
                    seconds=args.duration, threads=args.wrk_threads, placeholder=PLACEHOLDER)
        elapsed = w["duration_us"] / 1e6
        # requests in flight when a run stopped, and threads running unevenly, use bodies
        # beyond the completed count: a margin of both
        sent = int((int(warm["requests"]) + int(w["requests"])) * 1.2) + 2 * args.nodes
        if sent > len(tpl.batches):
            raise RuntimeError(f"{name}: {sent} requests but only {len(tpl.batches)} distinct bodies, so rows "
                               f"repeated (stored once): raise --windows to at least "
                               f"{sent // args.nodes + 2}")
        for spy in spies:
            spy.wait(60)
        time.sleep(3.0)  # let the requests in flight when wrk stopped commit
        # Collector CPU over the run, and what the run cost the PostgreSQL server (server_cost)
        cpu = session_cpu_s(sid) - cpu0
        pgd = pg_instance.stats_delta(pg0, pg_instance.server_stats(url)) if pg0 else None
        stored = count_rows(url) - before
    ok = int(w["status"].get("200", 0))
    # Every key is distinct, so each 200 is a batch committed; the rows it says it stored are the
    # throughput (as for VictoriaMetrics' 204s). Not ok x 80: when one wrk thread runs ahead its
    # share of bodies can meet the warm-up's, and a body posted twice is answered stored=0 (its
    # rows are already stored: 728 of 24,559 requests in one run at 18:28 UTC, 1 Dec).
    acked = int(w.get("stored_rows", ok * tpl.rows_per_batch))
    repeated = ok - acked // tpl.rows_per_batch
    if repeated:
        log(f"{name}: {repeated} bodies were posted twice (answered stored=0), not counted")
    # The database's own count must cover what was acknowledged as stored (it also holds the
    # in-flight requests committed after wrk stopped, hence >=).
    if stored < acked:
        raise RuntimeError(f"{name}: {acked} rows acknowledged as stored but only {stored} in the database")
    return {"name": name, "requests_ok": ok, "status": w["status"], "elapsed": elapsed,
            "rows_s": acked / elapsed, "db_rows": stored, "acked_rows": acked,
            "field_samples_s": acked * tpl.fields / elapsed, "p50_ms": w["p50_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3,
            "collector_cpu_ms_per_req": 1e3 * cpu / max(ok, 1), **server_cost(pgd, stored, ok),
            "errors": {k: v for k, v in w.items() if k.startswith("errors_") and v}}


# VictoriaMetrics' inputs: (path, content type, wrk script, label)
VM_INPUTS = {
    "vm_text": ("/api/v1/import/prometheus", "text/plain", LUA, "Prometheus text /api/v1/import/prometheus"),
    "vm_jsonl": ("/api/v1/import", "application/json", LUA, "JSON lines, 10 points per series, /api/v1/import"),
    "vm_rw": ("/api/v1/write", "application/x-protobuf", RW_LUA,
              "remote write 1.0 (protobuf + snappy) /api/v1/write"),
}


def vm_ingest(kind: str, tools: dict[str, str | None], bodies: Path, tpl: Templates, args: Any,
              tmp: Path) -> dict[str, Any] | None:
    """The same rows into a fresh VictoriaMetrics through one of VM_INPUTS, with the same wrk
    settings as gpufleet. Throughput is acknowledged rows (2xx): VictoriaMetrics answers after
    its in-memory buffer took them (it makes them durable within ~1 s), gpufleet after commit."""
    if not (tools["wrk"] and tools["victoria-metrics"]):
        return None
    path, ctype, lua, label = VM_INPUTS[kind]
    # The reference at its strongest: VictoriaMetrics takes inserts a few at a time (its
    # -maxConcurrentInserts is 2x the cores) and queues the rest, so 1,000 connections cost it
    # throughput (2.4-2.6M field-samples/s here) that 200 do not (3.4M; 4 Dec 2026). Each
    # connection count of --vm-conns is measured on a fresh VictoriaMetrics, the best one kept.
    tries: dict[int, dict[str, Any]] = {}
    for conns in args.vm_conns:
        with victoria(tools["victoria-metrics"], tmp) as port:
            log(f"victoria-metrics {kind}, {conns} connections: warm-up")
            run_wrk(tools["wrk"], port, bodies, path, ctype, conns=conns, seconds=args.warmup,
                    threads=args.wrk_threads, placeholder=None, lua=lua)
            settle(f"victoria-metrics {kind}")
            log(f"victoria-metrics {kind}, {conns} connections: measuring {args.duration:.0f} s")
            w = run_wrk(tools["wrk"], port, bodies, path, ctype, conns=conns, seconds=args.duration,
                        threads=args.wrk_threads, placeholder=None, lua=lua)
            stored = vm_count(port)
        ok = sum(int(v) for k, v in w["status"].items() if k.startswith("2"))
        if ok and stored < len(NAMES) * tpl.rows_per_batch:
            raise RuntimeError(f"VictoriaMetrics {kind}: {ok} requests acknowledged but {stored} samples stored")
        elapsed = w["duration_us"] / 1e6
        tries[conns] = {"name": f"VictoriaMetrics, {label}, {conns} connections", "requests_ok": ok,
                        "status": w["status"], "elapsed": elapsed, "rows_s": ok * tpl.rows_per_batch / elapsed,
                        "field_samples_s": ok * tpl.rows_per_batch * tpl.fields / elapsed,
                        "vm_samples_stored": stored, "p50_ms": w["p50_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3,
                        "conns": conns}
    best = max(tries.values(), key=lambda x: x["field_samples_s"])
    return {**best, "by_conns": {c: x["field_samples_s"] for c, x in tries.items()}}


def vm_count(port: int) -> int:
    """Samples VictoriaMetrics holds for the bench's series (after a flush), whatever came in."""
    import httpx

    httpx.get(f"http://127.0.0.1:{port}/internal/force_flush", timeout=60)
    r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", timeout=120,
                  params={"query": 'sum(count_over_time({__name__="gpu_sm_active"}[1h]))'})
    res = r.json()["data"]["result"]
    return int(float(res[0]["value"][1])) * len(NAMES) if res else 0


def raw_copy(url: str, tpl: Templates, seconds: float, label: str = "") -> dict[str, Any]:
    import asyncpg

    from gpufleet.storage.db import asyncpg_dsn
    from gpufleet.storage.migrate import upgrade

    upgrade(url)
    recs = tpl.copy_records()
    settle(f"raw COPY {label}".strip())
    cols = ["ts", "gpu_pk", "job_pk", *NAMES]

    async def main() -> tuple[int, float]:
        dsn = asyncpg_dsn(url)
        c0 = await asyncpg.connect(dsn)
        # One wide row per GPU-sample, a column per catalog field and the indexes the wide
        # raw table had (job, ts) + BRIN ts: the plainest way PostgreSQL can take these rows,
        # whatever layout gpufleet's own raw storage uses.
        sql_type = {"f4": "real", "f8": "double precision", "i8": "bigint"}
        await c0.execute("CREATE TABLE bench_copy (ts double precision NOT NULL, gpu_pk integer NOT NULL, "
                         "job_pk integer, " + ", ".join(f"{f.name} {sql_type[f.dtype]}" for f in FIELDS) + ")")
        await c0.execute("CREATE INDEX ON bench_copy (job_pk, ts)")
        await c0.execute("CREATE INDEX ON bench_copy USING brin (ts)")
        await c0.close()
        chunk = 8000
        done = [0]
        end = time.perf_counter() + seconds

        async def worker(k: int) -> None:
            c = await asyncpg.connect(dsn)
            i = k * chunk
            while time.perf_counter() < end:
                part = recs[i % len(recs):i % len(recs) + chunk] or recs[:chunk]
                await c.copy_records_to_table("bench_copy", records=part, columns=cols)
                done[0] += len(part)
                i += chunk
            await c.close()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(2)))
        return done[0], time.perf_counter() - t0

    pg0 = pg_instance.server_stats(url)
    rows, el = asyncio.run(main())
    d = pg_instance.stats_delta(pg0, pg_instance.server_stats(url))
    cost = server_cost(d, rows, max(rows // 8000, 1))
    cost.pop("postgres_cpu_ms_per_req")  # per 8000-row COPY, not per request: not comparable
    return {"name": f"PostgreSQL {label + ' ' if label else ''}binary COPY of the same rows, wide "
                    "(asyncpg, 2 connections)",
            "rows_s": rows / el, "field_samples_s": rows * len(NAMES) / el, "rows": rows, **cost}


# --- storage and query -------------------------------------------------------------------------------

def job_dataset(hours: float, gpus: int, start: float) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
    """(gpu, ts, field values) per GPU per hour of a `gpus`-GPU job at 1 Hz."""
    for h in range(int(np.ceil(hours))):
        n = int(min(3600, hours * 3600 - h * 3600))
        ts = start + h * 3600 + np.arange(n, dtype=np.float64)
        for g in range(gpus):
            yield g, ts, field_values(np.random.default_rng(h * 1000 + g), n)


def load_pg_dataset(url: str, hours: float, gpus: int, start: float) -> int:
    from gpufleet.collector.columns import prepare
    from gpufleet.storage import retention
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.migrate import upgrade
    from gpufleet.storage.writes import WriteCache, write_batches

    upgrade(url)
    e = make_engine(url)
    retention.ensure_partitions(e, retention.days_of(np.array([start, start + hours * 3600])))
    cache = WriteCache()
    nodes = gpus // 8
    rows = 0
    seq = 0
    per_hour: dict[int, list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}
    for g, ts, vals in job_dataset(hours, gpus, start):
        per_hour.setdefault(g // 8, []).append((ts, vals))
        if len(per_hour) == nodes and all(len(v) == 8 for v in per_hour.values()):
            batches = []
            for node_i, lst in per_hour.items():
                node = f"q-{node_i:03d}"
                for s0 in range(0, len(lst[0][0]), 600):  # 10-minute batches of 8 GPUs
                    sl = slice(s0, s0 + 600)
                    ts_col, gpu_col, cols = [], [], {f: [] for f in NAMES}
                    for gi, (t, v) in enumerate(lst):
                        m = len(t[sl])
                        ts_col += t[sl].tolist()
                        gpu_col += [gpu_uuid(node, gi)] * m
                        for f in FIELDS:
                            x = v[f.name][sl]
                            cols[f.name] += [int(y) for y in x] if f.dtype == "i8" else x.tolist()
                    batches.append(Batch(agent=AgentInfo(boot_id="qboot", seq=seq, node=node),
                                         gpus=[GpuInfo(index=i, uuid=gpu_uuid(node, i)) for i in range(8)],
                                         jobs=[JobInfo(job_id="qjob", source="simulator", user="q")],
                                         samples={"ts": ts_col, "gpu": gpu_col, "job": ["qjob"] * len(ts_col), **cols}))
                    seq += 1
            with e.begin() as c:
                rows += write_batches(c, [prepare(b) for b in batches], time.time(), cache).stored
            per_hour = {}
    e.dispose()
    import psycopg

    from gpufleet.storage.db import asyncpg_dsn

    with psycopg.connect(asyncpg_dsn(url), autocommit=True) as c:
        c.execute("VACUUM ANALYZE")
    return rows


def load_vm_dataset(port: int, hours: float, gpus: int, start: float) -> int:
    import httpx

    enc = msgspec.json.Encoder()
    url = f"http://127.0.0.1:{port}/api/v1/import"
    client = httpx.Client(timeout=120)
    total = [0]

    def send(item: tuple[int, np.ndarray, dict[str, np.ndarray]]) -> None:
        g, ts, vals = item
        node = f"q-{g // 8:03d}"
        tms = (ts * 1000).astype(np.int64).tolist()
        lines = []
        for f in NAMES:
            lines.append(enc.encode({"metric": {"__name__": f"gpu_{f}", "cluster": "default", "node": node,
                                                "gpu": str(g % 8), "uuid": gpu_uuid(node, g % 8), "job": "qjob"},
                                     "values": vals[f].tolist(), "timestamps": tms}))
        r = client.post(url, content=b"\n".join(lines))
        r.raise_for_status()
        total[0] += len(ts) * len(NAMES)

    with ThreadPoolExecutor(2) as ex:
        list(ex.map(send, job_dataset(hours, gpus, start)))
    client.get(f"http://127.0.0.1:{port}/internal/force_flush")
    client.close()
    return total[0]


def raw_tables() -> list[str]:
    """The raw-sample table(s) the models define: gpu_samples (a row per GPU-second) before the
    compact layout, gpu_sample_blocks after; read from the metadata so both are measured."""
    from gpufleet.storage.models import Base

    return sorted(n for n in Base.metadata.tables if n.startswith("gpu_sample") and not n.endswith("_1m"))


def pg_sizes(url: str) -> dict[str, int]:
    """Bytes on disk (heap + indexes + TOAST, every partition) of the raw table(s), the rollups
    and, where the schema has them, the minute features folded at ingest."""
    import psycopg

    from gpufleet.storage.db import asyncpg_dsn
    from gpufleet.storage.models import Base

    groups = {"raw": raw_tables(), "gpu_samples_1m": ["gpu_samples_1m"], "job_samples_1m": ["job_samples_1m"],
              "features": [n for n in Base.metadata.tables if n in ("gpu_minute_features", "job_hist_features")]}
    out = {}
    with psycopg.connect(asyncpg_dsn(url)) as c:
        for k, tables in groups.items():
            # a partitioned table's tree, or (no tree) the plain table itself
            out[k] = sum(int(c.execute("select coalesce((select sum(pg_total_relation_size(relid)) from "
                                       "pg_partition_tree(%s::regclass)), pg_total_relation_size(%s::regclass))",
                                       (t, t)).fetchone()[0]) for t in tables)
    return out


def vm_size(port: int) -> int:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vm_data_size_bytes")))


def vm_compact(port: int, start: float, hours: float, timeout: float = 300) -> int:
    """VictoriaMetrics' size after /internal/force_merge of the data's month partitions, once
    no merge is running and the size stopped moving (its VACUUM, for a fair comparison)."""
    import httpx

    base = f"http://127.0.0.1:{port}"
    httpx.get(f"{base}/internal/force_flush", timeout=60)
    months = sorted({time.strftime("%Y_%m", time.gmtime(t)) for t in (start, start + hours * 3600)})
    for m in months:
        httpx.get(f"{base}/internal/force_merge", params={"partition_prefix": m}, timeout=60).raise_for_status()
    end = time.time() + timeout
    last = -1
    while time.time() < end:
        time.sleep(3)
        text = httpx.get(f"{base}/metrics", timeout=30).text
        merging = sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vm_active_merges"))
        size = vm_size(port)
        if merging == 0 and size == last:
            return size
        last = size
    log("VictoriaMetrics: merges still running at the timeout; size as it stands")
    return vm_size(port)


def p50(fn: Any, runs: int) -> float:
    fn()  # warm caches
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def query_bench(url: str, port: int | None, hours: float, start: float, runs: int) -> dict[str, Any]:
    """p50 latencies: the job's series through the real API over HTTP (uvicorn, one sequential
    client, body read and parsed), the same rows as plain SQL (the figures reported before the
    API path was measured), and VictoriaMetrics answering the same questions."""
    import httpx
    import psycopg

    from gpufleet.storage.db import asyncpg_dsn

    sys.path.insert(0, str(REPO / "bench" / "api"))
    from bench_api import server  # the API bench's uvicorn process

    a, b = start, start + hours * 3600
    cols = ", ".join(NAMES)
    out: dict[str, Any] = {}
    with psycopg.connect(asyncpg_dsn(url)) as c:
        jpk = c.execute("select id from jobs where job_id = 'qjob'").fetchone()[0]

        def job_series() -> int:
            return len(c.execute(f"select bucket, n, {cols} from job_samples_1m where job_pk = %s and bucket >= %s "
                                 "and bucket < %s order by bucket", (jpk, a, b)).fetchall())

        def gpu_series() -> int:
            return len(c.execute(f"select gpu_pk, bucket, n, {cols} from gpu_samples_1m where job_pk = %s and "
                                 "bucket >= %s and bucket < %s order by gpu_pk, bucket", (jpk, a, b)).fetchall())

        out["pg_job_rows"] = job_series()
        out["pg_gpu_rows"] = gpu_series()
        out["pg_job_ms"] = p50(job_series, runs)
        out["pg_gpu_ms"] = p50(gpu_series, runs)

    everything = ",".join(NAMES)
    window = {"start": a, "end": b}
    api_cases = {
        "api_job_1m": {"gpu": "none", "fields": everything, "step": "60", **window},
        "api_gpu_page": window,  # what the job page asks: 5 fields, step auto
        "api_gpu_page_1m": {"step": "60", **window},
        "api_gpu_all_fields": {"fields": everything, **window},
    }
    with server(url) as base, httpx.Client(base_url=base, timeout=120) as client:
        for name, params in api_cases.items():
            last: dict[str, Any] = {}

            def get(params: dict[str, Any] = params, last: dict[str, Any] = last) -> None:
                r = client.get("/api/v1/jobs/qjob/timeseries", params=params)
                r.raise_for_status()
                body = r.json()
                last.update(step=body["step"], points=body["points"], series=len(body["gpus"]) + 1,
                            fields=len(body["fields"]), bytes=len(r.content))

            out[name] = {"ms": p50(get, runs), **last}

    if port is not None:
        vclient = httpx.Client(timeout=300)
        by_kind: dict[str, list[str]] = {}
        for f in FIELDS:
            by_kind.setdefault(f.rollup, []).append(f"gpu_{f.name}")
        fn = {"mean": "avg_over_time", "sum_rate": "avg_over_time", "max": "max_over_time", "last": "last_over_time"}
        agg = {"mean": "avg", "sum_rate": "avg", "max": "max", "last": "max"}

        def vm(job_level: bool) -> int:
            pts = 0
            for kind, names in by_kind.items():
                sel = f'{{__name__=~"{"|".join(names)}",job="qjob"}}'
                q = f"{fn[kind]}({sel}[1m]) keep_metric_names"
                if job_level:
                    q = f"{agg[kind]} by (__name__) ({q})"
                r = vclient.get(f"http://127.0.0.1:{port}/api/v1/query_range",
                                params={"query": q, "start": a + 60, "end": b, "step": "60s"})
                r.raise_for_status()
                pts += sum(len(s["values"]) for s in r.json()["data"]["result"])
            return pts

        out["vm_job_points"] = vm(True)
        out["vm_gpu_points"] = vm(False)
        out["vm_job_ms"] = p50(lambda: vm(True), runs)
        out["vm_gpu_ms"] = p50(lambda: vm(False), runs)
        vclient.close()
    return out


# --- main ----------------------------------------------------------------------------------------------

def fmt(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k" if x >= 1e3 else f"{x:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs and a 2-hour query window (noisy)")
    ap.add_argument("--nodes", type=int, default=1000, help="simulated nodes = concurrent connections (default 1000)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per measured run (default 30, quick 10)")
    ap.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (default 5, quick 3)")
    ap.add_argument("--workers", type=int, default=2, help="collector processes on PostgreSQL (default 2)")
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--windows", type=int, default=None,
                    help="10-second windows per node: bodies for nodes x windows requests, each request its own rows "
                         "(default 64, quick 32: more than a run sends)")
    ap.add_argument("--query-hours", type=float, default=None, help="query window (default 24, quick 2)")
    ap.add_argument("--query-gpus", type=int, default=64)
    ap.add_argument("--pg", default="tuned",
                    help="PostgreSQL server(s), comma-separated: tuned (default: a throwaway instance with production "
                         "write settings, bench/pg_instance.py), existing (--pg-admin's server, the old behaviour) "
                         "or a postgresql:// admin URL; with several, each round runs gpufleet and raw COPY on each, "
                         "interleaved, and the storage/query part uses the first")
    ap.add_argument("--pg-admin", default=os.environ.get("GPUFLEET_BENCH_PG", pg_instance.DEFAULT_EXISTING),
                    help="the server --pg existing means (default $GPUFLEET_BENCH_PG, else the local service)")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["pg", "vm", "text", "jsonl", "rw", "copy", "sqlite", "query"],
                    help="leave out a part (vm: all three VictoriaMetrics inputs; text/jsonl/rw: one of them)")
    ap.add_argument("--only", choices=["query"], default=None,
                    help="query: only the storage and query part (the --skip of pg, vm, copy and sqlite); with "
                         "--query-gpus 8 a 24 h window loads in a fraction of the 64-GPU time")
    ap.add_argument("--vm-conns", default="200,1000",
                    help="VictoriaMetrics' connection counts, each measured, its best one the reference "
                         "(default 200,1000; gpufleet always gets --nodes connections)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of the PostgreSQL / VictoriaMetrics / COPY ingest runs, interleaved (default 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--profile", type=Path, default=None,
                    help="py-spy --gil each collector worker during gpufleet's measured runs, folded stacks here")
    args = ap.parse_args()
    args.duration = args.duration or (10.0 if args.quick else 30.0)
    args.warmup = args.warmup or (3.0 if args.quick else 5.0)
    args.windows = args.windows or (32 if args.quick else 64)
    args.query_hours = args.query_hours or (2.0 if args.quick else 24.0)
    args.vm_conns = conns_list(ap, args.vm_conns)
    if args.only == "query":
        args.skip += ["pg", "vm", "copy", "sqlite"]

    tools = locate_tools()
    specs = [x.strip() for x in args.pg.split(",") if x.strip()] or ["tuned"]
    labels = [x if x in ("tuned", "existing") else f"server{i + 1}" for i, x in enumerate(specs)]
    if len(set(labels)) != len(labels):
        ap.error(f"--pg names a server twice: {args.pg}")
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    res: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                           "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    try:
        # the servers first (a tuned instance starts here, not inside a measured run), and what
        # each one runs with, for the report
        admins = {lab: pg_instance.admin_url(spec, args.pg_admin) for lab, spec in zip(labels, specs, strict=True)}
        res["pg_servers"] = {lab: pg_instance.reported_settings(u) for lab, u in admins.items()}
        main_pg = admins[labels[0]]
        now = time.time()
        ingest = "pg" not in args.skip or "sqlite" not in args.skip
        # --only query: one window, not the ingest runs' bodies (minutes to build for nothing)
        tpl = Templates(args.nodes, now, windows=args.windows if ingest else 1)
        proto = tmp / "proto.bin"
        if ingest:
            res["body_bytes_protocol"] = tpl.write_protocol(proto)
        # VictoriaMetrics has no idempotency or rollups to keep honest: one window of the
        # same rows is enough (and keeps wrk's memory for 375 KB text bodies bounded). The
        # same seed makes them the very rows of gpufleet's first window.
        tpl1 = Templates(args.nodes, now, windows=1)
        vm_bodies: dict[str, Path] = {}
        for kind, write in (("vm_text", tpl1.write_prometheus), ("vm_jsonl", tpl1.write_jsonl),
                            ("vm_rw", tpl1.write_remote_write)):
            if kind.removeprefix("vm_") not in args.skip and "vm" not in args.skip:
                vm_bodies[kind] = tmp / f"{kind}.bin"
                res[f"body_bytes_{kind}"] = write(vm_bodies[kind])
        # Rounds interleave the three, so a noisy minute hits all of them; the ratios are
        # reported per round and as their median (one run of this box can move 20%).
        rounds: list[dict[str, Any]] = []
        # With several servers each round runs them in a rotated order (round 2 starts with the
        # second), so neither always runs first, right after the box's previous noise.
        for k in range(args.repeat):
            if args.repeat > 1:
                log(f"round {k + 1} of {args.repeat}")
            r: dict[str, Any] = {}
            order = labels[k % len(labels):] + labels[:k % len(labels)]
            by: dict[str, dict[str, Any]] = {lab: {} for lab in labels}
            if "pg" not in args.skip:
                for lab in order:
                    with throwaway_db(admins[lab], f"http{k}s{labels.index(lab)}") as url:
                        by[lab]["pg"] = http_ingest(f"gpufleet -> PostgreSQL {lab} ({args.workers} workers)", url,
                                                    tools, proto, tpl, args, tmp, args.workers)
            for kind, bodies in vm_bodies.items():
                r[kind] = vm_ingest(kind, tools, bodies, tpl1, args, tmp)
            # the headline reference: remote write, VictoriaMetrics' fastest input here
            r["vm"] = r.get("vm_rw") or r.get("vm_jsonl") or r.get("vm_text")
            if "copy" not in args.skip:
                for lab in order:
                    with throwaway_db(admins[lab], f"copy{k}s{labels.index(lab)}") as url:
                        log(f"raw COPY ({lab})")
                        by[lab]["copy"] = raw_copy(url, tpl1, args.duration, lab)
            r["by_server"] = by
            r.update(by[labels[0]])  # "pg" and "copy" of the first server, as before (capacity.py reads them)
            rounds.append(r)
        res["rounds"] = rounds
        res.update(rounds[-1])  # the detailed table shows the last round
        if "sqlite" not in args.skip:
            url = f"sqlite:///{tmp / 'bench.db'}"
            res["sqlite"] = http_ingest("gpufleet -> SQLite (1 worker)", url, tools, proto, tpl, args, tmp, 1)
        if "query" not in args.skip:
            start = (time.time() // 86400) * 86400 - 3 * 86400
            with throwaway_db(main_pg, "query") as url:
                log(f"query: loading a {args.query_gpus}-GPU job, {args.query_hours:g} h at 1 Hz into PostgreSQL")
                t = time.time()
                rows = load_pg_dataset(url, args.query_hours, args.query_gpus, start)
                res["dataset_pg_rows_s"] = rows / (time.time() - t)
                sizes = pg_sizes(url)
                gpu_days = args.query_gpus * args.query_hours / 24
                res["storage"] = {"rows": rows, **sizes, "raw_tables": raw_tables(),
                                  "raw_bytes_per_gpu_sample": sizes["raw"] / rows,
                                  "bytes_per_gpu_day": sum(sizes.values()) / gpu_days,
                                  "rollup_bytes_per_gpu_day":
                                      (sizes["gpu_samples_1m"] + sizes["job_samples_1m"]) / gpu_days,
                                  "features_bytes_per_gpu_day": sizes["features"] / gpu_days}
                if tools["victoria-metrics"]:
                    with victoria(tools["victoria-metrics"], tmp) as port:
                        log("query: loading the same samples into VictoriaMetrics")
                        samples = load_vm_dataset(port, args.query_hours, args.query_gpus, start)
                        res["storage"]["vm_bytes_before_merge"] = vm_size(port)
                        log("VictoriaMetrics: /internal/force_merge")
                        vsize = vm_compact(port, start, args.query_hours)
                        res["storage"]["vm_bytes"] = vsize
                        res["storage"]["vm_bytes_per_field_sample"] = vsize / samples
                        res["storage"]["vm_bytes_per_gpu_sample"] = vsize / rows
                        res["storage"]["vm_bytes_per_gpu_day"] = vsize / gpu_days
                        res["query"] = query_bench(url, port, args.query_hours, start, 7 if args.quick else 15)
                else:
                    res["query"] = query_bench(url, None, args.query_hours, start, 7 if args.quick else 15)
    finally:
        _keep_failing_logs(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    report(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


def ratio_cells(x: dict[str, Any]) -> dict[str, float | None]:
    """One round's ratios on one server (``x`` holds that server's "pg" and "copy"): gpufleet's
    field-samples/s over each VictoriaMetrics input's, and its rows/s over raw COPY's on the same
    server."""
    pg = x.get("pg")
    out: dict[str, float | None] = {}
    for k in (*VM_INPUTS, "copy"):
        ref = x.get(k)
        key = "rows_s" if k == "copy" else "field_samples_s"
        out[k] = pg[key] / ref[key] if pg and ref and ref[key] else None
    return out


def report(r: dict[str, Any]) -> None:
    print(f"\n## results ({r['started']}, {r['cpus']} CPUs, {r['args']['nodes']} connections, "
          f"{r['args']['duration']:.0f} s runs{', quick' if r['args']['quick'] else ''})\n")
    sizes = ", ".join(f"{k.removeprefix('body_bytes_')} {v:,} B" for k, v in r.items() if k.startswith("body_bytes_"))
    print(f"request bodies (80 rows x {len(NAMES)} fields): {sizes}\n")
    servers = list(r.get("pg_servers") or {})
    for lab, st in (r.get("pg_servers") or {}).items():
        print(f"PostgreSQL {lab}: {st.get('server_version', '?').split()[0]}, "
              + ", ".join(f"{k} {st[k]}" for k in ("shared_buffers", "max_wal_size", "checkpoint_timeout",
                                                     "wal_compression", "wal_buffers", "synchronous_commit", "fsync")
                          if k in st))
    print("\n| path | rows/s | field-samples/s | p50 ack | p99 ack | notes |")
    print("|---|---|---|---|---|---|")
    last = r.get("by_server") or {}
    rows = [last[s_].get("pg") for s_ in servers] if last else [r.get("pg")]
    rows += [r.get(k) for k in ("sqlite", *VM_INPUTS)]
    rows += [last[s_].get("copy") for s_ in servers] if last else [r.get("copy")]
    for x in rows:
        if not x:
            continue
        lat = (f"{x['p50_ms']:.0f} ms", f"{x['p99_ms']:.0f} ms") if "p50_ms" in x else ("-", "-")
        note = f"status {x.get('status')}" if "status" in x else ""
        if "collector_cpu_ms_per_req" in x:
            pgc = x.get("postgres_cpu_ms_per_req")
            note += (f"; CPU per request: collector {x['collector_cpu_ms_per_req']:.2f} ms, "
                     f"postgres {f'{pgc:.2f} ms' if pgc is not None else 'unknown'}")
        if x.get("wal_bytes_per_gpu_sample") is not None:
            note += (f"; WAL {x['wal_bytes_per_gpu_sample']:.0f} B per GPU-sample, "
                     f"{x['wal_fpi_per_1k_gpu_samples']:.1f} FPIs per 1k, checkpoints "
                     f"{x['checkpoints']['timed']} timed + {x['checkpoints']['requested']} requested")
        print(f"| {x['name']} | {fmt(x['rows_s'])} | {fmt(x['field_samples_s'])} | {lat[0]} | {lat[1]} | {note} |")
    rounds = [x for x in r.get("rounds") or [] if x.get("pg") or x.get("vm")]  # none with --only query
    for k, x in enumerate(rounds, 1):
        for kind in VM_INPUTS:
            if (x.get(kind) or {}).get("by_conns"):
                print(f"round {k}, VictoriaMetrics {kind} by connections: "
                      + ", ".join(f"{c}: {fmt(v)} field-samples/s" for c, v in x[kind]["by_conns"].items())
                      + f" (the reference: {x[kind]['conns']})")
    # one row per round and server: that server's gpufleet and COPY beside the round's VictoriaMetrics
    cells: list[tuple[int, str, dict[str, Any], dict[str, float | None]]] = []
    for k, x in enumerate(rounds, 1):
        for lab, mine in (x.get("by_server") or {"": {"pg": x.get("pg"), "copy": x.get("copy")}}).items():
            cells.append((k, lab, mine, ratio_cells({**x, **mine})))
    if rounds:
        print(f"\n{len(rounds)} interleaved round(s) (the table above is the last); gpufleet's field-samples/s "
              "over each VictoriaMetrics input's, rows/s over raw COPY's on the same server:\n")
        print("| round | server | gpufleet/PG rows/s | WAL KiB per GPU-minute | vs VM text | vs VM JSON lines "
              "| vs VM remote write | vs raw COPY |")
        print("|---|---|---|---|---|---|---|---|")
        for k, lab, mine, c in cells:
            cs = [f"{c[v]:.2f}x" if c[v] else "-" for v in VM_INPUTS]
            cs.append(f"{100 * c['copy']:.0f}%" if c["copy"] else "-")
            pg = mine.get("pg")
            wal = f"{pg['wal_kib_per_gpu_minute']:.1f}" if pg and pg.get("wal_kib_per_gpu_minute") else "-"
            print(f"| {k} | {lab or '-'} | {fmt(pg['rows_s']) if pg else '-'} | {wal} | {' | '.join(cs)} |")

        for lab in dict.fromkeys(lab for _, lab, _, _ in cells):
            per = [c for _, lb, _, c in cells if lb == lab]
            on = f" on PostgreSQL {lab}" if lab else ""

            def med(k: str, per: list[dict[str, float | None]] = per) -> float | None:
                xs = [v for c in per if (v := c[k])]
                return statistics.median(xs) if xs else None

            rw, cp = med("vm_rw"), med("copy")
            if rw:
                print(f"\n**headline{on}: gpufleet/PostgreSQL vs VictoriaMetrics remote write at its best "
                      f"connection count, median {rw:.2f}x** (goal >= 3x)")
                own = r["args"]["nodes"]
                same = []
                for k, lb, m, _ in cells:
                    vm_own = ((rounds[k - 1].get("vm_rw") or {}).get("by_conns") or {}).get(own)
                    if lb == lab and m.get("pg") and vm_own:
                        same.append(m["pg"]["field_samples_s"] / vm_own)
                if same:
                    print(f"(against VictoriaMetrics at gpufleet's own {own} connections: median "
                          f"{statistics.median(same):.2f}x)")
            for k, label in (("vm_jsonl", "JSON lines"), ("vm_text", "Prometheus text")):
                if med(k):
                    print(f"vs VictoriaMetrics {label}: median {med(k):.2f}x")
            if cp:
                print(f"vs raw binary COPY of the same rows{' on the same server' if lab else ''}: "
                      f"median **{100 * cp:.0f}%** (goal >= 50%)")
            wals = [m["pg"]["wal_kib_per_gpu_minute"] for _, lb, m, _ in cells
                    if lb == lab and m.get("pg") and m["pg"].get("wal_kib_per_gpu_minute")]
            if wals:
                print(f"WAL per GPU-minute{on}: median {statistics.median(wals):.1f} KiB"
                      + (" (server-wide: other databases' writes included)" if lab != "tuned" else ""))
    sq, vm = r.get("sqlite"), r.get("vm")
    if sq and vm:
        print(f"gpufleet/SQLite vs VictoriaMetrics remote write field-samples/s: "
              f"{sq['field_samples_s'] / vm['field_samples_s']:.2f}x")
    s = r.get("storage")
    if s:
        raw = s["raw_bytes_per_gpu_sample"]
        print(f"\nstorage ({s['rows']:,} GPU-samples of a {r['args']['query_gpus']}-GPU job, realistic values; "
              f"PostgreSQL after VACUUM, raw table(s) {', '.join(s['raw_tables'])}): "
              f"raw {raw:.1f} B per GPU-sample ({raw / len(NAMES):.2f} B per field-sample); per GPU-day "
              f"{s['bytes_per_gpu_day'] / 2**20:.2f} MiB in all "
              f"(rollups {s['rollup_bytes_per_gpu_day'] / 2**20:.2f} MiB, "
              f"minute features {s['features_bytes_per_gpu_day'] / 2**20:.2f} MiB)")
        if "vm_bytes" in s:
            print("VictoriaMetrics, same samples, after /internal/force_merge: "
                  f"{s['vm_bytes_per_gpu_sample']:.1f} B per "
                  f"GPU-sample ({s['vm_bytes_per_field_sample']:.2f} B per field-sample; "
                  f"{s['vm_bytes_before_merge'] / s['rows']:.1f} B before the merge). "
                  f"**gpufleet raw / VictoriaMetrics: {raw / s['vm_bytes_per_gpu_sample']:.2f}x** (goal <= 1.5x)")
    q = r.get("query")
    if q:
        h = r["args"]["query_hours"]
        print(f"\nquery: {r['args']['query_gpus']}-GPU job, {h:g} h (p50, client included)\n")
        print("| question | p50 | answer |")
        print("|---|---|---|")
        labels = {"api_job_1m": "API: job line, all fields, 1-minute points (goal <= 20 ms)",
                  "api_gpu_page": "API: per-GPU, the job page's 5 fields, step auto (goal <= 300 ms)",
                  "api_gpu_page_1m": "API: per-GPU, 5 fields, 1-minute points",
                  "api_gpu_all_fields": "API: per-GPU, all fields, step auto"}
        for k, label in labels.items():
            if k in q:
                x = q[k]
                print(f"| {label} | {x['ms']:.1f} ms | {x['series']} series x {x['fields']} fields x {x['points']} "
                      f"points at {x['step']} s, {x['bytes'] / 1024:.0f} KiB JSON |")
        print(f"| SQL: job_samples_1m rows, all fields | {q['pg_job_ms']:.1f} ms | {q['pg_job_rows']} rows |")
        print(f"| SQL: gpu_samples_1m rows, all fields | {q['pg_gpu_ms']:.1f} ms | {q['pg_gpu_rows']} rows |")
        if "vm_job_ms" in q:
            print(f"| VictoriaMetrics: job line, *_over_time[1m] on raw | {q['vm_job_ms']:.0f} ms | "
                  f"{q['vm_job_points']} points |")
            print(f"| VictoriaMetrics: per-GPU, *_over_time[1m] on raw | {q['vm_gpu_ms']:.0f} ms | "
                  f"{q['vm_gpu_points']} points |")
        if "dataset_pg_rows_s" in r:
            print(f"\n(loading that job through write_batches in-process: {fmt(r['dataset_pg_rows_s'])} rows/s)")


if __name__ == "__main__":
    sys.exit(main())
