"""Model loading: validation that reports every problem, folding, names, FLOPs and bytes."""

from __future__ import annotations

import os

import onnx
import pytest
from conftest import PPOCR_SHAPES, make_model, ppocr_model, rand, run_cli
from onnx import TensorProto, helper

from edgesplit.errors import ModelLoadError
from edgesplit.model.load import load_model, parse_input_shapes


def test_tiny_model_loads_with_costs(tiny_conv):
    g = load_model(tiny_conv)
    assert [n.name for n in g.nodes][:2] == ["conv1", "relu1"]
    conv1 = g.nodes[g.index["conv1"]]
    # 2 * Cout*H*W * Cin*k*k + bias
    assert conv1.flops == 2 * 8 * 16 * 16 * 3 * 9 + 8 * 16 * 16
    assert conv1.weight_nbytes == (8 * 3 * 9 + 8) * 4
    assert conv1.bytes_read == 3 * 16 * 16 * 4 + conv1.weight_nbytes
    assert conv1.bytes_written == 8 * 16 * 16 * 4
    assert g.tensors["y"].shape == (1, 10) and g.tensors["y"].dtype == "float32"
    assert g.inputs == ("x",) and g.outputs == ("y",)
    assert len(g.sha256) == 64
    assert not g.is_chain()  # relu1 feeds two branches


def test_unnamed_nodes_get_unique_stable_names(tmp_path):
    m = make_model(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Relu", ["a"], ["b"], name="r"),
            helper.make_node("Neg", ["b"], ["y"], name="r"),
        ],
        [("x", [2, 3])],
        [("y", [2, 3])],
    )
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    names = [n.name for n in load_model(p).nodes]
    assert len(set(names)) == 3
    assert names == [n.name for n in load_model(p).nodes]
    assert [n.name for n in load_model(p).model.graph.node] == names


def _flops(tmp_path, nodes, inputs, outputs, weights=(), name="m"):
    p = tmp_path / f"{name}.onnx"
    onnx.save(make_model(nodes, inputs, outputs, weights), p)
    return {n.op_type: n.flops for n in load_model(p).nodes}


def test_flops_of_common_ops(tmp_path):
    f = _flops(
        tmp_path,
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], name="ct")],
        [("x", [1, 4, 8, 8])],
        [("y", [1, 2, 17, 17])],
        [("w", rand(4, 2, 3, 3))],
        "ct",
    )
    assert f["ConvTranspose"] == 2 * (4 * 8 * 8) * 2 * 9
    f = _flops(
        tmp_path,
        [helper.make_node("Gemm", ["a", "b"], ["y"], name="g")],
        [("a", [5, 7])],
        [("y", [5, 3])],
        [("b", rand(7, 3))],
        "gemm",
    )
    assert f["Gemm"] == 2 * 5 * 3 * 7
    # attention-style chain: (Q K^T) softmax V
    f = _flops(
        tmp_path,
        [
            helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
            helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="sm"),
            helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
        ],
        [("q", [2, 16, 8]), ("kt", [2, 8, 16]), ("v", [2, 16, 8])],
        [("y", [2, 16, 8])],
        name="attn",
    )
    assert f["MatMul"] == 2 * (2 * 16 * 8) * 16  # last MatMul wins in the dict: 2*out*K
    assert f["Softmax"] == 5 * 2 * 16 * 16
    f = _flops(
        tmp_path,
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], name="mp")],
        [("x", [1, 3, 8, 8])],
        [("y", [1, 3, 4, 4])],
        name="pool",
    )
    assert f["MaxPool"] == 3 * 16 * 4
    f = _flops(
        tmp_path,
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")],
        [("x", [1, 3, 4, 4])],
        [("y", [1, 3, 4, 4])],
        [("s", rand(3)), ("b", rand(3)), ("m", rand(3)), ("v", abs(rand(3)) + 1)],
        "bn",
    )
    # onnxslim may fold a lone BatchNormalization into Mul+Add; either way it costs 2/element
    assert sum(f.values()) == 2 * 48 or f.get("BatchNormalization") == 2 * 48


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3)])
def test_flops_of_recurrent_ops(tmp_path, op, gates):
    seq, batch, inp, hid = 5, 1, 6, 4
    f = _flops(
        tmp_path,
        [helper.make_node(op, ["x", "w", "r"], ["y"], hidden_size=hid, name="rnn")],
        [("x", [seq, batch, inp])],
        [("y", [seq, 1, batch, hid])],
        [("w", rand(1, gates * hid, inp)), ("r", rand(1, gates * hid, hid))],
        op,
    )
    per_step = 2 * gates * hid * (inp + hid)
    assert f[op] >= seq * batch * per_step


def test_fixed_input_shape_folds_dynamic_model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])
    m = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
            helper.make_node("Relu", ["r"], ["y"], name="relu"),
        ],
        [x],
        [y],
    )
    p = tmp_path / "dyn.onnx"
    onnx.save(m, p)
    with pytest.raises(ModelLoadError, match=r"dynamic dimensions.*--input-shape x=N,3,N,N"):
        load_model(p)
    g = load_model(p, {"x": (1, 3, 8, 8)})
    assert "Shape" not in {n.op_type for n in g.nodes}  # the shape computation was folded
    assert g.tensors["y"].shape == (1, 3, 8, 8)


def test_parse_input_shapes():
    assert parse_input_shapes(["x=1,3,224,224", "ids=1,128"]) == {
        "x": (1, 3, 224, 224),
        "ids": (1, 128),
    }
    with pytest.raises(ModelLoadError, match="NAME=D1"):
        parse_input_shapes(["x:1,3"])
    with pytest.raises(ModelLoadError):
        parse_input_shapes(["x=1,0"])


# ---- bad inputs: each gives ModelLoadError naming the file; several problems are listed at once


def _bad_models(tmp_path):
    good = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", [1, 4])], [("y", [1, 4])]
    )
    data = good.SerializeToString()
    cases = {}
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\xffthis is not a protobuf\xff" * 10)
    cases["garbage"] = (tmp_path / "garbage.onnx", "not an ONNX model")
    big = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="a")],
        [("x", [1, 50000])],
        [("y", [1, 50000])],
        [("w", rand(1, 50000))],
    )
    (tmp_path / "truncated.onnx").write_bytes(
        big.SerializeToString()[: len(big.SerializeToString()) // 2]
    )
    cases["truncated"] = (tmp_path / "truncated.onnx", "truncated")
    bad = make_model(
        [helper.make_node("FancyOp", ["x"], ["y"], name="f")], [("x", [1, 4])], [("y", [1, 4])]
    )
    onnx.save(bad, tmp_path / "unknown_op.onnx")
    cases["unknown op"] = (tmp_path / "unknown_op.onnx", "unknown op 'FancyOp'")
    bad = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="f", domain="com.example")],
        [("x", [1, 4])],
        [("y", [1, 4])],
    )
    bad.opset_import.append(helper.make_opsetid("com.example", 1))
    onnx.save(bad, tmp_path / "unknown_domain.onnx")
    cases["unknown domain"] = (tmp_path / "unknown_domain.onnx", "unknown domain 'com.example'")
    bad = make_model(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="a")], [("x", [1, 4])], [("y", [1, 4])]
    )
    onnx.save(bad, tmp_path / "dangling.onnx")
    cases["dangling"] = (tmp_path / "dangling.onnx", "reads 'ghost', which nothing produces")
    bad = make_model(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
            helper.make_node("Relu", ["a"], ["b"], name="n2"),
            helper.make_node("Relu", ["a"], ["y"], name="n3"),
        ],
        [("x", [1, 4])],
        [("y", [1, 4])],
    )
    onnx.save(bad, tmp_path / "cycle.onnx")
    cases["cycle"] = (tmp_path / "cycle.onnx", "cycle through 2 nodes")
    dyn = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [("y", ["batch", 4])],
    )
    onnx.save(dyn, tmp_path / "dynamic.onnx")
    cases["dynamic"] = (tmp_path / "dynamic.onnx", "dynamic dimensions")
    cases["missing"] = (tmp_path / "nope.onnx", "no such file")
    (tmp_path / "ok.onnx").write_bytes(data)
    return cases


def test_each_bad_input_raises_with_the_file_named(tmp_path):
    for label, (path, text) in _bad_models(tmp_path).items():
        with pytest.raises(ModelLoadError) as info:
            load_model(path)
        msg = str(info.value)
        assert str(path) in msg, label
        assert text in msg, (label, msg)
        assert "\n" not in msg


def test_size_limit(tmp_path):
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="a")],
        [("x", [1, 300000])],
        [("y", [1, 300000])],
        [("w", rand(1, 300000))],
    )
    p = tmp_path / "big.onnx"
    onnx.save(m, p)
    with pytest.raises(ModelLoadError, match="over the model size limit of 1 MB"):
        load_model(p, max_model_mb=1)
    assert load_model(p).nodes


def test_every_problem_listed_at_once(tmp_path):
    bad = make_model(
        [
            helper.make_node("FancyOp", ["x"], ["a"], name="f"),
            helper.make_node("Add", ["a", "ghost"], ["y"], name="g"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [("y", [1, 4])],
    )
    p = tmp_path / "many.onnx"
    onnx.save(bad, p)
    with pytest.raises(ModelLoadError) as info:
        load_model(p)
    assert len(info.value.problems) == 3
    msg = str(info.value)
    assert "FancyOp" in msg and "ghost" in msg and "dynamic" in msg


@pytest.mark.slow
def test_cli_exits_2_with_one_line_and_no_output_file(tmp_path):
    for label, (path, text) in _bad_models(tmp_path).items():
        out = tmp_path / f"{label}.profile.json"
        r = run_cli("profile", str(path), "-o", str(out), "--runs", "1", "--warmup", "0")
        assert r.returncode == 2, (label, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and text in lines[0], (label, r.stderr)
        assert "Traceback" not in r.stderr
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}")]


def test_debug_flag_shows_traceback(tmp_path):
    (tmp_path / "g.onnx").write_bytes(b"garbage")
    r = run_cli("--debug", "profile", str(tmp_path / "g.onnx"))
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["det", "rec", "cls"])
def test_real_ppocr_models_load(kind):
    # cls declares its dynamic dimensions as -1: dynamic, not negative
    g = load_model(ppocr_model(kind), parse_input_shapes([PPOCR_SHAPES[kind]]))
    assert g.nodes and not g.notes
    assert all(t.shape and min(t.shape) > 0 for t in g.tensors.values() if not t.is_weight)


@pytest.mark.slow
def test_a_simplified_model_is_kept_and_read_back_by_the_next_load(tmp_path, monkeypatch):
    """The next load of the same model and shapes reads the simplified model from the cache instead
    of folding again: the same graph, costs and notes. A changed model, or other shapes, fold
    again."""
    from edgesplit.model import kept, zoo
    from edgesplit.model import simplify as simplify_module

    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    path = zoo.save("squeezenet", tmp_path / "sq.onnx")
    first = load_model(path)
    assert len(list((tmp_path / "cache" / "simplified").glob("*.onnx"))) == 1
    folds = []
    real = simplify_module.simplify
    monkeypatch.setattr(
        simplify_module, "simplify", lambda *a, **k: folds.append(a[0]) or real(*a, **k)
    )
    again = load_model(path)
    assert folds == [] and again == first
    assert again.model.SerializeToString() == first.model.SerializeToString()
    changed = onnx.load(path)
    w = changed.graph.initializer[0]
    arr = onnx.numpy_helper.to_array(w).copy()
    arr.flat[0] += 1.0
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    onnx.save(changed, tmp_path / "sq2.onnx")
    load_model(tmp_path / "sq2.onnx")
    assert folds == [str(tmp_path / "sq2.onnx")]
    m = onnx.load(path)
    assert kept.kept_path(m, {"x": (1, 3, 224, 224)}, None) != kept.kept_path(
        m, {"x": (2, 3, 224, 224)}, None
    )
    small = zoo.save("tiny_dag", tmp_path / "tiny.onnx")  # kept too: importing onnxslim costs more
    first_small = load_model(small)
    assert folds == [str(tmp_path / "sq2.onnx"), str(small)]
    assert len(list((tmp_path / "cache" / "simplified").glob("*.onnx"))) == 3
    assert load_model(small) == first_small and len(folds) == 2


@pytest.mark.slow
def test_kept_models_past_the_cap_go_least_recently_used_first(tmp_path, monkeypatch):
    """The cache folder holds at most ``MAX_NBYTES``: a model read from it counts as used, and
    the model used longest ago goes first."""
    from edgesplit.cache import prune, touch
    from edgesplit.model import kept, zoo

    monkeypatch.setenv("EDGESPLIT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "simplified"
    a = zoo.save("squeezenet", tmp_path / "a.onnx")
    b = onnx.load(a)
    w = b.graph.initializer[0]
    w.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w) + 1.0, w.name))
    onnx.save(b, tmp_path / "b.onnx")
    load_model(a)
    pair = sum(f.stat().st_size for f in folder.iterdir())
    monkeypatch.setattr(kept, "MAX_NBYTES", pair + pair // 2)  # room for one pair, not two
    (kept_a,) = folder.glob("*.onnx")
    for f in (kept_a, kept_a.with_suffix(".json")):
        os.utime(f, ns=(1, 1))  # used long ago (the clock of a shared machine is coarse)
    load_model(tmp_path / "b.onnx")
    assert (
        kept_a.name not in {f.name for f in folder.iterdir()} and len(list(folder.iterdir())) == 2
    )
    # prune itself: oldest first, a touched file counts as new, the cap is met exactly
    for i, name in enumerate("xyz"):
        (tmp_path / "p" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "p" / name).write_bytes(b"0" * 10)
        os.utime(tmp_path / "p" / name, ns=(i + 1, i + 1))
    touch(tmp_path / "p" / "x")
    assert [f.name for f in prune(tmp_path / "p", 20)] == ["y"]
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["x", "z"]
    assert prune(tmp_path / "nowhere", 0) == []
