"""A zoo of standard network architectures, built in code with random weights.

Every model is written out op by op with :mod:`onnx.helper` (no framework, nothing downloaded)
and filled with weights from a seeded numpy generator, so the same name and seed always give a
byte-identical model. Weights are He/Xavier-scaled and batch-norm statistics are realistic, so
activations stay finite and sensibly scaled: the models are fit for profiling, splitting and
comparing outputs, not for classifying anything.

All models use opset 17 and IR version 8; all but the decoders take float32 inputs of static
shapes (the decoders take token ids of dynamic length and a KV cache). The architectures live in
:mod:`edgesplit.model.zoo_cnn`, :mod:`edgesplit.model.zoo_seq` and
:mod:`edgesplit.model.zoo_decoder`; this module holds the registry, the public API and
:class:`_Builder`, the small graph builder they share.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgesplit.errors import InputError
from edgesplit.util import atomic_write_bytes, by_name

OPSET = 17
IR_VERSION = 8  # the newest IR that every onnxruntime we meet accepts with opset 17


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo.

    Attributes:
        name: Registry name, e.g. ``"resnet18"``.
        description: One line: the architecture and its input and output shapes.
        build: ``seed -> model``; the same seed gives byte-identical models.
    """

    name: str
    description: str
    build: Callable[[int], onnx.ModelProto]


def _lazy(module: str, func: str) -> Callable[[int], onnx.ModelProto]:
    """A builder that imports its architecture module only when called (they import this one)."""

    def build(seed: int) -> onnx.ModelProto:
        return getattr(importlib.import_module(f"edgesplit.model.{module}"), func)(seed)

    build.__name__ = build.__qualname__ = func
    return build


ZOO: dict[str, ZooEntry] = by_name(
    ZooEntry(
        "mobilenetv2",
        "MobileNetV2 1.0, inverted residuals; input 1x3x224x224 -> logits 1x1000",
        _lazy("zoo_cnn", "mobilenetv2"),
    ),
    ZooEntry(
        "resnet18",
        "ResNet-18, basic blocks with skips; input 1x3x224x224 -> logits 1x1000",
        _lazy("zoo_cnn", "resnet18"),
    ),
    ZooEntry(
        "resnet50",
        "ResNet-50 v1.5, bottleneck blocks with skips; input 1x3x224x224 -> logits 1x1000",
        _lazy("zoo_cnn", "resnet50"),
    ),
    ZooEntry(
        "mobilenetv1",
        "MobileNetV1 1.0, depthwise-separable stack; input 1x3x224x224 -> logits 1x1000",
        _lazy("zoo_cnn", "mobilenetv1"),
    ),
    ZooEntry(
        "squeezenet",
        "SqueezeNet 1.1, fire modules; input 1x3x224x224 -> logits 1x1000",
        _lazy("zoo_cnn", "squeezenet"),
    ),
    ZooEntry(
        "googlenet",
        "GoogLeNet (Inception v1, no aux heads); input 1x3x224x224 -> logits 1x1000",
        _lazy("zoo_cnn", "googlenet"),
    ),
    ZooEntry(
        "alexnet",
        "AlexNet, five convolutions then a 58.6M-weight fully connected head; "
        "input 1x3x224x224 -> logits 1x1000",
        _lazy("zoo_cnn", "alexnet"),
    ),
    ZooEntry(
        "transformer",
        "BERT-style encoder, 4 layers, d=256, 4 heads; input 1x128x256 -> hidden 1x128x256",
        _lazy("zoo_seq", "transformer"),
    ),
    ZooEntry(
        "transformer_large",
        "BERT-style encoder, 32 small layers (>1000 nodes); input 1x64x128 -> hidden 1x64x128",
        _lazy("zoo_seq", "transformer_large"),
    ),
    ZooEntry(
        "lstm",
        "LSTM(128) then GRU(128), last step, Gemm; input 1x32x64 -> logits 1x10",
        _lazy("zoo_seq", "lstm"),
    ),
    ZooEntry(
        "chain_shrink",
        "pure chain of Conv/Relu/MaxPool stages whose activations shrink; "
        "input 1x3x224x224 -> logits 1x10",
        _lazy("zoo_cnn", "chain_shrink"),
    ),
    ZooEntry(
        "tiny_dag",
        "10-node branchy DAG (Conv, Add, Concat, Gemm); input 1x3x32x32 -> logits 1x10",
        _lazy("zoo_cnn", "tiny_dag"),
    ),
    ZooEntry(
        "decoder_tiny",
        "Llama-style decoder, 2 layers, d=64, GQA 4/2 heads, vocab 256; input_ids + past KV "
        "-> logits + present KV",
        _lazy("zoo_decoder", "decoder_tiny"),
    ),
    ZooEntry(
        "decoder_small",
        "Llama-style decoder, 4 layers, d=256, GQA 8/2 heads, vocab 2048 (3.3M parameters); "
        "input_ids + past KV -> logits + present KV",
        _lazy("zoo_decoder", "decoder_small"),
    ),
    ZooEntry(
        "decoder_100m",
        "Llama-style decoder, 12 layers, d=768, GQA 12/4 heads, vocab 32000 (100M "
        "parameters); input_ids + past KV -> logits + present KV",
        _lazy("zoo_decoder", "decoder_100m"),
    ),
)
"""Registry name -> entry. Building a model imports its architecture module then."""


def names() -> list[str]:
    """Names of the zoo's models, in registry order."""
    return list(ZOO)


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """Build one zoo model.

    Args:
        name: A name from :func:`names`.
        seed: Seed of the weight generator.

    Raises:
        InputError: for an unknown name.
    """
    if name not in ZOO:
        raise InputError(f"unknown zoo model '{name}' (known: {', '.join(ZOO)})")
    return ZOO[name].build(seed)


def save(name: str, path: str | os.PathLike, seed: int = 0) -> Path:
    """Build one zoo model and write it atomically to ``path``; returns the path."""
    model = build(name, seed)
    path = Path(path)
    atomic_write_bytes(path, model.SerializeToString())
    return path


class _Builder:
    """Appends nodes and seeded random initializers to a graph; each method returns its output name.

    Node names are the dotted names a framework would give the layer (``layer1.0.conv1``); a
    layer's weights are ``<name>.weight`` / ``<name>.bias`` and its output tensor is ``<name>``.
    """

    def __init__(self, graph_name: str, seed: int):
        self.graph_name = graph_name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._consts: dict[tuple, str] = {}

    # -- tensors -------------------------------------------------------------------------------

    def tensor(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        value = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(
            std
        ) + np.float32(mean)
        return self.tensor(name, value.astype(np.float32))

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        return self.tensor(name, self.rng.uniform(low, high, tuple(shape)).astype(np.float32))

    def const(self, value: float | Sequence[int], dtype: type = np.float32) -> str:
        """A shared constant (a scalar or an int64 shape), one initializer per distinct value."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            text = (
                "_".join(str(v) for v in arr.reshape(-1).tolist())
                .replace("-", "m")
                .replace(".", "p")
            )
            self._consts[key] = self.tensor(f"const.{arr.dtype.name}.{text}", arr)
        return self._consts[key]

    # -- nodes ---------------------------------------------------------------------------------

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        name: str,
        outputs: Sequence[str] | None = None,
        **attrs,
    ) -> str:
        """Append one node; returns its first output (named ``name`` unless given)."""
        outs = list(outputs) if outputs is not None else [name]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0]

    def conv(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        k: int,
        stride: int = 1,
        pad: int | None = None,
        group: int = 1,
        bias: bool | None = None,
        *,
        bn_gamma: float | None = None,
        act: str | None = None,
    ) -> str:
        """Conv with He-normal weights; ``pad`` defaults to 'same' for odd kernels.

        With ``bn_gamma``, a BatchNormalization of that scale (``NAME.bn``) follows; ``act``
        (``relu`` or ``relu6``) then ends the block (``NAME.relu``, ``NAME.relu6``). The conv has
        a bias unless ``bias`` is False or a BatchNormalization follows. Returns the last output.
        """
        pad = k // 2 if pad is None else pad
        fan_in = cin // group * k * k
        inputs = [
            x,
            self.normal(f"{name}.weight", (cout, cin // group, k, k), math.sqrt(2.0 / fan_in)),
        ]
        if bias if bias is not None else bn_gamma is None:
            inputs.append(self.normal(f"{name}.bias", (cout,), 0.01))
        y = self.node(
            "Conv",
            inputs,
            name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            group=group,
        )
        if bn_gamma is not None:
            y = self.bn(y, f"{name}.bn", cout, gamma=bn_gamma)
        if act is not None:
            y = {"relu": self.relu, "relu6": self.relu6}[act](y, f"{name}.{act}")
        return y

    def bn(self, x: str, name: str, c: int, gamma: float = 1.0) -> str:
        """BatchNormalization with random but realistic running statistics.

        The running variance is close to what a He-initialised conv on unit-variance input gives
        (about 1-2), so the normalised output keeps roughly unit scale times ``gamma``.
        """
        inputs = [
            x,
            self.uniform(f"{name}.weight", (c,), 0.8 * gamma, 1.2 * gamma),
            self.normal(f"{name}.bias", (c,), 0.05),
            self.normal(f"{name}.running_mean", (c,), 0.1),
            self.uniform(f"{name}.running_var", (c,), 0.8, 2.0),
        ]
        return self.node("BatchNormalization", inputs, name, epsilon=1e-5)

    def relu(self, x: str, name: str) -> str:
        return self.node("Relu", [x], name)

    def relu6(self, x: str, name: str) -> str:
        return self.node("Clip", [x, self.const(0.0), self.const(6.0)], name)

    def add(self, a: str, b: str, name: str) -> str:
        return self.node("Add", [a, b], name)

    def concat(self, xs: Sequence[str], name: str, axis: int = 1) -> str:
        return self.node("Concat", list(xs), name, axis=axis)

    def maxpool(
        self, x: str, name: str, k: int, stride: int, pad: int = 0, ceil: bool = False
    ) -> str:
        return self.node(
            "MaxPool",
            [x],
            name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            ceil_mode=int(ceil),
        )

    def global_avgpool(self, x: str, name: str) -> str:
        return self.node("GlobalAveragePool", [x], name)

    def flatten(self, x: str, name: str) -> str:
        return self.node("Flatten", [x], name, axis=1)

    def gemm(self, x: str, name: str, n_in: int, n_out: int, output: str | None = None) -> str:
        """Fully connected layer ``x @ W.T + b`` (the weight stored as ``(n_out, n_in)``)."""
        w = self.normal(f"{name}.weight", (n_out, n_in), math.sqrt(1.0 / n_in))
        b = self.normal(f"{name}.bias", (n_out,), 0.01)
        return self.node("Gemm", [x, w, b], name, [output or name], transB=1)

    def linear(self, x: str, name: str, n_in: int, n_out: int, gain: float = 1.0) -> str:
        """MatMul + Add on a tensor of any rank (a transformer's dense layer)."""
        w = self.normal(f"{name}.weight", (n_in, n_out), math.sqrt(gain / n_in))
        y = self.node("MatMul", [x, w], f"{name}.matmul")
        return self.node("Add", [y, self.normal(f"{name}.bias", (n_out,), 0.01)], name)

    def layernorm(self, x: str, name: str, d: int) -> str:
        inputs = [
            x,
            self.uniform(f"{name}.weight", (d,), 0.9, 1.1),
            self.normal(f"{name}.bias", (d,), 0.02),
        ]
        return self.node("LayerNormalization", inputs, name, axis=-1, epsilon=1e-5)

    # -- model ---------------------------------------------------------------------------------

    def model(
        self, inputs: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]], doc: str = ""
    ) -> onnx.ModelProto:
        """The finished model with float32 inputs and outputs of the given static shapes."""
        graph = helper.make_graph(
            self.nodes,
            self.graph_name,
            [
                helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                for n, s in inputs.items()
            ],
            [
                helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                for n, s in outputs.items()
            ],
            initializer=self.initializers,
            doc_string=doc,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="edgesplit.zoo",
            ir_version=IR_VERSION,
        )
        return model
