"""Error measures between a reference tensor and an approximation, accumulated over samples.

SQNR and cosine are computed from sums over every sample (not averages of per-sample values),
so one near-silent sample cannot dominate the figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass
class ErrorStats:
    """Running sums for SQNR, cosine similarity and maximum absolute error of one tensor."""

    signal: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    approx_power: float = 0.0
    max_abs: float = 0.0
    elements: int = 0

    def add(self, reference: np.ndarray, approx: np.ndarray) -> None:
        ref = np.asarray(reference, np.float64).reshape(-1)
        app = np.asarray(approx, np.float64).reshape(-1)
        if ref.shape != app.shape:
            raise ValueError(f"shapes differ: {np.shape(reference)} vs {np.shape(approx)}")
        diff = ref - app
        self.signal += float(ref @ ref)
        self.noise += float(diff @ diff)
        self.dot += float(ref @ app)
        self.approx_power += float(app @ app)
        self.max_abs = max(self.max_abs, float(np.max(np.abs(diff))) if diff.size else 0.0)
        self.elements += ref.size

    @property
    def sqnr_db(self) -> float:
        return sqnr_db(self.signal, self.noise)

    @property
    def cosine(self) -> float:
        norm = math.sqrt(self.signal * self.approx_power)
        return self.dot / norm if norm > 0 else (1.0 if self.noise == 0 else 0.0)


def is_classifier(shape: tuple[int, ...]) -> bool:
    """An output reads as class scores when it is [batch, classes] with more than one class."""
    return len(shape) == 2 and shape[1] > 1


@dataclass
class Top1:
    """Counts for top-1 agreement between two classifiers and accuracy against labels."""

    samples: int = 0
    agree: int = 0
    correct_reference: int = 0
    correct_approx: int = 0
    labelled: int = 0

    def add(self, reference: np.ndarray, approx: np.ndarray, labels: np.ndarray | None) -> None:
        ref_class = np.asarray(reference).argmax(axis=-1)
        app_class = np.asarray(approx).argmax(axis=-1)
        self.samples += ref_class.size
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

    @property
    def agreement(self) -> float:
        return self.agree / self.samples if self.samples else 0.0

    def accuracy(self, which: str) -> float | None:
        if not self.labelled:
            return None
        correct = self.correct_reference if which == "reference" else self.correct_approx
        return correct / self.labelled
