"""Mixed precision under an accuracy budget: the fewest tensors and weights raised above int8
until the model's output meets `--min-sqnr`, `--max-drop` or `--min-agreement` on the
evaluation data.

The order comes from the sensitivity analysis (`ember.sensitivity`): each quantized tensor's
gain, the output SQNR won by keeping it at full precision in its range, which is what int16
keeps, and each layer's weights' gain, merged into one ranking. Down that ranking, a tensor is
raised to int16 where the accelerator can hold it (`QuantOptions.int16_tensors`,
`quantizer.wide`), a layer's weights to int16 on the array (`QuantOptions.int16_weights`);
else, with `allow_host`, the tensor is kept in fp32 on the host with its producer and readers
(or the layer, for its weights: the last resort, a host segment), else passed over with its
reason. The search raises the first 1, 2, 4, ... of that list, measuring each configuration
with the integer reference on the evaluation data, then bisects between the last miss and the
first hit: the fewest of the ranked items that meet the budget (the gains are estimates, so
each step is measured, never assumed).

The fewest items are not the cheapest: an int16 input and int16 weights make a layer's four
array passes, and on a detector the bisection's prefix holds hundreds of items that gain a few
hundredths of a dB each at the cost of whole layers' passes. So the search then prunes
(`_prune`): each raised item's cost in cycles is estimated from the quantized graph
(`ember.cost`, no compile), and the items are dropped costliest per dB of expected gain first,
in batches that grow while the budget holds, each step measured. The choice reports each
raised item's estimated cost.

Some error no precision fixes: a channel a hundred times narrower than its tensor's widest keeps
a few steps of one per-tensor scale, int16 or not, and a depthwise Conv after it amplifies what
it lost (PicoDet's backbone: every tensor and weight int16 left its regions' F1 0.6 points short).
Cross-layer equalization evens those channels out (`--equalize all`, `quantizer.equalize`), and
the model it makes needs its own profile. So when the user left `--equalize` out and int8
misses, the search profiles the equalized model on the given profile's own calibration data
(`ember.reprofile`) and measures it; when it meets the budget at int8 it is the choice, else
the search goes on from the plain model (`_equalized`: whose int16 forms reach further), and
what the trial found is the choice's `equalization`.
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from compiler.backend.progress import Progress, quiet
from compiler.graph.int8 import Quant
from compiler.graph.ir import Graph
from compiler.graph.ops import OPS
from ember.accuracy import Evaluation, measure
from ember.cluster import Where
from ember.cost import CycleModel, Wide, marginal
from ember.errors import EmberError
from ember.flow import Quantizer
from ember.reports.accuracy import AccuracyReport
from ember.reprofile import NotAgain, profile_again
from profiler import format as profile_format
from profiler.format import Profile
from profiler.run import load_model
from quantizer.equalize import chain_count, equalize
from quantizer.errors import QuantizeError
from quantizer.options import QuantOptions
from simulator.arch import Arch

# Tensors whose estimated gain is below this are not raised: none, so every tensor with a gain
# is ranked, those that lose alone last. Each gain is measured alone, and alone they can mislead:
# on PP-OCRv4's DB detector no tensor gains more than 2 dB while all of them together gain 11,
# and ranking only those that gain alone stopped the search at 14.93 dB where the whole
# ranking reached 17.66 (the search keeps the best configuration it measured either way).
MIN_GAIN_DB = float("-inf")
# The most configurations measured in one search (each runs every evaluation sample).
MAX_EVALUATIONS = 16
# The most configurations measured by the pruning after the search met the budget: as many
# as the search's. Batches of 1, 2, 4, ... reach 255 items if every drop passes, and a miss
# halves the next batch. On the DB detector (--min-sqnr 30) 8 took it from 15.70 to 13.02
# million cycles, 16 to 12.26 (30.75 dB: little margin left for more), 34 s more.
PRUNE_EVALUATIONS = 16
# The pruning orders the raised items by estimated cycles per dB of expected gain, a gain
# counted as at least this: the ranking puts many items within a hundredth of a dB of zero,
# or below it, and dropping such an item can still lose whole dB (on the DB detector
# p2o.Add.27, ranked -0.06 dB, loses 4.5 dB dropped from the 300), so a gain near zero says
# little beyond "small", and among those the costliest are tried first.
LOSS_FLOOR_DB = 0.01
# The ranking runs the model twice per tensor and sample (a CRNN: 517 tensors), and its gains
# are estimates that each configuration's measurement checks: it reads at most this many of the
# evaluation samples, which a task-metric budget may want by the hundred.
RANKING_SAMPLES = 32


@dataclass(frozen=True)
class Budget:
    """What the output must meet: every output's SQNR at least `min_sqnr` dB; each labelled
    classifier output's top-1 accuracy (a CTC head's: of whole texts), or the task metric of
    `--metric`, at most `max_drop` points below fp32's; each classifier output's top-1
    agreeing with fp32's on at least `min_agreement` percent of the samples, or of the
    positions of one scored per position (`Evaluation.class_axes`; no labels needed: fp32's
    own answers are the reference)."""

    min_sqnr: float | None = None
    max_drop: float | None = None
    min_agreement: float | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.min_sqnr, self.max_drop, self.min_agreement))

    def shortfall(self, report: AccuracyReport) -> str | None:
        """What the report misses, in words, or None when it meets the budget."""
        task = report.task
        if self.max_drop is not None and task is not None and task.drop_points is not None \
                and task.drop_points > self.max_drop:
            return (f"task metric {task.name} {task.drop_points:.2f} points below fp32 > "
                    f"{self.max_drop}")
        for output in report.outputs:
            if self.min_sqnr is not None and output.sqnr_db < self.min_sqnr:
                return f"output {output.name!r}: SQNR {output.sqnr_db:.2f} dB < {self.min_sqnr}"
            if self.max_drop is not None and output.top1_accuracy_fp32 is not None:
                drop = drop_points(output)
                if drop > self.max_drop:
                    return (f"output {output.name!r}: {output.accuracy_name} {drop:.2f} "
                            f"points below fp32 > {self.max_drop}")
            if self.min_agreement is not None and output.top1_agreement is not None and \
                    100 * output.top1_agreement < self.min_agreement:
                of = f" of {output.top1_positions:,} positions" \
                    if output.top1_per_position else ""
                return (f"output {output.name!r}: {_top1(output)} agrees with fp32 on "
                        f"{100 * output.top1_agreement:.2f}%{of} < {self.min_agreement}%")
        return None

    def margin(self, report: AccuracyReport) -> float:
        """How far inside (positive) or outside the budget the report is, in its own units
        (dB or points): the best configuration of a missed search is the largest."""
        margins = []
        if self.max_drop is not None and report.task is not None and \
                report.task.drop_points is not None:
            margins.append(self.max_drop - report.task.drop_points)
        for output in report.outputs:
            if self.min_sqnr is not None:
                margins.append(output.sqnr_db - self.min_sqnr)
            if self.max_drop is not None and output.top1_accuracy_fp32 is not None:
                margins.append(self.max_drop - drop_points(output))
            if self.min_agreement is not None and output.top1_agreement is not None:
                margins.append(100 * output.top1_agreement - self.min_agreement)
        return min(margins)

    def describe(self, report: AccuracyReport) -> str:
        """The report's figures the budget reads, in words."""
        parts = []
        task = report.task
        if self.max_drop is not None and task is not None and task.drop_points is not None:
            parts.append(f"task metric {task.name} {100 * task.int8:.2f}% (fp32 "
                         f"{100 * task.fp32:.2f}%)")
        for output in report.outputs:
            if self.min_sqnr is not None:
                parts.append(f"{output.name} {output.sqnr_db:.2f} dB")
            if self.max_drop is not None and output.top1_accuracy_fp32 is not None:
                parts.append(f"{output.name} {output.accuracy_name} "
                             f"{100 * output.top1_accuracy_int8:.2f}% "
                             f"(fp32 {100 * output.top1_accuracy_fp32:.2f}%)")
            if self.min_agreement is not None and output.top1_agreement is not None:
                parts.append(f"{output.name} {_top1(output)} agreement "
                             f"{100 * output.top1_agreement:.2f}%")
        return ", ".join(parts)


def _top1(output) -> str:
    if output.threshold is not None:
        return f"each decision (> {output.threshold:g})"
    return "per-position top-1" if output.top1_per_position else "top-1"


def drop_points(output) -> float:
    """Top-1 accuracy points lost to quantization (against labels)."""
    return 100 * (output.top1_accuracy_fp32 - output.top1_accuracy_int8)


@dataclass(frozen=True)
class Raised:
    """One tensor (or a layer's weights, by the weight's name) held above int8: how, what the
    sensitivity analysis expected it to gain, and its nodes: those kept in fp32 for it
    (host), or the layer whose weights are int16."""

    tensor: str
    how: str  # "int16", "int16 weights" or "fp32"
    gain_db: float
    nodes: tuple[str, ...] = ()
    # The cycles it costs among the others raised (dropping it alone saves them), estimated
    # from the quantized graph (`ember.cost`); set on a choice's items.
    cost_cycles: int | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Choice:
    """The search's outcome: the options it chose (or, when the budget was missed, the best
    it measured), the tensors raised, and the reports before and after."""

    options: QuantOptions
    raised: tuple[Raised, ...]
    baseline: AccuracyReport
    report: AccuracyReport
    met: bool
    evaluations: int
    passed_over: tuple[tuple[str, str], ...] = ()  # (tensor, why it could not be raised)
    budget: Budget | None = None
    pruned: int = 0  # items the search met the budget with that the pruning dropped
    # The estimated cycles (`ember.cost`) of the all-int8 program and of the chosen one.
    estimated_cycles: tuple[int, int] | None = None
    # The search's own trial of cross-layer equalization, when it made one (`_equalized`).
    equalization: Equalization | None = None


@dataclass(frozen=True)
class Equalization:
    """The budget's trial of `--equalize all` (Nagel et al.'s cross-layer equalization, through
    any activation): what it found, in words; the equalized model's int8 report when measured;
    and, when that met the budget (the choice), its profile, made on the given profile's own
    calibration data (`ember.reprofile`), which the chosen options need beside the program."""

    note: str
    report: AccuracyReport | None = None
    profile: Profile | None = None

    @property
    def chosen(self) -> bool:
        return self.profile is not None


class BudgetMissed(EmberError):
    """No configuration met the budget: the message says the best one measured."""

    def __init__(self, message: str, best: Choice):
        super().__init__(message)
        self.best = best


def choose(model_path: str, profile_path: str, evaluation: Evaluation, options: QuantOptions,
           budget: Budget, allow_host: bool,
           input_shapes: Mapping[str, Sequence[int]] | None = None,
           progress: Progress = quiet, where: Where = Where(),
           target: Arch | str = "default", try_equalize: bool = False) -> Choice:
    """The fewest ranked tensors to raise so that `budget` holds on `evaluation`, then the
    costliest of them for `target` dropped while it still holds (see the module docstring);
    raises BudgetMissed, carrying the best measured, when none does. `where` (--cluster) runs
    each measurement's samples and the ranking's runs in shards. With `try_equalize` (the
    options' equalize "off", as the user left it), an int8 model that misses is tried
    equalized too (`_equalized`): the choice if it meets the budget as it is."""
    if not budget.given:
        raise EmberError("a budget needs --min-sqnr, --max-drop or --min-agreement")

    def run(opts: QuantOptions, sensitivity: bool = False,
            profile: str = profile_path) -> AccuracyReport:
        ranking = dataclasses.replace(evaluation, per_layer=True, sensitivity=True, alone=False,
                                      samples=min(evaluation.samples or RANKING_SAMPLES,
                                                  RANKING_SAMPLES))
        with warnings.catch_warnings():  # the final compile says them once
            warnings.simplefilter("ignore")
            return measure(model_path, profile, ranking if sensitivity else evaluation,
                           opts, input_shapes, progress, where=where)

    progress("budget: measuring int8", 0, None)
    baseline = run(options)
    if budget.max_drop is not None and baseline.task is not None and \
            baseline.task.drop_points is None:
        raise EmberError(f"--max-drop: --metric {baseline.task.source} weighed nothing on "
                         f"--data {evaluation.data} (every weight 0): there is no task metric "
                         f"to hold")
    if budget.max_drop is not None and baseline.task is None and \
            not any(o.top1_accuracy_fp32 is not None for o in baseline.outputs):
        sequence = next((o for o in baseline.outputs if o.top1_per_position), None)
        if sequence is not None:
            raise EmberError(f"--max-drop compares accuracy with labels, and output "
                             f"{sequence.name!r} is scored per position (--class-axis "
                             f"{sequence.name}={sequence.class_axis}): for a CTC head, give "
                             f"--ctc-blank and one row of class indices per sample as labels; "
                             f"else use --min-agreement, which needs none")
        raise EmberError(f"--max-drop needs labels for a classifier output: give --labels, or a "
                         f"'labels' array in --data {evaluation.data}; a model that is not a "
                         f"classifier is held by a task metric of your own (--metric)")
    if budget.min_agreement is not None and not any(o.top1_agreement is not None
                                                    for o in baseline.outputs):
        outputs = ", ".join(f"{o.name!r} [{', '.join(map(str, o.shape or ()))}]"
                            for o in baseline.outputs)
        raise EmberError(f"--min-agreement needs a classifier output ([batch, classes] "
                         f"scores, or one whose class axis --class-axis OUTPUT=AXIS names); "
                         f"this model's outputs are {outputs}: name a class axis, read yes/no "
                         f"scores with --threshold OUTPUT=T, or use --min-sqnr")
    if budget.shortfall(baseline) is None:
        return Choice(options, (), baseline, baseline, True, 1, budget=budget)
    equalization = None
    if try_equalize and options.equalize == "off":
        equalization = _equalized(model_path, profile_path, options, budget, baseline, run,
                                  where, progress)
        if equalization.chosen:
            return Choice(dataclasses.replace(options, equalize="all"), (), baseline,
                          equalization.report, True, 2, budget=budget,
                          equalization=equalization)
    return _search(model_path, profile_path, options, budget, allow_host, input_shapes, run,
                   baseline, equalization, progress, target)


def _equalized(model_path: str, profile_path: str, options: QuantOptions, budget: Budget,
               baseline: AccuracyReport, run: Callable[..., AccuracyReport], where: Where,
               progress: Progress) -> Equalization:
    """The int8 model with `--equalize all`, profiled on the given profile's own calibration
    data, measured, and taken when it meets the budget:
    a per-tensor int16 scale cannot give a channel a hundred times narrower than its tensor's
    widest the steps it loses (PicoDet's backbone, whose depthwise Convs then amplify it), and
    equalization can, at one table per channel. One that only comes closer is not searched
    from: the int16 forms reach fewer of its nodes (a ReLU6 chain's per-channel bound is not
    widened, so EfficientNet-Lite0's search from it kept 3 tensors in fp32 on the host where
    the plain model's needed none)."""
    if options.weight_rounding:
        return Equalization("--equalize all not tried: --weight-rounding's codes are for the "
                            "plain model's weights")
    proto = load_model(model_path)
    chains = chain_count(proto, "all")
    if not chains:
        return Equalization("--equalize all not tried: the model has no Conv -> Conv chain")
    progress("budget: profiling the model equalized (--equalize all) on the profile's data",
             0, None)
    try:
        again = profile_again(equalize(proto, "all"), profile_format.load(profile_path),
                              model_path, where)
    except NotAgain as why:
        return Equalization(f"--equalize all not tried: {why}")
    progress("budget: measuring the equalized model at int8", 0, None)
    with tempfile.TemporaryDirectory(prefix="ember-budget-") as scratch:
        path = Path(scratch) / "equalized.profile.json"  # `measure` reads a profile's file
        profile_format.save(again, path)
        try:
            report = run(dataclasses.replace(options, equalize="all"), profile=str(path))
        except (QuantizeError, EmberError) as err:
            return Equalization(f"--equalize all tried, and it does not quantize: {err}")
    met = budget.shortfall(report) is None
    note = (f"--equalize all ({chains} chain{'s' if chains > 1 else ''}) at int8: "
            f"{budget.describe(report)} ({'meets the budget' if met else 'misses the budget'}; "
            f"plain: {budget.describe(baseline)})")
    return Equalization(note, report, again if met else None)


def _search(model_path: str, profile_path: str, options: QuantOptions, budget: Budget,
            allow_host: bool, input_shapes: Mapping[str, Sequence[int]] | None,
            run: Callable[..., AccuracyReport], baseline: AccuracyReport,
            equalization: Equalization | None, progress: Progress,
            target: Arch | str) -> Choice:
    """`choose`'s search from `baseline`, the int8 model of `options` and `profile_path`."""
    progress("budget: ranking tensors and weights by sensitivity", 0, None)
    ranking = run(options, sensitivity=True)
    # (name, gain, node): a tensor's (node None), or a layer's weights (the node reading them)
    ranked = [(layer.name, layer.gain_db, None) for layer in ranking.layers
              if layer.gain_db is not None and layer.gain_db >= MIN_GAIN_DB]
    ranked += [(w.name, w.gain_db, w.node) for w in ranking.weights
               if w.gain_db is not None and w.gain_db >= MIN_GAIN_DB and w.precision == "int8"]
    ranked.sort(key=lambda item: -item[1])
    quantizer = Quantizer(model_path, profile_path, input_shapes, options.equalize)

    def quantize(opts: QuantOptions):
        with warnings.catch_warnings():  # the final compile says them once
            warnings.simplefilter("ignore")
            return quantizer(opts)

    int8 = quantize(options)
    candidates = _Candidates(ranked, options, allow_host, int8.graph, quantize)
    measured: dict[int, AccuracyReport] = {0: baseline}
    trials = 1 + (equalization is not None and equalization.report is not None)

    def meets(count: int) -> bool:
        count = candidates.verify(count)
        if count not in measured:
            progress(f"budget: {count} tensors raised", len(measured), None)
            measured[count] = run(candidates.options(count))
        return budget.shortfall(measured[count]) is None

    # 1, 2, 4, ... up to every candidate, then bisect between the last miss and the first hit.
    low, high, count = 0, None, 1
    while len(measured) < MAX_EVALUATIONS:
        count = min(count, candidates.available(count))
        if count <= low:
            break
        if meets(count):
            high = count
            break
        low, count = count, 2 * count
    while high is not None and high - low > 1 and len(measured) < MAX_EVALUATIONS:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    model = CycleModel(int8.qgraph, target if isinstance(target, Arch) else Arch.load(target),
                       int8.graph)
    if high is None:
        best = max(measured, key=lambda n: budget.margin(measured[n]))
        raised = _priced(candidates.raised(best), model)
        choice = Choice(candidates.options(best), raised, baseline, measured[best], False,
                        len(measured) + trials - 1, candidates.passed_over, budget,
                        estimated_cycles=(model.cycles(), model.cycles(_wide(model, raised))),
                        equalization=equalization)
        what = (f"{best} tensors raised ({_names(choice.raised)})" if best else
                "nothing raised")
        also = "" if allow_host else "; --allow-host lets ember keep tensors in fp32 on the host"
        tried = "" if equalization is None else f"; {equalization.note}"
        raise BudgetMissed(f"the budget is not met: {budget.shortfall(baseline)} at int8; the "
                           f"best measured is {budget.describe(measured[best])} with {what}"
                           f"{_passed_over(candidates)}{tried}{also}", choice)
    raised, report, pruning = _prune(candidates.raised(high), measured[high], model, budget,
                                     run, quantize, options, progress)
    raised = _priced(raised, model)
    chosen = model.cycles(_wide(model, raised))
    return Choice(_options(options, raised), raised, baseline, report, True,
                  len(measured) + trials - 1 + pruning, candidates.passed_over, budget,
                  pruned=high - len(raised), estimated_cycles=(model.cycles(), chosen),
                  equalization=equalization)


def _wide(model: CycleModel, raised: Sequence[Raised]) -> Wide:
    wide = Wide()
    for r in raised:
        wide = wide | model.item(r.tensor, r.how, r.nodes)
    return wide


def _priced(raised: Sequence[Raised], model: CycleModel) -> tuple[Raised, ...]:
    """`raised`, each with its estimated cost among the others."""
    costs = marginal(model, {k: model.item(r.tensor, r.how, r.nodes)
                             for k, r in enumerate(raised)})
    return tuple(dataclasses.replace(r, cost_cycles=costs[k]) for k, r in enumerate(raised))


def drop_order(raised: Sequence[Raised]) -> list[int]:
    """The indices of `raised` (priced) in the order the pruning tries to drop them: the most
    cycles per dB of expected gain first, a gain under LOSS_FLOOR_DB counted as that much
    (so among items that gain next to nothing the costliest go first), never one that costs
    nothing."""
    def key(k: int) -> tuple[float, float]:
        cost = raised[k].cost_cycles or 0
        return (-cost / max(raised[k].gain_db, LOSS_FLOOR_DB), -cost)
    return sorted((k for k, r in enumerate(raised) if (r.cost_cycles or 0) > 0), key=key)


def _prune(raised: tuple[Raised, ...], report: AccuracyReport, model: CycleModel,
           budget: Budget, run: Callable[[QuantOptions], AccuracyReport],
           quantize: Callable[[QuantOptions], object], base: QuantOptions,
           progress: Progress) -> tuple[tuple[Raised, ...], AccuracyReport, int]:
    """`raised` (which met the budget, `report`) with items of `drop_order` dropped in
    batches, each measured and kept only if the budget still holds, in at most
    PRUNE_EVALUATIONS measurements: the next 1, 2, 4, ... items while drops pass, half the
    batch after one misses, and an item that misses alone kept (a configuration that does not
    quantize, an item needing one dropped, is a miss without a measurement). The gains are no
    guide to how many can go (on the DB detector dropping an item from the 300 loses 10 to
    200 times its gain), so the batches grow from one. The items kept, their report and the
    measurements made."""
    pending = drop_order(_priced(raised, model))
    dropped: set[int] = set()
    best, evaluations, size = report, 0, 1

    def kept(without: set[int]) -> tuple[Raised, ...]:
        return tuple(r for k, r in enumerate(raised) if k not in without)

    while pending and evaluations < PRUNE_EVALUATIONS:
        batch = pending[:size]
        opts = _options(base, kept(dropped | set(batch)))
        try:
            quantize(opts)
        except QuantizeError:
            measured = None
        else:
            progress(f"budget: pruning, dropping {len(batch)} more of {len(raised)} raised",
                     evaluations, PRUNE_EVALUATIONS)
            measured = run(opts)
            evaluations += 1
        if measured is not None and budget.shortfall(measured) is None:
            dropped |= set(batch)
            best, pending, size = measured, pending[len(batch):], 2 * len(batch)
        elif len(batch) == 1:
            pending = pending[1:]
        else:
            size = len(batch) // 2
    return kept(dropped), best, evaluations


class _Candidates:
    """The ranked tensors that can be raised, each checked against those before it (int16
    first; fp32 on the host with `allow_host`), found only as far as the search asks.

    Checking means quantizing with it (the quantizer's gates say what the accelerator holds),
    a second or more on a real model, and a ranking runs to hundreds: so the next items are
    checked together, and only a group that fails is split in halves, down to the items that
    fail alone (group testing: a few failures cost a few quantizations each), the groups
    sized by the failure rate so far (`_group_size`). A prefix that
    ends inside a group that passed was not checked itself: `verify` checks one before it is
    measured and, should it fail (a tensor needing one raised after it), checks that group
    again one item at a time."""

    def __init__(self, ranked: list[tuple[str, float, str | None]], options: QuantOptions,
                 allow_host: bool, graph: Graph, quantize: Callable[[QuantOptions], object]):
        self.ranked, self.base, self.allow_host = iter(ranked), options, allow_host
        self.graph, self.quantize = graph, quantize
        self.found: list[Raised] = []
        self.checked = {0}  # the counts of `found` quantized as they stand
        self.passed_over: list[tuple[str, str]] = []
        self._kept_nodes = set(options.keep_fp32)
        self._host_nodes: dict[Raised, Callable[[], set[str]]] = {}

    def available(self, count: int) -> int:
        """How many of the first `count` exist (fewer when the ranking runs out)."""
        while len(self.found) < count:
            items = [next(self.ranked, None) for _ in range(count - len(self.found))]
            items = [self._int16(*item) for item in items if item is not None]
            if not items:
                break
            while items:
                size = self._group_size()
                self._check(items[:size])
                items = items[size:]
        return min(count, len(self.found))

    def _group_size(self) -> int:
        """Items checked together, by the failure rate p so far (Laplace's rule): 1/p while
        failures are rare (at most 64), 1/sqrt(p) (Dorfman's) where they are not, one at a
        time from p = 1/4 up: where most fail, as in a CRNN's LSTM steps, big groups would
        almost all fail and split (1.8 checks a candidate at p = 0.6 against 1.0 one by one,
        `tests/ember/test_budget.py`)."""
        failed = len(self.passed_over) + sum(r.how == "fp32" for r in self.found)
        rate = (failed + 1) / (len(self.found) + len(self.passed_over) + 2)
        return max(1, min(64, int(1 / rate) if rate < 0.05 else int(rate ** -0.5)))

    def verify(self, count: int) -> int:
        """`count`, once the first `count` found are known to quantize (see the class)."""
        if count in self.checked:
            return count
        try:
            self.quantize(self.options(count))
            self.checked.add(count)
            return count
        except QuantizeError:
            start = max(c for c in self.checked if c < count)
            redo, self.found = self.found[start:], self.found[:start]
            self.checked = {c for c in self.checked if c <= start}
            for raised in redo:
                if raised.how == "fp32":
                    self._kept_nodes -= set(raised.nodes)
            for raised in redo:
                self._check([self._original(raised)])
            return self.available(count)

    def options(self, count: int) -> QuantOptions:
        return _options(self.base, self.found[:count])

    def raised(self, count: int) -> tuple[Raised, ...]:
        return tuple(self.found[:count])

    def _int16(self, name: str, gain: float, node: str | None) -> Raised:
        """A tensor (`node` None) at int16, or the weights `name` of layer `node` at int16
        weights; the nodes the host would keep instead, should the accelerator refuse."""
        if node is None:
            raised = Raised(name, "int16", gain)
            self._host_nodes[raised] = lambda: _nodes_around(self.graph, name)
        else:
            raised = Raised(name, "int16 weights", gain, (node,))
            self._host_nodes[raised] = lambda: _layer_with_clamp(self.graph, node)
        return raised

    def _original(self, raised: Raised) -> Raised:
        """The int16 item a found one was made from (an fp32 one is its host fallback)."""
        if raised.how != "fp32":
            return raised
        return next(r for r in self._host_nodes if r.tensor == raised.tensor)

    def _wanted(self, raised: Raised) -> bool:
        """Not already covered: a layer kept in fp32 has its weights so, and a tensor a host
        segment holds (or raised already) needs nothing more."""
        if raised.how == "int16 weights":
            return raised.nodes[0] not in self._kept_nodes
        return not any(raised.tensor in r.nodes or raised.tensor == r.tensor for r in self.found)

    def _check(self, group: list[Raised]) -> None:
        group = [r for r in group if self._wanted(r)]
        if len(group) == 1:
            self._raise(group[0])
        elif group:
            try:
                self.quantize(_options(self.base, [*self.found, *group]))
            except QuantizeError:
                middle = len(group) // 2
                self._check(group[:middle])
                self._check(group[middle:])
                return
            self.found += group
            self.checked.add(len(self.found))

    def _raise(self, int16: Raised) -> None:
        """One item: int16 where the accelerator can hold it, else (with --allow-host) fp32
        on the host, with the nodes that keep it so, else passed over with the reasons."""
        try:
            self.quantize(_options(self.base, [*self.found, int16]))
            self.found.append(int16)
            self.checked.add(len(self.found))
            return
        except QuantizeError as err:
            why = f"{int16.how}: {err}"
        if not self.allow_host:
            self.passed_over.append((int16.tensor, why))
            return
        nodes = self._host_nodes[int16]() - self._kept_nodes
        kept = Raised(int16.tensor, "fp32", int16.gain_db, tuple(sorted(nodes)))
        try:
            self.quantize(_options(self.base, [*self.found, kept]))
        except QuantizeError as err:  # e.g. a node it keeps writes a tensor raised to int16
            self.passed_over.append((int16.tensor, f"{why}; fp32 on the host: {err}"))
            return
        self._kept_nodes |= nodes
        self.found.append(kept)
        self.checked.add(len(self.found))


def _layer_with_clamp(graph: Graph, node: str) -> set[str]:
    """Node `node` and a clamp that alone reads its output (kept together: see
    `_nodes_around`)."""
    return _with_clamps_after(graph, {node})


def _options(base: QuantOptions, raised: Sequence[Raised]) -> QuantOptions:
    int16 = tuple(r.tensor for r in raised if r.how == "int16")
    weights = tuple(node for r in raised if r.how == "int16 weights" for node in r.nodes)
    kept = tuple(node for r in raised if r.how == "fp32" for node in r.nodes)
    return dataclasses.replace(
        base, int16_tensors=tuple(dict.fromkeys((*base.int16_tensors, *int16))),
        int16_weights=tuple(dict.fromkeys((*base.int16_weights, *weights))),
        keep_fp32=tuple(dict.fromkeys((*base.keep_fp32, *kept))))


def _nodes_around(graph: Graph, tensor: str) -> set[str]:
    """The nodes that keep `tensor` in fp32 when they run there: its producer (with the layer
    before it when the producer is a clamp fused into that layer) and every node that reads
    it; and a clamp that alone reads a kept node's output, which would otherwise take the
    node's unclamped range in int8 (a Conv kept without its ReLU6 loses 8 dB there)."""
    producers = graph.producers()

    def readers(value: str) -> list:
        return [node for node in graph.nodes if value in node.inputs]

    def clamp(node) -> bool:
        return OPS[node.op].quant is Quant.CLAMP

    nodes = {node.name for node in readers(tensor)}
    producer = producers.get(tensor)
    if producer is not None:
        nodes.add(producer.name)
        source = producer.inputs[0]
        if clamp(producer) and source in producers and len(readers(source)) == 1:
            nodes.add(producers[source].name)
    return _with_clamps_after(graph, nodes)


def _with_clamps_after(graph: Graph, nodes: set[str]) -> set[str]:
    """`nodes` and each clamp that alone reads one of their outputs: kept in fp32 without
    it, a layer would hand the clamp its unclamped range in int8."""
    by_name = {node.name: node for node in graph.nodes}
    found = set(nodes)
    for name in nodes:
        for out in by_name[name].outputs:
            after = [node for node in graph.nodes if out in node.inputs]
            if len(after) == 1 and OPS[after[0].op].quant is Quant.CLAMP:
                found.add(after[0].name)
    return found


def _names(raised: Sequence[Raised], shown: int = 5) -> str:
    names = ", ".join(f"{r.tensor} {r.how}" for r in raised[:shown])
    return names + (f" and {len(raised) - shown} more" if len(raised) > shown else "")


def _passed_over(candidates: _Candidates) -> str:
    if not candidates.passed_over:
        return ""
    tensor, why = candidates.passed_over[0]
    more = len(candidates.passed_over) - 1
    return (f"; passed over {tensor} ({why})" + (f" and {more} more" if more else ""))
