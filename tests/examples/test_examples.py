"""The bundled examples: zoo models are valid, sane and deterministic; the committed digits files
are what the docs promise; `ember examples build` works end to end."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from ember.cli import cli
from examples import build, zoo
from tests.e2e.flow import model_samples
from examples.digits import train

DIGITS_DIR = build.EXAMPLES_DIR / "digits"
EXPECTED_OUTPUT_SHAPES = {
    **{name: {"logits": (1, 1000)} for name in ("resnet18", "mobilenetv2", "squeezenet",
                                               "mobilenetv3_small", "efficientnet_lite0")},
    "mlp": {"logits": (1, 10)},
    "lstm_classifier": {"logits": (1, 10)},
    "transformer_encoder": {"pooled": (1, 64)},
    "yolo": {"head16.box": (1, 4, 16, 16), "head16.cls": (1, 80, 16, 16),
             "head32.box": (1, 4, 8, 8), "head32.cls": (1, 80, 8, 8)},
    "unet": {"scores": (1, 2, 128, 128)},
}


# Mean pooling over tokens of independent random inputs averages normalized features away.
SMALLEST_PEAK = {"transformer_encoder": 0.2}


def _session(model: onnx.ModelProto, every_tensor: bool = False) -> ort.InferenceSession:
    """With every_tensor, each intermediate tensor becomes a graph output too."""
    if every_tensor:
        model = onnx.shape_inference.infer_shapes(model)
        model.graph.output.extend(model.graph.value_info)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _input_shape(model: onnx.ModelProto) -> list[int]:
    return [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_is_valid_deterministic_and_numerically_sane(name: str) -> None:
    model = zoo.MODELS[name]()
    assert model.SerializeToString() == zoo.MODELS[name]().SerializeToString()
    assert model.SerializeToString() != zoo.MODELS[name](seed=1).SerializeToString()
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17

    session = _session(model, every_tensor=True)
    feeds = ({"input": np.random.default_rng(0).standard_normal(_input_shape(model),
                                                                dtype=np.float32)}
             if model.graph.input[0].name == "input" else model_samples(model, 1)[0])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for output, shape in EXPECTED_OUTPUT_SHAPES[name].items():
        assert outputs[output].shape == shape, output
        assert np.isfinite(outputs[output]).all(), output
        assert SMALLEST_PEAK.get(name, 1) <= np.abs(outputs[output]).max() <= 100, output
    # Neither exploding nor vanishing: every tensor's RMS stays within a decade of 1.
    rms = {key: float(np.sqrt(np.mean(value.astype(np.float64) ** 2)))
           for key, value in outputs.items()}
    # Attention probabilities are 1/tokens on average by nature.
    assert all(0.1 < value < 10 for key, value in rms.items() if not key.endswith(".probs")), rms


def test_zoo_models_have_the_expected_operators() -> None:
    ops = {name: [n.op_type for n in fn().graph.node] for name, fn in zoo.MODELS.items()}
    assert ops["resnet18"].count("Conv") == 20  # stem + 16 in blocks + 3 downsamples
    assert ops["resnet18"].count("Add") == 8
    groups = [a.i for n in zoo.mobilenetv2().graph.node for a in n.attribute if a.name == "group"]
    assert sum(group > 1 for group in groups) == 17  # one depthwise conv per inverted residual
    assert ops["mobilenetv2"].count("Add") == 10 and "Clip" in ops["mobilenetv2"]
    assert ops["squeezenet"].count("Concat") == 8 and ops["squeezenet"].count("Conv") == 25
    assert ops["mlp"] == ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    # Written out as exporters do: 19 hard-swishes and 9 hard-sigmoids end in a Div, the 9
    # squeeze-and-excitation gates multiply the map; the detector's 41 SiLUs are x * Sigmoid(x).
    assert ops["mobilenetv3_small"].count("Div") == 28
    assert ops["mobilenetv3_small"].count("GlobalAveragePool") == 10
    assert ops["yolo"].count("Sigmoid") == 41 and "Resize" in ops["yolo"]
    assert ops["unet"].count("ConvTranspose") == 2 and ops["unet"].count("Concat") == 2
    # EfficientNet-Lite0: 49 convolutions (stem, 16 MBConv blocks, head), 9 residual Adds.
    assert ops["efficientnet_lite0"].count("Conv") == 49
    assert ops["efficientnet_lite0"].count("Add") == 9


def test_committed_digits_data_has_the_documented_layout() -> None:
    with np.load(DIGITS_DIR / "calib.npz") as calib, np.load(DIGITS_DIR / "eval.npz") as data:
        assert set(calib.files) == {"input"} and set(data.files) == {"input", "labels"}
        assert calib["input"].dtype == np.float32 and calib["input"].shape == (256, 1, 8, 8)
        images, labels = data["input"], data["labels"]
    assert images.dtype == np.float32 and images.shape[1:] == (1, 8, 8) and len(images) >= 400
    assert labels.dtype == np.int64 and labels.shape == (len(images),)
    assert images.min() >= 0 and images.max() <= 1 and set(labels) == set(range(10))


def test_committed_digits_data_matches_the_seeded_split() -> None:
    """Calibration images come from training, evaluation images never do."""
    splits = train.load_splits()
    with np.load(DIGITS_DIR / "calib.npz") as calib, np.load(DIGITS_DIR / "eval.npz") as data:
        np.testing.assert_array_equal(calib["input"], splits.calib_x)
        np.testing.assert_array_equal(data["input"], splits.eval_x)
        np.testing.assert_array_equal(data["labels"], splits.eval_y)
    assert len(splits.train_x) + len(splits.eval_x) == 1797


def test_committed_digits_model_reaches_97_percent_in_onnxruntime() -> None:
    model = onnx.load(DIGITS_DIR / "model.onnx")
    onnx.checker.check_model(model, full_check=True)
    assert _input_shape(model) == [1, 1, 8, 8] and model.graph.output[0].name == "logits"
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") >= 2 and ops.count("BatchNormalization") >= 2
    assert {"Relu", "MaxPool", "Flatten", "Gemm"} <= set(ops)
    with np.load(DIGITS_DIR / "eval.npz") as data:
        images, labels = data["input"], data["labels"]
    session = _session(model)
    predictions = [session.run(None, {"input": image[None]})[0].argmax() for image in images]
    assert np.mean(np.array(predictions) == labels) >= 0.97


def test_digits_training_is_deterministic() -> None:
    """A reduced run (one epoch on 128 images) keeps this fast; the code path is the full one."""
    first = train.build(epochs=1, train_limit=128)
    second = train.build(epochs=1, train_limit=128)
    assert first.files == second.files
    assert first.accuracy_numpy == first.accuracy_onnxruntime
    assert train.build(seed=1, epochs=1, train_limit=128).files["model.onnx"] != \
        first.files["model.onnx"]


def test_npz_bytes_round_trips() -> None:
    arrays = {"input": np.arange(6, dtype=np.float32).reshape(2, 3), "labels": np.arange(2)}
    data = train.npz_bytes(arrays)
    assert data == train.npz_bytes(arrays)
    with np.load(io.BytesIO(data)) as loaded:
        for key, value in arrays.items():
            np.testing.assert_array_equal(loaded[key], value)
            assert loaded[key].dtype == value.dtype


def test_cli_builds_mlp_into_out_dir(tmp_path) -> None:
    wide = CliRunner(env={"COLUMNS": "200"})  # rich reads COLUMNS; keeps the path on one line
    result = wide.invoke(cli, ["examples", "build", "--only", "mlp", "--out", str(tmp_path)],
                         catch_exceptions=False)
    assert result.exit_code == 0, result.output
    written = tmp_path / "models" / "mlp.onnx"
    assert written.read_bytes() == zoo.mlp().SerializeToString()
    assert "mlp.onnx" in result.stdout and "0.54 M params" in result.stdout
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["mlp.onnx", "models"]


def test_cli_rejects_an_unknown_example(tmp_path) -> None:
    args = ["examples", "build", "--only", "vgg16", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "vgg16" in result.output


def test_write_atomic_leaves_nothing_behind_on_failure(tmp_path, monkeypatch) -> None:
    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(build.os, "replace", failing_replace)
    with pytest.raises(OSError):
        build.write_atomic(tmp_path / "model.onnx", b"data")
    assert list(tmp_path.iterdir()) == []
