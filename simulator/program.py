"""The `.ember` program file: what the compiler writes and the simulator runs.

Layout (all integers little-endian):

    offset 0   8 bytes  magic b"EMBERPRG"
           8   u32      format version (FORMAT_VERSION)
          12   u32      bytes per instruction word (isa.WORD_BYTES)
          16   u64      length of the JSON header
          24   u64      number of instructions
          32   u64      length of the DRAM image
          40   ...      JSON header (UTF-8, sorted keys): "arch" (the fully resolved arch dict),
                        "inputs"/"outputs" (IOBinding records), "metadata" (tool version and the
                        option record), "nodes" (source graph node names), "host_segments",
                        "model_macs" (null when not recorded)
                  ...   instruction words
                  ...   u32 per instruction: index into "nodes" (0xFFFFFFFF: none)
                  ...   DRAM image: initial DRAM contents from address 0 (weights, parameters)
        end - 32        SHA-256 of every byte before it

Same Program -> byte-identical file, written atomically (temporary name, then os.replace).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator import isa, numerics
from simulator.arch import Arch
from simulator.errors import SimulatorError
from simulator.units import dram_span
from simulator.units import host as host_unit

MAGIC = b"EMBERPRG"
FORMAT_VERSION = 2  # 2: model_macs a typed header field; the arch record has no memory banks
_FIXED = struct.Struct("<8sIIQQQ")
_DIGEST = 32
_NO_NODE = 0xFFFFFFFF


@dataclass(frozen=True)
class IOBinding:
    """A program input or output: where it lives in DRAM and how it is quantized.

    The tensor is stored at byte address `dram` with byte strides `strides` (row-major
    contiguous when empty); real = scale * (q - zero_point). A "float32" binding (a value a
    host segment reads or writes in fp32) holds real values: scale and zero_point are unused;
    an "int32" binding holds integer indices (a model's token ids, which the indexed DMA
    reads), never quantized: scale 1 and zero point 0. The machine's memories hold int8 codes, so a uint8 tensor is stored as the int8 code q - 128
    (its top bit flipped): the same real value with zero point zero_point - 128, as the compiler
    lowers uint8 activations (`compiler.passes.offset_uint8`). An "int16" binding (an input
    the array reads at 16 bits: `quantizer.wide`) is stored as two planes of int8 codes
    (`numerics.split_wide`), each at the strides given: the high bytes at `dram`, the low
    bytes `plane` bytes after them.
    """

    name: str
    dram: int
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    dtype: str = "int8"
    strides: tuple[int, ...] = ()
    plane: int = 0  # int16: bytes from the high plane to the low one

    @property
    def item_bytes(self) -> int:
        """Bytes an element takes in each plane: an int16 value's planes hold int8 codes."""
        return 1 if self.dtype == "int16" else np.dtype(self.dtype).itemsize

    @property
    def byte_strides(self) -> tuple[int, ...]:
        if self.strides:
            return self.strides
        # Python integers: a forged shape must not wrap around int64 and pass the bounds check.
        item = self.item_bytes
        return tuple(item * math.prod(self.shape[i + 1:]) for i in range(len(self.shape)))

    @property
    def size_bytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def planes(self) -> tuple[int, ...]:
        """The DRAM address of each plane: one, or an int16 value's high and low."""
        return (self.dram, self.dram + self.plane) if self.dtype == "int16" else (self.dram,)

    def span(self) -> tuple[int, int]:
        """The DRAM bytes [lo, hi) the binding reaches, every plane's."""
        spans = [dram_span(address, self.shape, self.byte_strides, self.item_bytes)
                 for address in self.planes()]
        return min(lo for lo, _ in spans), max(hi for _, hi in spans)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Host-side input quantization exactly as ONNX QuantizeLinear (and the quantizer's
        reference) computes it: x / scale in float32, rounded half to even. A float32 binding
        takes the values as they are."""
        if self.dtype == "float32":
            return np.asarray(x, np.float32)
        if self.dtype == "int32":
            return self.indices(x)
        return numerics.quantize(x, self.scale, self.zero_point, dtype=self.dtype)

    def indices(self, x: np.ndarray) -> np.ndarray:
        """An int32 binding's integers as they are; floats, or integers past int32, are an
        error naming the input."""
        x = np.asarray(x)
        if x.dtype.kind not in "iu":
            raise SimulatorError(f"input {self.name!r}: expected integers (int32 or int64 "
                                 f"indices), got {x.dtype}")
        lo, hi = numerics.RANGES["int32"]
        outside = x[(x < lo) | (x > hi)]
        if outside.size:
            raise SimulatorError(f"input {self.name!r}: value {int(outside[0])} does not fit "
                                 f"int32")
        return x.astype(np.int32)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """Host-side output dequantization: the product in float64, rounded once to float32."""
        if self.dtype == "float32":
            return np.asarray(q, np.float32)
        return numerics.dequantize(q, self.scale, self.zero_point,
                                   arithmetic=np.float64).astype(np.float32)

    def to_dict(self) -> dict:
        return {"name": self.name, "dram": self.dram, "shape": list(self.shape),
                "scale": self.scale, "zero_point": self.zero_point, "dtype": self.dtype,
                "strides": list(self.strides), **({"plane": self.plane} if self.plane else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "IOBinding":
        return cls(name=d["name"], dram=d["dram"], shape=tuple(d["shape"]), scale=d["scale"],
                   zero_point=d["zero_point"], dtype=d["dtype"], strides=tuple(d["strides"]),
                   plane=d.get("plane", 0))


BINDING_DTYPES = ("int8", "uint8", "int16", "int32", "float32")
# The codes each quantized dtype holds: a binding's zero point is one of them (an int16
# value's is 0: `quantizer.wide` makes them symmetric).
_CODE_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (0, 0)}
_MAX_RANK = 32  # numpy's own limit on dimensions
# Python floats: a forged scale may be an integer of any size, which numpy's float32 would
# overflow (with a warning) to compare.
_SCALE_RANGE = (float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max))
# What a host segment record must hold (the runner may add keys; "graph" is its business).
_SEGMENT_KEYS = {"name": str, "nodes": list, "inputs": list, "outputs": list, "flops": int}
# Every key of the program header and its JSON type (model_macs may also be null).
_HEADER_KEYS = {"arch": dict, "inputs": list, "outputs": list, "metadata": dict, "nodes": list,
                "host_segments": list, "model_macs": int}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def binding_from_dict(d, kind: str) -> IOBinding:
    """An IOBinding record checked key by key (a forged header holds anything JSON can):
    SimulatorError naming the `kind` of binding ("input", "output") and the key otherwise."""
    if not isinstance(d, dict):
        raise SimulatorError(f"a malformed {kind} binding: expected a record (a dict), got "
                             f"{type(d).__name__}")
    keys = set(IOBinding.__dataclass_fields__)
    if set(d) | {"plane"} != keys:  # plane is written only for int16
        missing, unknown = sorted(keys - set(d) - {"plane"}), sorted(set(d) - keys)
        raise SimulatorError(f"a malformed {kind} binding: " + (
            f"missing key {missing[0]!r}" if missing else f"unknown key {unknown[0]!r}"))
    if not isinstance(d["name"], str):
        raise SimulatorError(f"a malformed {kind} binding: name = {d['name']!r:.60}: expected "
                             f"a string")
    where = f"{kind} {d['name']!r}"
    dtype = d["dtype"]
    if dtype not in BINDING_DTYPES:
        raise SimulatorError(f"{where} has dtype {dtype!r:.60}: expected one of "
                             f"{', '.join(BINDING_DTYPES)}")
    low, high = _CODE_RANGE.get(dtype, (-(1 << 31), (1 << 31) - 1))
    shape, strides = d["shape"], d["strides"]
    checks = [
        # Ranges (where the binding reaches, sizes non-negative, one stride per dimension) are
        # `Program._check_binding`'s, as for a binding built in memory.
        ("dram", _is_int(d["dram"]), "an integer"),
        ("shape", isinstance(shape, list) and len(shape) <= _MAX_RANK
         and all(_is_int(n) for n in shape), f"a list of at most {_MAX_RANK} integers"),
        ("strides", isinstance(strides, list) and all(_is_int(s) for s in strides),
         "a list of integers"),
        # The host quantizes in float32: a scale that is 0 or inf there divides by zero.
        ("scale", isinstance(d["scale"], (int, float)) and not isinstance(d["scale"], bool)
         and _SCALE_RANGE[0] <= d["scale"] <= _SCALE_RANGE[1],
         f"a positive, finite float32 number in [{_SCALE_RANGE[0]:.3g}, "
         f"{_SCALE_RANGE[1]:.3g}]"),
        ("zero_point", _is_int(d["zero_point"]) and low <= d["zero_point"] <= high,
         f"an integer in [{low}, {high}]"),
        # Both planes of an int16 value, apart: the low one after the high one's bytes.
        ("plane", _is_int(d.get("plane", 0)) and (d.get("plane", 0) > 0) == (dtype == "int16"),
         "a positive integer for an int16 binding, absent otherwise"),
    ]
    for key, ok, expected in checks:
        if not ok:
            raise SimulatorError(f"{where}: {key} = {d.get(key)!r:.60}: expected {expected}")
    return IOBinding.from_dict(d)


def segment_bindings(segment: dict) -> tuple[tuple[IOBinding, ...], tuple[IOBinding, ...]]:
    """The input and output bindings of a host segment record."""
    return (tuple(binding_from_dict(d, "input") for d in segment["inputs"]),
            tuple(binding_from_dict(d, "output") for d in segment["outputs"]))


@dataclass(frozen=True)
class Program:
    """Everything the machine needs. `source[i]` names the graph node instruction i implements
    ("" for none); per-layer reports group by it.

    `host_segments` are the subgraphs the host CPU runs (HOST instructions name them by
    index): JSON-serializable dicts with "name", "nodes" (graph node names), "inputs" and
    "outputs" (IOBinding records: where each value lives in DRAM), "graph" (the host runner's
    business) and "flops".

    `model_macs` are the model's MACs, which the roofline counts (`bound`): a grouped
    convolution's block-diagonal zero blocks, which the array multiplies too, excluded. None
    (a hand-written program) lets the MACs issued to the array stand in."""

    arch: Arch
    instructions: tuple[isa.Insn, ...]
    dram_image: bytes = b""
    inputs: tuple[IOBinding, ...] = ()
    outputs: tuple[IOBinding, ...] = ()
    source: tuple[str, ...] = ()
    metadata: dict = field(default_factory=dict)
    host_segments: tuple[dict, ...] = ()
    model_macs: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "instructions", tuple(self.instructions))
        object.__setattr__(self, "source",
                           tuple(self.source) or ("",) * len(self.instructions))
        if len(self.source) != len(self.instructions):
            raise SimulatorError(f"program: {len(self.source)} source names for "
                                 f"{len(self.instructions)} instructions")
        ends = [i for i, insn in enumerate(self.instructions) if insn.op is isa.END]
        if ends != [len(self.instructions) - 1]:
            where = f"at {ends}" if ends else "nowhere"
            raise SimulatorError(f"program: expected exactly one END, as the last instruction "
                                 f"(found {where} among {len(self.instructions)} instructions)")
        for binding in self.inputs + self.outputs:
            self._check_binding(binding, f"I/O {binding.name!r}")
        object.__setattr__(self, "host_segments", tuple(self.host_segments))
        for k, segment in enumerate(self.host_segments):
            self._check_segment(k, segment)
        count = len(self.host_segments)
        for i, insn in enumerate(self.instructions):
            if insn.op is isa.HOST and insn.args["segment"] >= count:
                raise SimulatorError(f"program: instruction {i} ({isa.disassemble(insn)}) names "
                                     f"host segment {insn.args['segment']}, but the program has "
                                     f"{count} host segment(s)")
        if self.model_macs is not None and (not isinstance(self.model_macs, int)
                                            or isinstance(self.model_macs, bool)
                                            or self.model_macs < 0):
            raise SimulatorError(f"program: model_macs = {self.model_macs!r}: expected a "
                                 f"non-negative integer or None")
        if len(self.dram_image) > self.arch.dram.size_bytes:
            raise SimulatorError(f"program: DRAM image of {len(self.dram_image)} bytes exceeds "
                                 f"DRAM of {self.arch.dram.size_bytes} bytes")

    @property
    def compulsory_dram_bytes(self) -> int:
        """The DRAM bytes every run moves: the image read once, each input read and each output
        written once."""
        return len(self.dram_image) + sum(b.size_bytes for b in self.inputs + self.outputs)

    def roofline_macs(self, issued_macs: int) -> int:
        """The MACs the roofline counts: the model's, or the `issued_macs` when not recorded."""
        return issued_macs if self.model_macs is None else self.model_macs

    def bound(self, issued_macs: int, dram_traffic: int) -> tuple[int, str]:
        """The program's roofline (`Arch.roofline`) and what sets it: its `roofline_macs` on the
        array, the compulsory DRAM bytes (no more than the `dram_traffic` a run moves: what is
        never read need not be), and its HOST instructions one after another."""
        host = sum(host_unit.roof_cycles(self.arch, insn) for insn in self.instructions
                   if insn.op is isa.HOST)
        return self.arch.roofline(self.roofline_macs(issued_macs),
                                  min(self.compulsory_dram_bytes, dram_traffic),
                                  host_cycles=host)

    def _check_binding(self, binding: IOBinding, what: str) -> None:
        """Every byte the binding reaches, at both ends, inside DRAM: the machine builds strided
        views on it."""
        try:
            lo, hi = binding.span()
        except SimulatorError as err:
            raise SimulatorError(f"program: {what}: {err}") from None
        if binding.dram < 0 or lo < 0 or hi > self.arch.dram.size_bytes:
            raise SimulatorError(f"program: {what} at DRAM {binding.dram} does not fit in "
                                 f"{self.arch.dram.size_bytes} bytes: it reaches bytes "
                                 f"[{lo}, {hi})")
        # Overlapping (zero-stride) elements fit in few bytes but are copied out one by one.
        if binding.size_bytes > self.arch.dram.size_bytes:
            raise SimulatorError(f"program: {what} of shape {list(binding.shape)} holds "
                                 f"{binding.size_bytes} bytes, more than the "
                                 f"{self.arch.dram.size_bytes} bytes of DRAM")

    def _check_segment(self, k: int, segment) -> None:
        where = f"program: host segment {k}"
        if not isinstance(segment, dict):
            raise SimulatorError(f"{where}: expected a dict, got {type(segment).__name__}")
        if isinstance(segment.get("name"), str):
            where += f" ({segment['name']!r})"
        for key, kind in _SEGMENT_KEYS.items():
            if not isinstance(segment.get(key), kind) or isinstance(segment.get(key), bool):
                raise SimulatorError(f"{where}: key {key!r} = {segment.get(key)!r}: expected "
                                     f"a {kind.__name__}")
        if "graph" not in segment:
            raise SimulatorError(f"{where}: missing key 'graph'")
        if segment["flops"] < 0:
            raise SimulatorError(f"{where}: flops = {segment['flops']}: expected >= 0")
        if not all(isinstance(n, str) for n in segment["nodes"]):
            raise SimulatorError(f"{where}: key 'nodes': expected a list of strings")
        if not isinstance(segment["graph"], dict):
            raise SimulatorError(f"{where}: key 'graph' = {segment['graph']!r:.60}: expected a "
                                 f"serialized graph (a dict)")
        try:
            inputs, outputs = segment_bindings(segment)
        except SimulatorError as err:
            raise SimulatorError(f"{where}: {err}") from None
        for kind, bindings in (("input", inputs), ("output", outputs)):
            for b in bindings:
                self._check_binding(b, f"host segment {k} {kind} {b.name!r}")

    def to_bytes(self) -> bytes:
        nodes = list(dict.fromkeys(name for name in self.source if name))
        index = {name: i for i, name in enumerate(nodes)}
        header = json.dumps({
            "arch": self.arch.to_dict(),
            "inputs": [b.to_dict() for b in self.inputs],
            "outputs": [b.to_dict() for b in self.outputs],
            "metadata": self.metadata,
            "nodes": nodes,
            "host_segments": list(self.host_segments),
            "model_macs": self.model_macs,
        }, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        words = isa.encode_words(self.instructions)
        node_ids = np.array([index[n] if n else _NO_NODE for n in self.source], "<u4").tobytes()
        body = b"".join([
            _FIXED.pack(MAGIC, FORMAT_VERSION, isa.WORD_BYTES, len(header),
                        len(self.instructions), len(self.dram_image)),
            header, words, node_ids, bytes(self.dram_image)])
        return body + hashlib.sha256(body).digest()

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | Path) -> "Program":
        try:
            data = Path(path).read_bytes()
        except OSError as err:
            raise SimulatorError(f"{path}: cannot read the program: {err.strerror}") from None
        return cls.from_bytes(data, str(path))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<program>") -> "Program":
        if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
            raise SimulatorError(f"{name}: not an ember program (no {MAGIC.decode()} magic)")
        if len(data) < _FIXED.size + _DIGEST:
            raise SimulatorError(f"{name}: truncated: {len(data)} bytes, shorter than the header")
        _, version, word_bytes, header_len, count, image_len = _FIXED.unpack_from(data)
        if version != FORMAT_VERSION:
            raise SimulatorError(f"{name}: format version {version}, but this simulator reads "
                                 f"version {FORMAT_VERSION}; recompile the model")
        if word_bytes != isa.WORD_BYTES:
            raise SimulatorError(f"{name}: {word_bytes}-byte instruction words, expected "
                                 f"{isa.WORD_BYTES}")
        expected = _FIXED.size + header_len + count * (word_bytes + 4) + image_len + _DIGEST
        if len(data) != expected:
            what = "truncated" if len(data) < expected else "corrupt (trailing bytes)"
            raise SimulatorError(f"{name}: {what}: {len(data)} bytes, the header says {expected}")
        if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
            raise SimulatorError(f"{name}: corrupt: the SHA-256 checksum does not match")
        offset = _FIXED.size
        header = _read_header(data[offset:offset + header_len], name)
        offset += header_len
        words = data[offset:offset + count * word_bytes]
        offset += count * word_bytes
        node_ids = np.frombuffer(data, "<u4", count, offset)
        offset += 4 * count
        nodes = header["nodes"]
        past = [i for i in set(node_ids.tolist()) if i != _NO_NODE and i >= len(nodes)]
        if past:
            raise SimulatorError(f"{name}: corrupt: an instruction names source node {past[0]}, "
                                 f"but the header key 'nodes' lists {len(nodes)}")
        try:
            instructions = isa.decode_words(words)
        except SimulatorError as err:
            raise SimulatorError(f"{name}: corrupt instruction stream: {err}") from None
        arch = Arch.from_dict(header["arch"], source=f"{name} (header)")
        try:
            return cls(
                arch=arch,
                instructions=tuple(instructions),
                dram_image=data[offset:offset + image_len],
                inputs=tuple(binding_from_dict(d, "input") for d in header["inputs"]),
                outputs=tuple(binding_from_dict(d, "output") for d in header["outputs"]),
                source=tuple(nodes[i] if i != _NO_NODE else "" for i in node_ids.tolist()),
                metadata=header["metadata"],
                host_segments=tuple(header["host_segments"]),
                model_macs=header["model_macs"])
        except SimulatorError as err:
            raise SimulatorError(f"{name}: {err}") from None


def _read_header(raw: bytes, name: str) -> dict:
    """The JSON header, its keys and their types checked (their contents are checked where
    they are read): a forged header with a valid checksum is one line, not a KeyError."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SimulatorError(f"{name}: corrupt: the header is not UTF-8") from None
    except (ValueError, RecursionError) as err:
        raise SimulatorError(f"{name}: corrupt: the header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise SimulatorError(f"{name}: corrupt: the header is a JSON {type(header).__name__}, "
                             f"expected an object")
    for key, kind in _HEADER_KEYS.items():
        if key not in header:
            raise SimulatorError(f"{name}: the header misses key {key!r}")
        value = header[key]
        if key == "model_macs" and value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise SimulatorError(f"{name}: header key {key!r} = {value!r:.60}: expected a "
                                 f"{'JSON object' if kind is dict else kind.__name__}")
    unknown = sorted(set(header) - set(_HEADER_KEYS))
    if unknown:
        raise SimulatorError(f"{name}: unknown header key {unknown[0]!r}")
    if not all(isinstance(n, str) for n in header["nodes"]):
        raise SimulatorError(f"{name}: header key 'nodes': expected a list of strings")
    # The metadata is the tools' record; the records they read back must be objects.
    for key in ("inputs", "options"):
        if not isinstance(header["metadata"].get(key, {}), dict):
            raise SimulatorError(f"{name}: header key 'metadata.{key}' = "
                                 f"{header['metadata'][key]!r:.60}: expected a JSON object")
    return header


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write to a temporary name beside `path`, then rename: never a half file."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise SimulatorError(f"{path}: cannot write: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, output_mode())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except OSError as err:  # a full disk, or a folder that lost its write permission
        Path(tmp).unlink(missing_ok=True)
        raise SimulatorError(f"{path}: cannot write: {err.strerror or err}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def output_mode() -> int:
    """0666 minus the umask, the mode `open()` would give a new file (profiler.format, which
    may not import this package, repeats it)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask
