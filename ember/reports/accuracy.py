"""The accuracy report: one object, rendered as a terminal table, JSON and self-contained HTML."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ember.reports.html import render_page
from ember.reports.metrics import SQNR_CAP_DB
from ember.reports.svg import bar_chart

# A kernel this far below a kernel that rounds once (its kernel loss) is flagged: its
# arithmetic, not its output's rounding, costs the tensor's accuracy, and a better kernel would
# win it back...
LOSSY_KERNEL_DB = 10.0
# ... unless its kernel SQNR is this far above the SQNR its tensor accumulates from the input:
# its error is then under 1% of what the tensor already carries, and fixing it buys nothing.
KERNEL_RELEVANT_DB = 20.0


@dataclass(frozen=True)
class OutputAccuracy:
    """One model output. For a classifier (`class_axis`: where its class scores lie), top-1
    over `top1_positions` argmaxes: the samples, or with `top1_per_position` every position of
    a sequence or map (each index of the other axes), the agreement their share."""

    name: str
    sqnr_db: float
    cosine: float
    max_abs_error: float
    classifier: bool
    top1_agreement: float | None = None
    top1_accuracy_fp32: float | None = None
    top1_accuracy_int8: float | None = None
    shape: tuple[int, ...] | None = None  # one run's
    class_axis: int | None = None
    top1_positions: int | None = None
    top1_per_position: bool = False
    # The accuracies are of whole texts: a CTC head's decoded samples against label rows.
    sequences: bool = False
    # Yes/no decisions, a score above it a yes (`--threshold`): top-1 counts decisions.
    threshold: float | None = None

    @property
    def accuracy_name(self) -> str:
        """What its accuracy against labels counts, in words."""
        return "text accuracy" if self.sequences else \
            f"accuracy of decisions > {self.threshold:g}" if self.threshold is not None else \
            "top-1"

    def accuracy_text(self, accuracy: float | None) -> str:
        """An accuracy for a table cell; a CTC head's says it counts whole texts."""
        if accuracy is None:
            return "—"
        return f"{accuracy:.2%}" + (" of texts" if self.sequences else "")

    @property
    def agreement_text(self) -> str:
        """The top-1 agreement for a table cell, with its count when it is per position."""
        if self.top1_agreement is None:
            return "—"
        if self.top1_per_position:
            what = "decisions" if self.threshold is not None else "positions"
            return f"{self.top1_agreement:.2%} of {self.top1_positions:,} {what}"
        return f"{self.top1_agreement:.2%}"


@dataclass(frozen=True)
class TaskMetric:
    """A task metric of the user's own (`--metric FILE.py:FUNCTION`, `ember.task_metric`)
    against the labels, for fp32 and int8: a fraction, its drop counted in points."""

    name: str  # the function's
    source: str  # FILE.py:FUNCTION
    fp32: float | None
    int8: float | None

    @property
    def drop_points(self) -> float | None:
        if self.fp32 is None or self.int8 is None:
            return None
        return 100 * (self.fp32 - self.int8)

    @property
    def text(self) -> str:
        """One line for people."""
        def value(v: float | None) -> str:
            return "— (nothing weighed)" if v is None else f"{v:.2%}"
        drop = self.drop_points
        change = "" if drop is None else \
            f", {abs(drop):.2f} points {'lower' if drop > 0 else 'higher'}" if drop else \
            ", level"
        return (f"task metric {self.name} ({self.source}) on the labels: fp32 "
                f"{value(self.fp32)}, int8 {value(self.int8)}{change}")


@dataclass(frozen=True)
class LayerAccuracy:
    """One quantized tensor, keyed by its ONNX name.

    own_sqnr_db: the tensor's own quantization error (fp32 value vs its quantize-dequantize);
    accumulated_sqnr_db: the error carried from the model input (fp32 vs the int8 run), as
    onnxruntime's qdq_loss_debug separates them. With --sensitivity (`ember.sensitivity`):
    alone_sqnr_db, the model output's SQNR with this tensor alone quantized, and gain_db,
    the output SQNR gained by keeping this tensor at full precision: where to look first.

    kernel_sqnr_db: the integer node that computes the tensor against its fp32 operator run on
    the dequantized inputs it received (`quantizer.ideal`): its output's rounding plus whatever
    its arithmetic adds (table interpolation, multiplier rounding, integer approximations);
    kernel_loss_db: how far below a kernel that rounds exactly once (the same signal quantized
    in the output's parameters) it falls, about 0 for an exact kernel. None for a tensor no
    integer kernel computes (a view's, a model input's, one kept in fp32).
    """

    name: str
    node: str
    op: str
    precision: str
    own_sqnr_db: float
    accumulated_sqnr_db: float
    alone_sqnr_db: float | None = None
    gain_db: float | None = None
    kernel_sqnr_db: float | None = None
    kernel_loss_db: float | None = None

    @property
    def lossy_kernel(self) -> bool:
        return (self.kernel_loss_db is not None and self.kernel_loss_db >= LOSSY_KERNEL_DB
                and self.kernel_sqnr_db < self.accumulated_sqnr_db + KERNEL_RELEVANT_DB)


@dataclass(frozen=True)
class WeightAccuracy:
    """One layer's constant weight: its ONNX name (`value`: the integer weight's), the node
    that reads it, its own quantization SQNR (the float weight against its codes), and with
    --sensitivity the model output's SQNR with only these weights quantized (alone_sqnr_db)
    and the output SQNR gained by keeping them at full precision (gain_db)."""

    name: str
    value: str
    node: str
    op: str
    precision: str
    own_sqnr_db: float
    alone_sqnr_db: float | None = None
    gain_db: float | None = None


@dataclass(frozen=True)
class AccuracyReport:
    model: str
    samples: int
    outputs: tuple[OutputAccuracy, ...]
    layers: tuple[LayerAccuracy, ...] = ()
    weights: tuple[WeightAccuracy, ...] = ()  # --per-layer: each layer's weights
    options: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    bit_exact: bool | None = None
    first_difference: dict[str, Any] | None = None
    # The program's host segments (name, nodes): what ran on the host instead of the
    # accelerator. Reported with bit_exact, when a program was checked.
    host_segments: tuple[dict[str, Any], ...] = ()
    task: TaskMetric | None = None  # --metric

    @property
    def quantized_as(self) -> str:
        """What the model was quantized to, for titles: int8, and what the options (or the
        program's record) raised to int16."""
        tensors = len(self.options.get("int16_tensors") or ())
        weights = len(self.options.get("int16_weights") or ())
        raised = [f"{tensors} tensor{'s' * (tensors != 1)}" if tensors else "",
                  ("1 layer's weights" if weights == 1 else f"{weights} layers' weights")
                  if weights else ""]
        raised = [r for r in raised if r]
        return "int8" if not raised else f"int8 with {' and '.join(raised)} int16"

    def to_json(self) -> dict[str, Any]:
        """Stable keys; the top-level metrics are those of the first output."""
        first = self.outputs[0]
        doc: dict[str, Any] = {
            "model": self.model, "samples": self.samples,
            "top1_agreement": first.top1_agreement,
            "top1_per_position": first.top1_per_position,
            "top1_accuracy_fp32": first.top1_accuracy_fp32,
            "top1_accuracy_int8": first.top1_accuracy_int8,
            "sqnr_db": first.sqnr_db, "cosine": first.cosine,
            "max_abs_error": first.max_abs_error,
            "outputs": [asdict(o) for o in self.outputs],
            "layers": [asdict(layer) for layer in self.worst_layers()],
            "lossy_kernels": [layer.name for layer in self.lossy_kernels()],
            "weights": [asdict(w) for w in self.worst_weights()],
            "precision": self.precision_counts(),
            "options": self.options, "notes": list(self.notes),
            "task_metric": None if self.task is None else asdict(self.task),
        }
        if self.bit_exact is not None:
            doc["bit_exact"] = self.bit_exact
            doc["first_difference"] = self.first_difference
            doc["host_segments"] = [dict(s) for s in self.host_segments]
        return doc

    @property
    def sensitivity(self) -> bool:
        return any(layer.gain_db is not None for layer in self.layers)

    def worst_layers(self) -> list[LayerAccuracy]:
        """With sensitivities, the largest output gain first; else the lowest accumulated
        SQNR first."""
        if self.sensitivity:
            return sorted(self.layers, key=lambda layer: -(layer.gain_db or 0.0))
        return sorted(self.layers, key=lambda layer: layer.accumulated_sqnr_db)

    def lossy_kernels(self) -> list[LayerAccuracy]:
        """The layers whose kernel loses LOSSY_KERNEL_DB or more beyond a kernel that rounds
        once (fixable kernels, not coarse tensors) and errs within KERNEL_RELEVANT_DB of what
        its tensor carries (a table at 65 dB on a tensor of 13 dB costs nothing), the lowest
        kernel SQNR first: a kernel losing 40 dB at 100 dB costs less than one losing 15 at
        35."""
        return sorted((layer for layer in self.layers if layer.lossy_kernel),
                      key=lambda layer: layer.kernel_sqnr_db or 0.0)

    @property
    def kernels_measured(self) -> bool:
        return any(layer.kernel_sqnr_db is not None for layer in self.layers)

    def worst_weights(self) -> list[WeightAccuracy]:
        """With sensitivities, the largest output gain first; else the lowest own SQNR."""
        if any(w.gain_db is not None for w in self.weights):
            return sorted(self.weights, key=lambda w: -(w.gain_db or 0.0))
        return sorted(self.weights, key=lambda w: w.own_sqnr_db)

    def applicable_options(self) -> dict[str, Any]:
        """The recorded options that applied to this run, for people: the percentile only
        under percentile calibration, and no option left unset or empty (`samples` when all
        were evaluated, `program` without one, an empty `keep_fp32`). JSON keeps them all."""
        return {k: v for k, v in self.options.items()
                if v is not None and v != [] and v != ()
                and (k != "percentile" or self.options.get("calibration") == "percentile")}

    def precision_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.precision] = counts.get(layer.precision, 0) + 1
        return counts

    def print(self, console: Console, max_layers: int = 15) -> None:
        table = Table(title=f"{self.model}: {self.quantized_as} vs fp32 onnxruntime, "
                            f"{self.samples} samples")
        for col in ("output", "SQNR dB", "cosine", "max |err|", "top-1 agree", "fp32 accuracy",
                    "int8 accuracy"):
            table.add_column(col, justify="left" if col == "output" else "right")
        for o in self.outputs:
            table.add_row(o.name, f"{o.sqnr_db:.2f}", f"{o.cosine:.5f}", f"{o.max_abs_error:.4g}",
                          o.agreement_text, o.accuracy_text(o.top1_accuracy_fp32),
                          o.accuracy_text(o.top1_accuracy_int8))
        console.print(table)
        if self.task is not None:
            console.print(escape(self.task.text), highlight=False)
        if self.layers:
            order = "largest output gain first" if self.sensitivity else "worst first"
            worst = Table(title=f"per layer, {order} ({min(max_layers, len(self.layers))} "
                                f"of {len(self.layers)})")
            columns = ["tensor", "op", "precision", "own SQNR dB", "accumulated SQNR dB"]
            if self.kernels_measured:
                columns += ["kernel SQNR dB", "kernel loss dB"]
            if self.sensitivity:
                columns += ["output SQNR dB, alone quantized", "output gain dB, full precision"]
            for col in columns:
                worst.add_column(col, justify="left" if col in ("tensor", "op") else "right")
            for layer in self.worst_layers()[:max_layers]:
                cells = [layer.name, layer.op, layer.precision, f"{layer.own_sqnr_db:.2f}",
                         f"{layer.accumulated_sqnr_db:.2f}"]
                if self.kernels_measured:
                    cells += _kernel_cells(layer)
                if self.sensitivity:
                    cells += [_db(layer.alone_sqnr_db), _db(layer.gain_db, "+.2f")]
                worst.add_row(*cells)
            console.print(worst)
            if self.kernels_measured:
                self._print_lossy_kernels(console, max_layers)
        if self.weights:
            self._print_weights(console, max_layers)
        if self.bit_exact is not None:
            console.print("simulator vs integer reference: " + (
                "[green]bit-exact[/]" if self.bit_exact else
                f"[red]DIFFERS[/] first at {self.first_difference}"))
            for segment in self.host_segments:
                console.print(f"ran on the host: {segment['name']} "
                              f"({', '.join(segment['nodes'])})", highlight=False)
        for note in self.notes:  # its brackets ([batch, classes]) are text, not markup
            console.print(f"note: {escape(note)}")

    def _print_lossy_kernels(self, console: Console, max_rows: int) -> None:
        lossy = self.lossy_kernels()
        if not lossy:
            console.print(f"no integer kernel loses {LOSSY_KERNEL_DB:.0f} dB or more beyond "
                          f"its output's rounding where it matters (within "
                          f"{KERNEL_RELEVANT_DB:.0f} dB of its tensor's accumulated SQNR)",
                          highlight=False)
            return
        table = Table(title=f"kernels losing {LOSSY_KERNEL_DB:.0f} dB or more beyond their "
                            f"output's rounding, within {KERNEL_RELEVANT_DB:.0f} dB of their "
                            f"tensor's accumulated SQNR, lowest kernel SQNR first "
                            f"({min(max_rows, len(lossy))} of {len(lossy)})")
        for col in ("tensor", "node", "op", "precision", "own SQNR dB", "kernel SQNR dB",
                    "kernel loss dB"):
            table.add_column(col, justify="left" if col in ("tensor", "node", "op") else "right")
        for layer in lossy[:max_rows]:
            table.add_row(layer.name, layer.node, layer.op, layer.precision,
                          f"{layer.own_sqnr_db:.2f}", *_kernel_cells(layer))
        console.print(table)

    def _print_weights(self, console: Console, max_rows: int) -> None:
        sensitivity = any(w.gain_db is not None for w in self.weights)
        order = "largest output gain first" if sensitivity else "worst first"
        table = Table(title=f"weights, {order} ({min(max_rows, len(self.weights))} of "
                            f"{len(self.weights)})")
        columns = ["weight", "node", "precision", "own SQNR dB"]
        if sensitivity:
            columns += ["output SQNR dB, alone quantized", "output gain dB, full precision"]
        for col in columns:
            table.add_column(col, justify="left" if col in ("weight", "node") else "right")
        for w in self.worst_weights()[:max_rows]:
            cells = [w.name, w.node, w.precision, f"{w.own_sqnr_db:.2f}"]
            if sensitivity:
                cells += [_db(w.alone_sqnr_db), _db(w.gain_db, "+.2f")]
            table.add_row(*cells)
        console.print(table)

    def html(self) -> str:
        layers = self.worst_layers()
        chart = bar_chart(
            [layer.name for layer in self.layers],
            {"own": [layer.own_sqnr_db for layer in self.layers],
             "accumulated": [layer.accumulated_sqnr_db for layer in self.layers]},
            unit="dB", title="SQNR per quantized tensor, in graph order") if self.layers else ""
        return render_page("accuracy.html.j2", report=self, doc=self.to_json(), layers=layers,
                           weights=self.worst_weights(), chart=chart,
                           lossy=self.lossy_kernels(), lossy_db=LOSSY_KERNEL_DB,
                           relevant_db=KERNEL_RELEVANT_DB)


def _kernel_cells(layer: LayerAccuracy) -> list[str]:
    """The kernel SQNR ("exact" at the cap: a kernel that moves codes) and loss, the loss in
    red when the kernel is flagged."""
    if layer.kernel_sqnr_db is None:
        return ["—", "—"]
    sqnr = "exact" if layer.kernel_sqnr_db >= SQNR_CAP_DB else f"{layer.kernel_sqnr_db:.2f}"
    loss = f"{layer.kernel_loss_db:.2f}"
    return [sqnr, f"[red]{loss}[/]" if layer.lossy_kernel else loss]


def _db(value: float | None, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"
