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

Privacy is composed around it (`strategies.privacy`). Where only sums may reach the server (SecAgg+) or
be noised (DP) round 1 draws C̃ from the federated mean and variance of the representations (`init =
moments`); training replies then hold per-cluster sums and counts (secure over n, or noisy), and Eq. 16
runs on the federation's totals (a cluster with under half a record in total, or at most one under DP's
noise, keeps its C̃). FSTC's own choice under DP (clients/fstc.py): with `fstc.dp-labels = centres`
(default) no model is sent either way (the clients build the public initial model from the run seed) and
the global model is [C̃, *the initial model]: records are labelled by their nearest centre. With `model`
the final models are averaged with equal weights (the clients send no record count).
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.common import FitIns, Parameters, log, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from fedapp.config.run import RunConfig
from fedapp.maths.clustering import centres_from_moments
from fedapp.maths.fstc import (
    EMPTY_TOTAL,
    SITE_SKEW_WARNING,
    centres_from_totals,
    initial_centres,
    relocate_empty,
    site_skew,
)
from fedapp.methods.fstc import (
    CENTRES_KEY,
    FINAL_KEY,
    HEAD_INIT_CENTRES,
    INIT_KEY,
    INIT_MERGE_KFED,
    INIT_MERGE_WEIGHTED,
    MODEL_KEY,
    PHASE_INIT,
    PHASE_LLOYD,
    PHASE_TRAIN,
    SECAGG_KEY,
    FSTCConfig,
    lloyd_rounds,
    loss_target,
    train_modes,
)
from fedapp.models.fstc import fstc_model
from fedapp.neural.glue import StateSchema, state_arrays, state_schema, weighted_average
from fedapp.privacy.floor import WITHHELD_KEY
from fedapp.privacy.secagg import MEAN, SUM
from fedapp.report.keep import BY_CENTRES, LABELS_BY_KEY, StartCandidate
from fedapp.wire import ArraySpec, ReplyError
from strategies.base import ClientReply, ClusteringStrategy, consistent_replies

# under DP with dp-labels = centres the rounds are DP Lloyd steps: on StackOverflow at eps 8 (seed 0) 6 and
# 11 rounds gave NMI 61.2 / 62.7, the default 41 rounds 57.4; beyond this many the run says so
DP_CENTRE_ROUNDS = 11


def site_skew_warning(skew: float) -> str:
    """The warning for sites that hold different clusters (mean site skew, `fstc_math.site_skew`, above
    SITE_SKEW_WARNING: IID sites measure 0.02-0.04, the label-skewed sets of docs/methods/fstc.md 0.29 and
    more), the shape where FSTC was measured far below FSBERT k-FED; from the init round's local centres
    and sizes, which the server has anyway."""
    return (
        f"sites hold different clusters (mean site skew {skew:.2f} > {SITE_SKEW_WARNING}: each client's "
        "share over the initial clusters differs from the federation's); with many topics split across "
        "sites FSTC measured far below fsbert-kfed (docs/methods/fstc.md, 'Real data shapes'): compare "
        "with `--method fsbert-kfed`"
    )


def head_scale(scale: float, centres: np.ndarray, secagg_clip: float | None) -> float:
    """`fstc.head-scale` for F's start at the centres, lowered under SecAgg+ (`secagg_clip` given) so the
    started weights stay within half the clip (SecAgg+ clips beyond it: a wrong, not a noisy, sum; half
    leaves training room). The argmax, the nearest centre, does not depend on the scale."""
    if secagg_clip is None:
        return scale
    largest = max(float(np.abs(centres).max()), float(0.5 * (centres**2).sum(1).max()))
    bound = 0.5 * secagg_clip / max(largest, 1e-12)
    if bound < scale:
        log(INFO, "FSTC: F starts at scale %.3g, not %.3g, to stay within secagg-clip/2", bound, scale)
    return min(scale, bound)


def training_row(server_round: int, replies: list[ClientReply]) -> dict[str, float]:
    """Mean of the clients' training metrics (losses, kept fraction, Sinkhorn iterations) in a round."""
    keys = sorted({key for r in replies for key in r.metrics if key.startswith(("train-", "sinkhorn"))})
    row: dict[str, float] = {"round": server_round}
    for key in keys:
        values = [float(r.metrics[key]) for r in replies if isinstance(r.metrics.get(key), int | float)]
        if values:
            row[key] = float(np.mean(values))
    return row


INIT_SOURCES = {"representations": "representations", "moments": "representation moments"}


class FSTCStrategy(ClusteringStrategy):
    """See the module docstring. Variants without centre aggregation set `align = False`."""

    method = "fstc"
    align = True
    state_fields = (
        "centres",
        "initial_model",
        "schema",
        "global_model",
        "has_model",
        "train_metrics",
        "lloyd_done",
        "start_centres",
    )

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(FSTCConfig)
        self.centres: np.ndarray | None = None  # C̃
        self.initial_model: list[np.ndarray] | None = None
        self.schema: StateSchema | None = None
        self.global_model: list[np.ndarray] | None = None
        self.has_model: set[int] = set()  # partitions that confirmed the initial model
        self.train_metrics: list[dict[str, float]] = []
        self.site_skew: float | None = None  # label skew across sites, from the init (centres init only)
        # only sums may reach the server (SecAgg+) or be noised (DP): then the initialisation is one too
        self.init = "moments" if self.privacy.sums_only else self.params.init
        self.lloyd_rounds = lloyd_rounds(self.privacy.secure, self.params)
        self.total_rounds += self.lloyd_rounds
        self.lloyd_done = 0  # secure Lloyd steps taken on the moments init (`PHASE_LLOYD`)
        self.start_centres: np.ndarray | None = None  # C̃ as training starts: the k-FED-like clustering
        # under DP with dp-labels = centres: labels by the nearest C̃, no model sent or released
        self.centre_labels = self.privacy.private and not self.params.dp_model_release
        if cfg.num_rounds < 2:
            raise ValueError("FSTC needs num-rounds >= 2 (one initialisation round + training rounds)")
        if self.centre_labels:
            log(
                INFO,
                "FSTC under DP with fstc.dp-labels=centres: no local training (nothing it produces is "
                "released or used); labels = nearest global centre in the public initial-model space",
            )
            if cfg.num_rounds > DP_CENTRE_ROUNDS:
                self.warn(
                    f"under DP each of the {cfg.num_rounds - 1} training rounds is a noisy release of the "
                    "centre statistics, so the budget is spread thin (StackOverflow at eps 8: NMI 61-63 with "
                    "6-11 rounds, 57 with 41; docs/privacy.md): consider --set num-rounds=6"
                )

    # ---------------------------------------------------------------------------------- configure
    def fit_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, FitIns]]:
        config = {**self.fit_config(server_round), SECAGG_KEY: self.cfg.secagg}
        if self.centres is None:
            init = {"phase": PHASE_INIT, INIT_KEY: self.init}
            return [(client, FitIns(ndarrays_to_parameters([]), {**config, **init})) for client in clients]
        if self.refining:
            ins = FitIns(ndarrays_to_parameters([self.centres]), {**config, "phase": PHASE_LLOYD})
            return [(client, ins) for client in clients]
        config.update(phase=PHASE_TRAIN, **{FINAL_KEY: server_round >= self.total_rounds})
        if self.start_centres is None:
            self.start_centres = self.centres.copy()
        instructions = []
        for client in clients:
            # with centre labels a client needs no model: it builds the public one from the run seed
            new = not self.centre_labels and self.partition_of.get(client.cid) not in self.has_model
            arrays = [self.centres] if (self.align or new) else []
            if new:
                arrays += self.initial_model or []
            flags = {CENTRES_KEY: self.align or new, MODEL_KEY: new}
            instructions.append((client, FitIns(ndarrays_to_parameters(arrays), {**config, **flags})))
        return instructions

    # -------------------------------------------------------------------------------- replies
    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.centres is None:
            if self.init == "representations":
                return [ArraySpec("representations", (None, None))]
            if self.init == "moments":
                return self.privacy.moments_spec()
            return [ArraySpec("centres", (None, None)), ArraySpec("counts", (None,), "i")]
        k, dim = self.centres.shape
        if self.refining:
            spec = [ArraySpec("sums", (k, dim)), ArraySpec("counts", (k,), "i")]
            return self.privacy.expected(spec, self.reply_modes(server_round))
        spec = [ArraySpec("counts", (k,), "i")]
        if self.align:
            spec.insert(0, ArraySpec("centres", (k, dim)))
        if self.model_in_reply(server_round):
            spec += self.schema.array_specs()  # type: ignore[union-attr]
        return self.privacy.expected(spec, self.reply_modes(server_round))

    def final_round(self, server_round: int) -> bool:
        return server_round >= self.total_rounds and self.schema is not None

    def model_in_reply(self, server_round: int) -> bool:
        """The clients send their model this round: the last one, unless DP labels by centres."""
        return self.final_round(server_round) and not self.centre_labels

    def reply_modes(self, server_round: int) -> list[str]:
        """`fedapp.privacy.secagg` modes of this round's reply (moments: n-weighted means)."""
        if self.centres is None:
            return [MEAN, MEAN]
        if self.refining:
            return [SUM, SUM]
        dtypes = [t.dtype for t in self.schema.tensors] if self.model_in_reply(server_round) else []  # type: ignore[union-attr]
        return train_modes(self.align, dtypes)

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        # the representation dimension is not known before the first replies
        if self.centres is not None:
            return replies
        return consistent_replies(replies, server_round, axis=0 if self.init == "moments" else 1)

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        if self.model_in_reply(server_round):
            self.schema.check_fingerprint(reply.metrics, sender=f"client {reply.cid}")  # type: ignore[union-attr]
        if self.centres is None:
            if self.init == "centres":
                centres, counts = reply.arrays
                if counts.shape[0] != centres.shape[0] or (counts < 0).any():
                    raise ReplyError(f"{centres.shape[0]} centres but counts of shape {counts.shape}")
            return
        counts = reply.arrays[1 if self.align else 0]
        if not self.privacy.exact:  # a secure share of records in [0, 1], or noisy counts
            self.privacy.check_shares(counts)
            return
        # clusters below the client's privacy floor come as empty (`floor-withheld`): sizes may sum to less
        if (counts < 0).any() or int(counts.sum()) > reply.num_examples:
            raise ReplyError(
                f"cluster sizes sum to {int(counts.sum())}, the client has {reply.num_examples} samples"
            )
        if int(counts.sum()) < reply.num_examples and not reply.metrics.get(WITHHELD_KEY):
            raise ReplyError(
                f"cluster sizes sum to {int(counts.sum())} of {reply.num_examples}, none withheld"
            )

    # ----------------------------------------------------------------------------- aggregation
    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        modes, dtypes = self.reply_modes(server_round), self.secure_dtypes(server_round)
        replies = self.privacy.intake(server_round, replies, modes, dtypes)
        if self.centres is None:
            return self.initialise(replies)
        if self.refining:
            return self.lloyd_step(replies)
        self.has_model.update(reply.partition_id for reply in replies)
        self.train_metrics.append(training_row(server_round, replies))
        if self.align:  # Eq. 16 from the federation's totals (noisy totals are summed as they are)
            weighted, total = self.privacy.centre_totals(
                [r.arrays[0] for r in replies], [r.arrays[1] for r in replies]
            )
            min_total = max(EMPTY_TOTAL, self.privacy.noise_floor)
            self.centres = centres_from_totals(weighted, total, self.centres, min_total)
            self.note_stale_centres(server_round, total >= min_total)
        if server_round < self.total_rounds:
            return ndarrays_to_parameters([self.centres])
        if self.centre_labels:
            assert self.initial_model is not None
            self.global_model = [self.centres, *self.initial_model]
            self.finished, self.stop_reason = True, "global centres final (DP, fstc.dp-labels=centres)"
            log(INFO, "FSTC: global model = %d centres + the public initial model (labels: nearest)", self.k)
            return ndarrays_to_parameters(self.global_model)
        assert self.schema is not None
        n_model = len(self.schema)
        weights = self.privacy.model_weights(replies)
        self.global_model = weighted_average([r.arrays[-n_model:] for r in replies], weights)
        self.finished, self.stop_reason = True, "final model averaged"
        log(INFO, "FSTC: global model = average of %d client models (Alg. 2 line 12)", len(replies))
        return ndarrays_to_parameters(self.global_model)

    @property
    def refining(self) -> bool:
        """This round is a secure Lloyd step on the moments init (`fedapp.methods.fstc.lloyd_rounds`)."""
        return self.centres is not None and self.lloyd_done < self.lloyd_rounds

    def lloyd_step(self, replies: list[ClientReply]) -> Parameters:
        """C̃_k = (sum of the records nearest C̃_k) / (their count), from SecAgg+'s totals in the initial
        representation space; an empty cluster moves beside the largest (`relocate_empty`)."""
        assert self.centres is not None
        sums, counts = self.privacy.centre_totals(
            [r.arrays[0] for r in replies], [r.arrays[1] for r in replies]
        )
        centres = centres_from_totals(sums, counts, self.centres, EMPTY_TOTAL)
        self.lloyd_done += 1
        self.centres, moved = relocate_empty(centres, counts, self.cfg.seed + self.lloyd_done)
        log(
            INFO,
            "FSTC: secure Lloyd step %d of %d (%d of %d held; %d empty moved by the largest)",
            self.lloyd_done,
            self.lloyd_rounds,
            int((counts >= EMPTY_TOTAL).sum()),
            self.k,
            moved,
        )
        return ndarrays_to_parameters([self.centres])

    def secure_dtypes(self, server_round: int) -> list[str | None]:
        """Dtypes the secure average is cast back to: float64 sums, the model's own dtypes."""
        modes = self.reply_modes(server_round)
        model = [t.dtype for t in self.schema.tensors] if self.model_in_reply(server_round) else []  # type: ignore[union-attr]
        return [None] * (len(modes) - len(model)) + model

    def initialise(self, replies: list[ClientReply]) -> Parameters:
        assert self.k is not None  # _validated rejects every reply while k is unknown
        if self.init == "moments":  # sums only (SecAgg+, DP): K seeded draws from the federated moments
            mean, mean_square = self.privacy.moments(replies)
            self.centres = centres_from_moments(mean, mean_square, self.k, self.cfg.seed)
        else:
            points = [r.arrays[0] for r in replies]
            sizes = [r.arrays[1] for r in replies] if self.init == "centres" else None
            n_points = sum(len(p) for p in points)
            if n_points < self.k:
                self.warn(
                    f"only {n_points} local centres for k={self.k} (the privacy floor of "
                    f"{self.privacy.floor_size} records caps each client's): the other "
                    f"{self.k - n_points} initial centres are seeded draws from their mean and variance"
                )
            weights = sizes if self.params.init_merge == INIT_MERGE_WEIGHTED else None  # kfed: unweighted
            self.centres = initial_centres(points, weights, self.k, self.cfg.seed)
            if sizes is not None and min(len(p) for p in points) >= self.k:  # fewer: shares too coarse
                self.site_skew = float(np.mean(site_skew(points, sizes, self.centres)))
                if self.site_skew > SITE_SKEW_WARNING:
                    self.warn(site_skew_warning(self.site_skew))
        with torch.random.fork_rng(devices=[]):  # Alg. 2 line 1: one initial model for every client
            torch.manual_seed(self.cfg.seed)
            model = fstc_model(self.params, self.k, self.centres.shape[1], self.cfg.embedding_model, "cpu")
        # F starts as C̃'s nearest-centre classifier; not under DP, whose clients build the public
        # initial model from the run seed alone (`clients.fstc.FSTCClient.public_model`)
        if self.params.head_init == HEAD_INIT_CENTRES and not self.privacy.private:
            clip = self.cfg.secagg_clip if self.cfg.secagg else None
            model.head.start_at(self.centres, head_scale(self.params.head_scale, self.centres, clip))
        self.schema = state_schema(model)
        self.initial_model = state_arrays(model)
        source = INIT_SOURCES.get(self.init, "local k-means centres")
        log(INFO, "FSTC: %d initial centres from %d clients' %s", self.k, len(replies), source)
        return ndarrays_to_parameters([self.centres])

    def note_stale_centres(self, server_round: int, updated: np.ndarray) -> None:
        """Count the global centres no client updated this round (Eq. 16 keeps them as they were).

        With many clusters (K >= 100 on a few clients) a cluster can hold fewer records than the privacy
        floor on every client, or none: its centre then stops moving. That is said, not hidden: the last
        training round's count becomes a warning of the run (`warnings` in summary.json)."""
        stale = int((~np.asarray(updated, dtype=bool)).sum())
        if self.train_metrics and self.train_metrics[-1].get("round") == server_round:
            self.train_metrics[-1]["stale-centres"] = float(stale)
        if stale and server_round >= self.total_rounds:
            why = self.privacy.empty_cluster_reason(self.privacy.floor_size)
            self.warn(f"{stale} of {len(updated)} global centres got no update in the last round: {why}")

    # ------------------------------------------------------------------------------- evaluation
    def should_evaluate(self, server_round: int) -> bool:
        """Only the averaged global model is evaluated (local models have no common cluster order)."""
        return self.global_model is not None and super().should_evaluate(server_round)

    def effective_config(self) -> dict[str, Any]:
        return {**super().effective_config(), "fstc.init": self.init}

    def extra_summary(self) -> dict[str, Any]:
        return {
            "fstc": {
                "encoder": self.params.encoder,
                "embedding_model": self.cfg.embedding_model,
                "init": self.init,
                "secagg": self.cfg.secagg,
                "align": self.align,
                "dp_labels": self.params.dp_labels if self.privacy.private else None,
                "site_skew": self.site_skew,
                "loss_on": None if self.k is None else loss_target(self.params.loss_on, self.k),
                "train_per_round": self.train_metrics,
            },
        }

    def start_candidate(self) -> StartCandidate | None:
        """C̃ as training started with the initial model, records to the nearest centre. FSBERT k-FED's
        clustering only from K local centres a client merged unweighted (the default): another merge, k'
        or init (moments and their secure Lloyd steps, the paper's representations) names no method."""
        if self.start_centres is None or self.initial_model is None or self.centre_labels:
            return None
        arrays = [self.start_centres, *self.initial_model]
        return StartCandidate(arrays, {LABELS_BY_KEY: BY_CENTRES}, self.one_shot_method())

    def one_shot_method(self) -> str:
        """The one-shot method whose clustering the start is ('' when none is)."""
        kfed_like = self.init == "centres" and self.params.init_merge == INIT_MERGE_KFED
        return "fsbert-kfed" if kfed_like and self.params.local_centres(self.k or 0) == self.k else ""

    def model_description(self) -> dict[str, Any]:
        """model.json says how the weights are laid out when they are not the trained model alone."""
        if not self.centre_labels:
            return {}
        return {
            "fstc_labels": "nearest global centre (array 0, K x D) of the record's representation under the "
            "initial model (the other arrays), clipped to dp.clip"
        }


class FSTCRSTCStrategy(FSTCStrategy):
    """FSTC-RSTC ablation: no centre aggregation during training, final averaging only."""

    method = "fstc-rstc"
    align = False


class FSTCSTCStrategy(FSTCRSTCStrategy):
    """FSTC-STC ablation: as FSTC-RSTC on the server (the client drops the robust weights)."""

    method = "fstc-stc"
