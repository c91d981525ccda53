"""What a reply looks like under Flower's SecAgg+ (run-config `secagg`), for client and strategy alike.

SecAgg+ hands the server one thing per round: the n-weighted average sum_i n_i x_i / sum_i n_i of the
clients' masked arrays (x_i quantised after clipping to +-`secagg-clip`). Each array of a method's plain
reply is one of three kinds:

- SUM (per-cluster sums, counts, document frequencies): the client sends x / n, so the secure average
  times N = sum_i n_i is sum_i x_i; the values sent are per-sample means, bounded by the data's range.
- MEAN (model weights, gradients, BatchNorm statistics): already an n-weighted average; sent as is.
- CLEAR: what is not a sum travels in the clear in the reply's metrics (`CLEAR_KEY`): integer counters
  (BatchNorm's `num_batches_tracked`, which clipping would destroy) and messages that are not sums by
  nature (CCFC's local centroids). A method's docs say which of its arrays these are.
- CENTRES: per-cluster means weighted by the counts in the array that follows (FSTC's local centres,
  Eq. 16): sent as the per-cluster sums (centre x count) over n, so their total over the counts' total is
  the weighted average.

`secure_upload` is the client's side; `plain_replies` turns the one secure average back into per-reply
arrays that the method's plain aggregation maps to the same result (sum -> avg * n_i, mean -> avg, clear
-> the client's own), so a strategy keeps one aggregation path for both runs.

Quantisation error (flwr's `quantization_range` 2**22, weights n / `secagg-max-weight` quantised alike):
a SUM total is off by about sqrt(m) * clip * max_weight / 2**22 (m clients), a MEAN by that over N.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedapp.wire import ArraySpec, ReplyError, decode_arrays, encode_arrays

SUM, MEAN, CLEAR, CENTRES = "sum", "mean", "clear", "centres"
MODES = (SUM, MEAN, CLEAR, CENTRES)
CLEAR_KEY = "secagg-clear"  # metrics: the reply's CLEAR arrays (`fedapp.wire.encode_arrays`, positional)
CLIPPED_KEY = "secagg-clipped"  # metrics: how many uploaded values SecAgg+ will clip (should be 0)
SECAGG_QUANTISATION_RANGE = 1 << 22  # flwr's SecAggPlusWorkflow default, which server_loop keeps


def model_modes(arrays: Sequence[np.ndarray] | Sequence[str]) -> list[str]:
    """Modes of a model's state: float tensors are averaged securely, integer counters go in the clear.

    Takes arrays or dtype names (a `StateSchema`'s)."""
    kinds = [np.dtype(a if isinstance(a, str) else a.dtype).kind for a in arrays]
    return [CLEAR if kind in "iub" else MEAN for kind in kinds]


def decode_clear(blob: object, count: int) -> list[np.ndarray]:
    """A reply's CLEAR arrays (`CLEAR_KEY`, positional `fedapp.wire.encode_arrays`); ReplyError unless it
    holds exactly `count` of them."""
    arrays = decode_arrays(blob, f"'{CLEAR_KEY}'")
    names = [f"arr_{i}" for i in range(count)]
    if len(arrays) != count:
        raise ReplyError(f"'{CLEAR_KEY}' holds {len(arrays)} arrays, expected {count}")
    if set(arrays) != set(names):
        raise ReplyError(f"'{CLEAR_KEY}' holds {sorted(arrays)}, expected {names}")
    return [arrays[name] for name in names]


def secure_upload(
    arrays: Sequence[np.ndarray], modes: Sequence[str], n: int, clip: float
) -> tuple[list[np.ndarray], dict[str, bytes | int]]:
    """Client: (the arrays SecAgg+ masks, the metrics to add) for a plain reply of `arrays` with weight n.

    SUM arrays are divided by n, MEAN arrays pass, CLEAR arrays move to the metrics. `CLIPPED_KEY`
    counts values beyond +-clip, which SecAgg+ would silently clip (a wrong, not a noisy, result)."""
    if len(arrays) != len(modes) or any(mode not in MODES for mode in modes):
        raise ValueError(f"{len(arrays)} arrays, modes {list(modes)}")
    if n < 1:
        raise ValueError(f"weight n={n}: SecAgg+ needs a positive sample count")
    masked, clear = [], []
    for index, (array, mode) in enumerate(zip(arrays, modes, strict=True)):
        if mode == CLEAR:
            clear.append(np.asarray(array))
            continue
        values = np.asarray(array, dtype=np.float64)
        if mode == CENTRES:  # the per-cluster sums: centre times its count (the next array)
            values = values * np.asarray(arrays[index + 1], dtype=np.float64)[:, None]
        masked.append(values if mode == MEAN else values / n)
    clipped = int(sum(int((np.abs(a) > clip).sum()) for a in masked))
    return masked, {CLEAR_KEY: encode_arrays(*clear), CLIPPED_KEY: clipped}


def secure_specs(specs: Sequence[ArraySpec], modes: Sequence[str]) -> list[ArraySpec]:
    """Strategy: what the secure average looks like (float, same shapes) for a plain reply of `specs`."""
    return [
        ArraySpec(spec.name, spec.shape, "f")
        for spec, mode in zip(specs, modes, strict=True)
        if mode != CLEAR
    ]


def plain_replies(
    average: Sequence[np.ndarray],
    clear_blobs: Sequence[object],
    weights: Sequence[int],
    modes: Sequence[str],
    dtypes: Sequence[str | None],
) -> list[list[np.ndarray]]:
    """Strategy: per reply, arrays the plain aggregation maps to the secure result.

    `average` is SecAgg+'s output (every reply holds the same), `weights` the n_i of every reply that
    went into it. SUM -> average * n_i (they add up to the total), MEAN -> the average cast to its
    dtype (their weighted mean is itself), CLEAR -> that client's own array."""
    if len(average) != sum(mode != CLEAR for mode in modes):
        raise ReplyError(f"secure average of {len(average)} arrays, modes {list(modes)}")
    n_clear = sum(mode == CLEAR for mode in modes)
    clears = [decode_clear(blob, n_clear) for blob in clear_blobs]
    replies = []
    for n, own in zip(weights, clears, strict=True):
        secure, clear, arrays = iter(average), iter(own), []
        for mode, dtype in zip(modes, dtypes, strict=True):
            if mode == CLEAR:
                arrays.append(next(clear))
                continue
            value = np.asarray(next(secure), dtype=np.float64)
            value = value if mode == MEAN else value * n  # SUM, CENTRES: this reply's share of the total
            arrays.append(value.astype(dtype) if dtype else value)
        replies.append(arrays)
    return replies


def sum_tolerance(clip: float, max_weight: float, clients: int) -> float:
    """A bound (4 sigma of stochastic rounding + weight quantisation) on a SUM total's absolute error."""
    return 4.0 * np.sqrt(max(clients, 1)) * clip * max_weight / SECAGG_QUANTISATION_RANGE
