"""Planner time of ``edgesplit fleet plan`` at 10,000 devices in 100 groups (issue 39: under 10 s).

The groups are made from real zoo models on shipped device specs over shipped link presets, with
the H200 server (``devices/server-h200.yaml``, and the measured H200 profiles in ``profiles/``
where there is one): every (model, spec, link) has its candidate plans made once by the optimiser
(:func:`edgesplit.fleet.candidates.group_candidates`, timed apart), then 100 groups of 100 devices
draw one of them, a request rate (1-10 a second) and a deadline (1.2-3x the combination's fastest
plan alone), seeded. The figure is the joint search alone (:func:`edgesplit.fleet.plan_fleet`):
the median of ``--repeat`` runs. It also prints the fleet's predicted device energy a request
against every group's own best plan alone (what Neurosurgeon or DADS picks per device) and all on
the device, priced by the same model.

Run: .venv/bin/python benchmarks/fleet_planner.py [--groups 100] [--devices-per-group 100]
     [--slots 32] [--max-batch 32] [--delay-ms 4] [--max-replicas 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from edgesplit.fleet import FleetTable, Group, Server, plan_fleet
from edgesplit.fleet.candidates import group_candidates
from edgesplit.fleet.plan import alone_ms, best_alone
from edgesplit.model import zoo
from edgesplit.util import shipped_dir
from edgesplit.workflows.resolve import Choices, resolve

MODELS = ("squeezenet", "mobilenetv2", "resnet18")
SPECS = ("raspberry-pi5", "jetson-orin-nano", "snapdragon-8gen2")
LINKS = (("wifi", None), ("wifi", 100.0), ("wifi", 400.0))
"""Wi-Fi at its DADS rate (18.88 Mbit/s), and at 100 and 400 Mbit/s (Wi-Fi 5 / 6 class), with
the preset's radio power and RTT."""


def combos(tmp: Path) -> list[tuple[str, tuple]]:
    """(label, candidates) of every model x spec x link, made once each."""
    profiles = shipped_dir("profiles")
    out = []
    for model in MODELS:
        path = zoo.save(model, tmp / f"{model}.onnx")
        sp = profiles / f"{model}.server-h200.profile.json"
        for spec in SPECS:
            for link, mbps in LINKS:
                choices = Choices(
                    objective="energy",
                    server="server-h200",
                    server_profile=sp if sp.is_file() else None,
                    link=link,
                    bandwidth_mbps=mbps,
                )
                made, _ = group_candidates(resolve(path, spec, choices))
                out.append(
                    (f"{model}/{spec}/{link}@{mbps or 'preset'}", tuple(m.candidate for m in made))
                )
    return out


def fleet(made, n_groups: int, per_group: int, seed: int = 0) -> list[Group]:
    rng = random.Random(seed)
    groups = []
    for k in range(n_groups):
        label, cands = made[k % len(made)]
        fastest = min(c.device_ms + c.server_ms for c in cands)
        groups.append(
            Group(
                f"{label}#{k}",
                per_group,
                rng.uniform(1, 10),
                round(fastest * rng.uniform(1.2, 3.0) + 5.0, 3),
                "latency" if k % 10 == 9 else "energy",
                cands,
            )
        )
    return groups


def per_request_mj(table: FleetTable, choice, server: Server) -> float:
    p = table.price(choice, server)
    w = table.weight
    return float((w * p.energy_mj).sum() / w.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--devices-per-group", type=int, default=100)
    ap.add_argument("--slots", type=str, default="4,1", help="server slots: one run each")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--delay-ms", type=float, default=4.0)
    ap.add_argument("--max-replicas", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        made = combos(Path(tmp))
        made_s = time.perf_counter() - t0
    groups = fleet(made, args.groups, args.devices_per_group)
    for slots in (int(v) for v in args.slots.split(",")):
        run(groups, Server(slots, args.max_batch, args.delay_ms), args)
    print(f"candidates: {len(made)} (model, spec, link) combinations in {made_s:.1f} s")


def run(groups: list[Group], server: Server, args) -> None:
    times, choice = [], None
    for _ in range(args.repeat):
        t = time.perf_counter()
        choice = plan_fleet(groups, server, max_replicas=args.max_replicas)
        times.append(time.perf_counter() - t)
    n_cands = sum(len(g.candidates) for g in groups)
    devices = sum(g.count for g in groups)
    print(
        f"planner time at {devices} devices in {len(groups)} groups: "
        f"{statistics.median(times):.2f} s, {n_cands} candidates, {server.slots} slots "
        f"(median of {len(times)}: "
        + ", ".join(f"{t:.2f}" for t in times)
        + f"); search {choice.search}, {choice.evaluations} choices priced"
    )
    s = choice.server
    print(
        f"server: {s.replicas} replica(s) x {s.slots} slots, window {s.max_queue_delay_ms:g} ms, "
        f"utilisation {choice.pricing.utilisation:.0%}; groups over their deadline: "
        f"{len(choice.unmet)}"
    )
    table = FleetTable(groups, s)
    fleet_mj = per_request_mj(table, choice.pricing.choice, s)
    alone = [best_alone(g) for g in groups]
    device = [best_alone(g, device_only=True) for g in groups]
    for name, c in (("each group's best alone", alone), ("all on device", device)):
        p = table.price(c, s)
        print(
            f"{name}: {per_request_mj(table, c, s):.3f} mJ/request, groups over deadline "
            f"{sum(p95 > g.deadline_p95_ms for p95, g in zip(p.p95_ms, groups))}, "
            f"utilisation {p.utilisation:.0%}{' (saturated)' if p.saturated else ''}"
        )
    gap = choice.pricing.score[1] / choice.energy_bound_mj - 1 if choice.energy_bound_mj else 0.0
    print(
        f"fleet plan: {fleet_mj:.3f} mJ/request; energy groups {gap:.1%} above the lower bound "
        "(each one's cheapest plan that meets its deadline alone)"
    )
    assert all(alone_ms(g, i) >= 0 for g, i in zip(groups, choice.pricing.choice))


if __name__ == "__main__":
    main()
