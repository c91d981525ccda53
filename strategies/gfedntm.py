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
`fedapp.maths.gfedntm.EpochSplit`), so every client stays on the same epoch boundaries. A round without any
valid
reply takes no step and is retried with the same batches. The vocabulary round is never thinned by
`dropout-rate`: the consensus needs every client's terms.

Under SecAgg+ (run-config `secagg`): round 1 collects the term lists in the clear (`terms`, a plain
round inside the secure run: `secure_round`), round 2 their document frequencies over the union as a
secure sum (rounded to integers: the same V as the plain merge), and every training reply is a secure
n-weighted average, which is Eq. 2 itself. The training budget counts the rounds after the consensus.

Under differential privacy (`fedapp.privacy.dp`, clients/gfedntm.py) every training reply is a clipped, noised
update; the server applies it as it is, keeps averaged BatchNorm variances positive, and summary.json's
`privacy` block accounts the releases and names the vocabulary round as not covered.
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

from fedapp.config.run import RunConfig
from fedapp.datasets.synthetic import VARIANTS as SYNTHETIC_DATASETS
from fedapp.datasets.synthetic import synthetic_truth
from fedapp.features.bow import BowError, DocumentFrequencies, merge_document_frequencies, select_vocabulary
from fedapp.maths.gfedntm import (
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
from fedapp.methods.gfedntm import (
    COOCCURRENCE_KEY,
    DIVERSITY_TOP_WORDS,
    NPMI_TOP_WORDS,
    PHASE_COOCCURRENCE,
    PHASE_TERMS,
    PHASE_TRAIN,
    PHASE_VOCABULARY,
    SECAGG_KEY,
    GFedNTMConfig,
)
from fedapp.metrics.topics import (
    document_similarity_score,
    npmi_from_cooccurrence,
    reference_double_softmax,
    to_full_vocabulary,
    topic_diversity,
    topic_similarity_score,
)
from fedapp.neural.glue import (
    load_gradients,
    load_state_arrays,
    resolve_device,
    state_arrays,
    state_schema,
    weighted_average,
)
from fedapp.privacy.secagg import SUM, model_modes
from fedapp.wire import ArraySpec, ReplyError, decode_array
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


def apply_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    exchange: str,
    replies: list[list[np.ndarray]],
    weights: list[int],
) -> None:
    """One global step from the clients' replies (update, then BatchNorm buffers), weighted by batch size:
    Eq. 2 + Eq. 3 (or Adam) on the gradients, or the average of locally stepped parameters; the
    buffers averaged alike."""
    n_update = len(state_schema(model, "trainable"))
    updates = [reply[:n_update] for reply in replies]
    if exchange == "gradient":
        server_step(model, optimizer, weighted_gradient(updates, weights))
    else:
        load_state_arrays(model, weighted_average(updates, weights), part="trainable")
    load_state_arrays(
        model, weighted_average([reply[n_update:] for reply in replies], weights), part="buffers"
    )


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
    topic_word = topic_word_matrix(model)
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


def frequencies_from_totals(
    candidates: Sequence[str], totals: np.ndarray, n_documents: int
) -> DocumentFrequencies:
    """The union's document frequencies from SecAgg+'s total, rounded (its error is far below 0.5)."""
    counts = np.rint(totals).astype(np.int64)
    return DocumentFrequencies(
        {term: int(c) for term, c in zip(candidates, counts, strict=True) if c > 0}, n_documents
    )


def batch_documents(documents: int, steps_per_epoch: int, step: int, local_steps: int) -> int:
    """Documents a client of `documents` uses in global steps step .. step + local_steps - 1 (batch sizes
    do not depend on the seed)."""
    split = EpochSplit(documents, steps_per_epoch, 0)
    return sum(split.batch_size(s) for s in range(step, step + local_steps))


def check_vocabulary_reply(reply: ClientReply, phase: str, shares: bool, tolerance: float) -> None:
    """A vocabulary-consensus reply: a term list without duplicate or empty terms (`terms`), SecAgg+'s
    mean of document frequency / n over the union (`shares`: in [0, 1] up to `tolerance`), or a term list
    with document frequencies and the client's context dimension; ReplyError otherwise."""
    if phase == PHASE_TERMS:
        terms = reply.arrays[0]
        if len(np.unique(terms)) != len(terms) or (terms == "").any():
            raise ReplyError("the term list has duplicate or empty terms")
    elif shares:
        values = reply.arrays[0]
        if (values < -tolerance).any() or (values > 1.0 + tolerance).any():
            raise ReplyError("secure document-frequency shares outside [0, 1]")
    else:
        try:
            DocumentFrequencies.from_arrays(*reply.arrays, reply.num_examples)
        except BowError as exc:
            raise ReplyError(f"vocabulary statistics: {exc}") from None
        if not isinstance(reply.metrics.get("context-dim"), int) or reply.metrics["context-dim"] < 0:
            raise ReplyError("metrics lack a non-negative integer 'context-dim'")


def federated_epoch(documents: list[int], batch_size: int) -> int:
    """Steps per epoch shared by every client (`steps_per_epoch`); FederationError when some client's
    documents cannot be split into that many batches."""
    steps = steps_per_epoch(documents, batch_size)
    try:
        for n in documents:
            EpochSplit(n, steps, 0)
    except TopicModelError as exc:
        raise FederationError(f"batch-size {batch_size}: {exc}") from None
    return steps


def training_budget(
    params: GFedNTMConfig, steps_per_epoch: int, server_round: int, num_rounds: int
) -> tuple[int, str]:
    """(steps to train: `epochs` epochs, at most `max-steps`, as many as the rounds after `server_round`
    allow; what capped them, for the log)."""
    wanted = params.epochs * steps_per_epoch
    if params.max_steps:
        wanted = min(wanted, params.max_steps)
    steps = min(wanted, (num_rounds - server_round) * params.local_steps)
    if steps == wanted:
        return steps, "as configured"
    needed = server_round + -(-wanted // params.local_steps)
    return steps, f"capped by num-rounds={num_rounds}; {wanted} wanted: set num-rounds >= {needed}"


def topic_summary(model: torch.nn.Module, vocabulary: Sequence[str]) -> dict[str, Any]:
    """summary.json's topics: each topic's top words (terms and indices) and the vocabulary."""
    top, terms = topic_words(model, vocabulary)
    return {"top_words": terms, "top_word_indices": top.tolist(), "vocabulary": list(vocabulary)}


def topic_word_matrix(model: torch.nn.Module) -> np.ndarray:
    """The model's K x V topic-word distributions, float64 on the CPU."""
    return model.topic_word().cpu().numpy().astype(np.float64)


def topic_words(model: torch.nn.Module, vocabulary: Sequence[str]) -> tuple[np.ndarray, list[list[str]]]:
    """(indices of each topic's top words by weight, the first NPMI_TOP_WORDS of them as terms)."""
    top = top_words(topic_word_matrix(model), DIVERSITY_TOP_WORDS)
    return top, [[vocabulary[j] for j in row[:NPMI_TOP_WORDS]] for row in top]


def npmi_metrics(
    server_round: int, results: list[tuple[ClientProxy, EvaluateRes]], topics: int
) -> dict[str, float]:
    """NPMI of the top words from the clients' summed co-occurrence counts ({} when none is valid)."""
    total, documents = summed_cooccurrences(server_round, results, (topics, NPMI_TOP_WORDS, NPMI_TOP_WORDS))
    if total is None:
        log(WARNING, "round %d: no co-occurrence counts; NPMI not computed", server_round)
        return {}
    return {"npmi": float(npmi_from_cooccurrence(total, documents).mean())}


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


def server_metrics(
    model: torch.nn.Module, vocabulary: tuple[str, ...], truth: tuple[str, int, int, int] | None
) -> dict[str, float]:
    """What the server computes from W alone: topic diversity; on a synthetic corpus (`truth`: its
    dataset, seed, theta samples and context dimension) TSS and DSS too."""
    metrics = {"td": topic_diversity(topic_words(model, vocabulary)[0])}
    if truth is not None:
        metrics.update(synthetic_scores(model, vocabulary, *truth))
    return metrics


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
        "candidates",
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
        self.candidates: tuple[str, ...] | None = None  # SecAgg+: the union of the clients' term lists

    @property
    def training(self) -> bool:
        return self.model is not None

    def new_global_model(self) -> None:
        """W^(0) from the run seed for the merged vocabulary, and the server optimizer."""
        assert self.vocabulary is not None
        p = self.params
        self.model = build_model(p, len(self.vocabulary), self.context_dim, self.cfg.seed, self.device)
        self.optimizer = make_optimizer(list(self.model.parameters()), p.optimizer, p.lr, p.betas)

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

    def secure_round(self, server_round: int) -> bool:
        """Whether this round's replies go through SecAgg+: all but the term lists (not a sum)."""
        return self.vocabulary_phase() != PHASE_TERMS

    def vocabulary_phase(self) -> str | None:
        """`terms` / `vocabulary` until the consensus, None once training."""
        if self.training:
            return None
        # under SecAgg+ the vocabulary takes two rounds: the term lists (not a sum), then the frequencies
        # over their union (a secure sum)
        return PHASE_TERMS if self.privacy.secure and self.candidates is None else PHASE_VOCABULARY

    def sends_releases(self, server_round: int) -> bool:
        return self.training  # the vocabulary round is not covered by DP (summary.json says so)

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        config = {**super().fit_config(server_round), SECAGG_KEY: self.cfg.secagg}
        if not self.training:
            return {**config, "phase": self.vocabulary_phase()}  # type: ignore[dict-item]
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
            union = [np.array(self.candidates, dtype=np.str_)] if self.candidates is not None else []
            return [(client, FitIns(ndarrays_to_parameters(union), config)) for client in clients]
        assert self.model is not None and self.vocabulary is not None
        state, vocabulary = state_arrays(self.model), np.array(self.vocabulary, dtype=np.str_)
        plain = FitIns(ndarrays_to_parameters(state), config)
        first = FitIns(ndarrays_to_parameters([vocabulary, *state]), {**config, "with-vocabulary": True})
        return [(client, plain if client.cid in self.has_vocabulary else first) for client in clients]

    # -------------------------------------------------------------------------------- validate
    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        phase = self.vocabulary_phase()
        if phase == PHASE_TERMS:
            return [ArraySpec("terms", (None,), "U")]
        if phase == PHASE_VOCABULARY and self.candidates is not None:  # frequencies over the union
            shares = [ArraySpec("document-frequency shares", (len(self.candidates),))]
            return self.privacy.expected(shares, [SUM])
        if phase == PHASE_VOCABULARY:
            return [ArraySpec("terms", (None,), "U"), ArraySpec("document-frequencies", (None,), "i")]
        return self.privacy.expected(self.state_specs(), self.reply_modes())

    def state_specs(self) -> list[ArraySpec]:
        """A training reply: the update (gradient or parameters), then the BatchNorm buffers."""
        assert self.model is not None
        update = state_schema(self.model, "trainable").array_specs()
        return [*update, *state_schema(self.model, "buffers").array_specs()]

    def reply_modes(self) -> list[str]:
        """`fedapp.privacy.secagg` modes of a training reply: floats averaged, integer buffers in the
        clear."""
        return model_modes([spec.dtype or "float64" for spec in self.state_specs()])

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        if self.training:
            return replies
        dim = "context-dim"
        return keep_modal(replies, server_round, lambda reply: int(reply.metrics[dim]), dim)

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        if not self.training:
            phase = self.vocabulary_phase()
            shares = phase == PHASE_VOCABULARY and self.candidates is not None
            check_vocabulary_reply(reply, phase, shares, self.privacy.tolerance())  # type: ignore[arg-type]
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
        n, steps = (
            self.client_documents.get(partition_id),
            (self.steps_per_epoch, self.step, self.params.local_steps),
        )
        return None if n is None else batch_documents(n, *steps)

    # ------------------------------------------------------------------------------- aggregate
    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        phase = self.vocabulary_phase()
        if phase == PHASE_TERMS:
            self.candidates = tuple(sorted({str(term) for reply in replies for term in reply.arrays[0]}))
            log(INFO, "gFedNTM: %d candidate terms from %d clients", len(self.candidates), len(replies))
            return ndarrays_to_parameters([])
        if phase == PHASE_VOCABULARY and self.candidates is not None:
            shares = self.privacy.intake(server_round, replies, [SUM])
            totals = self.privacy.totals([reply.arrays[0] for reply in shares])
            documents = sum(reply.num_examples for reply in replies)
            merged = frequencies_from_totals(self.candidates, totals, documents)
            return self.vocabulary_consensus(server_round, replies, merged)
        if phase == PHASE_VOCABULARY:
            merged = merge_document_frequencies(
                DocumentFrequencies.from_arrays(*reply.arrays, reply.num_examples) for reply in replies
            )
            return self.vocabulary_consensus(server_round, replies, merged)
        dtypes = [spec.dtype for spec in self.state_specs()]
        replies = self.privacy.intake(server_round, replies, self.reply_modes(), dtypes)
        return self.training_step(server_round, replies)

    def vocabulary_consensus(
        self, server_round: int, replies: list[ClientReply], merged: DocumentFrequencies
    ) -> Parameters:
        """Alg. 1 lines 2-6: V = merge(V_l) with optional min-df / max-df / max-features; W^(0)."""
        params = self.params
        self.vocabulary = select_vocabulary(
            merged, min_df=params.min_df, max_df=params.max_df, max_features=params.max_features or None
        )
        self.client_documents = {reply.partition_id: reply.num_examples for reply in replies}
        self.steps_per_epoch = federated_epoch(list(self.client_documents.values()), params.batch_size)
        self.context_dim = int(replies[0].metrics["context-dim"])
        self.new_global_model()
        self.total_steps, budget = training_budget(
            params, self.steps_per_epoch, server_round, self.cfg.num_rounds
        )
        log(
            INFO,
            "gFedNTM: vocabulary of %d terms from %d clients (%d documents); %d steps per epoch; "
            "training %d steps (%s)",
            len(self.vocabulary),
            len(replies),
            merged.n_documents,
            self.steps_per_epoch,
            self.total_steps,
            budget,
        )
        if self.total_steps == 0:
            self.finished, self.stop_reason = True, f"no training round left (num-rounds = {server_round})"
        return ndarrays_to_parameters(state_arrays(self.model))

    def training_step(self, server_round: int, replies: list[ClientReply]) -> Parameters:
        """Eq. 2 and Eq. 3 (or Adam) on the replies that passed validation; buffers averaged alike."""
        assert self.model is not None and self.optimizer is not None
        weights = [reply.num_examples for reply in replies]
        apply_step(self.model, self.optimizer, self.params.exchange, [r.arrays for r in replies], weights)
        buffer_names = state_schema(self.model, "buffers").names
        averaged = self.privacy.positive_variances(buffer_names, state_arrays(self.model, "buffers"))
        load_state_arrays(self.model, averaged, part="buffers")
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

    def evaluation_clients(self, clients: list[ClientProxy]) -> list[ClientProxy]:
        """The clients that hold the vocabulary (it comes with their first training step): right after the
        consensus round nobody can count words yet, which is nothing to evaluate, not a failure."""
        return [client for client in clients if client.cid in self.has_vocabulary]

    def evaluation_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Every client counts the co-occurrences of the top words (NPMI); TD, TSS, DSS come from W."""
        assert self.model is not None and self.vocabulary is not None
        truth = (self.cfg.dataset, self.cfg.seed, self.params.theta_samples, self.context_dim)
        self._pending = server_metrics(self.model, self.vocabulary, truth if self.synthetic else None)
        top = top_words(topic_word_matrix(self.model), NPMI_TOP_WORDS)
        ins = EvaluateIns(
            ndarrays_to_parameters([top]), {"server-round": server_round, "phase": PHASE_COOCCURRENCE}
        )
        return [(client, ins) for client in self.evaluation_clients(clients)]

    def evaluation_metrics(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The server's metrics plus NPMI from the summed co-occurrence counts of the clients."""
        metrics = {**self._pending, **npmi_metrics(server_round, results, self.params.topics)}
        epoch = self.step / max(self.steps_per_epoch, 1)
        return metrics, {"step": self.step, "epoch": epoch, "train_loss": self.last_loss}

    def headline_text(self, metrics: dict[str, float]) -> str:
        shown = " ".join(f"{key} {metrics[key]:.4g}" for key in self.headline_metrics if key in metrics)
        return f"step {self.step}/{self.total_steps} {shown}"

    def report_parameters(self) -> Parameters | None:
        """Vocabulary, then the model state: what a client (or `predict`) needs to infer topics."""
        if not self.training or self.vocabulary is None:
            return None
        assert self.model is not None
        return ndarrays_to_parameters([np.array(self.vocabulary, dtype=np.str_), *state_arrays(self.model)])

    def model_description(self) -> dict[str, Any]:
        if not self.training:
            return {}
        assert self.model is not None and self.vocabulary is not None
        return {
            "topic_words": topic_words(self.model, self.vocabulary)[1],
            "vocabulary_size": len(self.vocabulary),
        }

    def extra_summary(self) -> dict[str, Any]:
        seconds = self.step_seconds
        return {
            "steps": self.step,
            "steps_per_epoch": self.steps_per_epoch,
            "vocabulary_size": len(self.vocabulary or ()),
            "seconds_per_step_round": float(np.median(seconds)) if seconds else None,
            **(
                topic_summary(self.model, self.vocabulary)
                if self.model is not None and self.vocabulary
                else {}
            ),
        }
