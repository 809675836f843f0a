"""Design-space exploration: compile and time one or more models on many architectures, and
keep the points no other beats on cycles and area, or on cycles and energy.

The space, its file and its constraints are `ember.space`'s. The space is a grid: point `index`
is the mixed-radix number of its values' positions, the first key the most significant, so the
grid search runs `itertools.product`'s order and a random search draws indices without
repetition from a seeded generator. A local search
(Pareto local search) spends a quarter of its budget at random (at least a batch, or half a
small budget), then evaluates, batch after batch, untried neighbours (one key moved to the
next or previous value) of the points on either front; batches have a fixed size, so its
choices do not depend on the workers. Results
are exact and in index order, so where the points ran (`--cluster`) changes nothing in them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from compiler.backend.program import BackendOptions
from compiler.errors import CompileError
from ember import cluster
from ember.errors import EmberError
from ember.flow import CompileOptions, prepare_model
from ember.space import Space, arch_at, metrics
from simulator import machine
from simulator.arch import Arch
from simulator.errors import SimulatorError
from simulator.stats import Stats

SWEEP_VERSION = 1
SEARCHES = ("grid", "random", "local")
LOCAL_BATCH = 8  # points a local search chooses at once, from the results before them
OBJECTIVES = ("cycles", "energy_uj", "area_mm2")
# The two trade-offs reported as Pareto fronts: (x, y), both minimized.
FRONTS = {"cycles_area": ("area_mm2", "cycles"), "cycles_energy": ("energy_uj", "cycles")}
GRID_MAX = 1_000_000  # points a grid search may have: beyond, a random search
# A random search walks a shuffled list of the space when it is at most this big, and draws
# with rejection beyond; either gives up after DRAWS_PER_POINT draws per point asked for (a
# space that the constraints leave nearly empty).
SHUFFLED_MAX = 1_000_000
DRAWS_PER_POINT = 1000


def draw(space: Space, search: str, seed: int | None) -> Iterator[int]:
    """Point indices in the order the search visits them: the grid's order, or a seeded
    uniform draw without repetition."""
    if search == "grid":
        yield from range(space.size)
        return
    rng = random.Random(seed)
    if space.size <= SHUFFLED_MAX:
        yield from rng.sample(range(space.size), space.size)
        return
    seen: set[int] = set()
    while True:
        index = rng.randrange(space.size)
        if index not in seen:
            seen.add(index)
            yield index


def neighbours(space: Space, index: int) -> list[int]:
    """The points one step away on one key (the previous or next value in its list)."""
    found, stride = [], 1
    for values in reversed(space.axes.values()):
        position = index // stride % len(values)
        if position > 0:
            found.append(index - stride)
        if position + 1 < len(values):
            found.append(index + stride)
        stride *= len(values)
    return sorted(found)


@dataclass(frozen=True)
class Model:
    """One model of the workload: its ONNX file, its profile, the name results use."""

    path: str
    profile: str
    name: str


class _Chooser:
    """Turns point indices into shards to evaluate, once each: a point whose keys make no
    architecture is kept as failed, one the constraints exclude is counted."""

    def __init__(self, space: Space, base: Arch):
        self.space, self.base = space, base.to_dict()
        self.seen: set[int] = set()
        self.configs: dict[int, dict] = {}
        self.invalid: dict[int, str] = {}
        self.metrics: dict[int, dict] = {}  # of the points evaluated
        self.excluded = 0

    def take(self, index: int) -> tuple[int, dict, dict] | None:
        """The shard of point `index`, or None when it is seen, invalid or excluded."""
        if index in self.seen:
            return None
        self.seen.add(index)
        config = self.space.config(index)
        try:
            arch = arch_at(self.base, config)
        except SimulatorError as err:
            self.configs[index] = config
            self.invalid[index] = str(err).removeprefix("point: ")
            return None
        cost = metrics(arch)
        if self.space.violated(cost) is not None:
            self.excluded += 1
            return None
        self.configs[index] = config
        self.metrics[index] = cost
        return index, config, arch.to_dict()

    @property
    def taken(self) -> int:
        """Points that count against a budget: evaluated or invalid."""
        return len(self.metrics) + len(self.invalid)


def _batches(chooser: _Chooser, search: str, points: int, seed: int | None,
             results: dict[int, dict]) -> Iterator[list]:
    """Lists of shards to evaluate, each list after the results of those before it are in
    `results` (so that a search may choose from them; lists of a fixed size keep it
    independent of how many workers there are)."""
    space = chooser.space
    if search == "grid" and space.size > GRID_MAX:
        raise EmberError(f"{space.source}: the grid has {space.size:,} points: expected at most "
                         f"{GRID_MAX:,}; use --search random --points N")
    budget = space.size if search == "grid" else points
    order = draw(space, "grid" if search == "grid" else "random", seed)
    draws = [0]

    def fill(batch: list, size: int) -> None:  # from the grid's or the random order
        for index in order:
            draws[0] += 1
            if (shard := chooser.take(index)) is not None:
                batch.append(shard)
            if len(batch) >= size or chooser.taken >= budget or \
                    draws[0] >= DRAWS_PER_POINT * budget:
                return

    if search != "local":
        batch: list = []
        fill(batch, budget)
        yield batch
        return
    # Pareto local search: a quarter of the budget at random (at least a batch, or half a
    # small budget), then batches of the untried neighbours of the points on either front
    # (random points when there are too few). benchmarks/bench_search.py: better than random
    # from 64 points on, as good at 32, a little worse at 16.
    rng = random.Random(seed)
    batch = []
    fill(batch, max(1, budget // 4, min(budget // 2, LOCAL_BATCH)))
    yield batch
    while chooser.taken < budget:
        ok = [r for r in results.values() if r["status"] == "ok"]
        front = sorted({p["index"] for x, y in FRONTS.values()
                        for p in pareto_front(ok, x, y)})
        candidates = sorted({n for i in front for n in neighbours(space, i)} - chooser.seen)
        rng.shuffle(candidates)
        batch, before = [], chooser.taken
        size = min(LOCAL_BATCH, budget - chooser.taken)
        for index in candidates:
            if len(batch) >= size or chooser.taken >= budget:
                break
            if (shard := chooser.take(index)) is not None:
                batch.append(shard)
        if len(batch) < size and chooser.taken < budget:
            fill(batch, size)
        if chooser.taken == before and not batch:
            return  # the space is exhausted
        yield batch


@dataclass(frozen=True)
class Explored:
    """What a search found: each point's result (by index), its keys, and how many points
    were evaluated and how many the constraints excluded."""

    results: dict[int, dict]
    configs: dict[int, dict]
    evaluated: int
    excluded: int


def explore(space: Space, base: Arch, search: str, points: int, seed: int | None,
            evaluate_batch: Callable[[list], Iterable[dict]]) -> Explored:
    """Run a search, `evaluate_batch(shards)` giving the results of a list of shards (index,
    config, arch dict) in any order (`evaluate`'s, or a table's in benchmarks)."""
    chooser = _Chooser(space, base)
    results: dict[int, dict] = {}
    for batch in _batches(chooser, search, points, seed, results):
        for result in evaluate_batch(batch):
            results[result["index"]] = {**result, **chooser.metrics[result["index"]]}
    if not chooser.metrics and chooser.excluded:
        bounds = ", ".join(f"{k} in [{'-inf' if lo is None else f'{lo:g}'}, "
                           f"{'inf' if hi is None else f'{hi:g}'}]"
                           for k, (lo, hi) in space.constraints.items())
        raise EmberError(f"{space.source}: no point satisfies the constraints ({bounds}; "
                         f"{chooser.excluded} points excluded)")
    for index, reason in chooser.invalid.items():
        results[index] = {"index": index, "status": "failed", "reason": reason}
    return Explored(results, chooser.configs, len(chooser.metrics), chooser.excluded)


def run(models: Sequence[Model], space: Space, base: Arch, search: str = "grid",
        points: int | None = None, seed: int | None = None,
        where: cluster.Where = cluster.Where(), backend: BackendOptions = BackendOptions(),
        on_point: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """The sweep's document (see `ember sweep --help` for its keys). A grid search evaluates
    every point, a random or local one `points` points (failed ones included)."""
    # Absolute paths: a Dask worker's working directory is not this one.
    work = Work(tuple(replace(m, path=str(Path(m.path).absolute()),
                              profile=str(Path(m.profile).absolute())) for m in models),
                CompileOptions(backend=backend))
    shared = cluster.Shared(work)
    _prepared(shared, work)  # here first: a model or profile error is the user's, in one line
    total = space.size if search == "grid" else points or 0
    done = 0
    on_point(0, total)

    def evaluate_batch(batch: list) -> Iterator[dict]:
        nonlocal done
        for _, result in runner.run(evaluate, shared, batch):
            done += 1
            on_point(done, total)
            yield result

    with cluster.Cluster(where) as runner:
        found = explore(space, base, search, points or 0, seed, evaluate_batch)
    results = found.results
    rows = [{"index": index, "config": found.configs[index], **results[index]}
            for index in sorted(results)]
    ok = [r for r in rows if r["status"] == "ok"]
    fronts = {name: [p["index"] for p in pareto_front(ok, x, y)]
              for name, (x, y) in FRONTS.items()}
    # Ties on an objective go to the point better on the others, then to the lower index.
    best = {objective: min(ok, key=lambda p: (p[objective], *(p[o] for o in OBJECTIVES),
                                              p["index"]))["index"]
            for objective in OBJECTIVES} if ok else {}
    return {"sweep_version": SWEEP_VERSION, "target": base.name,
            "models": [{"name": m.name, "path": m.path, "profile": m.profile} for m in models],
            "space": {"source": space.source, "size": space.size, **space.to_dict()},
            "search": search, "seed": seed if search != "grid" else None,
            "allow_host": backend.allow_host,
            "evaluated": found.evaluated, "failed": sum(r["status"] != "ok" for r in rows),
            "excluded_by_constraints": found.excluded,
            "best": best, "pareto": fronts, "points": rows}


@dataclass(frozen=True)
class Work:
    """What every worker needs (sent once): the models and how to compile them."""

    models: tuple[Model, ...]
    options: CompileOptions


def evaluate(shared: cluster.Shared, shard: tuple[int, dict, dict]) -> dict:
    """One point: every model compiled for its architecture and timed (the timing needs no
    data). A model that cannot be compiled fails the point, with the compiler's reason."""
    work: Work = shared.payload
    prepared = _prepared(shared, work)
    index, _, arch_dict = shard
    arch = Arch.from_dict(arch_dict)
    per_model = {}
    for model, ready in zip(work.models, prepared):
        try:
            program = ready.compile(arch).program
        except CompileError as err:
            return {"index": index, "status": "failed", "reason": f"{model.name}: {err}"}
        stats = Stats.collect(program, machine.timing(program))
        report = stats.to_report()
        per_model[model.name] = {
            "cycles": stats.cycles, "time_ms": report["time_ms"], "energy_uj": stats.energy_uj,
            "dram_bytes": stats.dram_bytes_read + stats.dram_bytes_written,
            "mac_utilization": report["mac_utilization"],
            "bound_cycles": stats.bound_cycles}
    return {"index": index, "status": "ok",
            "cycles": sum(m["cycles"] for m in per_model.values()),
            "time_ms": sum(m["time_ms"] for m in per_model.values()),
            "energy_uj": sum(m["energy_uj"] for m in per_model.values()),
            "models": per_model}


def _prepared(shared: cluster.Shared, work: Work) -> list:
    """The quantized models, built once per worker process."""
    return cluster.cached(shared, "prepared", lambda: [
        prepare_model(m.path, m.profile, work.options) for m in work.models])


def pareto_front(points: Sequence[dict], x: str, y: str) -> list[dict]:
    """The points no other beats on both `x` and `y` (both minimized; a point beats another
    when it is no worse on both and better on one), by increasing `x`. Of points equal on
    both, one stays: the best on the other objectives (then the lowest index), so a front of
    cycles against energy does not list every scratchpad size that changes neither."""
    others = [o for o in OBJECTIVES if o not in (x, y)]
    ordered = sorted(points, key=lambda p: (p[x], p[y], *(p.get(o, 0) for o in others),
                                            p["index"]))
    front: list[dict] = []
    for p in ordered:
        if not front or p[y] < front[-1][y]:
            front.append(p)
    return front


def hypervolume(points: Sequence[dict], x: str, y: str, box: dict) -> float:
    """The share of the box `box[x]` x `box[y]` ((low, high) each, scaled to [0, 1]) that
    the front of `points` dominates (both minimized): how much of the trade-off a search
    found, comparable between searches of one space."""
    front = pareto_front(points, x, y)

    def scaled(p, k):
        low, high = box[k]
        return min(1.0, max(0.0, (p[k] - low) / (high - low))) if high > low else 0.0

    total = 0.0
    for i, p in enumerate(front):
        right = scaled(front[i + 1], x) if i + 1 < len(front) else 1.0
        total += (right - scaled(p, x)) * (1.0 - scaled(p, y))
    return total
