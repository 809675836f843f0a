"""Code generation over all layers: each tiled layer's constants go into the DRAM image and its
instructions into steps; convolutions are `convolution`, the vector unit's layers `vector`,
host segments `host`, embedding lookups `gather`. Instructions are built only through the rows of `simulator.isa`
(`emit.instruction`)."""

from __future__ import annotations

from compiler.backend.codegen.convolution import PaddedInput, conv_steps, padded_input
from compiler.backend.codegen.emit import Context
from compiler.backend.codegen.gather import gather_steps
from compiler.backend.codegen.host import host_steps
from compiler.backend.codegen.matmul import matmul_steps
from compiler.backend.codegen.vector import elementwise_steps, pool_steps, softmax_steps
from compiler.backend.layers import (ConvLayer, GatherLayer, HostLayer, Lowered, MatMulLayer,
                                     PoolLayer, SoftmaxLayer)
from compiler.backend.memory import ImageBuilder
from compiler.backend.program import BackendOptions
from compiler.backend.progress import Progress, quiet
from compiler.backend.steps import Step
from compiler.backend.tiling import Tiles
from simulator.arch import Arch


def generate(lowered: Lowered, tiles: list[Tiles], arch: Arch, options: BackendOptions,
             on_chip: dict | None = None, progress: Progress = quiet):
    """Codegen for every layer: the DRAM image, the layers' (tensor-relative) steps, the
    model inputs that live pre-padded in the image (by tensor), and the image address of each
    constant operand tensor. `on_chip`: the tensors kept in the scratchpad
    (`compiler.backend.reuse`)."""
    image = ImageBuilder()
    ctx = Context(arch, options.double_buffer, dict(on_chip or {}))
    constants = {name: image.add(data) for name, data in lowered.constants.items()}
    steps, padded = [], {}
    for done, (layer, t) in enumerate(zip(lowered.layers, tiles)):
        progress("generating code for layers", done, len(lowered.layers))
        if isinstance(layer, ConvLayer) and t.packed_taps > 1:
            padded[layer.x] = padded_input(layer, t, image)
        steps.append(layer_steps(layer, t, ctx, image, padded.get(getattr(layer, "x", None))))
    return image, steps, padded, constants


def layer_steps(layer, tiles, ctx: Context, image: ImageBuilder,
                padded: PaddedInput | None = None) -> list[Step]:
    """One layer's constants (appended to `image`) and steps."""
    if isinstance(layer, HostLayer):
        return host_steps(layer, ctx)
    if isinstance(layer, ConvLayer):
        return conv_steps(layer, tiles, ctx, image, padded)
    if isinstance(layer, PoolLayer):
        return pool_steps(layer, tiles, ctx, image)
    if isinstance(layer, SoftmaxLayer):
        return softmax_steps(layer, tiles, ctx, image)
    if isinstance(layer, MatMulLayer):
        return matmul_steps(layer, tiles, ctx, image)
    if isinstance(layer, GatherLayer):
        return gather_steps(layer, ctx, image)
    return elementwise_steps(layer, tiles, ctx, image)
