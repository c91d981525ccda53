"""k-FED / k-means on text features — the FSTC paper's FBOW, FTF-IDF and FSBERT baselines: the keys of
`[tool.flwr.app.config.textkfed]` and what their clients and strategies share.

FBOW / FTF-IDF (`fbow`, `ftfidf`) need a vocabulary that every client uses, built without any text
leaving a client: round 1 each client sends its term document frequencies (`fedapp.features.bow`), the server
sums them and keeps the `vocab-size` most frequent terms that occur in at least `min-df` documents
(plus their idf for TF-IDF); round 2 each client sends k-FED's local k-means centres of its count or
TF-IDF rows, and the server clusters them. FSBERT-kFED (`fsbert-kfed`) is k-FED on the sentence
embeddings (one round); FSBERT (`fsbert`) is the paper's centralized k-means on those embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key

PHASE_VOCABULARY = "vocabulary"
PHASE_CENTRES = "local-centres"
DOCUMENTS_KEY = "n-documents"  # fit metrics of the vocabulary round: the client's document count


@dataclass(frozen=True)
class TextKFedConfig(ConfigSection):
    local_k: int = config_key(0, ge=0, doc="local k-means centres k' per client; 0 = k")
    vocab_size: int = config_key(
        2000, ge=1, doc="FBOW/FTF-IDF: keep this many terms by merged document frequency"
    )
    min_df: int = config_key(2, ge=1, doc="FBOW/FTF-IDF: a term must occur in at least this many documents")
    max_length: int = config_key(32, ge=1, doc="FSBERT: encoder input length in tokens (as FSTC's)")
