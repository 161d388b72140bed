"""The typed fields of a plan (``predicted``, ``link``, ``accuracy``) and their JSON.

``data/plans/v1_*.json`` were written by ``Plan.save`` before these fields were typed (a 6-node
convolution net on ``snapdragon-8gen2`` with ``server-a100`` over Wi-Fi at a server load of 4
devices and 2 slots; its int8 NPU part kept under a 15 dB budget, dropped under a 150 dB one),
with the paths made relative: a plan read and written again must be the same file.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from edgesplit.device.spec import NetworkLink
from edgesplit.errors import PlanError
from edgesplit.optimize.plan import Plan, Predicted, check_plan_types, load_plan
from edgesplit.precision import RECORDED_BEFORE_METHODS, recorded_calibration
from edgesplit.precision.metrics import Accuracy, AccuracyBudget
from edgesplit.precision.record import AccuracyRecord, CalibrationRecord, DroppedPart
from edgesplit.util import dump_json

PLANS = Path(__file__).parent / "data" / "plans"


def _doc(name: str) -> dict:
    return json.loads((PLANS / name).read_text())


def _json(plan: Plan) -> dict:
    return json.loads(dump_json(plan.to_json()))


@pytest.mark.parametrize("name", ["v1_full.json", "v1_dropped.json"])
def test_a_plan_written_before_reads_and_writes_the_same_file(name, tmp_path):
    text = (PLANS / name).read_text()
    plan = load_plan(PLANS / name)
    assert dump_json(plan.to_json()) == text
    plan.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text
    assert load_plan(tmp_path / "again.json") == plan


def test_the_fields_are_typed():
    plan = load_plan(PLANS / "v1_full.json")
    pred = plan.predicted
    assert isinstance(pred, Predicted)
    assert pred.latency_ms == 0.795364 and pred.energy_mj == 0.826414 and pred.period_ms == 0.247144
    assert pred.throughput_per_s == 4046.224064 and pred.sequential_latency_ms == 0.795364
    assert (pred.server_devices, pred.server_slots, pred.server_queue_factor) == (4, 2, 1.0)
    assert isinstance(pred.server_devices, int)  # 4.0 in the file
    assert isinstance(plan.link, NetworkLink)
    assert (plan.link.name, plan.link.up_mbps, plan.link.rtt_ms) == ("wifi", 18.88, 10.0)
    acc = plan.accuracy
    assert isinstance(acc, AccuracyRecord) and acc.meets is True
    assert acc.budget == AccuracyBudget(min_snr_db=15.0)
    assert isinstance(acc.measured, Accuracy) and acc.measured.snr_db == 22.602005
    assert acc.parts == {"p0": acc.measured} and acc.dropped == ()
    assert isinstance(acc.calibration, CalibrationRecord)
    assert acc.calibration.source == "photos" and acc.calibration.held_out_samples == 8
    assert acc.calibration.method == "minmax" and acc.calibration.path is None

    dropped = load_plan(PLANS / "v1_dropped.json").accuracy
    assert dropped is not None and dropped.parts == {} and dropped.measured.snr_db == 200.0
    (step,) = dropped.dropped
    assert isinstance(step, DroppedPart) and isinstance(step.alone, Accuracy)
    assert (step.part, step.processor, step.precision, step.nodes) == ("p0", "npu", "int8", 5)
    assert step.why == "SNR 22.6 dB < 150 dB" and step.plan.snr_db == 22.602005


def test_older_plans_read(tmp_path):
    """A link named by its preset; no calibration method; a plan made by hand (no figures, no
    link, no accuracy); each written again as it was read."""
    doc = _doc("v1_full.json")
    doc["link"] = "wifi"
    del doc["accuracy"]["calibration"]["method"]
    plan = Plan.from_json(doc)
    assert plan.link == "wifi" and _json(plan) == doc
    assert recorded_calibration(plan.accuracy) == (None, RECORDED_BEFORE_METHODS)

    bare = _doc("v1_full.json")
    for key in ("link", "accuracy", "predicted", "server"):
        del bare[key]
    plan = Plan.from_json(bare)
    assert plan.link is None and plan.accuracy is None and plan.predicted == Predicted()
    assert _json(plan)["predicted"] == {} and _json(plan)["accuracy"] is None

    partial = _doc("v1_full.json")
    partial["predicted"] = {"latency_ms": 1.5, "energy_mj": 2}
    partial["accuracy"] = {"calibration": {"source": "photos", "path": "a.npz"}}
    plan = Plan.from_json(partial)
    assert plan.predicted == Predicted(latency_ms=1.5, energy_mj=2)
    assert _json(plan)["predicted"] == partial["predicted"]
    assert _json(plan)["accuracy"] == partial["accuracy"]
    assert recorded_calibration(plan.accuracy) == ("a.npz", RECORDED_BEFORE_METHODS)


def _set(path: str, value):
    def edit(doc: dict) -> None:
        *keys, last = path.split("/")
        node = doc
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        key = int(last) if isinstance(node, list) else last
        if value is KeyError:
            del node[key]
        else:
            node[key] = value

    return edit


HOSTILE = {
    "predicted_not_a_number": (
        _set("predicted/latency_ms", "fast"),
        "predicted.latency_ms: expected a number",
    ),
    "predicted_negative": (_set("predicted/energy_mj", -1), "predicted.energy_mj: -1 is negative"),
    "predicted_count_not_whole": (
        _set("predicted/server_devices", 2.5),
        "predicted.server_devices: expected an integer, got 2.5",
    ),
    "predicted_not_an_object": (_set("predicted", [1]), "predicted: expected an object, got [1]"),
    "link_a_number": (_set("link", 5), "link: expected an object, a preset's name or null, got 5"),
    "link_name_not_a_string": (_set("link/name", 3), "link.name: expected a string, got 3"),
    "link_figure_a_string": (_set("link/rtt_ms", "slow"), "link.rtt_ms: expected a number"),
    "link_missing_a_figure": (_set("link/down_mbps", KeyError), "missing key 'down_mbps'"),
    "meets_not_a_bool": (_set("accuracy/meets", "yes"), "accuracy: meets: expected true or false"),
    "dropped_nodes_a_string": (
        _set("accuracy/dropped/0/nodes", "five"),
        "accuracy.dropped[0]: nodes: expected an integer, got 'five'",
    ),
    "dropped_without_why": (
        _set("accuracy/dropped/0/why", KeyError),
        "accuracy.dropped[0]: missing key 'why'",
    ),
    "dropped_figures_bad": (
        _set("accuracy/dropped/0/alone/cosine", "high"),
        "accuracy.dropped[0].alone: cosine: expected a number",
    ),
    "dropped_not_an_object": (
        _set("accuracy/dropped/0", 7),
        "accuracy.dropped[0]: expected an object, got 7",
    ),
    "held_out_negative": (
        _set("accuracy/calibration/held_out_samples", -3),
        "accuracy.calibration: held_out_samples: -3 is negative",
    ),
    "parts_figures_bad": (_set("accuracy/parts/p0", [1]), "accuracy.parts.p0: expected an object"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_field_of_the_wrong_type_is_one_line_naming_it(case, tmp_path):
    edit, needle = HOSTILE[case]
    doc = _doc("v1_dropped.json")
    edit(doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError) as e:
        load_plan(path)
    msg = str(e.value)
    assert needle in msg and msg.startswith(str(path)) and "\n" not in msg, msg


def test_a_plan_made_in_python_is_checked_too():
    plan = load_plan(PLANS / "v1_full.json")
    check_plan_types(plan, "plan")
    bad = dataclasses.replace(plan, predicted=Predicted(latency_ms=float("inf")))
    with pytest.raises(PlanError, match=r"^plan: predicted\.latency_ms: inf is not a finite"):
        check_plan_types(bad, "plan")
    bad = dataclasses.replace(plan, link=dataclasses.replace(plan.link, up_mbps=-1.0))
    with pytest.raises(PlanError, match=r"^plan: link\.up_mbps: -1\.0 is negative$"):
        check_plan_types(bad, "plan")
    bad = dataclasses.replace(plan, link=7)
    with pytest.raises(PlanError, match="^plan: link: expected a network link, got 7$"):
        check_plan_types(bad, "plan")
    acc = copy.deepcopy(plan.accuracy)
    bad = dataclasses.replace(
        plan, accuracy=dataclasses.replace(acc, calibration=CalibrationRecord(method="vibes"))
    )
    with pytest.raises(PlanError, match="^plan: accuracy.calibration.method: expected one of"):
        check_plan_types(bad, "plan")
