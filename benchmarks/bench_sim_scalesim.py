"""ember's array cycles against SCALE-Sim's, for ResNet-18's convolutions and a few GEMMs.

Each layer is a GEMM of M output pixels x K = kh * kw * cin x N = cout. ember compiles it: a
one-node ONNX model of that Conv (unpadded, as SCALE-Sim takes it) or MatMul, profiled on two
seeded random samples, quantized and compiled for the preset by ember's own compiler
(`compiled_layer`), and the machine runs the program; its array cycles are the array unit's
busy cycles in that run (its PRELOADs and COMPUTEs as the compiler tiled them), and preload
overlap is off so that every fold pays its weight load, as SCALE-Sim's does. SCALE-Sim's count
is the length of its compute unit's demand matrix for the same operand shapes. `ember_cycles`,
the ISA's cost functions added over the ideal folds, is printed beside them: where the compiled
program differs, its tiling (the scratchpad holds only so many rows) is why. Needs the optional
`bench` extra (PyPI `scalesim`); without it the script says so and exits.

Host time per layer, side by side: SCALE-Sim's is the time to build its compute unit's demand
matrices (only part of a full SCALE-Sim run, which also simulates its memory system, so the
ratio understates ember's lead); ember's is the machine running the layer's compiled program,
functional and timed with its race check (`machine.run`).

Then a second table, full SCALE-Sim runs the way its users run it: for each layer named by
`--full-scalesim` (default: the cheap ones, `FULL_DEFAULT`), a config file and a one-layer
topology CSV are written to a temporary directory and `scalesim(...).run_scale(top_path=...)`
runs in a child process (compute unit, double-buffered SRAM and DRAM-interface simulation,
report CSVs; console output silenced), killed after `--timeout` seconds, in which case the row
gives lower bounds. Per layer: SCALE-Sim's compute cycles (its COMPUTE_REPORT "Total Cycles",
stalls included) and its total with the initial prefetch, ember's array cycles and its machine's
cycles for the layer's program, the host seconds of each, SCALE-Sim's host microseconds per
simulated cycle, and the speed-up (SCALE-Sim's seconds over ember's). SCALE-Sim's time is
measured inside the child around `scalesim(...)` and `run_scale` (its import is not counted);
ember's is `machine.run` of the layer's program, as in the first table.

SCALE-Sim's config follows the ember preset as far as its knobs go:
  * array rows x cols and dataflow (ws / os) are the preset's;
  * SRAM: ember has one scratchpad (inputs and weights) and an int32 accumulator; SCALE-Sim has
    separate ifmap / filter / ofmap SRAMs of 1-byte words, so ifmap = filter = half the
    scratchpad and ofmap = the accumulator's bytes (which holds 4x as many outputs as ember's
    int32 accumulator rows do);
  * bandwidth: InterfaceBandwidth USER with the DMA's bytes per cycle as words per cycle for
    each of the three buffers (SCALE-Sim takes the ifmap and filter figures from its [layout]
    section's SRAM bank bandwidths, the ofmap one from Bandwidth); ember has one DMA engine
    shared by all transfers, so SCALE-Sim gets up to 3x ember's off-chip bandwidth;
  * DRAM latency: SCALE-Sim's backing store answers in 1 cycle (without Ramulator traces), the
    preset's DMA pays `dma.latency_cycles` per transfer; SCALE-Sim has no banks or burst size
    (its bank count only matters with custom layouts, which are off);
  * no padding in SCALE-Sim: a convolution's IFMAP is given as (out - 1) * stride + kernel
    pixels square, so that SCALE-Sim's output size, and M, equal ember's;
  * SCALE-Sim's compute-cycle count is its memory system's last OFMAP write cycle, one less than
    its demand matrix's length used in the first table;
  * trace CSVs are not written (`save_disk_space=True`), which saves SCALE-Sim time;
    `--scalesim-traces` writes them as its command line does by default.
SCALE-Sim 3.0.0 fails inside its memory simulation with NumPy >= 2.4 (`int()` of a 1-element
array); install `numpy<2.4` beside it.

    .venv/bin/python benchmarks/bench_sim_scalesim.py [--arch default] [--dataflow ws|os]
        [--full-scalesim LAYER ...] [--timeout SECONDS] [--scalesim-traces] [--no-cycle-table]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import warnings

import numpy as np

import onnx
from onnx import helper, numpy_helper

from compiler.pipeline import compile_int8
from ember.flow import profile_model, quantize_model
from examples.synthetic_program import resnet18_convs
from profiler.model_inputs import input_specs
from profiler.run import RunOptions
from profiler.sources.arrays import RandomData
from simulator import isa, machine
from simulator.arch import Arch
from simulator.program import Program

GEMMS = [("gemm 64x64x64", 64, 64, 64), ("gemm 128x256x64", 128, 256, 64),
         ("gemm 256x256x256", 256, 256, 256), ("gemm 17x33x15", 17, 33, 15),
         ("gemm 1x512x1000", 1, 512, 1000)]
DATAFLOWS = {"ws": "weight_stationary", "os": "output_stationary"}
# Full SCALE-Sim runs by default: the cheapest layers first, then the cheapest 3x3 convolution.
FULL_DEFAULT = ["layer2.0.downsample", "layer3.0.downsample", "layer4.0.downsample", "fc",
                "layer2.0.conv1"]


def layers() -> list[tuple[str, int, int, int]]:
    out = [(c.name, c.size_out * c.size_out, c.kernel * c.kernel * c.cin, c.cout)
           for c in resnet18_convs()]
    return out + GEMMS


def ember_cycles(arch: Arch, m: int, k: int, n: int) -> int:
    """Weight-stationary: one PRELOAD + COMPUTE of all M rows per K x N fold. Output-stationary:
    at most R rows per COMPUTE with the K loop innermost, so the outputs stay in the array."""
    rows, cols = arch.array.rows, arch.array.cols
    m_step = m if arch.array.dataflow == "weight_stationary" else rows
    total = 0
    for m0 in range(0, m, m_step):
        for n0 in range(0, n, cols):
            for k0 in range(0, k, rows):
                kk, nn, mm = min(rows, k - k0), min(cols, n - n0), min(m_step, m - m0)
                total += isa.PRELOAD.cycles(arch, isa.PRELOAD(sp=0, k=kk))
                total += isa.COMPUTE.cycles(arch, isa.COMPUTE(
                    sp=0, acc=0, m_inner=mm, k=kk, n=nn, accumulate=int(k0 > 0)))
    return total


def scalesim_cycles(arch: Arch, dataflow: str, m: int, k: int, n: int) -> int:
    from scalesim.compute.systolic_compute_os import systolic_compute_os
    from scalesim.compute.systolic_compute_ws import systolic_compute_ws
    from scalesim.scale_config import scale_config

    config = scale_config()
    config.set_arr_dims(rows=arch.array.rows, cols=arch.array.cols)
    config.set_dataflow(dataflow)
    config.force_valid()  # otherwise its getters silently return None
    unit = {"ws": systolic_compute_ws, "os": systolic_compute_os}[dataflow]()
    unit.set_params(config_obj=config,
                    ifmap_op_mat=np.arange(m * k).reshape(m, k),
                    filter_op_mat=np.arange(k * n).reshape(k, n) + 10_000_000,
                    ofmap_op_mat=np.arange(m * n).reshape(m, n) + 20_000_000)
    unit.create_demand_matrices()
    return unit.get_ifmap_demand_mat().shape[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="default")
    parser.add_argument("--dataflow", choices=sorted(DATAFLOWS), default="ws")
    parser.add_argument("--full-scalesim", nargs="*", metavar="LAYER", default=FULL_DEFAULT,
                        help="ResNet-18 layers to run through a full SCALE-Sim run (none: skip); "
                             f"default: {' '.join(FULL_DEFAULT)}")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds allowed to each full SCALE-Sim run (default 120)")
    parser.add_argument("--scalesim-traces", action="store_true",
                        help="let SCALE-Sim write its SRAM/DRAM trace CSVs (its CLI default)")
    parser.add_argument("--no-cycle-table", dest="cycle_table", action="store_false",
                        help="skip the cycle-equality table")
    args = parser.parse_args()
    try:
        import scalesim  # noqa: F401
    except ImportError:
        print("SCALE-Sim is not installed: `pip install -e '.[bench]'` (PyPI scalesim); skipped.")
        return
    convs = {conv.name: conv for conv in resnet18_convs()}
    unknown = [name for name in args.full_scalesim if name not in convs]
    if unknown:
        parser.error(f"unknown layer(s) {', '.join(unknown)}; choose from {', '.join(convs)}")
    data = Arch.load(args.arch).to_dict()
    data["array"].update(dataflow=DATAFLOWS[args.dataflow], preload_overlap=False)
    arch = Arch.from_dict(data, source=f"{args.arch} (preload overlap off)")
    print(f"{arch.name}: {arch.array.rows}x{arch.array.cols} {arch.array.dataflow}, "
          f"preload overlap off")
    if args.cycle_table:
        cycle_table(arch, args.dataflow, convs)
    if args.full_scalesim:
        if args.cycle_table:
            print()
        full_table(arch, args.dataflow, [convs[name] for name in args.full_scalesim],
                   args.timeout, args.scalesim_traces)


def cycle_table(arch: Arch, dataflow: str, convs: dict) -> None:
    print(f"{'layer':<24}{'M':>7}{'K':>7}{'N':>6}{'ember':>13}{'SCALE-Sim':>13}{'ratio':>8}"
          f"{'formula':>13}{'ember ms':>10}{'S-Sim ms':>10}{'speed-up':>10}")
    total_ember = total_scalesim = total_formula = 0
    host_ember = host_scalesim = 0.0
    for name, m, k, n in layers():
        ours_s, _, _, ours = _simulate(arch, convs.get(name) or (name, m, k, n))
        formula = ember_cycles(arch, m, k, n)
        started = time.perf_counter()
        theirs = scalesim_cycles(arch, dataflow, m, k, n)
        theirs_s = time.perf_counter() - started
        total_ember += ours
        total_scalesim += theirs
        total_formula += formula
        host_ember += ours_s
        host_scalesim += theirs_s
        print(f"{name:<24}{m:>7}{k:>7}{n:>6}{ours:>13,}{theirs:>13,}{ours / theirs:>8.3f}"
              f"{formula:>13,}{ours_s * 1e3:>10.1f}{theirs_s * 1e3:>10.1f}"
              f"{theirs_s / ours_s:>9.1f}x")
    print(f"{'total':<44}{total_ember:>13,}{total_scalesim:>13,}"
          f"{total_ember / total_scalesim:>8.3f}{total_formula:>13,}{host_ember * 1e3:>10.1f}"
          f"{host_scalesim * 1e3:>10.1f}{host_scalesim / host_ember:>9.1f}x")


def full_table(arch: Arch, dataflow: str, convs: list, timeout: float, traces: bool) -> None:
    """Full SCALE-Sim runs (memory system included) against ember's machine, layer by layer."""
    config = scalesim_config(arch, dataflow)
    print(f"Full SCALE-Sim runs (run_scale, memory system simulated, {timeout:.0f} s limit each; "
          f"trace CSVs {'on' if traces else 'off'})")
    print(f"{'layer':<22}{'S-Sim cyc':>11}{'+prefetch':>11}{'stalls':>11}{'ember arr':>11}"
          f"{'ember mach':>12}{'S-Sim s':>9}{'us/cyc':>8}{'ember s':>9}{'us/cyc':>8}"
          f"{'speed-up':>10}{'CPU s-up':>10}{'timing s':>10}{'s-up':>8}")
    total_theirs_s = total_ours_s = total_theirs_cpu = total_ours_cpu = total_timing_s = 0.0
    complete = True
    for conv in convs:
        m, k, n = conv.size_out ** 2, conv.kernel ** 2 * conv.cin, conv.cout
        full = run_full_scalesim(config, scalesim_topology(conv), timeout, traces)
        ours_s, ours_cycles, ours_cpu, array = _simulate(arch, conv)
        timing_s = _timing_only(arch, conv, ours_cycles)
        if isinstance(full, dict):
            if full["mnk"] != [m, n, k]:
                print(f"{conv.name}: SCALE-Sim's M, N, K {full['mnk']} != ember's {[m, n, k]}")
            theirs_s, cycles = full["seconds"], full["cycles"]
            total_theirs_s += theirs_s
            total_ours_s += ours_s
            total_theirs_cpu += full["cpu"]
            total_ours_cpu += ours_cpu
            total_timing_s += timing_s
            print(f"{conv.name:<22}{cycles:>11,}{full['overall']:>11,}{full['stalls']:>11,}"
                  f"{array:>11,}{ours_cycles:>12,}{theirs_s:>9.1f}{theirs_s / cycles * 1e6:>8.0f}"
                  f"{ours_s:>9.3f}{ours_s / ours_cycles * 1e6:>8.2f}{theirs_s / ours_s:>9.0f}x"
                  f"{full['cpu'] / ours_cpu:>9.0f}x{timing_s:>10.4f}{theirs_s / timing_s:>7.0f}x")
        else:
            # Timed out (or failed): SCALE-Sim's compute cycles are at least its demand matrix's
            # length less one, so the time per cycle and the speed-up are lower bounds.
            complete = False
            if full is not None:
                print(f"{conv.name}: SCALE-Sim failed: {full}")
                continue
            cycles = scalesim_cycles(arch, dataflow, m, k, n) - 1
            print(f"{conv.name:<22}{'~' + format(cycles, ','):>11}{'-':>11}{'-':>11}"
                  f"{array:>11,}{ours_cycles:>12,}{'>' + format(timeout, '.0f'):>9}"
                  f"{'>' + format(timeout / cycles * 1e6, '.0f'):>8}{ours_s:>9.3f}"
                  f"{ours_s / ours_cycles * 1e6:>8.2f}{'>' + format(timeout / ours_s, '.0f'):>9}x"
                  f"{'-':>10}")
    if total_ours_s:
        print(f"{'total (completed runs)':<78}{total_theirs_s:>9.1f}{'':>8}{total_ours_s:>9.3f}"
              f"{'':>8}{total_theirs_s / total_ours_s:>9.0f}x"
              f"{total_theirs_cpu / total_ours_cpu:>9.0f}x{total_timing_s:>10.4f}"
              f"{total_theirs_s / total_timing_s:>7.0f}x")
    print("timing s: ember's timing model alone on the same program (`machine.timing`: the "
          "cycles, no values, no race check; what SCALE-Sim computes), median of 3")
    print(f"host load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs; CPU s-up: the ratio of host CPU seconds")
    if not complete:
        print("~: SCALE-Sim's demand-matrix length less one, as its full run would report; "
              ">: lower bounds, the run was stopped at the time limit")


def scalesim_config(arch: Arch, dataflow: str) -> str:
    """A SCALE-Sim 3 config file as close to `arch` as its knobs go (see the docstring)."""
    bandwidth = arch.dma.bytes_per_cycle  # SCALE-Sim's words are bytes
    return f"""[general]
run_name = ember_{arch.name}

[architecture_presets]
ArrayHeight : {arch.array.rows}
ArrayWidth : {arch.array.cols}
IfmapSramSzkB : {arch.scratchpad.size_bytes // 2 // 1024}
FilterSramSzkB : {arch.scratchpad.size_bytes // 2 // 1024}
OfmapSramSzkB : {arch.accumulator.size_bytes // 1024}
IfmapOffset : 0
FilterOffset : 10000000
OfmapOffset : 20000000
Bandwidth : {bandwidth}
Dataflow : {dataflow}
ReadRequestBuffer : 512
WriteRequestBuffer : 512

[layout]
IfmapCustomLayout : False
IfmapSRAMBankBandwidth : {bandwidth}
IfmapSRAMBankNum : 1
IfmapSRAMBankPort : 2
FilterCustomLayout : False
FilterSRAMBankBandwidth : {bandwidth}
FilterSRAMBankNum : 1
FilterSRAMBankPort : 2

[sparsity]
SparsitySupport : false

[run_presets]
InterfaceBandwidth : USER
UseRamulatorTrace : False
"""


def scalesim_topology(conv) -> str:
    """A one-layer SCALE-Sim topology CSV; unpadded, so the IFMAP is the pixels the output uses."""
    size = (conv.size_out - 1) * conv.stride + conv.kernel
    return ("Layer name,IFMAP Height,IFMAP Width,Filter Height,Filter Width,Channels,"
            "Num Filter,Strides,\n"
            f"{conv.name.replace('.', '_')},{size},{size},{conv.kernel},{conv.kernel},{conv.cin},"
            f"{conv.cout},{conv.stride},\n")


def run_full_scalesim(config: str, topology: str, timeout: float, traces: bool):
    """A dict of SCALE-Sim's results and host seconds, None if it ran out of time, or the error
    message if it failed. The run is in a child process so that it can be stopped."""
    import scalesim.scale_sim  # noqa: F401  (imported here, before the fork, so not timed)

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_full_scalesim_child, args=(send, config, topology, traces),
                            daemon=True)
    child.start()
    send.close()
    try:
        result = receive.recv() if receive.poll(timeout) else None
    except EOFError:
        result = f"the child exited with code {child.exitcode}"
    if child.is_alive():
        child.terminate()
    child.join()
    receive.close()
    return result


def _full_scalesim_child(send, config: str, topology: str, traces: bool) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)  # SCALE-Sim prints freely
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    warnings.simplefilter("ignore")
    from scalesim.scale_sim import scalesim

    try:
        with tempfile.TemporaryDirectory(prefix="ember-scalesim-") as tmp:
            paths = {}
            for name, text in (("config", config), ("topology", topology),
                               ("layout", "Layer name,\n")):  # read even when unused
                paths[name] = os.path.join(tmp, f"{name}.{'cfg' if name == 'config' else 'csv'}")
                with open(paths[name], "w") as f:
                    f.write(text)
            started, cpu = time.perf_counter(), time.process_time()
            sim = scalesim(save_disk_space=not traces, verbose=False, config=paths["config"],
                           topology=paths["topology"], layout=paths["layout"])
            sim.run_scale(top_path=os.path.join(tmp, "out"))
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            layer = sim.runner.single_layer_sim_object_list[0]
            overall, cycles, stalls = layer.get_compute_report_items()[:3]
            ofmap, n, k = (int(x) for x in sim.topo.get_transformed_mnk_dimensions()[0])
            mnk = [ofmap // n, n, k]  # its M counts the outputs of all N filters
        send.send({"seconds": seconds, "cpu": cpu, "cycles": int(cycles), "overall": int(overall),
                   "stalls": int(stalls), "mnk": mnk})
    except Exception as error:  # reported by the parent
        send.send(f"{type(error).__name__}: {error}")
    finally:
        send.close()


_COMPILED: dict = {}


def compiled_layer(arch: Arch, layer) -> Program:
    """ember's program for one layer: a ResNet-18 convolution (unpadded: its input is the
    pixels its outputs read, as SCALE-Sim's IFMAP) or a GEMM (name, M, K, N) as a MatMul by a
    constant, profiled on two seeded random samples and compiled for `arch`."""
    key = (arch.name, arch.array.dataflow, str(layer))
    if key in _COMPILED:
        return _COMPILED[key]
    rng = np.random.default_rng(0)
    if isinstance(layer, tuple):
        _, m, k, n = layer
        weights = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="gemm")
        shape_in, shape_out = [1, m, k], [1, m, n]
    else:
        size = (layer.size_out - 1) * layer.stride + layer.kernel
        weights = numpy_helper.from_array(rng.standard_normal(
            (layer.cout, layer.cin, layer.kernel, layer.kernel)).astype(np.float32), "w")
        node = helper.make_node("Conv", ["x", "w"], ["y"], name=layer.name,
                                kernel_shape=[layer.kernel] * 2, strides=[layer.stride] * 2)
        shape_in = [1, layer.cin, size, size]
        shape_out = [1, layer.cout, layer.size_out, layer.size_out]
    graph = helper.make_graph(
        [node], "layer", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape_in)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape_out)], [weights])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    specs = input_specs(proto, {})
    qgraph = quantize_model(proto, profile_model(proto, RandomData(2, specs, 0), specs,
                                                 RunOptions(batch=1))).qgraph
    program = _COMPILED[key] = compile_int8(qgraph, arch).program
    return program


def _simulate(arch: Arch, layer) -> tuple[float, int, float, int]:
    """Host seconds (wall) for ember's machine to run one layer's compiled program, functional
    and timed with its race check, and to read its cycles and the array's busy cycles off the
    timeline; the simulated cycles; the host CPU seconds; the array's busy cycles."""
    program = compiled_layer(arch, layer)
    inputs = {b.name: np.zeros(b.shape, b.dtype) for b in program.inputs}
    started, cpu = time.perf_counter(), time.process_time()
    result = machine.run(program, inputs)
    # The cycles and the array's busy cycles, read off the timeline (the full report's other
    # figures, `result.stats`, are not needed here and not timed).
    timeline = result.timeline
    on_array = timeline.queue == isa.QUEUES.index("compute")
    array = int((timeline.end - timeline.start)[on_array].sum())
    return (time.perf_counter() - started, timeline.cycles, time.process_time() - cpu, array)


def _timing_only(arch: Arch, layer, cycles: int) -> float:
    """Host seconds (median of 3) for ember's timing model alone on the layer's program: the
    same cycles as the full run, without the values or the race check."""
    program = compiled_layer(arch, layer)
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        timeline = machine.timing(program)
        seconds.append(time.perf_counter() - started)
    assert timeline.cycles == cycles, (timeline.cycles, cycles)
    return sorted(seconds)[1]


if __name__ == "__main__":
    main()
