"""What both sides of a protocol share: reply validation, label encoding, the label holder, and the one
codec for arrays carried in metrics.

Strategies validate every client reply against `ArraySpec`s before aggregating; clients encode label
vectors with `label_dtype`; arrays that travel in a reply's metrics (cluster sizes, contingency tables,
the report's sums, SecAgg+'s clear part) are bytes of `encode_array`, `encode_arrays` or `encode_counts`,
and a blob that does not decode is a `ReplyError`, as every other malformed reply. Both sides import
from here, so `clients/` and `strategies/` never import each other.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np


class ReplyError(ValueError):
    """A client reply that does not match what the protocol expects (rejected, never aggregated)."""


@dataclass(frozen=True)
class ArraySpec:
    """Expected array in a reply: `shape` entries of None match any length; `kind` is a numpy dtype kind.

    `dtype` (a numpy dtype name such as "float32") additionally demands that exact type: model state must
    load without a silent cast, so torch glue asks for it (`fedapp.neural.glue.StateSchema.array_specs`).
    """

    name: str
    shape: tuple[int | None, ...]
    kind: str = "f"  # "f" float, "i" integer (signed or unsigned)
    dtype: str | None = None


def check_arrays(arrays: Sequence[np.ndarray], specs: Sequence[ArraySpec]) -> None:
    """Raise ReplyError unless `arrays` match `specs` in count, rank, shape, dtype kind and finiteness."""
    if len(arrays) != len(specs):
        raise ReplyError(f"expected {len(specs)} arrays, got {len(arrays)}: {_count_mismatch(arrays, specs)}")
    for array, spec in zip(arrays, specs, strict=True):
        if array.ndim != len(spec.shape) or any(
            want is not None and got != want for got, want in zip(array.shape, spec.shape, strict=True)
        ):
            raise ReplyError(f"'{spec.name}' has shape {array.shape}, expected {spec.shape}")
        kinds = "iu" if spec.kind == "i" else spec.kind
        if array.dtype.kind not in kinds:
            raise ReplyError(f"'{spec.name}' has dtype {array.dtype}, expected kind '{spec.kind}'")
        if spec.dtype is not None and array.dtype != np.dtype(spec.dtype):
            raise ReplyError(f"'{spec.name}' has dtype {array.dtype}, expected {spec.dtype}")
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise ReplyError(f"'{spec.name}' contains NaN or infinite values")


def _count_mismatch(arrays: Sequence[np.ndarray], specs: Sequence[ArraySpec]) -> str:
    """Name the first array that is missing or extra (a model's state has too many names to list)."""
    if len(arrays) < len(specs):
        return f"first missing '{specs[len(arrays)].name}'"
    return f"first extra has shape {np.shape(arrays[len(specs)])}"


LABEL_HOLDER = 0  # vertical federation: the party whose copy of the labels scores the consensus


def label_dtype(k: int) -> np.dtype:
    """Smallest unsigned integer type for labels in [0, k): what crosses the wire for label vectors."""
    return np.dtype(np.uint8 if k <= 256 else np.uint16 if k <= 65536 else np.int32)


# ------------------------------------------------------------------------ arrays carried in metrics
# A metrics value is a scalar or bytes, so arrays travel as bytes in one of three forms: one array as
# `np.save` bytes, several (named or positional) as an `np.savez` archive, a table of counts in the compact
# form below. Nothing is pickled; a blob that does not decode is a `ReplyError`, whoever sent it.
_COUNTS_MAGIC = b"FCT1"  # counts: magic, NumPy dtype string (3 ASCII bytes), rows, cols, then the counts
_COUNTS_HEADER = struct.Struct("<4s3sII")  # row-major in the narrowest unsigned dtype holding the largest
_COUNTS_DTYPES = ("|u1", "<u2", "<u4", "<u8")


def encode_array(array: np.ndarray) -> bytes:
    """One array as `np.save` bytes."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def decode_array(blob: object, what: str = "array") -> np.ndarray:
    """The inverse of `encode_array`; ReplyError for anything that is not one saved array."""
    loaded = _load(blob, what)
    if not isinstance(loaded, np.ndarray):
        raise ReplyError(f"{what}: an archive of arrays, expected one saved array")
    return loaded


def encode_arrays(*arrays: np.ndarray, **named: np.ndarray) -> bytes:
    """Several arrays as one `np.savez` archive: positional ones as arr_0, arr_1, ..., named ones by name.

    Arrays are stored as given (not made contiguous, which would turn a 0-d array 1-d)."""
    buffer = io.BytesIO()
    np.savez(buffer, *arrays, **named)
    return buffer.getvalue()


def decode_arrays(blob: object, what: str, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The inverse of `encode_arrays`: name -> array; ReplyError for a malformed archive or, when `names`
    is given, one that does not hold exactly those arrays."""
    archive = _load(blob, what)
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ReplyError(f"{what}: one saved array, expected an archive of arrays")
    with archive:
        if names is not None and set(archive.files) != set(names):
            raise ReplyError(f"{what} holds {sorted(archive.files)}, expected {sorted(names)}")
        try:
            return {name: archive[name] for name in archive.files}
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
            raise ReplyError(f"{what} is not a valid archive of arrays: {exc}".splitlines()[0]) from None


def _load(blob: object, what: str) -> np.ndarray | np.lib.npyio.NpzFile:
    if blob is None:
        raise ReplyError(f"metrics lack {what}")
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise ReplyError(f"{what} must be bytes, got {type(blob).__name__}")
    try:
        return np.load(io.BytesIO(bytes(blob)), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ReplyError(f"{what} is not saved arrays: {exc}".splitlines()[0]) from None


def encode_counts(counts: np.ndarray) -> bytes:
    """A non-empty 2-D table of non-negative integer counts (a contingency table) in the compact form: one
    byte a count when the largest is below 256, plus a 15-byte header."""
    counts = np.asarray(counts)
    if counts.ndim != 2 or 0 in counts.shape or counts.dtype.kind not in "iu" or (counts < 0).any():
        raise ValueError(
            f"counts must be a non-empty 2-D table of integers >= 0, got {counts.dtype} {counts.shape}"
        )
    largest = int(counts.max())
    wire_dtype = next(code for code in _COUNTS_DTYPES if largest <= np.iinfo(np.dtype(code)).max)
    header = _COUNTS_HEADER.pack(_COUNTS_MAGIC, wire_dtype.encode("ascii"), *counts.shape)
    return header + counts.astype(wire_dtype).tobytes(order="C")


def decode_counts(blob: object) -> np.ndarray:
    """The inverse of `encode_counts` (int64); ReplyError for anything that is not a well-formed table.

    Negative counts and tables that are not 2-D cannot be expressed in the form (unsigned counts, two
    dimensions), so a blob that decodes is a valid table."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise ReplyError(f"an encoded table must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < _COUNTS_HEADER.size:
        raise ReplyError(
            f"encoded table too short: {len(blob)} bytes, the header alone is {_COUNTS_HEADER.size}"
        )
    magic, dtype_code, n_rows, n_cols = _COUNTS_HEADER.unpack_from(blob)
    if magic != _COUNTS_MAGIC:
        raise ReplyError(f"not an encoded contingency table (magic {magic!r}, expected {_COUNTS_MAGIC!r})")
    wire_dtype = dtype_code.decode("ascii", errors="replace")
    if wire_dtype not in _COUNTS_DTYPES:
        raise ReplyError(f"unsupported count dtype {wire_dtype!r}; expected one of {_COUNTS_DTYPES}")
    if n_rows < 1 or n_cols < 1:
        raise ReplyError(f"encoded table has an empty shape ({n_rows}, {n_cols})")
    expected = _COUNTS_HEADER.size + n_rows * n_cols * np.dtype(wire_dtype).itemsize
    if len(blob) != expected:
        raise ReplyError(f"encoded ({n_rows}, {n_cols}) table should be {expected} bytes, got {len(blob)}")
    counts = np.frombuffer(blob, dtype=wire_dtype, offset=_COUNTS_HEADER.size).reshape(n_rows, n_cols)
    if counts.max() > np.iinfo(np.int64).max:
        raise ReplyError("encoded table holds a count that does not fit in int64")
    return counts.astype(np.int64)
