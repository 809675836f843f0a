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
from onnx import helper

from tests.e2e.flow import compile_and_check
from tests.onnx_builder import model, weights

# (input channels, output channels, input size, kernel, stride, pad): a U-Net decoder's step
# and a DB text detector's head.
SHAPES = ((32, 16, 16, 4, 2, 1), (64, 32, 16, 2, 2, 0), (16, 8, 12, 3, 3, 0))


def conv_transpose(cin, cout, size, kernel, stride, pad):
    rng = np.random.default_rng(0)
    out = (size - 1) * stride + kernel - 2 * pad
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[stride] * 2,
                            pads=[pad] * 4, name="up")
    return model([node], {"x": [1, cin, size, size]}, {"y": [1, cout, out, out]},
                 {"w": weights(rng, cin, cout, kernel, kernel), "b": weights(rng, cout)})


def zero_inserted(cin, cout, size, kernel, stride, pad):
    rng = np.random.default_rng(0)
    dense = (size - 1) * stride + 1 + 2 * (kernel - 1 - pad)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="dense")
    out = dense - kernel + 1
    return model([node], {"x": [1, cin, dense, dense]}, {"y": [1, cout, out, out]},
                 {"w": weights(rng, cout, cin, kernel, kernel), "b": weights(rng, cout)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="default,edge")
    args = parser.parse_args()
    print(f"{'preset':8} {'shape (Cin,Cout,H,k,s,p)':26} {'lowering':14} {'cycles':>8} "
          f"{'array MACs':>11} {'DRAM bytes':>11}")
    for preset in args.presets.split(","):
        for shape in SHAPES:
            for name, build in (("phases", conv_transpose), ("zero-inserted", zero_inserted)):
                _, result = compile_and_check(build(*shape), preset, count=1)
                stats = result.stats
                print(f"{preset:8} {str(shape):26} {name:14} {stats.cycles:8d} "
                      f"{stats.macs:11d} {stats.dram_bytes_read + stats.dram_bytes_written:11d}")


if __name__ == "__main__":
    main()
