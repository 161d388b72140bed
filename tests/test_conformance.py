"""ONNX's own backend test models through edgesplit's whole pipeline (``tests/conformance_kit.py``).

Each model is loaded, profiled and partitioned on ``host-2core`` with its nodes pinned in up to
three alternating runs (so it is cut and op types cross part boundaries), compiled, run, and its
outputs compared with the outputs ONNX ships beside it, at the case's tolerances. The whole set
(2,000 models, about 40 minutes here) runs in ``benchmarks/conformance.py``; the suite runs a
fixed, seeded sample: a few node case modules (at most :data:`PER_MODULE` cases of each) and a
few cases of every other folder, quick ones in the quick subset and the rest marked ``slow``
(about 1 s a model), and every model of the known-failures file.

``tests/conformance_known_failures.txt`` lists the models that ONNX Runtime passes and edgesplit
does not, one line each (model, stage, reason). It can only shrink: a listed model that passes,
or fails at another stage, fails the test until its line is removed or changed. A model that ORT
fails too is not required to pass.
"""

from __future__ import annotations

import random
from pathlib import Path

import conformance_kit as kit
import pytest

SEED = 37
PER_MODULE = 3
QUICK = {"simple": 1, "pytorch-operator": 1}
SLOW = {"node": 15, "simple": 7, "pytorch-converted": 10, "pytorch-operator": 5}
REAL = ("test_squeezenet",)  # the other real models take 5 to 60 s each here


def _known_units() -> dict[tuple[str, str], None]:
    """The units that hold a known failure: each is run, so that a line cannot outlive its
    failure."""
    out: dict[tuple[str, str], None] = {}
    for key in kit.known_failures():
        folder, name = key.split("/", 1)
        out[(folder, kit.node_module_of(name) if folder == "node" else name) or "?"] = None
    return out


def _sample() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    rng = random.Random(SEED)
    quick, slow = [], []
    for folder in kit.FOLDERS:
        if folder == "real":
            slow += [(folder, u) for u in REAL]
            continue
        units = kit.units(folder)
        picked = rng.sample(units, min(len(units), QUICK.get(folder, 0) + SLOW.get(folder, 0)))
        n = QUICK.get(folder, 0)
        quick += [(folder, u) for u in picked[:n]]
        slow += [(folder, u) for u in picked[n:]]
    slow += [u for u in _known_units() if u not in quick and u not in slow]
    return sorted(quick), sorted(slow)


QUICK_UNITS, SLOW_UNITS = _sample()


def _cases(folder: str, unit: str, known: dict) -> list[kit.Case]:
    """A unit's cases: a data folder's one case, or a node module's known failures and at most
    :data:`PER_MODULE` of its other cases (seeded)."""
    if folder != "node":
        return [kit.data_case(folder, unit)]
    found = kit.cases("node", [unit])
    listed = [c for c in found if c.key in known]
    others = [c for c in found if c.key not in known]
    return listed + random.Random(f"{SEED}/{unit}").sample(others, min(PER_MODULE, len(others)))


def _check(folder: str, unit: str, tmp_path: Path) -> None:
    known = kit.known_failures()
    problems = []
    for case in _cases(folder, unit, known):
        out = kit.run_edgesplit(case, tmp_path / case.name)
        listed = known.get(case.key)
        if listed is not None:
            if out.stage == "pass":
                problems.append(
                    f"{case.key} passes now: remove its line from {kit.KNOWN_FAILURES.name}"
                )
            elif out.stage != listed[0]:
                problems.append(
                    f"{case.key} fails at {out.stage}, listed at {listed[0]}: {out.reason}"
                )
        elif out.stage != "pass":
            ort = kit.run_ort(case)
            if ort[0] == "pass":
                problems.append(
                    f"{case.key}: ONNX Runtime passes it, edgesplit fails at {out.stage}: "
                    f"{out.reason}"
                )
        elif len(case.model.graph.node) > 1 and out.parts < 2:
            problems.append(
                f"{case.key}: {len(case.model.graph.node)} nodes in {out.parts} part: not cut"
            )
    assert not problems, "\n".join(problems)


def _id(unit: tuple[str, str]) -> str:
    return "/".join(unit)


@pytest.mark.parametrize("unit", QUICK_UNITS, ids=_id)
def test_backend_models_match_onnx_quick(unit, tmp_path):
    _check(*unit, tmp_path)


def _slow_suite(units: list[tuple[str, str]]) -> type:
    """A class of slow tests over ``units``: pytest-xdist (``--dist loadscope``) hands out each
    class
    as a unit of its own, so the sample spreads over the workers instead of holding one."""

    class Suite:
        @pytest.mark.slow
        @pytest.mark.parametrize("unit", units, ids=_id)
        def test_backend_models_match_onnx(self, unit, tmp_path):
            _check(*unit, tmp_path)

    return Suite


_NODE = [u for u in SLOW_UNITS if u[0] == "node"]
TestNodeModelsA = _slow_suite(_NODE[: len(_NODE) // 2])
TestNodeModelsB = _slow_suite(_NODE[len(_NODE) // 2 :])
TestOtherModels = _slow_suite([u for u in SLOW_UNITS if u[0] not in ("node", "real")])
TestRealModels = _slow_suite([u for u in SLOW_UNITS if u[0] == "real"])


def test_the_known_failures_file_names_real_models_stages_and_reasons():
    known = kit.known_failures()
    problems = []
    for key in known:
        folder, name = key.split("/", 1)
        if folder not in kit.FOLDERS:
            problems.append(f"{key}: no folder {folder} (folders: {', '.join(kit.FOLDERS)})")
        elif folder == "node":
            if kit.node_module_of(name) is None:
                problems.append(f"{key}: no node case module defines it")
        elif name not in kit.units(folder):
            problems.append(f"{key}: no such case in {folder}")
    assert not problems, "\n".join(problems)
    assert list(known) == sorted(known), "keep the file sorted by model"


@pytest.mark.slow
def test_a_listed_model_that_passes_fails_the_test(tmp_path, monkeypatch):
    """The file can only shrink: listing a model that passes is a failure, named."""
    fake = tmp_path / "known.txt"
    fake.write_text("simple/test_single_relu_model  compile  pretend it fails\n")
    monkeypatch.setattr(kit, "KNOWN_FAILURES", fake)
    monkeypatch.setattr(kit.known_failures, "__defaults__", (fake,))
    with pytest.raises(AssertionError, match="test_single_relu_model passes now: remove its line"):
        _check("simple", "test_single_relu_model", tmp_path)
