"""Hostile inputs, the corpus: device specs, profiles, plans, bundles and run inputs (issue 12), one
case each, with the expectations of test_artifacts.py (exit code 2, one line naming the file and the
problem, nothing left behind, no hang)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from artifact_kit import (  # noqa: F401 - the fixtures bundle, w
    SPEC,
    bundle_fixture,
    cli,
    manifest_of,
    nothing_written,
    npy,
    partition,
    refused,
    run,
    sha,
    w_fixture,
    write_json,
)

pytestmark = pytest.mark.timeout(120)


SPECS = {
    "nan": (
        SPEC.replace("peak_gflops: 50", "peak_gflops: .nan"),
        "peak_gflops: nan is not a finite number",
    ),
    "inf": (
        SPEC.replace("mem_bandwidth_gbps: 10", "mem_bandwidth_gbps: .inf"),
        "inf is not a finite number",
    ),
    "huge_int": (SPEC.replace("active_w: 2", "active_w: 1" + "0" * 400), "active_w"),
    "negative_power": (
        SPEC.replace("active_w: 2", "active_w: -3"),
        "active_w: -3 is less than the minimum",
    ),
    "wrong_type": (
        SPEC.replace("peak_gflops: 50", "peak_gflops: fast"),
        "'fast' is not of type 'number'",
    ),
    "unknown_key": (
        SPEC.replace("kind: cpu\n", "kind: cpu\n    turbo: true\n", 1),
        "'turbo' was unexpected",
    ),
    "deep": (
        SPEC.replace(
            "{runtime: ort}", "{runtime: ort, options: {a: " + "[" * 60 + "]" * 60 + "}}", 1
        ),
        "nested more than 32 deep",
    ),
    "very_deep": (
        "name: x\nkind: device\nx: " + "[" * 5000 + "]" * 5000 + "\n",
        "nested too deeply",
    ),
    "ten_mb": (
        "name: x\nkind: device\ndescription: " + "x" * (10 << 20) + "\n",
        "more than a device spec may hold",
    ),
    "non_utf8": (b"name: \xff\xfe\nkind: device\n", "not a text file"),
    "a_small_alias": (SPEC + "servers: &s [a]\n", "anchors and aliases"),
    "top_is_a_list": ("- a\n- b\n", "expected a mapping at the top"),
    "empty": ("", "expected a mapping at the top"),
    "huge_core_number": (
        SPEC.replace("kind: cpu\n", "kind: cpu\n    cores: [99999999]\n", 1),
        "99999999 is greater than the maximum",
    ),
    "bad_yaml": ("name: [unclosed\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", SPECS)
def test_a_hostile_device_spec_is_one_line(w, tmp_path, case):
    text, needle = SPECS[case]
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(text if isinstance(text, bytes) else text.encode())
    with nothing_written(tmp_path):
        refused(partition(w, tmp_path, spec=spec), needle, file=spec)


def test_a_spec_that_is_a_directory_or_missing_or_a_fifo(w, tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    refused(
        partition(w, tmp_path, spec=tmp_path / "dir.yaml"),
        "is a directory",
        file=tmp_path / "dir.yaml",
    )
    refused(partition(w, tmp_path, spec=tmp_path / "none.yaml"), "no such device spec file")
    os.mkfifo(tmp_path / "fifo.yaml")  # nobody writes: reading it would wait forever
    refused(
        partition(w, tmp_path, spec=tmp_path / "fifo.yaml"),
        "not a regular file",
        file=tmp_path / "fifo.yaml",
    )


# ---- profiles


def _profile(w, edit) -> dict:
    prof = json.loads(w["profile"].read_text())
    edit(prof)
    return prof


def _set_node(field, value):
    def edit(prof):
        prof["entries"][0]["nodes"]["conv"][field] = value

    return edit


PROFILES = {
    "nan_literal": (lambda p: None, "NaN is not a number JSON allows"),
    "inf_literal": (lambda p: None, "Infinity is not a number JSON allows"),
    "overflow": (lambda p: None, "1e999 is not a finite number"),
    "wrong_model_hash": (
        lambda p: p.update(model_sha256="0" * 64),
        "the profile is for model 000000000000",
    ),
    "unknown_backend": (
        lambda p: p["entries"][0].update(backend="cuda-magic"),
        "unknown backend cuda-magic",
    ),
    "negative_p90": (_set_node("p90_ms", -1), "p90_ms: -1 is negative"),
    "bool_latency": (_set_node("latency_ms", True), "expected a number, got True"),
    "negative_runs": (_set_node("runs", -5), "runs: -5 is negative"),
    "fraction_runs": (_set_node("runs", 2.5), "runs: expected an integer"),
    "node_not_an_object": (
        lambda p: p["entries"][0]["nodes"].update(conv=[1, 2]),
        "not a valid profile",
    ),
    "missing_entries_key": (
        lambda p: p.pop("entries"),
        "not a valid profile (KeyError: 'entries')",
    ),
    "top_is_a_list": (lambda p: None, "top level is list"),
    "truncated": (lambda p: None, "not a JSON profile"),
    "wrong_format_version": (lambda p: p.update(format_version=99), "profile format version 99"),
    "negative_input_dim": (
        lambda p: p.update(input_shapes={"x": [1, -3, 8, 8]}),
        "input_shapes.x: -3 is negative",
    ),
}


@pytest.mark.parametrize("case", PROFILES)
def test_a_hostile_profile_is_one_line(w, tmp_path, case):
    edit, needle = PROFILES[case]
    text = json.dumps(_profile(w, edit))
    if case == "nan_literal":
        text = text.replace('"latency_ms": 0.01', '"latency_ms": NaN', 1)
    elif case == "inf_literal":
        text = text.replace('"latency_ms": 0.01', '"latency_ms": -Infinity', 1)
    elif case == "overflow":
        text = text.replace('"latency_ms": 0.01', '"latency_ms": 1e999', 1)
    elif case == "top_is_a_list":
        text = "[" + text + "]"
    elif case == "truncated":
        text = text[: len(text) // 2]
    path = write_json(tmp_path / "p.json", text)
    with nothing_written(tmp_path):
        refused(partition(w, tmp_path, profile=path), needle, file=path)


def test_a_huge_profile_is_refused_before_it_is_read(w, tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(300 << 20)  # sparse: costs no disk, and is never read
    refused(partition(w, tmp_path, profile=path), "more than a profile may hold", file=path)


def test_a_profile_missing_entries_is_completed_by_prediction(w, tmp_path):
    """Expected: accepted (exit 0); processors without an entry are predicted from the spec."""
    path = write_json(tmp_path / "p.json", _profile(w, lambda p: p["entries"].pop(1)))
    assert partition(w, tmp_path, profile=path)[0] == 0
    assert "Infinity" not in (tmp_path / "plan.json").read_text()


# ---- plans


def _plan(w, edit) -> dict:
    plan = json.loads(w["plan"].read_text())
    edit(plan)
    return plan


def _cycle(plan):
    plan["parts"][0]["inputs"].append(plan["parts"][1]["outputs"][0])


def _twice(plan):
    plan["parts"][1]["nodes"].append(plan["parts"][0]["nodes"][0])


def _missing(plan):
    plan["parts"][1]["nodes"].pop()
    plan["parts"][1]["outputs"] = []


PLANS = {
    "slash_in_name": (lambda p: p["parts"][0].update(name="a/b"), "is not a valid name"),
    "duplicate_names": (
        lambda p: p["parts"][1].update(name=p["parts"][0]["name"]),
        "two parts are named p0",
    ),
    "cycle": (_cycle, "the parts depend on each other in a cycle (p0 -> p1 -> p0)"),
    "unknown_node": (
        lambda p: p["parts"][0]["nodes"].append("ghost"),
        "names nodes the model lacks: ghost",
    ),
    "unknown_processor": (
        lambda p: p["parts"][0].update(processor="npu9"),
        "runs on processor npu9",
    ),
    "unknown_tensor": (
        lambda p: p["parts"][1]["inputs"].append("ghost_t"),
        "names tensors the model lacks",
    ),
    "node_twice": (_twice, "node conv is in two parts"),
    "node_in_no_part": (_missing, "node(s) of the model are in no part: mul"),
    "no_parts": (lambda p: p.update(parts=[]), "the plan has no parts"),
    "negative_latency": (
        lambda p: p["parts"][0].update(latency_ms=-1e6),
        "latency_ms: -1000000.0 is negative",
    ),
    "string_nbytes": (
        lambda p: p.update(
            transfers=[
                {
                    "tensor": "r",
                    "nbytes": "lots",
                    "src_part": "p0",
                    "dst_part": "p1",
                    "src_processor": "cpu",
                    "dst_processor": "cpu2",
                    "latency_ms": 1,
                    "energy_mj": 1,
                }
            ]
        ),
        "nbytes: expected an integer",
    ),
    "nan_predicted": (lambda p: None, "NaN is not a number JSON allows"),
    "zero_slo": (lambda p: p.update(slo_ms=0), "slo_ms: must be positive"),
    "wrong_format_version": (lambda p: p.update(format_version=7), "plan format version 7"),
    "assignment_not_a_mapping": (
        lambda p: p.update(assignment={"conv": 5}),
        "not a valid plan (TypeError",
    ),
    "link_not_numbers": (
        lambda p: p.update(link={"up_mbps": "fast"}),
        "link.up_mbps: expected a number",
    ),
    "output_not_written": (
        lambda p: p["parts"][0]["outputs"].append("w"),
        "lists outputs its nodes do not write: w",
    ),
    "unknown_precision": (
        lambda p: p["parts"][0].update(precision="int4"),
        "precision: int4 is not one of",
    ),
    "precision_not_the_backends": (
        lambda p: p["parts"][0].update(precision="int8"),
        "part p0 says int8, but ort on cpu runs fp32",
    ),
    "accuracy_not_an_object": (lambda p: p.update(accuracy=[1, 2]), "accuracy: expected an object"),
    "accuracy_nan_snr": (
        lambda p: p.update(
            accuracy={"measured": {"snr_db": "loud", "cosine": 1, "max_abs_error": 0}}
        ),
        "accuracy.measured: snr_db: expected a number",
    ),
    "calibration_path_not_a_string": (
        lambda p: p.update(accuracy={"calibration": {"path": 7}}),
        "accuracy.calibration.path: expected a string",
    ),
    "calibration_method_unknown": (
        lambda p: p.update(accuracy={"calibration": {"method": "vibes"}}),
        "accuracy.calibration.method: expected one of minmax, percentile, entropy, got vibes",
    ),
    "calibration_method_not_a_string": (
        lambda p: p.update(accuracy={"calibration": {"method": ["minmax"]}}),
        "accuracy.calibration.method: expected one of",
    ),
}


@pytest.mark.parametrize("case", PLANS)
def test_a_hostile_plan_is_one_line(w, tmp_path, case):
    edit, needle = PLANS[case]
    text = json.dumps(_plan(w, edit))
    if case == "nan_predicted":
        text = text.replace('"predicted": {}', '"predicted": {"latency_ms": NaN}')
        assert "NaN" in text
    path = write_json(tmp_path / "plan.json", text)
    with nothing_written(tmp_path):
        refused(
            cli("compile", w["model"], "--plan", path, "-o", tmp_path / "out"), needle, file=path
        )


# ---- bundles


def _edit_manifest(edit):
    def apply(bundle: Path) -> None:
        doc = manifest_of(bundle)
        edit(doc, bundle)
        write_json(bundle / "manifest.json", doc)

    return apply


def _outside(doc, bundle):
    (bundle.parent / "evil.onnx").write_bytes((bundle / "parts" / "p1.onnx").read_bytes())
    doc["files"]["../evil.onnx"] = sha(bundle.parent / "evil.onnx")
    doc["parts"][1]["onnx_file"] = doc["parts"][1]["file"] = "../evil.onnx"


def _fifo(bundle):
    (bundle / "parts" / "p1.onnx").unlink()
    os.mkfifo(bundle / "parts" / "p1.onnx")  # nobody writes: a blocking read would never end


BUNDLES = {
    "file_outside": (_edit_manifest(_outside), "file path '../evil.onnx' leaves the bundle"),
    "absolute_file": (
        _edit_manifest(lambda d, b: d["files"].update({"/etc/passwd": "0" * 64})),
        "leaves the bundle",
    ),
    "missing_file": (
        lambda b: (b / "parts" / "p1.onnx").unlink(),
        "p1.onnx: missing from the bundle",
    ),
    "edited_file": (
        lambda b: (b / "parts" / "p1.onnx").write_bytes(b"\x08\x07junk"),
        "p1.onnx: checksum mismatch",
    ),
    "fifo_part": (_fifo, "p1.onnx: not a regular file"),
    "directory_part": (
        lambda b: ((b / "parts" / "p1.onnx").unlink(), (b / "parts" / "p1.onnx").mkdir()),
        "not a regular file",
    ),
    "unlisted_file": (
        _edit_manifest(lambda d, b: d["files"].pop("parts/p1.onnx")),
        "which the manifest has no checksum for",
    ),
    "wrong_format_version": (
        _edit_manifest(lambda d, b: d.update(format_version=2)),
        "manifest format version 2",
    ),
    "cycle": (_edit_manifest(lambda d, b: d["parts"][0].update(depends_on=["p1"])), "in a cycle"),
    "depends_on_itself": (
        _edit_manifest(lambda d, b: d["parts"][0].update(depends_on=["p0"])),
        "in a cycle (p0 -> p0)",
    ),
    "reads_an_unwritten_tensor": (
        _edit_manifest(lambda d, b: d["parts"][1]["inputs"][0].update(name="ghost")),
        "reads tensor ghost, which no part writes",
    ),
    "producer_shape_differs": (
        _edit_manifest(lambda d, b: d["parts"][1]["inputs"][0].update(shape=[1, 2])),
        "here but float32",
    ),
    "output_written_by_none": (
        _edit_manifest(lambda d, b: d["outputs"][0].update(name="nowhere")),
        "model output nowhere is written by no part",
    ),
    "object_dtype": (
        _edit_manifest(lambda d, b: d["inputs"][0].update(dtype="object")),
        "here but object",
    ),
    "huge_tensor": (
        _edit_manifest(lambda d, b: d["inputs"][0].update(shape=[1 << 20, 1 << 20])),
        "over 4 GiB",
    ),
    "negative_dim": (
        _edit_manifest(lambda d, b: d["inputs"][0].update(shape=[1, -3])),
        "-3 is negative",
    ),
    "part_name_traversal": (
        _edit_manifest(lambda d, b: d["parts"][0].update(name="../p0")),
        "is not a valid name",
    ),
    "threads_as_string": (
        _edit_manifest(lambda d, b: d["parts"][0].update(threads="8")),
        "threads: expected an integer",
    ),
    "quota_over_100": (
        _edit_manifest(lambda d, b: d["parts"][0].update(cpu_quota_pct=250)),
        "cpu_quota_pct: 250",
    ),
    "unknown_precision": (
        _edit_manifest(lambda d, b: d["parts"][0].update(precision="bf8")),
        "part p0: precision: bf8 is not one of",
    ),
    "not_json": (lambda b: (b / "manifest.json").write_text("{not json"), "not a JSON manifest"),
    "missing_manifest": (lambda b: (b / "manifest.json").unlink(), "missing; "),
    "missing_key": (
        _edit_manifest(lambda d, b: d.pop("inputs")),
        "malformed manifest (KeyError: 'inputs')",
    ),
}


@pytest.mark.parametrize("case", BUNDLES)
def test_a_hostile_bundle_is_one_line(bundle, case):
    edit, needle = BUNDLES[case]
    edit(bundle)
    with nothing_written(bundle.parent):
        refused(run(bundle), needle, file=bundle)


def test_a_bundle_path_that_is_a_file_or_missing(tmp_path):
    (tmp_path / "f").write_text("x")
    refused(run(tmp_path / "f"), "no such bundle directory", file=tmp_path / "f")
    refused(run(tmp_path / "none"), "no such bundle directory")


# ---- run inputs


def _input_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    x = np.zeros((1, 3, 8, 8), np.float32)
    (tmp / "text.npy").write_text("not an array")
    os.mkfifo(tmp / "fifo.npy")
    huge = tmp / "huge.npy"  # a header claiming 4 TB of float32, and no data
    with open(huge, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)}
        )
    return {
        "wrong_shape": (
            [f"x={npy(tmp / 's.npy', x[:, :, :4])}"],
            "input 'x': shape (1, 3, 4, 8), expected (1, 3, 8, 8)",
        ),
        "wrong_dtype": (
            [f"x={npy(tmp / 'd.npy', x.astype(np.float64))}"],
            "input 'x': dtype float64, expected float32",
        ),
        "pickle": ([f"x={npy(tmp / 'p.npy', np.array([{'a': 1}], dtype=object))}"], "a pickle"),
        "not_a_npy": ([f"x={tmp / 'text.npy'}"], "not a .npy array"),
        "missing_file": ([f"x={tmp / 'none.npy'}"], "cannot read the input"),
        "unknown_name": (
            [f"nope={npy(tmp / 'n.npy', x)}"],
            "the bundle has no input 'nope' (inputs: x)",
        ),
        "no_equals": (["x"], "--input 'x' is not NAME=FILE.npy"),
        "fifo": ([f"x={tmp / 'fifo.npy'}"], "not a regular file"),
        "directory": ([f"x={tmp}"], f"{tmp}: is a directory, not a .npy file"),
        "huge_header": ([f"x={huge}"], "shape (1048576, 1048576), expected (1, 3, 8, 8)"),
        "truncated": ([f"x={tmp / 't.npy'}"], "not a readable .npy array"),
    }


INPUTS = [
    "wrong_shape",
    "wrong_dtype",
    "pickle",
    "not_a_npy",
    "missing_file",
    "unknown_name",
    "no_equals",
    "fifo",
    "directory",
    "huge_header",
    "truncated",
]


@pytest.mark.parametrize("case", INPUTS)
def test_a_hostile_run_input_is_one_line(bundle, tmp_path, case):
    good = npy(tmp_path / "good.npy", np.zeros((1, 3, 8, 8), np.float32))
    (tmp_path / "t.npy").write_bytes(good.read_bytes()[:-40])
    specs, needle = _input_cases(tmp_path)[case]
    args = [a for s in specs for a in ("--input", s)]
    refused(run(bundle, *args, "-o", tmp_path / "outs"), needle)
    assert not (tmp_path / "outs").exists()
    assert run(bundle, "--input", f"x={good}")[0] == 0  # the control
