"""Convolutional networks of the zoo: MobileNetV1/V2, ResNet-18/50, SqueezeNet 1.1, GoogLeNet,
AlexNet and two small test graphs (a pure chain and a tiny DAG).

Layer names follow torchvision where it has the model (``layer1.0.conv1``, ``features.3.dw``), so
a split plan reads like the PyTorch module tree.
"""

from __future__ import annotations

import onnx

from edgesplit.model.zoo import _Builder

_IMAGE = (1, 3, 224, 224)


def _classifier(b: _Builder, x: str, c: int, classes: int = 1000) -> str:
    y = b.global_avgpool(x, "avgpool")
    y = b.flatten(y, "flatten")
    return b.gemm(y, "fc", c, classes, output="logits")


# (expansion t, output channels c, repeats n, first stride s) from the MobileNetV2 paper, table 2.
_MBV2_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenetv2(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0): depthwise-separable inverted residuals, ReLU6 as Clip.

    About 300 M multiply-adds; input ``input`` 1x3x224x224, output ``logits`` 1x1000.
    """
    b = _Builder("mobilenetv2", seed)
    x = b.conv("input", "features.0", 3, 32, 3, 2, bn_gamma=1.0, act="relu6")
    cin, i = 32, 1
    for t, c, n, s in _MBV2_SETTINGS:
        for r in range(n):
            stride = s if r == 0 else 1
            hidden = cin * t
            name = f"features.{i}"
            y = x  # t == 1: no expansion
            if t != 1:
                y = b.conv(x, f"{name}.expand", cin, hidden, 1, bn_gamma=1.0, act="relu6")
            y = b.conv(
                y, f"{name}.dw", hidden, hidden, 3, stride, group=hidden, bn_gamma=1.0, act="relu6"
            )
            residual = stride == 1 and cin == c
            # A smaller last-BN scale on residual blocks keeps the running sum from growing (as
            # "zero-init residual" training recipes do, but not all the way to zero).
            y = b.conv(y, f"{name}.project", hidden, c, 1, bn_gamma=0.5 if residual else 1.0)
            x = b.add(x, y, f"{name}.add") if residual else y
            cin, i = c, i + 1
    x = b.conv(x, f"features.{i}", cin, 1280, 1, bn_gamma=1.0, act="relu6")
    _classifier(b, x, 1280)
    return b.model({"input": _IMAGE}, {"logits": (1, 1000)}, "MobileNetV2 1.0, random weights")


def _resnet_stem(name: str, seed: int) -> tuple[_Builder, str]:
    """The builder of a ResNet and its stem: 7x7 conv (stride 2), BN, ReLU, 3x3 max pool."""
    b = _Builder(name, seed)
    x = b.conv("input", "conv1", 3, 64, 7, 2, bias=False)
    x = b.relu(b.bn(x, "bn1", 64), "relu")
    return b, b.maxpool(x, "maxpool", 3, 2, pad=1)


def resnet18(seed: int = 0) -> onnx.ModelProto:
    """ResNet-18: four stages of two basic blocks with identity or 1x1-conv skips.

    About 1.82 G multiply-adds; input ``input`` 1x3x224x224, output ``logits`` 1x1000.
    """
    b, x = _resnet_stem("resnet18", seed)
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            name = f"layer{stage}.{block}"
            y = b.conv(x, f"{name}.conv1", cin, cout, 3, stride, bias=False)
            y = b.relu(b.bn(y, f"{name}.bn1", cout), f"{name}.relu1")
            y = b.conv(y, f"{name}.conv2", cout, cout, 3, bias=False)
            y = b.bn(y, f"{name}.bn2", cout, gamma=0.5)
            if stride != 1 or cin != cout:
                x = b.conv(x, f"{name}.downsample.0", cin, cout, 1, stride, bias=False)
                x = b.bn(x, f"{name}.downsample.1", cout)
            x = b.relu(b.add(x, y, f"{name}.add"), f"{name}.relu2")
            cin = cout
    _classifier(b, x, 512)
    return b.model({"input": _IMAGE}, {"logits": (1, 1000)}, "ResNet-18, random weights")


def resnet50(seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 (v1.5, torchvision's layout): four stages of bottleneck blocks, stride on the 3x3.

    About 4.1 G multiply-adds; input ``input`` 1x3x224x224, output ``logits`` 1x1000.
    """
    b, x = _resnet_stem("resnet50", seed)
    cin = 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=1):
        cout = width * 4
        for block in range(blocks):
            stride = 2 if stage > 1 and block == 0 else 1
            name = f"layer{stage}.{block}"
            y = b.conv(x, f"{name}.conv1", cin, width, 1, bn_gamma=1.0, act="relu")
            y = b.conv(y, f"{name}.conv2", width, width, 3, stride, bn_gamma=1.0, act="relu")
            y = b.conv(y, f"{name}.conv3", width, cout, 1, bn_gamma=0.5)
            if block == 0:
                x = b.conv(x, f"{name}.downsample", cin, cout, 1, stride, bn_gamma=1.0)
            x = b.relu(b.add(x, y, f"{name}.add"), f"{name}.relu")
            cin = cout
    _classifier(b, x, 2048)
    return b.model({"input": _IMAGE}, {"logits": (1, 1000)}, "ResNet-50 v1.5, random weights")


# (output channels, stride) of the 13 depthwise-separable blocks, MobileNets paper, table 1.
_MBV1_BLOCKS = (
    ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2))
    + ((512, 1),) * 5
    + (
        (1024, 2),
        (1024, 1),
    )
)


def mobilenetv1(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV1 (width 1.0): a plain stack of depthwise 3x3 + pointwise 1x1 convolutions, ReLU.

    About 569 M multiply-adds; input ``input`` 1x3x224x224, output ``logits`` 1x1000.
    """
    b = _Builder("mobilenetv1", seed)
    x = b.conv("input", "features.0", 3, 32, 3, 2, bn_gamma=1.0, act="relu")
    cin = 32
    for i, (cout, stride) in enumerate(_MBV1_BLOCKS, start=1):
        x = b.conv(x, f"features.{i}.dw", cin, cin, 3, stride, group=cin, bn_gamma=1.0, act="relu")
        x = b.conv(x, f"features.{i}.pw", cin, cout, 1, bn_gamma=1.0, act="relu")
        cin = cout
    _classifier(b, x, 1024)
    return b.model({"input": _IMAGE}, {"logits": (1, 1000)}, "MobileNetV1 1.0, random weights")


def _fire(b: _Builder, x: str, name: str, cin: int, squeeze: int, expand: int) -> str:
    s = b.relu(b.conv(x, f"{name}.squeeze", cin, squeeze, 1), f"{name}.squeeze_activation")
    e1 = b.relu(b.conv(s, f"{name}.expand1x1", squeeze, expand, 1), f"{name}.expand1x1_activation")
    e3 = b.relu(b.conv(s, f"{name}.expand3x3", squeeze, expand, 3), f"{name}.expand3x3_activation")
    return b.concat([e1, e3], f"{name}.concat")


def squeezenet(seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1: fire modules (1x1 squeeze, then 1x1 and 3x3 expands joined by Concat).

    About 0.35 G multiply-adds; input ``input`` 1x3x224x224, output ``logits`` 1x1000.
    """
    b = _Builder("squeezenet", seed)
    x = b.relu(b.conv("input", "features.0", 3, 64, 3, 2, pad=0), "features.1")
    x = b.maxpool(x, "features.2", 3, 2, ceil=True)
    fires = {
        3: (64, 16, 64),
        4: (128, 16, 64),
        6: (128, 32, 128),
        7: (256, 32, 128),
        9: (256, 48, 192),
        10: (384, 48, 192),
        11: (384, 64, 256),
        12: (512, 64, 256),
    }
    for i in range(3, 13):
        if i in fires:
            x = _fire(b, x, f"features.{i}", *fires[i])
        else:
            x = b.maxpool(x, f"features.{i}", 3, 2, ceil=True)
    x = b.relu(b.conv(x, "classifier.1", 512, 1000, 1), "classifier.2")
    x = b.global_avgpool(x, "classifier.3")
    b.node("Flatten", [x], "classifier.flatten", ["logits"], axis=1)
    return b.model({"input": _IMAGE}, {"logits": (1, 1000)}, "SqueezeNet 1.1, random weights")


def _inception(
    b: _Builder,
    x: str,
    name: str,
    cin: int,
    c1: int,
    c3r: int,
    c3: int,
    c5r: int,
    c5: int,
    pool: int,
) -> tuple[str, int]:
    """Four branches on one input (1x1; 1x1-3x3; 1x1-5x5; maxpool-1x1) joined by a Concat."""

    def conv_relu(y: str, sub: str, ci: int, co: int, k: int) -> str:
        return b.relu(b.conv(y, f"{name}.{sub}", ci, co, k), f"{name}.{sub}.relu")

    y1 = conv_relu(x, "branch1", cin, c1, 1)
    y2 = conv_relu(conv_relu(x, "branch2.0", cin, c3r, 1), "branch2.1", c3r, c3, 3)
    y3 = conv_relu(conv_relu(x, "branch3.0", cin, c5r, 1), "branch3.1", c5r, c5, 5)
    y4 = conv_relu(b.maxpool(x, f"{name}.branch4.0", 3, 1, pad=1), "branch4.1", cin, pool, 1)
    return b.concat([y1, y2, y3, y4], f"{name}.concat"), c1 + c3 + c5 + pool


def googlenet(seed: int = 0) -> onnx.ModelProto:
    """GoogLeNet (Inception v1, without the auxiliary heads and LRN): a branchy DAG.

    About 1.5 G multiply-adds; input ``input`` 1x3x224x224, output ``logits`` 1x1000.
    """
    b = _Builder("googlenet", seed)
    x = b.relu(b.conv("input", "conv1", 3, 64, 7, 2), "conv1.relu")
    x = b.maxpool(x, "maxpool1", 3, 2, ceil=True)
    x = b.relu(b.conv(x, "conv2", 64, 64, 1), "conv2.relu")
    x = b.relu(b.conv(x, "conv3", 64, 192, 3), "conv3.relu")
    x = b.maxpool(x, "maxpool2", 3, 2, ceil=True)
    c = 192
    for name, cfg in (
        ("inception3a", (64, 96, 128, 16, 32, 32)),
        ("inception3b", (128, 128, 192, 32, 96, 64)),
        ("maxpool3", None),
        ("inception4a", (192, 96, 208, 16, 48, 64)),
        ("inception4b", (160, 112, 224, 24, 64, 64)),
        ("inception4c", (128, 128, 256, 24, 64, 64)),
        ("inception4d", (112, 144, 288, 32, 64, 64)),
        ("inception4e", (256, 160, 320, 32, 128, 128)),
        ("maxpool4", None),
        ("inception5a", (256, 160, 320, 32, 128, 128)),
        ("inception5b", (384, 192, 384, 48, 128, 128)),
    ):
        if cfg is None:
            x = b.maxpool(x, name, 3 if name == "maxpool3" else 2, 2, ceil=True)
        else:
            x, c = _inception(b, x, name, c, *cfg)
    _classifier(b, x, c)
    return b.model(
        {"input": _IMAGE}, {"logits": (1, 1000)}, "GoogLeNet / Inception v1, random weights"
    )


def chain_shrink(seed: int = 0) -> onnx.ModelProto:
    """A strict chain: five Conv3x3/Relu/MaxPool-stride-2 stages, then Flatten and Gemm.

    Channels double as the side halves, so each stage costs about the same (~58 M multiply-adds
    from the second on) while the activation it hands on halves: the setting in which
    Neurosurgeon's single split point is optimal. Input ``input`` 1x3x224x224, output ``logits``
    1x10.
    """
    b = _Builder("chain_shrink", seed)
    x, cin = "input", 3
    for stage, cout in enumerate((16, 32, 64, 128, 256), start=1):
        x = b.relu(b.conv(x, f"stage{stage}.conv", cin, cout, 3), f"stage{stage}.relu")
        x = b.maxpool(x, f"stage{stage}.pool", 2, 2)
        cin = cout
    x = b.flatten(x, "flatten")
    b.gemm(x, "fc", 256 * 7 * 7, 10, output="logits")
    return b.model({"input": _IMAGE}, {"logits": (1, 10)}, "pure chain with shrinking activations")


def tiny_dag(seed: int = 0) -> onnx.ModelProto:
    """Ten nodes: a stem, two branches joined by Add, a skip joined by Concat, pool, Gemm.

    Input ``input`` 1x3x32x32, output ``logits`` 1x10; runs in microseconds, for fast tests.
    """
    b = _Builder("tiny_dag", seed)
    stem = b.relu(b.conv("input", "stem.conv", 3, 8, 3), "stem.relu")
    left = b.relu(b.conv(stem, "left.conv", 8, 8, 3), "left.relu")
    right = b.conv(stem, "right.conv", 8, 8, 1)
    x = b.add(left, right, "merge.add")
    x = b.concat([x, stem], "merge.concat")
    x = b.maxpool(x, "pool", 4, 4)
    x = b.flatten(x, "flatten")
    b.gemm(x, "fc", 16 * 8 * 8, 10, output="logits")
    return b.model({"input": (1, 3, 32, 32)}, {"logits": (1, 10)}, "tiny branchy DAG for tests")


def alexnet(seed: int = 0) -> onnx.ModelProto:
    """AlexNet as torchvision has it: five convolutions (0.7 G multiply-adds) and a head of three
    fully connected layers that holds 94% of its 61 M weights.

    The split benchmark of Neurosurgeon and DADS. Input ``input`` 1x3x224x224, output ``logits``
    1x1000; no dropout (inference).
    """
    b = _Builder("alexnet", seed)
    x = b.relu(b.conv("input", "features.0", 3, 64, 11, 4, pad=2), "features.1")
    x = b.maxpool(x, "features.2", 3, 2)
    x = b.relu(b.conv(x, "features.3", 64, 192, 5), "features.4")
    x = b.maxpool(x, "features.5", 3, 2)
    x = b.relu(b.conv(x, "features.6", 192, 384, 3), "features.7")
    x = b.relu(b.conv(x, "features.8", 384, 256, 3), "features.9")
    x = b.relu(b.conv(x, "features.10", 256, 256, 3), "features.11")
    x = b.maxpool(x, "features.12", 3, 2)  # 256 x 6 x 6: torchvision's 6x6 average pool is a no-op
    x = b.flatten(x, "flatten")
    x = b.relu(b.gemm(x, "classifier.1", 256 * 6 * 6, 4096), "classifier.2")
    x = b.relu(b.gemm(x, "classifier.4", 4096, 4096), "classifier.5")
    b.gemm(x, "classifier.6", 4096, 1000, output="logits")
    return b.model({"input": _IMAGE}, {"logits": (1, 1000)}, "AlexNet, random weights")
