"""`gpufleet up`: the whole system in one process on an embedded default.

SQLite under --data-dir, collector + API + web page, analysis in-process (no Redis), and
agents: real NVML sampling when GPUs are present, else (or with --simulate N) a simulated
fleet. Agents push over real HTTP to this process's collector, exactly as remote nodes do."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

log = logging.getLogger("gpufleet.up")

# The default simulated fleet: room for every inefficient profile once, healthy jobs around them.
DEMO_NODES = 24
# Each simulated node replays only the past its jobs' flags need (_evidence_s), at most
# --history-minutes: a node of healthy jobs replays this much (its charts have a past; no flag
# waits on it), so the first analysis pass comes within a minute of start on a busy machine.
HEALTHY_HISTORY_S = 600.0
EVIDENCE_MARGIN_S = 120.0  # over a kind's minimum duration: the window alignment's slack
FABRIC_HISTORY_S = 900.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run everything in one process (SQLite, simulated or local GPUs)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    p.add_argument("--data-dir", default=None,
                   help="SQLite database, agent spools (default $GPUFLEET_DATA_DIR, else ./gpufleet-data)")
    p.add_argument("--database-url", default=None, help="use this database instead of SQLite under --data-dir")
    p.add_argument("--simulate", type=int, default=None, metavar="NODES",
                   help=f"simulate NODES nodes (default: sample local GPUs via NVML, else simulate {DEMO_NODES})")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node (default 8)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    p.add_argument("--flush-s", type=float, default=5.0, help="agent flush interval in seconds (default 5)")
    p.add_argument("--analysis-interval", type=float, default=None,
                   help="seconds between analysis runs (default $GPUFLEET_ANALYSIS_INTERVAL_S, else 60)")
    p.add_argument("--history-minutes", type=float, default=40.0,
                   help="simulated fleet: replay up to this much past history at start, so charts and flags "
                        "(which need 15-30 min of evidence) show at once; each node replays what its jobs' "
                        "flags need, a node of healthy jobs 10 min (default 40; 0 = live only)")
    p.set_defaults(func=run)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


def _local_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # no driver, no library, no GPU: all mean "simulate"
        log.debug("NVML unavailable (%s): simulating", e)
        return 0


def _sources(args: argparse.Namespace, data_dir: Path) -> list[tuple[str, Any]]:
    """(node name, Source) pairs for the agents this process runs."""
    if args.simulate is None and _local_gpu_count() > 0:
        from gpufleet.agent.sources.nvml import NvmlSource

        log.info("NVML found GPUs on this machine: sampling them for real")
        return [(socket.gethostname(), NvmlSource())]
    from gpufleet.agent.simulator import SimulatedFleet

    nodes = args.simulate if args.simulate is not None else DEMO_NODES
    fleet = SimulatedFleet(nodes=nodes, gpus_per_node=args.gpus_per_node, seed=args.seed, start_ts=time.time())
    log.info("simulating %d nodes x %d GPUs (%d jobs)", nodes, args.gpus_per_node, len(fleet.jobs))
    from gpufleet.agent.sim_fabric import fabric_sources
    from gpufleet.agent.sources.fabric_sections import STATE_FILE

    # Each node's NCCL Inspector files and /sys tree, read by its agent's real fabric sources;
    # their offsets from an earlier run name files that are gone.
    for n in fleet.node_names():
        (data_dir / "spool" / n / STATE_FILE).unlink(missing_ok=True)
    return list(fabric_sources(fleet, data_dir / "sim-fabric"))


def _evidence_s(job: Any, th: Any, now: float) -> float:
    """Seconds of replayed past a simulated job needs for the flags it should raise to show at
    the first analysis pass (its inefficiency runs from before the replay: simulator._age)."""
    p = job.profile
    if p.progress_flags:
        return now - job.start_ts + EVIDENCE_MARGIN_S  # its whole story, startup included
    if p.fabric_flags:
        # The fleet starts 150 s into a congestion or flapping-NIC episode (simulator
        # _in_episode_at_start) after a healthy gap of 6 min or more: the episode and 10 min of
        # baseline before it; a dirty cable counts one error a minute or more, its flag needs ten.
        return FABRIC_HISTORY_S
    if not p.flags:
        return HEALTHY_HISTORY_S
    window = float(th.general.window_s)
    return max(float(th.raw.get(k, {}).get("min_duration_s", 0.0)) for k in p.flags) + window + EVIDENCE_MARGIN_S


def _history_plan(sources: list[tuple[str, Any]], cap_s: float, now: float) -> dict[str, float]:
    """Seconds of past each node's agent replays: a simulated node what its jobs need (at most
    ``cap_s``), a real one none. The first agent owns the progress relay, and the simulated
    training processes report on its clock: ``sources`` is put longest replay first, and the
    first replays what every progress story needs."""
    from gpufleet.analysis.config import load_thresholds

    th = load_thresholds()
    plan: dict[str, float] = {}
    for node, source in sources:
        jobs = getattr(source, "jobs", None) if getattr(source, "name", "") == "simulator" else None
        if jobs is None or cap_s <= 0:
            plan[node] = 0.0
            continue
        needs = [_evidence_s(j, th, now) for j in jobs]
        plan[node] = min(cap_s, max([HEALTHY_HISTORY_S, *needs]))
    sources.sort(key=lambda ns: -plan[ns[0]])  # the relay's agent first: the longest replay
    if sources and plan[sources[0][0]] > 0:
        fleet = getattr(sources[0][1], "fleet_jobs", [])
        stories = [_evidence_s(j, th, now) for j in fleet if j.profile.progress_flags]
        plan[sources[0][0]] = min(cap_s, max([plan[sources[0][0]], *stories]))
    return plan


class _Background:
    """Agents and the analysis loop, started once the server listens, stopped on shutdown."""

    def __init__(self, args: argparse.Namespace, base_url: str, data_dir: Path, settings: Any) -> None:
        self.args = args
        self.settings = settings
        self.base_url = base_url
        self.data_dir = data_dir
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.agent_token: str | None = None  # minted by run(): agents store data in every mode
        from gpufleet.api.web import ReplayProgress

        self.replay = ReplayProgress()  # the page's "replaying history: N%" (api/web.py)
        self.agents: list[Any] = []
        self.agents_started = threading.Event()

    def start_agents(self) -> None:
        from gpufleet.agent.runner import Agent, AgentConfig

        sources = _sources(self.args, self.data_dir)
        history = _history_plan(sources, self.args.history_minutes * 60.0, time.time())
        relays: dict[str, Any] = {}
        first_source: Any = None
        for node, source in sources:
            fabric = getattr(source, "fabric", None)  # a simulated node's fake fabric files
            cfg = AgentConfig(
                collector_url=self.base_url,
                token=self.agent_token,
                node=node,
                flush_s=self.args.flush_s,
                spool_dir=self.data_dir / "spool" / node,
                **({"sys_root": fabric.sys_root, "nccl_inspector_dir": fabric.nccl_root} if fabric else {}),
            )
            agent = Agent(cfg, source)
            self.agents.append(agent)
            # One progress relay per simulated node, as one per host on a cluster (docs/progress.md):
            # each simulated rank reports to its own node's relay, so a progress flag names the
            # rank's node (with one relay on the first agent, every rank read as that node's).
            from gpufleet.agent.progress_relay import attach, socket_path_from_env

            if len(self.agents) == 1:
                base = socket_path_from_env()
                relay = attach(agent, base) if base else None
                print(f"training progress: GPUFLEET_PROGRESS={relay.path}" if relay else
                      "training progress: off (GPUFLEET_PROGRESS=off, or no folder for its socket)", flush=True)
                first_source = source
            elif relays:
                relay = attach(agent, f"{relays[sources[0][0]].path}-{len(self.agents) - 1}")
            else:
                relay = None
            if relay is not None:
                relays[node] = relay
            self.replay.plan(int(history[node] / cfg.interval_s))
            t = threading.Thread(target=self._run_agent, args=(agent, history[node]), name=f"agent-{node}",
                                 daemon=True)
            t.start()
            self.threads.append(t)
        if relays and hasattr(first_source, "hooks"):
            # The simulated training processes report to their node's relay, as real ones do; a
            # rank on a node without one (its socket could not be made) uses the first node's.
            from gpufleet.agent.sim_progress import ProgressDriver

            first = relays.get(sources[0][0])
            paths = {n: r.path for n, r in relays.items()}
            driver = ProgressDriver(first_source.fleet_jobs, lambda n: paths.get(n, first.path if first else ""),
                                    received=lambda: sum(int(r.received) for r in relays.values()))
            first_source.hooks.append(driver.advance)
        self.agents_started.set()  # every agent's replay is planned: the progress is complete

    def _run_agent(self, agent: Any, history_s: float) -> None:
        """Replay the simulated past through the agent's own batching and spool (its sender
        then delivers it over HTTP like any backlog), then sample live."""
        if history_s > 0:
            agent.start()
            t = time.time() - history_s
            n = 0
            planned = int(history_s / agent.config.interval_s)  # as start_agents planned it
            # Re-read the clock every cycle: the replay itself takes seconds, leave no gap.
            while t < time.time() and not self.stop.is_set():
                agent.cycle(t)
                t += agent.config.interval_s
                n += 1
                if n % 60 == 0:
                    agent.flush()
                    self.replay.step(60 if n <= planned else 0)
            agent.flush()
            self.replay.step(max(0, planned - (min(n, planned) // 60) * 60))  # this agent's share, no more
        agent.run(self.stop)

    def start_analysis(self, engine: Any) -> None:
        t = threading.Thread(target=self._analysis_loop, args=(engine,), name="analysis", daemon=True)
        t.start()
        self.threads.append(t)

    def _analysis_loop(self, engine: Any) -> None:
        from gpufleet.analysis.config import load_thresholds
        from gpufleet.analysis.progress.flags import run_progress_pass
        from gpufleet.analysis.runner import run_analysis
        from gpufleet.analysis.state import StateCache

        settings = self.settings
        alerts = _alerts_hook(settings)
        every = settings.analysis.interval_s
        path = settings.analysis.thresholds
        thresholds = load_thresholds(str(path) if path else None)
        cache = StateCache(max_bytes=int(settings.analysis.cache_mb * 2**20))
        # First pass soon after start so the page shows flags within a minute, but not before
        # the replayed past is stored: a job whose newest stored sample is still in the replayed
        # past looks stale, and the pass would close it and its allocations (close_stale_jobs).
        self._wait_for_replay(deadline_s=300.0)
        # Between hardware passes the progress pass runs alone every progress_interval_s, as the
        # production beat does (docs/evaluation.md, "Decision on cadence"): hung and slow_rank
        # are judged as the windows arrive, not once a minute.
        step = max(1.0, min(settings.analysis.progress_interval_s, every))
        wait, next_full = 0.0, time.monotonic()  # the first pass as soon as the replayed past is stored
        while not self.stop.wait(wait):
            full = time.monotonic() >= next_full
            if full:
                next_full = time.monotonic() + every
            try:
                changed = True
                if full:
                    run_analysis(engine, thresholds=thresholds, cache=cache)
                else:
                    pp = run_progress_pass(engine, time.time())
                    changed = bool(pp.opened or pp.resolved)  # alerts see a changed progress flag at once
                if changed and alerts:
                    alerts(engine, settings, base_url=settings.base_url())
            except Exception:
                log.exception("analysis pass failed; retrying next interval")
            wait = max(0.0, min(step, next_full - time.monotonic()))

    def _wait_for_replay(self, deadline_s: float) -> None:
        """Until the agents have started, replayed their history and sent their spools (at most
        ``deadline_s``: a collector that refuses batches must not hold the analysis back)."""
        end = time.monotonic() + deadline_s
        while not self.stop.is_set() and time.monotonic() < end:
            if (self.agents_started.is_set() and not self.replay.as_json()["active"]
                    and all(len(a.spool) == 0 for a in self.agents)):
                return
            self.stop.wait(0.5)

    def shutdown(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)


def _graceful_server(config: Any, bg: _Background) -> Any:
    """A uvicorn server whose Ctrl-C first stops the agents (their final flush still reaches
    the collector, which is still listening), then the server."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if bg.stop.is_set():  # second Ctrl-C: stop now
                super().handle_exit(sig, frame)
                return

            def stop_then_exit() -> None:
                bg.shutdown()
                super(Server, self).handle_exit(sig, frame)

            threading.Thread(target=stop_then_exit, name="shutdown", daemon=True).start()

    return Server(config)


def _alerts_hook(settings: Any) -> Any:
    """Slack alerts in embedded mode only when a webhook or rules file is configured."""
    if not settings.alerts.enabled:
        return None
    from gpufleet.alerts.runner import evaluate_and_deliver_with

    return evaluate_and_deliver_with


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gpufleet.commands._db import settings_from_args
    from gpufleet.gctune import tune_gc_for_server
    from gpufleet.server import serving_app
    from gpufleet.storage.migrate import upgrade

    loopback = _is_loopback(args.host)
    if not loopback:
        log.warning("listening on %s: anonymous access stays OFF; create tokens with `gpufleet token create`",
                    args.host)
    analysis = {"interval_s": args.analysis_interval} if args.analysis_interval is not None else {}
    settings = settings_from_args(args, http={"host": args.host, "port": args.port},
                                  auth={"allow_anonymous": loopback}, analysis=analysis)
    data_dir = Path(settings.database.data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = settings.replace(database={"data_dir": data_dir})
    url = settings.database_url()
    upgrade(url)
    local = f"http://127.0.0.1:{args.port}" if not loopback else f"http://{args.host}:{args.port}"
    bg = _Background(args, local, data_dir, settings)
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.tokens import mint_embedded_agent_token

    # The embedded agents push over HTTP like remote ones: with anonymous access off (any
    # non-loopback --host) they would get 401 for ever, so they get a token of their own.
    token_engine = make_engine(url)
    try:
        bg.agent_token = mint_embedded_agent_token(token_engine)
    finally:
        token_engine.dispose()

    @contextlib.asynccontextmanager
    async def background(app: Any) -> AsyncIterator[None]:
        app.state.replay = bg.replay
        bg.start_analysis(app.state.engine)
        yield
        bg.shutdown()

    # The ingest front: the simulated agents' batches skip the FastAPI request cycle.
    app = serving_app(settings, extra_lifespans=[background])
    tune_gc_for_server(settings.gc.threshold)  # a long-running server process, like `serve`'s workers
    from gpufleet.api.http_timeouts import http_protocol

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            proxy_headers=False, http=http_protocol())  # header read timeout (slowloris)
    server = _graceful_server(config, bg)

    def announce() -> None:
        while not server.started and not bg.stop.is_set():
            time.sleep(0.05)
        if server.started:
            shown = "localhost" if args.host in ("127.0.0.1", "0.0.0.0") else args.host
            print(f"gpufleet is up: http://{shown}:{args.port}/  (API docs /docs, Ctrl-C to stop)", flush=True)
            print(f"database: {url}", flush=True)
            bg.start_agents()

    threading.Thread(target=announce, name="announce", daemon=True).start()
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it handled; the shutdown above already ran
    bg.shutdown()
    print("gpufleet stopped", flush=True)
    return 0
