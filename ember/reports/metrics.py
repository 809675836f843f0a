"""Error measures between a reference tensor and an approximation, accumulated over samples.

SQNR and cosine are computed from sums over every sample (not averages of per-sample values),
so one near-silent sample cannot dominate the figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# A tensor reproduced exactly has infinite SQNR; JSON has no infinity, so reports cap it here.
SQNR_CAP_DB = 200.0


def sqnr_db(signal_power: float, noise_power: float) -> float:
    """10·log10(Σ ref² / Σ (ref − approx)²), capped at SQNR_CAP_DB (exact or silent tensors)."""
    if noise_power <= 0:
        return SQNR_CAP_DB
    if signal_power <= 0:
        return -SQNR_CAP_DB
    return min(SQNR_CAP_DB, 10.0 * math.log10(signal_power / noise_power))


# Exact sums count in units of the least float64 subnormal, 2^-1074: every finite float64 is a
# whole number of them.
_UNIT_BITS = 1074


@dataclass
class ExactSum:
    """A sum of float64 values kept exactly (a Python integer in units of 2^-1074) and rounded
    once when read, so that any grouping or order of the same values gives the same float:
    shards of an evaluation merge into what one process gives, bit for bit. Non-finite values
    are kept aside and read as IEEE addition would give them (NaN, or an infinity)."""

    units: int = 0
    nonfinite: frozenset[str] = frozenset()  # of "inf", "-inf", "nan"

    def add(self, value: float) -> None:
        if math.isfinite(value):
            numerator, denominator = value.as_integer_ratio()
            self.units += numerator << (_UNIT_BITS - denominator.bit_length() + 1)
        else:
            self.nonfinite |= {repr(value)}

    def merge(self, other: ExactSum) -> None:
        self.units += other.units
        self.nonfinite |= other.nonfinite

    @property
    def value(self) -> float:
        if "nan" in self.nonfinite or {"inf", "-inf"} <= self.nonfinite:
            return math.nan
        if self.nonfinite:
            return math.inf if "inf" in self.nonfinite else -math.inf
        try:
            return self.units / (1 << _UNIT_BITS)  # int / int rounds correctly, once
        except OverflowError:  # beyond the largest float64, as a float sum would overflow
            return math.inf if self.units > 0 else -math.inf


@dataclass
class ErrorStats:
    """Running sums for SQNR, cosine similarity and maximum absolute error of one tensor.

    Each `add` computes its four sums with numpy's own (pairwise) summation, never BLAS,
    whose result depends on its thread count; the sums over calls are exact (`ExactSum`), so
    the figures depend only on which tensors were added, not on their order or grouping."""

    signal_sum: ExactSum = field(default_factory=ExactSum)
    noise_sum: ExactSum = field(default_factory=ExactSum)
    dot_sum: ExactSum = field(default_factory=ExactSum)
    approx_power_sum: ExactSum = field(default_factory=ExactSum)
    max_abs: float = 0.0
    elements: int = 0

    def add(self, reference: np.ndarray, approx: np.ndarray) -> None:
        ref = np.asarray(reference, np.float64).reshape(-1)
        app = np.asarray(approx, np.float64).reshape(-1)
        if ref.shape != app.shape:
            raise ValueError(f"shapes differ: {np.shape(reference)} vs {np.shape(approx)}")
        diff = ref - app
        self.signal_sum.add(float(np.sum(ref * ref)))
        self.noise_sum.add(float(np.sum(diff * diff)))
        self.dot_sum.add(float(np.sum(ref * app)))
        self.approx_power_sum.add(float(np.sum(app * app)))
        self.max_abs = max(self.max_abs, float(np.max(np.abs(diff))) if diff.size else 0.0)
        self.elements += ref.size

    def merge(self, other: ErrorStats) -> None:
        """Add another's sums (another shard of the same tensor): exact, in any order."""
        for mine, theirs in ((self.signal_sum, other.signal_sum),
                             (self.noise_sum, other.noise_sum), (self.dot_sum, other.dot_sum),
                             (self.approx_power_sum, other.approx_power_sum)):
            mine.merge(theirs)
        self.max_abs = max(self.max_abs, other.max_abs)
        self.elements += other.elements

    @property
    def signal(self) -> float:
        return self.signal_sum.value

    @property
    def noise(self) -> float:
        return self.noise_sum.value

    @property
    def dot(self) -> float:
        return self.dot_sum.value

    @property
    def approx_power(self) -> float:
        return self.approx_power_sum.value

    @property
    def sqnr_db(self) -> float:
        return sqnr_db(self.signal, self.noise)

    @property
    def cosine(self) -> float:
        signal, noise = self.signal, self.noise
        norm = math.sqrt(signal * self.approx_power)
        return self.dot / norm if norm > 0 else (1.0 if noise == 0 else 0.0)


def is_classifier(shape: tuple[int, ...]) -> bool:
    """An output reads as class scores when it is [batch, classes] with more than one class."""
    return len(shape) == 2 and shape[1] > 1


def ctc_decode(steps: np.ndarray, blank: int) -> list[int]:
    """CTC's greedy decoding of one sequence's argmax classes: repeats merged, blanks
    dropped (a blank between two equal classes keeps both)."""
    steps = np.asarray(steps).reshape(-1)
    kept = np.ones(steps.shape, bool)
    kept[1:] = steps[1:] != steps[:-1]
    return steps[kept & (steps != blank)].tolist()


@dataclass
class Top1:
    """Counts for top-1 agreement between two classifiers and accuracy against labels.

    The class scores lie along `axis` (numpy's: negative counts from the last); a position is
    one index of every other axis, and each position's argmax is compared. For [batch,
    classes] scores the positions are the samples; for a sequence ([batch, steps, vocab], a
    CTC head's [steps, batch, classes]) or a segmentation map ([batch, classes, H, W]) they are
    the steps or pixels of every sample."""

    axis: int = -1
    positions: int = 0
    agree: int = 0
    correct_reference: int = 0
    correct_approx: int = 0
    labelled: int = 0
    # A CTC head's scores ([batch, steps, classes] or [steps, batch, classes]): with labels,
    # each sample's greedy decoding (`ctc_decode`) is compared whole with its label row.
    blank: int | None = None
    batch_axis: int = 0  # of the argmaxes (the scores without their class axis)
    # Yes/no scores: each position's class is whether its score is above the threshold (no
    # class axis); labels are 0 or 1 per position.
    threshold: float | None = None

    def add(self, reference: np.ndarray, approx: np.ndarray, labels: np.ndarray | None) -> None:
        if labels is not None and self.blank is not None:
            self._add_sequences(reference, approx, labels)
            labels = None
        if self.threshold is not None:
            ref_class, app_class = ((np.asarray(scores) > self.threshold).reshape(-1)
                                    .astype(np.int64) for scores in (reference, approx))
            if labels is not None:
                labels = np.asarray(labels).reshape(-1)
        else:
            ref_class = np.asarray(reference).argmax(axis=self.axis).reshape(-1)
            app_class = np.asarray(approx).argmax(axis=self.axis).reshape(-1)
        self.positions += ref_class.size
        self.agree += int(np.sum(ref_class == app_class))
        if labels is not None:
            # One class index per sample, as ember.accuracy.class_labels makes them: reshaping
            # anything else (one-hot rows) would count against the wrong samples.
            labels = np.asarray(labels)
            if labels.shape != ref_class.shape or labels.dtype.kind not in "iu":
                raise ValueError(f"labels of shape {labels.shape} and type {labels.dtype} for "
                                 f"{ref_class.size} samples: expected one class index each")
            self.labelled += labels.size
            self.correct_reference += int(np.sum(ref_class == labels))
            self.correct_approx += int(np.sum(app_class == labels))

    def _add_sequences(self, reference: np.ndarray, approx: np.ndarray,
                       labels: np.ndarray) -> None:
        """One label row per sample (class indices, padded with -1), each decoded sequence
        right when it equals its row exactly."""
        decoded = [np.moveaxis(np.asarray(scores).argmax(axis=self.axis), self.batch_axis, 0)
                   for scores in (reference, approx)]
        labels = np.asarray(labels)
        if labels.ndim != 2 or labels.shape[0] != len(decoded[0]):
            raise ValueError(f"labels of shape {labels.shape} for {len(decoded[0])} sequences: "
                             f"expected one row each")
        for row, ref_steps, app_steps in zip(labels, *decoded):
            truth = row[row >= 0].tolist()
            self.labelled += 1
            self.correct_reference += ctc_decode(ref_steps, self.blank) == truth
            self.correct_approx += ctc_decode(app_steps, self.blank) == truth

    @property
    def agreement(self) -> float:
        return self.agree / self.positions if self.positions else 0.0

    def merge(self, other: Top1) -> None:
        """Add another's counts (another shard of the same output, argmax on the same axis)."""
        if other.axis != self.axis:
            raise ValueError(f"top-1 counts over axis {other.axis} merged into axis {self.axis}")
        self.positions += other.positions
        self.agree += other.agree
        self.correct_reference += other.correct_reference
        self.correct_approx += other.correct_approx
        self.labelled += other.labelled

    def accuracy(self, which: str) -> float | None:
        if not self.labelled:
            return None
        correct = self.correct_reference if which == "reference" else self.correct_approx
        return correct / self.labelled
