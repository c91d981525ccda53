"""Strategy side of SecAgg+ (run-config `secagg`): a round's secure average back into per-reply arrays.

Under SecAgg+ every fit reply a strategy sees carries the same secure average, in place of the client's
own arrays (`fedapp.privacy.secagg`). `SecureSumStrategy.plain_equivalent` turns them into arrays the
method's plain aggregation maps to the secure result, so each method keeps one aggregation path. The
sum covers every client whose reply reached the workflow: if the strategy rejects one of them (a bad
fingerprint, a wrong step), its share cannot be taken out again, so the round is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from logging import WARNING
from typing import Any

from flwr.common import FitRes, Parameters, Scalar, log
from flwr.server.client_proxy import ClientProxy

from fedapp.privacy.secagg import CLEAR_KEY, CLIPPED_KEY, plain_replies, sum_tolerance
from strategies.replies import ClientReply


class SecureSumStrategy:
    """Mixin for a `ClusteringStrategy` whose replies may come through SecAgg+ (`self.cfg.secagg`)."""

    cfg: Any
    secure_weights: dict[str, int]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        # who is inside this round's secure sum, before validation may drop anyone
        self.secure_weights = {client.cid: int(res.num_examples) for client, res in results}
        return super().aggregate_fit(server_round, results, failures)  # type: ignore[misc]

    def secure_tolerance(self) -> float:
        """How far a secure average of per-sample shares (counts / n) may stray from the exact one."""
        total = max(sum(self.secure_weights.values()), 1)
        return (
            sum_tolerance(self.cfg.secagg_clip, self.cfg.secagg_max_weight, len(self.secure_weights)) / total
        )

    def summary(self) -> dict[str, Any]:
        """summary.json, plus how many uploaded values SecAgg+ clipped over the run (0: none distorted)."""
        summary: dict[str, Any] = super().summary()  # type: ignore[misc]
        if self.cfg.secagg:
            summary["secagg_clipped"] = getattr(self, "secagg_clipped", 0)
        return summary

    def plain_equivalent(
        self,
        server_round: int,
        replies: list[ClientReply],
        modes: Sequence[str],
        dtypes: Sequence[str | None],
    ) -> list[ClientReply]:
        """`replies` with arrays whose plain aggregation equals the secure one (see `fedapp.privacy.secagg`);
        ValueError (the round is skipped) when a client inside the secure sum was rejected."""
        missing = set(self.secure_weights) - {reply.cid for reply in replies}
        if missing:
            raise ValueError(
                f"SecAgg+: the secure sum includes rejected client(s) {sorted(missing)}, whose share "
                "cannot be removed"
            )
        clipped = sum(int(reply.metrics.get(CLIPPED_KEY, 0)) for reply in replies)  # type: ignore[arg-type]
        self.secagg_clipped = getattr(self, "secagg_clipped", 0) + clipped
        if clipped:
            log(
                WARNING,
                "round %d: SecAgg+ clipped %d uploaded values to +-%g (raise secagg-clip)",
                server_round,
                clipped,
                self.cfg.secagg_clip,
            )
        arrays = plain_replies(
            replies[0].arrays,
            [reply.metrics.get(CLEAR_KEY) for reply in replies],
            [reply.num_examples for reply in replies],
            modes,
            dtypes,
        )
        return [replace(reply, arrays=own) for reply, own in zip(replies, arrays, strict=True)]
