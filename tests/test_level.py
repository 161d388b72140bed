"""Leveling: the processors' whole-model times measured again in alternating rounds, so that a
block profiled in a slow phase of the machine does not make its processor look slower."""

from __future__ import annotations

import contextlib
import re

import pytest

from edgesplit.device.spec import load_device
from edgesplit.model import zoo
from edgesplit.model.load import load_model
from edgesplit.profile import level as leveling
from edgesplit.profile.backends import PROFILERS
from edgesplit.profile.run import ProfileOptions, profile_model
from edgesplit.profile.store import MEASURED, PREDICTED, NodeCost, ProcessorProfile

TRUE_MS = 10.0


class DriftingMachine:
    """Every processor takes TRUE_MS x the machine's speed factor, which changes with the round:
    slow (1.5x) in the first two, fast after. Records who ran in which round."""

    def __init__(self):
        self.calls: list[tuple[int, str]] = []
        self.round = 0

    @contextlib.contextmanager
    def whole_model_timer(self, graph, processor, backend):
        def timed() -> float:
            self.calls.append((self.round, processor.name))
            return TRUE_MS * (1.5 if self.round < 2 else 1.0)

        yield timed


def _entry(
    proc: str, whole_ms: float, backend: str = "ort", source: str = MEASURED
) -> ProcessorProfile:
    return ProcessorProfile(
        proc, backend, source, {"n": NodeCost(whole_ms, whole_ms, source, 1.0, 3)}, {}, whole_ms
    )


@pytest.fixture
def machine(monkeypatch):
    m = DriftingMachine()
    monkeypatch.setitem(PROFILERS, "ort", m)
    rounds = iter(range(1, 100))

    def progress(label, done, total):  # a round ends when every leveled pair has run in it
        assert label == "level"
        if done % 2 == 0:
            m.round = next(rounds)

    return m, progress


def test_blocks_measured_in_different_phases_come_out_level(machine):
    """core0's block fell in a slow phase (15 ms), core1's in a fast one (10 ms): both are the same
    processor really, and leveled they agree; each round runs both, in rotated order."""
    m, progress = machine
    device = load_device("host-2core")
    out = leveling.level(None, device, [_entry("core0", 15.0), _entry("core1", 10.0)], 20, progress)
    assert out[0].whole_model_ms == out[1].whole_model_ms
    assert "15.000 ms in its block" in out[0].note and "leveled (20 runs)" in out[0].note
    firsts = [next(p for r, p in m.calls if r == k) for k in range(leveling.ROUNDS)]
    assert set(firsts) == {"core0", "core1"}  # the order rotates
    for k in range(leveling.ROUNDS):
        assert {p for r, p in m.calls if r == k} == {"core0", "core1"}


def test_only_one_measured_pair_per_processor_is_leveled(machine):
    """A second pair on core0 shares its cores (left as measured); predicted pairs are left; with
    one processor left to level there is nothing to level against."""
    _, progress = machine
    device = load_device("host-2core")
    entries = [
        _entry("core0", 15.0),
        _entry("core0", 12.0, "ort-int8"),
        _entry("core1", 10.0, source=PREDICTED),
    ]
    assert leveling.level(None, device, entries, 20, progress) == tuple(entries)


@pytest.mark.slow
def test_a_real_profile_is_leveled_on_both_cores(tmp_path):
    graph = load_model(zoo.save("tiny_dag", tmp_path / "tiny_dag.onnx"))
    prof = profile_model(
        graph, load_device("host-2core"), ProfileOptions(backends=("ort",), runs=5, warmup=1)
    )
    for e in prof.entries:
        block, leveled = map(
            float, re.search(r"([\d.]+) ms in its block, ([\d.]+) ms leveled", e.note).groups()
        )
        assert e.whole_model_ms == pytest.approx(leveled, abs=1e-3) and block > 0
