"""The fleet plan's report: per group its plan and predicted figures, the server's, the shared
server parts, where sharing costs a group more than it saves the fleet, and where a group could
share a server part with others but does not (and what sharing would cost).

"Sharing costs a group": with every other group's plan fixed, the group's own best candidate
(its cheapest that meets its deadline, by its objective) is not the one the fleet plan gives it.
The report gives what the fleet plan costs that group (mJ or ms a request) and what it saves the
fleet (the fleet score's difference, in deadline miss or in device energy a second).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgesplit.fleet.plan import FleetChoice
from edgesplit.fleet.price import FleetTable, Group


def _selfish(table: FleetTable, choice: FleetChoice, g: int) -> int:
    """Group ``g``'s own best candidate with the others' fixed."""
    group = table.groups[g]
    best, best_key = choice.pricing.choice[g], None
    for i in range(len(group.candidates)):
        trial = list(choice.pricing.choice)
        trial[g] = i
        p = table.price(trial, choice.server)
        met = p.p95_ms[g] <= group.deadline_p95_ms * (1 + 1e-9)
        own = getattr(p, group.figure)[g]
        k = (not met, p.p95_ms[g] if not met else own)
        if best_key is None or k < best_key:
            best, best_key = i, k
    return best


def sharing(table: FleetTable, choice: FleetChoice) -> list[dict[str, Any]]:
    """Per group whose own best differs from its fleet plan: the cost to it, the saving to the
    fleet (see the module doc)."""
    out = []
    base = choice.pricing
    for g, group in enumerate(table.groups):
        own = _selfish(table, choice, g)
        if own == base.choice[g]:
            continue
        trial = list(base.choice)
        trial[g] = own
        alt = table.price(trial, choice.server)
        figure = group.figure
        mine = getattr(base, figure)[g] - getattr(alt, figure)[g]
        out.append(
            {
                "group": group.name,
                "own_best": group.candidates[own].name,
                "fleet_plan": group.candidates[base.choice[g]].name,
                f"costs_group_{figure}": round(mine, 6),
                "saves_fleet_miss_ms_per_s": round(alt.score[0] - base.score[0], 6),
                "saves_fleet_energy_mj_per_s": round(alt.score[1] - base.score[1], 6),
            }
        )
    return out


def not_shared(table: FleetTable, choice: FleetChoice) -> list[dict[str, Any]]:
    """Per group that offers a server part other groups run in the plan but runs another plan:
    what joining them would cost it (its own figure), the change in the server's utilisation, and
    the change in the fleet's score (deadline miss, then energy): why it does not share."""
    base = choice.pricing
    in_use: dict[str, set[int]] = {}
    for g, group in enumerate(table.groups):
        key = group.candidates[base.choice[g]].key
        if key is not None:
            in_use.setdefault(key, set()).add(g)
    out = []
    for g, group in enumerate(table.groups):
        mine = group.candidates[base.choice[g]].key
        for i, c in enumerate(group.candidates):
            if c.key is None or c.key == mine or not in_use.get(c.key, set()) - {g}:
                continue
            trial = list(base.choice)
            trial[g] = i
            alt = table.price(trial, choice.server)
            figure = group.figure
            out.append(
                {
                    "group": group.name,
                    "part": c.key,
                    "plan": c.name,
                    "with": sorted(table.groups[h].name for h in in_use[c.key] - {g}),
                    f"costs_group_{figure}": round(
                        getattr(alt, figure)[g] - getattr(base, figure)[g], 6
                    ),
                    "meets_deadline": alt.p95_ms[g] <= group.deadline_p95_ms * (1 + 1e-9),
                    "server_utilisation_change": round(alt.utilisation - base.utilisation, 6),
                    "fleet_miss_ms_per_s_change": round(alt.score[0] - base.score[0], 6),
                    "fleet_energy_mj_per_s_change": round(alt.score[1] - base.score[1], 6),
                }
            )
    return out


def report(
    groups: Sequence[Group], choice: FleetChoice, table: FleetTable | None = None
) -> dict[str, Any]:
    """The report as JSON-ready data (stable key order)."""
    table = table or FleetTable(groups, choice.server)
    p = choice.pricing
    shared: dict[str, list[str]] = {}
    rows = []
    for g, group in enumerate(groups):
        c = group.candidates[p.choice[g]]
        if c.key is not None:
            shared.setdefault(c.key, []).append(group.name)
        rows.append(
            {
                "group": group.name,
                "count": group.count,
                "rate_per_s": group.rate_per_s,
                "objective": group.objective,
                "plan": c.name,
                "server_part": c.key,
                "p50_ms": round(p.p50_ms[g], 6),
                "p95_ms": round(p.p95_ms[g], 6),
                "deadline_p95_ms": group.deadline_p95_ms,
                "meets_deadline": group.name not in choice.unmet,
                "device_energy_mj": round(p.energy_mj[g], 6),
                "alone_energy_mj": round(c.energy_mj, 6),
            }
        )
    requests = sum(g.requests_per_s for g in groups)
    return {
        "groups": rows,
        "unmet": list(choice.unmet),
        "server": {
            "replicas": choice.server.replicas,
            "slots": choice.server.slots,
            "max_batch": choice.server.max_batch,
            "max_queue_delay_ms": choice.server.max_queue_delay_ms,
            "utilisation": round(p.utilisation, 6),
            "saturated": p.saturated,
            "batch_size": p.batch,
        },
        "shared_parts": {k: v for k, v in shared.items() if len(v) > 1},
        "sharing_costs": sharing(table, choice),
        "not_shared": not_shared(table, choice),
        "fleet": {
            "devices": sum(g.count for g in groups),
            "requests_per_s": round(requests, 6),
            "device_energy_mj_per_request": round(
                sum(g.requests_per_s * e for g, e in zip(groups, p.energy_mj)) / requests, 6
            ),
            "deadline_miss_ms_per_s": p.score[0],
            "energy_bound_mj_per_s": round(choice.energy_bound_mj, 6),
        },
        "search": {
            "method": choice.search,
            "evaluations": choice.evaluations,
            "time_s": round(choice.time_s, 6),
            "settings": [
                {"replicas": r, "max_queue_delay_ms": w, "score": list(s)}
                for r, w, s in choice.settings
            ],
        },
    }
