"""Hand-written programs shared by the simulator tests (imported by module name)."""

import numpy as np

from simulator import isa, numerics
from simulator.arch import Arch
from simulator.program import IOBinding, Program

A_ADDR, W_ADDR, BIAS_ADDR, PARAM_ADDR, OUT_ADDR = 0x0000, 0x1000, 0x2000, 0x3000, 0x4000


def gemm_data(m=32, k=16, n=16, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    bias = rng.integers(-5000, 5000, n).astype(np.int32)
    scales = rng.uniform(1e-4, 1e-2, n)
    mult, shift = zip(*(numerics.quantize_multiplier(float(s)) for s in scales))
    return a, w, bias, np.array(mult, np.int64), np.array(shift, np.int64)


def gemm_program(a, w, bias, mult, shift, out_offset=3, arch="default", lanes=16):
    """out = requantize(a @ w + bias) through LOAD, PRELOAD, COMPUTE, REQUANT, STORE."""
    arch = Arch.load(arch)
    m, k = a.shape
    n = w.shape[1]
    acc_row = 4 * lanes
    params = np.zeros((2, lanes), "<i4")
    params[0, :n], params[1, :n] = mult, shift
    image = np.zeros(OUT_ADDR, np.uint8)
    image[W_ADDR:W_ADDR + w.size] = w.view(np.uint8).ravel()
    image[BIAS_ADDR:BIAS_ADDR + 4 * n] = bias.astype("<i4").view(np.uint8)
    image[PARAM_ADDR:PARAM_ADDR + params.nbytes] = params.view(np.uint8).ravel()
    out_sp = m + k
    program = [
        isa.LOAD(mem="scratchpad", sram=0, dram=A_ADDR, y_size=m, x_size=1, elem_bytes=k,
                 x_stride=k, y_stride=k),
        isa.LOAD(mem="scratchpad", sram=m, dram=W_ADDR, y_size=k, x_size=1, elem_bytes=n,
                 x_stride=n, y_stride=n),
        isa.LOAD(mem="accumulator", sram=0, dram=BIAS_ADDR, y_size=m, x_size=1,
                 elem_bytes=4 * n, x_stride=4 * n, y_stride=0),
        isa.LOAD(mem="accumulator", sram=m, dram=PARAM_ADDR, y_size=2, x_size=1,
                 elem_bytes=acc_row, x_stride=acc_row, y_stride=acc_row, push_next=True),
        isa.PRELOAD(sp=m, k=k, pop_prev=True),
        isa.COMPUTE(sp=0, acc=0, m_inner=m, k=k, n=n, accumulate=1, push_next=True),
        isa.REQUANT(acc=0, sp=out_sp, rows=m, param=m, out_offset=out_offset, pop_prev=True,
                    push_next=True),
        isa.STORE(mem="scratchpad", sram=out_sp, dram=OUT_ADDR, y_size=m, x_size=1,
                  elem_bytes=n, x_stride=n, y_stride=n, pop_prev=True),
        isa.END(),
    ]
    source = ("fc",) * 8 + ("",)
    return Program(arch=arch, instructions=program, dram_image=image.tobytes(),
                   inputs=(IOBinding("x", A_ADDR, (m, k), 0.05, 0),),
                   outputs=(IOBinding("y", OUT_ADDR, (m, n), 0.1, out_offset),),
                   source=source, metadata={"tool": "test"})


def gemm_reference(a, w, bias, mult, shift, out_offset=3):
    acc = numerics.wrap32(bias.astype(np.int64) + numerics.int_matmul(a, w))
    return numerics.requantize(acc, mult, shift, out_offset, axis=1)
