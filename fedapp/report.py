"""The final report: after the last round every client labels all its records with the global model.

Two evaluate messages, driven by the config key `report` (the server side is `strategies/report.py`):

1. ``assign``: the client assigns every local record (`Assignment`), writes `assignments.csv` on its own
   machine (`fedapp.node_outputs`), and returns only aggregates: cluster sizes, per-cluster sums in the
   space the method clusters in (`fedapp.label_free.ClusterSums`), per-cluster term document counts for
   text methods (terms in fewer than `keyword-min-docs` local documents of a cluster are withheld), and
   its contingency table when it has labels.
2. ``distances``: the server sends the pooled cluster means; the client returns per-cluster sums of
   distances to them and its silhouette sum (`fedapp.label_free.DistanceSums`), which Davies–Bouldin and
   the simplified silhouette need.

No per-record value crosses the wire in either message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.clustering import nearest_centre
from fedapp.node_outputs import SCORE_KINDS

REPORT_KEY = "report"  # EvaluateIns config: which stage of the final report this message is
STAGE_ASSIGN = "assign"
STAGE_DISTANCES = "distances"
STAGES = (STAGE_ASSIGN, STAGE_DISTANCES)

SIZES_KEY = "cluster-sizes"  # (k,) int64 counts of this client's records per cluster
SUMS_KEY = "cluster-sums"  # encoded ClusterSums
DISTANCES_KEY = "distance-sums"  # encoded DistanceSums
TERMS_KEY = "term-counts"  # encoded per-cluster term document counts (text methods)
TABLE_KEY = "table"  # contingency table (labelled clients only)
ROWS_KEY = "assigned-rows"  # how many records this client assigned (and wrote)
SCORE_KIND_KEY = "score-kind"  # what the score column of its assignments.csv means (node_outputs.SCORE_KINDS)
DATA_ERROR_KEY = "data-error"  # a client that cannot read its data says why (one line)


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
    """(nearest centre as `nearest_centre` picks it, Euclidean distance to it) for every row."""
    x = np.asarray(space, dtype=np.float64)
    labels = nearest_centre(x, centres)
    offset = x - np.asarray(centres, dtype=np.float64)[labels]
    return labels, np.sqrt((offset * offset).sum(1))
