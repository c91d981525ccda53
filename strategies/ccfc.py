"""CCFC strategy (Liu, Yan & Zhang, Alg. 1 lines 16-20): FedAvg of the local models + k-means of the
local centroids; the SimSiam pre-training phase, then CCFC, driven by the round number.

Server maths (plain functions, tested on arrays): `average_models` (Eq. 8, the whole state dict incl.
BatchNorm buffers, weighted by client size) and `merge_centroids` (k-means over the m*k local centroids).
`CCFCStrategy` is the glue: the setup round learns the image shape and builds the initial model from the
run seed, then every round broadcasts (w^g, global centroids) and aggregates what comes back.

Faults: a round aggregates the clients that answered with a valid reply (FedAvg weights renormalised over
them); clients that sit out (`dropout-rate`), fail, or send a reply with the wrong count, shapes, dtypes,
fingerprint or non-finite values are left out and recorded. Without any valid reply the global model and
centroids stay as they were.

Under SecAgg+ (run-config `secagg`): the model's average (Eq. 8) is SecAgg+'s secure average; the local
centroids are not a sum and come in the clear beside it (the server's k-means needs every client's),
so SecAgg+ hides each client's model but not its centroids. The setup round (no arrays) runs plain.

Under differential privacy (clients/ccfc.py) every reply is a noised, clipped update with equal weight;
the privacy layer (`strategies.privacy`) keeps averaged BatchNorm variances positive and accounts the
releases, and the server rescales the noisy local centroids by sqrt(k) / model-clip before its k-means.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import EvaluateRes, Parameters, Scalar, log, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from fedapp.config.run import RunConfig
from fedapp.maths.clustering import kmeans
from fedapp.methods.ccfc import (
    CLUSTER,
    PHASE_KEY,
    PRETRAIN,
    SECAGG_KEY,
    SETUP,
    SHAPE_KEYS,
    WANT_CENTROIDS_KEY,
    CCFCConfig,
    phase_of,
    secure_modes,
)
from fedapp.metrics.contingency import clustering_metrics
from fedapp.models.ccfc import initial_model
from fedapp.neural.glue import StateSchema, state_arrays, state_schema, weighted_average
from fedapp.report.keep import StartCandidate
from fedapp.wire import ArraySpec, ReplyError, decode_counts
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply, keep_modal

MODEL_FILE = "global_model.npz"  # the final global model and centroids (for simulation/papers/ccfc analyses)


class CheckpointError(RuntimeError):
    """`ccfc.init-model` names a file that does not hold this run's model (not a client fault: stop)."""


def average_models(states: list[list[np.ndarray]], sizes: list[int]) -> list[np.ndarray]:
    """Eq. 8: w^g = sum_l |X^l| / |X| w^l over every tensor of the state dict (BN buffers included)."""
    return weighted_average(states, [float(n) for n in sizes])


def load_checkpoint(
    path: Path, schema: StateSchema, k: int, latent_dim: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """(state arrays, centroids) from a `global_model.npz` written by `CCFCStrategy.write_outputs`."""
    try:
        saved = np.load(path)
    except OSError as exc:
        raise CheckpointError(f"ccfc.init-model: cannot read {path}: {exc}") from None
    missing = [name for name in schema.names if f"state.{name}" not in saved.files]
    if missing or "centroids" not in saved.files:
        raise CheckpointError(f"ccfc.init-model: {path} lacks {(missing or ['centroids'])[0]!r}")
    arrays = [saved[f"state.{name}"] for name in schema.names]
    try:
        schema.check(arrays, sender=f"ccfc.init-model {path}")
    except ReplyError as exc:
        raise CheckpointError(str(exc)) from None
    centroids = saved["centroids"]
    if centroids.shape != (k, latent_dim) or not np.all(np.isfinite(centroids)):
        raise CheckpointError(
            f"ccfc.init-model: centroids of shape {centroids.shape}, expected ({k}, {latent_dim})"
        )
    return arrays, centroids.astype(np.float32)


def merge_centroids(local: list[np.ndarray], k: int, seed: int) -> np.ndarray:
    """Alg. 1 line 19: k global centroids = k-means over all clients' local centroids (float32, k x d)."""
    union = np.concatenate(local, axis=0)
    if union.shape[0] < k:
        raise ValueError(f"only {union.shape[0]} local centroids for k={k} global clusters")
    centres, _ = kmeans(union, k, seed)
    return centres.astype(np.float32)


class CCFCStrategy(ClusteringStrategy):
    """Setup round, `pretrain-rounds` SimSiam rounds, then CCFC rounds (see fedapp.methods.ccfc)."""

    method = "ccfc"
    headline_metrics = ("acc", "nmi", "kappa")
    state_fields = (
        "image_shape",
        "schema",
        "global_state",
        "centroids",
        "centroids_round",
        "phases",
        "client_metrics",
        "start_arrays",
    )

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(CCFCConfig)
        self.image_shape: tuple[int, int, int] | None = None
        self.schema: StateSchema | None = None
        self.global_state: list[np.ndarray] | None = None
        self.centroids: np.ndarray | None = None
        self.centroids_round = 0  # the round whose replies produced `centroids`
        self.phases: dict[int, str] = {}
        self.client_metrics: dict[int, dict[str, dict[str, float]]] = {}  # round -> partition -> metrics
        self.start_arrays: list[np.ndarray] | None = None  # the first global model + centroids evaluated

    # ------------------------------------------------------------------------------------ rounds
    def phase(self, server_round: int) -> str:
        """The scheduled phase; CCFC waits for global centroids (a lost pre-training round delays it)."""
        if self.image_shape is None:
            return SETUP
        scheduled = phase_of(server_round, self.params.pretrain_rounds)
        if scheduled == SETUP or (scheduled == CLUSTER and self.centroids is None):
            return PRETRAIN
        return scheduled

    def wants_centroids(self, server_round: int) -> bool:
        """Local centroids cost a pass over the local data: only for CCFC, its last warm-up round and
        the rounds that are evaluated."""
        phase = self.phases.get(server_round, self.phase(server_round))
        if phase == SETUP:
            return False
        next_scheduled = phase_of(server_round + 1, self.params.pretrain_rounds)
        return phase == CLUSTER or next_scheduled == CLUSTER or super().should_evaluate(server_round)

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        phase = self.phase(server_round)
        self.phases[server_round] = phase
        return {
            **super().fit_config(server_round),
            PHASE_KEY: phase,
            WANT_CENTROIDS_KEY: int(self.wants_centroids(server_round)),
            SECAGG_KEY: self.cfg.secagg,
        }

    def secure_round(self, server_round: int) -> bool:
        """Under SecAgg+, every round but the setup (it carries no arrays) goes through it."""
        return self.phase(server_round) != SETUP

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.phases.get(server_round) == SETUP:
            return []
        specs = self.schema.array_specs() if self.params.federated and self.schema else []
        if self.params.federated and self.wants_centroids(server_round):
            specs.append(ArraySpec("local-centroids", (self.k, self.params.latent_dim), "f", "float32"))
        return self.privacy.expected(specs, self.reply_modes(server_round)) if specs else specs

    def reply_modes(self, server_round: int) -> list[str]:
        """`fedapp.privacy.secagg` modes of a reply: the model averaged, the local centroids in the clear."""
        assert self.schema is not None
        return secure_modes([t.dtype for t in self.schema.tensors], self.wants_centroids(server_round))

    def sends_releases(self, server_round: int) -> bool:
        return self.params.federated and self.phases.get(server_round) != SETUP

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        if self.phases.get(server_round) == SETUP:
            shape = tuple(reply.metrics.get(key) for key in SHAPE_KEYS)
            if not all(isinstance(s, int) and s > 0 for s in shape):
                raise ReplyError(f"setup reply lacks a positive image shape {SHAPE_KEYS}: {shape}")
        elif self.params.federated and self.schema is not None:
            self.schema.check_fingerprint(reply.metrics, sender=f"client {reply.cid}")
        if reply.num_examples < 1:
            raise ReplyError(f"num_examples is {reply.num_examples}")

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        if self.phases.get(server_round) != SETUP:
            return replies

        def image_shape(reply: ClientReply) -> tuple[int, ...]:
            return tuple(int(reply.metrics[key]) for key in SHAPE_KEYS)

        return keep_modal(replies, server_round, image_shape, "image shape")

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        if self.phases[server_round] == SETUP:
            return self._setup(replies)
        if self.params.federated:
            assert self.schema is not None
            n_state = len(self.schema)
            modes = self.reply_modes(server_round)
            dtypes = [t.dtype for t in self.schema.tensors] + [None] * (len(modes) - n_state)
            replies = self.privacy.intake(server_round, replies, modes, dtypes)
            averaged = average_models(
                [r.arrays[:n_state] for r in replies], [r.num_examples for r in replies]
            )
            self.global_state = self.privacy.positive_variances(self.schema.names, averaged)
            scale = 1.0
            if self.privacy.private:  # the centroids were released scaled by model-clip / sqrt(k)
                scale = float(np.sqrt(self.k)) / self.cfg.dp.model_clip  # type: ignore[arg-type]
            if self.wants_centroids(server_round):
                local = [r.arrays[n_state] * np.float32(scale) for r in replies]
                self.centroids = merge_centroids(local, self.k, self.cfg.seed + server_round)
                self.centroids_round = server_round
                if self.start_arrays is None:
                    self.start_arrays = [a.copy() for a in [*self.global_state, self.centroids]]
            return self._broadcast()
        # standalone: nothing to average; the clients keep their models and centroids
        if self.wants_centroids(server_round):
            self.centroids_round = server_round
            self.centroids = np.zeros((0,), np.float32)
        return ndarrays_to_parameters([np.zeros((0,), np.float32)])

    def start_candidate(self) -> StartCandidate | None:
        """The first clustering the run evaluates (after pre-training: k-means of the local centroids)."""
        if self.start_arrays is None:
            return None
        return StartCandidate(self.start_arrays, {}, "")

    def _setup(self, replies: list[ClientReply]) -> Parameters:
        """Alg. 1 line 1: the initial global model from the run seed, for the clients' image shape."""
        self.image_shape = tuple(int(replies[0].metrics[key]) for key in SHAPE_KEYS)
        model = initial_model(self.params, self.image_shape, self.cfg.seed)
        self.schema = state_schema(model)
        self.global_state = state_arrays(model)
        if self.params.init_model:
            assert self.k is not None
            path = Path(self.params.init_model)
            self.global_state, self.centroids = load_checkpoint(
                path, self.schema, self.k, self.params.latent_dim
            )
            log(INFO, "CCFC: starting from the model and centroids in %s", path)
        log(
            INFO,
            "CCFC: image shape %s, %d tensors (%.2f M values) in the model; %d clients, %d samples",
            self.image_shape,
            len(self.schema),
            sum(a.size for a in self.global_state) / 1e6,
            len(replies),
            sum(r.num_examples for r in replies),
        )
        return self._broadcast()

    def _broadcast(self) -> Parameters:
        """What every client gets next: w^g, plus the global centroids once there are any."""
        assert self.global_state is not None
        extra = [self.centroids] if self.centroids is not None else []
        return ndarrays_to_parameters(self.global_state + extra)

    # -------------------------------------------------------------------------------- evaluation
    def should_evaluate(self, server_round: int) -> bool:
        """Only rounds that produced global centroids can be scored (Eq. 3 needs them)."""
        return self.centroids_round == server_round and super().should_evaluate(server_round)

    def evaluation_metrics(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]
    ) -> tuple[dict[str, float], dict[str, Any]] | None:
        """Also score each client on its own samples (paper Table 4: kappa per client)."""
        per_client: dict[str, dict[str, float]] = {}
        for _, res in results:
            try:
                table = decode_counts(res.metrics["table"])
                per_client[str(res.metrics["partition-id"])] = clustering_metrics(table)
            except (KeyError, ValueError):
                continue  # the base class logs and drops malformed tables
        self.client_metrics[server_round] = dict(sorted(per_client.items(), key=lambda kv: int(kv[0])))
        return super().evaluation_metrics(server_round, results)

    # ----------------------------------------------------------------------------------- outputs
    def extra_summary(self) -> dict[str, Any]:
        last = max(self.client_metrics) if self.client_metrics else None
        return {
            "phases": {str(r): phase for r, phase in sorted(self.phases.items())},
            "client_metrics": self.client_metrics.get(last, {}) if last is not None else {},
            "image_shape": list(self.image_shape) if self.image_shape else None,
        }

    def write_outputs(self) -> None:
        super().write_outputs()
        if self.params.federated and self.global_state is not None and self.centroids is not None:
            assert self.schema is not None
            arrays = dict(zip(self.schema.names, self.global_state, strict=True))
            np.savez(
                Path(self.out_dir) / MODEL_FILE,
                **{"state." + k: v for k, v in arrays.items()},
                centroids=self.centroids,
            )
