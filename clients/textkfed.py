"""k-FED clients on text features: bag of words / TF-IDF over a federated vocabulary, or sentence embeddings.

The FSTC paper's FBOW, FTF-IDF and FSBERT baselines. The k-FED maths is k-FED's (`clients.kfed`); what
is new here is only how a client turns its texts into vectors. FSBERT-kFED supports differential
privacy with k-FED's DP-Lloyd step (`clients.kfed.kfed_reply`); FBOW/FTF-IDF do not (their
vocabulary round sends exact document frequencies).
"""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar

from clients.base import ClusteringClient
from clients.kfed import LOCAL_RESTARTS, kfed_reply
from fedapp.features.bow import count_matrix, document_frequencies, tfidf_matrix
from fedapp.features.texts import local_embeddings
from fedapp.maths.clustering import nearest_centre
from fedapp.methods.textkfed import DOCUMENTS_KEY, PHASE_VOCABULARY, TextKFedConfig
from fedapp.report.stages import Assignment, nearest_with_distance


class BagOfWordsKFedClient(ClusteringClient):
    """Round 1: term document frequencies; round 2: local centres of count (or TF-IDF) rows."""

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        if config.get("phase") == PHASE_VOCABULARY:
            terms, counts = document_frequencies(self.data.texts).to_arrays()
            return (
                [terms, counts],
                self.data.n_samples,
                {**self.identity_metrics(), DOCUMENTS_KEY: self.data.n_samples},
            )
        vocabulary, idf = parameters
        k_local = self.cfg.params(TextKFedConfig).local_k or self.k
        rows = self.features(vocabulary, idf)
        return kfed_reply(self.uplink, rows, k_local, self.seed, LOCAL_RESTARTS, self.identity_metrics())

    def features(self, vocabulary: np.ndarray, idf: np.ndarray) -> np.ndarray:
        """Dense rows over the shared vocabulary: counts, or TF-IDF when the server sent idf weights."""
        counts = count_matrix(self.data.texts, [str(term) for term in vocabulary])
        rows = tfidf_matrix(counts, idf) if idf.size else counts.astype(np.float64)
        return np.asarray(rows.todense())

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        centres, vocabulary, idf = parameters
        return nearest_centre(self.features(vocabulary, idf), centres)

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        centres, vocabulary, idf = parameters
        rows = self.features(vocabulary, idf)
        return Assignment(*nearest_with_distance(rows, centres), "distance", rows)


class SentenceKFedClient(ClusteringClient):
    """k-FED's local step on the client's sentence embeddings (the encoder FSTC uses)."""

    def embeddings(self) -> np.ndarray:
        """Its sentence embeddings: the space it clusters in (clipped to dp.clip under DP)."""
        params = self.cfg.params(TextKFedConfig)
        cfg = self.cfg
        vectors = local_embeddings(
            self.data, cfg.embedding_model, params.max_length, cfg.device, self.embedding_cache()
        )
        return self.uplink.records(vectors)

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        k_local = int(config.get("local-k", 0)) or self.k
        return kfed_reply(
            self.uplink, self.embeddings(), k_local, self.seed, LOCAL_RESTARTS, self.identity_metrics()
        )

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        return nearest_centre(self.embeddings(), parameters[0])

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        embeddings = self.embeddings()
        # under DP the report clips and noises (or withholds) its statistics itself (clients/base.py)
        space = embeddings
        return Assignment(*nearest_with_distance(embeddings, parameters[0]), "distance", space)
