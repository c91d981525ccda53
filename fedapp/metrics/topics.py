"""Topic-model metrics: the gFedNTM paper's TSS / DSS (Eq. 4-6), NPMI coherence, topic diversity, and
the topic coverage of Sec. 4.2 (average minimum word mover's distance between topic descriptions).

All similarities use the Bhattacharyya coefficient sqrt(p)^T sqrt(q) = 1 - H^2(p, q) (Eq. 4).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import softmax

DSS_BLOCK = 1024  # rows of the D x D similarity matrices held at once


def topic_similarity_score(learned: np.ndarray, true: np.ndarray) -> float:
    """Eq. 6: sum over true topics of the best Bhattacharyya coefficient with any learned topic (max K)."""
    _check_rows_sum_to_one(learned, "learned topics")
    _check_rows_sum_to_one(true, "true topics")
    if learned.shape[1] != true.shape[1]:
        raise ValueError(f"learned topics span {learned.shape[1]} terms, true topics {true.shape[1]}")
    similarity = np.sqrt(learned) @ np.sqrt(true).T  # K_learned x K_true
    return float(similarity.max(axis=0).sum())


def document_similarity_score(theta_true: np.ndarray, theta_inferred: np.ndarray) -> float:
    """Eq. 5: sum_ij |w_ij(true) - w_ij(inferred)| / D with w = sqrt(theta) sqrt(theta)^T (lower is better).

    The diagonal contributes |1 - 1| = 0, so summing over i != j (the paper) or all pairs (the authors'
    code) is the same. Computed in row blocks (D x D matrices of 5,000 documents are 200 MB each).
    """
    if theta_true.shape[0] != theta_inferred.shape[0]:
        raise ValueError(f"{theta_true.shape[0]} true and {theta_inferred.shape[0]} inferred documents")
    root_true, root_inferred = np.sqrt(theta_true), np.sqrt(theta_inferred)
    total = 0.0
    for start in range(0, root_true.shape[0], DSS_BLOCK):
        block = slice(start, start + DSS_BLOCK)
        total += np.abs(root_true[block] @ root_true.T - root_inferred[block] @ root_inferred.T).sum()
    return float(total / theta_true.shape[0])


def to_full_vocabulary(topic_word: np.ndarray, columns: np.ndarray, full_size: int) -> np.ndarray:
    """Topics over a learned vocabulary -> over the generator's V terms (`columns[j]` = term of column j);
    terms the model never saw get probability 0, rows renormalised (the authors' mapping)."""
    full = np.zeros((topic_word.shape[0], full_size))
    full[:, columns] = topic_word
    return full / full.sum(axis=1, keepdims=True)


def reference_double_softmax(beta: np.ndarray) -> np.ndarray:
    """What the authors' TSS evaluation scored: softmax applied twice to beta.

    Their `run_simulation.py` softmaxes `get_topic_word_distribution()`, which is already a softmax; the
    second softmax of values in [0, 1] flattens every topic towards uniform. Reported beside our TSS
    only to compare with their figures.
    """
    return softmax(softmax(beta, axis=1), axis=1)


def npmi_from_cooccurrence(cooccurrence: np.ndarray, n_documents: int) -> np.ndarray:
    """Per-topic mean NPMI of its top words from K x T x T document co-occurrence counts (diagonal = df).

    NPMI(i, j) = log(P(i, j) / (P(i) P(j))) / -log P(i, j) with document probabilities; word pairs that
    never co-occur score -1 (its limit). The counts are sums of the clients' counts, so the score is
    exactly the one computed on the union corpus.
    """
    counts = np.asarray(cooccurrence, dtype=np.float64)
    if counts.ndim != 3 or counts.shape[1] != counts.shape[2] or counts.shape[1] < 2:
        raise ValueError(f"co-occurrence must be K x T x T with T >= 2, got shape {counts.shape}")
    if n_documents < 1:
        raise ValueError(f"n_documents must be >= 1, got {n_documents}")
    probability = counts / n_documents
    marginal = np.diagonal(probability, axis1=1, axis2=2)  # K x T
    upper = np.triu_indices(counts.shape[1], k=1)
    joint = probability[:, upper[0], upper[1]]
    product = marginal[:, upper[0]] * marginal[:, upper[1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        npmi = np.log(joint / product) / -np.log(joint)
    npmi = np.where(joint > 0, npmi, -1.0)
    npmi = np.where(joint >= 1.0, 1.0, npmi)  # both words in every document: perfectly associated
    return npmi.mean(axis=1)


def topic_diversity(top_words: np.ndarray) -> float:
    """Share of distinct words among all topics' top words (Dieng et al. 2020; top-25 by convention)."""
    return float(np.unique(top_words).size / top_words.size)


def word_movers_distance(first: Sequence[int], second: Sequence[int], word_vectors: np.ndarray) -> float:
    """WMD between two equally long topic descriptions with uniform word weights.

    With equal masses on equally many words, an optimal transport plan is a permutation (Birkhoff), so
    the earth mover's distance is the mean cost of the optimal assignment. Cost: Euclidean distance of
    unit-normalised word vectors.
    """
    if len(first) != len(second):
        raise ValueError(f"descriptions of {len(first)} and {len(second)} words")
    a, b = word_vectors[list(first)], word_vectors[list(second)]
    cost = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=2)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def average_minimum_wmd(
    reference_topics: np.ndarray, evaluated_topics: np.ndarray, word_vectors: np.ndarray
) -> float:
    """Eq. 7 (AMWMD): sum over the reference model's topics of the WMD to the closest evaluated topic.

    Topics are rows of word indices into `word_vectors` (one shared vocabulary). Lower = the evaluated
    model covers the reference's topics better; 0 when it contains them all.
    """
    vectors = word_vectors / np.linalg.norm(word_vectors, axis=1, keepdims=True)
    return float(
        sum(
            min(word_movers_distance(reference, evaluated, vectors) for evaluated in evaluated_topics)
            for reference in reference_topics
        )
    )


def _check_rows_sum_to_one(matrix: np.ndarray, name: str) -> None:
    if matrix.ndim != 2 or np.any(matrix < 0) or not np.allclose(matrix.sum(axis=1), 1.0, atol=1e-6):
        raise ValueError(f"{name} must be rows of probabilities summing to 1 (shape {matrix.shape})")
