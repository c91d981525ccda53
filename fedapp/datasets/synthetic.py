"""Synthetic LDA corpora of the gFedNTM paper (Sec. 4.1): nodes that share some topics and own others.

Generator (as the authors' `run_simulation.py`, experiments A and B): K topics beta_k ~ Dir(eta 1_V) over
V artificial terms ``w0000 ...``; K' topics are shared by all L nodes and each node owns (K - K') // L
private topics. Node l draws document proportions theta ~ Dir(prior_l) with prior alpha on the shared
topics and on its own topics, alpha / 10,000 on the other nodes' topics (and on any remainder topics);
a document has U{150 .. 249} words, each drawn from a topic drawn from theta. Each node gets
`docs_per_node` training documents (the dataset's rows, label = node) and `heldout_per_node` held-out
documents; the held-out documents and the true topics and proportions are the benchmark's ground truth
(`synthetic_truth`), which only the evaluation reads (TSS, DSS); no client sends anything of it.

alpha = 0.1 is the value of the authors' experiment configs that produced their stored figures (the
paper's text says 50 / K).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse

from fedapp.datasets.common import Dataset, Embedded, build


@dataclass(frozen=True)
class SyntheticLDASpec:
    """The generator's parameters (defaults: the paper's setting with K' = 10, eta = 0.01)."""

    n_nodes: int = 5
    vocab_size: int = 5_000
    n_topics: int = 50
    n_shared: int = 10
    eta: float = 0.01
    alpha: float = 0.1
    docs_per_node: int = 10_000
    heldout_per_node: int = 1_000
    min_words: int = 150
    max_words: int = 250  # exclusive, as numpy's randint in the reference

    def __post_init__(self) -> None:
        if not 0 <= self.n_shared <= self.n_topics or self.n_nodes < 1:
            raise ValueError(f"need 0 <= n_shared <= n_topics and n_nodes >= 1, got {self}")
        if self.eta <= 0 or self.alpha <= 0 or not 1 <= self.min_words < self.max_words:
            raise ValueError(f"need eta, alpha > 0 and 1 <= min_words < max_words, got {self}")

    @property
    def own_topics(self) -> int:
        return (self.n_topics - self.n_shared) // self.n_nodes

    def node_prior(self, node: int) -> np.ndarray:
        """Dirichlet prior of node `node`'s document proportions: shared topics first, then node blocks."""
        prior = np.full(self.n_topics, self.alpha / 10_000)
        prior[: self.n_shared] = self.alpha
        start = self.n_shared + node * self.own_topics
        prior[start : start + self.own_topics] = self.alpha
        return prior

    def node_topics(self, node: int) -> np.ndarray:
        """Indices of the topics node `node` actually uses (shared + own)."""
        start = self.n_shared + node * self.own_topics
        return np.r_[np.arange(self.n_shared), np.arange(start, start + self.own_topics)]


@dataclass(frozen=True, eq=False)
class SyntheticLDA:
    """One generated benchmark: training and held-out documents plus the truth that generated them."""

    spec: SyntheticLDASpec
    topics: np.ndarray  # K x V true topic-word distributions
    train_counts: scipy.sparse.csr_matrix  # (L * docs_per_node) x V, node 0's documents first
    train_nodes: np.ndarray
    heldout_counts: scipy.sparse.csr_matrix
    heldout_theta: np.ndarray  # (L * heldout_per_node) x K true proportions
    heldout_nodes: np.ndarray

    @property
    def vocabulary(self) -> tuple[str, ...]:
        return vocabulary(self.spec.vocab_size)


def vocabulary(size: int) -> tuple[str, ...]:
    """Artificial terms whose sorted order is their index order."""
    width = len(str(size - 1))
    return tuple(f"w{index:0{width}d}" for index in range(size))


def generate(spec: SyntheticLDASpec, seed: int) -> SyntheticLDA:
    """Draw topics, then per node the training and held-out proportions and words (one seeded stream)."""
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(spec.vocab_size, spec.eta), spec.n_topics)
    per_node = spec.docs_per_node + spec.heldout_per_node
    train, heldout, train_nodes, heldout_nodes, heldout_theta = [], [], [], [], []
    for node in range(spec.n_nodes):
        theta = rng.dirichlet(spec.node_prior(node), per_node)
        counts = _draw_documents(theta, topics, spec, rng)
        train.append(counts[: spec.docs_per_node])
        heldout.append(counts[spec.docs_per_node :])
        heldout_theta.append(theta[spec.docs_per_node :])
        train_nodes.append(np.full(spec.docs_per_node, node))
        heldout_nodes.append(np.full(spec.heldout_per_node, node))
    return SyntheticLDA(
        spec,
        topics,
        scipy.sparse.vstack(train, format="csr"),
        np.concatenate(train_nodes),
        scipy.sparse.vstack(heldout, format="csr"),
        np.concatenate(heldout_theta),
        np.concatenate(heldout_nodes),
    )


def _draw_documents(
    theta: np.ndarray, topics: np.ndarray, spec: SyntheticLDASpec, rng: np.random.Generator
) -> scipy.sparse.csr_matrix:
    """LDA's generative process, vectorised: topic counts ~ Multinomial(length, theta_d), then each
    topic's tokens are drawn from beta_k (inverse CDF) and added to their documents' counts."""
    n_docs = theta.shape[0]
    lengths = rng.integers(spec.min_words, spec.max_words, size=n_docs)
    topic_counts = rng.multinomial(lengths, theta)  # n_docs x K tokens per (document, topic)
    cumulative = np.cumsum(topics, axis=1)
    rows, columns = [], []
    for topic in range(topics.shape[0]):
        per_doc = topic_counts[:, topic]
        draws = rng.random(int(per_doc.sum())) * cumulative[topic, -1]
        words = np.minimum(np.searchsorted(cumulative[topic], draws, side="right"), spec.vocab_size - 1)
        rows.append(np.repeat(np.arange(n_docs), per_doc))
        columns.append(words)
    row, column = np.concatenate(rows), np.concatenate(columns)
    counts = scipy.sparse.csr_matrix(
        (np.ones(row.size, dtype=np.int64), (row, column)), shape=(n_docs, spec.vocab_size)
    )
    counts.sum_duplicates()
    return counts


# ------------------------------------------------------------------------------------- registry
# Experiment A varies the shared topics K', experiment B the topic prior eta; "-tiny" is for tests.
VARIANTS: dict[str, SyntheticLDASpec] = {
    "synthetic-lda": SyntheticLDASpec(),
    **{f"synthetic-lda-shared{k}": SyntheticLDASpec(n_shared=k) for k in (5, 15, 30, 40)},
    **{f"synthetic-lda-eta{eta:g}": SyntheticLDASpec(eta=eta) for eta in (0.02, 0.03, 0.04, 0.08, 1.0)},
    "synthetic-lda-tiny": SyntheticLDASpec(
        vocab_size=300, n_topics=10, n_shared=5, docs_per_node=120, heldout_per_node=40
    ),
}


@lru_cache(maxsize=4)
def synthetic_truth(name: str, seed: int) -> SyntheticLDA:
    """The generated benchmark behind dataset `name` for run seed `seed` (cached per process)."""
    if name not in VARIANTS:
        raise ValueError(f"{name!r} is not a synthetic LDA dataset; choose one of {sorted(VARIANTS)}")
    return generate(VARIANTS[name], seed)


def _read(name: str, seed: int) -> Dataset:
    data = synthetic_truth(name, seed)
    return build(
        name,
        "bow",
        data.train_nodes,
        source=f"synthetic LDA generator, seed {seed}",
        counts=data.train_counts,
        vocabulary=data.vocabulary,
        class_names=tuple(f"node{node}" for node in range(data.spec.n_nodes)),
    )


def _describe(spec: SyntheticLDASpec) -> str:
    return (
        f"LDA corpus (gFedNTM Sec. 4.1): {spec.n_nodes} nodes x {spec.docs_per_node:,} docs, "
        f"V={spec.vocab_size:,}, K={spec.n_topics}, K'={spec.n_shared} shared, eta={spec.eta:g}; label = node"
    )


DATASETS: dict[str, Embedded] = {
    name: Embedded("bow", _describe(spec), _read, seeded=True) for name, spec in VARIANTS.items()
}
