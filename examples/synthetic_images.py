"""Synthetic ImageNet-like inputs for the zoo models: calibration and evaluation data that the
benchmarks share, without a data set to download."""

from __future__ import annotations

import numpy as np

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def smooth_images(n: int, seed: int, size: int = 224) -> np.ndarray:
    """n synthetic "images" (n, 1, 3, size, size): smooth, channel-correlated, ImageNet-normalized.

    Normal noise low-pass filtered with a Gaussian in frequency (blobs of ~10-20 pixels), one
    component shared by the three channels and one per channel, each image then mapped to
    pixels in [0, 1] around a random brightness and contrast, and normalized as torchvision does.
    """
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(size).reshape(-1, 1)
    fx = np.fft.rfftfreq(size).reshape(1, -1)
    low_pass = np.exp(-(fx**2 + fy**2) / (2 * 0.025**2))
    out = np.empty((n, 1, 3, size, size), np.float32)
    for i in range(n):
        noise = rng.standard_normal((4, size, size))
        smooth = np.fft.irfft2(np.fft.rfft2(noise) * low_pass, s=(size, size))
        smooth /= smooth.std(axis=(1, 2), keepdims=True)
        rgb = 0.8 * smooth[:1] + 0.6 * smooth[1:]
        brightness = rng.uniform(0.3, 0.6)
        contrast = rng.uniform(0.15, 0.3)
        pixels = np.clip(brightness + contrast * rgb, 0.0, 1.0)
        out[i, 0] = (pixels - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
    return out
