"""Calibration data in every supported form, and every kind of bad data, each with a test."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from profiler.errors import ProfileError
from profiler.model_inputs import input_specs, parse_input_shape
from profiler.run import RunOptions, profile
from profiler.sources import open_data
from profiler.sources.images import ImageOptions

from .conftest import conv_model, samples


def run(data, model=None, images=ImageOptions(), **options):
    model = model or conv_model()
    specs = input_specs(model, options.pop("input_shapes", {}))
    return profile(model, open_data(str(data), specs, images), specs, RunOptions(**options))


def input_stats(p):
    x = p.tensors["x"]
    return x.min, x.max, x.count


def test_npz_with_labels_streams_in_batches_and_respects_samples(tmp_path):
    data = samples(150)
    np.savez(tmp_path / "c.npz", x=data, labels=np.arange(150))
    p = run(tmp_path / "c.npz", samples=100)
    assert p.samples == 100
    assert input_stats(p) == (data[:100].min(), data[:100].max(), 100 * 32)
    assert run(tmp_path / "c.npz").samples == 150


def test_stacked_batch_of_one_arrays_are_accepted(tmp_path):
    np.savez(tmp_path / "c.npz", x=samples(6)[:, np.newaxis])
    assert run(tmp_path / "c.npz").samples == 6


def test_folder_of_npy_and_npz_files(tmp_path):
    data = samples(5)
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", data[i])  # one sample without its batch axis
    np.savez(tmp_path / "rest.npz", x=data[3:])
    p = run(tmp_path)
    assert p.samples == 5 and input_stats(p) == (data.min(), data.max(), 5 * 32)


def test_hook_file_iterable_and_get_next_reader(tmp_path):
    (tmp_path / "reader.py").write_text(
        "import numpy as np\n"
        "def batches():\n"
        "    for i in range(4):\n"
        "        yield {'x': np.full((1, 2, 4, 4), i, np.float32)}\n"
        "class Reader:\n"
        "    def __init__(self):\n"
        "        self.left = iter(batches())\n"
        "    def get_next(self):\n"
        "        return next(self.left, None)\n")
    for function in ("batches", "Reader"):
        p = run(f"{tmp_path}/reader.py:{function}")
        assert p.samples == 4 and input_stats(p) == (0.0, 3.0, 4 * 32)


def test_hook_module_function(tmp_path, monkeypatch):
    (tmp_path / "calib_mod.py").write_text(
        "import numpy as np\n"
        "def data():\n"
        "    return [{'x': np.ones((2, 2, 4, 4), np.float32)}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run("calib_mod:data").samples == 2


def write_image(path, size=(6, 5), color=(255, 0, 0)):
    Image.new("RGB", size, color).save(path)


def image_model():
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "img",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_image_folder_with_preprocessing(tmp_path):
    (tmp_path / "cls").mkdir()
    write_image(tmp_path / "cls" / "a.png")
    write_image(tmp_path / "b.jpg", color=(255, 0, 0))
    options = ImageOptions(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), channel_order="BGR")
    p = run(tmp_path, model=image_model(), images=options)
    x = p.tensors["x"]
    assert p.samples == 2 and x.count == 2 * 3 * 16
    assert x.min == pytest.approx(-1.0, abs=0.02) and x.max == pytest.approx(1.0, abs=0.02)
    assert p.runs[0]["data"]["layout"] == "NCHW" and p.runs[0]["data"]["resize"] == [4, 4]


def test_unreadable_image(tmp_path):
    write_image(tmp_path / "good.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ProfileError, match=r"broken\.png: unreadable image"):
        run(tmp_path, model=image_model())


def test_random_data_is_marked_synthetic():
    from profiler.sources.arrays import RandomData
    model = conv_model()
    specs = input_specs(model, {})
    p = profile(model, RandomData(9, specs, seed=3), specs, RunOptions())
    assert p.samples == 9 and p.runs[0]["data"]["synthetic"] is True


@pytest.mark.parametrize("arrays, message", [
    ({"image": samples(2)}, r"'image' is not an input of the model \(inputs: x\)"),
    ({"labels": np.arange(2)}, r"no data for input 'x'"),
    ({"x": samples(2).astype(np.float64)}, r"input 'x' expects float32, found float64"),
    ({"x": np.zeros((3, 4, 4), np.float32)},
     r"input 'x' expects shape \[1,2,4,4\] \(samples on the first axis\), found \[3, 4, 4\]"),
    ({"x": np.zeros((2, 2, 4, 5), np.float32)}, r"expects shape \[1,2,4,4\].*found \[2, 2, 4, 5\]"),
    ({"x": np.zeros((2,), np.float32)}, r"found \[2\]"),
])
def test_data_that_does_not_fit_the_model(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ProfileError, match=message):
        run(tmp_path / "bad.npz")


def test_nonfinite_data_is_an_error_naming_input_and_sample_unless_allowed(tmp_path):
    data = samples(10)
    data[6, 1, 2, 3] = np.nan
    data[8, 0, 0, 0] = np.inf
    np.savez(tmp_path / "nan.npz", x=data)
    with pytest.raises(ProfileError, match=r"input 'x' has NaN or Inf in sample 6 "
                                           r"\(pass --allow-nonfinite"):
        run(tmp_path / "nan.npz")
    p = run(tmp_path / "nan.npz", allow_nonfinite=True)
    assert p.samples == 8 and p.runs[0]["skipped_nonfinite"] == 2
    assert p.tensors["x"].count == 8 * 32


def test_no_samples(tmp_path):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 2, 4, 4), np.float32))
    with pytest.raises(ProfileError, match="no samples"):
        run(tmp_path / "empty.npz")
    (tmp_path / "none.py").write_text("def nothing():\n    return []\n")
    with pytest.raises(ProfileError, match="no samples"):
        run(f"{tmp_path}/none.py:nothing")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ProfileError, match="no .npy, .npz, .png or .jpg files"):
        run(tmp_path / "folder")


def test_hook_that_raises_or_yields_the_wrong_type(tmp_path):
    (tmp_path / "bad.py").write_text(
        "import numpy as np\n"
        "def boom():\n"
        "    yield {'x': np.zeros((1, 2, 4, 4), np.float32)}\n"
        "    raise RuntimeError('disk on fire')\n"
        "def wrong():\n"
        "    yield [1, 2, 3]\n"
        "def scalar():\n"
        "    return 42\n")
    with pytest.raises(ProfileError, match=r"bad\.py:boom raised RuntimeError: disk on fire"):
        run(f"{tmp_path}/bad.py:boom")
    with pytest.raises(ProfileError, match=r"bad\.py:wrong yielded list as item 0; expected a "
                                           r"dict"):
        run(f"{tmp_path}/bad.py:wrong")
    with pytest.raises(ProfileError, match=r"returned int; expected an iterable of dicts"):
        run(f"{tmp_path}/bad.py:scalar")
    with pytest.raises(ProfileError, match=r"has no function 'missing'"):
        run(f"{tmp_path}/bad.py:missing")


def test_dynamic_batch_runs_several_samples_at_once_and_input_shape_fixes_it(tmp_path):
    data = samples(13)
    np.savez(tmp_path / "c.npz", x=data)
    dynamic = conv_model(batch="N")
    by_batch = [run(tmp_path / "c.npz", model=dynamic, batch=b) for b in (1, 5)]
    assert by_batch[1].runs[0]["options"]["batch"] == 5
    assert ({n: t.to_json() for n, t in by_batch[0].tensors.items()}
            == {n: t.to_json() for n, t in by_batch[1].tensors.items()})
    fixed = run(tmp_path / "c.npz", model=dynamic, input_shapes={"x": (4, 2, 4, 4)})
    assert fixed.samples == 12 and fixed.runs[0]["dropped"] == 1
    with pytest.raises(ProfileError, match="does not fit the model's shape"):
        run(tmp_path / "c.npz", model=dynamic, input_shapes={"x": (4, 2, 4, 5)})
    with pytest.raises(ProfileError, match="expected NAME=D0,D1"):
        parse_input_shape("x=1,a")


def batch_one_model(reshape_to_one: bool):
    """x[1,2,4,4] -> Relu -> Reshape (to [1,32] or [-1,32]); plus a float Constant output."""
    from onnx import TensorProto, helper, numpy_helper
    shape = numpy_helper.from_array(np.array([1 if reshape_to_one else -1, 32]), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"]),
             helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                 np.array([0.5, -2.0, 3.0], np.float32)))]
    graph = helper.make_graph(
        nodes, "b1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [3])], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("reshape_to_one", [False, True])
def test_batch_one_models_run_batched_only_when_values_agree(tmp_path, reshape_to_one):
    np.savez(tmp_path / "c.npz", x=samples(21))
    model = batch_one_model(reshape_to_one)
    one = run(tmp_path / "c.npz", model=model, batch=1)
    many = run(tmp_path / "c.npz", model=model, batch=8)
    assert many.runs[0]["per_sample_runs"] is reshape_to_one
    assert ({n: t.to_json() for n, t in one.tensors.items()}
            == {n: t.to_json() for n, t in many.tensors.items()})
    assert many.tensors["c"].count == 21 * 3  # the same for every sample: counted per sample


def lying_npy(shape, dtype="<f4", data=1024) -> bytes:
    """An .npy whose header declares `shape` over only `data` bytes."""
    import io
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + bytes(data)


@pytest.mark.parametrize("compression", ["stored", "deflated"])
def test_an_npz_member_declaring_more_than_the_file_holds_is_refused(tmp_path, compression):
    import zipfile
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED if compression == "stored"
                         else zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", lying_npy((10**12,)))  # not by rows: once read whole
    with pytest.raises(ProfileError, match=r"lie.npz: array 'x' declares shape \[1000000000000\] "
                                           r"of float32 \(4,000,000,000,000 bytes\), but the "
                                           r"file holds [\d,]+ bytes of data"):
        run(path)


def test_an_npy_declaring_more_than_the_file_holds_is_refused(tmp_path):
    from profiler.sources.arrays import declared_arrays
    (tmp_path / "lie.npy").write_bytes(lying_npy((10**12, 2, 4, 4)))
    with pytest.raises(ProfileError, match="lie.npy: its header declares shape "
                                           r"\[1000000000000, 2, 4, 4\]"):
        declared_arrays(tmp_path / "lie.npy")
    np.save(tmp_path / "true.npy", samples(3))
    assert declared_arrays(tmp_path / "true.npy") == {"": ((3, 2, 4, 4), np.dtype("float32"))}
