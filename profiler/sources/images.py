"""Calibration data from a folder of images, with the preprocessing given explicitly.

Pixels are scaled to [0, 1], then normalised per channel as (x - mean) / std, the torchvision
convention (ImageNet: --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from profiler.batching import Chunk
from profiler.errors import ProfileError
from profiler.model_inputs import InputSpec

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# What `ImageFolder.describe` records of the preprocessing: the same options give the same
# tensors from the same images.
PREPROCESSING = ("resize", "mean", "std", "layout", "channel_order")


@dataclass(frozen=True)
class ImageOptions:
    resize: tuple[int, int] | None = None  # (height, width); default: the model's
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str | None = None  # NCHW or NHWC; default: guessed from the model's shape
    channel_order: str = "RGB"


class ImageFolder:
    """Every png/jpg under a folder (sub-folders too, as in class-per-folder data sets)."""

    def __init__(self, path: Path, files: list[Path], specs: list[InputSpec],
                 options: ImageOptions):
        if len(specs) != 1 or len(specs[0].shape) != 4:
            raise ProfileError(f"{path}: an image folder feeds a model with one 4-D input; this "
                               f"model has {', '.join(f'{s.name}{s}' for s in specs)}")
        self.path, self.files, self.spec = path, files, specs[0]
        self.layout = options.layout or _guess_layout(self.spec)
        dims = self.spec.shape[1:3] if self.layout == "NHWC" else self.spec.shape[2:4]
        channels = self.spec.shape[3] if self.layout == "NHWC" else self.spec.shape[1]
        self.size = options.resize or dims
        if None in self.size:
            raise ProfileError(f"input '{self.spec.name}' has dynamic height or width "
                               f"{self.spec}: give --resize H,W")
        self.channels = channels or 3
        if self.channels not in (1, 3):
            raise ProfileError(f"input '{self.spec.name}' {self.spec} in {self.layout} has "
                               f"{self.channels} channels; images give 1 or 3")
        for flag, values in (("--mean", options.mean), ("--std", options.std)):
            if len(values) not in (1, self.channels):
                raise ProfileError(f"{flag} has {len(values)} values; input '{self.spec.name}' "
                                   f"has {self.channels} channels")
        if 0.0 in options.std:
            raise ProfileError("--std must not contain 0")
        self.options = options

    def describe(self) -> dict:
        o = self.options
        return {"kind": "images", "path": str(self.path), "files": len(self.files),
                "resize": list(self.size), "mean": list(o.mean), "std": list(o.std),
                "layout": self.layout, "channel_order": o.channel_order,
                "scale": "pixels/255 then (x - mean) / std"}

    def count(self) -> int | None:
        return len(self.files)

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        for file in self.files[start:]:
            yield str(file), {self.spec.name: self._load(file)[np.newaxis]}

    def _load(self, file: Path) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError  # only image folders need Pillow

        try:
            with Image.open(file) as image:
                image = image.convert("L" if self.channels == 1 else "RGB")
                height, width = self.size
                image = image.resize((width, height), Image.Resampling.BILINEAR)
                pixels = np.asarray(image, dtype=np.float32) / 255.0
        except (OSError, UnidentifiedImageError, ValueError) as err:
            raise ProfileError(f"{file}: unreadable image ({err})") from None
        if pixels.ndim == 2:
            pixels = pixels[:, :, np.newaxis]
        if self.options.channel_order == "BGR":
            pixels = pixels[:, :, ::-1]
        pixels = (pixels - np.float32(self.options.mean)) / np.float32(self.options.std)
        if self.layout == "NCHW":
            pixels = pixels.transpose(2, 0, 1)
        return np.ascontiguousarray(pixels, dtype=self.spec.dtype)


def preprocessing(described: dict) -> dict | None:
    """The preprocessing a data source's description records, or None for data that is not
    images (arrays arrive as the model takes them)."""
    if described.get("kind") != "images":
        return None
    return {key: described.get(key) for key in PREPROCESSING}


def _guess_layout(spec: InputSpec) -> str:
    """NCHW unless only the last axis looks like channels."""
    return "NHWC" if spec.shape[1] not in (1, 3) and spec.shape[3] in (1, 3) else "NCHW"
