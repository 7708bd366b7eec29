"""Raw sample layouts side by side on realistic telemetry: bytes per GPU-sample after VACUUM
(pg_total_relation_size: heap, TOAST and indexes) and write/read cost, in one run.

Layouts (each a plain table shaped like one daily partition, with its indexes):
- ``wide``: the old ``gpu_samples`` (a row per GPU-second, 30 columns; (job_pk, ts) b-tree
  and BRIN on ts), written with the binary COPY encoder it had;
- ``blocks-W-lz4``: ``gpu_sample_blocks`` as the write path stores it (storage/raw_samples.py +
  storage/sample_codec.py, LZ4), one row per GPU per write of W seconds ((gpu_pk, t0) and
  (job_pk, t0) b-trees); W = 10 is what a group commit writes at today's 10-s agent batches;
  ``blocks-600-zstd`` is what compaction leaves once a window closed (storage/raw_compact.py);
- ``arrays-W``: one row per GPU per W seconds with a float8[] of timestamps and one
  real[]/float8[]/int8[] per field (NULL elements = absent), ``COMPRESSION lz4`` on every
  array column (PostgreSQL's TOAST compression; it applies once a row passes ~2 kB).

Data (``realistic``): per GPU a job with busy and idle phases; DCGM ratios busy level + noise
at full float32 precision; NVML utilisation in whole percent; power at mW resolution with
noise; energy a counter that counts (mJ); temperature a random walk in whole degrees; clocks
mostly constant with throttle dips; PCIe/NVLink rates noisy; IB absent on half the GPUs
(NaN); error counters that rarely count; fp64 mostly 0.

Timings interleave the layouts chunk by chunk (the machine is shared: compare ratios).

    .venv/bin/python bench/ingest/raw_layouts.py --gpus 8 --hours 2
    .venv/bin/python bench/ingest/raw_layouts.py --quick     # 4 GPUs x 30 min
    .venv/bin/python bench/ingest/raw_layouts.py --encode-only  # encoder CPU per group commit
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from gpufleet.storage.copy_encoding import SAMPLE_COLUMNS, copy_buffer
from gpufleet.storage.fields import FIELD_INDEX, FIELDS, NAMES, NF
from gpufleet.storage.raw_samples import block_rows
from gpufleet.storage.sample_codec import LZ4, ZSTD, decode_blocks

T0 = 1_764_547_200.0  # a UTC midnight
_PG_TYPE = {"f4": "real", "f8": "double precision", "i8": "bigint"}


def realistic(rng: np.random.Generator, n: int, gpu: int) -> np.ndarray:
    """(NF, n) float64 values of one GPU at 1 Hz, NaN = absent."""
    v = np.full((NF, n), np.nan)
    busy = (np.arange(n) // 900 + gpu) % 5 != 0  # 15-min phases, one in five idle
    level = np.where(busy, rng.uniform(0.6, 0.9), 0.02)

    def put(name: str, x: np.ndarray) -> None:
        f = FIELDS[FIELD_INDEX[name]]
        x = np.clip(x, f.min, f.max)
        v[FIELD_INDEX[name]] = x.astype(np.float32) if f.dtype == "f4" else x

    for name, scale in (("gr_engine_active", 1.0), ("sm_active", 0.95), ("sm_occupancy", 0.5),
                        ("tensor_active", 0.6), ("dram_active", 0.4), ("fp32_active", 0.2), ("fp16_active", 0.5)):
        put(name, level * scale + rng.normal(0, 0.03, n) * busy)
    put("fp64_active", np.zeros(n))
    put("gpu_util", np.round(np.clip(level + rng.normal(0, 0.05, n), 0, 1) * 100) / 100)
    put("mem_copy_util", np.round(np.clip(level * 0.3 + rng.normal(0, 0.03, n), 0, 1) * 100) / 100)
    fb = 60 * 2**30 + np.cumsum(rng.random(n) < 0.002) * 256 * 2**20
    put("fb_used_bytes", np.where(busy, fb, 2**30).astype(np.float64))
    put("fb_total_bytes", np.full(n, 80.0 * 2**30))
    power = np.round(np.where(busy, 550.0, 90.0) + rng.normal(0, 15, n), 3)
    put("power_w", power)
    put("energy_j", np.round(1e7 + np.cumsum(power), 3))
    put("temp_c", np.round(np.clip(60 + np.cumsum(rng.choice([-1, 0, 0, 0, 1], n)) * 0.2, 30, 90)))
    throttle = rng.random(n) < 0.01
    put("sm_clock_mhz", np.where(throttle, 1755.0, np.where(busy, 1980.0, 210.0)))
    put("mem_clock_mhz", np.full(n, 2619.0))
    put("clock_event_reasons", np.where(throttle, 4.0, 0.0))
    for name, base in (("pcie_tx_bytes_s", 2e9), ("pcie_rx_bytes_s", 3e9), ("nvlink_tx_bytes_s", 4e10),
                       ("nvlink_rx_bytes_s", 4e10)):
        put(name, np.round(np.abs(base * level + rng.normal(0, base * 0.05, n)) / 1024) * 1024)
    if gpu % 2 == 0:
        for name in ("ib_tx_bytes_s", "ib_rx_bytes_s"):
            put(name, np.round(np.abs(2.5e10 * level + rng.normal(0, 1e9, n))))
    put("xid_last", np.zeros(n))
    put("ecc_dbe_volatile", np.zeros(n))
    put("ecc_sbe_volatile", np.cumsum(rng.random(n) < 1e-4).astype(np.float64))
    put("row_remap_failure", np.zeros(n))
    put("nvlink_error_count", np.cumsum(rng.random(n) < 1e-3).astype(np.float64))
    put("pcie_replay_count", np.cumsum(rng.random(n) < 1e-3).astype(np.float64))
    return v


class Layout:
    name: str

    def create(self, c: psycopg.Connection[Any]) -> None: ...

    def write(self, c: psycopg.Connection[Any], ts: np.ndarray, gpu: np.ndarray, job: np.ndarray,
              vals: np.ndarray) -> None: ...

    def read(self, c: psycopg.Connection[Any]) -> int: ...


class Wide(Layout):
    name = "wide"

    def create(self, c: psycopg.Connection[Any]) -> None:
        cols = ", ".join(f"{f.name} {_PG_TYPE[f.dtype]}" for f in FIELDS)
        c.execute(f"CREATE TABLE l_wide (ts double precision NOT NULL, gpu_pk int NOT NULL, job_pk int, {cols})")
        c.execute("CREATE INDEX ON l_wide (job_pk, ts)")
        c.execute("CREATE INDEX ON l_wide USING brin (ts)")

    def write(self, c: psycopg.Connection[Any], ts: np.ndarray, gpu: np.ndarray, job: np.ndarray,
              vals: np.ndarray) -> None:
        with c.cursor() as cur, cur.copy(f"COPY l_wide ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN (FORMAT binary)") as cp:
            cp.write(copy_buffer(ts, gpu, job, vals))

    def read(self, c: psycopg.Connection[Any]) -> int:
        with c.cursor(binary=True) as cur:
            cur.execute(f"SELECT ts, gpu_pk, {', '.join(NAMES)} FROM l_wide ORDER BY gpu_pk, ts")
            rows = cur.fetchall()
        a = np.array(rows, dtype=np.float64)  # None -> NaN
        return len(a)


class Blocks(Layout):
    def __init__(self, window: int, codec: int = LZ4) -> None:
        self.window = window
        self.codec = codec
        self.name = f"blocks-{window}-{'zstd' if codec == ZSTD else 'lz4'}"
        self.table = f"l_blocks_{window}_{codec}"

    def create(self, c: psycopg.Connection[Any]) -> None:
        c.execute(f"CREATE TABLE {self.table} (gpu_pk int NOT NULL, job_pk int, t0 double precision NOT NULL, "
                  "t1 double precision NOT NULL, n int NOT NULL, data bytea NOT NULL)")
        c.execute(f"CREATE INDEX ON {self.table} (gpu_pk, t0)")
        c.execute(f"CREATE INDEX ON {self.table} (job_pk, t0)")

    def write(self, c: psycopg.Connection[Any], ts: np.ndarray, gpu: np.ndarray, job: np.ndarray,
              vals: np.ndarray) -> None:
        # one write per `window` seconds: the product's block builder on each write's rows
        win = np.floor((ts - T0) / self.window)
        bounds = np.flatnonzero(np.r_[True, win[1:] != win[:-1], True])
        with c.cursor() as cur, cur.copy(f"COPY {self.table} FROM STDIN (FORMAT binary)") as cp:
            cp.set_types(["int4", "int4", "float8", "float8", "int4", "bytea"])
            for lo, hi in itertools.pairwise(bounds):
                for r in block_rows(ts[lo:hi], gpu[lo:hi], job[lo:hi], vals[:, lo:hi], codec=self.codec):
                    cp.write_row(r)

    def read(self, c: psycopg.Connection[Any]) -> int:
        rows = c.execute(f"SELECT gpu_pk, job_pk, data FROM {self.table} ORDER BY gpu_pk, t0").fetchall()
        ts, _, _ = decode_blocks([bytes(r[2]) for r in rows])
        return len(ts)


class Arrays(Layout):
    def __init__(self, window: int) -> None:
        self.window = window
        self.name = f"arrays-{window}"
        self.table = f"l_arrays_{window}"

    def create(self, c: psycopg.Connection[Any]) -> None:
        cols = ", ".join(f"{f.name} {_PG_TYPE[f.dtype]}[] COMPRESSION lz4" for f in FIELDS)
        c.execute(f"CREATE TABLE {self.table} (gpu_pk int NOT NULL, job_pk int, t0 double precision NOT NULL, "
                  f"t1 double precision NOT NULL, ts double precision[] COMPRESSION lz4, {cols})")
        c.execute(f"CREATE INDEX ON {self.table} (gpu_pk, t0)")
        c.execute(f"CREATE INDEX ON {self.table} (job_pk, t0)")

    def write(self, c: psycopg.Connection[Any], ts: np.ndarray, gpu: np.ndarray, job: np.ndarray,
              vals: np.ndarray) -> None:
        win = np.floor((ts - T0) / self.window)
        order = np.lexsort((ts, win, gpu))
        g, w = gpu[order], win[order]
        starts = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (w[1:] != w[:-1])])
        ends = np.r_[starts[1:], len(order)]
        is_int = [f.dtype == "i8" for f in FIELDS]
        with c.cursor() as cur, cur.copy(f"COPY {self.table} FROM STDIN") as cp:
            for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
                idx = order[lo:hi]
                row: list[Any] = [int(gpu[idx[0]]), None if job[idx[0]] < 0 else int(job[idx[0]]),
                                  float(ts[idx[0]]), float(ts[idx[-1]]), ts[idx].tolist()]
                for j in range(NF):
                    x = vals[j, idx]
                    row.append([None if y != y else (int(y) if is_int[j] else y) for y in x.tolist()])
                cp.write_row(row)

    def read(self, c: psycopg.Connection[Any]) -> int:
        with c.cursor(binary=True) as cur:
            cur.execute(f"SELECT ts, {', '.join(NAMES)} FROM {self.table} ORDER BY gpu_pk, t0")
            n = 0
            for r in cur.fetchall():
                np.array(r[1:], dtype=np.float64)
                n += len(r[0])
        return n


def encode_cost(gpus: int, reps: int) -> dict[str, float]:
    """Encoder CPU of one group commit (``gpus`` GPUs x 10 s, rows in arrival order): the wide
    layout's COPY buffer against the blocks (``block_rows``: grouping, encoding, zstd),
    interleaved rep by rep; per GPU-sample, medians."""
    rng = np.random.default_rng(5)
    per = [realistic(rng, 10, g) for g in range(gpus)]
    ts = np.tile(T0 + np.arange(10, dtype=np.float64), gpus)
    gpu = np.repeat(np.arange(1, gpus + 1), 10)
    job = np.where(gpu % 3 == 0, -1, 1 + gpu // 64)
    vals = np.concatenate(per, axis=1)
    order = np.lexsort((gpu, ts))
    ts, gpu, job, vals = ts[order], gpu[order], job[order], vals[:, order]
    wide, blocks = [], []
    for _ in range(reps):
        t = time.perf_counter()
        copy_buffer(ts, gpu, job, vals)
        wide.append(time.perf_counter() - t)
        t = time.perf_counter()
        block_rows(ts, gpu, job, vals)
        blocks.append(time.perf_counter() - t)
    n = len(ts)
    w, b = float(np.median(wide)) / n * 1e6, float(np.median(blocks)) / n * 1e6
    return {"gpus": gpus, "rows": n, "wide_copy_us_per_gpu_sample": w, "blocks_us_per_gpu_sample": b, "ratio": b / w}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--admin", default=os.environ.get("GPUFLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--quick", action="store_true", help="4 GPUs x 30 min")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--encode-only", action="store_true", help="only the encoder cost of a group commit")
    args = ap.parse_args()
    if args.quick:
        args.gpus, args.hours = 4, 0.5
    enc = [encode_cost(g, 15 if args.quick else 40) for g in (64, 1000)]
    print("| group commit | rows | wide COPY buffer us/GPU-sample | blocks us/GPU-sample | ratio |")
    print("|---|---|---|---|---|")
    for r in enc:
        print(f"| {r['gpus']} GPUs x 10 s | {r['rows']} | {r['wide_copy_us_per_gpu_sample']:.2f} "
              f"| {r['blocks_us_per_gpu_sample']:.2f} | {r['ratio']:.2f}x |")
    if args.encode_only:
        return 0
    db = f"bench_raw_layouts_{os.getpid()}"
    with psycopg.connect(args.admin, autocommit=True) as a:
        a.execute(f'CREATE DATABASE "{db}"')
    url = args.admin.rsplit("/", 1)[0] + "/" + db
    # blocks-600-zstd is what compaction (storage/raw_compact.py) leaves: the same rows encoded alike
    layouts: list[Layout] = [Wide(), Blocks(10), Blocks(60), Blocks(600), Blocks(600, ZSTD), Arrays(10), Arrays(600)]
    write_s = dict.fromkeys((lay.name for lay in layouts), 0.0)
    try:
        with psycopg.connect(url, autocommit=True) as c:
            for lay in layouts:
                lay.create(c)
            secs = int(args.hours * 3600)
            rngs = [np.random.default_rng(g) for g in range(args.gpus)]
            per_gpu = [realistic(rngs[g], secs, g) for g in range(args.gpus)]
            chunk = 600  # 10 minutes of the fleet at a time, every layout in turn
            for s0 in range(0, secs, chunk):
                m = min(chunk, secs - s0)
                ts = np.tile(T0 + s0 + np.arange(m, dtype=np.float64), args.gpus)
                gpu = np.repeat(np.arange(1, args.gpus + 1), m)
                job = np.where(gpu <= max(1, args.gpus // 2), 1, 2)
                vals = np.concatenate([p[:, s0:s0 + m] for p in per_gpu], axis=1)
                order = np.lexsort((gpu, ts))  # arrival order: time, then GPU
                ts, gpu, job, vals = ts[order], gpu[order], job[order], vals[:, order]
                for lay in layouts:
                    t = time.perf_counter()
                    with c.transaction():
                        lay.write(c, ts, gpu, job, vals)
                    write_s[lay.name] += time.perf_counter() - t
            c.execute("VACUUM ANALYZE")
            n = secs * args.gpus
            out: dict[str, Any] = {"gpus": args.gpus, "hours": args.hours, "gpu_samples": n, "layouts": {},
                                   "encode": enc}
            for lay in layouts:
                table = {"wide": "l_wide"}.get(lay.name, getattr(lay, "table", ""))
                size = int(c.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0])  # type: ignore[index]
                reads: list[float] = []
                for _ in range(3):
                    t = time.perf_counter()
                    got = lay.read(c)
                    reads.append(time.perf_counter() - t)
                assert got == n, (lay.name, got, n)
                out["layouts"][lay.name] = {"bytes": size, "bytes_per_gpu_sample": size / n,
                                            "bytes_per_field_sample": size / n / NF,
                                            "write_us_per_gpu_sample": write_s[lay.name] / n * 1e6,
                                            "read_us_per_gpu_sample": float(np.median(reads)) / n * 1e6}
    finally:
        with psycopg.connect(args.admin, autocommit=True) as a:
            a.execute(f'DROP DATABASE IF EXISTS "{db}"')
    ref = out["layouts"]["wide"]
    print(f"{args.gpus} GPUs x {args.hours} h at 1 Hz = {n} GPU-samples x {NF} fields")
    print("| layout | B per GPU-sample | B per field-sample | vs wide | write us/GPU-sample | vs wide "
          "| read us/GPU-sample | vs wide |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in out["layouts"].items():
        print(f"| {name} | {r['bytes_per_gpu_sample']:.1f} | {r['bytes_per_field_sample']:.2f} "
              f"| {r['bytes'] / ref['bytes']:.3f}x | {r['write_us_per_gpu_sample']:.2f} "
              f"| {r['write_us_per_gpu_sample'] / ref['write_us_per_gpu_sample']:.2f}x "
              f"| {r['read_us_per_gpu_sample']:.2f} "
              f"| {r['read_us_per_gpu_sample'] / ref['read_us_per_gpu_sample']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
