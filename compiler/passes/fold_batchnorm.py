"""BatchNormalization folding into the Conv or Gemm that feeds it.

The operator table says which ops fold (`folds_into_producer`) and into which producers
(`absorbs_channel_affine`), along their weight's output-channel axis (the `weight` column).
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Type, Value
from compiler.graph.ops import OPS
from compiler.passes.util import prune_values, single_user


# A model's parameters may overflow float32 once folded (or hold a negative variance): the
# NaN or Inf is refused by name where weights are quantized, not warned about here.
@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def _fold(graph: Graph, producer: Node, bn: Node) -> tuple[Node, dict[str, Value]] | None:
    """Conv(x, W, b) → BN  becomes  Conv(x, W·s, (b − mean)·s + beta), s = gamma/√(var+eps)."""
    params = [graph.const_of(n) for n in bn.inputs[1:5]]
    weight = graph.const_of(producer.inputs[1])
    bias_name = producer.inputs[2] if len(producer.inputs) > 2 else ""
    bias = graph.const_of(bias_name) if bias_name else None
    if weight is None or any(p is None for p in params) or (bias_name and bias is None):
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    scale = gamma / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
    channels = scale.shape[0]
    if bias is not None and bias.ndim > 1:  # only a 1-D bias, one per channel, folds
        return None
    op = OPS[producer.op]
    axis = op.weight.out_axis(weight.ndim, op.bind(producer.name, producer.attrs))
    if axis is None:  # no one axis holds the output channels (a grouped ConvTranspose)
        return None
    new_weight = weight * scale.reshape([-1 if a == axis else 1 for a in range(weight.ndim)])
    # Gemm's alpha and beta fold too: the folded node multiplies by one.
    scales = {k: 1.0 for k in ("alpha", "beta") if k in op.attrs}
    if scales:
        attrs = producer.attrs
        alpha, beta_gemm = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
        new_weight, bias = new_weight * alpha, None if bias is None else bias * beta_gemm
        producer = producer.with_(attrs={**attrs, **scales})
    old_bias = np.zeros(channels) if bias is None else np.broadcast_to(bias, (channels,))
    new_bias = (old_bias - mean) * scale + beta
    dtype = weight.dtype
    w_name, b_name = f"{producer.name}/W_bn", f"{producer.name}/B_bn"
    values = {
        w_name: Value(w_name, Type(str(dtype), new_weight.shape), new_weight.astype(dtype)),
        b_name: Value(b_name, Type(str(dtype), (channels,)), new_bias.astype(dtype)),
    }
    folded = producer.with_(inputs=(producer.inputs[0], w_name, b_name), outputs=bn.outputs[:1])
    return folded, values


def fold_batchnorm(graph: Graph) -> Graph:
    """After this pass no BatchNormalization reads the sole-used output of a Conv or Gemm.

    The folded node takes the BatchNormalization's output name, so the value keeps the name
    the fp32 model gives it (profiles and per-layer reports match on it).
    """
    producers = graph.producers()
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    new_values: dict[str, Value] = {}
    origin: dict[str, str] = {}
    for node in graph.nodes:
        if not OPS[node.op].folds_into_producer or len(node.outputs) != 1:
            continue
        producer = producers.get(node.inputs[0])
        if producer is None or not OPS[producer.op].absorbs_channel_affine or \
                producer.name in replaced:
            continue
        if not single_user(graph, node.inputs[0]):
            continue
        if graph.type_of(producer.outputs[0]).shape[1] != graph.type_of(node.inputs[1]).shape[0]:
            continue  # the scale is not one per output channel
        result = _fold(graph, producer, node)
        if result is None:
            continue
        replaced[producer.name], values = result
        new_values.update(values)
        origin[node.outputs[0]] = node.outputs[0]
        dropped.add(node.name)
    if not replaced:
        return graph
    nodes = [replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return prune_values(graph, nodes, new_values)
