"""`ember accuracy --cluster`: shards of the samples, merged into one process's report exactly."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from ember import shards
from ember.accuracy import _Tallies
from ember.reports.metrics import ErrorStats, ExactSum, Top1
from profiler import batching
from profiler.model_inputs import InputSpec
from profiler.sources import open_data
from profiler.sources.images import ImageOptions
from tests.cli import DIGITS, assert_one_line_error, invoke


def _report(*args) -> dict:
    result = invoke("accuracy", DIGITS / "model.onnx", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _fields(stats: ErrorStats) -> tuple:
    return (stats.signal, stats.noise, stats.dot, stats.approx_power, stats.max_abs,
            stats.elements, stats.sqnr_db, stats.cosine)


def test_error_stats_merged_in_any_grouping_equal_the_sequential_sum_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    pairs = [(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6), rng.standard_normal(n))
             for n in rng.integers(1, 400, 30)]
    sequential = ErrorStats()
    for ref, app in pairs:
        sequential.add(ref, app)
    for seed in range(5):
        order = random.Random(seed).sample(range(len(pairs)), len(pairs))
        cuts = sorted(random.Random(seed + 100).sample(range(1, len(pairs)), 4))
        groups = [order[a:b] for a, b in itertools.pairwise([0, *cuts, len(pairs)])]
        merged = ErrorStats()
        for group in reversed(groups):
            part = ErrorStats()
            for i in group:
                part.add(*pairs[i])
            merged.merge(part)
        assert _fields(merged) == _fields(sequential)


def test_an_exact_sum_is_the_correctly_rounded_sum_and_keeps_infinities() -> None:
    values = [1e300, -1e300, 1e-310, 3.0, 2.0**-1074, 1.0 / 3.0] * 7
    total = ExactSum()
    for v in values:
        total.add(v)
    assert total.value == math.fsum(values)
    for special, expected in (([math.inf, 1.0], math.inf), ([math.inf, -math.inf], math.nan),
                              ([math.nan], math.nan), ([1e308, 1e308], math.inf)):
        total = ExactSum()
        for v in special:
            total.add(v)
        assert total.value == expected or (math.isnan(expected) and math.isnan(total.value))


def test_merged_tallies_keep_the_first_difference_by_global_sample() -> None:
    early, late = ({"sample": s, "output": "y", "element": [0], "simulator": 1, "reference": 2}
                   for s in (12, 40))
    for order in ((early, late), (late, early)):
        merged = _Tallies()
        for difference in order:
            merged.merge(_Tallies(samples=3, first_difference=difference,
                                  top1={"y": Top1(positions=3, agree=2)}))
        assert merged.first_difference == early and merged.samples == 6
        assert merged.top1["y"].agree == 4


def test_shard_ranges_read_back_every_sample_of_an_array_folder_once(tmp_path) -> None:
    """Sample ranges over a folder of array files of uneven sizes (and one without a batch
    axis) give the samples in order, each once, whatever the cut."""
    with np.load(DIGITS / "eval.npz") as data:
        x = data["input"][:41]
    sizes = [5, 1, 12, 9, 14]
    for n, (a, b) in enumerate(itertools.pairwise(np.cumsum([0, *sizes]))):
        np.save(tmp_path / f"part{n}.npy", x[a:b] if b - a > 1 else x[a])
    specs = [InputSpec("input", np.dtype(np.float32), (None, *x.shape[1:]))]
    source = open_data(str(tmp_path), specs, ImageOptions())
    for workers in (1, 2, 3):
        planned = shards.plan(source.count(), None, 1, workers)
        assert planned[-1].stop is None  # the last shard reads to the end
        read = [np.concatenate([batch["input"] for batch in batching.stream(
                    source, specs, 4, False, None, False, batching.Tally(), r.start, r.stop)])
                for r in planned]
        assert all(len(part) == r.length for part, r in zip(read, planned[:-1]))
        np.testing.assert_array_equal(np.concatenate(read), x)


@pytest.fixture(scope="module")
def digits_program(digits_profile, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("shards") / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "-o", path)
    assert result.exit_code == 0, result.output
    return path


def test_two_processes_give_the_report_of_one(digits_profile, digits_program) -> None:
    """With the program (bit_exact), --per-layer and labels: the same JSON, bit for bit."""
    args = (digits_program, "--profile", digits_profile, "--data", DIGITS / "eval.npz",
            "--samples", "97", "--per-layer")
    one = _report(*args, "--cluster", "local")
    assert one["bit_exact"] is True and one["layers"] and one["top1_accuracy_int8"] > 0.9
    assert _report(*args, "--cluster", "local:2") == one


def test_sensitivities_of_sharded_runs_equal_one_process(digits_profile, tmp_path) -> None:
    args = ("--profile", digits_profile, "--data", DIGITS / "eval.npz", "--samples", "12",
            "--per-layer", "--sensitivity")
    one = _report(*args)
    assert any(layer["gain_db"] is not None for layer in one["layers"])
    assert _report(*args, "--cluster", "local:2") == one


def test_a_hook_without_a_count_is_sharded_until_it_runs_out(digits_profile, tmp_path) -> None:
    """A hook cannot count its samples: shards are drawn until one comes back short."""
    with np.load(DIGITS / "eval.npz") as data:
        np.save(tmp_path / "x.npy", data["input"][:150])
    hook = tmp_path / "samples.py"
    hook.write_text("import numpy as np\n"
                    f"def samples():\n    return ({{'input': x}} for x in "
                    f"np.load({str(tmp_path / 'x.npy')!r}))\n")
    args = ("--profile", digits_profile, "--data", f"{hook}:samples")
    one = _report(*args)
    assert one["samples"] == 150
    assert _report(*args, "--cluster", "local:2") == one


def test_a_bad_sample_in_a_later_shard_is_named_by_its_global_index(digits_profile,
                                                                    tmp_path) -> None:
    """Samples 57 and 71 are bad, in two later shards of eight: the run stops on the first,
    as one process does, whichever shard fails first."""
    with np.load(DIGITS / "eval.npz") as data:
        x = data["input"][:80].copy()
    x[57, 0, 3, 3] = x[71, 0, 5, 5] = np.nan
    np.savez(tmp_path / "bad.npz", input=x)
    for where in ("local", "local:2"):
        result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile,
                        "--data", tmp_path / "bad.npz", "--cluster", where)
        assert_one_line_error(result, "bad.npz: input 'input' has NaN or Inf in sample 57")


def test_too_few_labels_stop_a_sharded_run_as_they_stop_one(digits_profile, tmp_path) -> None:
    with np.load(DIGITS / "eval.npz") as data:
        np.savez(tmp_path / "forty.npz", input=data["input"][:40])
        np.save(tmp_path / "labels.npy", data["labels"][:30])
    for where in ("local", "local:2"):
        result = invoke("accuracy", DIGITS / "model.onnx", "--profile", digits_profile,
                        "--data", tmp_path / "forty.npz", "--labels", tmp_path / "labels.npy",
                        "--cluster", where)
        assert_one_line_error(result, "labels.npy: 30 labels for more samples")


def test_a_dask_cluster_gives_the_report_of_one_process(digits_profile, digits_program,
                                                        dask_scheduler) -> None:
    args = (digits_program, "--profile", digits_profile, "--data", DIGITS / "eval.npz",
            "--samples", "60", "--per-layer")
    assert _report(*args, "--cluster", dask_scheduler) == _report(*args)
