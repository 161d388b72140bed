"""The fleet planner (edgesplit/fleet): against brute force, impossible deadlines reported, a
saturated server moves work back onto the devices, shared server parts batch together."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesplit.errors import PlanError
from edgesplit.fleet import Candidate, FleetTable, Group, Server, plan_fleet
from edgesplit.fleet.plan import best_alone
from edgesplit.fleet.report import report

KEYS = ("m/cut1", "m/cut2", "n/cut1")


@st.composite
def candidates(draw):
    n = draw(st.integers(1, 3))
    out = []
    for i in range(n):
        key = draw(st.sampled_from((None, *KEYS)))
        server_ms = draw(st.floats(0.1, 20)) if key is not None else 0.0
        out.append(
            Candidate(
                f"c{i}",
                key,
                device_ms=draw(st.floats(0.5, 60)),
                energy_mj=draw(st.floats(0.1, 100)),
                idle_w=draw(st.floats(0, 1)),
                server_ms=server_ms,
                shared_ms=server_ms * draw(st.floats(0, 1)),
            )
        )
    return tuple(out)


@st.composite
def fleets(draw, max_groups: int = 4):
    groups = [
        Group(
            f"g{k}",
            count=draw(st.integers(1, 60)),
            rate_per_s=draw(st.floats(0.5, 20)),
            deadline_p95_ms=draw(st.floats(5, 120)),
            objective=draw(st.sampled_from(("energy", "latency"))),
            candidates=draw(candidates()),
        )
        for k in range(draw(st.integers(1, max_groups)))
    ]
    server = Server(
        slots=draw(st.integers(1, 4)),
        max_batch=draw(st.integers(1, 16)),
        max_queue_delay_ms=draw(st.sampled_from((0.0, 2.0, 5.0))),
    )
    return groups, server


def brute_force(groups, server: Server) -> tuple:
    """The best score over every choice and the windows the planner tries (one replica)."""
    table = FleetTable(groups, server)
    w = server.max_queue_delay_ms
    windows = {w, w / 2, 0.0} if server.max_batch > 1 else {0.0}
    best = None
    for w in windows:
        s = Server(server.slots, server.max_batch, w if server.max_batch > 1 else 0.0)
        for combo in itertools.product(*(range(len(g.candidates)) for g in groups)):
            sc = table.score(combo, s)
            best = sc if best is None or sc < best else best
    return best


def _close(a: tuple, b: tuple) -> bool:
    return all(x == pytest.approx(y, rel=1e-6, abs=1e-6) for x, y in zip(a, b))


@settings(deadline=None)
@given(fleets())
def test_planner_matches_brute_force(fleet):
    groups, server = fleet
    choice = plan_fleet(groups, server)
    assert choice.search == "exact"
    assert _close(choice.pricing.score, brute_force(groups, server))
    # the chosen figures are the pricing of the chosen plans on the chosen server setting
    again = FleetTable(groups, server).price(choice.pricing.choice, choice.server)
    assert again.score == choice.pricing.score


@settings(deadline=None)
@given(fleets())
def test_descent_never_worse_than_each_group_alone_or_on_its_device(fleet):
    groups, server = fleet
    choice = plan_fleet(groups, server, exact_limit=0, windows=False)
    assert choice.search == "descent"
    table = FleetTable(groups, choice.server)
    for start in ([best_alone(g) for g in groups], [best_alone(g, True) for g in groups]):
        assert choice.pricing.score <= table.score(start, choice.server)


@settings(deadline=None)
@given(fleets())
def test_descent_is_exact_where_the_groups_do_not_interact(fleet):
    """With a server that never queues nor batches, each group's best is its own: the descent
    must find every one of them."""
    groups, _ = fleet
    server = Server(slots=4096, max_batch=1)
    choice = plan_fleet(groups, server, exact_limit=0)
    assert _close(choice.pricing.score, brute_force(groups, server))


def _offload_group(name: str, count: int, deadline_ms: float = 40.0) -> Group:
    return Group(
        name,
        count,
        10.0,
        deadline_ms,
        "energy",
        (
            Candidate("only:cpu", None, 30.0, 90.0, 0.2),
            Candidate("cut@3", "m/cut3", 4.0, 20.0, 0.2, server_ms=2.0, shared_ms=0.2),
        ),
    )


def test_an_impossible_deadline_is_reported_not_dropped():
    groups = [
        _offload_group("fine", 5),
        Group("hopeless", 3, 1.0, 1.0, "energy", (Candidate("only:cpu", None, 30.0, 90.0),)),
    ]
    choice = plan_fleet(groups, Server(slots=2))
    assert choice.unmet == ("hopeless",)
    r = report(groups, choice)
    rows = {g["group"]: g for g in r["groups"]}
    assert set(rows) == {"fine", "hopeless"}
    assert rows["hopeless"]["meets_deadline"] is False and rows["hopeless"]["plan"] == "only:cpu"
    assert rows["fine"]["meets_deadline"] is True and r["unmet"] == ["hopeless"]


def test_saturation_moves_work_back_to_the_devices():
    """Alone, every group offloads (less energy). A server of one slot takes 0.5 request/ms at
    2 ms each: 4 groups of 10 devices x 10 req/s = 0.4 req/ms fit, 12 groups do not."""
    server = Server(slots=1, max_batch=1)
    few = [_offload_group(f"g{k}", 10) for k in range(4)]
    many = [_offload_group(f"g{k}", 10) for k in range(12)]
    small = plan_fleet(few, server)
    big = plan_fleet(many, server, exact_limit=0)
    assert {few[0].candidates[i].name for i in small.pricing.choice} == {"cut@3"}
    names = [many[0].candidates[i].name for i in big.pricing.choice]
    assert "only:cpu" in names and "cut@3" in names  # some moved back, the rest still offload
    assert not big.unmet and not big.pricing.saturated
    assert big.pricing.utilisation < server.max_utilisation
    # the planner's pricing says why: everyone offloading saturates the server
    all_off = FleetTable(many, server).price([1] * len(many))
    assert all_off.saturated and all_off.score[0] > 0


def test_replicas_are_added_before_deadlines_fail():
    """Device plans miss the deadline (30 ms > 20 ms): only more servers can meet it."""
    many = [_offload_group(f"g{k}", 10, deadline_ms=20.0) for k in range(12)]
    one = plan_fleet(many, Server(slots=1), exact_limit=0)
    assert one.unmet  # one server cannot take them all
    grown = plan_fleet(many, Server(slots=1), exact_limit=0, max_replicas=4)
    assert grown.server.replicas > 1 and not grown.unmet


def test_shared_server_parts_batch_together():
    """Two groups on different devices run the same weight-bound server part (2 ms, 1.5 ms of it
    reading weights). Unbatched, one slot cannot take both (0.8 request/ms x 2 ms); batched, it
    can, and the report names the shared part."""

    def group(name: str, device_ms: float) -> Group:
        cands = (
            Candidate("only:cpu", None, 30.0, 90.0, 0.2),
            Candidate("cut@3", "m/cut3", device_ms, 20.0, 0.2, server_ms=2.0, shared_ms=1.5),
        )
        return Group(name, 40, 10.0, 80.0, "energy", cands)

    groups = [group("a", 4.0), group("b", 6.0)]
    unbatched = plan_fleet(groups, Server(slots=1, max_batch=1))
    assert sorted(unbatched.pricing.choice) == [0, 1]  # one of them back on its device
    why = report(groups, unbatched)["not_shared"]  # and the report says why it does not share
    assert len(why) == 1 and why[0]["part"] == "m/cut3" and not why[0]["meets_deadline"]
    assert why[0]["costs_group_energy_mj"] < 0 < why[0]["fleet_miss_ms_per_s_change"]
    choice = plan_fleet(groups, Server(slots=1, max_batch=16, max_queue_delay_ms=4.0))
    assert choice.pricing.choice == (1, 1) and not choice.unmet
    assert choice.pricing.batch["m/cut3"] > 1.0
    r = report(groups, choice)
    assert r["shared_parts"] == {"m/cut3": ["a", "b"]}


def test_bad_fleets_are_refused():
    with pytest.raises(PlanError, match="no groups"):
        plan_fleet([], Server())
    with pytest.raises(PlanError, match="without a candidate"):
        plan_fleet([Group("x", 1, 1.0, 1.0, "energy", ())], Server())


@pytest.mark.slow
def test_fleet_plan_file_writes_plans_server_flags_and_report(tmp_path):
    """The workflow on a small real fleet (predicted profiles, nothing measured): a plan per
    group, the serve flags, the report; an output folder that is not a fleet plan is kept."""
    import json

    from edgesplit.fleet.spec import FleetError
    from edgesplit.workflows.fleet import plan_fleet_file

    (tmp_path / "more.yaml").write_text(
        "groups:\n"
        "  - {name: jetsons, model: squeezenet, spec: jetson-orin-nano, count: 20,\n"
        "     band: {bandwidth_mbps: 400, rtt_ms: 2}, deadline_p95_ms: 30, objective: latency}\n"
    )
    (tmp_path / "fleet.yaml").write_text(
        "include: [more.yaml]\n"
        "server: {spec: server-h200, slots: 2, max_batch: 8, max_queue_delay_ms: 2}\n"
        "groups:\n"
        "  - {name: pis, model: squeezenet, spec: raspberry-pi5, count: 50, rate_per_s: 4,\n"
        "     band: {bandwidth_mbps: 400, rtt_ms: 2}, deadline_p95_ms: 60}\n"
        "  - {name: hopeless, model: squeezenet, spec: raspberry-pi5, count: 2, link: wifi,\n"
        "     deadline_p95_ms: 0.01}\n"
    )
    out = tmp_path / "fleet"
    result = plan_fleet_file(tmp_path / "fleet.yaml", out, max_candidates=6)
    r = json.loads((out / "fleet-report.json").read_text())
    assert r == json.loads(json.dumps(result.report))
    assert {g["group"] for g in r["groups"]} == {"pis", "jetsons", "hopeless"}
    assert r["unmet"] == ["hopeless"]
    for g in ("pis", "jetsons", "hopeless"):
        plan = json.loads((out / "groups" / g / "plan.json").read_text())
        assert plan["server"] == "server-h200" and plan["solver"]["name"] == "fleet"
    assert (out / "server" / "serve.args").read_text().startswith("--max-batch ")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(FleetError, match="not a fleet plan"):
        plan_fleet_file(tmp_path / "fleet.yaml", other)
    assert (other / "keep.txt").read_text() == "x"


def test_a_measured_latency_is_charged_as_the_pricing_charges_it():
    """benchmarks/fleet_run.py measures device energy with energy_at_mj: at the latency the
    pricing predicts on an idle server it gives the priced energy, and each ms longer costs the
    device's idle power; a plan all on the device costs its energy alone."""
    from edgesplit.fleet.price import energy_at_mj

    off = Candidate("cut", "k", device_ms=12.0, energy_mj=40.0, idle_w=0.5, server_ms=8.0)
    local = Candidate("local", None, device_ms=30.0, energy_mj=90.0, idle_w=0.5)
    g = Group("g", 1, 0.001, 100.0, "energy", (off, local))
    priced = FleetTable([g], Server()).price([0])
    assert energy_at_mj(off, priced.p50_ms[0]) == pytest.approx(priced.energy_mj[0])
    assert energy_at_mj(off, 30.0) == pytest.approx(40.0 + 0.5 * 10.0)
    assert energy_at_mj(off, 15.0) == pytest.approx(40.0 - 0.5 * 5.0)  # sooner than alone
    assert energy_at_mj(off, 1.0) == pytest.approx(40.0 - 0.5 * 8.0)  # never below the device's
    assert energy_at_mj(local, 500.0) == 90.0
