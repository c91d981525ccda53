"""Federated fuzzy c-means strategy (Stallmann & Wilbik 2022).

Round 1: weighted k-means over the clients' local FCM centres (weights = membership mass) gives the
initial global centres. Rounds >= 2: global centres = sum of clients' membership-weighted sums divided by
the summed membership mass (the FCM centre update over the union). Stops when the largest centre shift,
relative to the centres' scale, is <= `delta`.
"""

from __future__ import annotations

from logging import INFO

import numpy as np
from flwr.common import Parameters, Scalar, log, ndarrays_to_parameters

from fedapp.clustering import kmeans
from fedapp.config import RunConfig
from fedapp.methods.ffcm import FFCMConfig
from fedapp.protocol import ArraySpec, ReplyError
from strategies.base import ClientReply, ClusteringStrategy, consistent_replies


def merge_weighted_centres(
    centres: list[np.ndarray], masses: list[np.ndarray], k: int, seed: int
) -> np.ndarray:
    """Initial global centres: k-means over local centres weighted by their membership mass."""
    union, weights = np.concatenate(centres), np.concatenate(masses)
    if union.shape[0] < k:
        raise ValueError(f"only {union.shape[0]} local centres for k={k} global clusters")
    global_centres, _ = kmeans(union, k, seed, sample_weight=weights)
    return global_centres


def centres_from_sums(sums: list[np.ndarray], masses: list[np.ndarray]) -> np.ndarray:
    """FCM centre update over the union: c_j = sum_clients sum_i u_ij^m x_i / sum_clients sum_i u_ij^m."""
    total_mass = np.sum(masses, axis=0)
    if (total_mass <= 0).any():
        raise ValueError("a cluster received zero membership mass")
    return np.sum(sums, axis=0) / total_mass[:, None]


def relative_shift(old: np.ndarray, new: np.ndarray) -> float:
    return float(np.abs(new - old).max() / max(np.abs(old).max(), 1e-12))


class FFCMStrategy(ClusteringStrategy):
    method = "ffcm"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(FFCMConfig)
        self.centres: np.ndarray | None = None
        self.shifts: list[float] = []

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        phase = "init" if self.centres is None else "update"
        return {
            **super().fit_config(server_round),
            "phase": phase,
            "fuzziness": self.params.fuzziness,
            "local-iters": self.params.local_iters,
        }

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.centres is None:
            return [ArraySpec("centres", (None, None)), ArraySpec("mass", (None,))]
        k, dim = self.centres.shape
        return [ArraySpec("sums", (k, dim)), ArraySpec("mass", (k,))]

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        # local centres: the feature dimension is not known before the first replies
        return consistent_replies(replies, server_round) if self.centres is None else replies

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        centres_or_sums, mass = reply.arrays
        if mass.shape[0] != centres_or_sums.shape[0] or (mass < 0).any():
            raise ReplyError(f"membership mass of shape {mass.shape} for {centres_or_sums.shape[0]} rows")

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        if self.centres is None:
            assert self.k is not None  # _validated rejects every reply while k is unknown
            self.centres = merge_weighted_centres(
                [r.arrays[0] for r in replies], [r.arrays[1] for r in replies], self.k, self.cfg.seed
            )
            log(INFO, "FFCM: initial centres from %d clients' local FCM centres", len(replies))
        else:
            updated = centres_from_sums([r.arrays[0] for r in replies], [r.arrays[1] for r in replies])
            self.shifts.append(relative_shift(self.centres, updated))
            self.centres = updated
            if self.shifts[-1] <= self.params.delta:
                self.finished, self.stop_reason = (
                    True,
                    f"relative centre shift {self.shifts[-1]:.2e} <= delta",
                )
        return ndarrays_to_parameters([self.centres])

    def extra_summary(self) -> dict[str, list[float]]:
        return {"centre_shift_per_round": self.shifts}
