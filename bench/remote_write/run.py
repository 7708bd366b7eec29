#!/usr/bin/env python
"""Remote-write benchmark, references measured side by side in the same run:

  1. receive: `wrk` posts the very same remote-write bodies (snappy protobuf, what a Prometheus
     shard sends after scraping dcgm-exporter: ~2,000 series x 1 sample, dcgm-exporter's
     labels) to gpufleet's POST /api/v1/write (`gpufleet serve --workers N` on PostgreSQL) and
     to VictoriaMetrics' /api/v1/write; reported as samples/s and their ratio (goal >= 1x);
  2. export cost: bench/ingest's protocol ingest (80-row batches, every catalog field) into
     gpufleet with export off, then with GPUFLEET_EXPORT_URL pointing at a VictoriaMetrics,
     interleaved over --repeat rounds; reported as the ingest rows/s ratio (goal: < 10% lost),
     and whether the export kept up (samples that reached VictoriaMetrics).

Run:  .venv/bin/python bench/remote_write/run.py [--quick] [--repeat N] [--pg existing]
PostgreSQL: by default a throwaway instance with production write settings (bench/pg_instance.py),
removed after the run; `--pg existing` uses --pg-admin's server (the old behaviour). Creates and
drops its own databases (gpufleet_bench_<pid>_*) there and its own VictoriaMetrics data
directories. Needs `wrk` and `victoria-metrics` (Debian packages).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
import zlib
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # after PYTHONPATH: an older tree put first there is the one measured
sys.path.append(str(REPO / "bench"))

def _ingest_bench() -> Any:
    # bench/ingest/run.py: the ingest bench's fixtures and process helpers (same file name as
    # this one, hence loaded by path)
    import importlib.util

    spec = importlib.util.spec_from_file_location("ingest_bench", REPO / "bench" / "ingest" / "run.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_ib = _ingest_bench()
PLACEHOLDER, Templates, collector, count_rows = _ib.PLACEHOLDER, _ib.Templates, _ib.collector, _ib.count_rows
locate_tools, log, run_wrk, session_cpu_s = _ib.locate_tools, _ib.log, _ib.run_wrk, _ib.session_cpu_s
throwaway_db, victoria = _ib.throwaway_db, _ib.victoria

from gpufleet.catalog import CATALOG  # noqa: E402
from gpufleet.collector.remote_write import wire  # noqa: E402

LUA = Path(__file__).resolve().parent / "post_snappy.lua"
DCGM_FIELDS = [f for f in CATALOG.fields if f.dcgm]
SAMPLES_PER_SEND = 2000  # Prometheus' max_samples_per_send default (2.42: 500; later 2000)


FB_TOTAL_MIB = 81_559.0  # an H100 80GB's DCGM_FI_DEV_FB_TOTAL: constant, as on a real GPU


def bodies_needed(samples_s: float, seconds: float, per_body: int = SAMPLES_PER_SEND) -> int:
    """Distinct bodies for ``seconds`` of posting at up to ``samples_s`` (10% spare)."""
    return int(samples_s * seconds * 1.1 / per_body) + 1


def remote_write_bodies(path: Path, nodes: int, windows: int, now: float, shards: int = 1) -> tuple[int, int, int]:
    """Bodies of ~SAMPLES_PER_SEND samples: window after window (15 s apart, the last one a
    minute ago), node after node, every GPU's dcgm-exporter series, as a shard sends them; a
    body boundary falls anywhere in a node's series. ``shards`` > 1: as Prometheus runs that
    many shards, each series goes to the shard its label set hashes to (crc32 here) and each
    shard cuts its own stream into bodies, so one GPU's fields at one scrape arrive in up to
    ``shards`` bodies (the bodies in the order the shards filled them). Returns (bodies,
    samples, bytes/body)."""
    start = int((now - 60 - windows * 15) * 1000)
    parts_of: list[list[bytes]] = [[] for _ in range(max(1, shards))]
    bodies = size = samples = 0
    # per series, in send order: TimeSeries tag + length + labels, and its value (a constant,
    # or 40..69 moving with the node, GPU and scrape)
    series: list[tuple[bytes, float | None, int, float]] = []
    for n in range(nodes):
        for g in range(8):
            uuid = f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'bench-{n}/{g}')}"
            for fld in DCGM_FIELDS:
                lab = wire.encode_labels([
                    ("__name__", fld.dcgm[0]), ("DCGM_FI_DRIVER_VERSION", "550.144.03"),
                    ("Hostname", f"bench-{n:05d}"), ("UUID", uuid), ("container", "trainer"),
                    ("device", f"nvidia{g}"), ("gpu", str(g)), ("instance", f"10.1.{n // 250}.{n % 250}:9400"),
                    ("job", "dcgm-exporter"), ("modelName", "NVIDIA H100 80GB HBM3"), ("namespace", "ml"),
                    ("pci_bus_id", f"00000000:{g:02X}:00.0"), ("pod", f"train-{n // 4}-{n % 4}")])
                h = bytearray(b"\x0a")
                # a sample's encoding has one length for every timestamp of the run
                wire.put_varint(h, len(lab) + len(wire.encode_sample(start, 1.0)))
                if fld.name == "fb_total_bytes":
                    series.append((bytes(h) + lab, FB_TOTAL_MIB, 0, 1.0))
                elif fld.unit == "ratio":
                    series.append((bytes(h) + lab, min(fld.max, 0.5) / fld.dcgm_scale, 0, 1.0))
                else:  # in dcgm-exporter's unit (MiB for the framebuffer)
                    div = 1.0 if fld.unit == "bytes" else (fld.dcgm_scale or 1.0)
                    series.append((bytes(h) + lab, None, n + g, div))
    shard_of = [zlib.crc32(head) % len(parts_of) for head, _, _, _ in series]
    with path.open("wb") as f:

        def flush(parts: list[bytes]) -> None:
            nonlocal bodies, size, samples
            body = wire.snappy(b"".join(parts))
            f.write(b"%010d" % len(body) + body)
            bodies += 1
            size += len(body)
            samples += len(parts)
            parts.clear()

        for w in range(windows):
            ts = start + w * 15_000
            enc: dict[float, bytes] = {}
            for (head, const, ng, div), k in zip(series, shard_of, strict=True):
                v = const if const is not None else (40.0 + (ng + w) % 30) / div
                sample = enc.get(v)
                if sample is None:
                    sample = enc[v] = wire.encode_sample(ts, v)
                parts = parts_of[k]
                parts.append(head + sample)
                if len(parts) >= SAMPLES_PER_SEND:
                    flush(parts)
        for parts in parts_of:
            if parts:
                flush(parts)
    return bodies, samples, size // max(bodies, 1)


def ratio(a: float, b: float) -> float:
    """a / b; NaN when b is 0 (no request of the reference completed: a loaded box, not a result)."""
    return a / b if b else float("nan")


def wrk_rw(wrk: str, port: int, bodies: Path, *, conns: int, seconds: float, threads: int,
           offset: int = 0) -> dict[str, Any]:
    """Bodies dealt from ``offset`` on (post_snappy.lua); the answer's ``last`` is where the
    next run should start so that it repeats none of this run's bodies."""
    args = [wrk, f"-t{threads}", f"-c{conns}", f"-d{seconds:.0f}s", "--timeout", "30s", "-s", str(LUA),
            f"http://127.0.0.1:{port}", "--", str(bodies), "/api/v1/write", "application/x-protobuf",
            str(offset), str(threads)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
    for line in out.stdout.splitlines():
        if line.startswith("WRKJSON "):
            return json.loads(line[8:])
    raise RuntimeError(f"wrk said: {out.stdout[-2000:]} {out.stderr[-2000:]}")


def receive(name: str, port: int, tools: dict[str, Any], bodies: Path, per_body: float, args: Any,
            sid: int | None = None) -> dict[str, Any]:
    log(f"{name}: warm-up")
    w0 = wrk_rw(tools["wrk"], port, bodies, conns=args.conns, seconds=args.warmup, threads=args.wrk_threads)
    _ib.settle(name)
    log(f"{name}: measuring {args.duration:.0f} s with {args.conns} connections")
    cpu0 = session_cpu_s(sid) if sid else 0.0
    w = wrk_rw(tools["wrk"], port, bodies, conns=args.conns, seconds=args.duration, threads=args.wrk_threads,
               offset=int(w0["last"]))
    cpu = session_cpu_s(sid) - cpu0 if sid else None
    ok = sum(int(v) for k, v in w["status"].items() if k.startswith("2"))
    elapsed = w["duration_us"] / 1e6
    return {"name": name, "requests_ok": ok, "status": w["status"], "bodies_posted": int(w["last"]),
            "distinct_bodies": int(w["bodies"]), "samples_s": ok * per_body / elapsed,
            "p50_ms": w["p50_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3,
            "cpu_ms_per_req": (1e3 * cpu / max(ok, 1)) if cpu is not None else None}


def vm_samples(port: int) -> int:
    r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                  params={"query": 'sum(count_over_time({__name__=~"gpufleet_.*"}[1d]))'}, timeout=60)
    res = r.json()["data"]["result"]
    return int(float(res[0]["value"][1])) if res else 0


def ingest(name: str, url: str, tools: dict[str, Any], proto: Path, tpl: Templates, args: Any, tmp: Path,
           export_port: int | None) -> dict[str, Any]:
    from gpufleet.storage.migrate import upgrade

    upgrade(url)
    saved = {k: os.environ.get(k) for k in ("GPUFLEET_EXPORT_URL", "GPUFLEET_EXPORT_QUEUE_DIR")}
    if export_port:
        os.environ["GPUFLEET_EXPORT_URL"] = f"http://127.0.0.1:{export_port}/api/v1/write"
        os.environ["GPUFLEET_EXPORT_QUEUE_DIR"] = str(Path(tempfile.mkdtemp(prefix="xq-", dir=tmp)))
    try:
        with collector(url, args.workers, tmp) as (port, sid):
            log(f"{name}: warm-up")
            w0 = run_wrk(tools["wrk"], port, proto, "/api/v1/ingest", "application/msgpack", conns=args.conns,
                         seconds=args.warmup, threads=args.wrk_threads, placeholder=PLACEHOLDER)
            log(f"{name}: measuring {args.duration:.0f} s")
            cpu0 = session_cpu_s(sid)
            w = run_wrk(tools["wrk"], port, proto, "/api/v1/ingest", "application/msgpack", conns=args.conns,
                        seconds=args.duration, threads=args.wrk_threads, placeholder=PLACEHOLDER)
            cpu = session_cpu_s(sid) - cpu0
            time.sleep(3.0)
            stored = count_rows(url)
            # every request's key is distinct: each 200 is a newly stored batch (warm-up included)
            acked = (int(w0["status"].get("200", 0)) + int(w["status"].get("200", 0))) * tpl.rows_per_batch
            exported = None
            if export_port:
                deadline = time.time() + 90  # let the queue drain, then count what arrived
                want = acked * len(CATALOG.names)
                while time.time() < deadline and (exported := vm_samples(export_port)) < want * 0.98:
                    time.sleep(2)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ok = int(w["status"].get("200", 0))
    elapsed = w["duration_us"] / 1e6
    return {"name": name, "requests_ok": ok, "rows_s": ok * tpl.rows_per_batch / elapsed, "db_rows": stored,
            "p50_ms": w["p50_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3,
            "collector_cpu_ms_per_req": 1e3 * cpu / max(ok, 1),
            "exported_samples": exported, "stored_field_samples": acked * len(CATALOG.names)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", type=int, default=100,
                    help="simulated GPU nodes (8 GPUs each) in the remote-write bodies (100: 22,400 series)")
    ap.add_argument("--max-samples-s", type=float, default=1_000_000,
                    help="the fastest receive rate the bodies must cover without a repeat: distinct bodies = this x "
                         "(warm-up + duration) / 2000, i.e. that many scrapes (15 s apart) of every node; the "
                         "series repeat from scrape to scrape, as from a real Prometheus, so the receiver's series "
                         "cache is warm after the warm-up")
    ap.add_argument("--conns", type=int, default=64, help="concurrent connections (remote-write shards / agents)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per measured run (default 20, quick 8)")
    ap.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (default 4, quick 2)")
    ap.add_argument("--workers", type=int, default=2, help="gpufleet serve processes")
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds; ratios reported per round and median")
    ap.add_argument("--skip", action="append", default=[], choices=["receive", "export"])
    ap.add_argument("--pg", default="tuned",
                    help="tuned (default: a throwaway instance with production write settings, bench/pg_instance.py), "
                         "existing (--pg-admin's server) or a postgresql:// admin URL")
    ap.add_argument("--pg-admin", default=os.environ.get("GPUFLEET_BENCH_PG", _ib.pg_instance.DEFAULT_EXISTING),
                    help="the server --pg existing means (default $GPUFLEET_BENCH_PG, else the local service)")
    ap.add_argument("--shards", type=int, default=1,
                    help="the bodies as this many Prometheus shards send them (series hashed to shards; a GPU's "
                         "row then arrives in pieces); 1: one shard's ordered stream")
    ap.add_argument("--vm-conns", default="16,64,256",
                    help="VictoriaMetrics' connection counts for receive, each measured, its best the reference")
    ap.add_argument("--gf-conns", default=None,
                    help="gpufleet's connection counts for receive, each measured on a fresh database, its best "
                         "reported (default: --conns alone, the shards one Prometheus runs)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.vm_conns = _ib.conns_list(ap, args.vm_conns)
    args.gf_conns = _ib.conns_list(ap, args.gf_conns) if args.gf_conns else [args.conns]
    args.duration = args.duration or (8.0 if args.quick else 20.0)
    args.warmup = args.warmup or (2.0 if args.quick else 4.0)
    tools = locate_tools()
    if not (tools["wrk"] and tools["victoria-metrics"]):
        log("needs wrk and victoria-metrics (apt-get install wrk victoria-metrics)")
        return 2
    # the server before anything is measured (a tuned instance starts here, removed at exit)
    admin = _ib.pg_instance.admin_url(args.pg, args.pg_admin)
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-rwbench-"))
    res: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                           "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "rounds": [], "pg_server": _ib.pg_instance.reported_settings(admin)}
    try:
        now = time.time()
        rw = tmp / "rw.bin"
        # enough distinct bodies that gpufleet never sees a repeat (a repeat would be a cheap duplicate)
        want = bodies_needed(args.max_samples_s, args.warmup + args.duration)
        windows = -(-want * SAMPLES_PER_SEND // (args.nodes * 8 * len(DCGM_FIELDS)))
        log(f"writing {want} remote-write bodies ({windows} scrapes of {args.nodes} nodes)")
        nb, ns, bsize = remote_write_bodies(rw, args.nodes, windows, now, shards=args.shards)
        per_body = ns / nb
        res["rw_bodies"] = {"bodies": nb, "samples_per_body": per_body, "bytes_per_body": bsize}
        tpl = Templates(args.conns, now, windows=6)
        proto = tmp / "proto.bin"
        tpl.write_protocol(proto)
        for k in range(args.repeat):
            r: dict[str, Any] = {}
            if "receive" not in args.skip:
                mine = []
                for conns in args.gf_conns:
                    with throwaway_db(admin, f"rw{k}c{conns}") as url:
                        from gpufleet.storage.migrate import upgrade

                        upgrade(url)
                        with collector(url, args.workers, tmp) as (port, sid):
                            mine.append(receive(f"gpufleet /api/v1/write ({args.workers} workers, PostgreSQL), "
                                                f"{conns} connections", port, tools, rw, per_body,
                                                argparse.Namespace(**{**vars(args), "conns": conns}), sid))
                            mine[-1]["conns"] = conns
                        if mine[-1]["bodies_posted"] > nb:
                            log(f"WARNING: gpufleet went through all {nb} bodies: later requests were duplicates "
                                "(raise --max-samples-s)")
                r["gpufleet"] = max(mine, key=lambda x: x["samples_s"])
                r["gpufleet"]["by_conns"] = {x["conns"]: x["samples_s"] for x in mine}
                # the reference at its strongest: each of --vm-conns on a fresh VictoriaMetrics,
                # the best kept (gpufleet keeps --conns, the shards a Prometheus would run)
                tries = []
                for conns in args.vm_conns:
                    with victoria(tools["victoria-metrics"], tmp) as vport:
                        tries.append(receive(f"VictoriaMetrics /api/v1/write, {conns} connections", vport, tools,
                                             rw, per_body, argparse.Namespace(**{**vars(args), "conns": conns})))
                        tries[-1]["conns"] = conns
                r["vm"] = max(tries, key=lambda x: x["samples_s"])
                r["vm"]["by_conns"] = {x["conns"]: x["samples_s"] for x in tries}
                r["receive_ratio"] = ratio(r["gpufleet"]["samples_s"], r["vm"]["samples_s"])
            if "export" not in args.skip:
                with throwaway_db(admin, f"off{k}") as url:
                    r["off"] = ingest("ingest, export off", url, tools, proto, tpl, args, tmp, None)
                with victoria(tools["victoria-metrics"], tmp) as vport, throwaway_db(admin, f"on{k}") as url:
                    r["on"] = ingest("ingest, export on (to VictoriaMetrics)", url, tools, proto, tpl, args, tmp,
                                     vport)
                r["export_ingest_ratio"] = ratio(r["on"]["rows_s"], r["off"]["rows_s"])
            res["rounds"].append(r)
            log(f"round {k + 1}: " + ", ".join(f"{x}={r[x]:.2f}" for x in ("receive_ratio", "export_ingest_ratio")
                                               if x in r))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


def report(res: dict[str, Any]) -> None:
    rounds = res["rounds"]
    print(f"\n## remote write ({res['started']}, {res['cpus']} CPUs, {res['args']['conns']} connections, "
          f"{res['args']['duration']:.0f} s runs, {len(rounds)} round(s))\n")
    st = res.get("pg_server") or {}
    print("PostgreSQL: " + ", ".join(f"{k} {st[k]}" for k in ("server_version", "shared_buffers", "max_wal_size",
                                                               "checkpoint_timeout", "wal_compression") if k in st)
          + "\n")
    b = res["rw_bodies"]
    print(f"remote-write bodies: {b['bodies']} distinct, {b['samples_per_body']:.0f} samples, "
          f"{b['bytes_per_body']} B snappy each, as {res['args'].get('shards', 1)} shard(s) send them\n")
    print("| round | gpufleet samples/s | VM samples/s | receive ratio | ingest rows/s export off | on | "
          "export ratio | exported / stored samples |")
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rounds, 1):
        g, v, off, on = r.get("gpufleet"), r.get("vm"), r.get("off"), r.get("on")
        print(f"| {i} | {g['samples_s']:,.0f} | {v['samples_s']:,.0f} | {r['receive_ratio']:.2f}x | "
              if g else f"| {i} | - | - | - | ", end="")
        if off and on:
            ex = on["exported_samples"]
            print(f"{off['rows_s']:,.0f} | {on['rows_s']:,.0f} | {r['export_ingest_ratio']:.2f} | "
                  f"{ex:,} / {on['stored_field_samples']:,} |")
        else:
            print("- | - | - | - |")
    for i, r in enumerate(rounds, 1):
        g = r.get("gpufleet") or {}
        if len(g.get("by_conns") or {}) > 1:
            print(f"round {i}, gpufleet receive by connections: "
                  + ", ".join(f"{c}: {x:,.0f} samples/s" for c, x in g["by_conns"].items())
                  + f" (reported: {g['conns']})")
    for i, r in enumerate(rounds, 1):
        v = r.get("vm") or {}
        if v.get("by_conns"):
            print(f"round {i}, VictoriaMetrics receive by connections: "
                  + ", ".join(f"{c}: {x:,.0f} samples/s" for c, x in v["by_conns"].items())
                  + f" (the reference: {v['conns']})")
    for key in ("receive_ratio", "export_ingest_ratio"):
        xs = [r[key] for r in rounds if key in r and r[key] == r[key]]  # NaN rounds left out
        if xs:
            print(f"\nmedian {key}: {statistics.median(xs):.2f}")
    for r in rounds[-1:]:
        for k in ("gpufleet", "vm", "off", "on"):
            if k in r:
                x = r[k]
                print(f"- {x['name']}: p50 {x['p50_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms"
                      + (f", collector CPU {x.get('cpu_ms_per_req') or x.get('collector_cpu_ms_per_req'):.2f} ms/req"
                         if (x.get('cpu_ms_per_req') or x.get('collector_cpu_ms_per_req')) else ""))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
