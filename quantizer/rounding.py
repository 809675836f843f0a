"""Weight codes that minimize each layer's output error on calibration data, not each weight's
own rounding error: error-compensated rounding (GPTQ, Frantar et al., ICLR 2023, after Optimal
Brain Quantization; AdaRound, Nagel et al., ICML 2020, optimizes the same layer-wise objective by
gradient descent).

Rounding every weight to its nearest code minimizes |W_q - W| but not what the layer outputs,
|(W_q - W) X| over the inputs X it sees. With H = X X^T (the inputs' second moments, per group
of a grouped convolution), the output error of a row w is (w_q - w) H (w_q - w)^T: the weights
are rounded one column at a time, and each rounding error is pushed onto the columns not yet
rounded through the Cholesky factor of H^-1, so that they absorb it. The scales stay the
quantizer's (per channel or per tensor, floored for dead channels): only which of the two
neighbouring codes each weight takes changes (a weight may move a code or two further where the
compensation carries it), so the program's arithmetic is untouched and its cycles too.

Measured on EfficientNet-Lite0's pretrained weights with 8 calibration images (fp32
activations, weights alone quantized per channel): nearest rounding caps the output at 19.6 dB,
error-compensated rounding at 31.1 dB.

The layer-wise objective above takes X from the fp32 model, but in the quantized model a layer
reads X~, its input after the earlier layers' own rounding and the activations' quantization.
Fitted to the quantized model (GPTQ and AdaRound's sequential variants; Nagel et al. 2020's
"asymmetric" reconstruction), the codes minimize |W X - W_q X~| instead: with H~ = X~ X~^T and
C = X~ X^T, that is |(W* - W_q) X~| plus a constant, for the target W* = W C^T H~^-1. So the same
compensation runs on H~ with W* in place of W, and the codes also absorb part of the error the
earlier layers put into X~ (`quantized_codes`).

The codes are computed once (`ember round-weights`) and stored with their scales, so that every
later compile and accuracy run uses the same codes: a rounding that floating-point noise could
flip would make a program differ from its integer reference.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass

import numpy as np

from quantizer.errors import QuantizeError

FORMAT = "ember.rounding"
VERSION = 1

# Added to H's diagonal, relative to its mean: keeps H invertible where inputs are constant or
# correlated (GPTQ's default).
DAMPING = 0.01
# Columns rounded between two updates of the rest (GPTQ's lazy batch): same result, fewer passes.
BLOCK = 128


def compensated_codes(weights: np.ndarray, hessian: np.ndarray, scales: np.ndarray,
                      qmax: int) -> np.ndarray:
    """Integer codes of `weights` (G groups x R rows x K columns) for the symmetric grid of
    `scales` (G x R x 1, or broadcastable), clamped to [-qmax, qmax], choosing each so that the
    rows' output error under `hessian` (G x K x K, the inputs' X X^T per group) is small.
    Columns are rounded in decreasing order of their input energy (H's diagonal: GPTQ's act
    order). Columns whose input is always zero take their nearest codes."""
    w = np.array(weights, np.float64)
    h = np.array(hessian, np.float64)
    groups, rows, k = w.shape
    s = np.broadcast_to(np.asarray(scales, np.float64), (groups, rows, 1))
    diag = np.diagonal(h, axis1=1, axis2=2).copy()
    dead = diag <= 0
    index = np.arange(k)
    h[:, index, index] += np.where(dead, 1.0, 0.0) + \
        DAMPING * np.maximum(diag.mean(axis=1, keepdims=True), 1e-30)
    order = np.argsort(-diag, axis=1, kind="stable")
    w = np.take_along_axis(w, order[:, None, :], axis=2)
    h = np.take_along_axis(np.take_along_axis(h, order[:, :, None], axis=1),
                           order[:, None, :], axis=2)
    # The upper Cholesky factor U of H^-1 (H^-1 = U^T U): row i says how the error of column
    # i spreads over the columns after it.
    upper = np.swapaxes(np.linalg.cholesky(np.linalg.inv(h)), 1, 2)
    codes = np.empty((groups, rows, k), np.int64)
    for start in range(0, k, BLOCK):
        end = min(start + BLOCK, k)
        errors = np.empty((groups, rows, end - start))
        for i in range(start, end):
            q = np.clip(np.rint(w[:, :, i] / s[:, :, 0]), -qmax, qmax)
            codes[:, :, i] = q
            err = (w[:, :, i] - q * s[:, :, 0]) / upper[:, i, i][:, None]
            w[:, :, i + 1:end] -= err[:, :, None] * upper[:, None, i, i + 1:end]
            errors[:, :, i - start] = err
        if end < k:
            w[:, :, end:] -= errors @ upper[:, start:end, end:]
    restored = np.empty_like(codes)
    np.put_along_axis(restored, order[:, None, :], codes, axis=2)
    return restored


def output_error(weights: np.ndarray, codes: np.ndarray, scales: np.ndarray,
                 hessian: np.ndarray) -> float:
    """sum over rows of (w_q - w) H (w_q - w)^T: the layer's squared output error on the
    calibration inputs."""
    delta = np.asarray(codes, np.float64) * np.asarray(scales, np.float64) - weights
    return float(np.einsum("grk,gkl,grl->", delta, hessian, delta))


@dataclass(frozen=True)
class Moments:
    """A layer's inputs over calibration samples, per group (G x K x K each): the quantized
    model's X~ X~^T, the cross term X~ X^T, and the fp32 model's X X^T. Enough for the output
    error |W X - W_q X~| of any codes."""

    quantized: np.ndarray
    cross: np.ndarray
    fp32: np.ndarray

    def __add__(self, other: Moments) -> Moments:
        return Moments(self.quantized + other.quantized, self.cross + other.cross,
                       self.fp32 + other.fp32)


def target_weights(weights: np.ndarray, moments: Moments) -> np.ndarray:
    """W* = (W C^T + d W)(H~ + d I)^-1: the real weights whose output on the quantized inputs
    is closest to the fp32 layer's, pulled towards W by GPTQ's damping d (a column the
    quantized inputs never excite keeps W's values; with X~ = X, W* = W)."""
    w = np.asarray(weights, np.float64)
    h = np.array(moments.quantized, np.float64)
    k = h.shape[-1]
    diag = np.diagonal(h, axis1=1, axis2=2)
    damping = DAMPING * np.maximum(diag.mean(axis=1), 1e-30)
    h[:, np.arange(k), np.arange(k)] += damping[:, None]
    rhs = w @ np.swapaxes(moments.cross, 1, 2) + damping[:, None, None] * w
    # H~ is symmetric: W* = rhs H~^-1 is the solution of H~ W*^T = rhs^T.
    return np.swapaxes(np.linalg.solve(h, np.swapaxes(rhs, 1, 2)), 1, 2)


def quantized_codes(weights: np.ndarray, moments: Moments, scales: np.ndarray, qmax: int,
                    match_fp32_output: bool) -> np.ndarray:
    """`compensated_codes` for the quantized model, chosen on H~: for W itself (GPTQ's
    sequential form: the inputs' error is not corrected), or, `match_fp32_output`, for the
    target W* (the layer's output on its quantized inputs as near the fp32 layer's output as
    the codes allow; fits the calibration samples' input errors, which other samples may not
    share)."""
    target = target_weights(weights, moments) if match_fp32_output else weights
    return compensated_codes(target, moments.quantized, scales, qmax)


def quantized_output_error(weights: np.ndarray, codes: np.ndarray, scales: np.ndarray,
                           moments: Moments) -> float:
    """sum over rows of |w X - w_q X~|^2: the layer's squared output error in the quantized
    model (its codes and its inputs' error together) against the fp32 layer's output."""
    w = np.asarray(weights, np.float64)
    q = np.asarray(codes, np.float64) * np.asarray(scales, np.float64)
    return float(np.einsum("grk,gkl,grl->", q, moments.quantized, q)
                 - 2 * np.einsum("grk,gkl,grl->", q, moments.cross, w)
                 + np.einsum("grk,gkl,grl->", w, moments.fp32, w))


@dataclass(frozen=True)
class RoundedWeight:
    """A weight's codes from a rounding file, the scales they are on, and the sha256 of the
    float weight they were chosen for (`weight_digest`)."""

    codes: np.ndarray
    scales: np.ndarray
    axis: int | None
    digest: str


def weight_digest(weight: np.ndarray) -> str:
    """The sha256 of a float weight's values as float32: which weight a file's codes are for."""
    return hashlib.sha256(np.ascontiguousarray(weight, np.float32).tobytes()).hexdigest()


def save_rounding(handle, weights: dict[str, RoundedWeight], about: dict) -> None:
    """Write `weights` as an .npz: a JSON header (format, version, `about`, one record per
    weight) and each weight's codes and scales."""
    arrays, index = {}, []
    for k, (name, w) in enumerate(weights.items()):
        arrays[f"codes_{k}"] = np.asarray(w.codes, np.int8)
        arrays[f"scales_{k}"] = np.asarray(w.scales, np.float64)
        index.append({"weight": name, "axis": w.axis, "digest": w.digest})
    header = {"format": FORMAT, "version": VERSION, **about, "weights": index}
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    np.savez_compressed(handle, **arrays)


def load_rounding(path: str) -> dict[str, RoundedWeight]:
    """A rounding file's weights by name; QuantizeError naming the file when it is missing,
    corrupt or of another format."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode())
            if header.get("format") != FORMAT or header.get("version") != VERSION:
                raise QuantizeError(f"--weight-rounding {path}: not an ember rounding file "
                                    f"(format {header.get('format')!r}, version "
                                    f"{header.get('version')!r}; expected {FORMAT!r} "
                                    f"{VERSION})")
            return {w["weight"]: RoundedWeight(data[f"codes_{k}"], data[f"scales_{k}"],
                                               w["axis"], w["digest"])
                    for k, w in enumerate(header["weights"])}
    except QuantizeError:
        raise
    except FileNotFoundError:
        raise QuantizeError(f"--weight-rounding {path}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile,
            json.JSONDecodeError, UnicodeDecodeError) as err:
        raise QuantizeError(f"--weight-rounding {path}: not a readable rounding file "
                            f"({type(err).__name__}: {err})") from None
