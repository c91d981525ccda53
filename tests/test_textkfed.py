"""FBOW / FTF-IDF / FSBERT baselines: the vocabulary round with mocked replies, then runs on `texts-demo`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy
from sklearn.feature_extraction.text import TfidfVectorizer

from fedapp.config.run import parse_run_config
from fedapp.features.bow import document_frequencies
from fedapp.launch.resolve import build_overrides
from simulation.runner import execute
from strategies.textkfed import BagOfWordsKFedStrategy, TfIdfKFedStrategy
from tests.flower_mocks import mock_manager, mock_proxy

CLIENT_TEXTS = [
    ["python list sort", "python dict keys", "football goal league"],
    ["football referee goal", "python pandas dataframe", "cake oven sugar"],
]


def _df_reply(cid: str, pid: int, texts: list[str], **metrics: Any) -> tuple[ClientProxy, FitRes]:
    terms, counts = document_frequencies(texts).to_arrays()
    metrics = {"partition-id": pid, "k": 2, "n-documents": len(texts), **metrics}
    return mock_proxy(cid), FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters([terms, counts]), len(texts), metrics
    )


def _strategy(
    tmp_path: Path, method: str, cls: type[BagOfWordsKFedStrategy], **keys: Any
) -> BagOfWordsKFedStrategy:
    cfg = parse_run_config(
        {"method": method, "dataset": "texts-demo", "out-dir": str(tmp_path), "k": 2, **keys}
    )
    return cls(cfg)


def test_vocabulary_round_merges_document_frequencies_and_idf(tmp_path: Path) -> None:
    strategy = _strategy(tmp_path, "ftfidf", TfIdfKFedStrategy, **{"textkfed.min-df": 2})
    replies = [
        _df_reply(cid, pid, texts)
        for cid, pid, texts in (("a", 0, CLIENT_TEXTS[0]), ("b", 1, CLIENT_TEXTS[1]))
    ]
    parameters, stats = strategy.aggregate_fit(1, replies, [])
    assert stats["accepted"] == 2 and parameters_to_ndarrays(parameters) == []
    assert strategy.vocabulary is not None
    assert list(strategy.vocabulary) == ["football", "goal", "python"]  # df >= 2 over the union
    reference = TfidfVectorizer(vocabulary=list(strategy.vocabulary)).fit(CLIENT_TEXTS[0] + CLIENT_TEXTS[1])
    np.testing.assert_allclose(strategy.idf, reference.idf_)
    ins = strategy.configure_fit(2, parameters, mock_manager(["a", "b"]))[0][1]
    vocabulary, idf = parameters_to_ndarrays(ins.parameters)
    assert ins.config["phase"] == "local-centres" and list(vocabulary) == list(strategy.vocabulary)


def test_fbow_sends_no_idf_and_caps_the_vocabulary(tmp_path: Path) -> None:
    strategy = _strategy(
        tmp_path, "fbow", BagOfWordsKFedStrategy, **{"textkfed.min-df": 1, "textkfed.vocab-size": 2}
    )
    replies = [_df_reply("a", 0, CLIENT_TEXTS[0]), _df_reply("b", 1, CLIENT_TEXTS[1])]
    strategy.aggregate_fit(1, replies, [])
    assert list(strategy.vocabulary) == ["goal", "python"] or list(strategy.vocabulary) == [
        "football",
        "python",
    ]
    assert strategy.idf.size == 0


@pytest.mark.parametrize(
    ("metrics", "arrays", "reason"),
    [
        ({"n-documents": 1}, None, "document frequency"),  # 'alpha' is in 2 of the claimed 1 documents
        ({}, None, "n-documents"),
        ({"n-documents": 3}, [np.array(["a", "a"]), np.array([1, 1])], "duplicate"),
        ({"n-documents": 3}, [np.array(["a"]), np.array([1.5])], "dtype"),
    ],
)
def test_malformed_frequency_replies_are_rejected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, metrics: dict[str, Any], arrays: Any, reason: str
) -> None:
    strategy = _strategy(tmp_path, "fbow", BagOfWordsKFedStrategy, **{"textkfed.min-df": 1})
    proxy, res = _df_reply("bad", 7, ["alpha beta", "alpha gamma"])
    res.metrics = {"partition-id": 7, "k": 2, **metrics}
    if arrays is not None:
        res.parameters = ndarrays_to_parameters(arrays)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, stats = strategy.aggregate_fit(1, [_df_reply("a", 0, CLIENT_TEXTS[0]), (proxy, res)], [])
    assert stats["accepted"] == 1 and stats["rejected"] == 1
    assert "node bad" in caplog.text and reason in caplog.text  # no valid reply yet: its node id


@pytest.mark.usefixtures("text_embedding_cache")
@pytest.mark.parametrize("method", ["fbow", "ftfidf", "fsbert-kfed", "fsbert"])
def test_text_baselines_run_on_the_demo_texts(tmp_path: Path, method: str) -> None:
    overrides = {"method": method, "dataset": "texts-demo", "num-clients": 2, "seed": 0}
    summary = execute(build_overrides(overrides, tmp_path / method), engine="inprocess", quiet=True)
    assert set(summary["metrics"]) >= {"acc", "nmi"}
    assert summary["metrics"]["acc"] >= (0.3 if method == "fbow" else 0.9)
