"""`ember report`: the performance report of a program on the accelerator, or of a saved
`ember simulate --report` JSON, as a table, JSON and a self-contained HTML page."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from compiler.backend.codegen.host import check_segments, run_segment
from ember import console
from ember.commands.options import json_option, program_shape_option, refuse_conflicts
from ember.commands.simulate import Feeds, check_shapes, performance_doc, read_inputs
from ember.errors import EmberError
from ember.files import InputPath, OutputPath, write_text
from ember.reports.performance import PerformanceReport
from simulator import machine
from simulator.program import Program


@click.command()
@click.argument("source", metavar="PROGRAM|REPORT", type=InputPath(dir_okay=False))
@click.option("-i", "--input", "input_path", type=InputPath(dir_okay=False),
              help="Inputs for PROGRAM, as `ember simulate -i` takes them (the first sample is "
                   "timed). Without it the program runs on zero-point inputs: the timing does "
                   "not depend on the values.")
@click.option("--html", "html_path", type=OutputPath(dir_okay=False),
              help="Also write the self-contained HTML report (roofline, where the cycles go, "
                   "unit utilization, a per-layer timeline, the tables).")
@click.option("-o", "--output", "--report", "output", type=OutputPath(dir_okay=False),
              help="Also write the report as JSON here (the keys --json prints); --report is "
                   "`ember simulate`'s spelling.")
@click.option("--check-hazards/--no-check-hazards", default=True, show_default=True,
              help="As for `ember simulate`: reject races that no dependency token orders.")
@program_shape_option
@json_option
def report(source: str, input_path: str | None, html_path: str | None, output: str | None,
           check_hazards: bool, input_shapes: tuple[str, ...], as_json: bool) -> None:
    """The performance report of PROGRAM (an .ember) on its accelerator, or of REPORT (a
    .json that `ember simulate --report` wrote).

    Per layer: its unit (array, vector, dma or host), its exclusive cycles (what it adds to the
    run after the layers before it: they sum to the total) and their share, its span (first
    start to last end; spans overlap), MACs issued to the array, array utilization, its own roofline bound and what bounds it (array, dram or
    vector), and DRAM bytes. Totals: cycles against the roofline bound (of the model's MACs),
    the MACs issued to the array and the model's, utilization per unit, DRAM traffic against
    the compulsory bytes, energy, and time at the arch's clock. Host segments, when the
    program has them, appear as their own rows with what they cost.

    \b
    JSON keys: every key of `ember simulate --report`, plus bound_ratio (bound / cycles),
    dram_bytes, dram_traffic_ratio (traffic / compulsory bytes), host_cycles, host_share,
    host_segments, and per layer kind, exclusive_cycles, share (exclusive / total),
    array_utilization, macs_per_cycle and
    intensity_macs_per_byte.

    \b
    Examples:
      ember report model.ember -i input.npz --html perf.html
      ember report perf.json --html perf.html          # a saved `ember simulate --report`
      ember report model.ember --json | jq .layers
    """
    path = Path(source)
    if not path.is_file():
        raise EmberError(f"{source}: no such file")
    if path.suffix.lower() == ".json":
        if input_path:
            raise EmberError(f"{source}: a saved report is rendered as it is; -i is for a "
                             f"program")
        if input_shapes:
            raise EmberError(f"{source}: a saved report is rendered as it is; --input-shape "
                             f"is for a program")
        doc = _load_json(path)
        run = doc.get("run") if isinstance(doc, dict) else None
        recorded = run.get("options") if isinstance(run, dict) else None
        hazards = recorded.get("check_hazards") if isinstance(recorded, dict) else None
        refuse_conflicts(click.get_current_context(), source,
                         {"check_hazards": hazards} if isinstance(hazards, bool) else {},
                         "the report was simulated with", "simulate again")
        perf = PerformanceReport.from_report(doc, source)
    else:
        perf = PerformanceReport.from_report(
            _simulate(source, input_path, check_hazards, input_shapes), source)
    if html_path:
        write_text(html_path, perf.html())
    text = json.dumps(perf.to_json(), indent=2)
    if output:
        write_text(output, text + "\n")
    if as_json:
        click.echo(text)
    else:
        perf.print(console.results())


def _load_json(path: Path) -> dict:
    try:
        # NaN and Infinity are not JSON (the simulator never writes them); the report's keys
        # are printed back with --json and -o, which must stay JSON.
        return json.loads(path.read_text(), parse_constant=_not_json)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise EmberError(f"{path}: not a JSON performance report: {err}") from None


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _simulate(source: str, input_path: str | None, check_hazards: bool,
              input_shapes: tuple[str, ...]) -> dict:
    prog = Program.load(source)
    check_segments(prog, source)
    check_shapes(prog, source, input_shapes)
    if input_path:
        feeds = read_inputs(prog, input_path)
    else:  # every input at its zero point
        feeds = Feeds([{b.name: b.quantize(np.zeros(b.shape, np.float32))
                        for b in prog.inputs}], 0, 1)
    result = machine.run(prog, feeds.runs[0], check_hazards=check_hazards, host=run_segment)
    return performance_doc(source, input_path or "(zero-point inputs)", feeds, result.stats,
                           {"check_hazards": check_hazards})
