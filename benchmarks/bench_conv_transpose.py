"""ConvTranspose on the accelerator: its phase lowering (stride_h x stride_w stride-1
convolutions into strided Views of the output) against the zero-inserted alternative, the same
weights as one dense stride-1 convolution over the input with stride - 1 zeros between its
pixels, already in DRAM (so the copy that would insert them is not even counted).

Prints, per preset and shape: simulated cycles, array MACs and DRAM bytes of each, bit-exact
against the integer reference.

    .venv/bin/python benchmarks/bench_conv_transpose.py [--presets default,edge]
"""

from __future__ import annotations

import argparse

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from compiler.pipeline import compile_int8
from ember.accuracy import BitExactness
from ember.flow import quantize_model
from profiler.model_inputs import input_specs
from profiler.run import RunOptions, profile
from profiler.sources.arrays import RandomData
from quantizer.reference import run_int8
from simulator.arch import Arch

# (input channels, output channels, input size, kernel, stride, pad): a U-Net decoder's step
# and a DB text detector's head.
SHAPES = ((32, 16, 16, 4, 2, 1), (64, 32, 16, 2, 2, 0), (16, 8, 12, 3, 3, 0))


def one_node(op, size, weight_shape, cout, out, **attrs):
    """A model of one `op` node over a 1 x C x size x size input, seeded weights and bias."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
             for name, shape in (("w", weight_shape), ("b", (cout,)))]
    cin = weight_shape[0] if op == "ConvTranspose" else weight_shape[1]
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "w", "b"], ["y"], name=op.lower(), **attrs)], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, out, out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_transpose(cin, cout, size, kernel, stride, pad):
    out = (size - 1) * stride + kernel - 2 * pad
    return one_node("ConvTranspose", size, (cin, cout, kernel, kernel), cout, out,
                    strides=[stride] * 2, pads=[pad] * 4)


def zero_inserted(cin, cout, size, kernel, stride, pad):
    dense = (size - 1) * stride + 1 + 2 * (kernel - 1 - pad)
    return one_node("Conv", dense, (cout, cin, kernel, kernel), cout, dense - kernel + 1)


def simulate(proto, preset):
    """The simulator's statistics of the compiled model, checked bit-exact on one sample."""
    specs = input_specs(proto, {})
    qgraph = quantize_model(proto, profile(proto, RandomData(4, specs, 0), specs,
                                           RunOptions())).qgraph
    program = compile_int8(qgraph, Arch.load(preset)).program
    exactness = BitExactness(program, qgraph)
    sample = {s.name: np.random.default_rng(1).standard_normal(s.shape).astype(np.float32)
              for s in specs}
    stats = exactness.check(run_int8(qgraph, sample, keep_all=True))
    assert exactness.first_difference is None, exactness.first_difference
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="default,edge")
    args = parser.parse_args()
    print(f"{'preset':8} {'shape (Cin,Cout,H,k,s,p)':26} {'lowering':14} {'cycles':>8} "
          f"{'array MACs':>11} {'DRAM bytes':>11}")
    for preset in args.presets.split(","):
        for shape in SHAPES:
            for name, build in (("phases", conv_transpose), ("zero-inserted", zero_inserted)):
                stats = simulate(build(*shape), preset)
                print(f"{preset:8} {str(shape):26} {name:14} {stats.cycles:8d} "
                      f"{stats.macs:11d} {stats.dram_bytes_read + stats.dram_bytes_written:11d}")


if __name__ == "__main__":
    main()
