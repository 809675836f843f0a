"""The whole flow in one place: an fp32 ONNX model and its profile → an int8 graph → a Program.

Every caller (the CLI, `ember accuracy`, the demo, the benchmarks, the tests) goes through
`quantize_model` or `compile_model`, so the frontend, the fp32 passes, the quantizer and the
backend are composed once; `compiler.pipeline` keeps each half's plan.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from compiler.backend.program import BackendOptions, Compiled
from compiler.backend.progress import Progress, quiet
from compiler.frontend.onnx import (UNROLLED, fix_input_shapes, import_model, load_model,
                                    unroll_recurrent)
from compiler.graph.ir import Graph
from compiler.pipeline import compile_int8, optimize
from ember import preprocessing
from ember.cluster import Cluster
from ember.errors import EmberError
from ember.profiling import profile as sharded_profile
from profiler import format as profile_format
from compiler.errors import CompileError
from profiler.fingerprint import fingerprint, graph_inputs
from profiler.errors import ProfileError
from profiler.format import Profile
from quantizer.checks import unquantizable_nodes
from quantizer.equalize import MODES as EQUALIZE_MODES
from quantizer.equalize import equalize
from quantizer.options import QuantOptions
from quantizer.quantize import quantize
from simulator.arch import Arch

ModelSource = onnx.ModelProto | str | os.PathLike
ProfileSource = Profile | str | os.PathLike


@dataclass(frozen=True)
class CompileOptions:
    """Everything besides the model, its profile and the target that decides a program; the
    program header records it (`to_header`) and `ember accuracy` reads it back (`from_header`).
    `input_shapes` fixes dynamic inputs (--input-shape); `compile_model` records the shapes it
    resolved, and only for dynamic inputs, so a static model's header is as it always was."""

    quant: QuantOptions = QuantOptions()
    backend: BackendOptions = BackendOptions()
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def to_header(self) -> dict:
        """Every option by its field name, the quantizer's first (tuples as JSON lists)."""
        recorded = {f.name: (list(v) if isinstance(v := getattr(options, f.name), tuple) else v)
                    for options in (self.quant, self.backend) for f in fields(options)}
        for name in ("int16_tensors", "int16_weights", "weight_rounding"):
            if not getattr(self.quant, name):  # a program without them has the header it had
                del recorded[name]
        if self.input_shapes:
            recorded["input_shapes"] = {name: list(dims)
                                        for name, dims in self.input_shapes.items()}
        return recorded

    @classmethod
    def from_header(cls, recorded: Mapping) -> CompileOptions:
        """The options a header records; those it lacks keep their defaults."""
        def rebuild(kind):
            known = {f.name for f in fields(kind)}
            return kind(**{k: (tuple(v) if isinstance(v, list) else v)
                           for k, v in recorded.items() if k in known})
        shapes = recorded.get("input_shapes", {})
        if not isinstance(shapes, Mapping) or not all(
                isinstance(dims, list) and all(type(d) is int and d > 0 for d in dims)
                for dims in shapes.values()):
            raise ValueError(f"input_shapes = {shapes!r:.60}: expected lists of positive sizes")
        return cls(rebuild(QuantOptions), rebuild(BackendOptions),
                   {name: tuple(dims) for name, dims in shapes.items()})


@dataclass(frozen=True)
class Quantized:
    """A model through the frontend, the fp32 graph passes and the quantizer."""

    model: onnx.ModelProto  # as imported: its input shapes fixed when shapes were given
    graph: Graph  # fp32, after the graph passes: the per-layer reference, same names
    qgraph: Graph  # int8: the integer reference the program matches bit for bit
    # Each integer weight's float values by its name (a smoothed one's are in no other graph).
    float_weights: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Built:
    """What `compile_model` made: the int8 graph and the program compiled from it."""

    qgraph: Graph
    compiled: Compiled


def quantize_model(model: ModelSource, profile: ProfileSource,
                   options: QuantOptions = QuantOptions(),
                   input_shapes: Mapping[str, Sequence[int]] | None = None) -> Quantized:
    """Import `model` (its dynamic inputs fixed by `input_shapes`, else at the shapes the
    profile was made at), run the fp32 graph passes and quantize it with `profile`, which must
    have been made for this model."""
    return Quantizer(model, profile, input_shapes, options.equalize)(options)


class Quantizer:
    """A model imported once and quantized under any number of options: a budget's search
    checks hundreds of configurations, and the import and fp32 passes (half of a
    quantization's time on a CRNN) do not depend on them. The quantizer leaves its fp32 graph
    as it found it."""

    def __init__(self, model: ModelSource, profile: ProfileSource,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 equalize: str = "off"):
        proto, self.profile = _load(model, profile, equalize)
        label = _label(model)
        shapes = resolve_input_shapes(proto, self.profile, input_shapes or {}, label)
        self.model = fix_input_shapes(proto, shapes, label)
        self.graph = optimized_graph(self.model, label=label)
        self.equalize = equalize

    def __call__(self, options: QuantOptions) -> Quantized:
        if options.equalize != self.equalize:
            raise ValueError(f"imported with equalize={self.equalize!r}, asked to quantize "
                             f"with {options.equalize!r}")
        floats: dict[str, np.ndarray] = {}
        qgraph = quantize(self.graph, self.profile, options, floats)
        return Quantized(self.model, self.graph, qgraph, floats)


def compile_model(model: ModelSource, profile: ProfileSource,
                  options: CompileOptions = CompileOptions(),
                  arch: Arch | str = "default", progress: Progress = quiet) -> Built:
    """Quantize `model` with `profile` and compile it for `arch` (an Arch, a preset name or an
    architecture TOML file). The header records the tool, the options (with the shapes that
    fixed dynamic inputs) and, when `model` and `profile` are files, their digests (so
    `ember accuracy` can refuse another profile). With the backend's allow_host, nodes without
    an int8 form are kept in fp32 (host segments). `progress` hears how far each step has come
    (`compiler.backend.progress`)."""
    proto, loaded = _load(model, profile, options.quant.equalize)
    arch = arch if isinstance(arch, Arch) else Arch.load(arch)
    prepared = _prepare(model, profile, proto, loaded, options, progress)
    return Built(prepared.qgraph, prepared.compile(arch, progress))


@dataclass(frozen=True)
class Prepared:
    """A model quantized for the backend, for any number of targets (`ember sweep` compiles
    one quantized graph for many architectures: the quantizer does not depend on them)."""

    qgraph: Graph
    options: CompileOptions  # as the header records them: shapes resolved, host nodes kept
    metadata: dict  # the header's entries besides the options

    def compile(self, arch: Arch, progress: Progress = quiet) -> Compiled:
        """The program for `arch`: what `compile_model` gives for the same inputs."""
        metadata = {"tool": self.metadata["tool"],
                    "options": {"target": arch.name, **self.options.to_header()},
                    **{k: v for k, v in self.metadata.items() if k != "tool"}}
        return compile_int8(self.qgraph, arch, self.options.backend, metadata, progress)


def prepare_model(model: ModelSource, profile: ProfileSource,
                  options: CompileOptions = CompileOptions()) -> Prepared:
    """`compile_model`'s work up to the target: import, fp32 passes, quantization."""
    proto, loaded = _load(model, profile, options.quant.equalize)
    return _prepare(model, profile, proto, loaded, options, quiet)


def _prepare(model: ModelSource, profile: ProfileSource, proto: onnx.ModelProto,
             loaded: Profile, options: CompileOptions, progress: Progress) -> Prepared:
    label = _label(model)
    shapes = resolve_input_shapes(proto, loaded, options.input_shapes, label)
    options = replace(options, input_shapes=shapes)
    progress("quantizing", 0, None)
    graph = optimized_graph(fix_input_shapes(proto, shapes, label), label=label)
    if options.backend.allow_host:
        # What has no int8 form runs on the host in fp32, as if named with keep_fp32; the
        # header records it so, and `ember accuracy` rebuilds the same int8 graph.
        kept = unquantizable_nodes(graph, options.quant)
        if kept:
            options = replace(options, quant=replace(
                options.quant, keep_fp32=options.quant.keep_fp32 + kept))
    qgraph = quantize(graph, loaded, options.quant)
    metadata: dict = {"tool": {"name": "ember", "version": profile_format.tool_version()}}
    if (images := preprocessing.profiled(loaded)) is not None:
        metadata["preprocessing"] = images  # for `ember simulate -i images/` to check
    if not isinstance(model, onnx.ModelProto) and not isinstance(profile, Profile):
        metadata["inputs"] = {"model_sha256": _sha256(model),
                              "model_fingerprint": loaded.model.digest,
                              "profile_sha256": _sha256(profile)}
        if options.quant.weight_rounding:
            metadata["inputs"]["weight_rounding_sha256"] = _sha256(options.quant.weight_rounding)
    return Prepared(qgraph, options, metadata)


def resolve_input_shapes(proto: onnx.ModelProto, profile: Profile,
                         given: Mapping[str, Sequence[int]], label: str = "model"
                         ) -> dict[str, tuple[int, ...]]:
    """The shape of each dynamic input: as `given` (--input-shape), else as profiled (at
    batch 1 when the profile's data chose the batch size).

    A given shape must equal the profiled one except on the batch axis: ranges are per
    sample, so a profile made at batch 1 serves a program compiled for batch 4, but not one
    for another image size. Static inputs are left to `fix_input_shapes` to check.
    """
    profiled = profile.input_shapes
    resolved = {}
    for value in graph_inputs(proto):
        dims = value.type.tensor_type.shape.dim
        recorded = profiled.get(value.name)
        if value.name in given:
            shape = tuple(given[value.name])
            if recorded is not None and len(recorded) == len(shape):
                for axis, (was, now) in enumerate(zip(recorded, shape)):
                    if axis and was is not None and was != now:
                        raise EmberError(
                            f"{label}: --input-shape {value.name}={_dims(shape)} does not fit "
                            f"{_name(profile)}, profiled at {value.name}={_dims(recorded)}: "
                            f"dimension {axis} is {now}, the profile's {was} (only the batch "
                            f"axis may differ); re-profile with --input-shape "
                            f"{value.name}={_dims(shape)}")
        elif recorded and None not in recorded[1:] and len(recorded) == len(dims):
            shape = (recorded[0] or 1, *recorded[1:])  # batch 1 when the data chose it
        else:
            continue
        if any(not d.HasField("dim_value") for d in dims):
            resolved[value.name] = shape
    for name in given:  # a static input named, or an unknown name: fix_input_shapes checks it
        resolved.setdefault(name, tuple(given[name]))
    return resolved


def optimized_graph(model: ModelSource,
                    input_shapes: Mapping[str, Sequence[int]] | None = None,
                    label: str | None = None) -> Graph:
    """The fp32 Graph the quantizer starts from: imported, then the fp32 graph passes."""
    return optimize(import_model(model, input_shapes, label))


def _load(model: ModelSource, profile: ProfileSource, mode: str = "off"
          ) -> tuple[onnx.ModelProto, Profile]:
    """The model (equalized by `mode`, as its profile must have been) and its profile,
    checked to belong together."""
    given = model if isinstance(model, onnx.ModelProto) else load_model(model)
    proto = equalize(given, mode)
    loaded = profile if isinstance(profile, Profile) else profile_format.load(profile)
    try:
        profile_format.check_matches(loaded, proto)
    except ProfileError as err:
        for other in EQUALIZE_MODES:  # made with another --equalize: say so
            if other != mode and not profile_format.difference(
                    loaded.model, fingerprint(equalize(given, other))):
                raise EmberError(f"{_name(loaded)} was made without --equalize; drop "
                                 f"--equalize {mode}" if other == "off" else
                                 f"{_name(loaded)} was made with --equalize {other}; give "
                                 f"--equalize {other} here too") from None
        raise err
    return proto, loaded


def _label(model: ModelSource) -> str:
    """How errors name `model`: its path, as the user typed it."""
    return "model" if isinstance(model, onnx.ModelProto) else str(model)


def _name(profile: Profile) -> str:
    return profile.path or "the profile"


def _dims(shape: Sequence[int | None]) -> str:
    return ",".join("?" if d is None else str(d) for d in shape)


def _sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def profile_model(proto: onnx.ModelProto, source, specs, options, overrides=None,
                  on_samples=lambda n: None, label: str = "model",
                  cluster: Cluster | None = None) -> Profile:
    """The profiler's run (`profiler.run.profile`, in shards where `cluster` runs them) over
    the model as ember imports it: its recurrent layers unrolled at the given input shapes, so
    that every step's values get a range under the names the quantizer reads. The profile
    names the model given."""
    if cluster is None:
        with Cluster() as here:
            return profile_model(proto, source, specs, options, overrides, on_samples, label,
                                 here)
    if not any(node.op_type in UNROLLED for node in proto.graph.node):
        return sharded_profile(cluster, proto, source, specs, options, on_samples)
    try:
        unrolled = unroll_recurrent(fix_input_shapes(proto, overrides or {}, label), label)
    except CompileError as err:
        raise EmberError(str(err)) from None
    return replace(sharded_profile(cluster, unrolled, source, specs, options, on_samples),
                   model=fingerprint(proto))
