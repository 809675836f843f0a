"""The whole flow in one place: an fp32 ONNX model and its profile → an int8 graph → a Program.

Every caller (the CLI, `ember accuracy`, the demo, the benchmarks, the tests) goes through
`quantize_model` or `compile_model`, so the frontend, the fp32 passes, the quantizer and the
backend are composed once; `compiler.pipeline` keeps each half's plan.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping, Sequence

import onnx

from compiler.backend.program import BackendOptions, Compiled
from compiler.frontend.onnx import fix_input_shapes, import_model, load_model
from compiler.graph.ir import Graph
from compiler.pipeline import compile_int8, optimize
from profiler import format as profile_format
from profiler.format import Profile
from quantizer.options import QuantOptions
from quantizer.quantize import quantize
from simulator.arch import Arch

ModelSource = onnx.ModelProto | str | os.PathLike
ProfileSource = Profile | str | os.PathLike


@dataclass(frozen=True)
class CompileOptions:
    """Everything besides the model, its profile and the target that decides a program; the
    program header records it (`to_header`) and `ember accuracy` reads it back (`from_header`)."""

    quant: QuantOptions = QuantOptions()
    backend: BackendOptions = BackendOptions()

    def to_header(self) -> dict:
        """Every option by its field name, the quantizer's first (tuples as JSON lists)."""
        return {f.name: (list(v) if isinstance(v := getattr(options, f.name), tuple) else v)
                for options in (self.quant, self.backend) for f in fields(options)}

    @classmethod
    def from_header(cls, recorded: Mapping) -> CompileOptions:
        """The options a header records; those it lacks keep their defaults."""
        def rebuild(kind):
            known = {f.name for f in fields(kind)}
            return kind(**{k: (tuple(v) if isinstance(v, list) else v)
                           for k, v in recorded.items() if k in known})
        return cls(rebuild(QuantOptions), rebuild(BackendOptions))


@dataclass(frozen=True)
class Quantized:
    """A model through the frontend, the fp32 graph passes and the quantizer."""

    model: onnx.ModelProto  # as imported: its input shapes fixed when shapes were given
    graph: Graph  # fp32, after the graph passes: the per-layer reference, same names
    qgraph: Graph  # int8: the integer reference the program matches bit for bit


@dataclass(frozen=True)
class Built:
    """What `compile_model` made: the int8 graph and the program compiled from it."""

    qgraph: Graph
    compiled: Compiled


def quantize_model(model: ModelSource, profile: ProfileSource,
                   options: QuantOptions = QuantOptions(),
                   input_shapes: Mapping[str, Sequence[int]] | None = None) -> Quantized:
    """Import `model` (with `input_shapes`, fix its dynamic inputs), run the fp32 graph passes
    and quantize it with `profile`, which must have been made for this model."""
    return _quantize(*_load(model, profile), options, input_shapes, _label(model))


def compile_model(model: ModelSource, profile: ProfileSource,
                  options: CompileOptions = CompileOptions(),
                  arch: Arch | str = "default") -> Built:
    """Quantize `model` with `profile` and compile it for `arch` (an Arch, a preset name or an
    architecture TOML file). The header records the tool, the options and, when `model` and
    `profile` are files, their digests (so `ember accuracy` can refuse another profile)."""
    proto, loaded = _load(model, profile)
    arch = arch if isinstance(arch, Arch) else Arch.load(arch)
    qgraph = _quantize(proto, loaded, options.quant, label=_label(model)).qgraph
    metadata = {"tool": {"name": "ember", "version": profile_format.tool_version()},
                "options": {"target": arch.name, **options.to_header()}}
    if not isinstance(model, onnx.ModelProto) and not isinstance(profile, Profile):
        metadata["inputs"] = {"model_sha256": _sha256(model),
                              "model_fingerprint": loaded.model.digest,
                              "profile_sha256": _sha256(profile)}
    return Built(qgraph, compile_int8(qgraph, arch, options.backend, metadata))


def optimized_graph(model: ModelSource,
                    input_shapes: Mapping[str, Sequence[int]] | None = None,
                    label: str | None = None) -> Graph:
    """The fp32 Graph the quantizer starts from: imported, then the fp32 graph passes."""
    return optimize(import_model(model, input_shapes, label))


def _load(model: ModelSource, profile: ProfileSource) -> tuple[onnx.ModelProto, Profile]:
    """The model and its profile, checked to belong together."""
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    loaded = profile if isinstance(profile, Profile) else profile_format.load(profile)
    profile_format.check_matches(loaded, proto)
    return proto, loaded


def _quantize(proto: onnx.ModelProto, profile: Profile, options: QuantOptions,
              input_shapes: Mapping[str, Sequence[int]] | None = None,
              label: str = "model") -> Quantized:
    if input_shapes is not None:
        proto = fix_input_shapes(proto, input_shapes, label)
    graph = optimized_graph(proto, label=label)
    return Quantized(proto, graph, quantize(graph, profile, options))


def _label(model: ModelSource) -> str:
    """How errors name `model`: its path, as the user typed it."""
    return "model" if isinstance(model, onnx.ModelProto) else str(model)


def _sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
