"""Programs for batch N: a dynamic-batch model profiled at batch 1 and compiled for batch 4
tiles the batch like any other axis, bit-exact against the integer reference, each batch
element equal to what the batch-1 program gives for that sample alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from ember.flow import CompileOptions, compile_model
from quantizer.reference import run_int8
from simulator import machine
from tests import onnx_builder as ob
from tests.cli import invoke
from tests.e2e.flow import check_bit_exact, compile_and_check
from tests.e2e.models import chain


def dynamic_batch_model() -> onnx.ModelProto:
    """image[N,3,8,8] → Conv → Relu → (+ residual Conv) → MaxPool → Flatten → Gemm → y[N,10]."""
    rng = np.random.default_rng(7)
    inits = {"w1": ob.weights(rng, 8, 3, 3, 3), "b1": ob.weights(rng, 8),
             "w2": ob.weights(rng, 8, 8, 3, 3), "b2": ob.weights(rng, 8),
             "w3": ob.weights(rng, 10, 8 * 4 * 4), "b3": ob.weights(rng, 10)}
    nodes = [helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["r1", "c2"], ["s"], name="residual"),
             helper.make_node("MaxPool", ["s"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1)]
    return ob.model(nodes, {"image": ["N", 3, 8, 8]}, {"y": ["N", 10]}, inits)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model, 10 calibration samples and their profile made at batch 1 by the CLI."""
    tmp = tmp_path_factory.mktemp("batch")
    onnx.save(dynamic_batch_model(), tmp / "dyn.onnx")
    samples = np.random.default_rng(1).standard_normal((10, 3, 8, 8)).astype(np.float32)
    np.savez(tmp / "ten.npz", image=samples)
    result = invoke("quantize-profile", tmp / "dyn.onnx", "--data", tmp / "ten.npz",
                    "--input-shape", "image=1,3,8,8", "-o", tmp / "p.json")
    assert result.exit_code == 0, result.output
    return tmp, samples


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_a_batch_4_program_equals_the_reference_and_the_batch_1_program(files, preset) -> None:
    tmp, samples = files
    one = compile_model(tmp / "dyn.onnx", tmp / "p.json", CompileOptions(), preset)
    four = compile_model(tmp / "dyn.onnx", tmp / "p.json",
                         CompileOptions(input_shapes={"image": (4, 3, 8, 8)}), preset)
    assert four.compiled.program.inputs[0].shape == (4, 3, 8, 8)
    check_bit_exact(four.qgraph, four.compiled,
                    [{"image": samples[:4]}, {"image": samples[4:8]}])
    program, binding = four.compiled.program, four.compiled.program.inputs[0]
    batched = machine.run(program, {binding.name: binding.quantize(samples[:4])}).outputs["y"]
    single = one.compiled.program
    for n in range(4):
        alone = machine.run(single, {binding.name: single.inputs[0].quantize(samples[n:n + 1])})
        np.testing.assert_array_equal(batched[n:n + 1], alone.outputs["y"])
    # The integer reference agrees too: batching changes no value.
    np.testing.assert_array_equal(run_int8(four.qgraph, {"image": samples[:4]})["y"],
                                  np.concatenate([run_int8(one.qgraph, {"image": s[None]})["y"]
                                                  for s in samples[:4]]))


def test_simulate_groups_samples_into_the_programs_batches(files) -> None:
    """10 samples through a batch-4 program: three runs, the last filled, and said so."""
    tmp, _ = files
    for shape, name in (("1,3,8,8", "one"), ("4,3,8,8", "four")):
        result = invoke("compile", tmp / "dyn.onnx", "--profile", tmp / "p.json",
                        "--input-shape", f"image={shape}", "-o", tmp / f"{name}.ember")
        assert result.exit_code == 0, result.output
        result = invoke("simulate", tmp / f"{name}.ember", "-i", tmp / "ten.npz",
                        "-o", tmp / f"{name}.npz", "--json")
        assert result.exit_code == 0, result.output
    assert ("10 samples in 3 runs of 4 (the last filled with 2 zero-point samples, their "
            "outputs dropped)") in result.stderr
    four, one = np.load(tmp / "four.npz")["y"], np.load(tmp / "one.npz")["y"]
    assert four.shape == (10, 10) and one.shape == (10, 1, 10)
    np.testing.assert_array_equal(four, one[:, 0])


@pytest.mark.parametrize("preset", ["default", "edge"])
def test_a_batch_kept_on_chip_is_bit_exact(preset) -> None:
    """The chain keeps its tensors in the scratchpad, one block per image: every image's
    output still equals the integer reference."""
    compile_and_check(ob.with_batch(chain(), 3), preset, count=2)
