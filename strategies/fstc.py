"""FSTC strategy (Hu et al., IJCAI 2023): initial centres, Eq. 16 every round, model averaging at the end.

Round 1 clusters what the clients sent (local k-means centres weighted by their sizes, or the paper's
representations) into K initial global centres C̃ and builds the initial clustering model. Rounds 2 ..
num-rounds send C̃ (and, to a client that has not had it yet, the initial model) and apply Eq. 16 to the
local centres that come back. The last round's replies also carry the clients' models, averaged by
sample count into the global model (Alg. 2 line 12) that the clients are evaluated with.

Policy when clients are missing (dropout, rejected replies): Eq. 16 runs over the clients that
answered (a cluster none of them holds keeps its previous centre); the final model is the average of
the models that came back, weights renormalised over them; a client that missed the round with the
initial model gets it (and the current C̃) the first time it is asked again.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.common import FitIns, Parameters, log, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from fedapp.config import RunConfig
from fedapp.fstc_math import aggregate_centres, initial_centres
from fedapp.methods.fstc import CENTRES_KEY, FINAL_KEY, MODEL_KEY, PHASE_INIT, PHASE_TRAIN, FSTCConfig
from fedapp.models.fstc import fstc_model
from fedapp.privacy import WITHHELD_KEY
from fedapp.protocol import ArraySpec, ReplyError
from fedapp.torch_glue import StateSchema, state_arrays, state_schema, weighted_average
from strategies.base import ClientReply, ClusteringStrategy, consistent_replies


class FSTCStrategy(ClusteringStrategy):
    """See the module docstring. Variants without centre aggregation set `align = False`."""

    method = "fstc"
    align = True
    state_fields = ("centres", "initial_model", "schema", "global_model", "has_model", "train_metrics")

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(FSTCConfig)
        self.centres: np.ndarray | None = None  # C̃
        self.initial_model: list[np.ndarray] | None = None
        self.schema: StateSchema | None = None
        self.global_model: list[np.ndarray] | None = None
        self.has_model: set[int] = set()  # partitions that confirmed the initial model
        self.train_metrics: list[dict[str, float]] = []
        if cfg.num_rounds < 2:
            raise ValueError("FSTC needs num-rounds >= 2 (one initialisation round + training rounds)")

    # ---------------------------------------------------------------------------------- configure
    def fit_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, FitIns]]:
        config = self.fit_config(server_round)
        if self.centres is None:
            return [
                (client, FitIns(ndarrays_to_parameters([]), {**config, "phase": PHASE_INIT}))
                for client in clients
            ]
        config.update(phase=PHASE_TRAIN, **{FINAL_KEY: server_round >= self.cfg.num_rounds})
        instructions = []
        for client in clients:
            new = self.partition_of.get(client.cid) not in self.has_model
            arrays = [self.centres] if (self.align or new) else []
            if new:
                arrays += self.initial_model or []
            flags = {CENTRES_KEY: self.align or new, MODEL_KEY: new}
            instructions.append((client, FitIns(ndarrays_to_parameters(arrays), {**config, **flags})))
        return instructions

    # -------------------------------------------------------------------------------- replies
    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.centres is None:
            if self.params.init == "representations":
                return [ArraySpec("representations", (None, None))]
            return [ArraySpec("centres", (None, None)), ArraySpec("counts", (None,), "i")]
        k, dim = self.centres.shape
        spec = [ArraySpec("counts", (k,), "i")]
        if self.align:
            spec.insert(0, ArraySpec("centres", (k, dim)))
        if server_round >= self.cfg.num_rounds and self.schema is not None:
            spec += self.schema.array_specs()
        return spec

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        # the representation dimension is not known before the first replies
        return consistent_replies(replies, server_round) if self.centres is None else replies

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        if self.centres is None:
            if self.params.init == "centres":
                centres, counts = reply.arrays
                if counts.shape[0] != centres.shape[0] or (counts < 0).any():
                    raise ReplyError(f"{centres.shape[0]} centres but counts of shape {counts.shape}")
            return
        counts = reply.arrays[1 if self.align else 0]
        # clusters below the client's privacy floor come as empty (`floor-withheld`): sizes may sum to less
        if (counts < 0).any() or int(counts.sum()) > reply.num_examples:
            raise ReplyError(
                f"cluster sizes sum to {int(counts.sum())}, the client has {reply.num_examples} samples"
            )
        if int(counts.sum()) < reply.num_examples and not reply.metrics.get(WITHHELD_KEY):
            raise ReplyError(
                f"cluster sizes sum to {int(counts.sum())} of {reply.num_examples}, none withheld"
            )
        if server_round >= self.cfg.num_rounds and self.schema is not None:
            self.schema.check_fingerprint(reply.metrics, sender=f"client {reply.cid}")

    # ----------------------------------------------------------------------------- aggregation
    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        if self.centres is None:
            return self.initialise(replies)
        self.has_model.update(reply.partition_id for reply in replies)
        self.record_training(server_round, replies)
        if self.align:
            self.centres = aggregate_centres(
                [r.arrays[0] for r in replies], [r.arrays[1] for r in replies], self.centres
            )  # Eq. 16
        if server_round < self.cfg.num_rounds:
            return ndarrays_to_parameters([self.centres])
        assert self.schema is not None
        n_model = len(self.schema)
        self.global_model = weighted_average(
            [r.arrays[-n_model:] for r in replies], [r.num_examples for r in replies]
        )
        self.finished, self.stop_reason = True, "final model averaged"
        log(INFO, "FSTC: global model = average of %d client models (Alg. 2 line 12)", len(replies))
        return ndarrays_to_parameters(self.global_model)

    def initialise(self, replies: list[ClientReply]) -> Parameters:
        assert self.k is not None  # _validated rejects every reply while k is unknown
        if self.params.init == "representations":
            points, weights = [r.arrays[0] for r in replies], None
        else:
            points, weights = [r.arrays[0] for r in replies], [r.arrays[1] for r in replies]
        self.centres = initial_centres(points, weights, self.k, self.cfg.seed)
        with torch.random.fork_rng(devices=[]):  # Alg. 2 line 1: one initial model for every client
            torch.manual_seed(self.cfg.seed)
            model = fstc_model(self.params, self.k, self.centres.shape[1], self.cfg.embedding_model, "cpu")
        self.schema = state_schema(model)
        self.initial_model = state_arrays(model)
        log(
            INFO,
            "FSTC: %d initial centres from %d clients' %s",
            self.k,
            len(replies),
            "representations" if weights is None else "local k-means centres",
        )
        return ndarrays_to_parameters([self.centres])

    def record_training(self, server_round: int, replies: list[ClientReply]) -> None:
        """Mean of the clients' training metrics (losses, kept fraction, Sinkhorn iterations) per round."""
        keys = sorted(
            {
                key
                for r in replies
                for key, value in r.metrics.items()
                if key.startswith(("train-", "sinkhorn"))
            }
        )
        row: dict[str, float] = {"round": server_round}
        for key in keys:
            values = [float(r.metrics[key]) for r in replies if isinstance(r.metrics.get(key), int | float)]
            if values:
                row[key] = float(np.mean(values))
        self.train_metrics.append(row)

    # ------------------------------------------------------------------------------- evaluation
    def should_evaluate(self, server_round: int) -> bool:
        """Only the averaged global model is evaluated (local models have no common cluster order)."""
        return self.global_model is not None and super().should_evaluate(server_round)

    def extra_summary(self) -> dict[str, Any]:
        return {
            "fstc": {
                "encoder": self.params.encoder,
                "embedding_model": self.cfg.embedding_model,
                "init": self.params.init,
                "align": self.align,
                "train_per_round": self.train_metrics,
            }
        }


class FSTCRSTCStrategy(FSTCStrategy):
    """FSTC-RSTC ablation: no centre aggregation during training, final averaging only."""

    method = "fstc-rstc"
    align = False


class FSTCSTCStrategy(FSTCRSTCStrategy):
    """FSTC-STC ablation: as FSTC-RSTC on the server (the client drops the robust weights)."""

    method = "fstc-stc"
