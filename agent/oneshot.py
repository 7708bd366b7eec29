"""``gpufleet agent --once [--print]``: one sample, as a table, as JSON, or sent once."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from gpufleet.catalog import CATALOG

from .config import AgentConfig
from .runner import Agent, Sample
from .sources.base import Source

# Rates (GPM, counters turned into bytes/s) need two reads; this is the gap between them.
PRIME_GAP_S = 0.25


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value * 100:.1f}%"
    if unit in ("bytes", "bytes/s"):
        for div, suffix in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
            if abs(value) >= div:
                return f"{value / div:.1f}{suffix}"
        return f"{value:.0f}"
    if unit == "bitmask":
        return hex(int(value))
    if unit == "J" and abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if float(value).is_integer():
        return f"{int(value)}"
    return f"{value:.1f}"


def format_table(node: str, s: Sample, out: TextIO) -> None:
    """Fields down, GPUs across: 8 GPUs fit an 120-column terminal, 30 fields do not."""
    info = {d.uuid: d for d in s.devices}
    cols = []
    for r in s.readings:
        d = info.get(r.uuid)
        label = "?" if d is None else str(d.index) + (f"/{d.mig_profile}" if d.mig_profile else "")
        cols.append((label, r))
    present = [f for f in CATALOG.fields if any(f.name in r.values for _, r in cols)]
    header = ["field (unit)"] + [c[0] for c in cols]
    lines = [header, ["job"] + [s.attribution.gpu_job.get(r.uuid, "-") for _, r in cols]]
    for f in present:
        lines.append([f"{f.name} ({f.unit})"] + [_fmt(r.values.get(f.name), f.unit) for _, r in cols])
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
    out.write(f"node {node}: {len(cols)} GPUs at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s.ts))}\n")
    for label, r in cols:
        d = info.get(r.uuid)
        out.write(f"  {label:>4}  {r.uuid}  {d.model if d else ''}\n")
    out.write("\n")
    for i, row in enumerate(lines):
        out.write("  ".join(str(c).ljust(w) if j == 0 else str(c).rjust(w) for j, (c, w) in
                            enumerate(zip(row, widths, strict=True))).rstrip() + "\n")
        if i == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
    for job_id, j in s.attribution.jobs.items():
        out.write(f"job {job_id}: source={j.source} user={j.user or '-'} name={j.name or '-'}"
                  f" account={j.account or '-'} partition={j.partition or '-'}\n")
    for e in s.events:
        out.write(f"event {e.kind} gpu={e.gpu_uuid} code={e.code} {e.message}\n")


def as_dict(node: str, s: Sample) -> dict[str, object]:
    return {"node": node, "ts": s.ts,
            "gpus": [{"uuid": r.uuid, "job": s.attribution.gpu_job.get(r.uuid), "values": r.values}
                     for r in s.readings],
            "jobs": {k: {"source": v.source, "user": v.user, "name": v.name} for k, v in s.attribution.jobs.items()},
            "events": [{"kind": e.kind, "gpu": e.gpu_uuid, "code": e.code} for e in s.events]}


def sample_once(cfg: AgentConfig, sources: list[tuple[str, Source]], *, print_: bool, as_json: bool = False,
                out: TextIO | None = None) -> int:
    """Returns the exit status: 1 when any node's batch was not stored (refused with 401/403/409,
    dead-lettered, or the collector did not answer in time), so `--once` is a node bring-up check."""
    out = out or sys.stdout
    dumps = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-once-") as tmp:
        for node, source in sources:
            # Printing must not leave anything in (or need write access to) the real spool.
            spool = Path(tmp) / node if print_ else (cfg.spool_dir / node if len(sources) > 1 else cfg.spool_dir)
            agent = Agent(replace(cfg, node=node, spool_dir=spool), source)
            try:
                agent.sample(time.time())  # primes rates and GPM
                time.sleep(PRIME_GAP_S)
                if print_:
                    s = agent.sample(time.time())
                    if as_json:
                        dumps.append(as_dict(node, s))
                    else:
                        format_table(node, s, out)
                else:
                    agent.start()
                    agent.cycle(time.time())
                    agent.flush()
                    sent = agent.sender.drain(cfg.timeout_s)
                    left, dead = len(agent.spool), agent.sender.dead_lettered
                    out.write(f"node {node}: sent {sent} batch(es); {left} left in {agent.spool.dir}"
                              + (f"; {dead} refused for good (in {agent.spool.dead_dir})" if dead else "") + "\n")
                    if left or dead:
                        failed.append(node)
            finally:
                agent.journal.close()
                agent.spool.unlock()
                agent.sender.close()
                source.close()
    if as_json:
        out.write(json.dumps(dumps if len(dumps) != 1 else dumps[0], indent=2) + "\n")
    if failed:
        sys.stderr.write(f"not stored at {cfg.collector_url}: {', '.join(failed)} (the log above says why)\n")
        return 1
    return 0
