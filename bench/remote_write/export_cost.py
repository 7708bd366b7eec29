#!/usr/bin/env python
"""What the remote-write export costs ingest (issue 17: "< 10% ingest throughput lost with
export on"), references measured side by side in the same run.

Ingest load: bench/ingest's protocol ingest (`wrk`, 80-row batches, every catalog field,
`gpufleet serve --workers N`, PostgreSQL). Each round runs it three times, order rotated per
round: export off; export on to a *sink* (a minimal remote-write receiver in its own process:
it reads, decompresses and acknowledges each body and counts its samples by decoding it with
rw_count.c, a C walk of the WriteRequest compiled on first use, so its own cost is small and
what ingest loses is mostly the export path's cost); export on to Debian's victoria-metrics on
the same box (the realistic receiver, which also proves the samples arrive: counted with
PromQL). Reported per round: ingest rows/s on / off (the issue's measure: throughput lost),
and beside it the CPU split per ingested field sample: the collector's processes (of it the
export's threads, gf-export-enc and gf-export-send), PostgreSQL's (the bench's own instance),
and the receiver's, which a deployment runs on another host but the ratio pays for here.

On a production deployment the receiver is another host, so the sink configuration answers the
issue's question; with VictoriaMetrics on the same 2 cores its ingest of the exported samples
(~0.6 us each) is taken from gpufleet's ingest too, and the ratio measures it as much as the
export.

``--micro``: the export path alone, in-process: the Exporter is offered the bench's prepared
batches as the writer offers them (one group commit at a time) and posts to a sink; the figure
is this process's CPU (encoder + sender threads, snappy, queue files, HTTP) per exported sample,
min of --repeat. With ``--ref DIR`` (an older tree importable as ``gpufleet``, docs/benchmarks.md)
the old and the new code run alternately in child processes, A/B in the same run.

Run:  .venv/bin/python bench/remote_write/export_cost.py [--repeat 3] [--receivers sink,vm]
      .venv/bin/python bench/remote_write/export_cost.py --repeat 4 --tree /tmp/new --ref /tmp/old   # A/B: <rx>@ref
      .venv/bin/python bench/remote_write/export_cost.py --micro --repeat 7 [--ref /tmp/old]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import cramjam
import httpx

HERE = Path(__file__).resolve().parent
if "--micro-child" in sys.argv:  # the tree under test (PYTHONPATH) is gpufleet before run.py puts the repo first
    import gpufleet.collector.export.exporter  # noqa: F401
sys.path.insert(0, str(HERE))
from run import _ib, ratio, vm_samples  # noqa: E402  (bench/remote_write/run.py: ingest helpers)

PY = sys.executable


# --- the sink receiver (its own process) -------------------------------------------------

class SinkStats:
    def __init__(self) -> None:
        self.bodies = self.bytes = self.samples = self.decoded_bodies = self.bad = 0
        self.counter = ""


def sample_counter(tmp: Path | None = None) -> tuple[str, Callable[[memoryview], int]]:
    """How the sink counts a body's samples: by decoding it. rw_count.c (a WriteRequest walked
    field by field, every length checked, -1 when malformed: ~0.015 us per sample), compiled
    here with ``cc`` on first use; where no compiler is, wire.decode (~2 us per sample, which
    the bench then shows as the sink's CPU). Not by the byte pattern of an encoded Sample: a
    double's or a label's bytes can hold it too (one round counted offered + 1)."""
    import ctypes

    from gpufleet.collector.remote_write import wire

    so = Path(tmp or tempfile.mkdtemp(prefix="rwcount-")) / "rw_count.so"
    try:
        if not so.exists():
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(HERE / "rw_count.c")], check=True,
                           capture_output=True, timeout=120)
        lib = ctypes.CDLL(str(so))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "wire.decode", lambda raw: sum(len(x.samples) for x in wire.decode(bytes(raw)).series)
    fn = lib.rw_count
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long]

    def count(raw: memoryview) -> int:  # a writable buffer's view (no copy to pass it)
        n = int(fn(ctypes.addressof(ctypes.c_char.from_buffer(raw)), len(raw))) if len(raw) else 0
        if n < 0:
            raise ValueError("malformed WriteRequest")
        return n

    return "rw_count.c", count


class _SinkHandler(socketserver.StreamRequestHandler):
    """One keep-alive connection: requests read with a blocking buffered reader (no event loop,
    no copies of the body but the kernel's: asyncio's stream reader cost ~0.8 ms of CPU per
    180 KB body, more than decompressing and decoding it), bodies inflated into a reused
    buffer and counted by decoding."""

    server: _SinkServer
    rbufsize = 1 << 20

    def handle(self) -> None:
        from gpufleet.collector.remote_write import wire

        st, srv = self.server.stats, self.server
        body = bytearray(1 << 20)
        raw = bytearray(1 << 22)
        while True:
            line = self.rfile.readline(65537)
            if not line:
                return
            length = 0
            while (h := self.rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
                k, _, v = h.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            if length > len(body):
                body = bytearray(length)
            view = memoryview(body)[:length]
            if length and self.rfile.readinto(view) != length:
                return
            if line.startswith(b"GET /stats"):
                out = json.dumps({**vars(st), "cpu_s": time.process_time()}).encode()
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(out), out))
                continue
            with srv.lock:
                st.bodies += 1
                st.bytes += length
            try:
                n_raw = wire.snappy_uncompressed_length(bytes(view[:10]))
                if n_raw > len(raw):
                    raw = bytearray(n_raw)
                got = cramjam.snappy.decompress_raw_into(view, raw)
                inflated = memoryview(raw)[:got]
                n = srv.count(inflated)  # decoded: a malformed body is counted bad, not its samples
                check = srv.every and st.bodies % srv.every == 1 % srv.every
                if check and sum(len(x.samples) for x in wire.decode(bytes(inflated)).series) != n:
                    raise ValueError("rw_count and wire.decode disagree")
                with srv.lock:
                    st.samples += n
                    st.decoded_bodies += bool(check)
            except Exception:
                with srv.lock:
                    st.bad += 1
            self.wfile.write(b"HTTP/1.1 204 No Content\r\n\r\n")


class _SinkServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, every: int) -> None:
        self.stats = SinkStats()
        self.stats.counter, self.count = sample_counter()
        self.every = every
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _SinkHandler)


def serve_sink(port: int, every: int) -> None:
    with _SinkServer(port, every) as srv:
        srv.serve_forever()


@contextlib.contextmanager
def sink(tmp: Path, every: int) -> Iterator[int]:
    port = _ib.free_port()
    p = _ib.Proc([PY, str(Path(__file__).resolve()), "--serve-sink", str(port), "--decode-every", str(every)],
                 None, tmp / f"sink-{port}.log")
    try:
        _ib.wait_port(port)
        yield port
    finally:
        p.stop()


def sink_stats(port: int) -> dict[str, Any]:
    s: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/stats", timeout=30).json()
    return s


def vm_cpu_s(port: int) -> float:
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text.splitlines():
        if line.startswith("process_cpu_seconds_total"):
            return float(line.split()[-1])
    return float("nan")


def export_threads_cpu_s(sid: int) -> dict[str, float]:
    """CPU seconds of the export's threads (named gf-export-* by collector/export/exporter.py)
    in the server's processes (session ``sid``) by name, from /proc/<pid>/task/<tid>/stat;
    none for a tree whose threads are unnamed."""
    tick = os.sysconf("SC_CLK_TCK")
    total: dict[str, float] = {}
    for pid, st in _ib.pg_instance.proc_stats():
        if int(st[3]) != sid:
            continue
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                    if name.startswith("gf-export"):
                        f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()
                        total[name] = total.get(name, 0.0) + (int(f[11]) + int(f[12])) / tick
    return total


# --- one ingest run ----------------------------------------------------------------------

def ingest(mode: str, url: str, tools: dict[str, Any], proto: Path, tpl: Any, args: Any, tmp: Path,
           rx_port: int | None, tree: Path | None = None) -> dict[str, Any]:
    """Warm-up, a measured `wrk` run, then (export on) wait until every sample the exporter was
    offered has arrived at the receiver (or --drain-s passed: then what is missing is reported,
    not rounded away as the 98% this waited for before did). ``tree``: an older checkout
    importable as gpufleet, run as the collector."""
    from gpufleet.catalog import CATALOG
    from gpufleet.storage.migrate import upgrade

    upgrade(url)
    env = {"GPUFLEET_EXPORT_URL": f"http://127.0.0.1:{rx_port}/api/v1/write" if rx_port else "",
           "GPUFLEET_EXPORT_QUEUE_DIR": tempfile.mkdtemp(prefix="xq-", dir=tmp)}
    if tree:  # first on sys.path; the bench runs from a directory without a gpufleet/ of its own
        env["PYTHONPATH"] = str(tree)
    rx_cpu = (lambda: sink_stats(rx_port)["cpu_s"]) if mode.startswith("sink") else \
        (lambda: vm_cpu_s(rx_port)) if mode.startswith("vm") else (lambda: 0.0)  # type: ignore[arg-type]
    count = (lambda: sink_stats(rx_port)["samples"]) if mode.startswith("sink") else (lambda: vm_samples(rx_port))
    with mock.patch.dict(os.environ, env), _ib.collector(url, args.workers, tmp) as (port, sid):
        _ib.log(f"{mode}: warm-up")
        arrived0 = count() if rx_port else 0  # what the receiver held before this run (0: its own)
        _ib.run_wrk(tools["wrk"], port, proto, "/api/v1/ingest", "application/msgpack", conns=args.conns,
                    seconds=args.warmup, threads=args.wrk_threads, placeholder=_ib.PLACEHOLDER,
                    reverse=True)  # from the end: the measured run, from the front, never meets it
        _ib.log(f"{mode}: measuring {args.duration:.0f} s")
        pg0 = _ib.pg_instance.server_stats(url)
        cpu0, rx0, xt0 = _ib.session_cpu_s(sid), rx_cpu(), export_threads_cpu_s(sid)
        spies = _ib.profile_workers(sid, args.profile, args.duration, mode) if args.profile else []
        w = _ib.run_wrk(tools["wrk"], port, proto, "/api/v1/ingest", "application/msgpack", conns=args.conns,
                        seconds=args.duration, threads=args.wrk_threads, placeholder=_ib.PLACEHOLDER)
        cpu, rx, xt1 = _ib.session_cpu_s(sid) - cpu0, rx_cpu() - rx0, export_threads_cpu_s(sid)
        xt = {k: v - xt0.get(k, 0.0) for k, v in xt1.items()}
        pg_cpu = _ib.pg_instance.stats_delta(pg0, _ib.pg_instance.server_stats(url))["cpu_s"]
        for spy in spies:
            spy.wait(60)
        # What must arrive: every field of every row stored (warm-up included; the template
        # bodies carry every field). The export forwards the rows a commit stored, not a
        # repeat's (collector/writer.py stored_rows), and --nodes x --windows bodies are sized
        # so a run does not repeat them (a repeat would be ingest's cheap stored=0 path and
        # export nothing: the cost would read low).
        stored = _ib.count_rows(url)
        want = stored * len(CATALOG.names)
        arrived: float | None = None
        drain_s = None
        if rx_port:
            t0, deadline = time.time(), time.time() + args.drain_s
            while True:
                arrived = count() - arrived0
                if arrived >= want:
                    drain_s = time.time() - t0
                    break
                if time.time() > deadline:
                    _ib.log(f"{mode}: {want - arrived:,.0f} of {want:,} offered samples not at the receiver after "
                            f"{args.drain_s:.0f} s")
                    break
                time.sleep(0.5)
    ok = int(w["status"].get("200", 0))
    elapsed = w["duration_us"] / 1e6
    rows_w = w.get("stored_rows")  # what the 200s said they stored (a repeat says 0)
    rows = rows_w if rows_w is not None else ok * tpl.rows_per_batch
    per_sample = 1e6 / max(rows * len(CATALOG.names), 1)  # CPU us per ingested (= exported) field sample
    return {"mode": mode, "requests_ok": ok, "rows_s": rows / elapsed, "db_rows": stored,
            "stored_rows_w": w.get("stored_rows"), "stored_samples": stored * len(CATALOG.names),
            "p50_ms": w["p50_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3, "cpu_ms_per_req": 1e3 * cpu / max(ok, 1),
            "receiver_cpu_ms_per_req": 1e3 * rx / max(ok, 1), "arrived_samples": arrived,
            "postgres_cpu_ms_per_req": 1e3 * pg_cpu / max(ok, 1) if pg_cpu is not None else None,
            "us_per_sample": {"collector": cpu * per_sample, "export_threads": sum(xt.values()) * per_sample,
                              **{k.removeprefix("gf-"): v * per_sample for k, v in xt.items()},
                              "postgres": pg_cpu * per_sample if pg_cpu is not None else None,
                              "receiver": rx * per_sample},
            "offered_samples": want, "drain_s": drain_s}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main_ingest(args: Any) -> int:
    tools = _ib.locate_tools()
    receivers = [r for r in args.receivers.split(",") if r]
    if not tools["wrk"] or ("vm" in receivers and not tools["victoria-metrics"]):
        _ib.log("needs wrk (and victoria-metrics for --receivers vm): apt-get install wrk victoria-metrics")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-exportcost-"))
    res: dict[str, Any] = {"args": vars(args), "cpus": os.cpu_count(), "rounds": [],
                           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load": [loadavg()]}
    tpl = _ib.Templates(args.nodes, time.time(), windows=args.windows)
    res["samples_per_request"] = tpl.rows_per_batch * tpl.fields
    proto = tmp / "proto.bin"
    tpl.write_protocol(proto)
    modes = ["off", *receivers]
    trees: dict[str, Path | None] = {m: args.tree.resolve() if args.tree else None for m in modes}
    if args.tree and not args.ref:
        os.chdir(tmp)
    if args.ref:  # the same receivers with the older tree's collector, A/B in the same round
        os.chdir(tmp)  # `python -m gpufleet.cli` puts the cwd first: not the checkout's gpufleet/
        for m in receivers:
            trees[f"{m}@ref"] = args.ref.resolve()
        receivers = [*receivers, *(f"{m}@ref" for m in receivers)]
        modes = ["off", *receivers]
    for k in range(args.repeat):
        r: dict[str, Any] = {"load": loadavg()}
        for mode in modes[k % len(modes):] + modes[:k % len(modes)]:  # rotated: no side always runs first
            with contextlib.ExitStack() as st:
                port = None
                if mode.startswith("sink"):
                    port = st.enter_context(sink(tmp, args.decode_every))
                elif mode.startswith("vm"):
                    port = st.enter_context(_ib.victoria(tools["victoria-metrics"], tmp))
                url = st.enter_context(_ib.throwaway_db(args.pg_admin, f"x{mode.replace('@', '_')}{k}"))
                r[mode] = ingest(mode, url, tools, proto, tpl, args, tmp, port, trees[mode])
        for m in receivers:
            r[f"ratio_{m}"] = ratio(r[m]["rows_s"], r["off"]["rows_s"])
        res["rounds"].append(r)
        _ib.log(f"round {k + 1} (load {r['load']}): " + ", ".join(f"{m} {r[f'ratio_{m}']:.2f}" for m in receivers))
    res["load"].append(loadavg())
    report(res, receivers)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


def report(res: dict[str, Any], receivers: list[str]) -> None:
    a = res["args"]
    print(f"\n## export cost ({res['started']}, {res['cpus']} CPUs, {a['conns']} connections, {a['workers']} "
          f"workers, {a['duration']:.0f} s runs, load average {res['load'][0]} -> {res['load'][-1]})\n")
    print("| round | load | export off rows/s | " + " | ".join(f"on ({m}) rows/s | ratio" for m in receivers)
          + " | collector CPU ms/req off / " + " / ".join(receivers) + " | receiver CPU ms/req "
          + " / ".join(receivers) + " | arrived / offered samples " + " / ".join(receivers) + " |")
    print("|---" * (4 + 2 * len(receivers) + 2) + "|")
    for i, r in enumerate(res["rounds"], 1):
        cells = [str(i), r["load"], f"{r['off']['rows_s']:,.0f}"]
        for m in receivers:
            cells += [f"{r[m]['rows_s']:,.0f}", f"{r[f'ratio_{m}']:.3f}"]
        cells.append(" / ".join(f"{r[m]['cpu_ms_per_req']:.2f}" for m in ["off", *receivers]))
        cells.append(" / ".join(f"{r[m]['receiver_cpu_ms_per_req']:.2f}" for m in receivers))
        cells.append(" ; ".join(f"{(r[m]['arrived_samples'] or 0):,.0f} / {r[m]['offered_samples']:,}"
                                for m in receivers))
        print("| " + " | ".join(cells) + " |")
    for m in receivers:
        xs = [r[f"ratio_{m}"] for r in res["rounds"] if r[f"ratio_{m}"] == r[f"ratio_{m}"]]
        cpu = [r[m]["cpu_ms_per_req"] / r["off"]["cpu_ms_per_req"] for r in res["rounds"]]
        # the collector's extra CPU per exported sample: a request stores rows x fields samples
        per = [1e3 * (r[m]["cpu_ms_per_req"] - r["off"]["cpu_ms_per_req"]) / res["samples_per_request"]
               for r in res["rounds"]]
        if xs:
            print(f"\nexport on ({m}): median ingest ratio {statistics.median(xs):.3f} "
                  f"({100 * (1 - statistics.median(xs)):.1f}% lost), median collector CPU per request on/off "
                  f"{statistics.median(cpu):.3f} ({statistics.median(per):+.3f} us per exported sample)")
    # The CPU split: throughput lost (above, the measure) also pays for the receiver on
    # the same cores, which a deployment runs elsewhere; per ingested field sample, what the
    # collector (its export threads apart) and PostgreSQL spend, export off and on, and the
    # receiver's own CPU beside them.
    print("\nCPU per ingested field sample (us; a run exports every sample it stores): collector (of it the "
          "export threads) + PostgreSQL = gpufleet's; the receiver apart\n")
    print("| round | mode | collector | export threads (encoder / sender) | PostgreSQL | collector + PostgreSQL "
          "| receiver |")
    print("|---|---|---|---|---|---|---|")

    def gf(x: dict[str, Any]) -> float:
        u = x["us_per_sample"]
        return float(u["collector"] + (u["postgres"] or 0.0))

    for i, r in enumerate(res["rounds"], 1):
        for m in ["off", *receivers]:
            u = r[m]["us_per_sample"]
            pg = f"{u['postgres']:.3f}" if u["postgres"] is not None else "?"
            split = f" ({u.get('export-enc', 0):.3f} / {u.get('export-send', 0):.3f})" if u["export_threads"] else ""
            print(f"| {i} | {m} | {u['collector']:.3f} | {u['export_threads']:.3f}{split} | {pg} | {gf(r[m]):.3f} | "
                  f"{u['receiver']:.3f} |")
    for m in receivers:
        med = statistics.median
        off = med([gf(r["off"]) for r in res["rounds"]])
        on = med([gf(r[m]) for r in res["rounds"]])
        xt = med([r[m]["us_per_sample"]["export_threads"] for r in res["rounds"]])
        rx = med([r[m]["us_per_sample"]["receiver"] for r in res["rounds"]])
        print(f"\nexport on ({m}), medians per ingested field sample: collector + PostgreSQL {off:.3f} off -> "
              f"{on:.3f} us on ({on - off:+.3f} us, {100 * (on - off) / on:.1f}% of the CPU on; export threads "
              f"{xt:.3f} us), receiver {rx:.3f} us on the same cores")
    for m in receivers:
        short = [(i, r[m]["offered_samples"] - (r[m]["arrived_samples"] or 0)) for i, r in enumerate(res["rounds"], 1)
                 if (r[m]["arrived_samples"] or 0) < r[m]["offered_samples"]]
        print(f"- {m}: every offered sample arrived in every round" if not short else
              f"- {m}: MISSING at the receiver (round, samples): {short}")
    last = res["rounds"][-1]
    for m in ["off", *receivers]:
        x = last[m]
        print(f"- {m}: p50 {x['p50_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms, drained in {x['drain_s']} s")


# --- in-process: the export path alone -----------------------------------------------------

def micro_child(args: Any) -> None:
    """One measurement, printed as JSON: CPU of this process per exported sample while an
    Exporter encodes and sends the bench's batches, offered one group commit at a time."""
    from gpufleet.collector.columns import prepare
    from gpufleet.collector.export.exporter import Exporter, ExportSettings

    tpl = _ib.Templates(args.conns, time.time(), windows=6)
    preps = [prepare(b) for b in tpl.batches]
    group = args.group
    commits = [preps[i:i + group] for i in range(0, len(preps), group)]
    q = Path(tempfile.mkdtemp(prefix="xq-", dir=args.tmp))
    ex = Exporter(ExportSettings(url=f"http://127.0.0.1:{args.sink_port}/api/v1/write", flush_s=args.flush_s), q)
    ex.start()
    want = sum(p.n for p in preps) * len(ex.encoder.fields)
    out = []
    for k in range(args.inner + 1):  # pass 0 warms the label cache, as a running collector's is
        sent0, bodies0 = ex.sent_samples, ex.sent_bodies
        t0, c0 = time.perf_counter(), time.process_time()
        for c in commits:  # the writer's pace: a commit every few ms, the encoder batching what piled up
            ex.offer(c)
            time.sleep(args.commit_gap_s)
        while ex.sent_samples - sent0 < want and time.perf_counter() - t0 < 120:
            time.sleep(0.02)
        cpu = time.process_time() - c0
        if k:
            out.append({"us_per_sample": 1e6 * cpu / want, "samples": want, "sent": ex.sent_samples - sent0,
                        "bodies": ex.sent_bodies - bodies0})
    ex.stop()
    print("MICRO " + json.dumps(out))


def main_micro(args: Any) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-exportmicro-"))
    trees = [("new", args.tree)] + ([("ref", args.ref)] if args.ref else [])
    got: dict[str, list[float]] = {n: [] for n, _ in trees}
    load0 = loadavg()
    with sink(tmp, args.decode_every) as port:
        for k in range(args.repeat):
            for name, tree in (trees if k % 2 == 0 else trees[::-1]):  # A/B interleaved
                env = {**os.environ, "PYTHONPATH": str(tree) if tree else str(HERE.parents[1])}
                cmd = [PY, str(Path(__file__).resolve()), "--micro-child", "--sink-port", str(port), "--tmp", str(tmp),
                       "--conns", str(args.conns), "--group", str(args.group), "--inner", str(args.inner)]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                line = [x for x in p.stdout.splitlines() if x.startswith("MICRO ")]
                if not line:
                    raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
                runs = json.loads(line[0][6:])
                got[name] += [x["us_per_sample"] for x in runs]
                assert all(x["sent"] == x["samples"] for x in runs), runs
        st = sink_stats(port)
    print(f"\n## export path in-process ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average "
          f"{load0} -> {loadavg()}, {args.repeat} x {args.inner} runs, {args.conns * 6} batches of 80 rows x every "
          f"field, {args.group} batches per commit)\n")
    for name, xs in got.items():
        print(f"- {name}: CPU per exported sample min {min(xs):.4f} us, median {statistics.median(xs):.4f} us")
    if args.ref:
        print(f"- ref / new (min): {min(got['ref']) / min(got['new']):.2f}x")
    print(f"- sink: {st['bodies']} bodies, {st['samples']:,} samples, {st['decoded_bodies']} decoded, {st['bad']} "
          "undecodable or miscounted")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (ingest) / A-B pairs (--micro)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per measured ingest run")
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--conns", type=int, default=500,
                    help="wrk connections (many: group commits as large as a busy fleet makes them)")
    ap.add_argument("--nodes", type=int, default=400,
                    help="simulated nodes (8 GPUs each): few enough that each GPU sends many batches in a run, as in "
                    "production (the exporter caches per-GPU layouts; 1,000 nodes seen 3 times each is its cold path)")
    ap.add_argument("--windows", type=int, default=64,
                    help="10 s batches per node: nodes x windows distinct bodies, more than a run posts")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--receivers", default="sink,vm", help="comma list of sink, vm")
    ap.add_argument("--decode-every", type=int, default=0,
                    help="the sink also decodes one body in N with wire.decode, checking its count (0: never; "
                         "that decoder's ~2 us per sample would be the sink's largest cost)")
    ap.add_argument("--pg-admin", default=os.environ.get("GPUFLEET_BENCH_PG", "tuned"),
                    help="tuned (bench/pg_instance.py, the default), existing (the service) or a URL")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--profile", type=Path, default=None,
                    help="py-spy --gil raw stacks of each server process for every measured run, into this folder")
    ap.add_argument("--micro", action="store_true", help="the export path alone, in-process (see above)")
    ap.add_argument("--ref", type=Path, default=None,
                    help="an older tree importable as gpufleet: --micro runs its exporter, the ingest rounds its "
                         "collector too (modes <receiver>@ref)")
    ap.add_argument("--tree", type=Path, default=None,
                    help="the tree (importable as gpufleet) measured as new: the ingest rounds' collector "
                         "(plain modes), --micro's exporter; default the checkout (and whatever else is "
                         "uncommitted in it)")
    ap.add_argument("--drain-s", type=float, default=120.0, help="most seconds to wait for every sample to arrive")
    ap.add_argument("--group", type=int, default=4, help="--micro: batches per group commit")
    ap.add_argument("--inner", type=int, default=3, help="--micro: runs per child process")
    ap.add_argument("--serve-sink", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--micro-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sink-port", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--flush-s", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--commit-gap-s", type=float, default=0.01, help="--micro: seconds between commits")
    args = ap.parse_args()
    if args.serve_sink:
        serve_sink(args.serve_sink, args.decode_every)
        return 0
    if args.micro_child:
        micro_child(args)
        return 0
    return main_micro(args) if args.micro else main_ingest(args)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
