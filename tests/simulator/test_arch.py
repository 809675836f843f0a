"""Architecture files: presets load, derived sizes, and errors that name file, key and
expectation."""

import pytest

from simulator.arch import Arch
from simulator.errors import SimulatorError


@pytest.mark.parametrize("name,rows,sp_kib,bw", [("default", 16, 256, 16), ("large", 32, 1024, 32),
                                                   ("edge", 8, 32, 8)])
def test_presets(name, rows, sp_kib, bw):
    arch = Arch.load(name)
    assert arch.array.rows == arch.array.cols == rows
    assert arch.scratchpad.size_bytes == sp_kib * 1024 and arch.dma.bytes_per_cycle == bw
    assert arch.scratchpad.rows == arch.scratchpad.size_bytes // arch.lanes
    assert arch.macs_per_cycle == rows * rows
    assert Arch.from_dict(arch.to_dict()) == arch


def write(tmp_path, text):
    path = tmp_path / "arch.toml"
    path.write_text(text)
    return path


def default_text():
    from simulator.arch import PRESETS
    return (PRESETS / "default.toml").read_text()


def test_user_file(tmp_path):
    path = write(tmp_path, default_text().replace('name = "default"', 'name = "mine"'))
    assert Arch.load(path).name == "mine"
    assert Arch.load(str(path)).name == "mine"


@pytest.mark.parametrize("old,new,message", [
    ("rows = 16", "rows = -16", "array.rows = -16: expected a positive integer"),
    ('dataflow = "weight_stationary"', 'dataflow = "row_stationary"',
     "array.dataflow = 'row_stationary': expected one of weight_stationary, output_stationary"),
    ("preload_overlap = true", "preload_overlap = 1", "array.preload_overlap = 1: expected true"),
    ("row_bytes = 16", "row_bytes = 32", "memory.scratchpad.row_bytes = 32: expected 16"),
    ("latency_cycles = 100", "", "missing key 'dma.latency_cycles'"),
    ("lanes = 16", "lanes = 16\nwidth = 3", "unknown key 'vector.width'"),
    ('"REDUCE"]', '"FFT"]', "vector.ops"),
    ("size_bytes = 65536", "size_bytes = 65537", "expected a multiple of row_bytes"),
    # Nothing modelled memory banks: a file that still names them says so.
    ("row_bytes = 16", "row_bytes = 16\nbanks = 4",
     ("key 'memory.scratchpad.banks' is no longer read (the machine does not model memory "
      "banks): delete it")),
])
def test_errors_name_file_key_and_expectation(tmp_path, old, new, message):
    path = write(tmp_path, default_text().replace(old, new, 1))
    with pytest.raises(SimulatorError) as info:
        Arch.load(path)
    assert str(path) in str(info.value) and message in str(info.value), str(info.value)


def test_unknown_preset_and_bad_toml(tmp_path):
    with pytest.raises(SimulatorError, match="unknown target 'huge'.*default, edge, large"):
        Arch.load("huge")
    with pytest.raises(SimulatorError, match="not valid TOML"):
        Arch.load(write(tmp_path, "name = "))
    with pytest.raises(SimulatorError, match="cannot read"):
        Arch.load(tmp_path / "missing.toml")


def test_area_counts_pes_local_memory_and_lanes():
    arch = Arch.load("default")
    assert arch.sram_bytes == 256 * 1024 + 64 * 1024
    assert arch.area_um2 == 256 * 419.0 + arch.sram_bytes * 5.536 + 16 * 3632.0
    assert Arch.load("edge").area_um2 < arch.area_um2 < Arch.load("large").area_um2


def test_a_file_without_area_gets_the_default_figures(tmp_path):
    """Program headers written before [area] existed still load, with the presets' figures."""
    from simulator.arch import DEFAULT_AREA
    data = Arch.load("default").to_dict()
    del data["area"]
    assert Arch.from_dict(data) == Arch.load("default")
    assert Arch.from_dict(data).area.pe_um2 == DEFAULT_AREA["pe_um2"]
    with pytest.raises(SimulatorError, match="area.pe_um2 = -1: expected a non-negative"):
        Arch.from_dict({**data, "area": {"pe_um2": -1}}, source="mine")
