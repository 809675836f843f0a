"""Every row of the instruction table round-trips through encode/decode and assemble/disassemble."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simulator import isa
from simulator.errors import SimulatorError

CI = settings(max_examples=60)  # derandomized by the "ci" profile in tests/conftest.py


@st.composite
def instructions(draw, row):
    values = {f.name: draw(st.integers(0, len(f.names) - 1) if f.names else st.integers(*f.range))
              for f in row.fields}
    flags = {name: draw(st.booleans()) for name in isa.DEPS} if row.queue != "end" else {}
    try:
        return row(**values, **flags)
    except SimulatorError:
        assume(False)  # a dependency flag toward a queue that does not exist


@pytest.mark.parametrize("row", isa.TABLE, ids=lambda r: r.mnemonic)
@CI
@given(data=st.data())
def test_round_trip(row, data):
    insn = data.draw(instructions(row))
    word = isa.encode(insn)
    assert 0 <= word < 2**isa.WORD_BITS
    assert isa.decode(word) == insn
    assert isa.assemble(isa.disassemble(insn)) == insn
    assert isa.decode_words(isa.encode_words([insn, insn])) == [insn, insn]


def test_opcodes_unique_and_words_fit():
    assert len(isa.BY_OPCODE) == len(isa.TABLE)
    for row in isa.TABLE:
        assert row.opcode < 2**isa.OPCODE_BITS and row.opcode != 0
        assert isa.OPCODE_BITS + 4 + sum(f.bits for f in row.fields) <= isa.WORD_BITS


def test_field_too_wide_names_instruction_field_and_range():
    with pytest.raises(SimulatorError, match=r"PRELOAD: field k = 65536 .* \[0, 65535\]"):
        isa.PRELOAD(sp=0, k=2**16)
    with pytest.raises(SimulatorError, match=r"REQUANT: field qmin = -129 .* \[-128, 127\]"):
        isa.REQUANT(acc=0, sp=0, rows=1, param=0, qmin=-129)


def test_bad_constructions():
    with pytest.raises(SimulatorError, match="missing field 'k'"):
        isa.PRELOAD(sp=0)
    with pytest.raises(SimulatorError, match="unknown field 'bogus'"):
        isa.PRELOAD(sp=0, k=1, bogus=1)
    with pytest.raises(SimulatorError, match="no previous queue"):
        isa.LOAD(mem="scratchpad", sram=0, dram=0, y_size=1, x_size=1, elem_bytes=1,
                 x_stride=1, y_stride=1, pop_prev=True)
    with pytest.raises(SimulatorError, match="no next queue"):
        isa.SYNC(queue="store", push_next=True)
    with pytest.raises(SimulatorError, match="expected one of scratchpad, accumulator"):
        isa.STORE(mem="dram", sram=0, dram=0, y_size=1, x_size=1, elem_bytes=1, x_stride=1,
                  y_stride=1)
    with pytest.raises(SimulatorError, match="unknown mnemonic"):
        isa.assemble("JUMP 3")
    with pytest.raises(SimulatorError, match="unknown opcode"):
        isa.decode(0)
    with pytest.raises(SimulatorError, match="field mem = 3: expected one of"):
        isa.decode(isa.STORE.opcode | 3 << 9)


def test_assembler_text_form():
    insn = isa.assemble("COMPUTE sp=0x10 acc=2 m_inner=4 k=3 n=5 accumulate=1 pop_prev ; a comment")
    assert insn == isa.COMPUTE(sp=16, acc=2, m_inner=4, k=3, n=5, accumulate=1, pop_prev=True)
    assert insn.queue == "compute" and isa.SYNC(queue="store").queue == "store"
    assert len(isa.assemble_program("END\n; only a comment\n\nEND")) == 2
