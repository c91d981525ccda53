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
from fedapp.privacy.dp import RELEASES_KEY, floor_variances, privacy_summary
from fedapp.privacy.secagg import SUM, model_modes, secure_specs
from fedapp.wire import ArraySpec, ReplyError, decode_array
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply, keep_modal
from strategies.roster import FederationError
from strategies.secure import SecureSumStrategy


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


class GFedNTMStrategy(SecureSumStrategy, ClusteringStrategy):
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
        "dp_releases",
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
        self.dp_releases = 0  # the most noisy releases any client reported (summary.json `privacy`)

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

    def secure_round(self, server_round: int) -> bool:
        """Whether this round's replies go through SecAgg+: all but the term lists (not a sum)."""
        return self.vocabulary_phase() != PHASE_TERMS

    def vocabulary_phase(self) -> str | None:
        """`terms` / `vocabulary` until the consensus, None once training."""
        if self.training:
            return None
        return PHASE_TERMS if self.cfg.secagg and self.candidates is None else PHASE_VOCABULARY

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
        state = state_arrays(self.model)
        plain = FitIns(ndarrays_to_parameters(state), config)
        first = FitIns(
            ndarrays_to_parameters([np.array(self.vocabulary, dtype=np.str_), *state]),
            {**config, "with-vocabulary": True},
        )
        return [(client, plain if client.cid in self.has_vocabulary else first) for client in clients]

    # -------------------------------------------------------------------------------- validate
    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        phase = self.vocabulary_phase()
        if phase == PHASE_TERMS:
            return [ArraySpec("terms", (None,), "U")]
        if phase == PHASE_VOCABULARY and self.cfg.secagg:
            return [ArraySpec("document-frequency shares", (len(self.candidates or ()),))]
        if phase == PHASE_VOCABULARY:
            return [ArraySpec("terms", (None,), "U"), ArraySpec("document-frequencies", (None,), "i")]
        specs = self.state_specs()
        return secure_specs(specs, self.secure_modes()) if self.cfg.secagg else specs

    def state_specs(self) -> list[ArraySpec]:
        """A training reply: the update (gradient or parameters), then the BatchNorm buffers."""
        assert self.model is not None
        update = state_schema(self.model, "trainable").array_specs()
        return [*update, *state_schema(self.model, "buffers").array_specs()]

    def secure_modes(self) -> list[str]:
        """`fedapp.privacy.secagg` modes of a training reply: floats averaged, integer buffers in the
        clear."""
        return model_modes([spec.dtype or "float64" for spec in self.state_specs()])

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        if self.training:
            return replies
        dim = "context-dim"
        return keep_modal(replies, server_round, lambda reply: int(reply.metrics[dim]), dim)

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        phase = self.vocabulary_phase()
        if phase == PHASE_TERMS:
            terms = reply.arrays[0]
            if len(np.unique(terms)) != len(terms) or (terms == "").any():
                raise ReplyError("the term list has duplicate or empty terms")
            return
        if phase == PHASE_VOCABULARY and self.cfg.secagg:  # the secure mean of df / n: shares in [0, 1]
            shares, noise = reply.arrays[0], self.secure_tolerance()
            if (shares < -noise).any() or (shares > 1.0 + noise).any():
                raise ReplyError("secure document-frequency shares outside [0, 1]")
            return
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
        if self.cfg.dp.enabled and not isinstance(reply.metrics.get(RELEASES_KEY), int):
            raise ReplyError(f"a DP reply without an integer '{RELEASES_KEY}'")
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
        phase = self.vocabulary_phase()
        if phase == PHASE_TERMS:
            self.candidates = tuple(sorted({str(term) for reply in replies for term in reply.arrays[0]}))
            log(INFO, "gFedNTM: %d candidate terms from %d clients", len(self.candidates), len(replies))
            return ndarrays_to_parameters([])
        if phase == PHASE_VOCABULARY and self.cfg.secagg:
            return self.vocabulary_consensus(
                server_round, replies, self.secure_frequencies(server_round, replies)
            )
        if phase == PHASE_VOCABULARY:
            merged = merge_document_frequencies(
                DocumentFrequencies.from_arrays(*reply.arrays, reply.num_examples) for reply in replies
            )
            return self.vocabulary_consensus(server_round, replies, merged)
        if self.cfg.secagg:
            dtypes = [spec.dtype for spec in self.state_specs()]
            replies = self.plain_equivalent(server_round, replies, self.secure_modes(), dtypes)
        return self.training_step(server_round, replies)

    def secure_frequencies(self, server_round: int, replies: list[ClientReply]) -> DocumentFrequencies:
        """The union's document frequencies from SecAgg+'s total, rounded (its error is far below 0.5)."""
        assert self.candidates is not None
        shares = self.plain_equivalent(server_round, replies, [SUM], [None])
        totals = np.rint(np.sum([reply.arrays[0] for reply in shares], axis=0)).astype(np.int64)
        n_documents = sum(reply.num_examples for reply in replies)
        counts = {term: int(c) for term, c in zip(self.candidates, totals, strict=True) if c > 0}
        return DocumentFrequencies(counts, n_documents)

    def vocabulary_consensus(
        self, server_round: int, replies: list[ClientReply], merged: DocumentFrequencies
    ) -> Parameters:
        """Alg. 1 lines 2-6: V = merge(V_l) with optional min-df / max-df / max-features; W^(0)."""
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
        rounds_left = (self.cfg.num_rounds - server_round) * params.local_steps
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
            f"{server_round + -(-wanted // params.local_steps)}",
        )
        if self.total_steps == 0:
            self.finished, self.stop_reason = True, f"no training round left (num-rounds = {server_round})"
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
        averaged = weighted_average(buffers, weights)
        if self.cfg.dp.enabled:  # noisy running variances may be <= 0
            averaged = floor_variances(state_schema(self.model, "buffers").names, averaged)
            self.dp_releases = max([self.dp_releases, *(int(r.metrics[RELEASES_KEY]) for r in replies)])
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
            "privacy": privacy_summary(self.cfg.dp, self.method, self.cfg.num_rounds, self.dp_releases),
        }
        if self.training:
            top = top_words(self.topic_word(), DIVERSITY_TOP_WORDS)
            summary["top_words"] = [[self.vocabulary[j] for j in row[:NPMI_TOP_WORDS]] for row in top]
            summary["top_word_indices"] = top.tolist()
            summary["vocabulary"] = list(self.vocabulary or ())
        return summary
