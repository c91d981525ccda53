"""The final report: after the last round every client labels all its records with the global model.

Two evaluate messages, driven by the config key `report` (the client side is `clients/report.py`, the
server side `strategies/report.py`):

1. ``assign``: the client assigns every local record (`Assignment`), writes `assignments.csv` on its own
   machine (`fedapp.report.assignments`), and returns only aggregates: cluster sizes, per-cluster sums in
   the space the method clusters in (`fedapp.metrics.label_free.ClusterSums`), per-cluster term document
   counts for text methods (terms in fewer than `keyword-min-docs` local documents of a cluster are
   withheld), and its contingency table when it has labels.
2. ``distances``: the server sends the pooled cluster means; the client returns per-cluster sums of
   distances to them and its silhouette sum (`fedapp.metrics.label_free.DistanceSums`), which
   Davies–Bouldin and the simplified silhouette need.

No per-record value crosses the wire in either message.

**Under SecAgg+** (run-config `secagg`) both stages are *fit* messages aggregated by Flower's SecAgg+
(`fedapp.app.secure_loop.run_secure_report`): the client returns its summable statistics as arrays
(`secure_assign_arrays`, `secure_distance_arrays`, sums over n as `fedapp.privacy.secagg` encodes them), and
the server learns only their totals. Per client in the clear: its row count (SecAgg+'s weight), its
score kind, the number of clusters its privacy floor withheld (zeros in those rows of the sums) and the
text methods' term counts (each client's own vocabulary: not a sum). Sums of features and distances are
multiplied by the public `SCALE_KEY` the server sends (1, then smaller if SecAgg+ would clip them).

**Under differential privacy** (`dp.epsilon > 0`, `dp.report`) the client sends either nothing but its
identity, or noisy statistics of clipped records (`NOISY_KEY`, `fedapp.privacy.dp`), counted in the plan.

What travels in the metrics is bytes of the one codec (`fedapp.wire`); the functions at the end of this
module say which arrays each message holds, and a blob that does not decode is a `ReplyError`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedapp.maths.chunks import row_chunks
from fedapp.maths.clustering import nearest_centre
from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    LabelFreeError,
    approximate_cluster_sums,
    approximate_distance_sums,
    check_term_counts,
)
from fedapp.report.assignments import SCORE_KINDS
from fedapp.wire import ReplyError, decode_arrays, encode_arrays

REPORT_KEY = "report"  # EvaluateIns config: which stage of the final report this message is
STAGE_ASSIGN = "assign"
STAGE_DISTANCES = "distances"
STAGES = (STAGE_ASSIGN, STAGE_DISTANCES)

SIZES_KEY = "cluster-sizes"  # (k,) int64 counts of this client's records per cluster
SUMS_KEY = "cluster-sums"  # `encode_cluster_sums`
DISTANCES_KEY = "distance-sums"  # `encode_distance_sums`
TERMS_KEY = "term-counts"  # `encode_term_counts`: per-cluster term document counts (text methods)
TABLE_KEY = "table"  # contingency table (labelled clients only)
ROWS_KEY = "assigned-rows"  # how many records this client assigned (and wrote)
SCORE_KIND_KEY = "score-kind"  # what the score column of its assignments.csv means (node_outputs.SCORE_KINDS)
DATA_ERROR_KEY = "data-error"  # a client that cannot read its data says why (one line)
SCALE_KEY = "report-scale"  # secure report: public factor on the feature and distance sums (clip headroom)
NOISY_KEY = "noisy-statistics"  # DP report: the noisy statistics (`encode_noisy`)
NOISY_ASSIGN = ("sizes", "sums")  # what NOISY_KEY holds in each stage (a space-less method: sizes only)
NOISY_SIZES = ("sizes",)
NOISY_DISTANCES = ("distance_sums", "squared_sums", "silhouette_sum")
# what the strategy says of one SecAgg+ attempt at a report stage: go on, ask again with a smaller scale
# (SecAgg+ would have clipped a value), or stop the report
SECURE_DONE, SECURE_RETRY, SECURE_STOP = "done", "retry", "stop"


@dataclass(frozen=True)
class Assignment:
    """A client's labelling of its records under the global model.

    `labels`: cluster per record (0..k-1); `scores`: per record, what `score_kind` says (NaN: none);
    `space`: the N x D vectors the label-free metrics are computed in (None: the method has no such
    space, e.g. a topic model, whose metrics are its topics').
    """

    labels: np.ndarray
    scores: np.ndarray
    score_kind: str
    space: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.labels)
        if self.score_kind not in SCORE_KINDS:
            raise ValueError(f"score kind {self.score_kind!r} is none of {sorted(SCORE_KINDS)}")
        if self.scores.shape != (n,):
            raise ValueError(f"{n} labels but scores of shape {self.scores.shape}")
        if self.space is not None and (self.space.ndim != 2 or self.space.shape[0] != n):
            raise ValueError(f"{n} labels but a metric space of shape {self.space.shape}")


def nearest_with_distance(space: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nearest centre as `nearest_centre` picks it, Euclidean distance to it) for every row, a chunk of
    rows at a time in float64 (no float64 copy of the whole space)."""
    centres = np.asarray(centres, dtype=np.float64)
    labels = nearest_centre(space, centres)
    distances = np.empty(len(labels), dtype=np.float64)
    for rows in row_chunks(len(labels), np.shape(space)[1]):
        offset = np.asarray(space[rows], dtype=np.float64) - centres[labels[rows]]
        distances[rows] = np.sqrt((offset * offset).sum(1))
    return labels, distances


# ------------------------------------------------------------------------------- SecAgg+ layout
def secure_assign_arrays(sizes: np.ndarray, sums: ClusterSums | None, scale: float) -> list[np.ndarray]:
    """Stage 1 as SecAgg+ sums: cluster sizes, then (if the method has a metric space) the floor's
    counts and the feature sums times `scale`; every one is summed over the clients."""
    arrays = [np.asarray(sizes, dtype=np.float64)]
    if sums is not None:
        arrays += [sums.counts.astype(np.float64), sums.sums * scale]
    return arrays


def secure_distance_arrays(sums: DistanceSums, scale: float) -> list[np.ndarray]:
    """Stage 2 as SecAgg+ sums: distance and squared-distance sums times `scale`, silhouette sum, rows."""
    return [
        sums.distance_sums * scale,
        sums.squared_sums * scale,
        np.array([sums.silhouette_sum]),
        np.array([float(sums.n)]),
    ]


def assign_from_totals(
    totals: list[np.ndarray], k: int, scale: float
) -> tuple[np.ndarray, ClusterSums | None]:
    """Server: (cluster sizes, pooled `ClusterSums` or None) from stage 1's secure totals, rounded."""
    if len(totals) not in (1, 3) or any(t.shape[:1] != (k,) for t in totals):
        raise ReplyError(f"secure report totals of shapes {[t.shape for t in totals]} for k={k}")
    sizes = np.maximum(np.rint(totals[0]), 0).astype(np.int64)
    if len(totals) == 1:
        return sizes, None
    return sizes, approximate_cluster_sums(totals[1], np.asarray(totals[2]) / scale)


def distances_from_totals(totals: list[np.ndarray], counts: np.ndarray, scale: float) -> DistanceSums:
    """Server: pooled `DistanceSums` from stage 2's secure totals (n: the pooled count)."""
    if len(totals) != 4 or totals[0].shape != counts.shape or totals[1].shape != counts.shape:
        raise ReplyError(f"secure distance totals of shapes {[t.shape for t in totals]}")
    return approximate_distance_sums(totals[0] / scale, totals[1] / scale, float(totals[2][0]), counts)


# ----------------------------------------------------------------------- what travels in the metrics
_DISTANCE_ARRAYS = ("distance_sums", "squared_sums", "silhouette_sum", "n")


def encode_cluster_sums(sums: ClusterSums) -> bytes:
    """`SUMS_KEY`: a client's pass-1 sums."""
    return encode_arrays(counts=sums.counts, sums=sums.sums)


def decode_cluster_sums(blob: object) -> ClusterSums:
    arrays = decode_arrays(blob, "cluster sums", ("counts", "sums"))
    with _malformed("cluster sums"):
        return ClusterSums(arrays["counts"], arrays["sums"])


def encode_distance_sums(distances: DistanceSums) -> bytes:
    """`DISTANCES_KEY`: a client's pass-2 sums."""
    return encode_arrays(
        distance_sums=distances.distance_sums,
        squared_sums=distances.squared_sums,
        silhouette_sum=np.float64(distances.silhouette_sum),
        n=np.int64(distances.n),
    )


def decode_distance_sums(blob: object) -> DistanceSums:
    arrays = decode_arrays(blob, "distance sums", _DISTANCE_ARRAYS)
    silhouette, n = arrays["silhouette_sum"], arrays["n"]
    if silhouette.shape != () or silhouette.dtype.kind != "f":
        raise ReplyError(f"silhouette_sum must be a float scalar, got {silhouette.dtype} {silhouette.shape}")
    if n.shape != () or n.dtype.kind not in "iu":
        raise ReplyError(f"n must be an integer scalar, got {n.dtype} {n.shape}")
    with _malformed("distance sums"):
        return DistanceSums(arrays["distance_sums"], arrays["squared_sums"], float(silhouette), int(n))


def encode_noisy(**arrays: np.ndarray | float) -> bytes:
    """`NOISY_KEY`: a DP release's noisy statistics, as float64."""
    return encode_arrays(**{name: np.asarray(a, dtype=np.float64) for name, a in arrays.items()})


def decode_noisy(blob: object, what: str, *layouts: Collection[str]) -> dict[str, np.ndarray]:
    """The noisy statistics if they hold the arrays of one of `layouts`, real and finite (float64)."""
    arrays = decode_arrays(blob, what)
    if set(arrays) not in [set(layout) for layout in layouts]:
        expected = " or ".join(str(sorted(layout)) for layout in layouts)
        raise ReplyError(f"{what} holds {sorted(arrays)}, expected {expected}")
    for name, array in arrays.items():
        if array.dtype.kind not in "iuf" or not np.all(np.isfinite(array)):
            raise ReplyError(f"{what}: '{name}' is not finite real numbers ({array.dtype})")
    return {name: array.astype(np.float64) for name, array in arrays.items()}


def encode_term_counts(term_counts: list[dict[str, int]]) -> bytes:
    """`TERMS_KEY`: UTF-8 JSON, keys sorted so equal counts give equal bytes."""
    return json.dumps(check_term_counts(term_counts, "term counts"), sort_keys=True).encode("utf-8")


def decode_term_counts(blob: object, k: int) -> list[dict[str, int]]:
    """The inverse of `encode_term_counts` for `k` clusters."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise ReplyError(f"encoded term counts must be bytes, got {type(blob).__name__}")
    try:
        decoded = json.loads(bytes(blob).decode("utf-8"), object_pairs_hook=_no_duplicate_terms)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReplyError(f"encoded term counts are not UTF-8 JSON: {exc}".splitlines()[0]) from None
    with _malformed("term counts"):
        term_counts = check_term_counts(decoded, "encoded term counts")
    if len(term_counts) != k:
        raise ReplyError(f"encoded term counts hold {len(term_counts)} clusters, expected {k}")
    return term_counts


def _no_duplicate_terms(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    as_dict = dict(pairs)
    if len(as_dict) != len(pairs):
        raise ReplyError("encoded term counts repeat a term within a cluster")
    return as_dict


@contextmanager
def _malformed(what: str) -> Iterator[None]:
    """Statistics that decode but break the label-free maths' own checks: a malformed reply too."""
    try:
        yield
    except LabelFreeError as exc:
        raise ReplyError(f"{what}: {exc}") from None
