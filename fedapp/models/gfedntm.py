"""Neural topic models for gFedNTM: ProdLDA (Srivastava & Sutton 2017) and CombinedTM (Bianchi et al. 2021).

Written here rather than imported from `contextualized-topic-models` (see docs/methods/gfedntm.md): that
package ships only the contextual inference networks (plain ProdLDA lives in a separate AVITM code base),
places tensors with a hard-coded `.cuda()`, draws dropout and reparameterisation noise from the global
RNG, and normalises each BatchNorm over the whole batch. Federated training equal to centralized
training needs two things those modules do not offer, both explicit here:

- `noise`: every random draw (encoder dropout, the reparameterisation epsilon, dropout on theta) comes
  from per-group `torch.Generator`s, so a centralized run on the union batch can draw, for client l's
  rows, exactly what client l drew.
- `groups`: BatchNorm statistics per group of rows (`GroupBatchNorm1d`). A federated step normalises each
  client's mini-batch with that client's statistics; the centralized equivalent is the union batch
  normalised per client group ("ghost batches"). With one group it is `nn.BatchNorm1d(affine=False)`.

Architecture and defaults follow contextualized-topic-models: hidden (100, 100), softplus, dropout 0.2,
a learnable Laplace-approximation prior N(0, 1 - 1/K), beta K x V (Xavier-uniform) with an affine-free
BatchNorm on the decoder logits; CombinedTM maps the sentence embedding to V dimensions and concatenates
it to the bag of words before the first layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

ACTIVATIONS = {"softplus": nn.Softplus, "relu": nn.ReLU}


@dataclass(frozen=True)
class Groups:
    """Row groups of a batch (one per client) and the generator each group's random draws come from.

    `sizes` sum to the batch size; `generators[i]` serves rows of group i. One group = an ordinary batch.
    Draws are made on the CPU generator and moved to the batch's device, so CPU and GPU runs draw alike.
    """

    sizes: tuple[int, ...]
    generators: tuple[torch.Generator, ...]
    pooled_norm: bool = False  # True: BatchNorm over the whole batch (ordinary centralized BN), for contrast

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.generators) or not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"need one generator per non-empty group, got sizes {self.sizes}")

    @property
    def norm_sizes(self) -> tuple[int, ...]:
        """The row groups BatchNorm normalises separately."""
        return (sum(self.sizes),) if self.pooled_norm else self.sizes

    @classmethod
    def single(cls, size: int, generator: torch.Generator) -> Groups:
        return cls((int(size),), (generator,))

    def rand(self, like: torch.Tensor, columns: int) -> torch.Tensor:
        """Uniform [0, 1) draws (dtype and device of `like`), rows of group i from generator i."""
        parts = [
            torch.rand((n, columns), generator=g, dtype=like.dtype)
            for n, g in zip(self.sizes, self.generators, strict=True)
        ]
        return torch.cat(parts).to(like.device)

    def randn(self, like: torch.Tensor, columns: int) -> torch.Tensor:
        """Standard normal draws (dtype and device of `like`), rows of group i from generator i."""
        parts = [
            torch.randn((n, columns), generator=g, dtype=like.dtype)
            for n, g in zip(self.sizes, self.generators, strict=True)
        ]
        return torch.cat(parts).to(like.device)


def dropout(x: torch.Tensor, p: float, groups: Groups, training: bool) -> torch.Tensor:
    """Inverted dropout with masks from `groups` (nn.Dropout would draw from the global RNG)."""
    if not training or p == 0.0:
        return x
    keep = (groups.rand(x, x.shape[1]) >= p).to(x.dtype)
    return x * keep / (1.0 - p)


class GroupBatchNorm1d(nn.Module):
    """Affine-free BatchNorm over row groups; running statistics = the size-weighted mean of the groups'.

    Train mode normalises each group with its own mean and biased variance (as `nn.BatchNorm1d` does for
    a batch). The running mean/variance move towards the size-weighted mean of the groups' batch mean and
    unbiased variance, which is what averaging the clients' BatchNorm buffers by batch size gives after a
    federated step (Eq. 2 applied to buffers). `num_batches_tracked` counts steps, not groups.
    """

    def __init__(self, num_features: int, *, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
        if not self.training:
            return (x - self.running_mean) / torch.sqrt(self.running_var + self.eps)
        sizes = [x.shape[0]] if sizes is None else list(sizes)
        if min(sizes) < 2:
            raise ValueError(f"BatchNorm in train mode needs >= 2 rows per group, got group sizes {sizes}")
        outputs, means, variances = [], [], []
        for part in torch.split(x, sizes):
            mean = part.mean(dim=0)
            var = part.var(dim=0, unbiased=False)
            outputs.append((part - mean) / torch.sqrt(var + self.eps))
            means.append(mean.detach())
            variances.append(part.detach().var(dim=0, unbiased=True))
        weights = torch.tensor(sizes, dtype=x.dtype, device=x.device) / sum(sizes)
        with torch.no_grad():
            batch_mean = sum(w * m for w, m in zip(weights, means, strict=True))
            batch_var = sum(w * v for w, v in zip(weights, variances, strict=True))
            self.running_mean.mul_(1 - self.momentum).add_(self.momentum * batch_mean)
            self.running_var.mul_(1 - self.momentum).add_(self.momentum * batch_var)
            self.num_batches_tracked.add_(1)
        return torch.cat(outputs)


class InferenceNetwork(nn.Module):
    """Encoder q(z | d): bag of words (+ a sentence embedding for CombinedTM) -> (mu, log variance)."""

    def __init__(
        self,
        bow_size: int,
        contextual_size: int,
        n_topics: int,
        hidden_sizes: Sequence[int],
        activation: str,
        dropout: float,
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.adapt_context = nn.Linear(contextual_size, bow_size) if contextual_size else None
        width = 2 * bow_size if contextual_size else bow_size
        self.input_layer = nn.Linear(width, hidden_sizes[0])
        self.activation = ACTIVATIONS[activation]()
        self.hiddens = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(hidden_sizes[:-1], hidden_sizes[1:], strict=False)
        )
        self.f_mu = nn.Linear(hidden_sizes[-1], n_topics)
        self.f_mu_batchnorm = GroupBatchNorm1d(n_topics)
        self.f_sigma = nn.Linear(hidden_sizes[-1], n_topics)
        self.f_sigma_batchnorm = GroupBatchNorm1d(n_topics)

    def forward(
        self, bow: torch.Tensor, context: torch.Tensor | None, groups: Groups
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = bow
        if self.adapt_context is not None:
            if context is None:
                raise ValueError("CombinedTM needs the documents' contextual embeddings")
            x = torch.cat((bow, self.adapt_context(context)), dim=1)
        x = self.activation(self.input_layer(x))
        for layer in self.hiddens:
            x = self.activation(layer(x))
        x = dropout(x, self.dropout, groups, self.training)
        mu = self.f_mu_batchnorm(self.f_mu(x), groups.norm_sizes)
        log_variance = self.f_sigma_batchnorm(self.f_sigma(x), groups.norm_sizes)
        return mu, log_variance


@dataclass
class Forward:
    """What one pass produces: the posterior, the prior and the reconstructed word distributions."""

    posterior_mean: torch.Tensor
    posterior_log_variance: torch.Tensor
    prior_mean: torch.Tensor
    prior_variance: torch.Tensor
    word_distribution: torch.Tensor


class NeuralTopicModel(nn.Module):
    """ProdLDA (`contextual_size` = 0) or CombinedTM (`contextual_size` = sentence-embedding width)."""

    def __init__(
        self,
        bow_size: int,
        n_topics: int,
        *,
        contextual_size: int = 0,
        hidden_sizes: Sequence[int] = (100, 100),
        activation: str = "softplus",
        dropout: float = 0.2,
        learn_priors: bool = True,
    ) -> None:
        super().__init__()
        if bow_size < 1 or n_topics < 1 or contextual_size < 0 or not hidden_sizes:
            raise ValueError(
                f"need bow_size, n_topics >= 1, contextual_size >= 0 and hidden sizes, got {bow_size}, "
                f"{n_topics}, {contextual_size}, {tuple(hidden_sizes)}"
            )
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        self.bow_size, self.n_topics, self.contextual_size = bow_size, n_topics, contextual_size
        self.dropout = dropout
        self.inf_net = InferenceNetwork(
            bow_size, contextual_size, n_topics, hidden_sizes, activation, dropout
        )
        # Laplace approximation of a Dirichlet(1) prior in the softmax basis (Srivastava & Sutton, Eq. 3)
        prior_mean = torch.zeros(n_topics)
        prior_variance = torch.full((n_topics,), 1.0 - 1.0 / n_topics)
        if learn_priors:
            self.prior_mean = nn.Parameter(prior_mean)
            self.prior_variance = nn.Parameter(prior_variance)
        else:
            self.register_buffer("prior_mean", prior_mean)
            self.register_buffer("prior_variance", prior_variance)
        self.beta = nn.Parameter(torch.empty(n_topics, bow_size))
        nn.init.xavier_uniform_(self.beta)
        self.beta_batchnorm = GroupBatchNorm1d(bow_size)

    def forward(self, bow: torch.Tensor, context: torch.Tensor | None, groups: Groups) -> Forward:
        mu, log_variance = self.inf_net(bow, context, groups)
        # reparameterisation: z = mu + sigma * eps, theta = softmax(z), dropout on theta
        z = mu + torch.exp(0.5 * log_variance) * groups.randn(mu, self.n_topics)
        theta = dropout(functional.softmax(z, dim=1), self.dropout, groups, self.training)
        # product of experts: word distribution = softmax(BN(theta beta))
        logits = self.beta_batchnorm(theta @ self.beta, groups.norm_sizes)
        return Forward(
            mu, log_variance, self.prior_mean, self.prior_variance, functional.softmax(logits, dim=1)
        )

    def topic_word(self) -> torch.Tensor:
        """The K x V topic-word distributions: softmax of beta over the vocabulary."""
        return functional.softmax(self.beta.detach(), dim=1)


def elbo_terms(out: Forward, bow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-document KL(q(z|d) || p(z)) and reconstruction loss -sum_w n_dw log p(w|d) (AVITM's loss)."""
    prior_variance = out.prior_variance
    posterior_variance = torch.exp(out.posterior_log_variance)
    diff = out.prior_mean - out.posterior_mean
    kl = 0.5 * (
        torch.sum(posterior_variance / prior_variance, dim=1)
        + torch.sum(diff * diff / prior_variance, dim=1)
        - out.posterior_mean.shape[1]
        + prior_variance.log().sum()
        - out.posterior_log_variance.sum(dim=1)
    )
    reconstruction = -torch.sum(bow * torch.log(out.word_distribution + 1e-10), dim=1)
    return kl, reconstruction
