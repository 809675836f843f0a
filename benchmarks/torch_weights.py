"""A PyTorch state dict (.pth) as numpy arrays, without torch.

A .pth is pickled: its tensors are `torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, ...)` calls whose storages are persistent ids pointing at raw little-endian data kept
outside the pickle: in the zip's `archive/data/KEY` members (torch 1.6 and later) or, in the
legacy format, after the pickle as (int64 element count, raw bytes) records in the order of a
pickled list of keys. This module reads both; it runs no code from the file beyond building
tensors, ordered dicts and the storage types.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
STORAGE_DTYPES = {"FloatStorage": np.float32, "DoubleStorage": np.float64,
                  "HalfStorage": np.float16, "LongStorage": np.int64, "IntStorage": np.int32,
                  "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
                  "BoolStorage": np.bool_}


@dataclass
class _Storage:
    dtype: type
    key: str
    data: np.ndarray | None = None  # filled once the raw bytes are read


@dataclass
class _Tensor:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def array(self) -> np.ndarray:
        flat = self.storage.data
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(
            flat[self.offset:], self.size, tuple(s * item for s in self.stride)).copy()


def _rebuild_tensor(storage, offset, size, stride, *_rest):
    return _Tensor(storage, offset, tuple(size), tuple(stride))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, storages: dict[str, _Storage]):
        super().__init__(file)
        self.storages = storages

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"a state dict holds no {module}.{name}")

    def persistent_load(self, saved_id):
        kind, dtype, key, _location, _numel, *view = saved_id
        if kind != "storage" or (view and view[0] is not None):
            raise pickle.UnpicklingError(f"unsupported persistent id {saved_id[:3]}")
        return self.storages.setdefault(str(key), _Storage(dtype, str(key)))


def load_state_dict(path: Path) -> dict[str, np.ndarray]:
    """The state dict at `path`, each tensor a numpy array of its dtype and shape."""
    storages: dict[str, _Storage] = {}
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            root = names[0].split("/")[0]
            state = _Unpickler(io.BytesIO(archive.read(f"{root}/data.pkl")), storages).load()
            for key, storage in storages.items():
                storage.data = np.frombuffer(archive.read(f"{root}/data/{key}"),
                                             np.dtype(storage.dtype).newbyteorder("<"))
    else:
        with open(path, "rb") as file:
            if pickle.load(file) != LEGACY_MAGIC:
                raise ValueError(f"{path}: neither a zip nor a legacy torch file")
            pickle.load(file)  # the protocol version
            pickle.load(file)  # the saving system's type sizes and byte order
            state = _Unpickler(file, storages).load()
            for key in pickle.load(file):
                storage = storages[str(key)]
                count = int(np.frombuffer(file.read(8), "<i8")[0])
                dtype = np.dtype(storage.dtype).newbyteorder("<")
                storage.data = np.frombuffer(file.read(count * dtype.itemsize), dtype)
    return {name: value.array() for name, value in state.items() if isinstance(value, _Tensor)}
