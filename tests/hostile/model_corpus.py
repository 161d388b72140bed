"""The hostile model corpus (tests/hostile/test_models.py): each case builds its model in code
and states its outcome, ``refused`` (``edgesplit partition`` exits 2 with one line that names the
file and ``expect``) or ``loads`` (``load_model`` returns a graph, and ``check`` holds on it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from conftest import make_model, rand
from model_builders import control_flow_model, nested_model, old_cnn
from onnx import TensorProto, helper, numpy_helper


def _relu(opset: int = 17) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [("x", [1, 4])],
        [("y", [1, 4])],
        opset=opset,
    )


def _save(m: onnx.ModelProto, d: Path, name: str) -> Path:
    p = d / f"{name}.onnx"
    onnx.save(m, p)
    return p


def external_data_model(
    d: Path, name: str, location: str, *, nbytes: int = 64, length: int | None = None
) -> Path:
    """A model whose weight 'w' (16 floats) lives in external data at ``location``."""
    w = numpy_helper.from_array(rand(1, 16), "w")
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    w.external_data.add(key="offset", value="0")
    w.external_data.add(key="length", value=str(nbytes if length is None else length))
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], [("x", [1, 16])], [("y", [1, 16])]
    )
    m.graph.initializer.append(w)
    p = d / f"{name}.onnx"
    p.write_bytes(m.SerializeToString())
    return p


# ---- builders: each writes its model (and any side files) into a folder and returns the path


def garbage(d):
    p = d / "garbage.onnx"
    p.write_bytes(b"\x00\xffthis is not a protobuf\xff" * 20)
    return p


def truncated(d):
    data = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="a")],
        [("x", [1, 5000])],
        [("y", [1, 5000])],
        [("w", rand(1, 5000))],
    ).SerializeToString()
    p = d / "truncated.onnx"
    p.write_bytes(data[: len(data) // 2])
    return p


def empty(d):
    p = d / "empty.onnx"
    p.write_bytes(b"")
    return p


def directory(d):
    p = d / "folder.onnx"
    p.mkdir()
    return p


def zero_nodes(d):
    return _save(make_model([], [("x", [1, 4])], [("x", [1, 4])]), d, "zero_nodes")


def output_is_input(d):
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [("x", [1, 4])],
        [("y", [1, 4]), ("x", [1, 4])],
    )
    return _save(m, d, "output_is_input")


def output_is_weight(d):
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [("x", [1, 4])],
        [("y", [1, 4]), ("w", [1, 4])],
        [("w", rand(1, 4))],
    )
    return _save(m, d, "output_is_weight")


def opset_999(d):
    return _save(_relu(opset=999), d, "opset999")


def ml_opset_99(d):
    m = _relu()
    m.opset_import.append(helper.make_opsetid("ai.onnx.ml", 99))
    return _save(m, d, "ml_opset99")


def unknown_domain(d):
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")],
        [("x", [1, 4])],
        [("y", [1, 4])],
    )
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    return _save(m, d, "unknown_domain")


def unknown_op(d):
    return _save(
        make_model(
            [helper.make_node("FancyOp", ["x"], ["y"], name="f")], [("x", [1, 4])], [("y", [1, 4])]
        ),
        d,
        "unknown_op",
    )


def no_ort_kernel(d):
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])
    return _save(
        make_model([helper.make_node("Erf", ["x"], ["y"], name="erf64")], [x], [y]), d, "no_kernel"
    )


def duplicate_node_names(d):
    m = make_model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="same"),
            helper.make_node("Neg", ["a"], ["y"], name="same"),
        ],
        [("x", [1, 4])],
        [("y", [1, 4])],
    )
    return _save(m, d, "dup_nodes")


def duplicate_tensor_names(d):
    m = make_model(
        [
            helper.make_node("Relu", ["x"], ["y"], name="a"),
            helper.make_node("Neg", ["x"], ["y"], name="b"),
        ],
        [("x", [1, 4])],
        [("y", [1, 4])],
    )
    return _save(m, d, "dup_tensors")


def cycle(d):
    m = make_model(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
            helper.make_node("Relu", ["a"], ["b"], name="n2"),
            helper.make_node("Relu", ["a"], ["y"], name="n3"),
        ],
        [("x", [1, 4])],
        [("y", [1, 4])],
    )
    return _save(m, d, "cycle")


def dangling(d):
    m = make_model(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="a")], [("x", [1, 4])], [("y", [1, 4])]
    )
    return _save(m, d, "dangling")


def dangling_outer_read(d):
    then_g = helper.make_graph(
        [helper.make_node("Add", ["x", "ghost"], ["t"], name="then_add")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    m = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="iff")],
        [("x", [1, 4]), c],
        [("y", [1, 4])],
    )
    return _save(m, d, "dangling_outer")


def matmul_mismatch(d):
    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [("x", [1, 4])],
        [("y", [1, 5])],
        [("w", rand(3, 5))],
    )
    return _save(m, d, "matmul_mismatch")


def huge_input(d):
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [("x", [1, 3, 100000, 200000])],
        [("y", [1, 3, 100000, 200000])],
    )
    return _save(m, d, "huge_input")


def huge_intermediate(d):
    m = make_model(
        [
            helper.make_node(
                "Constant",
                [],
                ["s"],
                value=numpy_helper.from_array(np.array([100000, 100000, 100], np.int64)),
            ),
            helper.make_node("Expand", ["x", "s"], ["big"], name="expand"),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0, name="sum"),
        ],
        [("x", [1, 1, 1])],
        [("y", [])],
    )
    return _save(m, d, "huge_intermediate")


def zero_size_dim(d):
    return _save(
        make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")],
            [("x", [1, 0, 4])],
            [("y", [1, 0, 4])],
        ),
        d,
        "zero_dim",
    )


def negative_dim(d):
    return _save(
        make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, -3])], [("y", [1, 3])]
        ),
        d,
        "negative_dim",
    )


def string_input(d):
    x = helper.make_tensor_value_info("text", TensorProto.STRING, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [1, 2])
    m = make_model(
        [
            helper.make_node(
                "StringNormalizer",
                ["text"],
                ["y"],
                case_change_action="LOWER",
                locale="C.UTF-8",
                name="norm",
            )
        ],
        [x],
        [y],
    )
    return _save(m, d, "string_input")


def sequence_input(d):
    x = helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, [1, 4])
    m = make_model(
        [helper.make_node("ConcatFromSequence", ["xs"], ["y"], axis=0, name="cat")],
        [x],
        [("y", [2, 4])],
    )
    return _save(m, d, "sequence_input")


def map_input(d):
    m_type = helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
    )
    m = make_model(
        [helper.make_node("Identity", ["m"], ["y"], name="id")],
        [helper.make_value_info("m", m_type)],
        [helper.make_value_info("y", m_type)],
    )
    return _save(m, d, "map_input")


def bfloat16_input(d):
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 4])
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [x],
        [x.__class__(name="y", type=x.type)],
    )
    return _save(m, d, "bfloat16_input")


def external_missing(d):
    return external_data_model(d, "ext_missing", "weights.bin")


def external_outside(d):
    (d.parent / "outside.bin").write_bytes(rand(1, 16).tobytes())
    return external_data_model(d, "ext_outside", "../outside.bin")


def external_symlink_outside(d):
    (d.parent / "secret.bin").write_bytes(rand(1, 16).tobytes())
    (d / "link.bin").symlink_to(d.parent / "secret.bin")
    return external_data_model(d, "ext_symlink", "link.bin")


def external_absolute(d):
    return external_data_model(d, "ext_absolute", "/etc/passwd")


def external_short(d):
    (d / "short.bin").write_bytes(b"\0" * 8)
    return external_data_model(d, "ext_short", "short.bin", nbytes=8)


def external_over_limit(d):
    with open(d / "big.bin", "wb") as f:
        f.truncate(1_500_000_000)  # sparse: declared, never written
    return external_data_model(d, "ext_big", "big.bin", length=1_500_000_000)


def external_ok(d):
    (d / "w.bin").write_bytes(rand(1, 16).tobytes())
    return external_data_model(d, "ext_ok", "w.bin")


def value_dependent(d):
    s = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    m = make_model(
        [helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")], [("x", [1, 4]), s], [y]
    )
    return _save(m, d, "value_dependent")


def ir3_opset6(d):
    return _save(old_cnn(), d, "ir3_opset6")


def control_flow(d):
    return _save(control_flow_model(), d, "control_flow")


def nested(d):
    return _save(nested_model(), d, "nested")


def wide_node(d):
    m = make_model(
        [helper.make_node("Sum", ["x"] * 10_000, ["y"], name="sum")],
        [("x", [1, 4])],
        [("y", [1, 4])],
    )
    return _save(m, d, "wide")


def deep_chain(d):
    n = 10_000
    nodes = [
        helper.make_node(
            "Neg", ["x" if i == 0 else f"t{i}"], ["y" if i == n - 1 else f"t{i + 1}"], name=f"n{i}"
        )
        for i in range(n)
    ]
    return _save(make_model(nodes, [("x", [1, 4])], [("y", [1, 4])]), d, "deep")


def nan_weights(d):
    w = np.array([[np.nan, np.inf, -np.inf, 1.0]], np.float32)
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [("x", [1, 4])],
        [("y", [1, 4])],
        [("w", w)],
    )
    return _save(m, d, "nan_weights")


def endless_loop(d):
    """A Loop of 10^12 trips whose scan output's length only a run can tell: the run is stopped."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
            helper.make_node("Add", ["v_in", "x"], ["v_out"], name="body_add"),
            helper.make_node("Identity", ["v_out"], ["scan_out"], name="body_scan"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [1]),
        ],
    )
    m = make_model(
        [
            helper.make_node(
                "Constant", [], ["M"], value=numpy_helper.from_array(np.array(10**12, np.int64))
            ),
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
            helper.make_node("Loop", ["M", "c", "x"], ["final", "all"], body=body, name="forever"),
            helper.make_node("ReduceSum", ["all"], ["y"], keepdims=0, name="sum"),
        ],
        [("x", [1])],
        [("y", [])],
    )
    return _save(m, d, "endless_loop")


def dev_zero(d):
    p = d / "zero.onnx"
    p.symlink_to("/dev/zero")
    return p


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], Path]
    outcome: str  # "refused": exit 2, one line naming the file and ``expect``; "loads"
    expect: str = ""
    check: Callable | None = None
    probe_timeout_s: float = 2.0  # how long the run that finds data-dependent shapes may take here


def _loads_with_note(text):
    return lambda g: any(text in n for n in g.notes)


CASES = {
    "garbage bytes": Case(garbage, "refused", "not an ONNX model"),
    "truncated protobuf": Case(truncated, "refused", "truncated"),
    "empty file": Case(empty, "refused", "empty file"),
    "directory": Case(directory, "refused", "directory"),
    "/dev/zero (must not hang)": Case(dev_zero, "refused", "not a regular file"),
    # Nothing to split: the bundle side would have zero parts, so the load side refuses it.
    "zero nodes, output = input": Case(zero_nodes, "refused", "no nodes"),
    "an output that is an input": Case(
        output_is_input, "refused", "graph output 'x' is an input passed through"
    ),
    "an output that is a weight": Case(
        output_is_weight, "refused", "graph output 'w' is a weight passed through"
    ),
    "opset 999": Case(
        opset_999, "refused", "opset 999 of domain 'ai.onnx' is not a released opset"
    ),
    "ai.onnx.ml opset 99": Case(ml_opset_99, "refused", "opset 99 of domain 'ai.onnx.ml'"),
    "unknown domain": Case(unknown_domain, "refused", "unknown domain 'com.example'"),
    "unknown op": Case(unknown_op, "refused", "unknown op 'FancyOp'"),
    "op ORT has no kernel for": Case(no_ort_kernel, "refused", "ONNX Runtime cannot run it"),
    "duplicate node names": Case(
        duplicate_node_names, "loads", check=lambda g: len({n.name for n in g.nodes}) == 2
    ),
    "duplicate tensor names": Case(
        duplicate_tensor_names, "refused", "'y' has been used as output names multiple"
    ),
    "cycle": Case(cycle, "refused", "cycle through 2 nodes"),
    "dangling input": Case(dangling, "refused", "reads 'ghost', which nothing produces"),
    "dangling outer-scope read": Case(
        dangling_outer_read, "refused", "node 'iff' (If) reads 'ghost'"
    ),
    "mismatched MatMul": Case(matmul_mismatch, "refused", "node name: mm"),
    "huge input shape": Case(
        huge_input, "refused", "input 'x' of shape [1, 3, 100000, 200000] needs 240.0 GB"
    ),
    "huge intermediate tensor": Case(huge_intermediate, "refused", "over the tensor size limit"),
    "zero-size dimension": Case(zero_size_dim, "refused", "input 'x' has a zero-size dimension"),
    # exporters write -1 for "dynamic": any negative dimension is taken as one
    "negative dimension": Case(
        negative_dim, "refused", "dynamic dimensions [1, '?']; pass --input-shape x=1,N"
    ),
    "string input": Case(
        string_input, "loads", check=lambda g: g.tensors["text"].dtype == "object"
    ),
    "sequence input": Case(
        sequence_input, "loads", check=lambda g: g.tensors["xs"].kind == "sequence"
    ),
    "map input": Case(
        map_input, "refused", "input 'm' is not a tensor, a sequence of tensors or an optional"
    ),
    "bfloat16 input": Case(bfloat16_input, "refused", "input 'x' has element type BFLOAT16"),
    "external data missing": Case(
        external_missing, "refused", "external data file 'weights.bin' is missing"
    ),
    "external data outside the folder": Case(
        external_outside, "refused", "outside the model's folder"
    ),
    "external data symlink out of the folder": Case(
        external_symlink_outside, "refused", "outside the model's folder"
    ),
    "external data absolute path": Case(external_absolute, "refused", "outside the model's folder"),
    "external data shorter than its shape": Case(
        external_short, "refused", "holds 8 bytes, its shape needs 64"
    ),
    "external data over the limit": Case(
        external_over_limit, "refused", "over the model size limit of 1024 MB"
    ),
    "external data inside the folder": Case(
        external_ok, "loads", check=lambda g: g.tensors["w"].nbytes == 64
    ),
    "value-dependent shape, no sample value": Case(
        value_dependent, "refused", "the shape of y depends on the values of input 'shape'"
    ),
    "IR 3, opset 6": Case(
        ir3_opset6, "loads", check=_loads_with_note("upgraded from opset 6 to 13")
    ),
    "If, Loop, Scan reading outer scope": Case(
        control_flow,
        "loads",
        check=lambda g: set(g.nodes[g.index["iff"]].outer_inputs) == {"a", "b"},
    ),
    "nested subgraphs": Case(
        nested, "loads", check=lambda g: g.nodes[g.index["outer_loop"]].outer_inputs == ("top",)
    ),
    "node with 10,000 inputs": Case(
        wide_node, "loads", check=lambda g: g.nodes[0].inputs == ("x",)
    ),
    "chain of 10,000 nodes": Case(deep_chain, "loads", check=lambda g: len(g.nodes) == 10_000),
    # NaN and Inf weights are data, not structure: the model loads and parts reproduce the NaNs.
    "Loop of 10^12 trips (the shape-finding run is stopped)": Case(
        endless_loop, "refused", "ran over 0.5 s and was stopped", probe_timeout_s=0.5
    ),
    "NaN and Inf weights": Case(nan_weights, "loads", check=lambda g: g.tensors["w"].is_weight),
}
