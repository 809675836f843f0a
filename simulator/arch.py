"""The accelerator's description: a few primary knobs read from TOML, derived sizes as properties.

A preset (`simulator/presets/*.toml`) or a user file is read with tomllib and checked key by key
against `_SCHEMA`; a bad value raises SimulatorError naming the file, the key and what was
expected. The compiler reads every size from here and hard-codes none.

Energy figures (pJ per int8 MAC, per local-memory byte, per DRAM byte) follow M. Horowitz,
"Computing's energy problem (and what we can do about it)", ISSCC 2014.

Area figures (`[area]`: µm² per processing element, per local-memory byte, per vector lane)
give the silicon an architecture takes (`Arch.area_um2`), for design-space sweeps that weigh
cycles against area. They are 45 nm figures too: a PE is an 8-bit multiplier (282 µm²) and a
32-bit adder (137 µm²) from the same Horowitz table; a vector lane a 32-bit multiplier (3495 µm²)
and adder (137 µm²); a local-memory byte eight 6T cells of 0.346 µm² (Intel's 45 nm process,
K. Mistry et al., IEDM 2007) over an array efficiency of one half (periphery: decoders, sense
amplifiers; our assumption, not the paper's). Registers, wiring, the DMA engine and the host
are not counted: the figure ranks designs, it is no floor plan. A file without `[area]` (an
older preset or program header) gets `DEFAULT_AREA`.

`[host]` describes the CPU that runs host segments (nodes kept in fp32, operators the
accelerator lacks): `flops_per_cycle` is its sustained fp32 FLOPs per accelerator cycle, from
which the compiler prices a segment (`Arch.host_cycles`). A file without `[host]` (an older
preset or program header) gets `DEFAULT_HOST_FLOPS_PER_CYCLE`.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from simulator import isa
from simulator.errors import SimulatorError

PRESETS = Path(__file__).parent / "presets"
DATAFLOWS = ("weight_stationary", "output_stationary")
VECTOR_OPS = ("REQUANT", "ADD", "MUL", "MAXPOOL", "AVGPOOL", "LUT", "SOFTMAX", "LAYERNORM",
              "REDUCE")
# The default preset's host: one x86 core with AVX2 (two 256-bit FMA pipes, 32 fp32 FLOP per
# core cycle at peak) at about 2 GHz, sustaining a quarter of peak on the small, memory-bound
# operators that fall back to the host: 32 * 2 GHz / 1 GHz * 0.25 = 16 per accelerator cycle.
DEFAULT_HOST_FLOPS_PER_CYCLE = 16.0
# 45 nm area in µm², derived in the module docstring (Horowitz ISSCC 2014; Mistry IEDM 2007).
# PE: 282 + 137; SRAM byte: 8 * 0.346 / 0.5; vector lane: 3495 + 137.
DEFAULT_AREA = {"pe_um2": 419.0, "sram_byte_um2": 5.536, "vector_lane_um2": 3632.0}
# What the instructions can address: every byte of DRAM, every row of a local memory.
_DRAM_BYTES_MAX = isa.LOAD.field("dram").range[1] + 1
_LOCAL_ROWS_MAX = isa.LOAD.field("sram").range[1] + 1


@dataclass(frozen=True)
class Array:
    rows: int
    cols: int
    dataflow: str
    preload_overlap: bool


@dataclass(frozen=True)
class Memory:
    size_bytes: int
    row_bytes: int

    @property
    def rows(self) -> int:
        return self.size_bytes // self.row_bytes


@dataclass(frozen=True)
class Dram:
    size_bytes: int


@dataclass(frozen=True)
class Dma:
    bytes_per_cycle: int
    latency_cycles: int
    max_burst_bytes: int


@dataclass(frozen=True)
class Vector:
    lanes: int
    ops: tuple[str, ...]


@dataclass(frozen=True)
class Queues:
    token_depth: int


@dataclass(frozen=True)
class Area:
    pe_um2: float  # one processing element of the array (an int8 MAC)
    sram_byte_um2: float  # one byte of local memory (scratchpad or accumulator)
    vector_lane_um2: float  # one lane of the vector unit (an int32 requantizer)


@dataclass(frozen=True)
class Host:
    flops_per_cycle: float  # sustained fp32 FLOPs of the host CPU per accelerator cycle


@dataclass(frozen=True)
class Energy:
    mac_pj: float
    local_byte_pj: float
    dram_byte_pj: float


# Every integer knob is at most this: a forged 10^30 cycles or lanes is refused here, not met
# as an overflow or a huge allocation deep in a run.
_INT_MAX = 1 << 32


def _positive_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= _INT_MAX


def _nonnegative_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _INT_MAX


def _nonnegative_number(v):
    """Finite too: an infinite clock or energy would put Infinity (not JSON) in a report."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf


_POSITIVE_INT = "a positive integer <= 2^32"
_NONNEGATIVE_INT = "a non-negative integer <= 2^32"
# Every key of the file: (dotted key, check, what was expected).
_SCHEMA = [
    ("name", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    ("clock_mhz", lambda v: _nonnegative_number(v) and v > 0, "a positive, finite number"),
    ("array.rows", _positive_int, _POSITIVE_INT),
    ("array.cols", _positive_int, _POSITIVE_INT),
    ("array.dataflow", lambda v: v in DATAFLOWS, f"one of {', '.join(DATAFLOWS)}"),
    ("array.preload_overlap", lambda v: isinstance(v, bool), "true or false"),
    ("memory.scratchpad.size_bytes", _positive_int, _POSITIVE_INT),
    ("memory.scratchpad.row_bytes", _positive_int, _POSITIVE_INT),
    ("memory.accumulator.size_bytes", _positive_int, _POSITIVE_INT),
    ("memory.accumulator.row_bytes", _positive_int, _POSITIVE_INT),
    ("dram.size_bytes", lambda v: _positive_int(v) and v <= _DRAM_BYTES_MAX,
     f"a positive integer <= 2^{_DRAM_BYTES_MAX.bit_length() - 1}"),
    ("dma.bytes_per_cycle", _positive_int, _POSITIVE_INT),
    ("dma.latency_cycles", _nonnegative_int, _NONNEGATIVE_INT),
    ("dma.max_burst_bytes", _positive_int, _POSITIVE_INT),
    ("vector.lanes", _positive_int, _POSITIVE_INT),
    ("vector.ops", lambda v: isinstance(v, list) and all(o in VECTOR_OPS for o in v),
     f"a list drawn from {', '.join(VECTOR_OPS)}"),
    ("queues.token_depth", _positive_int, _POSITIVE_INT),
    ("energy.mac_pj", _nonnegative_number, "a non-negative, finite number"),
    ("energy.local_byte_pj", _nonnegative_number, "a non-negative, finite number"),
    ("energy.dram_byte_pj", _nonnegative_number, "a non-negative, finite number"),
    ("host.flops_per_cycle", lambda v: _nonnegative_number(v) and 0 < v < math.inf,
     "a positive, finite number"),
    *((f"area.{key}", _nonnegative_number, "a non-negative, finite number")
      for key in DEFAULT_AREA),
]
# Each key's check and what it expects, by key: for files that name keys of this one
# (`ember sweep`'s space files).
KEYS = {key: (check, expected) for key, check, expected in _SCHEMA}
# Keys a file may omit (added after the first presets): their values when missing.
_DEFAULTS = {"host.flops_per_cycle": DEFAULT_HOST_FLOPS_PER_CYCLE,
             **{f"area.{key}": value for key, value in DEFAULT_AREA.items()}}
# Keys earlier files had that nothing modelled: an error that says so, not just "unknown".
_REMOVED = {f"memory.{memory}.banks": "the machine does not model memory banks"
            for memory in ("scratchpad", "accumulator")}


@dataclass(frozen=True)
class Arch:
    name: str
    clock_mhz: float
    array: Array
    scratchpad: Memory
    accumulator: Memory
    dram: Dram
    dma: Dma
    vector: Vector
    queues: Queues
    energy: Energy
    host: Host = Host(DEFAULT_HOST_FLOPS_PER_CYCLE)
    area: Area = Area(**DEFAULT_AREA)

    @classmethod
    def load(cls, name_or_path: str | Path) -> "Arch":
        """A preset name ("default", "large", "edge") or the path of a user TOML file."""
        path = Path(name_or_path)
        if path.suffix != ".toml":
            path = PRESETS / f"{name_or_path}.toml"
            if not path.is_file():
                known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.toml")))
                raise SimulatorError(f"unknown target {name_or_path!r}: expected a preset "
                                     f"({known}) or the path of a .toml file")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise SimulatorError(f"{path}: cannot read the architecture file: {err}") from None
        except UnicodeDecodeError:
            raise SimulatorError(f"{path}: not valid TOML: the file is not UTF-8") from None
        except tomllib.TOMLDecodeError as err:
            raise SimulatorError(f"{path}: not valid TOML: {err}") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<arch>") -> "Arch":
        """Validate a TOML-shaped dict (a file's contents or a program header's copy)."""
        values = {}
        for key, check, expected in _SCHEMA:
            node = data
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    if key in _DEFAULTS and isinstance(node, dict):
                        node = _DEFAULTS[key]
                        break
                    raise SimulatorError(f"{source}: missing key {key!r} (expected {expected})")
                node = node[part]
            if not check(node):
                raise SimulatorError(f"{source}: {key} = {node!r}: expected {expected}")
            values[key] = node
        known = {key for key, _, _ in _SCHEMA}
        unknown = sorted(k for k in _flatten(data) if k not in known)
        removed = [k for k in unknown if k in _REMOVED]
        if removed:
            raise SimulatorError(f"{source}: key {removed[0]!r} is no longer read "
                                 f"({_REMOVED[removed[0]]}): delete it")
        if unknown:
            raise SimulatorError(f"{source}: unknown key {unknown[0]!r}")

        def section(prefix):
            return {k[len(prefix) + 1:]: v for k, v in values.items() if k.startswith(prefix + ".")}

        arch = cls(
            name=values["name"], clock_mhz=values["clock_mhz"],
            array=Array(**section("array")),
            scratchpad=Memory(**section("memory.scratchpad")),
            accumulator=Memory(**section("memory.accumulator")),
            dram=Dram(**section("dram")), dma=Dma(**section("dma")),
            vector=Vector(lanes=values["vector.lanes"], ops=tuple(values["vector.ops"])),
            queues=Queues(**section("queues")), energy=Energy(**section("energy")),
            host=Host(**section("host")), area=Area(**section("area")))
        arch._check_consistency(source)
        return arch

    def _check_consistency(self, source: str) -> None:
        """The layout rules the ISA relies on: one scratchpad row is one array-width vector."""
        rules = [
            ("memory.scratchpad.row_bytes", self.scratchpad.row_bytes, self.array.cols,
             "equal to array.cols (one int8 lane per array column)"),
            ("memory.accumulator.row_bytes", self.accumulator.row_bytes, 4 * self.array.cols,
             "equal to 4 * array.cols (one int32 lane per array column)"),
        ]
        for key, value, want, expected in rules:
            if value != want:
                raise SimulatorError(f"{source}: {key} = {value}: expected {want}, {expected}")
        if self.array.rows > self.array.cols:
            raise SimulatorError(f"{source}: array.rows = {self.array.rows}: expected at most "
                                 f"array.cols = {self.array.cols} (an input row is one "
                                 f"scratchpad row)")
        if self.array.cols < 3:
            raise SimulatorError(f"{source}: array.cols = {self.array.cols}: expected at least 3 "
                                 f"(ADD keeps three rescales in one accumulator row)")
        for key, mem in (("scratchpad", self.scratchpad), ("accumulator", self.accumulator)):
            if mem.size_bytes % mem.row_bytes:
                raise SimulatorError(f"{source}: memory.{key}.size_bytes = {mem.size_bytes}: "
                                     f"expected a multiple of row_bytes = {mem.row_bytes}")
            if mem.rows > _LOCAL_ROWS_MAX:
                raise SimulatorError(f"{source}: memory.{key} has {mem.rows} rows: expected at "
                                     f"most 2^{_LOCAL_ROWS_MAX.bit_length() - 1} (the ISA's "
                                     f"local address fields)")

    def to_dict(self) -> dict:
        """The TOML-shaped dict: recorded in program headers, read back by `from_dict`."""
        d = asdict(self)
        d["memory"] = {"scratchpad": d.pop("scratchpad"), "accumulator": d.pop("accumulator")}
        d["vector"]["ops"] = list(d["vector"]["ops"])
        return d

    def vector_lacks(self, insn: isa.Insn) -> bool:
        """Whether `insn` is vector work this vector unit does not implement (`vector.ops`)."""
        return insn.queue == "vector" and insn.op is not isa.SYNC and \
            insn.op.mnemonic not in self.vector.ops

    def host_cycles(self, flops: int) -> int:
        """Accelerator cycles the host CPU takes for `flops` fp32 operations (rounded up)."""
        if flops < 0:
            raise SimulatorError(f"host_cycles: flops = {flops}: expected a non-negative count")
        return math.ceil(flops / self.host.flops_per_cycle)

    def roofline(self, macs: int, dram_bytes: int, vector_cycles: int = 0,
                 host_cycles: int = 0) -> tuple[int, str]:
        """The fewest cycles that work can take, and what sets them: the array at
        `macs_per_cycle`, the DRAM port at `dma.bytes_per_cycle`, the vector unit's own cycles,
        the host's (HOSTs run one at a time). Ties go to the first: array, then DRAM."""
        roofs = {"array": -(-macs // self.macs_per_cycle),
                 "dram": -(-dram_bytes // self.dma.bytes_per_cycle), "vector": vector_cycles,
                 "host": host_cycles}
        by = max(roofs, key=roofs.get)
        return roofs[by], by

    @property
    def memories(self) -> tuple[Memory, ...]:
        """The local memories, indexed by the ISA's memory ids (`isa.MEMORIES`)."""
        return tuple(getattr(self, name) for name in isa.MEMORIES)

    @property
    def macs_per_cycle(self) -> int:
        return self.array.rows * self.array.cols

    @property
    def lanes(self) -> int:
        """Elements per local-memory row (int8 in the scratchpad, int32 in the accumulator)."""
        return self.array.cols

    @property
    def sram_bytes(self) -> int:
        """Local memory: the scratchpad and the accumulator."""
        return self.scratchpad.size_bytes + self.accumulator.size_bytes

    @property
    def area_um2(self) -> float:
        """The silicon of the array, the local memories and the vector unit (`[area]`)."""
        return (self.macs_per_cycle * self.area.pe_um2 + self.sram_bytes * self.area.sram_byte_um2
                + self.vector.lanes * self.area.vector_lane_um2)

    @property
    def cycle_us(self) -> float:
        return 1.0 / self.clock_mhz


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        else:
            yield key
