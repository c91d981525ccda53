"""The strategy's side of privacy: composed into every `ClusteringStrategy` as `self.privacy`.

Flower wraps a strategy for DP and drives SecAgg+ as a workflow, and the method never knows; here the
method says what its replies are (`fedapp.privacy.secagg`'s SUM / MEAN / CENTRES / CLEAR kinds) and
`PrivacyLayer` does what depends on the mode:
- what a reply looks like on arrival (`expected`): under SecAgg+ one secure average of floats, under DP
  noisy sums as floats;
- what every reply must carry (`check`): under DP the count of releases its client has made;
- what the method's aggregation takes (`intake`): under SecAgg+ the one secure average becomes per-reply
  arrays that the method's plain aggregation maps to the secure result, so each method keeps one
  aggregation path; under DP the releases are accounted. The sum covers every client whose reply
  reached the SecAgg+ workflow: if validation rejected one of them, its share cannot be taken out again,
  so the round is skipped;
- the totals the methods aggregate from (`moments`, `totals`, `centre_totals`, `positive_variances`), and
  how small a total must be to be noise rather than records (`noise_floor`);
- summary.json's `privacy` block and `secagg_clipped`, and its own checkpointed state.
A method keeps only the protocol choices that are really its own (e.g. FSTC labelling by DP centres).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import FitRes, Scalar, log
from flwr.server.client_proxy import ClientProxy

from fedapp.config.run import RunConfig
from fedapp.maths.clustering import weighted_centre_sums
from fedapp.methods import method_spec
from fedapp.privacy.dp import RELEASES_KEY, floor_variances
from fedapp.privacy.floor import min_cluster_size
from fedapp.privacy.plan import DPPlan, dp_plan
from fedapp.privacy.secagg import (
    CENTRES,
    CLEAR_KEY,
    CLIPPED_KEY,
    SUM,
    plain_replies,
    secure_specs,
    sum_tolerance,
)
from fedapp.wire import ArraySpec, ReplyError
from strategies.replies import ClientReply

NOISE_FLOOR = 1.0  # under DP a total below one record is noise: dividing by it would fling a centre away
SECURE_SLACK = 1e-4  # how far below 0 SecAgg+'s quantisation takes an average of non-negative values


class PrivacyLayer:
    """See the module docstring. `secure`: SecAgg+; `private`: DP (never both: config validation)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.secure = cfg.secagg
        self.plan: DPPlan | None = dp_plan(cfg) if cfg.dp.enabled else None
        self.releases = 0  # the most DP releases any client reported (summary.json `privacy`)
        self.secagg_clipped = 0  # uploaded values SecAgg+ clipped over the run (0: none distorted)
        self.secure_weights: dict[str, int] = {}  # who is inside this round's secure sum, and their n

    @property
    def private(self) -> bool:
        return self.plan is not None

    @property
    def exact(self) -> bool:
        """Replies hold each client's own exact values (neither a secure average nor noisy)."""
        return not (self.secure or self.private)

    @property
    def sums_only(self) -> bool:
        """Only sums may reach the server (SecAgg+) or be noised with a bounded sensitivity (DP): a method
        initialises from the federated moments instead of local clusterings."""
        return self.secure or self.private

    @property
    def noise_floor(self) -> float:
        """A total at or below this is not records: 0 where totals are exact, NOISE_FLOOR under DP."""
        return NOISE_FLOOR if self.private else 0.0

    # ---------------------------------------------------------------------------------- arrival
    def expected(self, specs: Sequence[ArraySpec], modes: Sequence[str]) -> list[ArraySpec]:
        """What a reply of plain layout `specs` (of `modes`) looks like when it arrives."""
        if self.secure:
            return secure_specs(specs, modes)
        if self.private:  # noisy sums are floats (counts included); models keep their dtypes
            return [
                ArraySpec(spec.name, spec.shape, "f") if mode in (SUM, CENTRES) else spec
                for spec, mode in zip(specs, modes, strict=True)
            ]
        return list(specs)

    def moments_spec(self) -> list[ArraySpec]:
        """The reply of `fedapp.privacy.uplink.Uplink.send_moments`."""
        if self.private:
            return [ArraySpec("sum", (None,)), ArraySpec("sum of squares", (None,)), ArraySpec("count", (1,))]
        return [ArraySpec("mean", (None,)), ArraySpec("mean square", (None,))]

    def arrived(self, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """Note who is inside this round's secure sum, before validation may drop anyone."""
        self.secure_weights = {client.cid: int(res.num_examples) for client, res in results}

    def check(self, reply: ClientReply) -> None:
        """Under DP every reply says how many releases its client has made."""
        if self.private and not isinstance(reply.metrics.get(RELEASES_KEY), int):
            raise ReplyError(f"a DP reply without an integer '{RELEASES_KEY}'")

    def tolerance(self) -> float:
        """How far a non-negative share (a count over n) may arrive below 0: SecAgg+'s rounding error of a
        secure average; 0 for exact replies (noisy DP replies are not checked against it)."""
        if not self.secure:
            return 0.0
        total = max(sum(self.secure_weights.values()), 1)
        clients = len(self.secure_weights)
        return sum_tolerance(self.cfg.secagg_clip, self.cfg.secagg_max_weight, clients) / total

    def check_nonnegative(self, values: np.ndarray, what: str) -> None:
        """Sums of non-negative values (masses, counts) are >= 0: exact ones exactly, SecAgg+'s averages
        up to its quantisation noise around zero (`SECURE_SLACK`); noisy DP ones may be negative."""
        if self.private:
            return
        if (values < -(SECURE_SLACK if self.secure else 0.0)).any():
            raise ReplyError(f"negative {what}")

    def check_shares(self, shares: np.ndarray) -> None:
        """Under SecAgg+ per-cluster counts arrive as one secure average of counts / n: shares of records,
        in [0, 1] up to its rounding; noisy DP counts may be anything and exact ones are the method's."""
        if not self.secure:
            return
        noise = self.tolerance()
        if (shares < -noise).any() or shares.sum() > 1.0 + shares.size * noise:
            raise ReplyError(f"secure cluster shares sum to {shares.sum():.4f}, outside [0, 1]")

    def intake(
        self,
        server_round: int,
        replies: list[ClientReply],
        modes: Sequence[str],
        dtypes: Sequence[str | None] | None = None,
    ) -> list[ClientReply]:
        """The replies as the method's aggregation takes them (module docstring); `dtypes` are what the
        secure average is cast back to (None: float64)."""
        if self.private:
            self.note_releases([reply.metrics for reply in replies])
        if not self.secure:
            return replies
        missing = set(self.secure_weights) - {reply.cid for reply in replies}
        if missing:
            raise ValueError(
                f"SecAgg+: the secure sum includes rejected client(s) {sorted(missing)}, whose share "
                "cannot be removed"
            )
        self.note_clipped(f"round {server_round}", sum(int(r.metrics.get(CLIPPED_KEY, 0)) for r in replies))  # type: ignore[call-overload]
        arrays = plain_replies(
            replies[0].arrays,
            [reply.metrics.get(CLEAR_KEY) for reply in replies],
            [reply.num_examples for reply in replies],
            modes,
            dtypes or [None] * len(modes),
        )
        return [replace(reply, arrays=own) for reply, own in zip(replies, arrays, strict=True)]

    def note_releases(self, metrics: Sequence[Mapping[str, Scalar]]) -> None:
        """The most DP releases any client reports (replies of a round no noise covers carry none)."""
        made = [m.get(RELEASES_KEY) for m in metrics]
        self.releases = max([self.releases, *(count for count in made if isinstance(count, int))])

    def note_clipped(self, where: str, clipped: int) -> None:
        """Count values SecAgg+ clipped (a wrong, not a noisy, result) and say so."""
        self.secagg_clipped += clipped
        if clipped:
            log(
                WARNING,
                "%s: SecAgg+ clipped %d uploaded values to +-%g (raise secagg-clip)",
                where,
                clipped,
                self.cfg.secagg_clip,
            )

    # ----------------------------------------------------------------------------------- totals
    def moments(self, replies: list[ClientReply]) -> tuple[np.ndarray, np.ndarray]:
        """(federated mean, mean square) of the records from `send_moments` replies (after `intake`)."""
        if self.private:  # noisy (sum x, sum x*x, count): the same moments from their quotients
            count = max(float(np.sum([r.arrays[2] for r in replies])), 1.0)
            return (
                np.sum([r.arrays[0] for r in replies], axis=0) / count,
                np.sum([r.arrays[1] for r in replies], axis=0) / count,
            )
        sizes = [r.num_examples for r in replies]  # under SecAgg+ every reply holds the secure average
        return (
            np.average([r.arrays[0] for r in replies], axis=0, weights=sizes),
            np.average([r.arrays[1] for r in replies], axis=0, weights=sizes),
        )

    def totals(self, arrays: list[np.ndarray], *, nonnegative: bool = False) -> np.ndarray:
        """The federation's total of a SUM array. `nonnegative` (masses, counts): SecAgg+'s rounding may
        take a share just below 0, clamped; noisy DP shares are summed as they are (clamping would bias
        the total upwards)."""
        if nonnegative and self.secure:
            arrays = [np.maximum(a, 0.0) for a in arrays]
        return np.sum(arrays, axis=0)

    def centre_totals(
        self, centres: list[np.ndarray], counts: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(sum over clients of n_k C_k, sum of n_k) for CENTRES replies (Eq. 16's numerator and
        denominator): plain replies hold the centres, secure and DP ones their per-cluster sums."""
        if self.secure or self.private:
            sizes = np.stack([np.asarray(n, dtype=np.float64) for n in counts])  # m x K
            return np.sum([np.asarray(c, dtype=np.float64) for c in centres], axis=0), sizes.sum(0)
        return weighted_centre_sums(centres, counts)

    def model_weights(self, replies: list[ClientReply]) -> list[int]:
        """FedAvg weights of a round's models: each client's record count, equal under DP (a record
        count is private: record-level DP replies carry none)."""
        return [1 if self.private else reply.num_examples for reply in replies]

    def positive_variances(self, names: list[str], averaged: list[np.ndarray]) -> list[np.ndarray]:
        """An averaged model state with its BatchNorm variances kept positive: under DP the noisy
        average may be <= 0 (post-processing); exact averages pass unchanged."""
        return floor_variances(names, averaged) if self.private else averaged

    @property
    def floor_size(self) -> int:
        """The privacy floor every client enforces at least (a node may raise its own)."""
        return min_cluster_size(self.cfg.min_cluster_size, {})

    def collapse_cause(self) -> str:
        """The likely cause of a clustering that collapsed into a few clusters."""
        if self.plan is not None:
            return f"likely the DP noise at dp.epsilon={self.cfg.dp.epsilon:g}: raise it, or run fewer rounds"
        return (
            f"likely the privacy floor (min-cluster-size {self.floor_size}) or k above the clusters this "
            "data holds"
        )

    def empty_cluster_reason(self, floor_size: int) -> str:
        """Why a cluster's total got no update: DP noise, or empty / below the floor on every client."""
        if self.private:
            return f"their noisy count total was below {NOISE_FLOOR:g} (DP)"
        return f"on every client their cluster was empty or below the privacy floor ({floor_size} records)"

    # ---------------------------------------------------------------------------------- records
    def summary(self) -> dict[str, Any]:
        """summary.json's privacy fields: for a method that supports DP its `privacy` block (`dp`: None
        when off) and, under SecAgg+, how many uploaded values it clipped over the run."""
        fields: dict[str, Any] = {}
        if method_spec(self.cfg.method).dp is not None:
            fields["privacy"] = {"dp": self.plan.summary(self.releases) if self.plan else None}
        if self.secure:
            fields["secagg_clipped"] = self.secagg_clipped
        return fields

    def state_dict(self) -> dict[str, int]:
        return {"releases": self.releases, "secagg_clipped": self.secagg_clipped}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.releases, self.secagg_clipped = state["releases"], state["secagg_clipped"]
