"""Where calibration data comes from: one module per kind of source (`arrays`: .npz/.npy files
or random samples, `images`: a folder of images, `python_hook`: the user's function), and here
which one `--data` names, decided from the text and what the path holds."""

from __future__ import annotations

from pathlib import Path

from profiler.batching import Source
from profiler.errors import ProfileError
from profiler.model_inputs import InputSpec
from profiler.sources import arrays, images, python_hook


def open_data(data: str, specs: list[InputSpec], image_options: images.ImageOptions,
              option: str = "--data") -> Source:
    """The source `option` (--data, or -i) names: a hook, an .npz/.npy file, or a folder of
    arrays or images."""
    if python_hook.is_hook(data):
        return python_hook.Hook(data, specs)
    path = Path(data)
    if path.is_file():
        if path.suffix not in (".npz", ".npy"):
            raise ProfileError(f"{option} {data}: expected an .npz or .npy file, a folder, or a "
                               f"hook file.py:function")
        return arrays.ArrayFile(path, specs)
    if not path.is_dir():
        raise ProfileError(f"{option} {data}: no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.is_file())
    array_files = [p for p in files if p.suffix in (".npz", ".npy")]
    image_files = [p for p in files if p.suffix.lower() in images.IMAGE_SUFFIXES]
    if array_files and image_files:
        raise ProfileError(f"{option} {data}: holds both array files and images; use one kind")
    if image_files:
        return images.ImageFolder(path, image_files, specs, image_options)
    if array_files:
        return arrays.ArrayDirectory(path, array_files, specs)
    raise ProfileError(f"{option} {data}: no .npy, .npz, .png or .jpg files in the folder")
