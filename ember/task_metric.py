"""A task metric of the user's own (`--metric FILE.py:FUNCTION`): what a detector, a
segmenter or anything that is not a classifier is judged by, against labels, so that
`ember accuracy` reports it and `ember compile --max-drop` holds it.

The function is called once per run of the model, on fp32 onnxruntime's outputs and again on
the int8 model's, with the labels of that run's samples:

    def f1(outputs: dict[str, np.ndarray], labels: np.ndarray) -> tuple[float, float]:
        ...
        return 2 * true_positives, found + truths

and returns a pair (score, weight). The metric is the sum of the scores over the sum of the
weights, over every sample: (correct, count) is accuracy, (2·TP, found + truths) the F1 of
matched boxes, (intersection, union) an IoU. Sums of pairs, not a mean of per-sample values,
so that shards of the samples (--cluster) add up to what one process gives: the pairs are
summed with `math.fsum`, exactly, in any order. The metric is a fraction, as top-1 accuracy
is: --max-drop counts its points (hundredths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ember.errors import EmberError
from profiler.sources.python_hook import resolve

Metric = Callable[[Mapping[str, np.ndarray], np.ndarray], tuple[float, float]]


@dataclass(frozen=True)
class MetricSpec:
    """Where the metric is: a Python file (or module) and a function in it, named rather than
    held, so that the workers of --cluster load it again where they run."""

    path: str
    function: str

    @classmethod
    def parse(cls, text: str) -> MetricSpec:
        path, colon, function = text.rpartition(":")
        if not colon or not path or not function.isidentifier():
            raise EmberError(f"--metric {text}: expected FILE.py:FUNCTION (or MODULE:FUNCTION), "
                             f"the function that scores a run's outputs against its labels")
        return cls(path, function)

    def __str__(self) -> str:
        return f"{self.path}:{self.function}"

    def load(self) -> Metric:
        """The function (`profiler.sources.python_hook.resolve`, as a data hook's): a
        one-line error for a missing file, a failed import or a missing function."""
        return resolve(str(self), f"--metric {self}", EmberError)


@dataclass
class MetricSums:
    """One side's (fp32's or int8's) pairs, run by run: summed at the end, exactly."""

    scores: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    def add(self, metric: Metric, spec: MetricSpec, outputs: Mapping[str, np.ndarray],
            labels: np.ndarray, first: int, side: str) -> None:
        """Score one run (samples `first`, ...); the function's errors and wrong returns are
        one-line errors naming it and the samples."""
        count = len(labels)
        where = f"sample {first}" if count == 1 else f"samples {first}-{first + count - 1}"
        try:
            result = metric(dict(outputs), labels)
        except Exception as err:
            raise EmberError(f"--metric {spec} failed on {side}'s outputs of {where}: "
                             f"{type(err).__name__}: {err}") from err
        try:
            score, weight = (float(value) for value in result)
        except (TypeError, ValueError):
            raise EmberError(f"--metric {spec} returned {result!r} for {where}; expected a "
                             f"pair (score, weight) of numbers") from None
        if not (math.isfinite(score) and math.isfinite(weight) and weight >= 0):
            raise EmberError(f"--metric {spec} returned ({score!r}, {weight!r}) for {where}; "
                             f"expected a finite score and a finite weight >= 0")
        self.scores.append(score)
        self.weights.append(weight)

    def merge(self, other: MetricSums) -> None:
        self.scores.extend(other.scores)
        self.weights.extend(other.weights)

    @property
    def value(self) -> float | None:
        """Σ score / Σ weight; None when nothing was weighed (no sample counted)."""
        weight = math.fsum(self.weights)
        return math.fsum(self.scores) / weight if weight > 0 else None
