"""Splitting a sliced convolution: Before (one Conv, its output read only by Slices of its
channels, or of its last spatial axis) / Expected (one Conv per slice, on its rows of the weight
or its window of the input), the fp32 output equal to onnxruntime's; what must not split."""

from __future__ import annotations

import numpy as np
from onnx import helper

from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.fold_constants import fold_constants
from compiler.passes.split_sliced_conv import split_sliced_conv
from ember import ort
from tests.onnx_builder import model

C, L, K, S = 6, 40, 8, 4
FRAMES = (L - K) // S + 1


def stft_like(pads: int = 0, extra_reader: bool = False):
    """x [2, 1, L] → Conv (2C channels, K taps, stride S) → the two channel halves, each
    without its first frame → Add."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w", "b"], ["z"], name="conv", strides=[S], pads=[0, pads]),
             n("Slice", ["z", "c0", "c1", "a1"], ["re0"], name="real"),
             n("Slice", ["z", "c1", "c2", "a1"], ["im0"], name="imag"),
             n("Slice", ["re0", "t0", "t1", "a2"], ["re"], name="re_frames"),
             n("Slice", ["im0", "t0", "t1", "a2"], ["im"], name="im_frames"),
             n("Add", ["re", "im"], ["y"], name="sum")]
    frames = (L + pads - K) // S + 1
    outputs = {"y": [2, C, frames - 1]}
    if extra_reader:
        nodes.append(n("Relu", ["z"], ["r"], name="also"))
        outputs["r"] = [2, 2 * C, frames]
    inits = {"w": rng.normal(0, 1, (2 * C, 1, K)).astype(np.float32),
             "b": rng.normal(0, 1, 2 * C).astype(np.float32),
             "c0": np.array([0]), "c1": np.array([C]), "c2": np.array([2 * C]),
             "a1": np.array([1]), "t0": np.array([1]), "t1": np.array([frames]),
             "a2": np.array([2])}
    return model(nodes, {"x": [2, 1, L]}, outputs, inits)


def passes(proto):
    return eliminate_dead(split_sliced_conv(fold_constants(import_model(proto))))


def test_each_slice_becomes_its_own_conv_and_the_function_is_kept() -> None:
    proto = stft_like()
    graph = passes(proto)
    convs = [node for node in graph.nodes if node.op == "Conv"]
    assert len(convs) == 2 and [node.op for node in graph.nodes].count("Slice") == 2
    for conv in convs:  # half the channels, on the input window of the frames kept
        assert graph.values[conv.inputs[1]].const.shape == (C, 1, K)
        assert graph.type_of(conv.inputs[0]).shape == (2, 1, (FRAMES - 1) * S + K - S)
        assert graph.type_of(conv.outputs[0]).shape == (2, C, FRAMES - 1)
    x = {"x": np.random.default_rng(2).normal(0, 1, (2, 1, L)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(graph, x)["y"], ort.run(ort.session(proto), x)["y"],
                               rtol=1e-5, atol=1e-5)


def test_a_padded_axis_keeps_its_frame_slice_and_another_reader_keeps_the_conv() -> None:
    padded = passes(stft_like(pads=4))  # the channel split still happens, the frames stay
    assert [node.op for node in padded.nodes].count("Conv") == 2
    assert all(padded.type_of(n.outputs[0]).shape[-1] == (L + 4 - K) // S + 1
               for n in padded.nodes if n.op == "Conv")
    shared = passes(stft_like(extra_reader=True))
    assert [node.op for node in shared.nodes].count("Conv") == 1
