"""Plans per phase: the pricing on a synthetic profile, the CLI, and predicted vs measured."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from edgesplit.cli.main import cli
from edgesplit.errors import InputError
from edgesplit.generate.phases import (
    PhaseProfile,
    ProcessorPhases,
    all_candidates,
    choose_phases,
    decode_lengths,
    price,
)

FAST_PREFILL = ProcessorPhases("npu", 2.0, {16: 2.0, 32: 3.0}, ((40, 9.0), (80, 11.0)))
FAST_DECODE = ProcessorPhases("cpu", 1.0, {16: 10.0, 32: 19.0}, ((40, 1.0), (80, 3.0)))


def profile(copy_gbps: float = 1.0, per_token: int = 100_000) -> PhaseProfile:
    return PhaseProfile("toy", "dev", 40, 9, per_token, copy_gbps, (FAST_PREFILL, FAST_DECODE))


def test_price_formulas():
    c = price(profile(), "npu", 16, "cpu")
    assert c.ttft_ms == pytest.approx(3 * 2.0)  # ceil(40 / 16) chunks
    slots = 48  # 40 padded to whole chunks of 16
    steps = [1.0 + 2.0 * (slots + i - 40) / 40 for i in range(8)]  # N - 1 = 8 steps
    assert c.decode_ms == pytest.approx(sum(steps))
    assert c.switch_nbytes == slots * 100_000
    assert c.switch_ms == pytest.approx(slots * 100_000 / 1e9 * 1e3)
    assert c.total_ms == pytest.approx(c.ttft_ms + c.switch_ms + c.decode_ms)
    assert c.energy_mj == pytest.approx(c.ttft_ms * 2.0 + (c.switch_ms + c.decode_ms) * 1.0)
    assert c.decode_tokens_per_s == pytest.approx(8 / (c.decode_ms / 1e3))
    same = price(profile(), "cpu", 16, "cpu")
    assert same.switch_ms == 0 and same.switch_nbytes == 0


def test_decode_interpolation_is_flat_beyond_measured():
    assert FAST_DECODE.decode_ms_at(60) == pytest.approx(2.0)
    assert FAST_DECODE.decode_ms_at(10) == 1.0
    assert FAST_DECODE.decode_ms_at(500) == 3.0


@pytest.mark.parametrize("copy_gbps", [1e-3, 0.05, 1.0, 100.0])
def test_choice_is_the_brute_force_minimum_and_switch_is_charged(copy_gbps):
    prof = profile(copy_gbps)
    plan = choose_phases(prof)
    brute = min(
        (
            price(prof, a, k, b)
            for a, b in itertools.product(("npu", "cpu"), repeat=2)
            for k in (16, 32)
        ),
        key=lambda c: c.total_ms,
    )
    assert plan.chosen.total_ms == pytest.approx(brute.total_ms)
    assert len(plan.candidates) == len(all_candidates(prof)) == 8
    if copy_gbps >= 1.0:  # a cheap move: prefill on npu, decode on cpu
        assert (plan.chosen.prefill_processor, plan.chosen.decode_processor) == ("npu", "cpu")
    if copy_gbps == 1e-3:  # moving 4.8 MB at 1 MB/s costs seconds: stay on one processor
        assert plan.chosen.single_processor


def test_unknown_processor_and_chunk_refused():
    with pytest.raises(InputError):
        price(profile(), "gpu", 16, "cpu")
    with pytest.raises(InputError):
        price(profile(), "npu", 64, "cpu")


def test_decode_lengths_cover_the_padded_cache():
    assert decode_lengths(40, 9, (16, 32)) == (40, 44, 73)


def _save_small(tmp_path):
    from edgesplit.model.zoo_decoder import decoder_tiny

    path = tmp_path / "dec.onnx"
    onnx.save(decoder_tiny(), path)
    return path


@pytest.mark.measures
@pytest.mark.slow
def test_cli_writes_a_phase_plan(tmp_path):
    path = _save_small(tmp_path)
    out = tmp_path / "phases.json"
    args = ["partition", str(path), "--device", "host-biglittle", "--generate"]
    args += ["--prompt-tokens", "20", "--new-tokens", "6", "-o", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "chosen:" in r.output and "TTFT ms" in r.output
    data = json.loads(out.read_text())
    assert data["format"] == "edgesplit-phase-plan/1"
    totals = [c["total_ms"] for c in data["candidates"]]
    assert data["chosen"]["total_ms"] == min(totals)
    procs = {p["processor"] for p in data["profile"]["processors"]}
    assert {"big", "little"} <= procs
    chunk_counts = {len(p["prefill_chunk_ms"]) for p in data["profile"]["processors"]}
    assert chunk_counts == {1}  # only chunk 16 fits 20 tokens


def test_cli_refuses_a_non_decoder(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(g), path)
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "edgesplit", "partition", str(path), "--device", "host-biglittle",
         "--generate", "-o", str(tmp_path / "p.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a decoder" in lines[0] and str(path) in lines[0]
    assert not (tmp_path / "p.json").exists()


@pytest.mark.measures
@pytest.mark.slow
def test_predicted_vs_measured_on_host():
    from edgesplit.device.spec import load_device
    from edgesplit.generate.phase_measure import (
        MeasureOptions,
        measure_phases,
        open_runner,
        phase_processors,
        random_prompt,
        run_phases,
    )
    from edgesplit.model.zoo_decoder import config_of, decoder_small

    model, spec = decoder_small(), load_device("host-biglittle")
    opts = MeasureOptions(repeats=3, processors=("big",))
    plan = choose_phases(measure_phases(model, spec, (48, 12), opts))
    c = plan.chosen
    runner = open_runner(phase_processors(spec, ("big",))[0], model)
    try:
        gen = runner.generator(model, c.chunk_tokens)
        prompt = random_prompt(config_of(model).vocab_size, 48)
        runs = [run_phases((runner, gen), (runner, gen), prompt, 12) for _ in range(3)]
    finally:
        runner.close()
    measured = float(np.median([r.total_ms for r in runs]))
    # generous: another job may share this machine's two cores
    assert c.total_ms / 3 <= measured <= c.total_ms * 3, (c.total_ms, measured)
    assert all(len(r.tokens) == 12 for r in runs)
    assert not math.isnan(measured)
