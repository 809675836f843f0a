"""`ember sweep`: a design-space exploration of the accelerator for one or more models."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click
from rich.table import Table

from compiler.backend.program import BackendOptions
from ember import console
from ember import space as spaces
from ember import sweep as sweeping
from ember.cluster import Where
from ember.commands.options import cluster_option, json_option
from ember.errors import EmberError
from ember.files import InputPath, OutputPath, write_text
from ember.progress import progress_bar
from ember.reports.sweep import render_sweep
from simulator.arch import Arch

FAILED_SHOWN = 10  # failed points the terminal lists; the outputs list all


@click.command()
@click.argument("models", metavar="MODEL...", nargs=-1, required=True,
                type=InputPath(dir_okay=False))
@click.option("--profile", "profiles", multiple=True, required=True,
              type=InputPath(dir_okay=False),
              help="The profile of each MODEL (`ember quantize-profile`), repeated in the same "
                   "order as the models.")
@click.option("--space", "space_path", required=True, type=InputPath(dir_okay=False),
              help="The space file: a [space] table of architecture keys and their values, an "
                   "optional [constraints] table (see below).")
@click.option("--target", default="default", show_default=True, metavar="PRESET|ARCH.toml",
              type=InputPath(), help="What the keys the space leaves out are: a preset "
                                     "(default, large, edge) or an architecture TOML file.")
@click.option("--search", type=click.Choice(sweeping.SEARCHES), default="grid",
              show_default=True,
              help="grid: every point of the space; random: --points points drawn without "
                   "repetition; local: a quarter of them at random, then batches of the "
                   "untried neighbours (one key one value away) of the points on the fronts "
                   "(better than random from about 64 points on).")
@click.option("--points", type=click.IntRange(min=1), metavar="N",
              help="With --search random or local: how many points to evaluate (failed ones "
                   "count).  [default: 32]")
@click.option("--seed", type=int, default=0, show_default=True,
              help="With --search random or local: the generator's seed (same seed, same "
                   "points).")
@click.option("--allow-host/--no-allow-host", default=False, show_default=True,
              help="As for `ember compile`: run what the accelerator cannot on the host.")
@cluster_option
@click.option("-o", "--output", type=OutputPath(dir_okay=False),
              help="Write every point's results as JSON here.")
@click.option("--csv", "csv_path", type=OutputPath(dir_okay=False),
              help="Write one CSV row per point here.")
@click.option("--html", "html_path", type=OutputPath(dir_okay=False),
              help="Write the self-contained HTML page here: the two Pareto plots, the best "
                   "point per objective, the fronts, every point, the failed ones and why.")
@json_option
def sweep(models: tuple[str, ...], profiles: tuple[str, ...], space_path: str, target: str,
          search: str, points: int | None, seed: int, allow_host: bool, cluster: Where,
          output: str | None, csv_path: str | None, html_path: str | None,
          as_json: bool) -> None:
    """Compile and time MODEL (or several, a workload run once each) on every architecture
    of a space, and find the Pareto fronts of cycles against area and against energy.

    Each model is quantized once (with `ember compile`'s defaults) and compiled for every
    point; the simulator times each program (timing needs no data). Several models add their
    cycles and energy. A point whose keys make no architecture, or that a model cannot be
    compiled for, is listed as failed with the reason.

    \b
    The space file (TOML):
      [space]                                   # keys of the architecture file
      "array.rows" = [8, 16, 32]                # a list
      "array.cols" = [16, 32]
      "array.dataflow" = ["weight_stationary", "output_stationary"]
      "memory.scratchpad.size_bytes" = {start = 65536, stop = 262144, factor = 2}
      "dma.bytes_per_cycle" = {start = 8, stop = 32, step = 8}   # stop included
      [constraints]                             # pes, sram_bytes, area_mm2: min, max
      pes = {max = 1024}
      sram_bytes = {max = 524288}
    Keys left out keep --target's values; the local memories' row_bytes follow array.cols.
    Area: the target's [area] figures (45 nm, Horowitz ISSCC 2014 and Mistry IEDM 2007).

    \b
    JSON keys: sweep_version, target, models, space (source, size, axes, constraints),
    search, seed, evaluated, failed, excluded_by_constraints, best (objective -> index),
    pareto (cycles_area, cycles_energy: indices by increasing area or energy), points (index,
    config, status ok|failed, reason, pes, sram_bytes, area_mm2, cycles, time_ms, energy_uj,
    models: per model cycles, time_ms, energy_uj, dram_bytes, mac_utilization, bound_cycles).

    \b
    Examples:
      ember sweep model.onnx --profile model.profile.json --space space.toml --html sweep.html
      ember sweep a.onnx b.onnx --profile a.json --profile b.json --space space.toml \\
          --search random --points 200 --seed 1 --cluster local:4 -o sweep.json --csv sweep.csv
    """
    if len(profiles) != len(models):
        raise EmberError(f"{len(models)} model{'s' if len(models) > 1 else ''} but "
                         f"{len(profiles)} --profile: give one --profile per MODEL, in the "
                         f"same order")
    if search == "grid" and points is not None:
        raise EmberError(f"--points {points}: a grid search evaluates every point; use "
                         f"--search random or local to draw N")
    space = spaces.load_space(space_path)
    base = Arch.load(target)
    stems = [Path(m).stem for m in models]  # results name models so, [position] if repeated
    names = [f"{stem}[{i}]" if stems.count(stem) > 1 else stem
             for i, stem in enumerate(stems, 1)]
    workload = [sweeping.Model(m, p, n) for m, p, n in zip(models, profiles, names)]
    with progress_bar() as progress:
        doc = sweeping.run(workload, space, base, search, points or 32, seed, cluster,
                           BackendOptions(allow_host=allow_host),
                           lambda done, total: progress("points", done, total))
    if output:
        write_text(output, json.dumps(doc, indent=1) + "\n")
    if csv_path:
        write_text(csv_path, to_csv(doc))
    if html_path:
        write_text(html_path, render_sweep(doc))
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        _print(doc)


def to_csv(doc: dict) -> str:
    """One row per point: its keys' values, the costs, the totals and each model's cycles,
    whether it is on each front, and why it failed."""
    keys = list(doc["space"]["axes"])
    models = [m["name"] for m in doc["models"]]
    fronts = {name: set(indices) for name, indices in doc["pareto"].items()}
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["index", "status", *keys, *spaces.METRICS, "cycles", "time_ms",
                     "energy_uj", *(f"cycles[{m}]" for m in models if len(models) > 1),
                     *(f"front_{name}" for name in fronts), "reason"])
    for p in doc["points"]:
        writer.writerow([p["index"], p["status"], *(p["config"][k] for k in keys),
                         *(p.get(m, "") for m in spaces.METRICS),
                         *(p.get(k, "") for k in ("cycles", "time_ms", "energy_uj")),
                         *(p["models"][m]["cycles"] if "models" in p else ""
                           for m in models if len(models) > 1),
                         *(int(p["index"] in indices) for indices in fronts.values()),
                         p.get("reason", "")])
    return buffer.getvalue()


def _print(doc: dict) -> None:
    out = console.results()
    keys = list(doc["space"]["axes"])
    by_index = {p["index"]: p for p in doc["points"]}
    shown = sorted({i for front in doc["pareto"].values() for i in front},
                   key=lambda i: (by_index[i]["cycles"], i))
    marks = {}
    for objective, index in doc["best"].items():
        marks.setdefault(index, []).append(f"best {objective}")
    for name, front in doc["pareto"].items():
        for index in front:
            marks.setdefault(index, []).append(name.replace("_", "/"))
    if not shown:
        out.print(f"ember sweep on {doc['target']}: no point of {len(doc['points'])} "
                  f"compiled")
    else:
        _print_fronts(out, doc, shown, marks, keys, by_index)
    failed = [p for p in doc["points"] if p["status"] != "ok"]
    if failed:
        table = Table(title=f"failed points ({len(failed)})")
        table.add_column("#", justify="right")
        table.add_column("why")
        for p in failed[:FAILED_SHOWN]:
            table.add_row(str(p["index"]), p["reason"])
        if len(failed) > FAILED_SHOWN:
            table.add_row("…", f"{len(failed) - FAILED_SHOWN} more in -o, --csv or --html")
        out.print(table)


def _print_fronts(out, doc: dict, shown: list, marks: dict, keys: list,
                  by_index: dict) -> None:
    """The points on either front, fewest cycles first, and what each is best at."""
    table = Table(title=f"ember sweep on {doc['target']}: {len(doc['points'])} points "
                        f"({doc['failed']} failed, {doc['excluded_by_constraints']} excluded "
                        f"by constraints) of {doc['space']['size']:,}; the Pareto fronts")
    table.add_column("#", justify="right")
    for key in keys:
        table.add_column(key, justify="right")
    for column in ("cycles", "energy µJ", "area mm²", "on"):
        table.add_column(column, justify="left" if column == "on" else "right")
    for index in shown:
        p = by_index[index]
        table.add_row(str(index), *(str(p["config"][k]) for k in keys), f"{p['cycles']:,}",
                      f"{p['energy_uj']:.3f}", f"{p['area_mm2']:.3f}", ", ".join(marks[index]))
    out.print(table)
