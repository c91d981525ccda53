"""Bag of words for federated topic models and TF-IDF baselines, built without any text leaving a client.

The protocol (gFedNTM's vocabulary consensus; FSTC's FBOW / FTF-IDF baselines):

1. each client tokenizes its documents and sends `document_frequencies(texts)`: for every term, the
   number of its documents that contain it, plus its document count (`DocumentFrequencies.to_arrays`
   gives the wire form);
2. the server sums them (`merge_document_frequencies`: exactly the document frequencies of the union of
   the clients' corpora, since every document lives on one client), keeps the terms that pass `min_df`,
   `max_df` and `max_features` (`select_vocabulary`), and may compute the idf (`idf_weights`);
3. it broadcasts the sorted vocabulary (and idf); each client maps its documents to counts
   (`count_matrix`) and, for TF-IDF, weights them (`tfidf_matrix`).

Tokenization follows scikit-learn's `CountVectorizer` defaults (lowercase, token pattern
``(?u)\\b\\w\\w+\\b``, its English stop-word list), so the results equal scikit-learn's on the union of
the corpora for the same vocabulary (the tests check it). One difference: `max_features` ranks terms by
merged document frequency (what clients send), not by total count as scikit-learn does.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse

TOKEN_PATTERN = r"(?u)\b\w\w+\b"  # scikit-learn's default: runs of 2+ word characters


class BowError(ValueError):
    """Texts, frequencies or vocabulary options that cannot make a bag of words."""


@dataclass(frozen=True)
class Tokenizer:
    """Text -> list of terms: lowercase, `token_pattern` matches, stop words and short tokens dropped.

    `stop_words` is "english" (scikit-learn's list), None, or a collection of (lowercase) words.
    `min_token_length` drops shorter tokens on top of what the pattern allows.
    """

    lowercase: bool = True
    token_pattern: str = TOKEN_PATTERN
    stop_words: str | Collection[str] | None = "english"
    min_token_length: int = 1
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _stop: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            pattern = re.compile(self.token_pattern)
        except re.error as exc:
            raise BowError(
                f"token_pattern {self.token_pattern!r} is not a regular expression: {exc}"
            ) from None
        if pattern.groups > 1:
            raise BowError(f"token_pattern {self.token_pattern!r} has {pattern.groups} groups; at most 1")
        if isinstance(self.stop_words, str):
            if self.stop_words != "english":
                raise BowError(f"stop_words must be 'english', None or a collection, got {self.stop_words!r}")
            # lazily, as `fedapp.maths.clustering` imports scikit-learn (why there)
            from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

            stop = frozenset(ENGLISH_STOP_WORDS)
        else:
            stop = frozenset(self.stop_words or ())
        if not isinstance(self.min_token_length, int) or self.min_token_length < 1:
            raise BowError(f"min_token_length must be a positive integer, got {self.min_token_length!r}")
        object.__setattr__(self, "_pattern", pattern)
        object.__setattr__(self, "_stop", stop)

    def __call__(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        return [
            token
            for token in self._pattern.findall(text)
            if len(token) >= self.min_token_length and token not in self._stop
        ]


@dataclass(frozen=True)
class DocumentFrequencies:
    """Per-term document counts of one corpus (a client's, or the merge of several) and its size."""

    counts: dict[str, int]  # term -> number of documents that contain it (>= 1, <= n_documents)
    n_documents: int

    def __post_init__(self) -> None:
        if not isinstance(self.n_documents, int | np.integer) or self.n_documents < 0:
            raise BowError(f"n_documents must be a non-negative integer, got {self.n_documents!r}")
        for term, count in self.counts.items():
            if not isinstance(term, str) or not term:
                raise BowError(f"terms must be non-empty strings, got {term!r}")
            if not isinstance(count, int | np.integer) or not 1 <= count <= self.n_documents:
                raise BowError(f"term {term!r}: document frequency {count!r} not in [1, {self.n_documents}]")

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Wire form: terms (NumPy unicode, sorted) and their counts (int64); send `n_documents` alongside."""
        terms = sorted(self.counts)
        return np.array(terms, dtype=np.str_), np.array([self.counts[t] for t in terms], dtype=np.int64)

    @classmethod
    def from_arrays(cls, terms: np.ndarray, counts: np.ndarray, n_documents: int) -> DocumentFrequencies:
        """Rebuild (and validate) what `to_arrays` sent: 1-d, aligned, unique terms, counts in range."""
        terms, counts = np.asarray(terms), np.asarray(counts)
        if terms.ndim != 1 or counts.ndim != 1 or terms.shape != counts.shape:
            raise BowError(f"terms {terms.shape} and counts {counts.shape} must be 1-d and aligned")
        if terms.size and terms.dtype.kind != "U":
            raise BowError(f"terms must be a unicode array, got dtype {terms.dtype}")
        if counts.size and counts.dtype.kind not in "iu":
            raise BowError(f"counts must be integers, got dtype {counts.dtype}")
        as_dict = {str(t): int(c) for t, c in zip(terms.tolist(), counts.tolist(), strict=True)}
        if len(as_dict) != terms.size:
            raise BowError(f"{terms.size - len(as_dict)} duplicate terms")
        return cls(as_dict, int(n_documents))


def document_frequencies(texts: Iterable[str], tokenizer: Tokenizer | None = None) -> DocumentFrequencies:
    """Client side: how many of `texts` contain each term (the only thing about its texts a client sends)."""
    tokenizer = tokenizer or Tokenizer()
    counts: Counter[str] = Counter()
    n_documents = 0
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise BowError(f"document {index} is a {type(text).__name__}, not a string")
        counts.update(set(tokenizer(text)))
        n_documents += 1
    return DocumentFrequencies(dict(counts), n_documents)


def merge_document_frequencies(parts: Iterable[DocumentFrequencies]) -> DocumentFrequencies:
    """Server side: sum the clients' frequencies and document counts = the frequencies of the union."""
    counts: Counter[str] = Counter()
    n_documents = 0
    for part in parts:
        counts.update(part.counts)
        n_documents += part.n_documents
    return DocumentFrequencies(dict(counts), n_documents)


def _df_threshold(value: float, n_documents: int, name: str) -> float:
    """An absolute document count (int >= 0) or a fraction of all documents (float in [0, 1])."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BowError(f"{name} must be an int (documents) or a float in [0, 1] (fraction), got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise BowError(f"{name} must be >= 0 documents, got {value}")
        return value
    if not 0.0 <= value <= 1.0:
        raise BowError(f"{name} as a fraction must lie in [0, 1], got {value}")
    return value * n_documents


def select_vocabulary(
    frequencies: DocumentFrequencies,
    *,
    min_df: int | float = 1,
    max_df: int | float = 1.0,
    max_features: int | None = None,
) -> tuple[str, ...]:
    """Server side: the sorted vocabulary of terms with min_df <= df <= max_df, capped at `max_features`.

    Thresholds follow scikit-learn: an int counts documents, a float is a fraction of all documents
    (so max_df=1 means "in at most one document", max_df=1.0 "in any number"). `max_features` keeps the
    terms with the highest merged df, ties broken by the term in alphabetical order, so every server
    and every run picks the same vocabulary.
    """
    n = frequencies.n_documents
    low = _df_threshold(min_df, n, "min_df")
    high = _df_threshold(max_df, n, "max_df")
    if low > high:
        raise BowError(f"max_df ({max_df}) allows fewer documents than min_df ({min_df}) requires")
    if max_features is not None and (not isinstance(max_features, int) or max_features < 1):
        raise BowError(f"max_features must be a positive integer or None, got {max_features!r}")
    kept = [(term, df) for term, df in frequencies.counts.items() if low <= df <= high]
    if max_features is not None and len(kept) > max_features:
        kept = sorted(kept, key=lambda item: (-item[1], item[0]))[:max_features]
    if not kept:
        raise BowError(f"no term has a document frequency in [{min_df}, {max_df}] of {n} documents")
    return tuple(sorted(term for term, _ in kept))


def _check_vocabulary(vocabulary: Sequence[str]) -> dict[str, int]:
    index = {term: column for column, term in enumerate(vocabulary)}
    if len(index) != len(vocabulary):
        raise BowError(f"the vocabulary holds {len(vocabulary) - len(index)} duplicate terms")
    if not index:
        raise BowError("the vocabulary is empty")
    return index


def count_matrix(
    texts: Iterable[str], vocabulary: Sequence[str], tokenizer: Tokenizer | None = None
) -> scipy.sparse.csr_matrix:
    """Client side: documents x vocabulary term counts (int64 CSR); out-of-vocabulary terms are dropped."""
    tokenizer = tokenizer or Tokenizer()
    column_of = _check_vocabulary(vocabulary)
    indptr, indices, values = [0], [], []
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise BowError(f"document {index} is a {type(text).__name__}, not a string")
        row = Counter(column_of[t] for t in tokenizer(text) if t in column_of)
        for column in sorted(row):
            indices.append(column)
            values.append(row[column])
        indptr.append(len(indices))
    arrays = (np.array(values, dtype=np.int64), np.array(indices, dtype=np.int64), np.array(indptr))
    return scipy.sparse.csr_matrix(arrays, shape=(len(indptr) - 1, len(column_of)))


def idf_weights(
    frequencies: DocumentFrequencies, vocabulary: Sequence[str], *, smooth: bool = True
) -> np.ndarray:
    """Server side: inverse document frequency of each vocabulary term, from merged frequencies.

    smooth: idf = ln((1 + n) / (1 + df)) + 1 (as if one extra document held every term); otherwise
    idf = ln(n / df) + 1 - scikit-learn's `TfidfTransformer` definitions. A term no client holds has
    df = 0, which only the smooth form allows.
    """
    _check_vocabulary(vocabulary)
    df = np.array([frequencies.counts.get(term, 0) for term in vocabulary], dtype=np.float64)
    n = float(frequencies.n_documents)
    if smooth:
        return np.log((1.0 + n) / (1.0 + df)) + 1.0
    if np.any(df == 0):
        missing = [t for t, d in zip(vocabulary, df, strict=True) if d == 0][:5]
        raise BowError(f"unsmoothed idf needs every term in some document; df = 0 for {missing}")
    return np.log(n / df) + 1.0


def tfidf_matrix(
    counts: scipy.sparse.spmatrix | np.ndarray, idf: np.ndarray, *, norm: str | None = "l2"
) -> scipy.sparse.csr_matrix:
    """Client side: counts x idf per column, rows scaled to unit `norm` ("l2", "l1" or None), float64 CSR."""
    counts = scipy.sparse.csr_matrix(counts, dtype=np.float64)
    idf = np.asarray(idf, dtype=np.float64)
    if idf.shape != (counts.shape[1],):
        raise BowError(f"idf has shape {idf.shape}, expected ({counts.shape[1]},) for the vocabulary")
    if norm not in ("l2", "l1", None):
        raise BowError(f"norm must be 'l2', 'l1' or None, got {norm!r}")
    from sklearn.preprocessing import normalize  # lazily: `fedapp.maths.clustering` says why

    weighted = scipy.sparse.csr_matrix(counts @ scipy.sparse.diags(idf))
    return weighted if norm is None else normalize(weighted, norm=norm)  # all-zero rows stay zero
