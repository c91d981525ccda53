"""Piece 2 (`strategies/<m>.py`): the server's maths as a plain function, then a thin strategy."""

from __future__ import annotations

import numpy as np
from flwr.common import Parameters, ndarrays_to_parameters

from fedapp.maths.clustering import centres_from_moments
from fedapp.privacy.secagg import MEAN, SUM
from fedapp.wire import ArraySpec
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply, consistent_replies
from tests.skeleton.method import NAME, MeansConfig


def cluster_means(sums: np.ndarray, counts: np.ndarray, previous: np.ndarray, floor: float) -> np.ndarray:
    """The federation's per-cluster means; a cluster with no more than `floor` records keeps its centre."""
    empty = counts <= floor
    return np.where(empty[:, None], previous, sums / np.where(empty, 1.0, counts)[:, None])


class MeansStrategy(ClusteringStrategy):
    method = NAME
    state_fields = ("centres",)

    def __init__(self, cfg) -> None:  # type: ignore[no-untyped-def]
        super().__init__(cfg)
        self.centres: np.ndarray | None = None

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.centres is None:
            return self.privacy.moments_spec()
        k, dim = self.centres.shape
        return self.privacy.expected([ArraySpec("sums", (k, dim)), ArraySpec("counts", (k,))], [SUM, SUM])

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        return replies if self.centres is not None else consistent_replies(replies, server_round, axis=0)

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        assert self.k is not None
        replies = self.privacy.intake(
            server_round, replies, [MEAN, MEAN] if self.centres is None else [SUM, SUM]
        )
        if self.centres is None:
            self.centres = centres_from_moments(*self.privacy.moments(replies), self.k, self.cfg.seed)
        else:
            sums = self.privacy.totals([reply.arrays[0] for reply in replies])
            counts = self.privacy.totals([reply.arrays[1] for reply in replies], nonnegative=True)
            moved = cluster_means(sums, counts, self.centres, self.privacy.noise_floor)
            if np.abs(moved - self.centres).max() <= self.cfg.params(MeansConfig).delta:
                self.finished, self.stop_reason = True, "no centre moved"
            self.centres = moved
        return ndarrays_to_parameters([self.centres])
