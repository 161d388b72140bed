"""Models built in code that stress loading: control flow reading outer scopes, old opsets.

Shared by ``test_control_flow.py``, ``test_old_opsets.py`` and the hostile corpus.

* Control flow: every If, Loop and Scan subgraph reads at least one tensor of an enclosing graph
  that it does not take as an input (ONNX's outer-scope rule), so a part boundary that forgets
  those reads gives an invalid part.
* Old opsets: a CNN written the way exporters wrote them for opset 6 and IR version 3 (weights
  listed among the graph inputs, Gemm's ``broadcast`` attribute, AveragePool-1).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _vi(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(value))
    )


def if_branches(
    prefix: str, cond: str, then_reads: tuple[str, str], else_reads: tuple[str, str], out: str
):
    """An If node: then = Add(*then_reads), else = Sub(*else_reads); both read the outer scope."""
    then_g = helper.make_graph(
        [helper.make_node("Add", list(then_reads), [f"{prefix}_t"], name=f"{prefix}_then_add")],
        f"{prefix}_then",
        [],
        [_vi(f"{prefix}_t", None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", list(else_reads), [f"{prefix}_e"], name=f"{prefix}_else_sub")],
        f"{prefix}_else",
        [],
        [_vi(f"{prefix}_e", None)],
    )
    return helper.make_node(
        "If", [cond], [out], then_branch=then_g, else_branch=else_g, name=prefix
    )


def loop_adding(prefix: str, trips: str, init: str, outer: str, out: str) -> onnx.NodeProto:
    """A Loop that adds the outer-scope tensor ``outer`` to its carried value ``trips`` times."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name=f"{prefix}_cond"),
            helper.make_node("Add", ["v_in", outer], ["v_out"], name=f"{prefix}_body_add"),
        ],
        f"{prefix}_body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("v_in", None)],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", None)],
    )
    return helper.make_node("Loop", [trips, "", init], [out], body=body, name=prefix)


def scan_scaling(
    prefix: str, init: str, seq: str, outer: str, state_out: str, ys: str
) -> onnx.NodeProto:
    """A Scan over axis 0 of ``seq``: h += x_t * outer (outer-scope), emitting each h."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["x_t", outer], ["xs"], name=f"{prefix}_body_mul"),
            helper.make_node("Add", ["h_in", "xs"], ["h_out"], name=f"{prefix}_body_add"),
            helper.make_node("Identity", ["h_out"], ["y_t"], name=f"{prefix}_body_id"),
        ],
        f"{prefix}_body",
        [_vi("h_in", [8]), _vi("x_t", [8])],
        [_vi("h_out", [8]), _vi("y_t", [8])],
    )
    return helper.make_node(
        "Scan", [init, seq], [state_out, ys], body=body, num_scan_inputs=1, name=prefix
    )


def control_flow_model() -> onnx.ModelProto:
    """x[1,8] -> ... If (data-dependent condition), Loop and Scan, all reading outer tensors ->
    y[1,8].

    The nodes are spread so that contiguous cuts into 2 or 3 parts put control-flow nodes in
    different parts from the tensors their subgraphs read.
    """
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "w2")
    g_vec = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "gvec")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Mul", ["a", "w1"], ["b"], name="mul"),
        helper.make_node("ReduceSum", ["b"], ["s"], keepdims=0, name="rsum"),
        _const("zero", np.float32(0.0)),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
        # then reads the outer tensor b and the outer initializer w2; else reads a and b
        if_branches("iff", "cond", ("b", "w2"), ("a", "b"), "f"),
        helper.make_node("Tanh", ["f"], ["ft"], name="tanh"),
        _const("trips", np.int64(3)),
        loop_adding("loop", "trips", "ft", "a", "l"),
        helper.make_node("Sigmoid", ["l"], ["ls"], name="sig"),
        helper.make_node("Concat", ["ls", "ft"], ["seq"], axis=0, name="concat"),
        _const("h0", np.zeros(8, np.float32)),
        helper.make_node("Mul", ["gvec", "gvec"], ["g2"], name="gsq"),
        scan_scaling("scan", "h0", "seq", "g2", "h", "ys"),
        helper.make_node("ReduceMean", ["ys"], ["ym"], axes=[0], keepdims=1, name="ymean"),
        helper.make_node("Add", ["ym", "l"], ["y"], name="out"),
    ]
    g = helper.make_graph(nodes, "cf", [_vi("x", [1, 8])], [_vi("y", [1, 8])], [w1, w2, g_vec])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def nested_model() -> onnx.ModelProto:
    """A Loop whose body holds an If whose branches read a top-level tensor two scopes up."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["v_in", "top"], ["nt"], name="nest_then")],
        "nt",
        [],
        [_vi("nt", None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "top"], ["ne"], name="nest_else")],
        "ne",
        [],
        [_vi("ne", None)],
    )
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="nest_cond"),
            _const("two", np.int64(2)),
            helper.make_node("Mod", ["i", "two"], ["odd"], name="nest_mod"),
            _const("one", np.int64(1)),
            helper.make_node("Equal", ["odd", "one"], ["isodd"], name="nest_eq"),
            helper.make_node(
                "If", ["isodd"], ["v_out"], then_branch=then_g, else_branch=else_g, name="nest_if"
            ),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("v_in", None)],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", None)],
    )
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["top"], name="top_sig"),
        helper.make_node("Relu", ["x"], ["start"], name="start_relu"),
        _const("trips", np.int64(4)),
        helper.make_node("Loop", ["trips", "", "start"], ["z"], body=body, name="outer_loop"),
        helper.make_node("Neg", ["z"], ["y"], name="neg"),
    ]
    g = helper.make_graph(nodes, "nested", [_vi("x", [1, 8])], [_vi("y", [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def old_cnn(*, ort_runs_it: bool = False) -> onnx.ModelProto:
    """A CNN exported the old way: IR version 3 (weights listed as graph inputs), opset 6.

    By default Conv -> Relu -> AveragePool-1 -> Flatten -> Gemm-6 (with its ``broadcast``
    attribute): ONNX Runtime has kernels for neither AveragePool-1 nor Gemm-6, so only an upgrade
    makes it run. ``ort_runs_it`` gives Conv -> Relu -> MaxPool-1 -> Flatten -> MatMul-1 -> Sum-6,
    which ORT runs as it is. x[1,3,8,8] -> y[1,10].
    """
    rng = np.random.default_rng(3)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    pool = "MaxPool" if ort_runs_it else "AveragePool"
    nodes = [
        helper.make_node(
            "Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"
        ),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node(pool, ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
    ]
    if ort_runs_it:
        nodes += [
            helper.make_node("MatMul", ["f", "wf"], ["m"], name="fc"),
            helper.make_node("Sum", ["m", "bf"], ["y"], name="bias"),
        ]
        inits = [w("w1", 8, 3, 3, 3), w("b1", 8), w("wf", 128, 10), w("bf", 1, 10)]
    else:
        nodes.append(
            helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, broadcast=1, name="fc")
        )
        inits = [w("w1", 8, 3, 3, 3), w("b1", 8), w("wf", 10, 128), w("bf", 10)]
    g = helper.make_graph(
        nodes,
        "old_cnn",
        [_vi("x", [1, 3, 8, 8])]
        + [_vi(t.name, list(t.dims)) for t in inits],  # IR 3: weights are inputs
        [_vi("y", [1, 10])],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 6)], producer_name="old-exporter"
    )
    m.ir_version = 3
    return m


def mlp_graph(width: int, layers: int, *, seed: int = 0, bias: float = 0.0) -> onnx.GraphProto:
    """x [1, width] -> ``layers`` fully connected layers (Gemm, ReLU between; the first ReLU's
    output is ``relu0``): a weight-bound head, as a server part that batching helps."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.full(width, bias, np.float32), f"b{i}"),
        ]
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"fc{i}"], name=f"fc{i}"))
        x = f"fc{i}"
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [x], [f"relu{i}"], name=f"relu{i}"))
            x = f"relu{i}"
    return helper.make_graph(nodes, "mlp", [_vi("x", [1, width])], [_vi(x, [1, width])], inits)
