"""k-FED strategy (Dennis et al., ICML 2021): one-shot; k-means over the union of local centres.

Under differential privacy the local centres are noisy DP-Lloyd centres (clients/kfed.py); the merge
weights each by its noisy count (post-processing: a centre of a few noisy records is mostly noise).
The privacy layer (`strategies.privacy`) accounts the clients' releases in summary.json's `privacy`.
"""

from __future__ import annotations

from logging import INFO

import numpy as np
from flwr.common import Parameters, Scalar, log, ndarrays_to_parameters

from fedapp.maths.clustering import kmeans
from fedapp.methods.kfed import KFedConfig
from fedapp.wire import ArraySpec, ReplyError
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply, consistent_replies


def merge_local_centres(
    local_centres: list[np.ndarray], k: int, seed: int, counts: list[np.ndarray] | None = None
) -> np.ndarray:
    """Alg. 2 server step: k global centres = k-means over all clients' local centres (unweighted, or
    weighted by `counts` when given: centres of count 0 are left out while >= k others remain)."""
    union = np.concatenate(local_centres, axis=0)
    weights = None
    if counts is not None:
        weights = np.concatenate(counts).astype(np.float64)
        if (weights > 0).sum() >= k:
            union, weights = union[weights > 0], weights[weights > 0]
        else:  # too few populated centres (strong DP noise): keep every one, the empty ones barely weigh
            weights = np.maximum(weights, 1e-6)
    if union.shape[0] < k:
        raise ValueError(f"only {union.shape[0]} local centres for k={k} global clusters")
    centres, _ = kmeans(union, k, seed, sample_weight=weights)
    return centres


class KFedStrategy(ClusteringStrategy):
    """Round 1 collects local centres and builds the global centres; later rounds are no-ops."""

    method = "kfed"

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        local_k = self.cfg.params(KFedConfig).local_k
        return {**super().fit_config(server_round), "phase": "local-centres", "local-k": local_k}

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        return [ArraySpec("centres", (None, None)), ArraySpec("counts", (None,), "i")]

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        # local centres: the feature dimension is not known before the first replies
        return consistent_replies(replies, server_round)

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        centres, counts = reply.arrays
        if counts.shape[0] != centres.shape[0] or (counts < 0).any():
            raise ReplyError(f"{centres.shape[0]} centres but counts of shape {counts.shape}")

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        assert self.k is not None  # _validated rejects every reply while k is unknown
        replies = self.privacy.intake(server_round, replies, [])
        # under DP a centre of a few noisy records is mostly noise: the merge weighs each by its count
        counts = [reply.arrays[1] for reply in replies] if self.privacy.private else None
        centres = merge_local_centres([reply.arrays[0] for reply in replies], self.k, self.cfg.seed, counts)
        self.finished, self.stop_reason = True, "one-shot"
        log(
            INFO,
            "k-FED: %d local centres from %d clients -> %d global centres",
            sum(reply.arrays[0].shape[0] for reply in replies),
            len(replies),
            self.k,
        )
        return ndarrays_to_parameters([centres])
