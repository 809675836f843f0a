"""The systolic array: PRELOAD latches a weight tile, COMPUTE streams input rows through it
into accumulator rows.

Timing follows SCALE-Sim (Samajdar et al., "A Systematic Methodology for Characterizing
Scalability of DNN Accelerators using SCALE-Sim", ISPASS 2020, and its code, scalesim 3.0
`compute/systolic_compute_{ws,os}.py`), for an R x C array; like SCALE-Sim we charge the full
array's skew for a partial tile. benchmarks/bench_sim_scalesim.py checks both against it.

- weight_stationary: a fold costs 2R + C + M - 2: R cycles to load the weights, then M input
  rows stream with R + C - 2 cycles of skew. PRELOAD costs the R and COMPUTE M + R + C - 2, as
  in SCALE-Sim. With preload_overlap the weights are double-buffered in the PEs (Gemmini's
  WS mesh, the TPU's weight double-buffering, Jouppi et al. ISCA 2017): the next tile's
  weights shift into a shadow buffer while this COMPUTE streams, and the next COMPUTE's
  inputs enter right behind this one's, the weight switch travelling with them. PRELOAD then
  costs nothing, and COMPUTE occupies the array for max(M, R) cycles (R: the shift-in of the
  next weights); its skew is a latency, not throughput: its results land R + C - 2 cycles
  (M + R + C - 2 in all) after it starts streaming (`compute_latency`), which only the
  instructions waiting for them (its tokens) see.
- output_stationary: the weights stream with the inputs, so PRELOAD costs nothing, and a fold of
  at most R output rows costs R + C + K - 2. A COMPUTE costs ceil(M / R) folds of its k, except
  that an accumulating COMPUTE of at most R rows continues the previous one's outputs, which stay
  in the array: it costs only its k cycles. So a chain over K tiles costs one fold, as in
  SCALE-Sim, when the compiler keeps M outside the K loop.
"""

from __future__ import annotations

import functools

import numpy as np

from simulator import numerics
from simulator.errors import SimulatorError
from simulator.units import ACCUMULATOR, SCRATCHPAD, Access, Work, ceil_div, rows, shared

# OpenBLAS runs a GEMM on several threads once M * N * K exceeds 2^18. For the skinny products
# of one array pass that costs more than it saves (15x more on a busy machine), so COMPUTE feeds
# BLAS at most this much work per call.
_BLAS_SINGLE_THREAD_MNK = 2**18


def shared_product(x: np.ndarray, weights: np.ndarray, before: np.ndarray | None = None,
                   min_rows: int = 1, shift: int = 0) -> np.ndarray:
    """before + (x @ weights) * 2^shift (int32, wrapping; without `before`, the shifted product)
    for rows x (rows, k) and one weight matrix (k, n) for them all (`numerics.array_pass`), fed to BLAS in
    pieces of about `_BLAS_SINGLE_THREAD_MNK` work, each of at least `min_rows` rows (a fused
    chain's long product pays for BLAS's threads: `simulator.plan`)."""
    count, n = len(x), weights.shape[-1]
    result = np.empty((count, n), np.int32)
    step = max(min_rows, _BLAS_SINGLE_THREAD_MNK // max(1, x.shape[1] * n))
    for r in range(0, count, step):
        part = slice(r, r + step)
        result[part] = numerics.array_pass(None if before is None else before[part], x[part],
                                           weights, shift)
    return result


def preload(state, insn) -> None:
    """Latch the weight tile of every sample; `state.shared_weights` is the one tile when all
    samples latch the same (a layer's weights from the DRAM image)."""
    a = insn.args
    if a["k"] > state.arch.array.rows:
        raise SimulatorError(f"k = {a['k']}: expected at most array.rows = {state.arch.array.rows}")
    tile = state.scratchpad[:, rows(state.scratchpad, a["sp"], a["k"], "scratchpad")]
    state.weights = numerics.centre(tile, a["w_offset"])
    same = shared(tile)
    state.shared_weights = None if same is None else state.weights[0]


def input_rows(a: dict) -> np.ndarray | slice:
    """Scratchpad rows streamed by COMPUTE: sp + o * outer_stride + i * inner_stride."""
    if a["inner_stride"] == 1 and a["outer_stride"] == a["m_inner"]:
        return slice(a["sp"], a["sp"] + a["m_outer"] * a["m_inner"])
    return a["sp"] + _row_offsets(a["m_outer"], a["m_inner"], a["outer_stride"],
                                  a["inner_stride"])


@functools.lru_cache(maxsize=1024)
def _row_offsets(m_outer: int, m_inner: int, outer_stride: int, inner_stride: int) -> np.ndarray:
    """Cached: a convolution repeats the same access pattern for every tap and channel block."""
    outer = np.arange(m_outer) * outer_stride
    inner = np.arange(m_inner) * inner_stride
    offsets = (outer[:, None] + inner[None, :]).ravel()
    offsets.flags.writeable = False
    return offsets


def _last_row(a: dict) -> int:
    """The last scratchpad row a COMPUTE of at least one row streams (the strides are unsigned,
    so the offsets never decrease)."""
    return a["sp"] + (a["m_outer"] - 1) * a["outer_stride"] + (a["m_inner"] - 1) * a["inner_stride"]


def compute(state, insn) -> None:
    a = insn.args
    k, n, m = a["k"], a["n"], a["m_outer"] * a["m_inner"]
    tile = state.shared_weights if state.shared_weights is not None else state.weights
    if tile is None or k > tile.shape[-2]:
        have = 0 if tile is None else tile.shape[-2]
        raise SimulatorError(f"k = {k}: the preloaded weight tile has only {have} rows")
    if n > state.arch.array.cols:
        raise SimulatorError(f"n = {n}: expected at most array.cols = {state.arch.array.cols}")
    if m == 0:
        return
    # Both ranges are checked from the fields before the row offsets (m of them) are built.
    sp = state.scratchpad
    last = _last_row(a)
    if last >= sp.shape[1]:
        raise SimulatorError(f"scratchpad row {last} out of range [0, {sp.shape[1]})")
    out = state.accumulator[:, rows(state.accumulator, a["acc"], m, "accumulator"), :n]
    inputs = sp[:, input_rows(a), :k]
    if a["x_offset"]:
        inputs = numerics.centre(inputs, a["x_offset"])
    samples = len(inputs)
    if state.shared_weights is None:  # each sample its own tile (a MatMul of activations)
        out[...] = numerics.array_pass(out if a["accumulate"] else None, inputs,
                                       state.weights[:, :k, :n], a["shift"])
        return
    # One tile for the batch: one product of (samples x m) rows.
    before = out.reshape(samples * m, n) if a["accumulate"] else None
    out[...] = shared_product(inputs.reshape(samples * m, k), state.shared_weights[:k, :n],
                              before, shift=a["shift"]).reshape(samples, m, n)


def preload_cycles(arch, insn) -> int:
    if arch.array.dataflow == "output_stationary" or arch.array.preload_overlap:
        return 0
    return arch.array.rows


def compute_cycles(arch, insn) -> int:
    """Cycles the array is busy: the next COMPUTE may start after these."""
    a = insn.args
    r, c, m = arch.array.rows, arch.array.cols, a["m_outer"] * a["m_inner"]
    if arch.array.dataflow == "weight_stationary":
        if arch.array.preload_overlap:
            return max(m, r)
        return m + r + c - 2
    if a["accumulate"] and m <= r:
        return a["k"]
    return ceil_div(m, r) * (r + c + a["k"] - 2)


def compute_latency(arch, insn) -> int:
    """Cycles from the end of `compute_cycles` until the last result lands in the accumulator:
    with preload_overlap, the skew of a weight-stationary COMPUTE drains while the next one
    streams, so it delays only the instructions that wait for this one's results."""
    if arch.array.dataflow != "weight_stationary" or not arch.array.preload_overlap:
        return 0
    r, c, m = arch.array.rows, arch.array.cols, insn.args["m_outer"] * insn.args["m_inner"]
    return m + r + c - 2 - max(m, r)


def preload_work(arch, insn) -> Work:
    return Work(local_bytes=insn.args["k"] * arch.scratchpad.row_bytes)


def compute_work(arch, insn) -> Work:
    a = insn.args
    m = a["m_outer"] * a["m_inner"]
    acc_bytes = m * arch.accumulator.row_bytes * (2 if a["accumulate"] else 1)
    return Work(macs=m * a["k"] * a["n"], local_bytes=m * arch.scratchpad.row_bytes + acc_bytes,
                accumulator_end=a["acc"] + m if m else 0)


def preload_access(arch, insn) -> tuple[Access, ...]:
    a = insn.args
    return (Access(SCRATCHPAD, a["sp"], a["sp"] + a["k"], False),)


def compute_access(arch, insn) -> tuple[Access, ...]:
    """The streamed rows as one span from the first to the last (strides stay inside a tile).
    An accumulating read of the rows it writes needs no record of its own: the write's covers
    every later conflict."""
    a = insn.args
    m = a["m_outer"] * a["m_inner"]
    if m == 0:
        return ()
    return (Access(SCRATCHPAD, a["sp"], _last_row(a) + 1, False),
            Access(ACCUMULATOR, a["acc"], a["acc"] + m, True))
