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


def gaussian_moments(fn, x: Act) -> tuple[float, float]:
    """Mean and mean square of fn(z) for z ~ N(x.mean, x.std**2), by Gauss-Hermite quadrature
    (hard-swish, SiLU and hard-sigmoid have no closed form as handy as ReLU's)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(64)
    values = fn(x.mean + x.std * nodes)
    weights = weights / weights.sum()
    return float(weights @ values), float(weights @ values**2)


def _hard_sigmoid(z):
    return np.clip(z + 3.0, 0.0, 6.0) / 6.0


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

    def batchnorm(self, x: Act, name: str, dead: tuple[int, ...] = ()) -> Act:
        """Running statistics near the input's estimated ones, gamma and beta near identity;
        the `dead` channels as training with an L1 penalty on gamma leaves them: gamma 1e-9
        and beta -1.2 (folded: weights of about 1e-9 and a bias of -1.2)."""
        c, rng = x.channels, self.rng
        scale = rng.uniform(0.7, 1.3, c)
        bias = rng.normal(0.0, 0.1, c)
        scale[list(dead)], bias[list(dead)] = 1e-9, -1.2
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

    def maxpool(self, x: Act, name: str, kernel: int, stride: int,
                pad: int | None = None) -> Act:
        """Follows a ReLU of N(0, s^2): the max of nine of those is about N(1.49 s, (0.6 s)^2).
        Padded by kernel // 2 unless `pad` says otherwise."""
        pad = kernel // 2 if pad is None else pad
        out = self._node("MaxPool", [x.name], name, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[pad] * 4)
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

    def scalar(self, value: float) -> str:
        """A shared scalar initializer, named by its value."""
        name = f"const.{value:g}"
        if not any(t.name == name for t in self.initializers):
            self._constant(name, np.array(value))
        return name

    def conv_bias(self, x: Act, name: str, channels: int, kernel: int = 1,
                  stride: int = 1) -> Act:
        """A convolution with a bias and no BatchNormalization (SE layers, detection heads)."""
        weight = self._constant(f"{name}.weight", self._he_normal(
            (channels, x.channels, kernel, kernel)))
        bias = self._constant(f"{name}.bias", self.rng.normal(0.0, 0.1, channels))
        out = self._node("Conv", [x.name, weight, bias], name, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[kernel // 2] * 4)
        return Act(out, channels, 0.0, 2 * x.mean_square + 0.01)

    def hard_sigmoid(self, x: Act, name: str) -> Act:
        """Written out as exporters of torch's hardsigmoid do: Clip(x + 3, 0, 6) / 6."""
        shifted = self._node("Add", [x.name, self.scalar(3.0)], f"{name}.add")
        clipped = self._node("Clip", [shifted, self.scalar(0.0), self.scalar(6.0)],
                             f"{name}.clip")
        out = self._node("Div", [clipped, self.scalar(6.0)], name)
        return Act(out, x.channels, *gaussian_moments(_hard_sigmoid, x))

    def hard_swish(self, x: Act, name: str) -> Act:
        """Written out: x * Clip(x + 3, 0, 6) / 6 (the Div a MobileNetV3 export carries)."""
        shifted = self._node("Add", [x.name, self.scalar(3.0)], f"{name}.add")
        clipped = self._node("Clip", [shifted, self.scalar(0.0), self.scalar(6.0)],
                             f"{name}.clip")
        product = self._node("Mul", [x.name, clipped], f"{name}.mul")
        out = self._node("Div", [product, self.scalar(6.0)], name)
        return Act(out, x.channels, *gaussian_moments(lambda z: z * _hard_sigmoid(z), x))

    def silu(self, x: Act, name: str) -> Act:
        """Written out as every YOLO since v5 exports it: x * Sigmoid(x)."""
        gate = self._node("Sigmoid", [x.name], f"{name}.sigmoid")
        return Act(self._node("Mul", [x.name, gate], name), x.channels,
                   *gaussian_moments(lambda z: z / (1.0 + np.exp(-z)), x))

    def mul(self, x: Act, gate: Act, name: str) -> Act:
        """x times a gate (broadcast over H and W for squeeze-and-excitation), taken as
        independent of x."""
        return Act(self._node("Mul", [x.name, gate.name], name), x.channels,
                   x.mean * gate.mean, x.mean_square * gate.mean_square)

    def global_pool(self, x: Act, name: str) -> Act:
        return Act(self._node("GlobalAveragePool", [x.name], name), x.channels, x.mean,
                   x.mean**2 + (x.mean_square - x.mean**2) / 4)

    def upsample(self, x: Act, name: str) -> Act:
        """Nearest 2x, as a YOLO neck writes it (Resize with scales)."""
        scales = self._constant(f"{name}.scales", np.array([1, 1, 2, 2], np.float32))
        out = self._node("Resize", [x.name, "", scales], name, mode="nearest")
        return Act(out, x.channels, x.mean, x.mean_square)

    def conv_transpose(self, x: Act, name: str, channels: int) -> Act:
        """2x2, stride 2: a U-Net decoder's upsampling, no bias (a BatchNormalization follows)."""
        weight = self._constant(f"{name}.weight", self.rng.standard_normal(
            (x.channels, channels, 2, 2), dtype=np.float32) * np.float32(np.sqrt(2 / x.channels)))
        out = self._node("ConvTranspose", [x.name, weight], name, kernel_shape=[2, 2],
                         strides=[2, 2])
        return Act(out, channels, 0.0, 2 * x.mean_square)

    def model(self, name: str, x_shape: tuple[int, ...], out: Act | list[tuple[Act, list[int]]],
              doc: str) -> onnx.ModelProto:
        """One input "input"; one output [1, channels] (a classifier), or several of the given
        shapes."""
        outputs = out if isinstance(out, list) else [(out, [1, out.channels])]
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info(act.name, TensorProto.FLOAT, shape)
             for act, shape in outputs],
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


# MobileNetV3-Small (Howard et al. 2019, table 2; torchvision's mobilenet_v3_small): kernel,
# expanded channels, output channels, squeeze-and-excitation, hard-swish (else ReLU), stride.
MOBILENETV3_SMALL_BLOCKS = (
    (3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1))


def _divisible(channels: float, by: int = 8) -> int:
    """torchvision's _make_divisible: the nearest multiple of `by`, never 10% below."""
    rounded = max(by, int(channels + by / 2) // by * by)
    return rounded + by if rounded < 0.9 * channels else rounded


def _squeeze_excite(b: GraphBuilder, x: Act, name: str) -> Act:
    """Global mean, 1x1 squeeze + ReLU, 1x1 expand + hard-sigmoid, the gate times the map."""
    s = b.global_pool(x, f"{name}.avgpool")
    s = b.relu(b.conv_bias(s, f"{name}.fc1", _divisible(x.channels // 4)), f"{name}.relu")
    gate = b.hard_sigmoid(b.conv_bias(s, f"{name}.fc2", x.channels), f"{name}.hardsigmoid")
    return b.mul(x, gate, f"{name}.scale")


def _v3_block(b: GraphBuilder, x: Act, name: str, kernel: int, expanded: int, channels: int,
              se: bool, hard_swish: bool, stride: int) -> Act:
    def act(h: Act, label: str) -> Act:
        return b.hard_swish(h, label) if hard_swish else b.relu(h, label)
    h = x
    if expanded != x.channels:
        h = act(b.batchnorm(b.conv(h, f"{name}.expand", expanded, 1), f"{name}.expand.bn"),
                f"{name}.expand.act")
    h = act(b.batchnorm(b.conv(h, f"{name}.depthwise", expanded, kernel, stride,
                               group=expanded), f"{name}.depthwise.bn"), f"{name}.depthwise.act")
    if se:
        h = _squeeze_excite(b, h, f"{name}.se")
    h = b.batchnorm(b.conv(h, f"{name}.project", channels, 1), f"{name}.project.bn")
    if stride == 1 and x.channels == channels:
        h = b.add(h, x, f"{name}.add")
    return h


def mobilenetv3_small(seed: int = 0, image: int = 224) -> onnx.ModelProto:
    """MobileNetV3-Small as torchvision builds it, 1x3xSxS -> logits 1x1000, with hard-swish and
    hard-sigmoid written out (Add, Clip, Mul, Div) as older exports carry them."""
    b = GraphBuilder(seed)
    x = Act("input", 3, 0.0, 1.0)
    x = b.hard_swish(b.batchnorm(b.conv(x, "stem", 16, 3, stride=2), "stem.bn"), "stem.act")
    for index, block in enumerate(MOBILENETV3_SMALL_BLOCKS, start=1):
        x = _v3_block(b, x, f"block{index}", *block)
    x = b.hard_swish(b.batchnorm(b.conv(x, "head", 576, 1), "head.bn"), "head.act")
    x = Act(b._node("Flatten", [b.global_pool(x, "avgpool").name], "flatten", axis=1),
            x.channels, x.mean, x.mean_square)
    x = b.hard_swish(b.gemm(x, "classifier.0", 1024), "classifier.1")
    return b.model("mobilenetv3_small", (1, 3, image, image),
                   b.gemm(x, "classifier.3", CLASSES, output="logits"),
                   f"MobileNetV3-Small with random He-normal weights (seed {seed}), for "
                   f"benchmarking.")


def _conv_bn_silu(b: GraphBuilder, x: Act, name: str, channels: int, kernel: int = 1,
                  stride: int = 1) -> Act:
    return b.silu(b.batchnorm(b.conv(x, f"{name}.conv", channels, kernel, stride),
                              f"{name}.bn"), f"{name}.act")


def _csp(b: GraphBuilder, x: Act, name: str, channels: int) -> Act:
    """A YOLO CSP block: two 1x1 halves, one through a residual 3x3 pair, concatenated."""
    half = channels // 2
    a = _conv_bn_silu(b, x, f"{name}.cv1", half)
    h = _conv_bn_silu(b, x, f"{name}.cv2", half)
    r = _conv_bn_silu(b, _conv_bn_silu(b, h, f"{name}.m.cv1", half, 3), f"{name}.m.cv2", half, 3)
    h = b.add(h, r, f"{name}.m.add")
    return _conv_bn_silu(b, b.concat([a, h], f"{name}.cat"), f"{name}.cv3", channels)


def _sppf(b: GraphBuilder, x: Act, name: str) -> Act:
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools, all four concatenated."""
    h = _conv_bn_silu(b, x, f"{name}.cv1", x.channels // 2)
    pools = [h]
    for i in range(3):
        pools.append(b.maxpool(pools[-1], f"{name}.m{i}", kernel=5, stride=1))
    return _conv_bn_silu(b, b.concat(pools, f"{name}.cat"), f"{name}.cv2", x.channels)


def _decoupled_head(b: GraphBuilder, x: Act, name: str, classes: int) -> tuple[Act, Act]:
    """Separate box and class branches (YOLOX, YOLOv8): two 3x3 convs each, then 1x1 outputs."""
    box = _conv_bn_silu(b, _conv_bn_silu(b, x, f"{name}.box0", x.channels, 3), f"{name}.box1",
                        x.channels, 3)
    cls = _conv_bn_silu(b, _conv_bn_silu(b, x, f"{name}.cls0", x.channels, 3), f"{name}.cls1",
                        x.channels, 3)
    return (b.conv_bias(box, f"{name}.box", 4), b.conv_bias(cls, f"{name}.cls", classes))


def yolo(seed: int = 0, image: int = 256, classes: int = 80) -> onnx.ModelProto:
    """A small YOLO-style detector (v5/v8 parts at nano width): SiLU written out, CSP blocks,
    SPPF, a nearest-2x upsampling neck with Concat, and decoupled heads at strides 16 and 32;
    1x3xSxS -> box and class maps per stride."""
    b = GraphBuilder(seed)
    x = _conv_bn_silu(b, Act("input", 3, 0.0, 1.0), "stem", 16, 3, 2)
    x = _conv_bn_silu(b, x, "down1", 32, 3, 2)
    x = _csp(b, x, "stage1", 32)
    x = _conv_bn_silu(b, x, "down2", 64, 3, 2)
    x = _csp(b, x, "stage2", 64)
    p4 = _csp(b, _conv_bn_silu(b, x, "down3", 96, 3, 2), "stage3", 96)
    p5 = _sppf(b, _csp(b, _conv_bn_silu(b, p4, "down4", 128, 3, 2), "stage4", 128), "sppf")
    up = b.upsample(_conv_bn_silu(b, p5, "neck.reduce", 96), "neck.up")
    n4 = _csp(b, b.concat([up, p4], "neck.cat"), "neck.csp", 96)
    heads = []
    for stride, feature in ((16, n4), (32, p5)):
        side = image // stride
        box, cls = _decoupled_head(b, feature, f"head{stride}", classes)
        heads += [(box, [1, 4, side, side]), (cls, [1, classes, side, side])]
    return b.model("yolo", (1, 3, image, image), heads,
                   f"A small YOLO-style detector with random weights (seed {seed}), for "
                   f"benchmarking.")


def unet(seed: int = 0, image: int = 128, classes: int = 2) -> onnx.ModelProto:
    """A small U-Net (Ronneberger et al. 2015): two 2x downsamplings, ConvTranspose
    upsampling, skip Concats; 1x3xSxS -> class scores 1xKxSxS."""
    b = GraphBuilder(seed)

    def double(x: Act, name: str, channels: int) -> Act:
        x = _conv_bn_relu(b, x, f"{name}.0", channels, 3)
        return _conv_bn_relu(b, x, f"{name}.1", channels, 3)

    e1 = double(Act("input", 3, 0.0, 1.0), "enc1", 16)
    e2 = double(b.maxpool(e1, "pool1", kernel=2, stride=2, pad=0), "enc2", 32)
    mid = double(b.maxpool(e2, "pool2", kernel=2, stride=2, pad=0), "bottleneck", 64)
    for name, skip in (("dec2", e2), ("dec1", e1)):
        up = b.relu(b.batchnorm(b.conv_transpose(mid, f"{name}.up", skip.channels),
                                f"{name}.up.bn"), f"{name}.up.relu")
        mid = double(b.concat([up, skip], f"{name}.cat"), name, skip.channels)
    scores = b.conv_bias(mid, "scores", classes)
    return b.model("unet", (1, 3, image, image), [(scores, [1, classes, image, image])],
                   f"A small U-Net with random weights (seed {seed}), for benchmarking.")


# EfficientNet-Lite0 (Tan and Le 2019; the Lite variant drops squeeze-and-excitation and uses
# ReLU6): expansion, output channels, repeats, stride, depthwise kernel.
EFFICIENTNET_LITE0_BLOCKS = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5),
                             (6, 80, 3, 2, 3), (6, 112, 3, 1, 5), (6, 192, 4, 2, 5),
                             (6, 320, 1, 1, 3))
# Dead channels per BatchNormalization, as pruning leaves them in a pretrained model: after an
# expansion (ReLU6 makes them 0, so the depthwise convolution after it sees a constant), in a
# projection (no activation: a constant -1.2 joins the residual sum) and in the head. Each
# index exists at width 0.25 too.
EFFICIENTNET_LITE_DEAD = {"blocks.1.expand.bn": (3, 17, 40), "blocks.4.expand.bn": (10,),
                          "blocks.5.project.bn": (7,), "head.bn": (5, 200)}


def efficientnet_lite0(seed: int = 0, image: int = 224, width: float = 1.0,
                       classes: int = CLASSES) -> onnx.ModelProto:
    """EfficientNet-Lite0's layout (MBConv: 1x1 expansion, 3x3 or 5x5 depthwise, linear 1x1
    projection, residual Add; ReLU6; 1280-channel head), 1x3xSxS -> logits 1 x classes, with a
    few dead channels (EFFICIENTNET_LITE_DEAD) of the kind the quantizer must floor, not refuse.
    `width` scales every layer's channels, the stem and head too (narrow models for tests)."""
    b = GraphBuilder(seed)

    def conv_bn(x: Act, name: str, channels: int, kernel: int, stride: int = 1,
                group: int = 1, activation: bool = True) -> Act:
        h = b.batchnorm(b.conv(x, name, channels, kernel, stride, group), f"{name}.bn",
                        EFFICIENTNET_LITE_DEAD.get(f"{name}.bn", ()))
        return b.relu6(h, f"{name}.relu6") if activation else h

    x = conv_bn(Act("input", 3, 0.0, 1.0), "stem", _divisible(32 * width), 3, stride=2)
    index = 0
    for expansion, channels, repeats, stride, kernel in EFFICIENTNET_LITE0_BLOCKS:
        channels = _divisible(channels * width)
        for repeat in range(repeats):
            name, h, step = f"blocks.{index}", x, stride if repeat == 0 else 1
            if expansion != 1:
                h = conv_bn(h, f"{name}.expand", x.channels * expansion, 1)
            h = conv_bn(h, f"{name}.depthwise", h.channels, kernel, step, group=h.channels)
            h = conv_bn(h, f"{name}.project", channels, 1, activation=False)
            if step == 1 and x.channels == channels:
                h = b.add(h, x, f"{name}.add")
            x, index = h, index + 1
    x = conv_bn(x, "head", _divisible(1280 * width), 1)
    x = Act(b._node("Flatten", [b.global_pool(x, "avgpool").name], "flatten", axis=1),
            x.channels, x.mean, x.mean_square)
    return b.model("efficientnet_lite0", (1, 3, image, image),
                   b.gemm(x, "fc", classes, output="logits"),
                   f"EfficientNet-Lite0 with random He-normal weights and dead channels (seed "
                   f"{seed}), for benchmarking.")


def lstm_classifier(seed: int = 0, steps: int = 16, features: int = 20, hidden: int = 32,
                    classes: int = 10) -> onnx.ModelProto:
    """A sequence classifier as torch exports one: features [1, T, F] (batch first), made
    time-major for a one-layer LSTM of `hidden` units, the last hidden state through a Linear
    to logits [1, classes]. Weights uniform at 3x PyTorch's ±1/√H bound, as trained recurrent
    weights grow, so the gates use their range. The importer unrolls the LSTM into T steps of
    MatMuls, gate tables and products."""
    rng = np.random.default_rng(seed)
    bound = 3 / np.sqrt(hidden)

    def uniform(*shape: int) -> np.ndarray:
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("lstm.W", uniform(1, 4 * hidden, features)), ("lstm.R", uniform(1, 4 * hidden, hidden)),
        ("lstm.B", uniform(1, 8 * hidden)), ("fc.weight", uniform(classes, hidden)),
        ("fc.bias", uniform(classes)), ("flat", np.array([1, hidden], np.int64)))]
    nodes = [helper.make_node("Transpose", ["input"], ["time_major"], name="time_major",
                              perm=[1, 0, 2]),
             helper.make_node("LSTM", ["time_major", "lstm.W", "lstm.R", "lstm.B"],
                              ["", "lstm.h"], name="lstm", hidden_size=hidden),
             helper.make_node("Reshape", ["lstm.h", "flat"], ["last"], name="last"),
             helper.make_node("Gemm", ["last", "fc.weight", "fc.bias"], ["logits"], name="fc",
                              transB=1)]
    graph = helper.make_graph(
        nodes, "lstm_classifier",
        [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT,
                                       [1, steps, features])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.doc_string = (f"A one-layer LSTM sequence classifier with random weights (seed {seed}), "
                        "for benchmarking.")
    return model


def transformer_encoder(seed: int = 0, tokens: int = 32, width: int = 64, heads: int = 4,
                        blocks: int = 2, hidden: int = 128, vocab: int = 256,
                        mask: bool = False) -> onnx.ModelProto:
    """A BERT-style sentence encoder as torch exports one (opset 17), over token ids
    `input_ids` [1, tokens] (int64): word embeddings (a Gather of the table by the ids) plus
    position embeddings (a Gather by a constant range), LayerNormalization, `blocks` post-norm
    blocks of multi-head self-attention (Q/K/V projections with biases, heads by Reshape and
    Transpose, Q·Kᵀ/√d, Softmax, P·V, heads merged, output projection, residual,
    LayerNormalization) and a feed-forward (MatMul, GELU written with Erf, MatMul, residual,
    LayerNormalization), then mean pooling over the tokens → [1, width]. With `mask`, an
    `attention_mask` [1, tokens] (int64, 1 for a token, 0 for padding) as transformers and
    sentence-transformers write it: (1 - mask) · float32's lowest added to the scores, and the
    mean over the unmasked tokens (the mask expanded, multiplied, summed, divided by its
    clipped sum). Weights uniform in ±gain/√fan_in, embeddings normal(0, 1), LayerNorm gammas
    near 1."""
    rng = np.random.default_rng(seed)
    dh = width // heads
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}

    def const(name: str, value) -> str:
        inits[name] = np.asarray(value)
        return name

    def linear(x: str, name: str, fan_in: int, fan_out: int, gain: float = 1.0) -> str:
        bound = gain / np.sqrt(fan_in)
        w = const(f"{name}.weight", rng.uniform(-bound, bound, (fan_in, fan_out))
                  .astype(np.float32))
        b = const(f"{name}.bias", rng.uniform(-bound, bound, fan_out).astype(np.float32))
        nodes.append(helper.make_node("MatMul", [x, w], [f"{name}.mm"], name=f"{name}.mm"))
        nodes.append(helper.make_node("Add", [f"{name}.mm", b], [name], name=name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def norm(x: str, name: str) -> str:
        gamma = const(f"{name}.weight", rng.uniform(0.8, 1.2, width).astype(np.float32))
        beta = const(f"{name}.bias", rng.normal(0, 0.05, width).astype(np.float32))
        return node("LayerNormalization", [x, gamma, beta], name, epsilon=1e-12)

    words = const("embeddings.word.weight", rng.normal(0, 1, (vocab, width)).astype(np.float32))
    places = const("embeddings.position.weight",
                   rng.normal(0, 0.5, (tokens, width)).astype(np.float32))
    positions = const("embeddings.position_ids", np.arange(tokens, dtype=np.int64)[None])
    x = node("Add", [node("Gather", [words, "input_ids"], "embeddings.word"),
                     node("Gather", [places, positions], "embeddings.position")],
             "embeddings.sum")
    x = norm(x, "embeddings.norm")
    split = const("shape.heads", np.array([1, tokens, heads, dh], np.int64))
    merged = const("shape.merged", np.array([1, tokens, width], np.int64))
    scale = const("attention.scale", np.float32(1 / np.sqrt(dh)))
    half, one = const("gelu.half", np.float32(0.5)), const("gelu.one", np.float32(1.0))
    root2 = const("gelu.sqrt2", np.float32(np.sqrt(2.0)))
    bias = None
    if mask:
        axes1, axes2 = const("mask.axis1", np.array([1], np.int64)), \
            const("mask.axis2", np.array([2], np.int64))
        wide = node("Unsqueeze", [node("Unsqueeze", ["attention_mask", axes1], "mask.heads"),
                                  axes2], "mask.rows")
        inverted = node("Sub", [one, node("Cast", [wide], "mask.float", to=1)], "mask.inverted")
        lowest = const("mask.lowest", np.float32(np.finfo(np.float32).min))
        bias = node("Mul", [inverted, lowest], "mask.bias")
    for i in range(blocks):
        p = f"layer.{i}"
        # The value and output projections at gain 3: attention averages the values away.
        q, k, v = (node("Reshape", [linear(x, f"{p}.attention.{n}", width, width, gain), split],
                        f"{p}.attention.{n}.heads")
                   for n, gain in (("query", 1), ("key", 1), ("value", 3)))
        q = node("Transpose", [q], f"{p}.attention.q", perm=[0, 2, 1, 3])
        k = node("Transpose", [k], f"{p}.attention.kt", perm=[0, 2, 3, 1])
        v = node("Transpose", [v], f"{p}.attention.v", perm=[0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], f"{p}.attention.scores"), scale],
                      f"{p}.attention.scaled")
        if bias is not None:
            scores = node("Add", [scores, bias], f"{p}.attention.masked")
        probs = node("Softmax", [scores], f"{p}.attention.probs", axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v], f"{p}.attention.context")],
                       f"{p}.attention.merge", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merged], f"{p}.attention.merged")
        attended = linear(context, f"{p}.attention.output", width, width, 3)
        x = norm(node("Add", [attended, x], f"{p}.attention.residual"), f"{p}.attention.norm")
        h = linear(x, f"{p}.intermediate", width, hidden)
        erf = node("Erf", [node("Div", [h, root2], f"{p}.gelu.scaled")], f"{p}.gelu.erf")
        gelu = node("Mul", [node("Mul", [h, half], f"{p}.gelu.half"),
                            node("Add", [erf, one], f"{p}.gelu.shift")], f"{p}.gelu")
        out = linear(gelu, f"{p}.output", hidden, width)
        x = norm(node("Add", [out, x], f"{p}.output.residual"), f"{p}.output.norm")
    inputs = [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [1, tokens])]
    if mask:
        inputs.append(helper.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64,
                                                    [1, tokens]))
        last = const("pool.axis", np.array([-1], np.int64))
        shape = const("pool.shape", np.array([1, tokens, width], np.int64))
        weights = node("Cast", [node("Expand", [node("Unsqueeze", ["attention_mask", last],
                                                     "pool.mask"), shape], "pool.expanded")],
                       "pool.weights", to=1)
        token_axis = const("pool.tokens", np.array([1], np.int64))
        total = node("ReduceSum", [node("Mul", [x, weights], "pool.masked"), token_axis],
                     "pool.sum", keepdims=0)
        count = node("Clip", [node("ReduceSum", [weights, token_axis], "pool.count",
                                   keepdims=0), const("pool.least", np.float32(1e-9))],
                     "pool.clipped")
        node("Div", [total, count], "pooled")
    else:
        node("ReduceMean", [x], "pooled", axes=[1], keepdims=0)
    graph = helper.make_graph(
        nodes, "transformer_encoder", inputs,
        [helper.make_tensor_value_info("pooled", onnx.TensorProto.FLOAT, [1, width])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.doc_string = (f"A {blocks}-block transformer encoder with random weights (seed {seed}), "
                        "for benchmarking.")
    return model


MODELS = {"resnet18": resnet18, "mobilenetv2": mobilenetv2, "squeezenet": squeezenet, "mlp": mlp,
          "mobilenetv3_small": mobilenetv3_small, "yolo": yolo, "unet": unet,
          "efficientnet_lite0": efficientnet_lite0, "lstm_classifier": lstm_classifier,
          "transformer_encoder": transformer_encoder}
