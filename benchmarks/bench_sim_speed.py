"""How fast the simulator runs a ResNet-18-sized program (functional + timing).

The synthetic program of `examples.synthetic_program`: ResNet-18's convolution shapes (224x224
input, batch 1) written directly in machine instructions. Prints a table: instructions,
simulated cycles and MACs, host seconds of the run (functional, timed, race-checked) and of
collecting the report's figures after it, simulated MACs per host second and cycles per host
second.

    .venv/bin/python benchmarks/bench_sim_speed.py [--arch default]
"""

from __future__ import annotations

import argparse
import time

from examples.synthetic_program import resnet18_program
from simulator import machine
from simulator.arch import Arch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="default")
    parser.add_argument("--no-check-hazards", dest="check_hazards", action="store_false",
                        help="skip the machine's race check (simulator.hazards)")
    args = parser.parse_args()
    arch = Arch.load(args.arch)
    t0 = time.perf_counter()
    program = resnet18_program(arch)
    t1, cpu = time.perf_counter(), time.process_time()
    result = machine.run(program, check_hazards=args.check_hazards)
    t2, cpu = time.perf_counter(), time.process_time() - cpu
    stats = result.stats  # the report's figures, collected on first read
    report = time.perf_counter() - t2
    host = t2 - t1
    rows = [("arch", arch.name), ("hazard check", "on" if args.check_hazards else "off"),
            ("instructions", f"{stats.instructions:,}"),
            ("build seconds", f"{t1 - t0:.2f}"), ("simulate seconds (wall)", f"{host:.2f}"),
            ("simulate seconds (CPU)", f"{cpu:.2f}"),
            ("report figures seconds", f"{report:.2f}"),
            ("simulated cycles", f"{stats.cycles:,}"), ("simulated MACs", f"{stats.macs:,}"),
            ("roofline bound cycles", f"{stats.bound_cycles:,}"),
            ("MAC utilization", f"{stats.macs / (arch.macs_per_cycle * stats.cycles):.1%}"),
            ("simulated MACs / host s", f"{stats.macs / host:,.0f}"),
            ("cycles / host s", f"{stats.cycles / host:,.0f}"),
            ("instructions / host s", f"{stats.instructions / host:,.0f}")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value:>20}")


if __name__ == "__main__":
    main()
