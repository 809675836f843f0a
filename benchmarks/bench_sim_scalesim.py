"""ember's array cycles against SCALE-Sim's, for ResNet-18's convolutions and a few GEMMs.

Each layer is a GEMM of M output pixels x K = kh * kw * cin x N = cout. ember tiles it the way
its ISA must (see `ember_cycles`) and adds up
the table's own cost functions (`isa.PRELOAD.cycles`, `isa.COMPUTE.cycles`), which is what the
machine charges the array unit; preload overlap is off so that every fold pays its weight load,
as SCALE-Sim's does. SCALE-Sim's count is the length of its compute unit's demand matrix for the
same operand shapes. Needs the optional `bench` extra (PyPI `scalesim`); without it the script
says so and exits.

    .venv/bin/python benchmarks/bench_sim_scalesim.py [--arch default] [--dataflow ws|os]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from simulator import isa
from simulator.arch import Arch

sys.path.insert(0, str(Path(__file__).parent))
from bench_sim_speed import resnet18_convs  # noqa: E402  (a sibling script, not a package)

GEMMS = [("gemm 64x64x64", 64, 64, 64), ("gemm 128x256x64", 128, 256, 64),
         ("gemm 256x256x256", 256, 256, 256), ("gemm 17x33x15", 17, 33, 15),
         ("gemm 1x512x1000", 1, 512, 1000)]
DATAFLOWS = {"ws": "weight_stationary", "os": "output_stationary"}


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
    args = parser.parse_args()
    try:
        import scalesim  # noqa: F401
    except ImportError:
        print("SCALE-Sim is not installed: `pip install -e '.[bench]'` (PyPI scalesim); skipped.")
        return
    data = Arch.load(args.arch).to_dict()
    data["array"].update(dataflow=DATAFLOWS[args.dataflow], preload_overlap=False)
    arch = Arch.from_dict(data, source=f"{args.arch} (preload overlap off)")
    print(f"{arch.name}: {arch.array.rows}x{arch.array.cols} {arch.array.dataflow}, "
          f"preload overlap off")
    print(f"{'layer':<24}{'M':>7}{'K':>7}{'N':>6}{'ember':>13}{'SCALE-Sim':>13}{'ratio':>8}")
    total_ember = total_scalesim = 0
    for name, m, k, n in layers():
        ours = ember_cycles(arch, m, k, n)
        theirs = scalesim_cycles(arch, args.dataflow, m, k, n)
        total_ember += ours
        total_scalesim += theirs
        print(f"{name:<24}{m:>7}{k:>7}{n:>6}{ours:>13,}{theirs:>13,}{ours / theirs:>8.3f}")
    print(f"{'total':<44}{total_ember:>13,}{total_scalesim:>13,}"
          f"{total_ember / total_scalesim:>8.3f}")


if __name__ == "__main__":
    main()
