"""What both sides of a protocol share: reply validation, label encoding and the label holder.

Strategies validate every client reply against `ArraySpec`s before aggregating; clients encode label
vectors with `label_dtype`. Both import from here, so `clients/` and `strategies/` never import each other.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
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


def encode_array(array: np.ndarray) -> bytes:
    """An array as `np.save` bytes (no pickle), for a metrics or config value."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def decode_array(blob: bytes) -> np.ndarray:
    """The inverse of `encode_array`; ValueError for anything that is not a plain saved array."""
    if not isinstance(blob, bytes):
        raise ValueError(f"expected bytes, got {type(blob).__name__}")
    try:
        return np.load(io.BytesIO(blob), allow_pickle=False)
    except (OSError, EOFError) as exc:
        raise ValueError(f"not a saved array: {exc}") from None
