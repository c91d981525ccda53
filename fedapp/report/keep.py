"""Keep the better model: score a method's starting clustering and its final one by one label-free
criterion in one fixed space, and keep the better (run-config `select = best`).

Iterative methods start from a one-shot clustering (FSTC from the k-FED-like global centres, FFCM and
CCFC from the merged local centres) and training can make it worse (FSTC under label skew: 51.9 NMI
against 70.7 for its own start, docs/methods/fstc.md). After the last round one evaluate message sends
both candidates; every client labels its records with each, in the space of the start (the initial
model's representations, or the features) and returns, per candidate, only summable statistics:
cluster sizes, per-cluster sums and the total squared norm of the records in the clusters at or above
its privacy floor (the others sit out, as in the final report). No per-record value crosses the wire.

From those the server has Calinski–Harabasz exactly (between- over within-cluster scatter, each
divided by its degrees of freedom): SSW = Σ‖x‖² − Σ_k ‖S_k‖² / n_k, SSB = Σ_k ‖S_k‖² / n_k − ‖S‖² / n.
The start is a k-means solution in that very space, so CH favours it whenever the two are close: the rule
keeps the trained model unless its CH falls below the start's by more than `KEEP_MARGIN` (relative),
which separates the measured collapses from the measured gains (docs/model-selection.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.maths.chunks import as_float, row_chunks
from fedapp.metrics.label_free import cluster_sums
from fedapp.wire import ReplyError, decode_arrays, encode_arrays

KEEP_KEY = "keep"  # EvaluateIns config: this message scores the two candidates
START_ARRAYS_KEY = "keep-start-arrays"  # how many of the parameters are the start's (the rest: final)
LABELS_BY_KEY = "labels-by"  # assign config: "centres" = nearest centre (array 0) in the start's space
BY_CENTRES = "centres"
CANDIDATE_SUMS_KEY = "candidate-sums"  # `encode_candidate_sums`
START_TABLE_KEY, FINAL_TABLE_KEY = "start-table", "final-table"  # labelled clients' contingency tables
CANDIDATES = ("start", "final")
# keep the final model unless its CH is more than this fraction below the start's: FSTC's measured gains
# came with CH at 0.990-1.041 of the start's, its collapses at 0.68-0.93 and 0.974, 0.982 on 20 Newsgroups
# by group (docs/model-selection.md, "How thin the rule is")
KEEP_MARGIN = 0.015


@dataclass(frozen=True)
class CandidateSums:
    """Per candidate (start, final): cluster sizes (2, k), per-cluster sums (2, k, d), and the sum of the
    records' squared norms (2,), over the records in clusters at or above the privacy floor."""

    counts: np.ndarray
    sums: np.ndarray
    squared_norms: np.ndarray

    def __post_init__(self) -> None:
        n_candidates, k = self.counts.shape
        if n_candidates != len(CANDIDATES) or self.sums.shape[:2] != (n_candidates, k) or self.sums.ndim != 3:
            raise ReplyError(f"candidate sums of shapes {self.counts.shape} and {self.sums.shape}")
        if self.squared_norms.shape != (n_candidates,):
            raise ReplyError(f"candidate squared norms of shape {self.squared_norms.shape}")
        if (self.counts < 0).any() or not (
            np.isfinite(self.sums).all() and np.isfinite(self.squared_norms).all()
        ):
            raise ReplyError("candidate sums hold a negative count or a non-finite value")


def candidate_sums(space: np.ndarray, labellings: list[np.ndarray], k: int, floor: int) -> CandidateSums:
    """A client's statistics of each labelling of its records in `space` (n, d), in bounded row chunks
    (`fedapp.metrics.label_free.cluster_sums`)."""
    x = as_float(np.asarray(space))
    norms = np.concatenate(
        [np.einsum("ij,ij->i", x[rows], x[rows], dtype=np.float64) for rows in row_chunks(*x.shape)]
    )
    counts, sums, squared = [], [], []
    for labels in labellings:
        sizes = np.bincount(labels, minlength=k)
        shared = sizes[labels] >= floor  # the privacy floor: small clusters sit out
        part = cluster_sums(x, np.where(shared, labels, k), k + 1)  # cluster k: the records that sit out
        counts.append(part.counts[:k])
        sums.append(part.sums[:k])
        squared.append(float(norms[shared].sum()))
    return CandidateSums(np.stack(counts), np.stack(sums), np.asarray(squared))


def merge_candidate_sums(parts: list[CandidateSums]) -> CandidateSums:
    shapes = {part.sums.shape for part in parts}
    if len(shapes) != 1:
        raise ReplyError(f"candidate sums of different shapes {sorted(shapes)}")
    return CandidateSums(
        sum(part.counts for part in parts),  # type: ignore[arg-type]
        sum(part.sums for part in parts),  # type: ignore[arg-type]
        sum(part.squared_norms for part in parts),  # type: ignore[arg-type]
    )


def encode_candidate_sums(sums: CandidateSums) -> bytes:
    return encode_arrays(counts=sums.counts, sums=sums.sums, squared_norms=sums.squared_norms)


def secure_candidate_arrays(sums: CandidateSums, scale: float) -> list[np.ndarray]:
    """The sums as SecAgg+ arrays: sizes, then the feature sums and squared norms times `scale`."""
    return [sums.counts.astype(np.float64), sums.sums * scale, sums.squared_norms * scale]


def candidate_sums_from_totals(totals: list[np.ndarray], scale: float) -> CandidateSums:
    """The inverse of `secure_candidate_arrays` on SecAgg+'s totals (sizes rounded to whole records)."""
    if len(totals) != 3:
        raise ReplyError(f"secure candidate sums of {len(totals)} arrays, expected 3")
    counts, sums, squared = (np.asarray(total, dtype=np.float64) for total in totals)
    return CandidateSums(np.rint(counts).astype(np.int64), sums / scale, squared / scale)


def decode_candidate_sums(blob: object) -> CandidateSums:
    arrays = decode_arrays(blob, "candidate sums", ("counts", "sums", "squared_norms"))
    return CandidateSums(
        arrays["counts"].astype(np.int64),
        arrays["sums"].astype(np.float64),
        arrays["squared_norms"].astype(np.float64),
    )


def calinski_harabasz(counts: np.ndarray, sums: np.ndarray, squared_norms: float) -> float | None:
    """CH of one labelling from its sizes (k,), sums (k, d) and Σ‖x‖² (module docstring); None where
    scikit-learn refuses it (fewer than 2 used clusters, or as many as records)."""
    used = counts > 0
    n, n_used = int(counts.sum()), int(used.sum())
    if not 2 <= n_used < n:
        return None
    explained = float(((sums[used] ** 2).sum(axis=1) / counts[used]).sum())
    within = max(squared_norms - explained, 0.0)
    between = max(explained - float((sums.sum(axis=0) ** 2).sum()) / n, 0.0)
    return 1.0 if within == 0.0 else between * (n - n_used) / (within * (n_used - 1.0))


@dataclass(frozen=True)
class Choice:
    """Both candidates' scores and which is kept."""

    scores: dict[str, float | None]
    clusters_used: dict[str, int]
    kept: str

    @property
    def degraded(self) -> bool:
        return self.kept == "start"


def choose(merged: CandidateSums, select: str, margin: float = KEEP_MARGIN) -> Choice:
    """`select = best`: the start when the final model's CH is more than `margin` below it (or the final
    has no CH, e.g. one cluster left); `final`: always the final (the scores are still reported)."""
    scores = {
        name: calinski_harabasz(merged.counts[i], merged.sums[i], float(merged.squared_norms[i]))
        for i, name in enumerate(CANDIDATES)
    }
    used = {name: int((merged.counts[i] > 0).sum()) for i, name in enumerate(CANDIDATES)}
    start, final = scores["start"], scores["final"]
    worse = start is not None and (final is None or final < (1.0 - margin) * start)
    return Choice(scores, used, "start" if select == "best" and worse else "final")


@dataclass(frozen=True)
class StartCandidate:
    """A method's starting clustering as a model its clients can label with: `arrays` (assigned with
    `assign_config`), and the one-shot method it amounts to (named when it is kept)."""

    arrays: list[np.ndarray]
    assign_config: dict[str, str]
    method: str
