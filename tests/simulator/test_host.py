"""Host segments: HOST runs a subgraph on the host CPU through a runner, with DMA of its inputs and
outputs, a known cycle cost on the shared DRAM port, and reports that say what ran where."""

import json

import numpy as np
import pytest

from simulator import isa, machine, trace
from simulator.arch import DEFAULT_HOST_FLOPS_PER_CYCLE, Arch
from simulator.errors import SimulatorError
from simulator.program import IOBinding, Program

ARCH = Arch.load("default")  # latency 100 cycles, 16 B/cycle
X, A, B, F, Y = 0x0000, 0x1000, 0x2000, 0x3000, 0x4000
SHAPE = (4, 16)
COMPUTE = 50


def segment(name="host0", outputs=None, **extra):
    return {"name": name, "nodes": ["neg", "cast"], "graph": {"toy": True}, "flops": 800,
            "inputs": [IOBinding("a", A, SHAPE, 0.5, 0).to_dict()],
            "outputs": outputs if outputs is not None else [
                IOBinding("b", B, SHAPE, 0.5, 0).to_dict(),
                IOBinding("f", F, SHAPE, 1.0, 0, "float32").to_dict()],
            **extra}


def toy_runner(calls=None):
    """b = -a (saturating), f = a / 2 in float32."""
    def run(seg, inputs):
        if calls is not None:
            calls.append((seg["name"], {k: v.copy() for k, v in inputs.items()}))
        a = inputs["a"]
        return {"b": np.clip(-a.astype(np.int16), -128, 127).astype(np.int8),
                "f": a.astype(np.float32) * np.float32(0.5)}
    return run


def rows(insn, sram, dram, **kw):
    return insn(mem="scratchpad", sram=sram, dram=dram, y_size=SHAPE[0], x_size=1,
                elem_bytes=SHAPE[1], x_stride=SHAPE[1], y_stride=SHAPE[1], **kw)


READ, WRITE = 64, 64 + 256


def host_program(segment_index=0, segments=None):
    """x -> LOAD/STORE -> a; HOST: a -> b, f; b -> LOAD/STORE -> y. Tokens relay each STORE to
    the next reader as the ISA asks (store -> vector -> compute -> load for DRAM read-back)."""
    insns = [
        rows(isa.LOAD, 0, X, push_next=True),
        isa.SYNC(queue="compute", pop_prev=True, push_next=True),
        isa.SYNC(queue="vector", pop_prev=True, push_next=True),
        rows(isa.STORE, 0, A, pop_prev=True),
        isa.HOST(segment=segment_index, compute_cycles=COMPUTE, read_bytes=READ,
                 write_bytes=WRITE, push_prev=True),
        isa.SYNC(queue="vector", pop_next=True, push_prev=True),
        isa.SYNC(queue="compute", pop_next=True, push_prev=True),
        rows(isa.LOAD, 8, B, pop_next=True, push_next=True),
        isa.SYNC(queue="compute", pop_prev=True, push_next=True),
        isa.SYNC(queue="vector", pop_prev=True, push_next=True),
        rows(isa.STORE, 8, Y, pop_prev=True),
        isa.END(),
    ]
    source = ("copy",) * 4 + ("host0",) + ("out",) * 6 + ("",)
    return Program(arch=ARCH, instructions=insns, source=source,
                   inputs=(IOBinding("x", X, SHAPE, 0.5, 0),),
                   outputs=(IOBinding("y", Y, SHAPE, 0.5, 0),
                            IOBinding("f", F, SHAPE, 1.0, 0, "float32")),
                   host_segments=(segment(),) if segments is None else segments)


def x_data():
    return np.arange(-32, 32, dtype=np.int8).reshape(SHAPE) * np.int8(4)


@pytest.fixture(scope="module")
def result():
    return machine.run(host_program(), {"x": x_data()}, host=toy_runner())


def test_host_segment_outputs(result):
    x = x_data()
    np.testing.assert_array_equal(result.outputs["y"],
                                  np.clip(-x.astype(np.int16), -128, 127).astype(np.int8))
    assert result.outputs["f"].dtype == np.float32
    np.testing.assert_array_equal(result.outputs["f"], x.astype(np.float32) / 2)


def test_runner_sees_segment_and_inputs():
    calls = []
    machine.run(host_program(), {"x": x_data()}, host=toy_runner(calls))
    (name, inputs), = calls
    assert name == "host0" and list(inputs) == ["a"]
    np.testing.assert_array_equal(inputs["a"], x_data())


def test_host_cycles_follow_the_formula(result):
    host = 4
    cycles = int(result.timeline.end[host] - result.timeline.start[host])
    assert cycles == ARCH.dma.latency_cycles + -(-(READ + WRITE) // 16) + COMPUTE == 174
    assert cycles == isa.HOST.cycles(ARCH, host_program().instructions[host])
    # the HOST starts when the STORE of its input ends (same queue, in order), and the LOAD of
    # its output after the HOST ends (tokens relayed through vector and compute)
    assert result.timeline.start[host] == result.timeline.end[3]
    assert result.timeline.start[7] == result.timeline.end[host]


def test_host_shares_the_dram_port():
    """A 1 KiB LOAD holds the port over [100, 164); the HOST, started at 0 on the store
    queue, waits for it: transfer [164, 188), then 50 cycles of compute."""
    prog = Program(arch=ARCH, instructions=[
        isa.LOAD(mem="scratchpad", sram=0, dram=X, y_size=64, x_size=1, elem_bytes=16,
                 x_stride=16, y_stride=16),
        isa.HOST(segment=0, compute_cycles=COMPUTE, read_bytes=READ, write_bytes=WRITE),
        isa.END()], host_segments=(segment(),))
    result = machine.run(prog, host=toy_runner())
    assert result.timeline.start.tolist() == [0, 0]
    assert result.timeline.end.tolist() == [164, 164 + 24 + COMPUTE]
    assert result.stats.stall["store.dram_port"] == 64
    assert result.stats.busy["dram"] == 64 + 24
    assert result.stats.busy["host"] == 238 and result.stats.busy["store"] == 0


def test_file_round_trip_keeps_host_segments(tmp_path):
    prog = host_program()
    prog.save(tmp_path / "h.ember")
    back = Program.load(tmp_path / "h.ember")
    assert back.host_segments == prog.host_segments
    assert back.instructions == prog.instructions and back.instructions[4].op is isa.HOST
    assert isa.disassemble(back.instructions[4]) == (
        "HOST segment=0 compute_cycles=50 read_bytes=64 write_bytes=320 push_prev")
    again = machine.run(back, {"x": x_data()}, host=toy_runner())
    assert again.stats.cycles == machine.run(prog, {"x": x_data()}, host=toy_runner()).stats.cycles


def test_missing_runner_is_an_error():
    with pytest.raises(SimulatorError, match=r"program has host segment\(s\) host0: run it "
                                             r"with a host runner \(ember simulate supplies one\)"):
        machine.run(host_program(), {"x": x_data()})


def test_programs_without_host_need_no_runner():
    prog = Program(arch=ARCH, instructions=[isa.END()], host_segments=(segment(),))
    assert machine.run(prog).stats.cycles == 0


def test_bad_segment_index_is_rejected(tmp_path):
    with pytest.raises(SimulatorError, match=r"instruction 4 \(HOST segment=1 .*\) names host "
                                             r"segment 1, but the program has 1 host segment"):
        host_program(segment_index=1)
    # a file whose header lost a segment is rejected, naming the file
    prog = host_program()
    object.__setattr__(prog, "host_segments", ())
    path = tmp_path / "bad.ember"
    path.write_bytes(prog.to_bytes())
    with pytest.raises(SimulatorError, match=rf"{path}: program: instruction 4 .* names host "
                                             r"segment 0, but the program has 0"):
        Program.load(path)


@pytest.mark.parametrize("change,message", [
    (lambda s: s.pop("graph"), r"host segment 0 \('host0'\): missing key 'graph'"),
    (lambda s: s.pop("nodes"), r"host segment 0 \('host0'\): key 'nodes' = None: expected a list"),
    (lambda s: s.update(flops=-1), r"host segment 0 \('host0'\): flops = -1"),
    (lambda s: s.update(name=3), r"host segment 0: key 'name' = 3: expected a str"),
    (lambda s: s["inputs"][0].pop("dram"), r"host segment 0 \('host0'\): a malformed input"),
    (lambda s: s["inputs"][0].update(dram=2**30 - 8),
     r"host segment 0 input 'a' at DRAM 1073741816 does not fit"),
    (lambda s: s["outputs"][1].update(dtype="float16"), r"output 'f' has dtype 'float16'"),
])
def test_malformed_segments_are_rejected(change, message):
    bad = segment()
    change(bad)
    with pytest.raises(SimulatorError, match=message):
        host_program(segments=(bad,))


@pytest.mark.parametrize("runner,message", [
    (lambda s, i: {"b": np.zeros((4, 15), np.int8), "f": np.zeros(SHAPE, np.float32)},
     r"host segment 'host0': output 'b': expected int8 of shape \(4, 16\), the runner returned "
     r"int8 of shape \(4, 15\)"),
    (lambda s, i: {"b": np.zeros(SHAPE, np.int8), "f": np.zeros(SHAPE, np.float64)},
     r"host segment 'host0': output 'f': expected float32 .* returned float64"),
    (lambda s, i: {"b": np.zeros(SHAPE, np.int8)},
     r"host segment 'host0': the runner returned no output 'f'"),
    (lambda s, i: [np.zeros(SHAPE, np.int8)], r"host segment 'host0': the runner returned list"),
])
def test_runner_returning_the_wrong_thing_is_an_error(runner, message):
    with pytest.raises(SimulatorError, match=r"instruction 4 of node 'host0' \(HOST .*\): "
                                             + message):
        machine.run(host_program(), {"x": x_data()}, host=runner)


def test_report_says_what_ran_where(result):
    report = json.loads(json.dumps(result.stats.to_report()))
    units = {layer["name"]: layer["unit"] for layer in report["layers"]}
    assert units == {"copy": "accelerator", "host0": "host", "out": "accelerator"}
    assert report["host_cycles"] == 174 == report["busy_cycles"]["host"]
    assert report["host_segments"] == [{"name": "host0", "nodes": ["neg", "cast"], "cycles": 174,
                                        "read_bytes": READ, "write_bytes": WRITE,
                                        "compute_cycles": COMPUTE}]
    # the store unit's busy time excludes HOST's: two 64-byte STOREs of 104 cycles
    assert report["busy_cycles"]["store"] == 2 * 104
    assert report["dram_bytes_read"] == 64 + READ + 64
    assert report["dram_bytes_written"] == 64 + WRITE + 64
    host_layer = next(layer for layer in report["layers"] if layer["unit"] == "host")
    assert host_layer["bound_by"] == "host" and host_layer["bound_cycles"] == 24 + COMPUTE
    assert host_layer["busy_cycles"]["host"] == 174 and host_layer["busy_cycles"]["store"] == 0
    assert report["bound_cycles"] <= report["cycles"]


def test_trace_has_a_host_track(result):
    prog = host_program()
    doc = trace.chrome_trace(prog, result.timeline, "instruction")
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    host_tid = next(tid for tid, name in names.items() if name == "host")
    on_host = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == host_tid]
    assert {e["name"] for e in on_host} == {"host0", "HOST"}
    store_tid = next(tid for tid, name in names.items() if name == "store")
    assert all(e["name"] != "HOST" for e in doc["traceEvents"]
               if e["ph"] == "X" and e["tid"] == store_tid)


def test_arch_host_section(tmp_path):
    assert ARCH.host.flops_per_cycle == 16
    assert ARCH.host_cycles(0) == 0 and ARCH.host_cycles(16) == 1 and ARCH.host_cycles(17) == 2
    assert Arch.load("edge").host_cycles(800) == 400
    d = ARCH.to_dict()
    assert d["host"] == {"flops_per_cycle": 16.0} and Arch.from_dict(d) == ARCH
    del d["host"]  # an arch dict from before [host]: the default
    assert Arch.from_dict(d).host.flops_per_cycle == DEFAULT_HOST_FLOPS_PER_CYCLE
    for bad in (0, -1, "fast", float("inf"), float("nan"), True):
        with pytest.raises(SimulatorError, match=r"mine: host.flops_per_cycle = .*: expected a "
                                                 r"positive, finite number"):
            Arch.from_dict({**ARCH.to_dict(), "host": {"flops_per_cycle": bad}}, source="mine")
    with pytest.raises(SimulatorError, match="unknown key 'host.cores'"):
        Arch.from_dict({**ARCH.to_dict(), "host": {"flops_per_cycle": 8, "cores": 2}})
    with pytest.raises(SimulatorError, match="host_cycles: flops = -1"):
        ARCH.host_cycles(-1)


def test_float32_bindings():
    f = IOBinding("f", 8, (2, 3), 1.0, 0, "float32")
    x = np.array([[1.0, -2.5, 3e-8], [0.0, np.inf, 7.0]], np.float64)
    assert f.quantize(x).dtype == np.float32
    np.testing.assert_array_equal(f.quantize(x), x.astype(np.float32))
    np.testing.assert_array_equal(f.dequantize(f.quantize(x)), x.astype(np.float32))
    assert f.size_bytes == 24 and f.byte_strides == (12, 4)
    state = machine.State(ARCH)  # one sample: values and reads have the samples' axis
    state.write(f, f.quantize(x)[None])
    assert state.dram[0][8:12].tobytes() == np.float32(1.0).tobytes() == b"\x00\x00\x80\x3f"
    np.testing.assert_array_equal(state.read(f)[0], x.astype(np.float32))
    # a transposed (non-contiguous) array and a scalar binding
    t = IOBinding("t", 64, (3, 2), 1.0, 0, "float32")
    state.write(t, f.quantize(x).T[None])
    np.testing.assert_array_equal(state.read(t)[0], x.astype(np.float32).T)
    s = IOBinding("s", 128, (), 1.0, 0, "float32")
    state.write(s, np.array([2.5], np.float32))
    assert state.read(s)[0] == np.float32(2.5) and state.read(s).shape == (1,)
    with pytest.raises(SimulatorError, match=r"expected float32 of shape \(2, 3\)"):
        state.write(f, x[None])
    with pytest.raises(SimulatorError, match=r"expected float32 of shape \(2, 3\), got "
                                             r"float32 of shape \(3, 2\)"):
        state.write(f, f.quantize(x).T, sample=0)  # one sample's value
    u = IOBinding("u", 256, (2,), 0.1, 128, "uint8")  # uint8 keeps working
    assert u.quantize(np.array([0.0, 12.7])).tolist() == [128, 255]
    state.write(u, np.array([[0, 255]], np.uint8))
    assert state.read(u)[0].tolist() == [0, 255]
