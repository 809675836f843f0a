"""Standard architectures with seeded random weights, for compiling and benchmarking at real size.

The weights are not trained: these models measure what the compiler and the simulator do with a
ResNet-18 or a MobileNetV2 (shapes, operator mix, cycles, bytes moved), not what they predict.
To keep the numbers meaningful anyway, every BatchNormalization gets running statistics close to
what a unit-normal input produces. The builder carries an analytic estimate of each tensor's mean
and mean square (He-normal weights double the mean square, ReLU is applied to a Gaussian of that
mean and variance, Add sums), so the BNs really normalize and activations keep the same order of
magnitude from the first layer to the logits.

Names follow torchvision's state-dict names where they exist (`layer2.0.downsample.0`), so a
per-layer report reads like the familiar model. Same seed, byte-identical serialization.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what ONNX 1.12, which introduced opset 17, writes; older runtimes load it too
BN_EPSILON = 1e-5
IMAGE_SHAPE = (1, 3, 224, 224)
CLASSES = 1000

# MobileNetV2 (Sandler et al. 2018, table 2): expansion t, output channels c, repeats n, stride s.
MOBILENETV2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                      (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


@dataclass(frozen=True)
class Act:
    """A tensor being built: its ONNX name, channel count, and estimated mean and mean square."""

    name: str
    channels: int
    mean: float
    mean_square: float

    @property
    def std(self) -> float:
        return math.sqrt(max(self.mean_square - self.mean**2, 0.0))


def relu_moments(x: Act) -> tuple[float, float]:
    """Mean and mean square of max(z, 0) for z ~ N(x.mean, x.std**2)."""
    mu, sigma = x.mean, x.std
    cdf = 0.5 * (1 + math.erf(mu / sigma / math.sqrt(2)))
    pdf = math.exp(-0.5 * (mu / sigma) ** 2) / math.sqrt(2 * math.pi)
    return mu * cdf + sigma * pdf, x.mean_square * cdf + mu * sigma * pdf


class GraphBuilder:
    """Appends nodes and seeded initializers in call order, which fixes the bytes per seed."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def _constant(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def _node(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def _he_normal(self, shape: tuple[int, ...]) -> np.ndarray:
        """He et al. 2015: variance 2/fan_in keeps a ReLU network's mean square constant."""
        fan_in = int(np.prod(shape[1:]))
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2 / fan_in))

    def conv(self, x: Act, name: str, channels: int, kernel: int, stride: int = 1,
             group: int = 1) -> Act:
        """No bias: a BatchNormalization always follows, as in torchvision."""
        weight = self._constant(f"{name}.weight",
                                self._he_normal((channels, x.channels // group, kernel, kernel)))
        out = self._node("Conv", [x.name, weight], name, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[kernel // 2] * 4, group=group)
        return Act(out, channels, 0.0, 2 * x.mean_square)

    def batchnorm(self, x: Act, name: str) -> Act:
        """Running statistics near the input's estimated ones, gamma and beta near identity."""
        c, rng = x.channels, self.rng
        scale = rng.uniform(0.7, 1.3, c)
        bias = rng.normal(0.0, 0.1, c)
        mean = x.mean + rng.normal(0.0, 0.1 * x.std, c)
        var = x.std**2 * rng.uniform(0.7, 1.3, c)
        inputs = [x.name] + [self._constant(f"{name}.{key}", value) for key, value in
                             (("weight", scale), ("bias", bias), ("running_mean", mean),
                              ("running_var", var))]
        out = self._node("BatchNormalization", inputs, name, epsilon=BN_EPSILON)
        gain, shift = scale / np.sqrt(var), x.mean - mean
        out_mean = gain * shift + bias
        out_var = gain**2 * x.std**2
        return Act(out, c, float(np.mean(out_mean)), float(np.mean(out_mean**2 + out_var)))

    def relu(self, x: Act, name: str) -> Act:
        return Act(self._node("Relu", [x.name], name), x.channels, *relu_moments(x))

    def relu6(self, x: Act, name: str) -> Act:
        """ReLU6 as Clip(0, 6); the bounds are shared scalar initializers."""
        if not any(t.name == "relu6.min" for t in self.initializers):
            self._constant("relu6.min", np.array(0.0))
            self._constant("relu6.max", np.array(6.0))
        out = self._node("Clip", [x.name, "relu6.min", "relu6.max"], name)
        return Act(out, x.channels, *relu_moments(x))

    def add(self, a: Act, b: Act, name: str) -> Act:
        return Act(self._node("Add", [a.name, b.name], name), a.channels, a.mean + b.mean,
                   a.mean_square + b.mean_square + 2 * a.mean * b.mean)

    def concat(self, xs: list[Act], name: str) -> Act:
        """Channels side by side: the moments are the channel-weighted averages."""
        c = sum(x.channels for x in xs)
        return Act(self._node("Concat", [x.name for x in xs], name, axis=1), c,
                   sum(x.mean * x.channels for x in xs) / c,
                   sum(x.mean_square * x.channels for x in xs) / c)

    def maxpool(self, x: Act, name: str, kernel: int, stride: int) -> Act:
        """Follows a ReLU of N(0, s^2): the max of nine of those is about N(1.49 s, (0.6 s)^2)."""
        out = self._node("MaxPool", [x.name], name, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[kernel // 2] * 4)
        s = math.sqrt(2 * x.mean_square)
        return Act(out, x.channels, 1.49 * s, 2.56 * s**2)

    def classifier(self, x: Act) -> Act:
        """GlobalAveragePool + Flatten + Gemm to the logits; the pooled moments are upper bounds."""
        x = Act(self._node("GlobalAveragePool", [x.name], "avgpool"), x.channels, x.mean,
                x.mean_square)
        x = Act(self._node("Flatten", [x.name], "flatten", axis=1), x.channels, x.mean,
                x.mean_square)
        return self.gemm(x, "fc", CLASSES, output="logits")

    def gemm(self, x: Act, name: str, features: int, output: str | None = None) -> Act:
        """torch.nn.Linear layout: weight (out, in), hence transB=1."""
        weight = self._constant(f"{name}.weight", self._he_normal((features, x.channels)))
        bias = self._constant(f"{name}.bias", self.rng.normal(0.0, 0.1, features))
        self.nodes.append(helper.make_node("Gemm", [x.name, weight, bias], [output or name],
                                           name=name, transB=1))
        return Act(output or name, features, 0.0, 2 * x.mean_square)

    def model(self, name: str, x_shape: tuple[int, ...], out: Act, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info(out.name, TensorProto.FLOAT, [1, out.channels])],
            initializer=self.initializers)
        model = helper.make_model(graph, producer_name="ember.examples", ir_version=IR_VERSION,
                                  opset_imports=[helper.make_opsetid("", OPSET)], doc_string=doc)
        onnx.checker.check_model(model, full_check=True)
        return model


def _basic_block(b: GraphBuilder, x: Act, name: str, channels: int, stride: int) -> Act:
    """torchvision's BasicBlock: two 3x3 convs; a 1x1 conv + BN shortcut when shapes change."""
    h = b.relu(b.batchnorm(b.conv(x, f"{name}.conv1", channels, 3, stride), f"{name}.bn1"),
               f"{name}.relu1")
    h = b.batchnorm(b.conv(h, f"{name}.conv2", channels, 3), f"{name}.bn2")
    if stride != 1 or x.channels != channels:
        x = b.batchnorm(b.conv(x, f"{name}.downsample.0", channels, 1, stride),
                        f"{name}.downsample.1")
    return b.relu(b.add(h, x, f"{name}.add"), f"{name}.relu2")


def resnet18(seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 (He et al. 2016) in torchvision's layout, 1x3x224x224 -> logits 1x1000."""
    b = GraphBuilder(seed)
    x = Act("input", IMAGE_SHAPE[1], 0.0, 1.0)
    x = b.relu(b.batchnorm(b.conv(x, "conv1", 64, 7, stride=2), "bn1"), "relu")
    x = b.maxpool(x, "maxpool", kernel=3, stride=2)
    for stage, channels in enumerate((64, 128, 256, 512), start=1):
        for index in range(2):
            stride = 2 if stage > 1 and index == 0 else 1
            x = _basic_block(b, x, f"layer{stage}.{index}", channels, stride)
    return b.model("resnet18", IMAGE_SHAPE, b.classifier(x),
                   f"ResNet-18 with random He-normal weights (seed {seed}), for benchmarking.")


def _conv_bn(b: GraphBuilder, x: Act, name: str, channels: int, kernel: int, stride: int = 1,
             group: int = 1, activation: bool = True) -> Act:
    h = b.batchnorm(b.conv(x, f"{name}.conv", channels, kernel, stride, group), f"{name}.bn")
    return b.relu6(h, f"{name}.relu6") if activation else h


def _inverted_residual(b: GraphBuilder, x: Act, name: str, expansion: int, channels: int,
                       stride: int) -> Act:
    """Expand 1x1, depthwise 3x3, linear 1x1 projection; residual Add when shapes allow."""
    h = x
    if expansion != 1:
        h = _conv_bn(b, h, f"{name}.expand", x.channels * expansion, 1)
    h = _conv_bn(b, h, f"{name}.depthwise", h.channels, 3, stride, group=h.channels)
    h = _conv_bn(b, h, f"{name}.project", channels, 1, activation=False)
    if stride == 1 and x.channels == channels:
        h = b.add(h, x, f"{name}.add")
    return h


def mobilenetv2(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0) as in torchvision, 1x3x224x224 -> logits 1x1000."""
    b = GraphBuilder(seed)
    x = _conv_bn(b, Act("input", IMAGE_SHAPE[1], 0.0, 1.0), "stem", 32, 3, stride=2)
    index = 0
    for expansion, channels, repeats, stride in MOBILENETV2_BLOCKS:
        for repeat in range(repeats):
            index += 1
            x = _inverted_residual(b, x, f"block{index}", expansion, channels,
                                   stride if repeat == 0 else 1)
    x = _conv_bn(b, x, "head", 1280, 1)
    return b.model("mobilenetv2", IMAGE_SHAPE, b.classifier(x),
                   f"MobileNetV2 with random He-normal weights (seed {seed}), for benchmarking.")


# SqueezeNet 1.1 (Iandola et al. 2016; torchvision's squeezenet1_1): the fire modules' squeeze
# and expand widths, with a max-pool after the second and the fourth.
SQUEEZENET_FIRES = ((16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256),
                    (64, 256))


def _fire(b: GraphBuilder, x: Act, name: str, squeeze: int, expand: int) -> Act:
    """A 1x1 squeeze, then 1x1 and 3x3 expands side by side: the Concat the compiler removes
    (both expands write straight into its buffer)."""
    s = _conv_bn_relu(b, x, f"{name}.squeeze", squeeze, 1)
    e1 = _conv_bn_relu(b, s, f"{name}.expand1x1", expand, 1)
    e3 = _conv_bn_relu(b, s, f"{name}.expand3x3", expand, 3)
    return b.concat([e1, e3], f"{name}.cat")


def _conv_bn_relu(b: GraphBuilder, x: Act, name: str, channels: int, kernel: int,
                  stride: int = 1) -> Act:
    h = b.batchnorm(b.conv(x, name, channels, kernel, stride), f"{name}.bn")
    return b.relu(h, f"{name}.relu")


def squeezenet(seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1 with a BatchNormalization after each conv (folded away) and the
    classifier of the other models, 1x3x224x224 -> logits 1x1000."""
    b = GraphBuilder(seed)
    x = _conv_bn_relu(b, Act("input", IMAGE_SHAPE[1], 0.0, 1.0), "features.0", 64, 3, stride=2)
    x = b.maxpool(x, "features.2", kernel=3, stride=2)
    for index, (squeeze, expand) in enumerate(SQUEEZENET_FIRES):
        x = _fire(b, x, f"fire{index + 2}", squeeze, expand)
        if index in (1, 3):
            x = b.maxpool(x, f"pool{index + 2}", kernel=3, stride=2)
    return b.model("squeezenet", IMAGE_SHAPE, b.classifier(x),
                   f"SqueezeNet 1.1 with random He-normal weights (seed {seed}), for benchmarking.")


def mlp(seed: int = 0, features: tuple[int, ...] = (784, 512, 256, 10)) -> onnx.ModelProto:
    """Gemm layers of the given widths with ReLU between them: small enough to trace whole."""
    b = GraphBuilder(seed)
    x = Act("input", features[0], 0.0, 1.0)
    layers = len(features) - 1
    for i, width in enumerate(features[1:], start=1):
        if i < layers:
            x = b.relu(b.gemm(x, f"fc{i}", width), f"relu{i}")
        else:
            x = b.gemm(x, f"fc{i}", width, output="logits")
    widths = "-".join(map(str, features))
    return b.model("mlp", (1, features[0]), x,
                   f"MLP {widths} with random He-normal weights (seed {seed}), for benchmarking.")


MODELS = {"resnet18": resnet18, "mobilenetv2": mobilenetv2, "squeezenet": squeezenet, "mlp": mlp}
