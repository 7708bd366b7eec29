"""The pure decisions on small hand-made views: what counts as slow, who is blamed, and when
nobody is."""

from __future__ import annotations

from gpufleet.analysis.collectives.detect import LocaliseParams, SlowParams, localise, slow_episodes
from gpufleet.analysis.collectives.features import CollRow, FabricView, NicRow, build_series, comm_share

T0 = 1_764_583_200.0
NODES = ("a", "b", "c")


def _view(minutes: int, busbw: callable, exec_us: callable, nics: list[NicRow] | None = None) -> FabricView:  # type: ignore[valid-type]
    rows = []
    for m in range(minutes):
        for w in range(6):  # 10 s windows
            ts = T0 + m * 60 + w * 10
            for k, node in enumerate(NODES):
                for g in range(2):
                    rank = k * 2 + g
                    rows.append(CollRow(ts, node, "0xc0", rank, "AllReduce", 1 << 28, 5, exec_us(m, rank),
                                        busbw(m), f"GPU-{node}-{g}", 6, 3))
    return FabricView(rows, nics or [], {f"GPU-{n}-{g}": [f"mlx5_{g}/1"] for n in NODES for g in range(2)}, T0,
                      T0 + minutes * 60)


def test_a_short_dip_and_jitter_are_not_slow_but_a_long_drop_is() -> None:
    jitter = [1.0, 0.97, 1.03, 0.95, 1.02, 0.99]
    v = _view(20, lambda m: 300 * (0.5 if m == 7 or m == 8 else jitter[m % 6]), lambda m, r: 2000.0)
    assert slow_episodes(build_series(v, 60), SlowParams()) == [], "two minutes at half speed is not 3 minutes"
    v = _view(20, lambda m: 300 * (0.6 if m >= 14 else jitter[m % 6]), lambda m, r: 2000.0)
    (ep,) = slow_episodes(build_series(v, 60), SlowParams())
    assert ep.start == T0 + 14 * 60 and ep.ongoing and abs(ep.drop - 0.4) < 0.05 and ep.lost_gpu_s > 0


def test_the_rank_that_waits_least_is_blamed_only_if_it_started_then() -> None:
    slow = lambda m: 300.0 if m < 10 else 150.0  # noqa: E731
    # rank 3 (node b, GPU 1) waits least from minute 10
    v = _view(20, slow, lambda m, r: 1500.0 if (r == 3 and m >= 10) else 3000.0 + 10 * r)
    s = build_series(v, 60)
    (ep,) = slow_episodes(s, SlowParams())
    c = localise(v, s[0], ep, LocaliseParams())
    assert c is not None and (c.node, c.rank, c.nic, c.confidence) == ("b", 3, "mlx5_1/1", "medium")
    # rank 0 was always first (a leader, another code path): not a symptom, nobody is blamed
    v = _view(20, slow, lambda m, r: 1500.0 if r == 0 else 3000.0 + 10 * r)
    s = build_series(v, 60)
    (ep,) = slow_episodes(s, SlowParams())
    assert localise(v, s[0], ep, LocaliseParams()) is None


def test_counters_alone_name_the_nic_and_a_down_port_beats_congestion() -> None:
    nics = []
    for m in range(20):
        ts = T0 + m * 60 + 30
        nics.append(NicRow(ts, "c", "mlx5_0/1", 60, 400.0, "ACTIVE" if m < 12 else "DOWN", 6000, 0.0))
        nics.append(NicRow(ts, "a", "mlx5_1/1", 60, 400.0, "ACTIVE", 60 * (10 if m < 12 else 1e5), 0.0))
    v = _view(20, lambda m: 300.0 if m < 12 else 120.0, lambda m, r: 3000.0 + 10 * r, nics)
    s = build_series(v, 60)
    (ep,) = slow_episodes(s, SlowParams())
    c = localise(v, s[0], ep, LocaliseParams())
    assert c is not None and (c.node, c.nic, c.rank) == ("c", "mlx5_0/1", None)
    assert "port_state" in c.basis and c.confidence == "medium"


def test_comm_share() -> None:
    v = _view(2, lambda m: 300.0, lambda m, r: 2000.0)  # 5 calls x 2 ms per 10 s window
    shares = comm_share(v)
    assert len(shares) == 6 and all(abs(x - 0.001) < 1e-9 for x in shares.values())
