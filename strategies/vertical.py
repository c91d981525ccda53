"""Shared server glue for vertical federations: client v holds view v of the same N samples.

The initialisation needs every view (the maths combines them): a round in which a view is missing is
skipped and the next retries, and simulated dropout (`dropout-rate`) spares it. Later rounds go on
without a view that sat out, failed or timed out: its last reply (CeFMC: its labels y_v and objective;
FedCMv: its partial distances) stands in for it, and the round's record names it. After the first round
the server knows which client holds which view (from the `partition-id` in its reply) and sends each
client its own per-view payload. The global model is the consensus label vector; only the
label holder (partition 0) scores it, because every party holds the same samples.
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import FitIns, GetPropertiesIns, Parameters, Scalar, log, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from fedapp.config.run import RunConfig
from fedapp.privacy.alignment import ALIGN_KEY, ALIGNED_KEY, AlignmentError, intersect
from fedapp.report.records import PROGRESS_MARKER
from fedapp.wire import LABEL_HOLDER, ArraySpec, ReplyError, label_dtype
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply, consistent_replies


def has_converged(previous_objective: float | None, objective: float, delta: float) -> bool:
    """Alg. 2, server line 14: stop when |obj_t - obj_{t-1}| / |obj_t| <= δ (never on the first round)."""
    if previous_objective is None:
        return False
    if objective == 0.0:
        return previous_objective == 0.0
    return abs(objective - previous_objective) / abs(objective) <= delta


class VerticalStrategy(ClusteringStrategy):
    """Subclasses implement `initialised`, `view_payload`, `reply_spec` and `aggregate_views`, and check
    their replies in `check_view_reply` (not `check_reply`, which also sees the alignment round)."""

    refuse_duplicate_partitions = False  # two replies for one view: `aggregate` keeps the first and says so

    state_fields = (
        "aligned_ids",
        "alignment",
        "n_views",
        "n_samples",
        "objectives",
        "last_reply",
        "stale_views",
    )

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.own_data = cfg.own_data  # parties' own files: line them up by id first
        self.aligned_ids: np.ndarray | None = None  # the intersection of the parties' id hashes
        self.alignment: dict[str, dict[str, int]] = {}  # party -> its rows and how many were left out
        self.n_views: int | None = cfg.num_clients or None
        self.n_samples: int | None = None
        self.objectives: list[float] = []  # one per update round
        self.last_reply: dict[int, ClientReply] = {}  # view -> its latest valid reply (stands in for it)
        self.stale_views: dict[int, list[int]] = {}  # round -> views whose last reply stood in

    # ---------------------------------------------------------------------------------------- hooks
    def initialised(self) -> bool:
        raise NotImplementedError

    def view_payload(self, view: int) -> list[np.ndarray]:
        """Arrays for the client holding `view` once initialised."""
        raise NotImplementedError

    def aggregate_views(
        self, round_number: int, arrays: list[np.ndarray], metrics: list[dict[str, Any]]
    ) -> np.ndarray:
        """Server update from one array per view (view order); returns the consensus labels."""
        raise NotImplementedError

    def stop_delta(self) -> float:
        """The method's relative-objective threshold (its `<method>.delta` key)."""
        raise NotImplementedError

    def record_objective(self, objective: float) -> None:
        """Keep this round's objective; finish when its relative change is <= delta (Alg. 2, line 14)."""
        previous = self.objectives[-1] if self.objectives else None
        self.objectives.append(objective)
        delta = self.stop_delta()
        if has_converged(previous, objective, delta):
            self.finished, self.stop_reason = True, f"relative objective change <= delta={delta:g}"

    def report_views(self) -> int | None:
        return self.n_views

    def extra_summary(self) -> dict[str, Any]:
        stale = {str(r): views for r, views in sorted(self.stale_views.items())}
        summary = {"objective_per_round": self.objectives, "stale_views": stale}
        if self.own_data:
            summary["alignment"] = dict(sorted(self.alignment.items(), key=lambda kv: int(kv[0])))
        return summary

    def needs_every_client(self, server_round: int) -> bool:
        return not self.initialised()

    @property
    def aligning(self) -> bool:
        """This round collects the parties' id hashes (own data, before anything else)."""
        return self.own_data and self.aligned_ids is None

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        config = super().fit_config(server_round)
        if self.aligning:
            return {"server-round": server_round, ALIGN_KEY: True}
        return config

    def expected_arrays(self, server_round: int) -> list[ArraySpec]:
        if self.aligning:
            return [ArraySpec("id-hashes", (None,), kind="U")]
        return super().expected_arrays(server_round)

    # ------------------------------------------------------------------------------------ protocol
    def fit_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, FitIns]]:
        config = self.fit_config(server_round)
        if self.aligning:
            ins = FitIns(ndarrays_to_parameters([]), config)
            return [(client, ins) for client in clients]
        if not self.initialised():
            arrays: list[np.ndarray] = []
            if self.aligned_ids is not None:  # every party lines its rows up before the first step
                arrays, config = [self.aligned_ids], {**config, ALIGNED_KEY: True}
            ins = FitIns(ndarrays_to_parameters(arrays), config)
            return [(client, ins) for client in clients]
        instructions = []
        for client in clients:
            view = self.partition_of.get(client.cid)
            if view is None:  # e.g. a resumed run, whose nodes have new ids: ask the client who it is
                view = self._ask_partition(client, server_round)
            if view is None or not 0 <= view < (self.n_views or 0):
                log(
                    WARNING,
                    "round %d: client %s holds no known view (it missed the first round)",
                    server_round,
                    client.cid,
                )
                continue
            instructions.append((client, FitIns(ndarrays_to_parameters(self.view_payload(view)), config)))
        return instructions

    def _ask_partition(self, client: ClientProxy, server_round: int) -> int | None:
        """The partition id a client reports through `get_properties` (None if it cannot say)."""
        try:
            res = client.get_properties(
                GetPropertiesIns({}), timeout=self.cfg.round_timeout or None, group_id=server_round
            )
        except Exception as exc:  # a client that cannot answer is treated like one that missed round 1
            log(
                WARNING,
                "round %d: client %s did not say which view it holds: %s",
                server_round,
                client.cid,
                exc,
            )
            return None
        view = res.properties.get("partition-id")
        if isinstance(view, int) and not isinstance(view, bool):
            self.partition_of[client.cid] = view
            return view
        return None

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        if self.aligning:  # parties may hold different numbers of records before the alignment
            return replies
        # the first replies fix N (every view has the same samples): a client with other rows is rejected
        return consistent_replies(replies, server_round, axis=0) if self.n_samples is None else replies

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        """Every reply names a view of this federation. The alignment round's id hashes belong to this
        glue (`expected_arrays` checked them, `align` intersects them): only replies to the method's own
        messages reach its `check_view_reply`, so a method never meets an array of hex strings."""
        n_views = self.n_views or self.roster.clients_seen
        if not 0 <= reply.partition_id < n_views:
            raise ReplyError(
                f"partition-id {reply.partition_id} is not a view of this federation (0..{n_views - 1})"
            )
        if self.aligning:
            return
        for array in reply.arrays:
            if array.dtype.kind in "iu" and array.size and (array.min() < 0 or array.max() >= (self.k or 0)):
                raise ReplyError(f"labels outside [0, {self.k})")
        self.check_view_reply(server_round, reply)

    def check_view_reply(self, server_round: int, reply: ClientReply) -> None:
        """The method's own checks of a reply to its messages (never the alignment round's hashes)."""

    def align(self, replies: list[ClientReply]) -> None:
        """Intersect the parties' id hashes (`fedapp.privacy.alignment`); a tiny overlap stops the run."""
        n_views = self.n_views or self.roster.clients_seen
        hashes = {reply.partition_id: reply.arrays[0] for reply in replies}
        missing = sorted(set(range(n_views)) - set(hashes))
        if missing:
            raise ValueError(f"parties {missing} of {n_views} sent no ids: the alignment needs every party")
        assert self.k is not None
        try:
            common = intersect(hashes, self.k)
        except AlignmentError as exc:
            self._stop(str(exc))
            return
        self.aligned_ids = common
        self.alignment = {
            str(party): {"rows": int(len(ids)), "left_out": int(len(ids) - len(common))}
            for party, ids in sorted(hashes.items())
        }
        log(
            INFO,
            "%s aligned %d records across %d parties (left out: %s)",
            PROGRESS_MARKER,
            len(common),
            n_views,
            ", ".join(f"party {p} {v['left_out']}" for p, v in self.alignment.items()),
        )

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        if self.aligning:
            self.align(replies)
            return None
        n_views = self.n_views or self.roster.clients_seen
        by_view: dict[int, ClientReply] = {}
        for reply in replies:
            if reply.partition_id in by_view:
                log(
                    WARNING,
                    "round %d: two replies for view %d; keeping client %s",
                    server_round,
                    reply.partition_id,
                    by_view[reply.partition_id].cid,
                )
                continue
            by_view[reply.partition_id] = reply
        extra = sorted(set(by_view) - set(range(n_views)))
        if extra:
            raise ValueError(f"unexpected views {extra} of {n_views}")
        missing = sorted(set(range(n_views)) - set(by_view))
        if missing and not self.initialised():
            raise ValueError(f"views {missing} of {n_views} missing: the initialisation needs every view")
        if self.initialised():  # kept even if this round cannot proceed: a later round may use it
            self.last_reply.update(by_view)
        never_seen = [view for view in missing if view not in self.last_reply]
        if never_seen:  # no update-round reply of theirs yet (an initialisation reply is another message)
            raise ValueError(f"views {never_seen} have not replied to an update round yet")
        if missing:
            log(WARNING, "round %d: views %s stand in with their last replies", server_round, missing)
            self.stale_views[server_round] = missing
        by_view = {view: by_view.get(view, self.last_reply.get(view)) for view in range(n_views)}
        self.n_views = n_views
        self.n_samples = replies[0].arrays[0].shape[0]
        ordered = [by_view[view] for view in range(n_views)]
        labels = self.aggregate_views(
            server_round, [r.arrays[0] for r in ordered], [r.metrics for r in ordered]
        )
        assert self.k is not None
        return ndarrays_to_parameters([labels.astype(label_dtype(self.k))])

    def evaluation_clients(self, clients: list[ClientProxy]) -> list[ClientProxy]:
        return [client for client in clients if self.partition_of.get(client.cid) == LABEL_HOLDER]
