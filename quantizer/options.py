"""The quantizer's options: one frozen dataclass, validated when it is built."""

from __future__ import annotations

from dataclasses import dataclass

from quantizer import calibrate
from quantizer.equalize import MODES as EQUALIZE_MODES
from quantizer.errors import QuantizeError
from quantizer.smooth import MODES as SMOOTH_MODES
from quantizer.wide import MODES as WIDE_MODES

SCHEMAS = ("affine", "power2")
ACTIVATION_DTYPES = ("int8", "uint8")


@dataclass(frozen=True)
class QuantOptions:
    """How to quantize.

    activation_dtype defaults to "int8" with a zero point (asymmetric): the array multiplies
    int8 by int8 (numerics' contract), and with the zero point folded into the bias an int8
    activation has the same 256 levels as a uint8 one while every operand the array sees stays
    int8 (the reason TFLite moved from uint8 to int8). "uint8" is available for targets and
    tools that expect it. symmetric_activations fixes the zero point at 0 (128 for uint8).
    schema "power2" rounds every scale up to a power of two, for shift-only hardware.
    wide_norm_inputs chooses which LayerNorm inputs (residual streams an Add computes) are
    int16: "auto" those the profile shows int8 loses (`quantizer.wide`), "always" or "never".
    smooth_norms "auto" moves a LayerNorm output's outlier channels into the weights of the
    Gemms that read it when its per-channel ranges in the profile are uneven
    (`quantizer.smooth`); "never" keeps every norm as the model has it.
    equalize "exact" or "relu6" rewrites the model by cross-layer equalization before it is
    profiled and quantized (`quantizer.equalize`): its profile must be made with the same mode.
    bias_correction subtracts from each Conv/Gemm/MatMul bias the mean error its int8 weights
    bring, (W_int8 - W) times the input's per-channel means, which the profile must hold
    (`ember quantize-profile --channel-means`).
    int16_tensors names activations (graph value names, ONNX's) to hold int16: each a Conv's,
    ConvTranspose's, Gemm's or MatMul's output, a residual Add's, a table op's (Sigmoid,
    HardSwish, ...) or an AveragePool's, read only by Convs, ConvTransposes, Gemms and MatMuls
    by constant weights, which stream its two byte planes through the array, by residual Adds,
    by table ops, which interpolate between knots by its low byte, and by AveragePools; with
    it, every value holding the same codes through views, Slices, Splits, Transposes,
    Concats, MaxPools and nearest Resizes is int16 too, in one scale
    (`quantizer.wide.array_values`, `wide_group`); its codes take as many bits (up to 16) as
    its group's readers' int32 accumulators allow (`quantizer.wide.accumulator_bits`).
    weight_rounding is a file of weight codes chosen for each layer's output on calibration
    data (`ember round-weights`, `quantizer.rounding`); weights it holds at these options'
    scales take its codes, the others their nearest.
    int16_weights names Conv, Gemm and MatMul nodes (by node name) whose constant weight is
    quantized symmetric to as many bits as their int32 accumulators allow (9 to 15:
    `quantizer.wide_weights.weight_bits`) and stored int16; the array runs each weight tile
    as two passes of int8 parts (`numerics.split_weight`), four when the node's input is int16
    too (`numerics.wide_passes`), the two widths then chosen jointly
    (`quantizer.wide_weights.input_bits`).
    """

    calibration: str = "minmax"
    percentile: float = 99.99
    per_channel: bool = True
    activation_dtype: str = "int8"
    symmetric_activations: bool = False
    schema: str = "affine"
    keep_fp32: tuple[str, ...] = ()
    wide_norm_inputs: str = "auto"
    smooth_norms: str = "auto"
    equalize: str = "off"
    bias_correction: bool = False
    int16_tensors: tuple[str, ...] = ()
    weight_rounding: str | None = None
    int16_weights: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.calibration not in calibrate.METHODS:
            raise QuantizeError(f"calibration {self.calibration!r} is unknown; choose one of "
                                f"{calibrate.METHODS}")
        if not 0.0 < self.percentile <= 100.0:
            raise QuantizeError(f"percentile must lie in (0, 100], got {self.percentile}")
        if self.activation_dtype not in ACTIVATION_DTYPES:
            raise QuantizeError(f"activation_dtype {self.activation_dtype!r} is unknown; choose "
                                f"one of {ACTIVATION_DTYPES}")
        if self.wide_norm_inputs not in WIDE_MODES:
            raise QuantizeError(f"wide_norm_inputs {self.wide_norm_inputs!r} is unknown; choose "
                                f"one of {WIDE_MODES}")
        if self.smooth_norms not in SMOOTH_MODES:
            raise QuantizeError(f"smooth_norms {self.smooth_norms!r} is unknown; choose one of "
                                f"{SMOOTH_MODES}")
        if self.equalize not in EQUALIZE_MODES:
            raise QuantizeError(f"equalize {self.equalize!r} is unknown; choose one of "
                                f"{EQUALIZE_MODES}")
        if self.schema not in SCHEMAS:
            raise QuantizeError(f"schema {self.schema!r} is unknown; choose one of {SCHEMAS}")
        object.__setattr__(self, "keep_fp32", tuple(self.keep_fp32))
        object.__setattr__(self, "int16_tensors", tuple(self.int16_tensors))
        object.__setattr__(self, "int16_weights", tuple(self.int16_weights))
        if self.int16_tensors and self.activation_dtype != "int8":
            raise QuantizeError(f"int16 tensors ({', '.join(self.int16_tensors)}) refine int8 "
                                f"codes: not with activation_dtype {self.activation_dtype!r}")
