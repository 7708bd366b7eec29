"""The demo fleet `gpufleet up` simulates (DEMO_NODES nodes x 8 GPUs) is honest: it runs every
inefficient profile at least once, and no job name or label gives the profile away."""

from __future__ import annotations

import re

from gpufleet.agent.simulator import PROFILES, SimulatedFleet
from gpufleet.commands.up import DEMO_NODES


def _words(text: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", text.lower())) - {""}


def test_default_fleet_runs_every_inefficient_profile() -> None:
    fleet = SimulatedFleet(nodes=DEMO_NODES, gpus_per_node=8, seed=0)
    sick = {p.name for p in PROFILES.values() if not p.healthy}
    assert sick <= {j.profile.name for j in fleet.jobs}
    assert any(j.profile.healthy for j in fleet.jobs)  # healthy jobs too: false positives show
    # each inefficient profile has one job old enough for the replayed 40 min to hold its evidence,
    # multi-node ones on two nodes at least (a straggler node needs peer nodes)
    for name in sick:
        best = max((j for j in fleet.jobs if j.profile.name == name), key=lambda j: -j.start_ts)
        age = fleet.start_ts - best.start_ts
        if best.profile.progress_flags:  # its whole progress story (startup too) inside the 40 min replayed
            assert 1800 <= age <= 2100, name
        else:
            assert age >= 2700, name
        if best.profile.multi_node:
            assert len(best.nodes) >= 2, name
    used = [g for j in fleet.jobs for g in j.gpus]
    assert len(used) == len(set(used)) and len(used) < DEMO_NODES * 8  # no GPU twice; some unallocated


def test_names_and_labels_do_not_give_the_profile_away() -> None:
    fleet = SimulatedFleet(nodes=DEMO_NODES, gpus_per_node=8, seed=0)
    # the words of the inefficient profiles' names: "idle", "stall", "straggler", "fault", ...
    giveaways = {w for p in PROFILES.values() if not p.healthy for w in p.name.split("_") if len(w) > 2}
    for j in fleet.jobs:
        info = j.info()
        assert info.name and info.name not in PROFILES
        text = " ".join([info.name, *info.labels, *info.labels.values()])
        assert not _words(text) & giveaways, (j.profile.name, text)
        assert "profile" not in info.labels
        assert info == j.info()  # deterministic per job


def test_small_fleets_keep_their_plain_draw() -> None:
    # One- and few-node fleets (agents, tests) are not forced to carry every profile.
    a = [j.profile.name for j in SimulatedFleet(nodes=2, gpus_per_node=4, seed=3).jobs]
    b = [j.profile.name for j in SimulatedFleet(nodes=2, gpus_per_node=4, seed=3).jobs]
    assert a == b
