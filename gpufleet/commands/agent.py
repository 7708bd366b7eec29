"""`gpufleet agent`: sample this node's GPUs and push them to the collector.

Only the agent's light dependencies are imported, and only when the command runs, so it
works on a GPU node with nothing but ``pip install 'gpufleet[agent]'``.
Every flag has a GPUFLEET_* environment twin; precedence is flag > env > --config file.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent", help="run the per-node agent (NVML, dcgm-exporter or simulator -> collector)",
        description="Sample GPUs every --interval seconds, attribute them to jobs, and push batches to the "
                    "collector every --flush seconds through a durable on-disk spool. Every flag has an "
                    "environment twin (shown in brackets); flags beat env, env beats --config.",
    )
    a = p.add_argument
    a("--config", type=Path, metavar="FILE", default=os.environ.get("GPUFLEET_AGENT_CONFIG"),
      help="TOML file with agent settings (top level or [agent]) [GPUFLEET_AGENT_CONFIG]")
    a("--collector", dest="collector_url", metavar="URL", help="collector base URL [GPUFLEET_COLLECTOR_URL]")
    a("--token", help="bearer token for the collector [GPUFLEET_AGENT_TOKEN]")
    a("--node", help="node name (default: hostname) [GPUFLEET_NODE]")
    a("--cluster", help="cluster name (default: default) [GPUFLEET_CLUSTER]")
    a("--source", choices=["nvml", "dcgm-exporter", "simulator", "auto"],
      help="where readings come from (default auto: NVML when a GPU answers) [GPUFLEET_SOURCE]")
    a("--simulate", type=int, nargs="?", const=1, metavar="NODES",
      help="simulate NODES nodes (default 1) instead of real GPUs; implies --source simulator [GPUFLEET_SIMULATE]")
    a("--gpus-per-node", type=int, help="GPUs per simulated node (default 8) [GPUFLEET_GPUS_PER_NODE]")
    a("--dcgm-exporter-url", metavar="URL",
      help="dcgm-exporter /metrics URL (default http://localhost:9400/metrics) [GPUFLEET_DCGM_EXPORTER_URL]")
    a("--interval", dest="interval_s", type=float, metavar="S", help="sample period (default 1) [GPUFLEET_INTERVAL_S]")
    a("--flush", dest="flush_s", type=float, metavar="S", help="batch period (default 10) [GPUFLEET_FLUSH_S]")
    a("--spool-dir", type=Path, metavar="DIR", help="durable spool directory [GPUFLEET_SPOOL_DIR]")
    a("--spool-max-bytes", type=int, metavar="N", help="spool size bound (default 1 GiB) [GPUFLEET_SPOOL_MAX_BYTES]")
    a("--attributors", metavar="LIST",
      help="comma list of slurm,kubernetes,process, or auto/none (default auto) [GPUFLEET_ATTRIBUTORS]")
    a("--slurm-mapping-dir", type=Path, metavar="DIR",
      help="job mapping dir the prolog writes (default /var/run/gpufleet/jobs) [GPUFLEET_SLURM_MAPPING_DIR]")
    a("--gpustat-dir", type=Path, metavar="DIR",
      help="Princeton jobstats-style /run/gpustat dir [GPUFLEET_GPUSTAT_DIR]")
    a("--kubelet-socket", type=Path, metavar="PATH", help="kubelet pod-resources socket [GPUFLEET_KUBELET_SOCKET]")
    a("--pod-log-dir", type=Path, metavar="DIR",
      help="the kubelet's pod log dir, naming pods found by cgroup UID [GPUFLEET_POD_LOG_DIR]")
    a("--metrics-port", type=int, metavar="PORT", help="serve the agent's /metrics on PORT [GPUFLEET_METRICS_PORT]")
    a("--metrics-addr", metavar="ADDR", help="address for /metrics (default 0.0.0.0) [GPUFLEET_METRICS_ADDR]")
    a("--metrics-dcgm-names", action="store_const", const=True,
      help="also expose DCGM_FI_* names on /metrics (stand in for dcgm-exporter) [GPUFLEET_METRICS_DCGM_NAMES]")
    a("--no-infiniband", dest="infiniband", action="store_const", const=False,
      help="do not read IB/RoCE counters from sysfs [GPUFLEET_INFINIBAND=0]")
    a("--nccl-inspector-dir", type=Path, metavar="DIR",
      help="read NCCL Inspector files (JSON or Prometheus) found under DIR, recursively; a nccl-inspector-<jobid> "
           "directory names its job (docs/nccl.md) [GPUFLEET_NCCL_INSPECTOR_DIR]")
    a("--no-nic-health", dest="nic_health", action="store_const", const=False,
      help="do not read IB/RoCE port errors, congestion, rate and state [GPUFLEET_NIC_HEALTH=0]")
    a("--no-gpm", dest="gpm", action="store_const", const=False, help="skip NVML GPM metrics [GPUFLEET_GPM=0]")
    a("--once", action="store_true", default=_env_flag("GPUFLEET_ONCE"),
      help="take one sample (two for rates), then exit [GPUFLEET_ONCE=1]")
    a("--print", dest="print_", action="store_true", default=_env_flag("GPUFLEET_PRINT"),
      help="with --once: print the sample as a table, send nothing [GPUFLEET_PRINT=1]")
    a("--json", action="store_true", default=_env_flag("GPUFLEET_JSON"),
      help="with --once --print: print JSON instead of a table [GPUFLEET_JSON=1]")
    p.set_defaults(func=run)


# Command-line-only switches with an environment twin (not AgentConfig fields), for the docs.
CLI_ENV = {
    "GPUFLEET_AGENT_CONFIG": ("--config", "TOML file with agent settings (top level or `[agent]`)"),
    "GPUFLEET_ONCE": ("--once", "take one sample (two for rates), then exit"),
    "GPUFLEET_PRINT": ("--print", "with --once: print the sample, send nothing"),
    "GPUFLEET_JSON": ("--json", "with --once --print: JSON instead of a table"),
}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


_SETTINGS = ("collector_url", "token", "node", "cluster", "source", "simulate", "gpus_per_node", "dcgm_exporter_url",
             "interval_s", "flush_s", "spool_dir", "spool_max_bytes", "attributors", "slurm_mapping_dir",
             "gpustat_dir", "kubelet_socket", "pod_log_dir", "metrics_port", "metrics_addr", "metrics_dcgm_names",
             "infiniband", "gpm", "nccl_inspector_dir", "nic_health")


def config_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Any:
    from gpufleet.agent.config import load_config

    overrides = {k: getattr(args, k, None) for k in _SETTINGS}
    if overrides.get("simulate") is not None and overrides.get("source") is None:
        overrides["source"] = "simulator"
    cfg = load_config(args.config, env, overrides)
    if cfg.simulate and cfg.source == "auto":
        cfg.source = "simulator"
    return cfg


def run(args: argparse.Namespace) -> int:
    import logging

    from gpufleet.agent.runner import Agent
    from gpufleet.agent.sources import open_source

    log = logging.getLogger("gpufleet.agent")
    try:
        cfg = config_from_args(args)
    except (ValueError, OSError) as e:
        print(f"gpufleet agent: bad configuration: {e}", file=sys.stderr)
        return 2
    try:
        sources = open_source(cfg)
    except RuntimeError as e:
        print(f"gpufleet agent: {e}", file=sys.stderr)
        return 2

    if args.once:
        from gpufleet.agent.oneshot import sample_once

        return sample_once(cfg, sources, print_=args.print_, as_json=args.json)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threads: list[threading.Thread] = []
    for node, source in sources:
        node_cfg = replace(cfg, node=node)
        if len(sources) > 1:
            node_cfg = replace(node_cfg, spool_dir=cfg.spool_dir / node,
                               metrics_port=None if cfg.metrics_port is None else cfg.metrics_port + len(threads))
        agent = Agent(node_cfg, source)
        try:
            agent.start()  # here, not in the thread: a locked or unwritable spool is a clear exit 2
        except (RuntimeError, OSError) as e:
            print(f"gpufleet agent: {e}", file=sys.stderr)
            stop.set()
            for t in threads:
                t.join()
            return 2
        if not threads:  # training processes on this host report to the first agent (docs/progress.md)
            from gpufleet.agent.progress_relay import attach

            relay = attach(agent)
            if relay is not None:
                log.info("agent: training progress on %s (GPUFLEET_PROGRESS)", relay.path)
        t = threading.Thread(target=agent.run, args=(stop,), name=f"agent-{node}")
        t.start()
        threads.append(t)
    log.info("agent: %d node(s) sampling every %.3g s, pushing to %s every %.3g s (spool %s)",
             len(sources), cfg.interval_s, cfg.collector_url, cfg.flush_s, cfg.spool_dir)
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.5)
    return 0
