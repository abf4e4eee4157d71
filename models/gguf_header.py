"""Parsing a GGUF file's header: its metadata and where each tensor's bytes lie.

gguf.GGUFReader builds a numpy view per array element, seconds for SmolLM2's 150k tokenizer
entries; this parse does without them, so launch checks that read the config stay fast. gguf
supplies the format's constants; models/gguf.py reads the tensors through the result.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

SUPPORTED_VERSIONS = (2, 3)
_SCALARS = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
            GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
            GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
            GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
_STRUCTS = {t: struct.Struct(f) for t, f in _SCALARS.items()}
_U32, _U64 = _STRUCTS[GGUFValueType.UINT32], _STRUCTS[GGUFValueType.UINT64]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order (rows first): the file's dimensions reversed
    offset: int             # of the first byte, from the start of the file
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    file: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]


class _Cursor:
    """Little-endian reads from the start of a buffer; a read past its end raises struct.error."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def read(self, s: struct.Struct):
        (value,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return value

    def count(self, item_bytes: int) -> int:
        n = self.read(_U64)
        if n * item_bytes > len(self.buf) - self.pos:
            raise struct.error(f"{n} items of {item_bytes} bytes at byte {self.pos} run past the end")
        return n

    def string(self) -> str:
        n = self.count(1)
        self.pos += n
        return self.buf[self.pos - n:self.pos].decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            itype = self.read(_U32)
            if itype in _SCALARS:  # one numpy read, not one per element
                n = self.count(_STRUCTS[itype].size)
                items = np.frombuffer(self.buf, _SCALARS[itype], n, self.pos)
                self.pos += items.nbytes
                return items.tolist()
            return [self.value(itype) for _ in range(self.count(8))]
        if vtype not in _STRUCTS:
            raise ValueError(f"unknown metadata value type {vtype} at byte {self.pos}")
        value = self.read(_STRUCTS[vtype])
        # float32 as the shortest decimal that reads back the same (1e-05, not 9.999999747378752e-06)
        return float(str(np.float32(value))) if vtype == GGUFValueType.FLOAT32 else value


def read_gguf_header(file: str | Path) -> GGUFHeader:
    """Metadata and tensor layout of a GGUF file; raises ValueError naming the file when it is not
    GGUF, is truncated (header or tensor data), or holds a tensor type gguf does not know."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such GGUF file")
    size = file.stat().st_size
    with open(file, "rb") as f:
        if f.read(4) != GGUF_MAGIC.to_bytes(4, "little"):
            raise ValueError(f"{file}: not a GGUF file (no GGUF magic at the start)")
        # Not closed explicitly: numpy views may still export it while an error unwinds.
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        metadata, raw_tensors, data_start = _parse(_Cursor(buf), file)
    except struct.error as e:
        raise ValueError(f"{file}: truncated or corrupt GGUF header ({e})") from None
    tensors = {}
    for name, dims, raw_type, offset in raw_tensors:
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise ValueError(f"{file}: tensor {name!r} has unknown GGML type id {raw_type}") from None
        block, type_bytes = GGML_QUANT_SIZES[qtype]
        elements = int(np.prod(dims))
        if dims and dims[0] % block:
            raise ValueError(f"{file}: tensor {name!r}: row of {dims[0]} is not a whole number of "
                             f"{qtype.name} blocks of {block}")
        info = TensorInfo(name, qtype, tuple(reversed(dims)), data_start + offset, elements // block * type_bytes)
        if info.offset + info.n_bytes > size:
            raise ValueError(f"{file}: tensor {name!r} ends at byte {info.offset + info.n_bytes}, past the end "
                             f"of the {size}-byte file: the file is truncated")
        tensors[name] = info
    return GGUFHeader(file, metadata, tensors)


def _parse(c: _Cursor, file: Path) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    c.pos = 4
    version = c.read(_U32)
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{file}: GGUF version {version} is not supported (need {SUPPORTED_VERSIONS}, "
                         f"little-endian)")
    n_tensors, n_kv = c.read(_U64), c.read(_U64)
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.read(_U32))
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.read(_U64) for _ in range(c.read(_U32))]
        tensors.append((name, dims, c.read(_U32), c.read(_U64)))
    align = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ValueError(f"{file}: general.alignment {align!r} is not a power of two")
    return metadata, tensors, -(-c.pos // align) * align
