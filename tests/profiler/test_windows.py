"""Shards read windows of the data: samples `start` to `stop` of every kind of source are the
samples a whole read gives there, and the data digest of the windows, joined, is the whole's."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from profiler import batching
from profiler.model_inputs import InputSpec
from profiler.sources import open_data
from profiler.sources.arrays import RandomData
from profiler.sources.images import ImageOptions

SPECS = [InputSpec("x", np.dtype(np.float32), (None, 4))]


def _samples(source, specs, start=0, stop=None, tally=None):
    tally = tally or batching.Tally()
    batches = list(batching.stream(source, specs, 7, False, None, False, tally, start, stop))
    return (np.concatenate([b[specs[0].name] for b in batches]) if batches else
            np.zeros((0, *specs[0].shape[1:]), np.float32)), tally


def _array_sources(tmp_path):
    x = np.random.default_rng(0).standard_normal((300, 4)).astype(np.float32)
    folder = tmp_path / "parts"
    folder.mkdir()
    np.savez(folder / "a.npz", x=x[:130])
    np.savez_compressed(folder / "b.npz", x=x[130:250])
    np.save(folder / "c.npy", x[250:299])
    np.save(folder / "d.npy", x[299])  # one sample without its batch axis
    np.savez_compressed(tmp_path / "all.npz", x=x)
    return {"npz": open_data(str(tmp_path / "all.npz"), SPECS, ImageOptions()),
            "folder": open_data(str(folder), SPECS, ImageOptions()),
            "random": RandomData(300, SPECS, 3)}


@pytest.mark.parametrize("kind", ["npz", "folder", "random"])
def test_windows_of_array_sources_are_the_whole_read_cut(tmp_path, kind) -> None:
    source = _array_sources(tmp_path)[kind]
    whole, tally = _samples(source, SPECS)
    assert len(whole) == 300 and tally.read == 300
    cuts = [0, 1, 64, 129, 130, 131, 250, 298, 299, 300]
    digests = []
    for start, stop in zip(cuts, cuts[1:]):
        part, part_tally = _samples(source, SPECS, start, stop)
        np.testing.assert_array_equal(part, whole[start:stop])
        assert part_tally.read == stop
        digests += part_tally.sample_digests
    assert batching.data_digest(digests) == tally.hexdigest()
    assert len(_samples(source, SPECS, 300)[0]) == 0


def test_windows_of_an_image_folder_decode_only_their_images(tmp_path) -> None:
    for i in range(5):
        Image.fromarray(np.full((4, 4, 3), 40 * i, np.uint8)).save(tmp_path / f"{i}.png")
    specs = [InputSpec("x", np.dtype(np.float32), (None, 3, 4, 4))]
    source = open_data(str(tmp_path), specs, ImageOptions())
    whole, _ = _samples(source, specs)
    (tmp_path / "0.png").write_bytes(b"not an image")  # before the window: never opened
    part, _ = _samples(source, specs, 2, 4)
    np.testing.assert_array_equal(part, whole[2:4])


def test_a_bad_sample_is_named_by_its_place_in_the_whole_data(tmp_path) -> None:
    x = np.zeros((50, 4), np.float32)
    x[37, 1] = np.nan
    np.savez(tmp_path / "d.npz", x=x)
    source = open_data(str(tmp_path / "d.npz"), SPECS, ImageOptions())
    with pytest.raises(batching.ProfileError, match="sample 37"):
        _samples(source, SPECS, 30, 40)
