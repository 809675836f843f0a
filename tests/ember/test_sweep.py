"""`ember sweep`: the points a search visits, the Pareto fronts, constraints, failed points with
their reasons, one-line errors for bad space files, and the same results wherever they run."""

from __future__ import annotations

import csv
import json

import pytest

from ember import space as spaces
from ember import sweep
from ember.errors import EmberError
from simulator.arch import Arch
from tests.cli import DIGITS, assert_one_line_error, invoke

MODEL = DIGITS / "model.onnx"
# 2 x 2 x 2 = 8 points; rows 16 over cols 8 is no architecture (2 points fail).
SPACE = """
[space]
"array.rows" = [8, 16]
"array.cols" = [8, 16]
"memory.scratchpad.size_bytes" = {start = 16384, stop = 65536, factor = 4}
"""


def run(tmp_path, profile, space: str, *args):
    path = tmp_path / "space.toml"
    path.write_text(space)
    out = tmp_path / "sweep.json"
    result = invoke("sweep", MODEL, "--profile", profile, "--space", path, "-o", out, *args)
    return result, (json.loads(out.read_text()) if result.exit_code == 0 else None)


def dominated(p, others, x, y) -> bool:
    return any(o[x] <= p[x] and o[y] <= p[y] and (o[x] < p[x] or o[y] < p[y]) for o in others)


def test_grid_visits_every_point_and_the_fronts_are_pareto(tmp_path, digits_profile):
    result, doc = run(tmp_path, digits_profile, SPACE, "--csv", tmp_path / "s.csv",
                      "--html", tmp_path / "s.html")
    assert result.exit_code == 0, result.output
    assert doc["space"]["size"] == 8 and [p["index"] for p in doc["points"]] == list(range(8))
    assert doc["points"][5]["config"] == {"array.rows": 16, "array.cols": 8,
                                          "memory.scratchpad.size_bytes": 65536}
    ok = [p for p in doc["points"] if p["status"] == "ok"]
    assert len(ok) == 6 and doc["failed"] == 2
    for name, (x, y) in sweep.FRONTS.items():
        front = set(doc["pareto"][name])
        assert front
        for p in ok:  # on the front exactly when no point beats it on both
            assert (p["index"] in front) == (not dominated(p, ok, x, y)), (name, p)
    for objective, index in doc["best"].items():
        assert doc["points"][index][objective] == min(p[objective] for p in ok)
    best = doc["points"][doc["best"]["area_mm2"]]
    assert best["pes"] == 64 and best["sram_bytes"] == 16384 + 65536
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert len(rows) == 8 and rows[4]["status"] == "failed" and "array.cols" in rows[4]["reason"]
    html = (tmp_path / "s.html").read_text()
    assert html.count("<svg") == 2 and "Failed points (2)" in html
    assert "cycles against area" in result.output or "cycles/area" in result.output


def test_rows_derive_from_cols(tmp_path, digits_profile):
    """A point that sets array.cols gets the local memories' row widths from it."""
    arch = spaces.arch_at(Arch.load("default").to_dict(), {"array.cols": 32})
    assert arch.scratchpad.row_bytes == 32 and arch.accumulator.row_bytes == 128
    result, _ = run(tmp_path, digits_profile, '[space]\n"memory.scratchpad.row_bytes" = [8]\n')
    assert_one_line_error(result, "memory.scratchpad.row_bytes", "derived from array.cols")


def test_random_search_is_reproducible_by_seed(tmp_path, digits_profile):
    space = SPACE + '"dma.bytes_per_cycle" = [8, 16, 32]\n'
    first = run(tmp_path, digits_profile, space, "--search", "random", "--points", "5",
                "--seed", "3")[1]
    again = run(tmp_path, digits_profile, space, "--search", "random", "--points", "5",
                "--seed", "3")[1]
    other = run(tmp_path, digits_profile, space, "--search", "random", "--points", "5",
                "--seed", "4")[1]
    assert first == again and len(first["points"]) == 5 and first["seed"] == 3
    assert [p["index"] for p in first["points"]] != [p["index"] for p in other["points"]]


def test_constraints_exclude_points(tmp_path, digits_profile):
    result, doc = run(tmp_path, digits_profile, SPACE + "[constraints]\npes = {max = 128}\n"
                      "sram_bytes = {max = 100000}\n")
    assert result.exit_code == 0, result.output
    ok = [p for p in doc["points"] if p["status"] == "ok"]
    assert ok and all(p["pes"] <= 128 and p["sram_bytes"] <= 100000 for p in ok)
    assert doc["excluded_by_constraints"] == 6 - len(ok)


def test_a_point_that_cannot_compile_is_listed_with_its_reason(tmp_path, digits_profile):
    result, doc = run(tmp_path, digits_profile,
                      '[space]\n"memory.scratchpad.size_bytes" = [1024, 262144]\n')
    assert result.exit_code == 0, result.output
    small, large = doc["points"]
    assert small["status"] == "failed" and "scratchpad rows" in small["reason"]
    assert small["reason"].startswith("model: layer ")
    assert large["status"] == "ok" and doc["best"]["cycles"] == 1
    assert "scratchpad rows" in result.output


@pytest.mark.parametrize("space,parts", [
    ('[space]\n"array.depth" = [1, 2]\n', ("space.toml", "unknown key 'array.depth'")),
    ("[space]\n", ("space.toml", "the space is empty")),
    ("", ("space.toml", "the space is empty")),
    ('[space]\n"array.rows" = []\n', ("array.rows", "an empty list")),
    ('[space]\n"array.rows" = [8, -8]\n', ("array.rows", "-8", "positive integer")),
    ('[space]\n"array.rows" = {start = 8, stop = 4, step = 1}\n', ("array.rows", "start <= stop")),
    (SPACE + "[constraints]\npes = {max = 10}\n", ("no point satisfies the constraints",
                                                   "pes in [-inf, 10]")),
    (SPACE + "[constraints]\nwatts = {max = 10}\n", ("[constraints] watts", "unknown metric")),
    (SPACE + "[constraints]\npes = 10\n", ("[constraints] pes", "{max = 1024}")),
    ("[space\n", ("space.toml", "not valid TOML")),
])
def test_bad_space_files_are_one_line_errors(tmp_path, digits_profile, space, parts):
    assert_one_line_error(run(tmp_path, digits_profile, space)[0], *parts)


def test_bad_options_are_one_line_errors(tmp_path, digits_profile):
    path = tmp_path / "space.toml"
    path.write_text(SPACE)
    assert_one_line_error(invoke("sweep", MODEL, MODEL, "--profile", digits_profile, "--space",
                                 path), "2 models but 1 --profile")
    assert_one_line_error(invoke("sweep", MODEL, "--profile", digits_profile, "--space", path,
                                 "--points", "3"), "--points 3", "--search random")


LARGER = SPACE + '"dma.bytes_per_cycle" = [8, 16, 32]\n"vector.lanes" = [8, 16]\n'


def test_two_processes_give_the_same_results(tmp_path, digits_profile, dask_scheduler):
    one = run(tmp_path, digits_profile, SPACE, "--cluster", "local")[1]
    two = run(tmp_path, digits_profile, SPACE, "--cluster", "local:2")[1]
    assert one == two and one["evaluated"] == 6
    assert run(tmp_path, digits_profile, SPACE, "--cluster", dask_scheduler)[1] == one
    local = ("--search", "local", "--points", "12", "--seed", "5")
    one = run(tmp_path, digits_profile, LARGER, *local, "--cluster", "local")[1]
    two = run(tmp_path, digits_profile, LARGER, *local, "--cluster", "local:2")[1]
    assert one == two


def test_local_search_spends_its_budget_near_the_fronts(tmp_path, digits_profile):
    result, doc = run(tmp_path, digits_profile, LARGER, "--search", "local", "--points", "12",
                      "--seed", "5")
    assert result.exit_code == 0, result.output
    assert len(doc["points"]) == 12 and doc["search"] == "local" and doc["seed"] == 5
    assert len({p["index"] for p in doc["points"]}) == 12
    space = spaces.parse_space({"space": {"array.rows": [8, 16], "array.cols": [8, 16, 32]}},
                              "s")
    # index = rows position * 3 + cols position: 4 is (16, 16), next to (8, 16), (16, 8), (16, 32)
    assert sweep.neighbours(space, 4) == [1, 3, 5] and sweep.neighbours(space, 0) == [1, 3]


def test_several_models_add_their_cycles(tmp_path, digits_profile):
    path = tmp_path / "space.toml"
    path.write_text('[space]\n"array.rows" = [8, 16]\n')
    out = tmp_path / "sweep.json"
    result = invoke("sweep", MODEL, MODEL, "--profile", digits_profile, "--profile",
                    digits_profile, "--space", path, "-o", out)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    for p in doc["points"]:
        assert len(p["models"]) == 2
        assert p["cycles"] == sum(m["cycles"] for m in p["models"].values())


def test_space_values_and_ranges():
    space = spaces.parse_space({"space": {"array.rows": {"start": 8, "stop": 30, "step": 8},
                                         "clock_mhz": 500,
                                         "dma.bytes_per_cycle": {"start": 4, "stop": 64,
                                                                 "factor": 2}}}, "s")
    assert space.axes == {"array.rows": (8, 16, 24), "clock_mhz": (500,),
                          "dma.bytes_per_cycle": (4, 8, 16, 32, 64)}
    assert space.size == 15 and space.config(14) == {"array.rows": 24, "clock_mhz": 500,
                                                     "dma.bytes_per_cycle": 64}
    with pytest.raises(EmberError, match="quote dotted keys"):
        spaces.parse_space({"space": {"array": {"rows": [8]}}}, "s")


def test_pareto_front_drops_dominated_points_and_keeps_one_of_a_tie():
    points = [{"index": i, "a": a, "c": c}
              for i, (a, c) in enumerate([(1, 9), (2, 5), (2, 5), (3, 5), (4, 1), (5, 1)])]
    assert [p["index"] for p in sweep.pareto_front(points, "a", "c")] == [0, 1, 4]
    # of a tie on both, the one better on the third objective
    tied = [{"index": 0, "cycles": 5, "energy_uj": 2, "area_mm2": 3.0},
            {"index": 1, "cycles": 5, "energy_uj": 2, "area_mm2": 1.0}]
    assert [p["index"] for p in sweep.pareto_front(tied, "energy_uj", "cycles")] == [1]
