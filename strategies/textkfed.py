"""k-FED strategies on text features (the FSTC paper's FBOW, FTF-IDF and FSBERT baselines).

FBOW / FTF-IDF: round 1 merges the clients' term document frequencies into one vocabulary (and idf),
round 2 runs k-FED's server step on the local centres over that vocabulary. The global model is
(centres, vocabulary, idf), so clients can label their texts with it. FSBERT-kFED is k-FED itself.
"""

from __future__ import annotations

from logging import INFO

import numpy as np
from flwr.common import FitIns, Parameters, Scalar, log, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy

from fedapp.config.run import RunConfig
from fedapp.features.bow import (
    DocumentFrequencies,
    idf_weights,
    merge_document_frequencies,
    select_vocabulary,
)
from fedapp.methods.textkfed import DOCUMENTS_KEY, PHASE_CENTRES, PHASE_VOCABULARY, TextKFedConfig
from fedapp.wire import ArraySpec, ReplyError
from strategies.base import ClusteringStrategy
from strategies.kfed import KFedStrategy, merge_local_centres
from strategies.replies import ClientReply, consistent_replies


def shared_vocabulary(
    parts: list[DocumentFrequencies], vocab_size: int, min_df: int, tfidf: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Merged document frequencies -> (sorted vocabulary, idf or an empty array for plain counts)."""
    merged = merge_document_frequencies(parts)
    vocabulary = select_vocabulary(merged, min_df=min_df, max_features=vocab_size)
    idf = idf_weights(merged, vocabulary) if tfidf else np.zeros(0)
    return np.array(vocabulary, dtype=np.str_), idf


class BagOfWordsKFedStrategy(ClusteringStrategy):
    """FBOW: k-FED on term counts over a vocabulary merged from document frequencies."""

    method = "fbow"
    tfidf = False
    state_fields = ("vocabulary", "idf")

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(TextKFedConfig)
        self.vocabulary: np.ndarray | None = None
        self.idf = np.zeros(0)

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        phase = PHASE_VOCABULARY if self.vocabulary is None else PHASE_CENTRES
        return {**super().fit_config(server_round), "phase": phase}

    def fit_instructions(
        self, server_round: int, parameters: Parameters, clients: list[ClientProxy]
    ) -> list[tuple[ClientProxy, FitIns]]:
        arrays = [] if self.vocabulary is None else [self.vocabulary, self.idf]
        ins = FitIns(ndarrays_to_parameters(arrays), self.fit_config(server_round))
        return [(client, ins) for client in clients]

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.vocabulary is None:
            return [ArraySpec("terms", (None,), "U"), ArraySpec("document-frequencies", (None,), "i")]
        return [ArraySpec("centres", (None, len(self.vocabulary))), ArraySpec("counts", (None,), "i")]

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        first, second = reply.arrays
        if self.vocabulary is None:
            n_documents = reply.metrics.get(DOCUMENTS_KEY)
            if not isinstance(n_documents, int):
                raise ReplyError(f"metrics lack an integer '{DOCUMENTS_KEY}'")
            try:
                DocumentFrequencies.from_arrays(first, second, n_documents)
            except ValueError as exc:
                raise ReplyError(str(exc)) from None
        elif second.shape[0] != first.shape[0] or (second < 0).any():
            raise ReplyError(f"{first.shape[0]} centres but counts of shape {second.shape}")

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        return replies if self.vocabulary is None else consistent_replies(replies, server_round)

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        assert self.k is not None  # _validated rejects every reply while k is unknown
        if self.vocabulary is None:
            parts = [
                DocumentFrequencies.from_arrays(*r.arrays, int(r.metrics[DOCUMENTS_KEY])) for r in replies
            ]
            self.vocabulary, self.idf = shared_vocabulary(
                parts, self.params.vocab_size, self.params.min_df, self.tfidf
            )
            log(
                INFO,
                "%s: shared vocabulary of %d terms from %d clients",
                self.method,
                len(self.vocabulary),
                len(replies),
            )
            return ndarrays_to_parameters([])
        centres = merge_local_centres([r.arrays[0] for r in replies], self.k, self.cfg.seed)
        self.finished, self.stop_reason = True, "one-shot"
        return ndarrays_to_parameters([centres, self.vocabulary, self.idf])

    def extra_summary(self) -> dict[str, int]:
        return {"vocabulary_size": 0 if self.vocabulary is None else len(self.vocabulary)}


class TfIdfKFedStrategy(BagOfWordsKFedStrategy):
    """FTF-IDF: as FBOW, with TF-IDF rows (idf from the merged document frequencies)."""

    method = "ftfidf"
    tfidf = True


class SentenceKFedStrategy(KFedStrategy):
    """FSBERT-kFED: k-FED on sentence embeddings (its `local-k` from the textkfed table)."""

    method = "fsbert-kfed"

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        local_k = self.cfg.params(TextKFedConfig).local_k
        return {
            **ClusteringStrategy.fit_config(self, server_round),
            "phase": "local-centres",
            "local-k": local_k,
        }
