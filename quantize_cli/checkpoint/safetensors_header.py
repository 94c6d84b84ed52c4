"""Strict safetensors header parsing (torch-free: planning, ``check`` and ``--dry-run`` need no torch).

A safetensors file is ``u64 little-endian header length N | N bytes of JSON | data``. The JSON maps
tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the data
section) plus an optional ``"__metadata__"`` string map.

We parse headers ourselves instead of through ``safetensors.safe_open`` because checkpoints from
strangers must be validated before anything is allocated or read, with errors that name the file
and the rule (duplicate keys, offsets past the end, overlaps, dtype x shape mismatches). Tensor
reads (raw bytes and torch tensors) live in :mod:`.safetensors_io`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from ..errors import SourceError

# Header JSON larger than this is refused before it is read (the safetensors library uses 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024

# More dimensions than torch supports cannot be a real tensor.
MAX_RANK = 64

# safetensors dtype name -> (bits per element, torch dtype name or None when torch lacks it).
DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (8, "bool"),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "U16": (16, "uint16"),
    "I16": (16, "int16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "U32": (32, "uint32"),
    "I32": (32, "int32"),
    "F32": (32, "float32"),
    "U64": (64, "uint64"),
    "I64": (64, "int64"),
    "F64": (64, "float64"),
    "C64": (64, "complex64"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
}

FLOAT_SOURCE_DTYPES = ("BF16", "F16", "F32")


def nbytes_of(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes taken by a tensor of safetensors dtype `dtype` and `shape`."""
    bits = DTYPES[dtype][0]
    return math.prod(shape) * bits // 8


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, absolute byte offset and size, dtype name and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: str
    offset: int
    nbytes: int

    @property
    def module(self) -> str:
        """The module part of the name (``a.b.weight`` -> ``a.b``)."""
        return self.name.rpartition(".")[0]

    @property
    def leaf(self) -> str:
        """The last name component (``a.b.weight`` -> ``weight``)."""
        return self.name.rpartition(".")[2]


@dataclass(frozen=True)
class Header:
    """A parsed, validated safetensors header."""

    path: str
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int
    file_size: int


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def read_header(path: str, display: str | None = None) -> Header:
    """Parse and validate the header of the safetensors file at `path`.

    Raises :class:`SourceError` naming `display` (default: the path) for every malformed case:
    short file, header length past the end or absurdly large, non-UTF-8 or non-JSON header,
    duplicate keys, unknown dtype, bad shape, offsets that overlap, run past the end of the file or
    disagree with dtype x shape.
    """
    where = display or path
    fix = "re-download or re-export the file"
    try:
        file_size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SourceError(f"{where}: file is {file_size} bytes, too short for a safetensors header; {fix}")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > MAX_HEADER_BYTES or 8 + n > file_size:
                raise SourceError(
                    f"{where}: header length {n} is invalid for a {file_size}-byte file "
                    f"(must be 1..{min(MAX_HEADER_BYTES, max(file_size - 8, 0))}); the file is truncated or not safetensors; {fix}"
                )
            raw = f.read(n)
    except OSError as exc:
        raise SourceError(f"{where}: cannot read ({exc.strerror or exc}); check the path and permissions") from exc
    if len(raw) != n:  # the file shrank between stat and read
        raise SourceError(f"{where}: file ended inside its {n}-byte header; the file is truncated; {fix}")
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise SourceError(f"{where}: header is not UTF-8 ({exc.reason} at byte {exc.start}); {fix}") from exc
    except RecursionError:
        raise SourceError(f"{where}: header JSON is nested too deeply to be a safetensors header; {fix}") from None
    except ValueError as exc:  # JSONDecodeError, duplicate keys, integers too long to convert
        raise SourceError(f"{where}: header is not valid JSON ({_one_line(exc)}); {fix}") from exc
    if not isinstance(doc, dict):
        raise SourceError(f"{where}: header must be a JSON object, got {type(doc).__name__}; {fix}")
    data_start = 8 + n
    tensors, metadata = _parse_entries(doc, where, file_size - data_start, path, data_start)
    return Header(path=path, tensors=tensors, metadata=metadata, data_start=data_start, file_size=file_size)


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    if "integer string conversion" in text:  # Python's advice (set_int_max_str_digits) is not the user's fix
        text = "an integer with thousands of digits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _num(n: int) -> str:
    """A byte count for a message; absurd values (thousands of digits) are not spelled out."""
    return str(n) if n < 10**30 else "more than 10^30"


def _short(value: object, limit: int = 120) -> str:
    """repr(value) on one line, cut to `limit` characters (names and shapes come from strangers)."""
    return _one_line(repr(value), limit)


def _parse_entries(doc: dict, where: str, data_len: int, path: str, data_start: int):
    metadata = doc.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SourceError(f"{where}: __metadata__ must map strings to strings; the file is corrupt; re-export it")
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, entry in doc.items():
        info = _parse_entry(name, entry, where, data_len, path, data_start)
        tensors[name] = info
        spans.append((info.offset, info.offset + info.nbytes, name))
    spans.sort()
    for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise SourceError(f"{where}: tensors {_short(n0)} and {_short(n1)} overlap (bytes {b1}..{e0}); the file is corrupt; re-export it")
    return tensors, metadata


def _parse_entry(name, entry, where, data_len, path, data_start) -> TensorInfo:
    bad = f"{where}: tensor {_short(name)}"
    if not isinstance(entry, dict) or set(entry) - {"dtype", "shape", "data_offsets"} or len(entry) != 3:
        raise SourceError(f"{bad} must have exactly dtype, shape and data_offsets; the file is corrupt")
    dtype, shape, offs = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SourceError(f"{bad} has unknown dtype {_short(dtype, 60)} (known: {', '.join(DTYPES)}); convert it to a standard dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise SourceError(f"{bad} has an invalid shape {_short(shape)}: must be a list of non-negative integers; the file is corrupt; re-export it")
    if len(shape) > MAX_RANK:  # also bounds the big-integer product below
        raise SourceError(f"{bad} has {len(shape)} dimensions, more than torch's {MAX_RANK}; the file is corrupt")
    if (
        not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)
        or not 0 <= offs[0] <= offs[1]
    ):
        raise SourceError(f"{bad} has invalid data_offsets {_short(offs)}: must be [begin, end] with 0 <= begin <= end")
    size = nbytes_of(dtype, tuple(shape))
    if offs[1] - offs[0] != size:
        raise SourceError(
            f"{bad}: data_offsets span {_num(offs[1] - offs[0])} bytes but {dtype}{_short(shape, 80)} needs {_num(size)}; the file is corrupt; re-export it"
        )
    if offs[1] > data_len:
        raise SourceError(
            f"{bad} ends at data byte {_num(offs[1])} but the file holds only {data_len}; the file is truncated; re-download it"
        )
    return TensorInfo(name, dtype, tuple(shape), path, data_start + offs[0], size)


SAFETENSORS_METADATA = {"format": "pt"}


def shard_header(tensors: list) -> bytes:
    """The header bytes (length prefix included) for `tensors` (OutTensor-like, in data order)."""
    doc: dict = {"__metadata__": SAFETENSORS_METADATA}
    for t in tensors:
        doc[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.offset, t.offset + t.nbytes]}
    raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def read_bytes_into(info: TensorInfo, out: memoryview, start: int = 0, length: int | None = None) -> None:
    """Read `length` bytes of `info` (from byte `start` within the tensor) into `out`.
    (Torch-free: the torch-free copy of verbatim tensors while torch loads, run/copy_ahead.py.)"""
    length = info.nbytes - start if length is None else length
    try:
        fd = os.open(info.path, os.O_RDONLY)
    except OSError as exc:
        raise SourceError(f"{info.path}: cannot open to read {info.name!r} ({exc.strerror}); was the source changed during the run?") from exc
    try:
        got = 0
        while got < length:
            try:
                n = os.preadv(fd, [out[got:length]], info.offset + start + got)
            except OSError as exc:
                raise SourceError(f"{info.path}: read error in {info.name!r} ({exc.strerror}); check the disk and re-download the file") from exc
            if n == 0:
                raise SourceError(
                    f"{info.path}: unexpected end of file while reading {info.name!r}; the file was truncated during the run; re-download it"
                )
            got += n
    finally:
        os.close(fd)
