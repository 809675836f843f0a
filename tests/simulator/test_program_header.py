"""A forged program header ends in one line and exit 2, never an internal error.

Anyone can write a header with a valid SHA-256, so each case rewrites the JSON header of a real
program (the digits CNN with its pool on the host, so that it has a host segment), recomputes
the lengths and the checksum as `Program.to_bytes` does, and runs `ember simulate` on it."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.accuracy import program_options
from ember.errors import EmberError
from simulator.arch import PRESETS, Arch
from simulator.errors import SimulatorError
from simulator.program import _DIGEST, _FIXED, Program
from tests.cli import DIGITS, assert_one_line_error, invoke


@pytest.fixture(scope="module")
def digits_host(digits_profile, tmp_path_factory):
    """(folder, the program's bytes, one image): the digits CNN with a host segment."""
    tmp = tmp_path_factory.mktemp("header")
    program = tmp / "digits.ember"
    result = invoke("compile", DIGITS / "model.onnx", "--int8", "--profile", digits_profile,
                    "--keep-fp32", "pool", "--allow-host", "-o", program)
    assert result.exit_code == 0, result.output
    with np.load(DIGITS / "eval.npz") as data:
        np.savez(tmp / "sample.npz", input=data["input"][:1])
    return Digits(tmp, program.read_bytes(), tmp / "sample.npz")


class Digits(tuple):
    """(folder, program bytes, sample path), with a short repr for hypothesis' reports."""

    def __new__(cls, *parts):
        return super().__new__(cls, parts)

    def __repr__(self) -> str:
        return f"Digits({self[0]})"


def header_of(data: bytes) -> dict:
    header_len = _FIXED.unpack_from(data)[3]
    return json.loads(data[_FIXED.size:_FIXED.size + header_len])


def with_header(data: bytes, header: bytes) -> bytes:
    """`data` with its JSON header replaced by `header`, its length and checksum recomputed."""
    magic, version, word_bytes, header_len, count, image_len = _FIXED.unpack_from(data)
    body = (_FIXED.pack(magic, version, word_bytes, len(header), count, image_len) + header
            + data[_FIXED.size + header_len:-_DIGEST])
    return body + hashlib.sha256(body).digest()


def forged(data: bytes, change) -> bytes:
    header = copy.deepcopy(header_of(data))
    change(header)
    return with_header(data, json.dumps(header, sort_keys=True).encode())


def simulate(tmp: Path, data: bytes):
    path, out = tmp / "forged.ember", tmp / "out.npz"
    path.write_bytes(data)
    out.unlink(missing_ok=True)
    result = invoke("simulate", path, "-i", tmp / "sample.npz", "-o", out)
    return result, out.exists()


def _input(h) -> dict:
    return h["inputs"][0]


def _graph(h) -> dict:
    return h["host_segments"][0]["graph"]


CASES = [
    ("no nodes", lambda h: h.pop("nodes"), "misses key 'nodes'"),
    ("no arch", lambda h: h.pop("arch"), "misses key 'arch'"),
    ("no metadata", lambda h: h.pop("metadata"), "misses key 'metadata'"),
    ("metadata options a list", lambda h: h["metadata"].update(options=[1]),
     "'metadata.options' = [1]: expected a JSON object"),
    ("inputs a string", lambda h: h.update(inputs="x"), "header key 'inputs' = 'x'"),
    ("nodes of numbers", lambda h: h.update(nodes=[1, 2]), "'nodes': expected a list of str"),
    ("unknown key", lambda h: h.update(extra=1), "unknown header key 'extra'"),
    ("model_macs a string", lambda h: h.update(model_macs="x"), "'model_macs' = 'x'"),
    ("dram a string", lambda h: _input(h).update(dram="x"), "dram = 'x': expected an integer"),
    ("dram a float", lambda h: _input(h).update(dram=11.5), "dram = 11.5: expected an integer"),
    ("scale 0", lambda h: _input(h).update(scale=0), "scale = 0: expected a positive, finite"),
    ("scale 1e-50", lambda h: _input(h).update(scale=1e-50), "scale = 1e-50: expected"),
    ("scale NaN", lambda h: _input(h).update(scale=math.nan), "scale = nan"),
    ("no zero_point", lambda h: _input(h).pop("zero_point"), "missing key 'zero_point'"),
    ("zero_point out of range", lambda h: _input(h).update(zero_point=300),
     "zero_point = 300: expected an integer in [-128, 127]"),
    ("negative shape", lambda h: _input(h).update(shape=[-1, 1, 8, 8]), "non-negative sizes"),
    ("huge shape", lambda h: _input(h).update(shape=[10**12] + _input(h)["shape"][1:]),
     "does not fit"),
    ("too many dimensions", lambda h: _input(h).update(shape=[1] * 40), "at most 32 integers"),
    ("int4", lambda h: _input(h).update(dtype="int4"), "has dtype 'int4'"),
    ("short strides", lambda h: _input(h).update(strides=[1]), "one stride per dimension"),
    ("binding a list", lambda h: h["outputs"].__setitem__(0, [1]), "malformed output binding"),
    ("clock Infinity", lambda h: h["arch"].update(clock_mhz=math.inf),
     "clock_mhz = inf: expected a positive, finite number"),
    ("latency 10^30", lambda h: h["arch"]["dma"].update(latency_cycles=10**30),
     "dma.latency_cycles = 1000000000000000000000000000000"),
    ("arch energy NaN", lambda h: h["arch"]["energy"].update(mac_pj=math.nan),
     "energy.mac_pj = nan"),
    ("source node past the list", lambda h: h.update(nodes=h["nodes"][:1]),
     "names source node"),
    ("graph a string", lambda h: h["host_segments"][0].update(graph="g"), "key 'graph' = 'g'"),
    ("segment nodes of numbers", lambda h: h["host_segments"][0].update(nodes=[1]),
     "key 'nodes': expected a list of strings"),
    ("unknown operator", lambda h: _graph(h)["nodes"][0].update(op="Frobnicate"),
     "unknown operator 'Frobnicate'"),
    ("unknown value", lambda h: _graph(h)["nodes"][0].update(inputs=["nowhere"]),
     "input 'nowhere' is not a value defined before it"),
    ("graph values a string", lambda h: _graph(h).update(values="v"), "serialized graph"),
    ("graph missing a key", lambda h: _graph(h).pop("nodes"), "malformed (KeyError"),
]


@pytest.mark.parametrize("change,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forged_header_is_one_line(digits_host, change, message):
    tmp, data, _ = digits_host
    result, wrote = simulate(tmp, forged(data, change))
    assert_one_line_error(result, "forged.ember", message)
    assert not wrote


@pytest.mark.parametrize("header,message", [
    (b"\xff\xfe{}", "the header is not UTF-8"),
    (b"[1, 2]", "the header is a JSON list, expected an object"),
    (b"{\"arch\":", "the header is not JSON"),
])
def test_header_that_is_not_an_object(digits_host, header, message):
    tmp, data, _ = digits_host
    result, wrote = simulate(tmp, with_header(data, header))
    assert_one_line_error(result, "forged.ember", message)
    assert not wrote


def test_disasm_checks_the_header_too(digits_host):
    tmp, data, _ = digits_host
    path = tmp / "forged.ember"
    path.write_bytes(forged(data, lambda h: _input(h).update(scale=0)))
    assert_one_line_error(invoke("disasm", path), "forged.ember", "scale = 0")


def test_valid_program_round_trips_byte_identical(digits_host):
    tmp, data, _ = digits_host
    assert Program.from_bytes(data).to_bytes() == data
    result, wrote = simulate(tmp, data)
    assert result.exit_code == 0 and wrote, result.output


def _leaves(node, path=()):
    """Every path into the header, containers included."""
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            yield from _leaves(v, path + (i,))


_JSON = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, -1, 1, 255, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.lists(st.integers(-3, 70), max_size=5), st.dictionaries(st.text(max_size=4),
                                                               st.integers(), max_size=2))


@settings(max_examples=100)
@given(data=st.data())
def test_fuzzed_header_is_one_line_or_a_run(digits_host, data):
    """Any one key replaced or deleted: a successful run or one clean line, nothing else."""
    tmp, program, _ = digits_host
    header = header_of(program)
    # The host graph's constants are opaque bytes; their contents are the kernels' business.
    paths = [p for p in _leaves(header) if p and "data" not in p]
    path = data.draw(st.sampled_from(paths))
    delete = data.draw(st.booleans())
    value = None if delete else data.draw(_JSON)

    def change(h):
        node = h
        for part in path[:-1]:
            node = node[part]
        if delete and isinstance(node, dict):
            del node[path[-1]]
        else:
            node[path[-1]] = value

    result, _ = simulate(tmp, forged(program, change))
    if result.exit_code != 0:
        assert_one_line_error(result)


def test_malformed_recorded_options_are_one_error(digits_host, digits_profile):
    """`ember accuracy --program` rebuilds the quantizer options the header records."""
    _, data, _ = digits_host
    program = Program.from_bytes(forged(data, lambda h: h["metadata"]["options"].update(
        percentile="x")))
    with pytest.raises(EmberError, match="recorded options are malformed"):
        program_options(program, digits_profile)


@pytest.mark.parametrize("line,message", [
    ("clock_mhz = inf", "clock_mhz = inf: expected a positive, finite number"),
    ("latency_cycles = 1_000_000_000_000", "dma.latency_cycles = 1000000000000: expected"),
])
def test_arch_file_is_as_strict_as_the_header(tmp_path, line, message):
    """The header's arch record and an arch TOML go through the same `Arch.from_dict`."""
    text = (PRESETS / "default.toml").read_text()
    key = line.split(" =")[0]
    lines = [line if row.split("=")[0].strip() == key else row for row in text.splitlines()]
    (tmp_path / "a.toml").write_text("\n".join(lines))
    with pytest.raises(SimulatorError, match=re.escape(message)):
        Arch.load(tmp_path / "a.toml")
