"""FSCCL strategy: FSTC's private initialisation, then FedAvg of the whole SCCL model every round.

Round 1 clusters the clients' local k-means centres (weighted by size) into K initial centres, which
become the model's DEC centres (SCCL initialises them with k-means). Every later round sends the global
model and replaces it by the sample-weighted average of the models that come back (clients that
dropped out or were rejected are left out, weights renormalised). The global model exists from round
1 on, so it is evaluated every `eval-every` rounds.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.common import Parameters, Scalar, log, ndarrays_to_parameters

from fedapp.config.run import RunConfig
from fedapp.maths.fstc import initial_centres
from fedapp.methods.fsccl import FSCCLConfig
from fedapp.models.fsccl import SCCLModel
from fedapp.neural.glue import StateSchema, state_arrays, state_schema, weighted_average
from fedapp.report.keep import StartCandidate
from fedapp.wire import ArraySpec, ReplyError
from strategies.base import ClientReply, ClusteringStrategy, consistent_replies


class FSCCLStrategy(ClusteringStrategy):
    method = "fsccl"
    state_fields = ("schema", "global_model", "start_model", "train_metrics")

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(FSCCLConfig)
        self.schema: StateSchema | None = None
        self.global_model: list[np.ndarray] | None = None
        self.start_model: list[np.ndarray] | None = None  # round 1's model: `select = best`'s start
        self.train_metrics: list[dict[str, float]] = []

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        phase = "init" if self.global_model is None else "train"
        return {**super().fit_config(server_round), "phase": phase}

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.schema is None:
            return [ArraySpec("centres", (None, None)), ArraySpec("counts", (None,), "i")]
        return self.schema.array_specs()

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        return consistent_replies(replies, server_round) if self.schema is None else replies

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        if self.schema is not None:
            self.schema.check_fingerprint(reply.metrics, sender=f"client {reply.cid}")
            return
        centres, counts = reply.arrays
        if counts.shape[0] != centres.shape[0] or (counts < 0).any():
            raise ReplyError(f"{centres.shape[0]} centres but counts of shape {counts.shape}")

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        if self.schema is None:
            assert self.k is not None  # _validated rejects every reply while k is unknown
            centres = initial_centres(
                [r.arrays[0] for r in replies], [r.arrays[1] for r in replies], self.k, self.cfg.seed
            )
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.cfg.seed)
                model = SCCLModel(
                    centres.shape[1],
                    self.k,
                    adapter_hidden=self.params.adapter_hidden,
                    alpha=self.params.alpha,
                )
            with torch.no_grad():
                model.centres.copy_(torch.as_tensor(centres))
            self.schema = state_schema(model)
            self.global_model = state_arrays(model)
            self.start_model = [array.copy() for array in self.global_model]
            log(INFO, "FSCCL: initial model with %d k-means centres from %d clients", self.k, len(replies))
        else:
            self.global_model = weighted_average(
                [r.arrays for r in replies], [r.num_examples for r in replies]
            )
            self.train_metrics.append(
                {
                    "round": server_round,
                    "train-loss": float(np.mean([float(r.metrics["train-loss"]) for r in replies])),
                }
            )
        return ndarrays_to_parameters(self.global_model)

    def start_candidate(self) -> StartCandidate | None:
        """The initial model (round 1's merged local k-means centres as DEC's centres, the seeded adapter),
        labelling by DEC's soft assignment as the final model does."""
        if self.start_model is None:
            return None
        return StartCandidate(self.start_model, {}, "")

    def extra_summary(self) -> dict[str, Any]:
        return {"fsccl": {"train_per_round": self.train_metrics}}
