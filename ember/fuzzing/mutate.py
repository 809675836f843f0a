"""Mutators: each takes a seed file's bytes and a `random.Random` and returns a mutated copy.

Every decision is drawn from `rng`, so a seed and a `random.Random(n)` reproduce a case, and
hypothesis (`st.randoms()`) can drive and shrink the same functions. The mutations are those a
careless or hostile writer makes: bytes flipped, cut or repeated; a JSON or TOML value replaced
by an extreme one, deleted, or swapped for another part of the same file; an ONNX field given
a value the writer never would; a `.npy` header that lies about the data. Where a file carries
a checksum (programs), it is recomputed, so that the mutation reaches the reader's checks behind
it.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import random
import struct
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

INTS = (0, 1, -1, 2, 3, 7, 8, 15, 16, 17, 127, 128, 255, 256, 4095, 65535, 65536, 2**31 - 1,
        2**31, 2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64, -2**31, -2**63, 10**12, 10**30)
INT64S = tuple(v for v in INTS if -2**63 <= v < 2**63)  # what an ONNX int field holds
FLOATS = (0.0, -0.0, 0.5, -1.5, 1e-45, 1e-300, 3.4e38, 1e300, math.inf, -math.inf, math.nan)
STRINGS = ("", "x", "int4", "float64", "../../etc/passwd", "\u00e9\u0000", "a" * 300)


def interesting_value(rng: random.Random, like: Any = None) -> Any:
    """An extreme JSON value; half the time of the same kind as `like`."""
    if like is not None and rng.random() < 0.5:
        if isinstance(like, bool):
            return not like
        if isinstance(like, int):
            return rng.choice((rng.choice(INTS), like + rng.choice((-1, 1)), -like, like * 2,
                               like * 1000, float(like)))
        if isinstance(like, float):
            return rng.choice((rng.choice(FLOATS), -like, like * 1e30, like / 1e30, int(like)
                               if math.isfinite(like) else 0))
        if isinstance(like, str):
            return rng.choice(STRINGS + (like + "x", like[:-1]))
        if isinstance(like, list):
            return rng.choice(([], like * 2, like[:-1], like[::-1]))
    return rng.choice((None, True, rng.choice(INTS), rng.choice(FLOATS), rng.choice(STRINGS),
                       [], [rng.choice(INTS)], {}, {"x": 1}))


def _containers(node: Any, rng: random.Random) -> tuple[Any, Any]:
    """A random walk from the root: (container, key or index) of the element it stops at. Each
    level is as likely as the next, however many elements a list holds (a profile's
    histograms would otherwise take every mutation)."""
    parent, key = None, None
    while isinstance(node, (dict, list)) and node and (parent is None or rng.random() < 0.85):
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        parent, node = node, node[key]
    return parent, key


def _subtrees(node: Any, found: list) -> list:
    found.append(node)
    if isinstance(node, dict):
        for v in node.values():
            _subtrees(v, found)
    elif isinstance(node, list):
        for v in node[:8]:
            _subtrees(v, found)
    return found


def mutate_json_value(doc: Any, rng: random.Random) -> Any:
    """`doc` (parsed JSON) with one element replaced, deleted, duplicated or swapped for another
    part of the same document."""
    doc = copy.deepcopy(doc)
    parent, key = _containers(doc, rng)
    if parent is None:
        return interesting_value(rng, doc)
    action = rng.randrange(6)
    if action == 0:  # delete
        del parent[key]
    elif action == 1 and isinstance(parent, list):  # duplicate
        parent.insert(key, copy.deepcopy(parent[key]))
    elif action == 2:  # splice in another part of the document
        parent[key] = copy.deepcopy(rng.choice(_subtrees(doc, [])))
    elif action == 3 and isinstance(parent, dict):  # an unknown key beside it
        parent[rng.choice(STRINGS) + "_"] = interesting_value(rng)
    else:
        parent[key] = interesting_value(rng, parent[key])
    return doc


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to four byte-level edits: bits flipped, bytes set, a range cut, repeated or
    inserted, or the end cut off."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            out += bytes([rng.randrange(256)])
            continue
        at = rng.randrange(len(out))
        span = min(len(out) - at, rng.choice((1, 2, 4, 8, 64, 1024)))
        action = rng.randrange(6)
        if action == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif action == 1:
            out[at:at + span] = bytes([rng.choice((0, 0xFF, 0x7F, 0x80))]) * span
        elif action == 2:
            del out[at:at + span]
        elif action == 3:
            out[at:at] = out[at:at + span]
        elif action == 4:
            out[at:at] = rng.randbytes(span)
        else:
            del out[at:]
    return bytes(out)


def _dump_json(doc: Any) -> bytes:
    # NaN and Infinity are what Python's json writes for them, so a reader must refuse them.
    return json.dumps(doc, allow_nan=True).encode()


def mutate_json_file(data: bytes, rng: random.Random) -> bytes:
    """A JSON file (a profile, a report) mutated in its structure, or now and then in its
    bytes."""
    if rng.random() < 0.1:
        return mutate_bytes(data, rng)
    doc = json.loads(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        doc = mutate_json_value(doc, rng)
    return _dump_json(doc)


# The `.ember` layout (simulator.program): fixed fields, JSON header, instruction words, a u32
# source-node index per instruction, the DRAM image, a SHA-256 of everything before it.
_FIXED = struct.Struct("<8sIIQQQ")
_DIGEST = 32


def mutate_program(data: bytes, rng: random.Random) -> bytes:
    """A program with its header, instruction words, source-node indices, DRAM image or fixed
    fields changed, and (nearly always) its lengths and checksum recomputed to match."""
    magic, version, word_bytes, header_len, count, image_len = _FIXED.unpack_from(data)
    at = _FIXED.size
    header = data[at:at + header_len]
    words = bytearray(data[at + header_len:at + header_len + count * word_bytes])
    at += header_len + count * word_bytes
    node_ids = bytearray(data[at:at + 4 * count])
    image = bytearray(data[at + 4 * count:at + 4 * count + image_len])
    fixed = [magic, version, word_bytes, None, count, image_len]
    part = rng.choice(("header", "header", "words", "words", "words", "nodes", "image",
                       "fixed", "raw"))
    if part == "raw":  # the checksum no longer matches: refused before anything is read
        return mutate_bytes(data, rng)
    if part == "header":
        header = _dump_json(mutate_json_value(json.loads(header), rng)) \
            if rng.random() < 0.9 else mutate_bytes(header, rng)
    elif part == "words" and words:
        for _ in range(rng.randint(1, 3)):
            i, j = rng.randrange(count), rng.randrange(count)
            word = slice(i * word_bytes, (i + 1) * word_bytes)
            if rng.random() < 0.7:  # flip bits (fields, opcode, dependency flags)
                for _ in range(rng.randint(1, 4)):
                    bit = rng.randrange(8 * word_bytes)
                    words[i * word_bytes + bit // 8] ^= 1 << bit % 8
            elif rng.random() < 0.5:  # one instruction copied over another
                words[word] = words[j * word_bytes:(j + 1) * word_bytes]
            else:  # a field set to its extreme
                words[word] = rng.choice((b"\xff", b"\x00")) * word_bytes \
                    if rng.random() < 0.2 else mutate_bytes(bytes(words[word]), rng)[
                        :word_bytes].ljust(word_bytes, b"\0")
    elif part == "nodes" and node_ids:
        i = rng.randrange(count)
        node_ids[4 * i:4 * i + 4] = struct.pack("<I", rng.choice((1, 2, 1000, 2**31, 2**32 - 2)))
    elif part == "image" and image:
        image = bytearray(mutate_bytes(bytes(image), rng)[:len(image)].ljust(len(image), b"\0"))
    elif part == "fixed":
        k = rng.choice((1, 2, 4, 5))
        fixed[k] = rng.choice(INTS) % 2**(32 if k < 3 else 64)
    fixed[3] = len(header)
    body = _FIXED.pack(*fixed) + bytes(header) + bytes(words) + bytes(node_ids) + bytes(image)
    return body + hashlib.sha256(body).digest()


def mutate_toml(data: bytes, rng: random.Random) -> bytes:
    """An architecture TOML file with a value replaced by an extreme literal, a line deleted,
    repeated or renamed, or its bytes changed."""
    if rng.random() < 0.1:
        return mutate_bytes(data, rng)
    lines = data.decode().splitlines()
    settings = [i for i, line in enumerate(lines) if "=" in line and not line.startswith("#")]
    i = rng.choice(settings)
    key = lines[i].split("=")[0].strip()
    action = rng.choice((0, 1, 2, 3, 4, 4, 4, 4, 5, 5, 5))
    if action == 0:
        del lines[i]
    elif action == 1:
        lines.insert(i, lines[i])
    elif action == 2:
        lines[i] = f"{key}x = 1"
    elif action == 3:  # a table header moved or repeated
        tables = [j for j, line in enumerate(lines) if line.startswith("[")]
        lines.insert(i, lines[rng.choice(tables)])
    elif action == 4:  # a plausible number: halved, doubled, nudged
        value = lines[i].split("=", 1)[1].split("#")[0].strip()
        try:
            number = float(value)
        except ValueError:
            number = 1.0
        factor = rng.choice((0.5, 2, 4, 1 / 16, 3, 0.9))
        lines[i] = f"{key} = " + (f"{int(number * factor)}" if number == int(number)
                                  else f"{number * factor}")
    else:
        literal = rng.choice((str(rng.choice(INTS)), "nan", "inf", "-inf", "1e400", "0.5",
                              "-0.0", '"x"', "true", "[]", "[1, 2]", "{}", "1979-05-27",
                              '"weight_stationary"', '["LUT", "LUT"]', '["FROB"]'))
        lines[i] = f"{key} = {literal}"
    return ("\n".join(lines) + "\n").encode()


# NumPy's .npy: magic, version, header length, a Python dict literal, then the raw data.
_DESCRS = ("<f4", "<f8", "<f2", ">f4", "<i8", "<i4", "|i1", "|u1", "|b1", "<c8", "<U3", "|S4",
           "|O", "|V8", "<M8[s]", [("a", "<f4")], "'<f4'", "x")


def _npy_parts(data: bytes) -> tuple[dict, bytes] | None:
    try:
        f = io.BytesIO(data)
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    except Exception:  # noqa: BLE001 - an already mutated seed: fall back to bytes
        return None
    return ({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran,
             "shape": shape}, data[f.tell():])


def _npy(header: dict | str, payload: bytes) -> bytes:
    text = header if isinstance(header, str) else repr(header)
    text += " " * (-(len(text) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1") + payload


def mutate_npy(data: bytes, rng: random.Random) -> bytes:
    """A `.npy` file whose header lies (shape, dtype, order, or not a dict at all) or whose
    data is cut, extended or filled with NaN, infinities and extremes."""
    parts = _npy_parts(data)
    if parts is None or rng.random() < 0.1:
        return mutate_bytes(data, rng)
    header, payload = parts
    action = rng.randrange(7)
    if action == 0:  # a dimension changed, added or dropped
        shape = list(header["shape"])
        if shape and rng.random() < 0.7:
            shape[rng.randrange(len(shape))] = rng.choice((0, 1, 2, 3, 10, 10**6, 10**12,
                                                           2**62, -1))
        elif shape and rng.random() < 0.5:
            del shape[rng.randrange(len(shape))]
        else:
            shape.insert(rng.randrange(len(shape) + 1), rng.choice((1, 2, 10)))
        header["shape"] = tuple(shape)
    elif action == 1:
        descr = rng.choice(_DESCRS)
        header["descr"] = eval(descr) if descr.startswith("[") else descr
    elif action == 2:
        header["fortran_order"] = not header["fortran_order"]
    elif action == 3:  # not the dict numpy writes
        header = rng.choice(("{}", "[1]", "{'descr': '<f4', 'shape': (2,)}", "1/0",
                             repr(header)[:-3], ("{'descr': '<f4', 'fortran_order': False, "
                             "'shape': (1,), 'x': 1}"), "{" * 200))
    elif action == 4:
        payload = payload[:rng.randrange(len(payload) + 1)] if payload else payload
    elif action == 5:
        payload += rng.randbytes(rng.choice((1, 4, 64)))
    else:  # NaN, infinities and extremes in the data, in the file's own element type
        payload = _poison(payload, header["descr"], rng)
    return _npy(header, payload)


def _poison(payload: bytes, descr: Any, rng: random.Random) -> bytes:
    try:
        values = np.frombuffer(payload, np.dtype(descr)).copy()
    except (TypeError, ValueError):
        return payload
    if values.size == 0 or values.dtype.kind not in "fiub":
        return payload
    picks = [rng.randrange(values.size) for _ in range(rng.randint(1, 8))]
    info = np.finfo(values.dtype) if values.dtype.kind == "f" else np.iinfo(values.dtype) \
        if values.dtype.kind in "iu" else None
    for i in picks:
        if values.dtype.kind == "f":
            values[i] = rng.choice((np.nan, np.inf, -np.inf, info.max, info.min, 1e-40))
        elif info is not None:
            values[i] = rng.choice((info.min, info.max, 0, -1 if info.min < 0 else 1))
        else:
            values[i] = not values[i]
    return values.tobytes()


def mutate_npz(data: bytes, rng: random.Random) -> bytes:
    """An `.npz` with one member mutated as a `.npy`, renamed, dropped or added, or the zip
    itself damaged."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = [(info.filename, z.read(info)) for info in z.infolist()]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return mutate_bytes(data, rng)
    action = rng.randrange(8) if members else 7
    if action <= 3:
        k = rng.randrange(len(members))
        members[k] = (members[k][0], mutate_npy(members[k][1], rng))
    elif action == 4:
        k = rng.randrange(len(members))
        members[k] = (rng.choice(("x.npy", "input", "labels.npy", "/abs.npy", "../up.npy",
                                  members[k][0] + "x")), members[k][1])
    elif action == 5:
        del members[rng.randrange(len(members))]
    elif action == 6:
        members.append(rng.choice(members))
    else:
        return mutate_bytes(data, rng)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", rng.choice((zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED))) as z, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a member repeated: "Duplicate name"
        for name, body in members:
            z.writestr(name, body)
    return out.getvalue()


def mutate_onnx(data: bytes, rng: random.Random) -> bytes:
    """An ONNX model changed field by field (dims, element types, attributes, operator types,
    node wiring, initializers, opsets, external data) or, now and then, byte by byte."""
    import onnx

    from compiler.graph.ops import OPS

    if rng.random() < 0.15:
        return mutate_bytes(data, rng)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError: an already mutated seed
        return mutate_bytes(data, rng)
    graph = model.graph
    for _ in range(rng.choice((1, 1, 2, 3))):
        _ONNX_MUTATIONS[rng.randrange(len(_ONNX_MUTATIONS))](model, graph, rng, list(OPS))
    if rng.random() < 0.5:
        # Recorded shapes dropped, so that a mutation that changes shapes (a stride, an input
        # size) reaches ember rather than stopping at the checker's inference against them.
        del graph.value_info[:]
        for output in graph.output:
            for i, dim in enumerate(output.type.tensor_type.shape.dim):
                dim.dim_param = f"d{i}"
    return model.SerializeToString()


def _value_infos(graph):
    return list(graph.input) + list(graph.output) + list(graph.value_info)


def _dim(model, graph, rng, ops):
    infos = [v for v in _value_infos(graph) if v.type.tensor_type.shape.dim]
    if not infos:
        return
    dims = rng.choice(infos).type.tensor_type.shape.dim
    if rng.random() < 0.2:
        del dims[rng.randrange(len(dims))]
        return
    d = dims[rng.randrange(len(dims))]
    if rng.random() < 0.3:
        d.dim_param = rng.choice(("N", "", "batch"))
    else:
        d.dim_value = rng.choice((0, 1, 2, 3, 5, 7, 16, 1000, 10**6, 10**12, 2**62, -1))


def _elem_type(model, graph, rng, ops):
    targets = _value_infos(graph)
    if targets:
        rng.choice(targets).type.tensor_type.elem_type = rng.randrange(0, 25)


def _attribute(model, graph, rng, ops):
    nodes = [n for n in graph.node if n.attribute]
    if not nodes:
        return
    node = rng.choice(nodes)
    attr = node.attribute[rng.randrange(len(node.attribute))]
    action = rng.randrange(5)
    if action == 0:
        node.attribute.remove(attr)
    elif action == 1 and attr.ints:
        attr.ints[rng.randrange(len(attr.ints))] = rng.choice(INT64S + (0, 1, 1, 2, 2, 3, 3))
    elif action == 2 and attr.ints:
        del attr.ints[rng.randrange(len(attr.ints))]
    elif action == 3 and attr.type == 2 and rng.random() < 0.5:  # a plausible integer
        attr.i = rng.choice((-1, 0, 1, 2, 3))
    elif action == 3:
        attr.i = rng.choice(INT64S)
        attr.f = rng.choice(FLOATS)
        attr.type = rng.choice((1, 2, 3, 6, 7))
    else:
        node.attribute.add(name=rng.choice(("axis", "group", "pads", "strides", "x",
                                            "auto_pad", "dilations", "perm")),
                           type=rng.choice((1, 2, 3, 7)), i=rng.choice(INT64S),
                           s=b"SAME_UPPER", ints=[rng.choice((0, 1, 2, -1))] * rng.randint(0, 5))


def _op_type(model, graph, rng, ops):
    if graph.node:
        node = graph.node[rng.randrange(len(graph.node))]
        node.op_type = rng.choice(ops + ["Frobnicate", ""])
        if rng.random() < 0.1:
            node.domain = rng.choice(("com.microsoft", "ai.onnx.ml", "x"))


def _wiring(model, graph, rng, ops):
    if not graph.node:
        return
    names = [n for node in graph.node for n in (*node.input, *node.output)] + \
        [i.name for i in graph.initializer] + ["", "nowhere"]
    node = graph.node[rng.randrange(len(graph.node))]
    action = rng.randrange(5)
    if action == 0 and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice(names)
    elif action == 1 and node.input:
        del node.input[rng.randrange(len(node.input))]
    elif action == 2:
        node.input.append(rng.choice(names))
    elif action == 3 and node.output:
        node.output[rng.randrange(len(node.output))] = rng.choice(names)
    else:  # a node removed, repeated or moved
        k = rng.randrange(len(graph.node))
        copy_ = onnx_copy(graph.node[k])
        if rng.random() < 0.5:
            del graph.node[k]
        if rng.random() < 0.5:
            graph.node.insert(rng.randrange(len(graph.node) + 1), copy_)


def onnx_copy(message):
    clone = type(message)()
    clone.CopyFrom(message)
    return clone


def _initializer(model, graph, rng, ops):
    if not graph.initializer:
        return
    t = graph.initializer[rng.randrange(len(graph.initializer))]
    action = rng.randrange(7)
    if action == 0 and t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice((0, 1, 2, 3, 10**6, 10**12, -1))
    elif action == 1:
        t.data_type = rng.randrange(0, 25)
    elif action == 2 and t.raw_data:
        t.raw_data = t.raw_data[:rng.randrange(len(t.raw_data) + 1)]
    elif action == 3 and t.raw_data:
        values = np.frombuffer(t.raw_data, np.float32).copy() \
            if t.data_type == 1 and len(t.raw_data) % 4 == 0 else None
        if values is not None and values.size:
            values[rng.randrange(values.size)] = rng.choice((np.nan, np.inf, -np.inf, 3e38,
                                                             1e-40))
            t.raw_data = values.tobytes()
    elif action == 4:  # data that points outside the model's folder, or nowhere
        t.data_location = 1
        del t.external_data[:]
        t.external_data.add(key="location", value=rng.choice(("../../etc/passwd", "w.bin",
                                                               "/dev/zero", "")))
        t.external_data.add(key="length", value=str(rng.choice((4, 10**12))))
    elif action == 5:
        t.dims.append(rng.choice((1, 2)))
    else:
        t.name = rng.choice([i.name for i in graph.input] + [n for node in graph.node
                                                             for n in node.output] + ["x"])


def _opset(model, graph, rng, ops):
    if rng.random() < 0.5 and model.opset_import:
        model.opset_import[0].version = rng.choice((1, 6, 7, 9, 11, 13, 19, 21, 22, 10**9))
    else:
        model.ir_version = rng.choice((0, 1, 3, 7, 10, 11, 10**6))


def _graph_io(model, graph, rng, ops):
    action = rng.randrange(3)
    io_ = graph.input if action != 2 or not graph.output else graph.output
    if not io_:
        return
    if action == 0:
        del io_[rng.randrange(len(io_))]
    else:
        io_.add().CopyFrom(io_[rng.randrange(len(io_))])


_ONNX_MUTATIONS: list[Callable] = [_dim, _dim, _elem_type, _attribute, _attribute, _op_type,
                                   _wiring, _wiring, _initializer, _initializer, _opset,
                                   _graph_io]
