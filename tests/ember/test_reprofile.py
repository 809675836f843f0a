"""A profile's run made again on the equalized model (`ember.reprofile`, the accuracy budget's
trial of `--equalize all`): from each kind of data a profile records (arrays, a folder of images
with its preprocessing, a hook), the profile equals the one `ember quantize-profile --equalize
all` makes; what cannot be made again says why."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from PIL import Image

from ember.reprofile import NotAgain, profile_again
from profiler import format as profile_format
from profiler.run import load_model
from quantizer.equalize import equalize
from tests.cli import invoke
from tests.ember.test_budget import one_bad_tensor


def _data(folder, kind: str) -> tuple[str, tuple[str, ...]]:
    """Eight samples for one_bad_tensor's x [1, 3, 8, 8] as `kind`: the --data text and the
    options that read it."""
    rng = np.random.default_rng(3)
    if kind == "npz":
        np.savez(folder / "calib.npz", x=rng.standard_normal((8, 3, 8, 8)).astype(np.float32))
        return str(folder / "calib.npz"), ()
    if kind == "images":
        (folder / "images").mkdir()
        for i in range(8):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / "images" / f"{i}.png")
        return str(folder / "images"), ("--mean", "0.5,0.4,0.3", "--std", "0.2,0.25,0.3",
                                        "--channel-order", "BGR")
    (folder / "reader.py").write_text(
        "import numpy as np\n"
        "def samples():\n"
        "    rng = np.random.default_rng(4)\n"
        "    for i in range(8):\n"
        "        yield {'x': rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}\n")
    return f"{folder}/reader.py:samples", ()


@pytest.mark.parametrize("kind", ["npz", "images", "hook"])
def test_the_equalized_model_is_profiled_as_quantize_profile_would(tmp_path, kind) -> None:
    onnx.save(one_bad_tensor(), str(tmp_path / "m.onnx"))
    data, options = _data(tmp_path, kind)
    for mode, out in (("off", "p.json"), ("all", "by_hand.json")):
        made = invoke("quantize-profile", tmp_path / "m.onnx", "--data", data, *options,
                      "--equalize", mode, "-o", tmp_path / out)
        assert made.exit_code == 0, made.output
    again = profile_again(equalize(load_model(str(tmp_path / "m.onnx")), "all"),
                          profile_format.load(tmp_path / "p.json"), str(tmp_path / "m.onnx"))
    profile_format.save(again, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "by_hand.json").read_bytes()


def test_what_cannot_be_made_again_says_why(tmp_path) -> None:
    onnx.save(one_bad_tensor(), str(tmp_path / "m.onnx"))
    model = equalize(load_model(str(tmp_path / "m.onnx")), "all")
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--random", 4, "-o",
                  tmp_path / "random.json").exit_code == 0
    with pytest.raises(NotAgain, match="synthetic --random data"):
        profile_again(model, profile_format.load(tmp_path / "random.json"), "m.onnx")
    data, _ = _data(tmp_path, "npz")
    assert invoke("quantize-profile", tmp_path / "m.onnx", "--data", data, "-o",
                  tmp_path / "p.json").exit_code == 0
    merged = invoke("profile", "merge", tmp_path / "p.json", tmp_path / "p.json",
                    "--allow-same-data", "-o", tmp_path / "merged.json")
    assert merged.exit_code == 0, merged.output
    with pytest.raises(NotAgain, match="the profile merges 2 runs"):
        profile_again(model, profile_format.load(tmp_path / "merged.json"), "m.onnx")
