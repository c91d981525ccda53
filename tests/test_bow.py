"""Tests for the federated bag of words: tokenizer, document frequencies, merge, vocabulary, counts, idf."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

from fedapp.features.bow import (
    BowError,
    DocumentFrequencies,
    Tokenizer,
    count_matrix,
    document_frequencies,
    idf_weights,
    merge_document_frequencies,
    select_vocabulary,
    tfidf_matrix,
)

DOCS = [
    "The cat sat on the mat.",
    "Dogs and cats: the best friends!",
    "A mat for a DOG, a mat for a cat",
    "",
    "Python's regex and élan vital, 42 times",
    "How do I sort a list in Python?",
    "Sorting a LIST of dicts by key in python",
]
# Stop words ("the", "and", "of"), one-letter tokens ("x") and numbers mixed with plain terms.
WORDS = (
    "alpha",
    "beta",
    "gamma",
    "the",
    "and",
    "of",
    "python",
    "java",
    "list",
    "sort",
    "cat",
    "dog",
    "x",
    "7",
    "99",
)


def _random_corpus(rng: random.Random, n_docs: int) -> list[str]:
    """Common words mixed with rare ones (`rare0` ... `rare59`), so document frequencies spread out."""

    def word() -> str:
        chosen = rng.choice(WORDS) if rng.random() < 0.6 else f"rare{rng.randrange(60)}"
        return chosen.upper() if rng.random() < 0.2 else chosen

    return [" ".join(word() for _ in range(rng.randint(0, 12))) for _ in range(n_docs)]


def _split(docs: list[str], rng: random.Random, n_clients: int) -> list[list[str]]:
    owner = [rng.randrange(n_clients) for _ in docs]
    return [[d for d, o in zip(docs, owner, strict=True) if o == c] for c in range(n_clients)]


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_lowercases_and_drops_stop_words_and_one_letter_tokens() -> None:
    assert Tokenizer()("The Cat, a DOG and I sat: 42 x") == ["cat", "dog", "sat", "42"]


def test_tokenizer_matches_scikit_learns_analyzer() -> None:
    analyzer = CountVectorizer(stop_words="english").build_analyzer()
    for doc in DOCS:
        assert Tokenizer()(doc) == analyzer(doc)


def test_tokenizer_options() -> None:
    text = "The Cat sat on a mat"
    assert Tokenizer(stop_words=None)(text) == ["the", "cat", "sat", "on", "mat"]
    assert Tokenizer(stop_words={"cat", "mat"})(text) == ["the", "sat", "on"]
    assert Tokenizer(lowercase=False, stop_words=None)(text) == ["The", "Cat", "sat", "on", "mat"]
    assert Tokenizer(stop_words=None, min_token_length=3)(text) == ["the", "cat", "sat", "mat"]
    assert Tokenizer(token_pattern=r"[a-z]+", stop_words=None)("a-b c") == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"token_pattern": "("}, "not a regular expression"),
        ({"token_pattern": r"(a)(b)"}, "groups"),
        ({"stop_words": "french"}, "stop_words"),
        ({"min_token_length": 0}, "min_token_length"),
    ],
)
def test_tokenizer_rejects_bad_options(options: dict, message: str) -> None:
    with pytest.raises(BowError, match=message):
        Tokenizer(**options)


# --------------------------------------------------------------------------- document frequencies


def test_document_frequencies_count_documents_not_occurrences() -> None:
    df = document_frequencies(["mat mat mat cat", "mat dog", ""])
    assert df.n_documents == 3
    assert df.counts == {"mat": 2, "cat": 1, "dog": 1}


def test_document_frequencies_reject_non_strings() -> None:
    with pytest.raises(BowError, match="document 1 is a int"):
        document_frequencies(["ok", 3])  # type: ignore[list-item]


def test_merge_equals_frequencies_of_the_union() -> None:
    rng = random.Random(0)
    for trial in range(25):
        docs = _random_corpus(rng, rng.randint(1, 40))
        parts = [document_frequencies(client) for client in _split(docs, rng, rng.randint(1, 5))]
        assert merge_document_frequencies(parts) == document_frequencies(docs), f"trial {trial}"


def test_frequencies_survive_the_wire_form() -> None:
    df = document_frequencies(DOCS)
    terms, counts = df.to_arrays()
    assert terms.dtype.kind == "U" and counts.dtype == np.int64
    assert list(terms) == sorted(df.counts)
    assert DocumentFrequencies.from_arrays(terms, counts, df.n_documents) == df


@pytest.mark.parametrize(
    ("terms", "counts", "n", "message"),
    [
        (np.array(["a", "b"]), np.array([1]), 2, "aligned"),
        (np.array(["a", "a"]), np.array([1, 1]), 2, "duplicate"),
        (np.array([1, 2]), np.array([1, 1]), 2, "unicode"),
        (np.array(["a"]), np.array([0.5]), 2, "integers"),
        (np.array(["a"]), np.array([3]), 2, r"not in \[1, 2\]"),
        (np.array(["a"]), np.array([0]), 2, r"not in \[1, 2\]"),
        (np.array([""]), np.array([1]), 2, "non-empty"),
        (np.array(["a"]), np.array([1]), -1, "n_documents"),
    ],
)
def test_malformed_wire_frequencies_are_rejected(terms, counts, n, message) -> None:
    with pytest.raises(BowError, match=message):
        DocumentFrequencies.from_arrays(terms, counts, n)


# --------------------------------------------------------------------------- vocabulary


@pytest.mark.parametrize(
    ("min_df", "max_df"), [(1, 1.0), (2, 1.0), (1, 3), (0.2, 0.5), (2, 0.9), (1, 2), (0.0, 0.25)]
)
def test_vocabulary_matches_scikit_learn_thresholds(min_df, max_df) -> None:
    rng = random.Random(1)
    docs = _random_corpus(rng, 30)
    merged = merge_document_frequencies(document_frequencies(part) for part in _split(docs, rng, 3))
    expected = CountVectorizer(stop_words="english", min_df=min_df, max_df=max_df).fit(docs)
    assert select_vocabulary(merged, min_df=min_df, max_df=max_df) == tuple(expected.get_feature_names_out())


def test_vocabulary_is_sorted_and_max_features_keeps_highest_df_with_alphabetical_ties() -> None:
    df = DocumentFrequencies({"delta": 3, "alpha": 1, "carol": 2, "bravo": 2, "echo": 2}, n_documents=4)
    assert select_vocabulary(df) == ("alpha", "bravo", "carol", "delta", "echo")
    # delta (3) first, then the df-2 tie broken alphabetically: bravo, carol (echo is cut).
    assert select_vocabulary(df, max_features=3) == ("bravo", "carol", "delta")
    # The same frequencies in another insertion order give the same vocabulary.
    shuffled = DocumentFrequencies(dict(reversed(list(df.counts.items()))), n_documents=4)
    assert select_vocabulary(shuffled, max_features=3) == ("bravo", "carol", "delta")
    assert select_vocabulary(df, min_df=2, max_df=2) == ("bravo", "carol", "echo")
    assert select_vocabulary(df, max_df=0.5) == ("alpha", "bravo", "carol", "echo")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_df": 3, "max_df": 2}, "allows fewer documents"),
        ({"min_df": -1}, "min_df"),
        ({"max_df": 1.5}, r"max_df as a fraction"),
        ({"min_df": "2"}, "min_df must be"),
        ({"max_features": 0}, "max_features"),
        ({"min_df": 3}, "no term"),
    ],
)
def test_vocabulary_rejects_bad_thresholds(options: dict, message: str) -> None:
    df = DocumentFrequencies({"a": 1, "b": 2}, n_documents=4)
    with pytest.raises(BowError, match=message):
        select_vocabulary(df, **options)


# --------------------------------------------------------------------------- counts and tf-idf


def test_count_matrix_counts_in_vocabulary_terms_and_drops_the_rest() -> None:
    counts = count_matrix(["mat cat mat zebra", "zebra", "the dog"], ("cat", "dog", "mat"))
    assert counts.format == "csr" and counts.dtype == np.int64
    np.testing.assert_array_equal(counts.toarray(), [[1, 0, 2], [0, 0, 0], [0, 1, 0]])


def test_count_matrix_equals_scikit_learn_for_the_same_vocabulary() -> None:
    rng = random.Random(2)
    docs = _random_corpus(rng, 50) + DOCS
    vocabulary = select_vocabulary(document_frequencies(docs[:20]), max_features=8)
    expected = CountVectorizer(stop_words="english", vocabulary=vocabulary).transform(docs)
    assert (count_matrix(docs, vocabulary) != expected).nnz == 0


def test_count_matrix_rejects_bad_vocabularies() -> None:
    with pytest.raises(BowError, match="duplicate"):
        count_matrix(["a"], ["cat", "cat"])
    with pytest.raises(BowError, match="empty"):
        count_matrix(["a"], [])


def test_idf_and_tfidf_from_merged_frequencies_equal_scikit_learn_on_the_union() -> None:
    rng = random.Random(3)
    docs = _random_corpus(rng, 60) + DOCS
    clients = _split(docs, rng, 4)
    merged = merge_document_frequencies(document_frequencies(c) for c in clients)
    vocabulary = select_vocabulary(merged, min_df=2, max_features=10)
    idf = idf_weights(merged, vocabulary)
    reference = TfidfVectorizer(stop_words="english", vocabulary=vocabulary, smooth_idf=True).fit(docs)
    np.testing.assert_allclose(idf, reference.idf_, rtol=0, atol=1e-12)
    # Each client weights its own documents with the server's idf: rows equal the centralized ones.
    for client in clients:
        ours = tfidf_matrix(count_matrix(client, vocabulary), idf)
        np.testing.assert_allclose(ours.toarray(), reference.transform(client).toarray(), atol=1e-12)
    unsmoothed = TfidfVectorizer(stop_words="english", vocabulary=vocabulary, smooth_idf=False).fit(docs)
    np.testing.assert_allclose(idf_weights(merged, vocabulary, smooth=False), unsmoothed.idf_, atol=1e-12)


def test_idf_of_an_unseen_term() -> None:
    df = DocumentFrequencies({"cat": 2}, n_documents=3)
    np.testing.assert_allclose(idf_weights(df, ["cat", "dog"]), [np.log(4 / 3) + 1, np.log(4) + 1])
    with pytest.raises(BowError, match="df = 0"):
        idf_weights(df, ["cat", "dog"], smooth=False)


def test_tfidf_norms_and_shape_check() -> None:
    counts = count_matrix(["cat cat dog", ""], ["cat", "dog"])
    idf = np.array([1.0, 2.0])
    np.testing.assert_allclose(tfidf_matrix(counts, idf, norm=None).toarray(), [[2, 2], [0, 0]])
    np.testing.assert_allclose(tfidf_matrix(counts, idf, norm="l1").toarray(), [[0.5, 0.5], [0, 0]])
    np.testing.assert_allclose(tfidf_matrix(counts, idf).toarray(), [[2**-0.5, 2**-0.5], [0, 0]])
    with pytest.raises(BowError, match="idf has shape"):
        tfidf_matrix(counts, np.ones(3))
    with pytest.raises(BowError, match="norm"):
        tfidf_matrix(counts, idf, norm="max")
