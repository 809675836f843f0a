"""What code generation hands to scheduling: instructions before tokens (`Op`), grouped into
the unit of overlap (`Step`). Below both, so codegen never imports the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator import isa


@dataclass(frozen=True, eq=False)
class Op:
    """One instruction before tokens: its row, its fields, the node it implements, and the
    activation DRAM it reads or writes, one access per tensor: (start, stop, write) bytes once
    relocated, (tensor, write) from codegen before that; empty for constants or nothing."""

    row: isa.InsnDef
    args: dict
    source: str
    dram: tuple[tuple, ...] = ()
    # Fields holding a DRAM address relative to an activation tensor, until relocated: field
    # name → tensor (a LOAD's or STORE's `dram` names its one tensor in `dram` instead).
    relative: dict = field(default_factory=dict)

    @property
    def insn(self) -> isa.Insn:
        """The instruction without dependency flags, built (and checked) once: tiled layers
        repeat the same instructions (a PRELOAD per tap, per tile), which share one Insn.
        (Kept in the instance's __dict__ by hand: Python 3.11's cached_property takes a lock
        on each first read, 0.6 s of ResNet-18's 783k instructions on edge.)"""
        insn = self.__dict__.get("_insn")
        if insn is None:
            # the names, then the values: a flat tuple, no (name, value) pair built for it
            key = (self.row, *self.args, *self.args.values())
            insn = _INSNS.get(key)
            if insn is None:
                if len(_INSNS) >= _INSN_CACHE_SIZE:
                    _INSNS.clear()
                insn = _INSNS[key] = self.row(**self.args)
            self.__dict__["_insn"] = insn  # past the frozen dataclass's __setattr__
        return insn


_INSNS: dict[tuple, isa.Insn] = {}  # Insns are immutable, so equal ones may be shared
_INSN_CACHE_SIZE = 1 << 18


@dataclass(frozen=True)
class Step:
    """The unit of overlap: the loads of one tile, then the work that consumes them."""

    loads: tuple[Op, ...]
    body: tuple[Op, ...]
