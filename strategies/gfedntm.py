"""gFedNTM strategy (Calvo-Bartolomé & Arenas-García 2023, Alg. 1): vocabulary consensus, then one
synchronised mini-batch step per round (Eq. 1-3), evaluated with topic metrics instead of cluster labels.

Round 1 merges the clients' document frequencies into the vocabulary V and builds W^(0) (and the server
optimizer). Every later round sends W (parameters and BatchNorm buffers; V once), collects each
client's mini-batch gradient G_l with its batch size n_l, and applies the n-weighted mean (Eq. 2) with
server-side Adam (ProdLDA's default) or the plain step of Eq. 3. BatchNorm running statistics are the
n-weighted mean of the clients' (`num_batches_tracked` stays an integer). `exchange = parameters` is the
authors' later per-batch parameter averaging: clients step locally and send weights.

Failure policy (also the dropout-rate policy): a step is taken with the clients that answered, weights
renormalised over them: exactly the centralized step on the union of their batches. A client that sat
out a step skips that batch for the epoch (batches are a function of the global step, see
`fedapp.ntm.EpochSplit`), so every client stays on the same epoch boundaries. A round without any valid
reply takes no step and is retried with the same batches. The vocabulary round is never thinned by
`dropout-rate`: the consensus needs every client's terms.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
)
from flwr.server.client_proxy import ClientProxy

from fedapp.bow import BowError, DocumentFrequencies, merge_document_frequencies, select_vocabulary
from fedapp.config import RunConfig
from fedapp.datasets.synthetic import VARIANTS as SYNTHETIC_DATASETS
from fedapp.datasets.synthetic import synthetic_truth
from fedapp.methods.gfedntm import (
    COOCCURRENCE_KEY,
    DIVERSITY_TOP_WORDS,
    NPMI_TOP_WORDS,
    PHASE_COOCCURRENCE,
    PHASE_TRAIN,
    PHASE_VOCABULARY,
    GFedNTMConfig,
)
from fedapp.ntm import (
    Corpus,
    EpochSplit,
    TopicModelError,
    bow_projection,
    build_model,
    infer_theta,
    make_optimizer,
    steps_per_epoch,
    top_words,
)
from fedapp.protocol import ArraySpec, ReplyError, decode_array
from fedapp.topic_metrics import (
    document_similarity_score,
    npmi_from_cooccurrence,
    reference_double_softmax,
    to_full_vocabulary,
    topic_diversity,
    topic_similarity_score,
)
from fedapp.torch_glue import (
    load_gradients,
    load_state_arrays,
    resolve_device,
    state_arrays,
    state_schema,
    weighted_average,
)
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply, keep_modal
from strategies.roster import FederationError


def weighted_gradient(gradients: list[list[np.ndarray]], batch_sizes: list[int]) -> list[np.ndarray]:
    """Eq. 2: G = sum_l n_l G_l / sum_l n_l, tensor by tensor."""
    return weighted_average(gradients, batch_sizes)


def server_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, gradient: list[np.ndarray]) -> None:
    """Eq. 3 (W <- W - lr G with SGD) or Adam's update, applied to the global model with gradient G."""
    load_gradients(model, gradient)
    optimizer.step()


def synthetic_scores(
    model: torch.nn.Module,
    vocabulary: Sequence[str],
    dataset: str,
    seed: int,
    theta_samples: int,
    context_dim: int,
) -> dict[str, float]:
    """TSS (Eq. 6) and DSS (Eq. 5) against the generator's truth (the benchmark's evaluation harness:
    held-out documents and true topics come from the generator, not from any client)."""
    truth = synthetic_truth(dataset, seed)
    index = {term: j for j, term in enumerate(truth.vocabulary)}
    columns = np.array([index[term] for term in vocabulary])
    size = len(truth.vocabulary)
    topic_word = model.topic_word().cpu().numpy().astype(np.float64)
    beta = model.beta.detach().cpu().numpy().astype(np.float64)
    heldout = truth.heldout_counts
    contexts = bow_projection(heldout, seed) if context_dim else None
    theta = infer_theta(model, Corpus(heldout[:, columns], contexts), n_samples=theta_samples, seed=seed)
    return {
        "tss": topic_similarity_score(to_full_vocabulary(topic_word, columns, size), truth.topics),
        "dss": document_similarity_score(truth.heldout_theta, theta),
        "tss_double_softmax": topic_similarity_score(
            to_full_vocabulary(reference_double_softmax(beta), columns, size), truth.topics
        ),
    }


def summed_cooccurrences(
    server_round: int, results: list[tuple[ClientProxy, EvaluateRes]], shape: tuple[int, int, int]
) -> tuple[np.ndarray | None, int]:
    """(sum of the clients' top-word co-occurrence counts, their documents); invalid counts are logged
    and left out, None when none is valid."""
    total, documents = None, 0
    for client, res in results:
        try:
            counts = decode_array(res.metrics.get(COOCCURRENCE_KEY))  # type: ignore[arg-type]
        except ValueError as exc:
            log(
                WARNING,
                "round %d: rejected co-occurrence counts of client %s: %s",
                server_round,
                client.cid,
                exc,
            )
            continue
        if (
            counts.shape != shape
            or counts.dtype.kind not in "iu"
            or (counts < 0).any()
            or counts.max(initial=0) > res.num_examples
        ):
            log(
                WARNING,
                "round %d: rejected co-occurrence counts of client %s (shape %s)",
                server_round,
                client.cid,
                counts.shape,
            )
            continue
        total = counts if total is None else total + counts
        documents += res.num_examples
    return total, documents


class GFedNTMStrategy(ClusteringStrategy):
    """See the module docstring; hooks read top to bottom: configure -> validate -> aggregate -> evaluate."""

    method = "gfedntm"
    state_fields = (
        "vocabulary",
        "context_dim",
        "client_documents",
        "steps_per_epoch",
        "total_steps",
        "step",
        "has_vocabulary",
        "last_loss",
        "step_seconds",
    )  # W and the server optimizer: `state_dict`

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(GFedNTMConfig)
        self.k = self.params.topics
        self.device = resolve_device(cfg.device)
        self.synthetic = cfg.dataset in SYNTHETIC_DATASETS
        self.headline_metrics = ("tss", "dss") if self.synthetic else ("npmi", "td")
        self.vocabulary: tuple[str, ...] | None = None
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.context_dim = 0
        self.client_documents: dict[int, int] = {}  # partition id -> documents (from the consensus)
        self.steps_per_epoch = 0
        self.total_steps = 0
        self.step = 0  # global steps taken
        self.has_vocabulary: set[str] = set()  # cids whose reply showed they stored V
        self.last_loss = float("nan")
        self.step_seconds: list[float] = []  # wall seconds of each training round (fit -> aggregate)
        self._pending: dict[str, float] = {}  # server-side metrics waiting for the clients' NPMI counts

    @property
    def training(self) -> bool:
        return self.model is not None

    def new_global_model(self) -> None:
        """W^(0) from the run seed for the merged vocabulary, and the server optimizer."""
        assert self.vocabulary is not None
        params = self.params
        self.model = build_model(params, len(self.vocabulary), self.context_dim, self.cfg.seed, self.device)
        self.optimizer = make_optimizer(
            list(self.model.parameters()), params.optimizer, params.lr, params.betas
        )

    def state_dict(self) -> dict[str, Any]:
        """The base state plus W and the server optimizer's moments (their torch `state_dict`s)."""
        state = super().state_dict()
        if self.model is not None and self.optimizer is not None:
            state.update(model=self.model.state_dict(), optimizer=self.optimizer.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "model" in state:
            self.new_global_model()
            assert self.model is not None and self.optimizer is not None
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])

    # -------------------------------------------------------------------------------- configure
    def needs_every_client(self, server_round: int) -> bool:
        return not self.training  # the consensus needs every client's terms

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        config = super().fit_config(server_round)
        if not self.training:
            return {**config, "phase": PHASE_VOCABULARY}
        return {
            **config,
            "phase": PHASE_TRAIN,
            "step": self.step,
            "steps-per-epoch": self.steps_per_epoch,
            "local-steps": self.params.local_steps,
        }

    def fit_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, FitIns]]:
        config = self.fit_config(server_round)
        if not self.training:
            return [(client, FitIns(ndarrays_to_parameters([]), config)) for client in clients]
        assert self.model is not None and self.vocabulary is not None
        state = state_arrays(self.model)
        plain = FitIns(ndarrays_to_parameters(state), config)
        first = FitIns(
            ndarrays_to_parameters([np.array(self.vocabulary, dtype=np.str_), *state]),
            {**config, "with-vocabulary": True},
        )
        return [(client, plain if client.cid in self.has_vocabulary else first) for client in clients]

    # -------------------------------------------------------------------------------- validate
    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if not self.training:
            return [ArraySpec("terms", (None,), "U"), ArraySpec("document-frequencies", (None,), "i")]
        assert self.model is not None
        update = state_schema(self.model, "trainable").array_specs()
        return [*update, *state_schema(self.model, "buffers").array_specs()]

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        if self.training:
            return replies
        dim = "context-dim"
        return keep_modal(replies, server_round, lambda reply: int(reply.metrics[dim]), dim)

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        if not self.training:
            try:
                DocumentFrequencies.from_arrays(*reply.arrays, reply.num_examples)
            except BowError as exc:
                raise ReplyError(f"vocabulary statistics: {exc}") from None
            if not isinstance(reply.metrics.get("context-dim"), int) or reply.metrics["context-dim"] < 0:
                raise ReplyError("metrics lack a non-negative integer 'context-dim'")
            return
        assert self.model is not None
        state_schema(self.model).check_fingerprint(reply.metrics, sender=f"client {reply.cid}")
        if reply.metrics.get("step") != self.step:
            raise ReplyError(
                f"reply for step {reply.metrics.get('step')!r}, the federation is at step {self.step}"
            )
        expected = self.expected_documents(reply.partition_id)
        if expected is not None and reply.num_examples != expected:
            raise ReplyError(f"used {reply.num_examples} documents, its batches at this step hold {expected}")

    def expected_documents(self, partition_id: int) -> int | None:
        """Documents client `partition_id` must have used this round (None: not in the consensus)."""
        n = self.client_documents.get(partition_id)
        if n is None:
            return None
        split = EpochSplit(n, self.steps_per_epoch, 0)  # batch sizes do not depend on the seed
        return sum(split.batch_size(step) for step in range(self.step, self.step + self.params.local_steps))

    # ------------------------------------------------------------------------------- aggregate
    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        if not self.training:
            return self.vocabulary_consensus(replies)
        return self.training_step(server_round, replies)

    def vocabulary_consensus(self, replies: list[ClientReply]) -> Parameters:
        """Alg. 1 lines 2-6: V = merge(V_l) with optional min-df / max-df / max-features; W^(0)."""
        merged = merge_document_frequencies(
            DocumentFrequencies.from_arrays(*reply.arrays, reply.num_examples) for reply in replies
        )
        params = self.params
        self.vocabulary = select_vocabulary(
            merged, min_df=params.min_df, max_df=params.max_df, max_features=params.max_features or None
        )
        self.client_documents = {reply.partition_id: reply.num_examples for reply in replies}
        self.steps_per_epoch = steps_per_epoch(list(self.client_documents.values()), params.batch_size)
        try:
            for n in self.client_documents.values():
                EpochSplit(n, self.steps_per_epoch, 0)
        except TopicModelError as exc:
            raise FederationError(f"batch-size {params.batch_size}: {exc}") from None
        self.context_dim = int(replies[0].metrics["context-dim"])
        self.new_global_model()
        wanted = params.epochs * self.steps_per_epoch
        if params.max_steps:
            wanted = min(wanted, params.max_steps)
        rounds_left = (self.cfg.num_rounds - 1) * params.local_steps
        self.total_steps = min(wanted, rounds_left)
        log(
            INFO,
            "gFedNTM: vocabulary of %d terms from %d clients (%d documents); %d steps per epoch; "
            "training %d steps (%s)",
            len(self.vocabulary),
            len(replies),
            merged.n_documents,
            self.steps_per_epoch,
            self.total_steps,
            "as configured"
            if self.total_steps == wanted
            else f"capped by num-rounds={self.cfg.num_rounds}; {wanted} wanted: set num-rounds >= "
            f"{1 + -(-wanted // params.local_steps)}",
        )
        if self.total_steps == 0:
            self.finished, self.stop_reason = True, "no training round left (num-rounds = 1)"
        return ndarrays_to_parameters(state_arrays(self.model))

    def training_step(self, server_round: int, replies: list[ClientReply]) -> Parameters:
        """Eq. 2 and Eq. 3 (or Adam) on the replies that passed validation; buffers averaged alike."""
        assert self.model is not None and self.optimizer is not None
        n_update = len(state_schema(self.model, "trainable"))
        weights = [reply.num_examples for reply in replies]
        updates = [reply.arrays[:n_update] for reply in replies]
        buffers = [reply.arrays[n_update:] for reply in replies]
        if self.params.exchange == "gradient":
            server_step(self.model, self.optimizer, weighted_gradient(updates, weights))
        else:
            load_state_arrays(self.model, weighted_average(updates, weights), part="trainable")
        load_state_arrays(self.model, weighted_average(buffers, weights), part="buffers")
        self.has_vocabulary.update(reply.cid for reply in replies)
        self.last_loss = float(
            np.average([float(reply.metrics.get("loss", np.nan)) for reply in replies], weights=weights)
        )
        self.step += self.params.local_steps
        if server_round in self.record.round_started:
            self.step_seconds.append(time.perf_counter() - self.record.round_started[server_round])
        if self.step >= self.total_steps:
            self.finished = True
            self.stop_reason = f"{self.step} steps ({self.step / self.steps_per_epoch:g} epochs)"
        return ndarrays_to_parameters(state_arrays(self.model))

    # -------------------------------------------------------------------------------- evaluate
    def should_evaluate(self, server_round: int) -> bool:
        return self.training and super().should_evaluate(server_round)

    def evaluation_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Every client counts the co-occurrences of the top words (NPMI); TD, TSS, DSS come from W."""
        self._pending = self.server_metrics()
        top = top_words(self.topic_word(), NPMI_TOP_WORDS)
        ins = EvaluateIns(
            ndarrays_to_parameters([top]), {"server-round": server_round, "phase": PHASE_COOCCURRENCE}
        )
        return [(client, ins) for client in clients]

    def evaluation_metrics(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The server's metrics plus NPMI from the summed co-occurrence counts of the clients."""
        shape = (self.params.topics, NPMI_TOP_WORDS, NPMI_TOP_WORDS)
        total, documents = summed_cooccurrences(server_round, results, shape)
        metrics = dict(self._pending)
        if total is not None:
            metrics["npmi"] = float(npmi_from_cooccurrence(total, documents).mean())
        else:
            log(WARNING, "round %d: no co-occurrence counts; NPMI not computed", server_round)
        epoch = self.step / max(self.steps_per_epoch, 1)
        return metrics, {"step": self.step, "epoch": epoch, "train_loss": self.last_loss}

    def headline_text(self, metrics: dict[str, float]) -> str:
        shown = " ".join(f"{key} {metrics[key]:.4g}" for key in self.headline_metrics if key in metrics)
        return f"step {self.step}/{self.total_steps} {shown}"

    def topic_word(self) -> np.ndarray:
        assert self.model is not None
        return self.model.topic_word().cpu().numpy().astype(np.float64)

    def server_metrics(self) -> dict[str, float]:
        """What the server computes from W alone: topic diversity; on synthetic corpora TSS and DSS."""
        metrics = {"td": topic_diversity(top_words(self.topic_word(), DIVERSITY_TOP_WORDS))}
        if self.synthetic:
            assert self.model is not None and self.vocabulary is not None
            cfg, theta_samples = self.cfg, self.params.theta_samples
            scores = synthetic_scores(
                self.model, self.vocabulary, cfg.dataset, cfg.seed, theta_samples, self.context_dim
            )
            metrics.update(scores)
        return metrics

    def report_parameters(self) -> Parameters | None:
        """Vocabulary, then the model state: what a client (or `predict`) needs to infer topics."""
        if not self.training or self.vocabulary is None:
            return None
        assert self.model is not None
        return ndarrays_to_parameters([np.array(self.vocabulary, dtype=np.str_), *state_arrays(self.model)])

    def model_description(self) -> dict[str, Any]:
        if not self.training:
            return {}
        top = top_words(self.topic_word(), DIVERSITY_TOP_WORDS)
        return {
            "topic_words": [[self.vocabulary[j] for j in row[:NPMI_TOP_WORDS]] for row in top],  # type: ignore[index]
            "vocabulary_size": len(self.vocabulary or ()),
        }

    def extra_summary(self) -> dict[str, Any]:
        seconds = self.step_seconds
        summary: dict[str, Any] = {
            "steps": self.step,
            "steps_per_epoch": self.steps_per_epoch,
            "vocabulary_size": len(self.vocabulary or ()),
            "seconds_per_step_round": float(np.median(seconds)) if seconds else None,
        }
        if self.training:
            top = top_words(self.topic_word(), DIVERSITY_TOP_WORDS)
            summary["top_words"] = [[self.vocabulary[j] for j in row[:NPMI_TOP_WORDS]] for row in top]
            summary["top_word_indices"] = top.tolist()
            summary["vocabulary"] = list(self.vocabulary or ())
        return summary
