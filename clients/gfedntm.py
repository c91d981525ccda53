"""gFedNTM client: vocabulary statistics once, then the gradient (or locally stepped weights) of one
mini-batch per round, and document co-occurrence counts of the topics' top words for evaluation.

What never leaves the client: documents, their counts, their embeddings, which documents are in a
batch. What does: see fedapp/methods/gfedntm.py and docs/methods/gfedntm.md (a mini-batch gradient is
not anonymous: the encoder's first-layer gradient is non-zero exactly in the columns of words present
in the batch).

Under differential privacy (`dp.epsilon` > 0, `fedapp.privacy.dp`) each training reply is one client-level
Gaussian release (`private_reply`): the update (the gradient, or the parameter delta with `exchange =
parameters`) together with the BatchNorm running statistics' delta is clipped to `dp.model-clip` and gets
N(0, (z * model-clip)^2); other buffers (step counter, the fixed prior) go back as received. The
vocabulary round is NOT covered (exact term lists and document frequencies; summary.json says so).
"""

from __future__ import annotations

import hashlib

import numpy as np
import scipy.sparse
import torch
from flwr.common import ConfigRecord, Context, NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.config.run import RunConfig
from fedapp.datasets.local import LocalData
from fedapp.features.bow import DocumentFrequencies, count_matrix, document_frequencies
from fedapp.features.embeddings import EmbeddingCache, embed_texts
from fedapp.maths.gfedntm import (
    Corpus,
    EpochSplit,
    batch_loss,
    bow_projection,
    build_model,
    infer_theta,
    make_optimizer,
    model_dtype,
)
from fedapp.methods.gfedntm import (
    BOW_CONTEXT_DIM,
    COOCCURRENCE_KEY,
    PHASE_COOCCURRENCE,
    PHASE_TERMS,
    PHASE_TRAIN,
    PHASE_VOCABULARY,
    GFedNTMConfig,
)
from fedapp.models.gfedntm import Groups
from fedapp.neural.glue import (
    FINGERPRINT_KEY,
    client_rngs,
    gradient_arrays,
    load_state_arrays,
    resolve_device,
    restore_optimizer,
    save_optimizer,
    state_arrays,
    state_schema,
)
from fedapp.privacy.dp import (
    released_arrays,
)
from fedapp.privacy.secagg import SUM
from fedapp.report.stages import REPORT_KEY, Assignment
from fedapp.wire import encode_array

VOCABULARY_KEY = "gfedntm-vocabulary"
RNG_KEY = "gfedntm-rngs"
OPTIMIZER_KEY = "gfedntm-optimizer"
_CORPORA: dict[tuple, Corpus] = {}  # per process: Flower rebuilds the client every round
_CORPORA_KEPT = 16  # a Ray actor or the in-process engine hosts several clients; keep each one's


class GFedNTMClient(ClusteringClient):
    """One synchronised step per round; its state (vocabulary, random streams) lives in context.state."""

    def __init__(self, context: Context, cfg: RunConfig) -> None:
        super().__init__(context, cfg)
        self.params = cfg.params(GFedNTMConfig)
        self.k = self.params.topics
        self.device = resolve_device(cfg.device)

    # ----------------------------------------------------------------------------------- fit
    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        phase = config.get("phase")
        if phase in (PHASE_TERMS, PHASE_VOCABULARY):
            terms, counts = local_document_frequencies(self.data).to_arrays()
            metrics = {**self.identity_metrics(), "context-dim": self.context_dim()}
            if phase == PHASE_TERMS:  # SecAgg+'s first vocabulary round: which terms, not how often
                return [terms], self.data.n_samples, metrics
            if parameters:  # the server sent the union of the term lists: frequencies over it, a sum
                frequencies = union_frequencies(terms, counts, parameters[0])
                return self.uplink.send([frequencies], [SUM], self.data.n_samples, metrics)
            return [terms, counts], self.data.n_samples, metrics
        if phase != PHASE_TRAIN:
            raise ValueError(f"unknown gfedntm phase {phase!r}")
        if config.get("with-vocabulary"):
            self.context.state[VOCABULARY_KEY] = ConfigRecord({"terms": [str(t) for t in parameters[0]]})
            parameters = parameters[1:]
        arrays, used, metrics = self.train(parameters, config)
        # gradients and buffers are n-weighted averages; under DP one client-level release whose weight
        # stays the documents used (named as not covered in summary.json)
        return self.uplink.send_update(
            lambda: self.update_origin(parameters, arrays), arrays, used, metrics, private_weight=used
        )

    def update_origin(self, received_state: NDArrays, reply: NDArrays) -> tuple[list[np.ndarray], list[bool]]:
        """What a DP release of `reply` is a delta from (the received parameters with `exchange =
        parameters`, zeros for a gradient, which is its own delta; then the received buffers), and which of
        its arrays are released (`fedapp.privacy.dp.released_arrays`)."""
        model = build_model(self.params, len(self.vocabulary()), self.context_dim(), 0, "cpu")
        trainable, buffers = state_schema(model, "trainable"), state_schema(model, "buffers")
        by_name = dict(zip(state_schema(model).names, received_state, strict=True))
        received = [by_name[name] for name in buffers.names]
        if self.params.exchange == "parameters":
            received = [by_name[name] for name in trainable.names] + received
        else:
            received = [np.zeros_like(a) for a in reply[: len(trainable)]] + received
        names = trainable.names + buffers.names
        return received, released_arrays(names, list(reply), set(trainable.names))

    def train(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        corpus = self.corpus()
        model = build_model(self.params, corpus.counts.shape[1], self.context_dim(), 0, self.device)
        load_state_arrays(model, parameters, sender="server")
        split = EpochSplit(corpus.n_documents, int(config["steps-per-epoch"]), self.seed)
        first_step, local_steps = int(config["step"]), int(config["local-steps"])
        exchange = self.params.exchange
        optimizer = None
        if exchange == "parameters":
            optimizer = make_optimizer(
                list(model.parameters()), self.params.optimizer, self.params.lr, self.params.betas
            )
            restore_optimizer(self.context.state, OPTIMIZER_KEY, optimizer)
        used, losses = 0, []
        model.train()
        with client_rngs(self.context.state, RNG_KEY, self.seed) as rngs:
            for step in range(first_step, first_step + local_steps):
                rows = split.batch(step)
                bow, context = corpus.batch(rows, self.device, model_dtype(model))
                model.zero_grad(set_to_none=True)
                loss = batch_loss(model, bow, context, Groups.single(len(rows), rngs.torch))["loss"]
                if not torch.isfinite(loss):
                    raise ValueError(f"client {self.partition_id}: loss is {float(loss)} at step {step}")
                loss.backward()
                if optimizer is not None:
                    optimizer.step()
                used += len(rows)
                losses.append(float(loss.detach()))
        if optimizer is not None:
            save_optimizer(self.context.state, OPTIMIZER_KEY, optimizer)
            update = state_arrays(model, "trainable")
        else:
            update = gradient_arrays(model)
        metrics = {
            **self.identity_metrics(),
            "step": first_step,
            "loss": float(np.mean(losses)),
            FINGERPRINT_KEY: state_schema(model).fingerprint,
        }
        return [*update, *state_arrays(model, "buffers")], used, metrics

    # ------------------------------------------------------------------------------ evaluate
    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Per topic, how many local documents contain each pair of its top words (Eq.-free NPMI input);
        the final report's stages go to the common client."""
        if REPORT_KEY in config:
            return super().evaluate(parameters, config)
        if config.get("phase") != PHASE_COOCCURRENCE:
            raise ValueError(f"unknown gfedntm evaluation phase {config.get('phase')!r}")
        top = np.asarray(parameters[0], dtype=np.int64)
        present = (self.corpus().counts > 0).astype(np.int64)
        if top.ndim != 2 or top.min() < 0 or top.max() >= present.shape[1]:
            raise ValueError(
                f"top-word indices of shape {top.shape} do not fit a vocabulary of {present.shape[1]}"
            )
        cooccurrence = np.stack([(present[:, words].T @ present[:, words]).toarray() for words in top])
        metrics = {COOCCURRENCE_KEY: encode_array(cooccurrence.astype(np.int64)), **self.identity_metrics()}
        return 0.0, self.data.n_samples, metrics

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        raise NotImplementedError("gFedNTM is evaluated by topic metrics, not cluster labels")

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """Each document's dominant topic under the final model (parameters: vocabulary, then the model
        state), with its proportion θ as the score: what `predict` reproduces from the saved model."""
        vocabulary, state = [str(term) for term in parameters[0]], list(parameters[1:])
        self.context.state[VOCABULARY_KEY] = ConfigRecord({"terms": vocabulary})
        corpus = self.corpus()
        model = build_model(self.params, len(vocabulary), self.context_dim(), 0, self.device)
        load_state_arrays(model, state, sender="server")
        theta = infer_theta(model, corpus, n_samples=self.params.theta_samples, seed=self.cfg.seed)
        labels = theta.argmax(1)
        return Assignment(labels, theta[np.arange(len(labels)), labels], "probability", None)

    # -------------------------------------------------------------------------------- data
    def vocabulary(self) -> list[str]:
        if VOCABULARY_KEY not in self.context.state:
            raise ValueError(
                f"client {self.partition_id}: no vocabulary yet (the consensus round has not run)"
            )
        return list(self.context.state[VOCABULARY_KEY]["terms"])

    def context_dim(self) -> int:
        """Width of the contextual embeddings CombinedTM reads (0 for ProdLDA)."""
        if self.params.model != "combinedtm":
            return 0
        return BOW_CONTEXT_DIM if self.data.dataset.kind == "bow" else self.contexts().shape[1]

    def contexts(self) -> np.ndarray | None:
        if self.params.model != "combinedtm":
            return None
        return document_contexts(self.data, self.cfg, self.embedding_cache())

    def corpus(self) -> Corpus:
        """This client's documents over the consensus vocabulary (built once per process)."""
        terms = self.vocabulary()
        digest = hashlib.sha256("\n".join(terms).encode()).hexdigest()
        key = (
            self.cfg.dataset,
            self.cfg.seed,
            self.cfg.max_samples,
            self.cfg.imbalance,
            self.cfg.partition,
            self.partition_id,
            self.num_partitions,
            self.params.model,
            self.cfg.embedding_model,
            digest,
        )
        if key not in _CORPORA:
            if len(_CORPORA) >= _CORPORA_KEPT:
                del _CORPORA[next(iter(_CORPORA))]  # the oldest
            _CORPORA[key] = Corpus(local_counts(self.data, terms), self.contexts())
        return _CORPORA[key]


def union_frequencies(terms: np.ndarray, counts: np.ndarray, union: np.ndarray) -> np.ndarray:
    """This client's document frequencies laid out over the server's union of term lists (0: absent)."""
    position = {str(term): j for j, term in enumerate(union)}
    frequencies = np.zeros(len(union), dtype=np.int64)
    for term, count in zip(terms.tolist(), counts.tolist(), strict=True):
        if term not in position:
            raise ValueError(f"term {term!r} is missing from the server's union of term lists")
        frequencies[position[term]] = count
    return frequencies


def local_document_frequencies(data: LocalData) -> DocumentFrequencies:
    """Client side of the vocabulary consensus: per term, how many local documents contain it."""
    if data.dataset.kind == "bow":
        counts = data.dataset.counts[data.indices]
        df = np.asarray((counts > 0).sum(axis=0)).ravel()
        vocabulary = data.dataset.vocabulary
        return DocumentFrequencies({vocabulary[j]: int(df[j]) for j in np.flatnonzero(df)}, data.n_samples)
    return document_frequencies(data.texts)


def local_counts(data: LocalData, vocabulary: list[str]) -> scipy.sparse.csr_matrix:
    """Local documents x consensus vocabulary term counts (terms outside the vocabulary dropped)."""
    if data.dataset.kind == "bow":
        column_of = {term: j for j, term in enumerate(data.dataset.vocabulary)}
        missing = [term for term in vocabulary[:5] if term not in column_of]
        if missing:
            raise ValueError(f"consensus terms {missing} are not in this dataset's vocabulary")
        columns = np.array([column_of[term] for term in vocabulary])
        return scipy.sparse.csr_matrix(data.dataset.counts[data.indices][:, columns])
    return count_matrix(data.texts, vocabulary)


def document_contexts(data: LocalData, cfg: RunConfig, cache: EmbeddingCache) -> np.ndarray:
    """CombinedTM's document embeddings: SBERT (`embedding-model`) of the texts, or, for bag-of-words
    corpora without text, a seeded Gaussian projection of the L1-normalised counts (a stand-in with no
    semantics beyond the counts, so that CombinedTM runs and is tested on generated corpora)."""
    if data.dataset.kind != "bow":
        return embed_texts(
            data.texts,
            cfg.embedding_model,
            dataset=cfg.dataset,
            device=cfg.device,
            cache=cache,
            show_progress=False,
        )
    return bow_projection(data.dataset.counts[data.indices], cfg.seed)
