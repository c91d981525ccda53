"""FSTC's networks: the clustering network F, the residual adapter of frozen mode, and the encoder Φ.

`FSTCModel` maps inputs to (representations E, scores O). Its input is either a batch of cached
sentence embeddings (frozen mode: no encoder) or texts — a list, or rows of `TokenizedTexts` tokenized
once per round — that the wrapped sentence-transformers encoder embeds with gradients (fine-tune mode).
Only the adapter, F and — when present — the encoder are exchanged; a server and its clients build the
same class to agree on the state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from fedapp.methods.fstc import FSTCConfig


class ResidualAdapter(nn.Module):
    """E = x' + W2 relu(W1 x' + b1) + b2 with W2 = b2 = 0 at initialisation; x' = dropout(x) in training.

    Frozen mode's trainable part of Φ: it gives the representations (and so the centres and L_A)
    gradients. Starting as the identity means the initial representations are the encoder's own
    embeddings, so every client can compute them (for the k-means initialisation) before the
    federation's initial model arrives. `hidden = 0` is the identity with no parameters. `dropout`
    drops input features (and hidden units) while training — with a frozen encoder the only noise the
    model sees, like the dropout inside a fine-tuned transformer (RSTC's head uses 0.5).
    """

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.layers = (
            nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim))
            if hidden > 0
            else None
        )
        if self.layers is not None:
            nn.init.zeros_(self.layers[3].weight)
            nn.init.zeros_(self.layers[3].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(x)
        return x if self.layers is None else x + self.layers(x)


class ClusteringNetwork(nn.Module):
    """F: fully connected layers from representations to K cluster assignment scores O."""

    def __init__(self, dim: int, k: int, hidden: int = 0) -> None:
        super().__init__()
        self.layers = (
            nn.Linear(dim, k)
            if hidden == 0
            else nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, k))
        )

    def forward(self, representations: torch.Tensor) -> torch.Tensor:
        return self.layers(representations)

    def start_at(self, centres: np.ndarray, scale: float) -> None:
        """Make F the nearest-centre classifier of `centres` (K x dim): O_k = scale (c_k . e - |c_k|^2 / 2)
        = -scale |e - c_k|^2 / 2 + (a term common to every k), so argmax O is the nearest centre and
        softmax(O) a Gaussian posterior of inverse temperature `scale`. Training then starts from the
        clustering C̃ gives, which with many clusters a randomly started F never reaches again."""
        if not isinstance(self.layers, nn.Linear):
            raise ValueError("only a linear F (head-hidden = 0) can start as the nearest-centre classifier")
        weights = torch.as_tensor(np.asarray(centres), dtype=self.layers.weight.dtype)
        if weights.shape != self.layers.weight.shape:
            raise ValueError(
                f"centres of shape {tuple(weights.shape)} for F of {tuple(self.layers.weight.shape)}"
            )
        with torch.no_grad():
            self.layers.weight.copy_(scale * weights)
            self.layers.bias.copy_(-0.5 * scale * (weights**2).sum(1))


class TokenizedTexts:
    """Texts tokenized once, batches cut out of them: the rows of a batch, trimmed to the batch's longest
    text, are exactly what tokenizing that batch alone gives (right padding).

    Why: on an H100, tokenizing FSTC's 600 texts of a step (200 texts, 3 views) cost 33 ms of CPU, more
    than the transformer's forward + backward + Adam on them (25 ms).
    """

    def __init__(self, features: dict[str, Any], device: torch.device, *, trim: bool = True) -> None:
        self.features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
        self.device = device
        mask = features["attention_mask"]
        self.lengths = mask.sum(dim=1).cpu().numpy() if trim else None  # host copy: no GPU sync per batch

    def rows(self, indices: Any) -> dict[str, Any]:
        """The features of rows `indices` (any integer index), as a model input."""
        index = torch.as_tensor(indices, device=self.device)
        width = (
            int(self.lengths[np.asarray(indices)].max()) if self.lengths is not None and len(index) else None
        )

        def cut(value: Any) -> Any:  # token tensors are (rows, positions); others pass through
            if not torch.is_tensor(value):
                return value
            rows = value[index]
            return rows[:, :width] if rows.dim() == 2 else rows

        return {name: cut(value) for name, value in self.features.items()}


class SentenceEncoder(nn.Module):
    """Φ for fine-tune mode: a sentence-transformers model; texts (or their `TokenizedTexts` rows) in,
    (pooled) embeddings out."""

    def __init__(self, sentence_model: Any) -> None:
        super().__init__()
        self.model = sentence_model  # a SentenceTransformer (an nn.Sequential of its modules)

    def tokenize(self, texts: list[str]) -> dict[str, Any]:
        """The model's own tokenization (padding to the longest text, truncation at its max length)."""
        preprocess = getattr(self.model, "preprocess", None) or self.model.tokenize  # renamed in s-t 6
        return preprocess(texts)

    def tokenized(self, texts: list[str]) -> TokenizedTexts:
        """`texts` tokenized once, on the model's device, for `TokenizedTexts.rows` batches."""
        right_padded = getattr(self.model.tokenizer, "padding_side", "right") == "right"
        return TokenizedTexts(self.tokenize(texts), self.device, trim=right_padded)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward(self, inputs: list[str] | dict[str, Any]) -> torch.Tensor:
        features = self.tokenize(inputs) if isinstance(inputs, list) else inputs
        device = self.device
        features = {name: v.to(device) if torch.is_tensor(v) else v for name, v in features.items()}
        return self.model(features)["sentence_embedding"]


class FSTCModel(nn.Module):
    """Φ (encoder and/or adapter) followed by F: inputs -> (E, O)."""

    def __init__(
        self,
        dim: int,
        k: int,
        *,
        adapter_hidden: int,
        head_hidden: int,
        dropout: float = 0.0,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.adapter = ResidualAdapter(dim, adapter_hidden, dropout)
        self.head = ClusteringNetwork(dim, k, head_hidden)

    def forward(self, inputs: torch.Tensor | list[str] | dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        embeddings = inputs if self.encoder is None else self.encoder(inputs)
        representations = self.adapter(embeddings)
        return representations, self.head(representations)


def fstc_model(
    params: FSTCConfig, k: int, dim: int | None, embedding_model: str, device: str = "cpu"
) -> FSTCModel:
    """The model client and server agree on: frozen mode needs the embedding `dim`; fine-tune mode loads
    the sentence encoder (`embedding_model`, truncating at `params.max_length` tokens) and takes its dim."""
    if params.encoder == "frozen":
        if dim is None:
            raise ValueError("frozen mode needs the embedding dimension")
        return FSTCModel(
            dim,
            k,
            adapter_hidden=params.adapter_hidden,
            head_hidden=params.head_hidden,
            dropout=params.dropout,
        )
    from fedapp.features.embeddings import load_sentence_model, resolve_device

    sentence_model = load_sentence_model(embedding_model, resolve_device(device), params.max_length)
    encoder = SentenceEncoder(sentence_model)
    # sentence-transformers 6 renamed the method (the old name warns there); 3.x-5.x have only the old one
    dimension_of = getattr(sentence_model, "get_embedding_dimension", None)
    dim = dimension_of() if dimension_of else sentence_model.get_sentence_embedding_dimension()
    return FSTCModel(
        dim,
        k,
        adapter_hidden=params.adapter_hidden,
        head_hidden=params.head_hidden,
        dropout=params.dropout,
        encoder=encoder,
    )
