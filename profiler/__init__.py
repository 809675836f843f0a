"""Tensor ranges of an fp32 model over calibration data (`ember quantize-profile`).

The quantizer reads profiles through `profiler.format`: `load`, `check_matches`, `merge`,
`Profile.tensors[name] -> TensorStats`.
"""
