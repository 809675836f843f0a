"""The error measures that every accuracy figure rests on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ember.reports.metrics import SQNR_CAP_DB, ErrorStats, Top1, is_classifier


def test_sqnr_of_known_noise() -> None:
    stats = ErrorStats()
    ref = np.array([3.0, 4.0])          # signal power 25
    stats.add(ref, ref + np.array([0.5, 0.0]))  # noise power 0.25
    assert stats.sqnr_db == pytest.approx(20.0)
    assert stats.max_abs == 0.5


def test_sqnr_accumulates_powers_over_samples_not_per_sample_averages() -> None:
    stats = ErrorStats()
    stats.add(np.array([10.0]), np.array([9.0]))     # signal 100, noise 1
    stats.add(np.array([0.1]), np.array([0.0]))      # signal 0.01, noise 0.01
    assert stats.sqnr_db == pytest.approx(10 * math.log10(100.01 / 1.01))


def test_exact_copy_is_capped_and_cosine_is_one() -> None:
    stats = ErrorStats()
    x = np.linspace(-1, 1, 11)
    stats.add(x, x)
    assert stats.sqnr_db == SQNR_CAP_DB and stats.cosine == pytest.approx(1.0)


def test_cosine_of_opposite_vectors() -> None:
    stats = ErrorStats()
    stats.add(np.array([1.0, 2.0]), np.array([-1.0, -2.0]))
    assert stats.cosine == pytest.approx(-1.0)


def test_top1_agreement_and_accuracy() -> None:
    top1 = Top1()
    ref = np.array([[0.1, 0.9], [0.8, 0.2]])
    app = np.array([[0.2, 0.8], [0.4, 0.6]])
    top1.add(ref[:1], app[:1], np.array([1]))
    top1.add(ref[1:], app[1:], np.array([1]))
    assert top1.agreement == 0.5
    assert top1.accuracy("reference") == 0.5 and top1.accuracy("approx") == 1.0


def test_classifier_shapes() -> None:
    assert is_classifier((1, 10)) and not is_classifier((1, 1)) and not is_classifier((1, 3, 4))


@pytest.mark.parametrize("labels", [np.array([[0, 1]]), np.array([1.0]), np.array([1, 0])])
def test_top1_takes_only_one_class_index_per_sample(labels) -> None:
    with pytest.raises(ValueError, match="expected one class index each"):
        Top1().add(np.array([[0.1, 0.9]]), np.array([[0.2, 0.8]]), labels)
