"""Random against local search (`ember sweep --search random|local`) on the same budget, replayed
on a table of a whole grid, so that many seeds and budgets cost nothing but lookups.

    ember sweep examples/digits/model.onnx --profile digits.profile.json \\
        --space space.toml --cluster local:2 -o grid.json
    python benchmarks/bench_search.py grid.json --budgets 16,32,64,128 --seeds 50

Each search runs as `ember sweep` runs it (`ember.sweep.explore`), its points' results read
from GRID.json (an `ember sweep --search grid -o` of the same space and target). A run's
score per front is its hypervolume as a share of the whole grid's front's, both over the box
of every compiled point of the grid: 1.0 means the search found the true front.
"""

from __future__ import annotations

import argparse
import json
import statistics

from ember import space as space_file
from ember import sweep
from simulator.arch import Arch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="the JSON of an `ember sweep --search grid -o`")
    parser.add_argument("--budgets", default="16,32,64,128")
    parser.add_argument("--seeds", type=int, default=50, help="seeds 0 .. N-1 per budget")
    parser.add_argument("--target", help="the sweep's --target, if not a preset's name")
    args = parser.parse_args()
    doc = json.load(open(args.grid))
    if doc["search"] != "grid":
        raise SystemExit(f"{args.grid}: a {doc['search']} search; expected a grid")
    space = space_file.parse_space({"space": doc["space"]["axes"],
                                    "constraints": doc["space"]["constraints"]}, args.grid)
    base = Arch.load(args.target or doc["target"])
    table = {p["index"]: p for p in doc["points"]}
    grid_ok = [p for p in doc["points"] if p["status"] == "ok"]

    def lookup(batch: list) -> list[dict]:
        return [table[index] for index, _, _ in batch]

    print(f"{args.grid}: {doc['space']['size']:,} points, {len(grid_ok)} compiled; "
          f"models {', '.join(m['name'] for m in doc['models'])}; {args.seeds} seeds per budget\n")
    print("| front | budget | random: mean | random: worst | local: mean | local: worst | "
          "local wins |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (x, y) in sweep.FRONTS.items():
        box = {k: (min(p[k] for p in grid_ok), max(p[k] for p in grid_ok)) for k in (x, y)}
        best = sweep.hypervolume(grid_ok, x, y, box)
        for budget in (int(b) for b in args.budgets.split(",")):
            shares = {}
            for search in ("random", "local"):
                shares[search] = []
                for seed in range(args.seeds):
                    found = sweep.explore(space, base, search, budget, seed, lookup)
                    ok = [r for r in found.results.values() if r["status"] == "ok"]
                    shares[search].append(sweep.hypervolume(ok, x, y, box) / best)
            wins = sum(a > b for a, b in zip(shares["local"], shares["random"]))
            print(f"| {name} | {budget} | {statistics.mean(shares['random']):.3f} | "
                  f"{min(shares['random']):.3f} | {statistics.mean(shares['local']):.3f} | "
                  f"{min(shares['local']):.3f} | {wins}/{args.seeds} |", flush=True)


if __name__ == "__main__":
    main()
