"""Calibration data in array files: one .npz or .npy, a folder of them, or random samples."""

from __future__ import annotations

import zipfile
from pathlib import Path
from tokenize import TokenError
from typing import Iterator

import numpy as np

from profiler.batching import LABELS, Chunk, skip
from profiler.errors import ProfileError
from profiler.model_inputs import InputSpec

_CHUNK_SAMPLES = 64
_CHUNK_BYTES = 4 << 20  # read at most this much at a time, so big samples come a few at once


class ArrayFile:
    """One .npz keyed by input name (samples on the first axis), or one .npy for one input."""

    def __init__(self, path: Path, specs: list[InputSpec]):
        self.path, self.specs = path, specs

    def describe(self) -> dict:
        return {"kind": "npz" if self.path.suffix == ".npz" else "npy", "path": str(self.path)}

    def count(self) -> int | None:
        spec = self.specs[0]
        shape = _headers(self.path, self.specs).get(spec.name)
        if shape is None:
            return None
        return shape[0] if _rows_are_samples(len(shape), spec) else 1

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        yield from _read_chunks(self.path, self.specs, start)


class ArrayDirectory:
    """Every .npy and .npz file under a folder, in name order; each holds one or more samples."""

    def __init__(self, path: Path, files: list[Path], specs: list[InputSpec]):
        self.path, self.files, self.specs = path, files, specs

    def describe(self) -> dict:
        return {"kind": "array-directory", "path": str(self.path), "files": len(self.files)}

    def count(self) -> int | None:
        counts = [ArrayFile(file, self.specs).count() for file in self.files]
        return None if None in counts else sum(counts)

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        for file in self.files:
            if start > 0:  # a file wholly before `start` is not read, only its headers
                held = ArrayFile(file, self.specs).count()
                if held is not None and held <= start:
                    start -= held
                    continue
            yield from _read_chunks(file, self.specs, start)
            start = 0


class RandomData:
    """Synthetic samples for a quick run: normal(0, 1) floats, integers in [0, 10)."""

    def __init__(self, samples: int, specs: list[InputSpec], seed: int):
        for spec in specs:
            if None in spec.shape[1:]:
                raise ProfileError(f"--random: input '{spec.name}' has dynamic shape {spec}; "
                                   f"fix it with --input-shape {spec.name}=...")
        self.samples, self.specs, self.seed = samples, specs, seed

    def describe(self) -> dict:
        return {"kind": "random", "synthetic": True, "samples": self.samples,
                "seed": self.seed, "distribution": "normal(0,1) floats, integers in [0,10)"}

    def count(self) -> int | None:
        return self.samples

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """The same samples wherever a shard starts: drawn in the same chunks, from one seed."""
        yield from skip(self._chunks(), start, self.specs)

    def _chunks(self) -> Iterator[Chunk]:
        rng = np.random.default_rng(self.seed)
        for first in range(0, self.samples, _CHUNK_SAMPLES):
            n = min(_CHUNK_SAMPLES, self.samples - first)
            yield "--random", {s.name: _random(rng, s, n) for s in self.specs}


def _random(rng: np.random.Generator, spec: InputSpec, n: int) -> np.ndarray:
    shape = (n, *spec.shape[1:])
    if spec.dtype.kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if spec.dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 10, shape).astype(spec.dtype)


def _read_chunks(path: Path, specs: list[InputSpec], start: int = 0) -> Iterator[Chunk]:
    """Stream an .npy or .npz by rows when it holds many samples, so it need not fit in memory;
    from row `start` when rows are samples (seeking past the rows before), else whole."""
    try:
        if path.suffix == ".npy":
            yield from _npy_chunks(path, specs, start)
        else:
            yield from _npz_chunks(path, specs, start)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, NotImplementedError) as err:
        # NotImplementedError: a member compressed by a method zipfile does not implement.
        raise ProfileError(f"{path}: cannot read array file ({err})") from None


# Deflate's largest possible ratio of output to input bytes (a run of one byte value).
_MAX_DEFLATE_RATIO = 1032


def declared_arrays(path: str | Path, kind: str | None = None
                    ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's shape and element type from an .npy or .npz's headers (key "" for .npy),
    once the file is known to hold the bytes they declare. np.load allocates an array before
    reading it, so a 1 KiB file declaring 10^12 samples must be refused first. `kind` (".npy"
    or ".npz") says which the file is when its name does not."""
    path = Path(path)
    found = {}
    try:
        if (kind or path.suffix) == ".npy":
            with open(path, "rb") as f:
                reader = _RowReader(f)
                found[""] = reader.shape, reader.dtype
                _check_declared(path, "", reader, path.stat().st_size - f.tell())
        else:
            with zipfile.ZipFile(path) as archive:
                for info in archive.infolist():
                    if not info.filename.endswith(".npy"):
                        continue
                    with archive.open(info) as f:
                        reader = _RowReader(f)
                        header = f.tell()
                    name = info.filename[:-len(".npy")]
                    found[name] = reader.shape, reader.dtype
                    held = info.file_size
                    if info.compress_type == zipfile.ZIP_STORED:
                        held = min(held, info.compress_size)
                    elif info.compress_type == zipfile.ZIP_DEFLATED:
                        held = min(held, info.compress_size * _MAX_DEFLATE_RATIO)
                    _check_declared(path, name, reader, held - header)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, NotImplementedError) as err:
        # NotImplementedError: a member compressed by a method zipfile does not implement.
        raise ProfileError(f"{path}: cannot read array file ({err})") from None
    return found


def _check_declared(path: Path, name: str, reader: _RowReader, held: int) -> None:
    declared = int(np.prod(reader.shape, dtype=object)) * reader.dtype.itemsize
    if declared > held:
        what = f"array {name!r}" if name else "its header"
        raise ProfileError(f"{path}: {what} declares shape {list(reader.shape)} of "
                           f"{reader.dtype} ({declared:,} bytes), but the file holds "
                           f"{max(held, 0):,} bytes of data")


def _npy_chunks(path: Path, specs: list[InputSpec], start: int) -> Iterator[Chunk]:
    if len(specs) != 1:
        raise ProfileError(f"{path}: an .npy file feeds a one-input model; this model has "
                           f"inputs {', '.join(s.name for s in specs)}: use .npz files keyed "
                           f"by input name")
    declared_arrays(path)
    with open(path, "rb") as f:
        yield from _rows(path, {specs[0].name: _RowReader(f)}, specs, start)


def _npz_chunks(path: Path, specs: list[InputSpec], start: int) -> Iterator[Chunk]:
    declared_arrays(path)
    with zipfile.ZipFile(path) as archive:
        wanted = {s.name for s in specs}
        readers = {Path(m).stem: _RowReader(archive.open(m)) for m in archive.namelist()
                   if m.endswith(".npy") and (Path(m).stem != LABELS or LABELS in wanted)}
        yield from _rows(path, readers, specs, start)


def _rows(path: Path, readers: dict[str, _RowReader], specs: list[InputSpec],
          start: int = 0) -> Iterator[Chunk]:
    """A few samples at a time when every array holds samples on its first axis, else whole.

    Plain reads rather than a memory map: mapped pages would count as the profiler's memory.
    """
    by_name = {s.name: s for s in specs}
    rows = {len(r.shape) and r.shape[0] for r in readers.values()}
    streamable = len(rows) == 1 and all(
        name in by_name and _rows_are_samples(len(r.shape), by_name[name])
        for name, r in readers.items())
    if not streamable:
        whole = str(path), {name: r.read_all() for name, r in readers.items()}
        yield from skip(iter([whole]), start, specs)
        return
    total = rows.pop()
    row_bytes = sum(r.row_bytes for r in readers.values())
    step = max(1, min(_CHUNK_SAMPLES, _CHUNK_BYTES // max(row_bytes, 1)))
    start = min(start, total)
    for reader in readers.values():
        reader.skip_rows(start)
    for first in range(start, total, step):
        n = min(step, total - first)
        yield str(path), {name: r.read_rows(n) for name, r in readers.items()}


def _rows_are_samples(ndim: int, spec: InputSpec) -> bool:
    return ndim in (len(spec.shape), len(spec.shape) + 1)


class _RowReader:
    """Reads one .npy member of a zip archive a few rows at a time."""

    def __init__(self, f):
        self.f = f
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        try:
            self.shape, fortran, self.dtype = read_header(f)
        except (SyntaxError, TokenError, RecursionError, MemoryError, TypeError) as err:
            # NumPy parses the header as a Python literal; a forged one fails in the parser.
            raise ValueError(f"a malformed .npy header ({type(err).__name__})") from None
        if fortran or self.dtype.hasobject:
            raise ValueError("Fortran-ordered or object arrays are not supported")
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def read_rows(self, n: int) -> np.ndarray:
        raw = self.f.read(n * self.row_bytes)
        if len(raw) != n * self.row_bytes:
            raise ValueError("file ends early (truncated?)")
        return np.frombuffer(raw, self.dtype).reshape((n, *self.shape[1:]))

    def skip_rows(self, n: int) -> None:
        """Past `n` rows without holding them (a stored member or a file seeks; a deflated
        member decompresses up to there)."""
        if n:
            self.f.seek(n * self.row_bytes, 1)

    def read_all(self) -> np.ndarray:
        size = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        raw = self.f.read(size)
        if len(raw) != size:
            raise ValueError("file ends early (truncated?)")
        return np.frombuffer(raw, self.dtype).reshape(self.shape)


def _headers(path: Path, specs: list[InputSpec]) -> dict[str, tuple]:
    """Array shapes from the file headers alone, for an ETA before reading any data."""
    try:
        if path.suffix == ".npy":
            with open(path, "rb") as f:
                return {specs[0].name: _RowReader(f).shape}
        with zipfile.ZipFile(path) as archive:
            return {Path(m).stem: _RowReader(archive.open(m)).shape
                    for m in archive.namelist() if m.endswith(".npy")}
    except (OSError, ValueError, zipfile.BadZipFile, NotImplementedError):
        return {}
