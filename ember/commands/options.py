"""Options shared by several commands, declared once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from click.core import ParameterSource

from ember import cluster
from ember.errors import EmberError
from ember.files import InputPath
from quantizer.equalize import MODES as EQUALIZE_MODES

model_argument = click.argument("model", type=InputPath(dir_okay=False))

cluster_option = click.option(
    "--cluster", "cluster", default="local", show_default=True, metavar="local[:N]|ADDRESS",
    callback=lambda ctx, param, value: cluster.parse(value), help=cluster.CLUSTER_HELP)

input_shape_option = click.option(
    "--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,...",
    help="Fix a dynamic input shape, e.g. --input-shape input=1,3,224,224 (repeatable).")

DATA_FORMS = ("an .npz keyed by input name (samples on the first axis; a 'labels' array is "
              "ground truth, never an input), an .npy (one-input models), a folder of "
              ".npy/.npz files, a folder of png/jpg images (preprocessed as --resize, --mean, "
              "--std, --layout and --channel-order say), or a Python hook file.py:function or "
              "module:function returning dicts of {input name: array} (an iterable, or an "
              "object with get_next() such as an onnxruntime CalibrationDataReader)")


def data_options(*names: str, what: str, required: bool = False):
    """The data option (`--data`, or `-i/--input` where a command runs one input), --samples
    and the image preprocessing options, shared by every command that reads samples so that
    each takes every data form and preprocesses images the same way. The command receives
    `data`, `samples` and the keywords `image_options_from` reads."""
    def decorate(command):
        decorators = [
            click.option(*names, "data", metavar="DATA", type=InputPath(), required=required,
                         help=f"{what}: {DATA_FORMS}."),
            click.option("--samples", type=click.IntRange(min=1), metavar="N",
                         help="Read only the first N samples."),
            click.option("--resize", metavar="H,W",
                         help="Images: resize to H,W.  [default: the model's]"),
            click.option("--mean", default="0", show_default=True, metavar="M[,M,M]",
                         help="Images: per-channel mean subtracted after scaling pixels to "
                              "[0,1]."),
            click.option("--std", default="1", show_default=True, metavar="S[,S,S]",
                         help="Images: per-channel divisor applied after --mean."),
            click.option("--layout", type=click.Choice(["NCHW", "NHWC"]),
                         help="Images: tensor layout.  [default: guessed from the input shape]"),
            click.option("--channel-order", type=click.Choice(["RGB", "BGR"]), default="RGB",
                         show_default=True, help="Images: channel order the model expects."),
        ]
        for decorator in reversed(decorators):
            command = decorator(command)
        return command
    return decorate


def image_options_from(kwargs: dict):
    """An ImageOptions from the keywords `data_options` declared (removed from `kwargs`)."""
    from profiler.sources.images import ImageOptions
    return ImageOptions(resize=_size(kwargs.pop("resize")), mean=_floats(kwargs.pop("mean")),
                        std=_floats(kwargs.pop("std")), layout=kwargs.pop("layout"),
                        channel_order=kwargs.pop("channel_order"))


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"'{text}': expected comma-separated numbers") from None


def _size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        dims = tuple(int(v) for v in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) not in (1, 2) or min(dims) < 1:
        raise click.BadParameter(f"--resize '{text}': expected H,W or one size for both")
    return (dims[0], dims[-1])


program_shape_option = click.option(
    "--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,...",
    help="Check that PROGRAM was compiled for this input shape: a program's shapes are fixed "
         "by `ember compile --input-shape` (repeatable).")

class_axis_option = click.option(
    "--class-axis", "class_axes", multiple=True, metavar="[OUTPUT=]AXIS",
    help="Where an output's class scores lie, for top-1: OUTPUT=AXIS for one output "
         "(repeatable), AXIS alone for every output; negative counts from the last axis, as "
         "numpy's axis and torch's dim. Top-1 then compares the argmax over that axis at every "
         "position of the other axes: each step of a CTC head's [steps, batch, classes], each "
         "token of [batch, seq, vocab], each pixel of [batch, classes, H, W].  [default: only "
         "[batch, classes] outputs, on their last axis]")


ctc_blank_option = click.option(
    "--ctc-blank", type=click.IntRange(min=0), metavar="CLASS",
    help="Read each output --class-axis scores per position as a CTC head's, CLASS its blank, "
         "and score whole texts against the labels: each sample's argmaxes with repeats merged "
         "and blanks dropped must equal its label row exactly (labels: one row of class "
         "indices per sample, padded at the end with -1). Its accuracy is then the share of "
         "texts read right, what `compile --max-drop` holds (PaddleOCR's and most CRNNs' "
         "blank: 0).")


def _metric(ctx, param, value):
    from ember.task_metric import MetricSpec
    return None if value is None else MetricSpec.parse(value)


metric_option = click.option(
    "--metric", callback=_metric, metavar="FILE.py:FUNCTION",
    help="Score the outputs by a task metric of your own against the labels (a detector's box "
         "F1, a segmenter's IoU): FUNCTION(outputs, labels) is called on each run's fp32 "
         "outputs and again on its int8 ones ({name: array}; labels: that run's rows of the "
         "labels array, any shape) and returns a pair (score, weight); the metric is "
         "sum(score) / sum(weight), a fraction, as accuracy (correct, count) or F1 (2 TP, "
         "found + truths) is. The labels are then the metric's alone, and --max-drop holds it "
         "in points.")


threshold_option = click.option(
    "--threshold", "thresholds", multiple=True, metavar="[OUTPUT=]T",
    help="Read an output's scores as yes/no decisions, a score above T a yes, at every "
         "position: a binary classifier's one probability (T 0.5) or logit (T 0), a voice "
         "detector's speech probability per chunk. Top-1 agreement and accuracy then count "
         "decisions, and labels are 0 or 1 for each ([N], or [N, positions]). OUTPUT=T for one "
         "output (repeatable), T alone for every output.")


def decisions_from(values: tuple[str, ...]):
    """The `Decisions` that `--threshold` values name."""
    from ember.accuracy import Decisions
    return Decisions.parse(values)


def class_axes_from(values: tuple[str, ...]):
    """The `ClassAxes` that `--class-axis` values name."""
    from ember.accuracy import ClassAxes
    return ClassAxes.parse(values)


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON on stdout instead of a table.")

batch_option = click.option(
    "--batch", type=click.IntRange(min=1), metavar="N",
    help="Simulate N samples at once (one pass over the program for all of them; each "
         "sample's outputs are bit for bit those of its own run).  [default: from the "
         "program: as many as keep its working set in the caches, at most 256]")


equalize_option = click.option(
    "--equalize", type=click.Choice(EQUALIZE_MODES), default="off", show_default=True,
    help="Cross-layer equalization of Conv -> Conv chains before profiling and quantizing "
         "(Nagel et al. 2019): exact, through ReLU or nothing; relu6, also through ReLU6, whose "
         "bound becomes a per-channel Min (an extra vector pass); all, also through any other "
         "activation (HardSwish, SiLU, GELU...: one table per channel), and a depthwise Conv's "
         "input channels brought to one range (for per-channel weights). exact and relu6 even "
         "out per-tensor weight ranges (--per-tensor); the profile must be made with the same "
         "--equalize.")


def quantization_options(command):
    """The quantizer's options, shared by every command that quantizes (accuracy, compile)."""
    from quantizer.calibrate import METHODS
    from quantizer.options import QuantOptions
    decorators = [
        click.option("--profile", "profile_path", required=True,
                     type=InputPath(dir_okay=False),
                     help="The profile from `ember quantize-profile` for this model."),
        click.option("--calibration", type=click.Choice(METHODS),
                     default=QuantOptions().calibration,
                     show_default=True, help="How ranges come from the profile's histograms."),
        click.option("--percentile", type=float, default=99.99, show_default=True,
                     help="With --calibration percentile: the share of |x| kept inside."),
        click.option("--per-channel/--per-tensor", default=True, show_default=True,
                     help="Weight scales per output channel (Conv/Gemm/MatMul) or per tensor."),
        click.option("--activations", "activation_dtype", type=click.Choice(["int8", "uint8"]),
                     default="int8", show_default=True, help="Activation element type."),
        click.option("--symmetric/--asymmetric", default=False, show_default=True,
                     help="Symmetric activations (zero point fixed) or with an offset."),
        click.option("--schema", type=click.Choice(["affine", "power2"]), default="affine",
                     show_default=True,
                     help="power2 rounds every scale to a power of two (shift-only hardware)."),
        click.option("--keep-fp32", "keep_fp32", multiple=True, metavar="NODE",
                     help="Leave this node in fp32 (repeatable), to find the layer that hurts."),
        click.option("--wide-norm-inputs", "wide_norm_inputs",
                     type=click.Choice(["auto", "never", "always"]), default="auto",
                     show_default=True,
                     help="Which LayerNorm inputs (residual streams an Add computes, and what "
                          "is added into them), and which spectrum parts a magnitude reads, are "
                          "int16: auto, those whose median |x| int8 leaves under 8 steps "
                          "(outlier channels, quiet bins); the vector unit writes and reads them "
                          "as two byte planes."),
        click.option("--smooth-norms", "smooth_norms", type=click.Choice(["auto", "never"]),
                     default="auto", show_default=True,
                     help="Move a LayerNorm output's outlier channels into the weights of the "
                          "Gemms that read it (SmoothQuant): auto, when the profile's "
                          "per-channel ranges spread over 4x the median channel's."),
        equalize_option,
        click.option("--int16", "int16_tensors", multiple=True, metavar="NAME[,NAME...]",
                     callback=_names,
                     help="Hold these tensors (ONNX names: outputs of Conv, Gemm, MatMul or "
                          "ConvTranspose layers, by constant weights or of two activations "
                          "(attention's Q, K, V and context), LayerNorms, Softmaxes along "
                          "the last axis (their scores and probabilities), Adds and Subs "
                          "(residual "
                          "streams, an LSTM's "
                          "steps: slices, broadcast terms and biases too), Muls such as a "
                          "squeeze-and-excitation gate's or a peephole's, a Hypot's "
                          "magnitude, pools or table ops such as HardSwish and Sigmoid (a "
                          "table per channel too: PRelu, an --equalize all activation); model "
                          "inputs and outputs too) in int16, with every value holding the "
                          "same codes through views, Concats, MaxPools, nearest Resizes and "
                          "edge or reflect Pads: the array streams their two byte "
                          "planes (twice its time for their readers), a table op writes int16 "
                          "codes or interpolates between knots (finer ones where the function "
                          "bends); their codes "
                          "take as many bits as the readers' int32 accumulators allow."),
        click.option("--weight-rounding", "weight_rounding", type=InputPath(dir_okay=False),
                     metavar="FILE",
                     help="Weight codes chosen for each layer's output on calibration data, "
                          "from `ember round-weights` (error-compensated rounding: the same "
                          "scales and cycles, less output error)."),
        click.option("--int16-weights", "int16_weights", multiple=True, metavar="NODE[,NODE...]",
                     callback=_names,
                     help="Quantize the constant weights of these Conv, Gemm or MatMul nodes "
                          "(node names) to int16 (9 to 15 bits, as many as their int32 "
                          "accumulators allow): the array runs each weight tile as two int8 "
                          "passes (twice its time for these nodes, twice their weight bytes)."),
        click.option("--bias-correction", "bias_correction", is_flag=True,
                     help="Subtract from each Conv/Gemm/MatMul bias the mean error its int8 "
                          "weights bring on the calibration data: (W_int8 - W) times the "
                          "input's per-channel means (a profile made with --channel-means)."),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def _names(ctx, param, values) -> tuple[str, ...]:
    """NAME[,NAME...] given once or more: the names in order, each once."""
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    return tuple(dict.fromkeys(names))


# The QuantOptions field that each parameter of `quantization_options` sets.
QUANT_FIELDS = {"calibration": "calibration", "percentile": "percentile",
                "per_channel": "per_channel", "activation_dtype": "activation_dtype",
                "symmetric": "symmetric_activations", "schema": "schema",
                "keep_fp32": "keep_fp32", "wide_norm_inputs": "wide_norm_inputs",
                "smooth_norms": "smooth_norms", "equalize": "equalize",
                "bias_correction": "bias_correction", "int16_tensors": "int16_tensors",
                "weight_rounding": "weight_rounding",
                "int16_weights": "int16_weights"}


def quant_options_from(kwargs: dict):
    """A QuantOptions from the click keyword arguments `quantization_options` declared."""
    from quantizer.options import QuantOptions
    return QuantOptions(**{field: kwargs[param] for param, field in QUANT_FIELDS.items()})


def refuse_conflicts(ctx: click.Context, source: str, fixed: Mapping[str, Any], made: str,
                     again: str) -> None:
    """The options the user typed that `source` fixes must say what it recorded: an error
    naming both values, rather than the file's silently winning. `fixed` maps a parameter's
    name to the recorded value; `made` says how the file got it ("compiled with") and
    `again` how to get another ("compile the program again"). Options left at their defaults
    take the file's."""
    conflicts = []
    for param in ctx.command.params:
        if param.name not in fixed or ctx.get_parameter_source(param.name) in (
                ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            continue
        given = ctx.params[param.name]
        if (tuple(given) if param.multiple else given) != fixed[param.name]:
            conflicts.append(f"{spelled(param, given)} was given, but {made} "
                             f"{spelled(param, fixed[param.name])}")
    if conflicts:
        them = "them" if len(conflicts) > 1 else "it"
        raise EmberError(f"{source}: " + "; ".join(conflicts) + f"; drop {them}, or {again} "
                         f"with {them}")


def spelled(param: click.Parameter, value) -> str:
    """`value` as the user would type it: `--per-tensor`, `--calibration mse`,
    `--keep-fp32 a --keep-fp32 b` (or `no --keep-fp32`)."""
    flag = max(param.opts, key=len)
    if isinstance(param, click.Option) and param.is_flag and param.secondary_opts:
        return flag if value else max(param.secondary_opts, key=len)
    if param.multiple:
        return " ".join(f"{flag} {v}" for v in value) or f"no {flag}"
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def warn_if_synthetic(profile_path: str) -> None:
    """One line on stderr when the profile holds only made-up ranges (`--random` runs).

    Called once the command has loaded and checked the profile, so it never changes which
    error a bad file gives.
    """
    from profiler import format as profile_format
    if profile_format.load(profile_path).synthetic:
        click.echo(f"ember: warning: {profile_path} was profiled on synthetic --random data: "
                   f"its ranges say nothing about real inputs; profile real samples with "
                   f"--data", err=True)
