"""Training maths for neural topic models, framework-free: batches, the loss, steps, inference.

Used by the gFedNTM client (one mini-batch gradient per round), by the non-collaborative and centralized
references of the experiments, and by the exactness test's union-batch trainer. Nothing here knows
about Flower.

Batching with unequal clients (`EpochSplit`): every client cuts each epoch into the same number S of
mini-batches (sizes differ by at most one document), S = ceil(largest client / batch size). Client l's
batch then holds about n_l / S documents, all clients reach the end of an epoch at the same global step,
and over one epoch the union of the clients' batches is every document exactly once, which is what
an epoch of centralized training on the union corpus means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse
import torch

from fedapp.methods.gfedntm import BOW_CONTEXT_DIM, GFedNTMConfig, hidden_sizes
from fedapp.models.gfedntm import Groups, NeuralTopicModel, elbo_terms
from fedapp.neural.training import Progress

OPTIMIZERS = ("adam", "sgd")


class TopicModelError(ValueError):
    """A corpus, batch plan or optimizer setting that cannot train a topic model."""


@dataclass(frozen=True, eq=False)
class Corpus:
    """Documents as term counts (CSR, documents x vocabulary) and, for CombinedTM, their embeddings."""

    counts: scipy.sparse.csr_matrix
    contexts: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.contexts is not None and self.contexts.shape[0] != self.counts.shape[0]:
            raise TopicModelError(
                f"{self.counts.shape[0]} documents but {self.contexts.shape[0]} contextual embeddings"
            )

    @property
    def n_documents(self) -> int:
        return int(self.counts.shape[0])

    def batch(
        self, rows: np.ndarray, device: torch.device, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Dense (bag of words, embeddings) tensors of `rows`."""
        bow = torch.as_tensor(self.counts[rows].toarray(), dtype=dtype, device=device)
        if self.contexts is None:
            return bow, None
        return bow, torch.as_tensor(self.contexts[rows], dtype=dtype, device=device)


def concat_batches(
    parts: Sequence[tuple[torch.Tensor, torch.Tensor | None]],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The union batch of several clients' batches (rows in client order)."""
    bow = torch.cat([bow for bow, _ in parts])
    contexts = [context for _, context in parts]
    if any(context is None for context in contexts):
        return bow, None
    return bow, torch.cat(contexts)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ batching
@dataclass(frozen=True)
class EpochSplit:
    """Epoch e's order is a permutation seeded by (seed, e), cut into `steps_per_epoch` near-equal batches.

    Batch `step` (a global step counter) is a pure function of (seed, step), so a client needs no cursor
    beyond the step the server names, and a client that sat out a step skips exactly that batch.
    """

    n_documents: int
    steps_per_epoch: int
    seed: int

    def __post_init__(self) -> None:
        if self.steps_per_epoch < 1:
            raise TopicModelError(f"steps_per_epoch must be >= 1, got {self.steps_per_epoch}")
        if self.n_documents < 2 * self.steps_per_epoch:
            raise TopicModelError(
                f"{self.n_documents} documents cannot fill {self.steps_per_epoch} batches of >= 2 documents "
                "(BatchNorm needs 2 per batch): lower the batch count or give this client more documents"
            )

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_documents)

    def bounds(self, position: int) -> tuple[int, int]:
        """[start, stop) of batch `position` within an epoch's order (np.array_split's sizes)."""
        size, extra = divmod(self.n_documents, self.steps_per_epoch)
        start = position * size + min(position, extra)
        return start, start + size + (position < extra)

    def batch(self, step: int) -> np.ndarray:
        epoch, position = divmod(step, self.steps_per_epoch)
        start, stop = self.bounds(position)
        return self.order(epoch)[start:stop]

    def batch_size(self, step: int) -> int:
        start, stop = self.bounds(step % self.steps_per_epoch)
        return stop - start


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating type of a model's weights (batches must match it)."""
    return next(model.parameters()).dtype


def steps_per_epoch(client_sizes: Sequence[int], batch_size: int) -> int:
    """S = ceil(largest client / batch size): the largest client's batches hold `batch_size` documents."""
    if not client_sizes or batch_size < 1:
        raise TopicModelError(
            f"need client sizes and batch_size >= 1, got {list(client_sizes)}, {batch_size}"
        )
    return max(1, math.ceil(max(client_sizes) / batch_size))


# ------------------------------------------------------------------------------------ training
def batch_loss(
    model: NeuralTopicModel, bow: torch.Tensor, context: torch.Tensor | None, groups: Groups
) -> dict[str, torch.Tensor]:
    """Mean over the batch's documents of KL + reconstruction (the ELBO's negative), and each term.

    A mean, not AVITM's sum: then the n-weighted mean of clients' gradients (Eq. 2) is exactly the
    gradient of the union batch's mean loss. Adam is invariant to the constant factor (up to its eps).
    """
    kl, reconstruction = elbo_terms(model(bow, context, groups), bow)
    return {
        "loss": (kl + reconstruction).mean(),
        "kl": kl.mean().detach(),
        "rl": reconstruction.mean().detach(),
    }


def make_optimizer(
    parameters: Sequence[torch.nn.Parameter], name: str, lr: float, betas: tuple[float, float]
) -> torch.optim.Optimizer:
    """Adam with `betas` (ProdLDA's default, betas (0.99, 0.99)) or plain SGD (Eq. 3: W <- W - lr G)."""
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr, betas=betas)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr)
    raise TopicModelError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def fit_centralized(
    model: NeuralTopicModel,
    corpus: Corpus,
    *,
    batch_size: int,
    epochs: int,
    optimizer: torch.optim.Optimizer,
    seed: int,
    max_steps: int = 0,
    desc: str = "centralized",
    log_every: int | None = None,
) -> list[float]:
    """Ordinary minibatch training on one corpus (the centralized and non-collaborative scenarios).

    Batches: `EpochSplit` with ceil(n / batch_size) batches per epoch; noise from a generator seeded
    by `seed`. Returns the mean loss of each epoch.
    """
    device = next(model.parameters()).device
    split = EpochSplit(corpus.n_documents, steps_per_epoch([corpus.n_documents], batch_size), seed)
    generator = torch.Generator().manual_seed(seed)
    total = (
        epochs * split.steps_per_epoch if not max_steps else min(max_steps, epochs * split.steps_per_epoch)
    )
    progress = Progress(desc, total, log_every)
    model.train()
    epoch_losses: list[float] = []
    running = 0.0
    try:
        for step in range(total):
            rows = split.batch(step)
            bow, context = corpus.batch(rows, device, model_dtype(model))
            optimizer.zero_grad(set_to_none=True)
            terms = batch_loss(model, bow, context, Groups.single(len(rows), generator))
            loss = terms["loss"]
            if not torch.isfinite(loss):
                raise TopicModelError(f"{desc}: loss is {float(loss)} at step {step}")
            loss.backward()
            optimizer.step()
            running += float(loss.detach())
            progress.update({"loss": float(loss.detach())})
            if (step + 1) % split.steps_per_epoch == 0 or step + 1 == total:
                epoch_losses.append(running / ((step % split.steps_per_epoch) + 1))
                running = 0.0
    finally:
        progress.close()
    return epoch_losses


def union_batch_step(
    model: NeuralTopicModel,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor | None]],
    generators: Sequence[torch.Generator],
    *,
    pooled_norm: bool = False,
) -> float:
    """One centralized step on the union of several clients' batches, BatchNorm per client group.

    The reference the federated protocol must equal: one forward and one backward pass over the
    concatenated batch (mean loss over all its documents), noise for client l's rows from generator l.
    `pooled_norm`: ordinary BatchNorm over the whole union batch instead (what federation does not do).
    """
    bow, context = concat_batches(batches)
    groups = Groups(tuple(int(b.shape[0]) for b, _ in batches), tuple(generators), pooled_norm)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = batch_loss(model, bow, context, groups)["loss"]
    loss.backward()
    optimizer.step()
    return float(loss.detach())


# ------------------------------------------------------------------------------------ inference
@torch.no_grad()
def infer_theta(
    model: NeuralTopicModel,
    corpus: Corpus,
    *,
    n_samples: int = 20,
    seed: int = 0,
    batch_size: int = 512,
) -> np.ndarray:
    """Document-topic proportions: the mean of `n_samples` softmax(z) draws from q(z|d) in eval mode.

    As contextualized-topic-models' `get_doc_topic_distribution` (20 samples by default).
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    thetas = []
    for start in range(0, corpus.n_documents, batch_size):
        rows = np.arange(start, min(start + batch_size, corpus.n_documents))
        bow, context = corpus.batch(rows, device, model_dtype(model))
        groups = Groups.single(len(rows), generator)
        mu, log_variance = model.inf_net(bow, context, groups)
        sigma = torch.exp(0.5 * log_variance)
        draws = [
            torch.softmax(mu + sigma * groups.randn(mu, model.n_topics), dim=1) for _ in range(n_samples)
        ]
        thetas.append(torch.stack(draws).mean(dim=0).cpu().numpy())
    model.train(was_training)
    return np.concatenate(thetas).astype(np.float64)


def top_words(topic_word: np.ndarray, n: int) -> np.ndarray:
    """K x n column indices of each topic's most probable words, most probable first (ties: lower index)."""
    order = np.argsort(-topic_word, axis=1, kind="stable")
    return order[:, :n]


# ------------------------------------------------------------------------------ shared builders
def build_model(
    params: GFedNTMConfig, bow_size: int, contextual_size: int, seed: int, device: torch.device
) -> NeuralTopicModel:
    """The global model W^(0): the same seed gives the same weights on the server and in references."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = NeuralTopicModel(
            bow_size,
            params.topics,
            contextual_size=contextual_size if params.model == "combinedtm" else 0,
            hidden_sizes=hidden_sizes(params.hidden),
            activation=params.activation,
            dropout=params.model_dropout,
            learn_priors=params.learn_priors,
        )
    return model.to(device=device, dtype=getattr(torch, params.precision))


def bow_projection(counts: scipy.sparse.spmatrix, seed: int) -> np.ndarray:
    """CombinedTM's stand-in document embedding for corpora without text: L1-normalised counts times a
    V x 384 Gaussian matrix seeded by the run seed (the same on every client and the server)."""
    rng = np.random.default_rng([seed, 0xC7])
    projection = rng.standard_normal((counts.shape[1], BOW_CONTEXT_DIM)) / np.sqrt(BOW_CONTEXT_DIM)
    totals = np.maximum(np.asarray(counts.sum(axis=1)).ravel(), 1)
    normalised = scipy.sparse.diags(1.0 / totals) @ counts
    return np.asarray(normalised @ projection, dtype=np.float32)
