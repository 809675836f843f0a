"""LSTM and GRU unrolled on import: the expanded graph's fp32 outputs equal onnxruntime's on the
original node, over directions, layouts, biases, initial states, peepholes and clip."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from compiler.errors import CompileError
from compiler.frontend.onnx import import_model
from compiler.graph.evaluate import evaluate
from tests.onnx_builder import model

T, B, I, H = 5, 2, 3, 4


def _recurrent(op: str, direction: str = "forward", layout: int = 0, bias: bool = True,
               initial: str = "none", peephole: bool = False, clip: float | None = None,
               before_reset: int = 0, outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"),
               seed: int = 0, **attrs):
    rng = np.random.default_rng(seed)
    gates = 4 if op == "LSTM" else 3
    dirs = 2 if direction == "bidirectional" else 1
    inits = {"W": rng.normal(0, 0.5, (dirs, gates * H, I)).astype(np.float32),
             "R": rng.normal(0, 0.5, (dirs, gates * H, H)).astype(np.float32)}
    names = ["x", "W", "R"]
    if bias:
        inits["B"] = rng.normal(0, 0.3, (dirs, 2 * gates * H)).astype(np.float32)
    names.append("B" if bias else "")
    names.append("")  # sequence_lens
    state = [B, dirs, H] if layout else [dirs, B, H]
    inputs = {"x": [B, T, I] if layout else [T, B, I]}
    feeds = {"x": rng.normal(0, 1, inputs["x"]).astype(np.float32)}
    states = ("initial_h", "initial_c") if op == "LSTM" else ("initial_h",)
    for s in states:
        if initial == "const":
            inits[s] = rng.normal(0, 0.5, state).astype(np.float32)
            names.append(s)
        elif initial == "input":
            inputs[s] = state
            feeds[s] = rng.normal(0, 0.5, state).astype(np.float32)
            names.append(s)
        else:
            names.append("")
    if peephole:
        inits["P"] = rng.normal(0, 0.5, (dirs, 3 * H)).astype(np.float32)
        names.append("P")
    while names and not names[-1]:
        names.pop()
    out_shapes = {"Y": [B, T, dirs, H] if layout else [T, dirs, B, H], "Y_h": state,
                  "Y_c": state}
    outs = [o for o in ("Y", "Y_h", "Y_c")[:3 if op == "LSTM" else 2]]
    node_outs = [o if o in outputs else "" for o in outs]
    while node_outs and not node_outs[-1]:
        node_outs.pop()
    if clip is not None:
        attrs["clip"] = clip
    if op == "GRU":
        attrs["linear_before_reset"] = before_reset
    node = helper.make_node(op, names, node_outs, name="rnn", hidden_size=H,
                            direction=direction, layout=layout, **attrs)
    proto = model([node], inputs, {o: out_shapes[o] for o in node_outs if o}, inits,
                  opset=14)
    return proto, feeds


def _check(proto, feeds, reference=None) -> None:
    """`reference`: the same layer at layout 0 (onnxruntime runs only that), fed and read
    through the batch-major transposes."""
    ref_proto, ref_feeds = (proto, feeds) if reference is None else (reference, {
        k: np.swapaxes(v, 0, 1) for k, v in feeds.items()})
    if reference is not None:  # constant initial states, batch-major → direction-major
        states = {i.name: i for i in proto.graph.initializer}
        for init in ref_proto.graph.initializer:
            if init.name.startswith("initial_"):
                init.CopyFrom(numpy_helper.from_array(
                    np.swapaxes(numpy_helper.to_array(states[init.name]), 0, 1), init.name))
    expected = ort.InferenceSession(ref_proto.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, ref_feeds)
    if reference is not None:
        expected = [np.transpose(e, (2, 0, 1, 3)) if e.ndim == 4 else np.swapaxes(e, 0, 1)
                    for e in expected]
    graph = import_model(proto)
    assert not any(n.op in ("LSTM", "GRU") for n in graph.nodes)
    got = evaluate(graph, feeds)
    for name, want in zip(graph.outputs, expected):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("direction,layout,bias,initial", [
    combo for combo in itertools.product(("forward", "reverse", "bidirectional"), (0, 1),
                                         (True, False), ("none", "const", "input"))])
def test_lstm_equals_onnxruntime(direction, layout, bias, initial) -> None:
    _check(*_recurrent("LSTM", direction, layout, bias, initial),
           _recurrent("LSTM", direction, 0, bias, initial)[0] if layout else None)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes_and_clip(direction) -> None:
    _check(*_recurrent("LSTM", direction, peephole=True, clip=0.7, initial="const"))
    _check(*_recurrent("LSTM", direction, peephole=True, seed=3))


def test_lstm_with_only_the_last_state_as_output() -> None:
    _check(*_recurrent("LSTM", outputs=("Y_h",)))


@pytest.mark.parametrize("direction,layout,before_reset,initial", [
    combo for combo in itertools.product(("forward", "reverse", "bidirectional"), (0, 1),
                                         (0, 1), ("none", "input"))])
def test_gru_equals_onnxruntime(direction, layout, before_reset, initial) -> None:
    _check(*_recurrent("GRU", direction, layout, initial=initial, before_reset=before_reset),
           _recurrent("GRU", direction, 0, initial=initial, before_reset=before_reset)[0]
           if layout else None)


def test_gru_clip_and_no_bias() -> None:
    _check(*_recurrent("GRU", bias=False, clip=0.5, before_reset=1, initial="const"))


def test_lstm_other_activations() -> None:
    _check(*_recurrent("LSTM", activations=["Sigmoid", "Relu", "Tanh"]))


@pytest.mark.parametrize("attrs,message", [
    ({"activations": ["HardSigmoid", "Tanh", "Tanh"], "activation_alpha": [0.2],
      "activation_beta": [0.5]}, "activation_alpha"),
    ({"activations": ["Affine", "Tanh", "Tanh"]}, "'Affine' is not supported"),
    ({"input_forget": 1}, "input_forget=1"),
])
def test_unsupported_attributes_are_named(attrs, message) -> None:
    proto, _ = _recurrent("LSTM", **attrs)
    with pytest.raises(CompileError, match=message) as err:
        import_model(proto, label="rnn.onnx")
    assert str(err.value).startswith("rnn.onnx: node 'rnn' (LSTM)")


def test_shorter_sequence_lens_are_refused() -> None:
    proto, _ = _recurrent("GRU")
    node = proto.graph.node[0]
    node.input.append("lens")
    proto.graph.initializer.append(helper.make_tensor("lens", 6, [B], [T, T - 1]))
    with pytest.raises(CompileError, match="sequence_lens"):
        import_model(proto)
