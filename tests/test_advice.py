"""`fedapp methods --for DATA`: the data's kind decides which methods apply, the measured site skew (FSTC's
own measure) which one the tables favour; label-skewed sites read as skewed, IID sites do not."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedapp.datasets import load_dataset
from fedapp.features.embeddings import CACHE_DIR_ENV
from fedapp.maths.fstc import SITE_SKEW_WARNING
from simulation.__main__ import main
from simulation.advice import advise


def test_label_skew_is_measured_and_iid_is_not() -> None:
    iid = advise("digits", {"num-clients": 4})
    skewed = advise("digits", {"num-clients": 4, "partition": "dirichlet", "alpha": 0.1})
    assert iid.kind == "images" and "ccfc" in iid.applicable and "fstc" not in iid.applicable
    assert sum(iid.records) == sum(skewed.records) == 1797
    assert iid.skew is not None and skewed.skew is not None
    assert max(iid.skew) < SITE_SKEW_WARNING < min(skewed.skew)


def test_texts_favour_fstc_on_alike_sites(text_embedding_cache: None) -> None:
    advice = advise("texts-demo", {"num-clients": 2})
    assert advice.kind == "texts" and "fsbert-kfed" in advice.applicable and "kfed" not in advice.applicable
    assert advice.skew is not None and max(advice.skew) < SITE_SKEW_WARNING
    assert advice.favoured[0][0] == "fstc"
    text = advice.render()
    assert "sites look alike" in text and "docs/methods/fstc.md" in text


def test_the_command_prints_the_advice(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["methods", "--for", "digits", "--clients", "3", "--partition", "dirichlet", "--set", "alpha=0.1"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "data: images, 3 sites" in out and "sites hold different clusters" in out


def test_advice_on_own_texts_writes_nothing_and_one_site_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An advisory command on a user's own texts leaves no embeddings (derived from their records) in the
    working directory or anywhere else; one site is a horizontal question with no skew to measure."""
    texts = load_dataset("texts-demo").texts
    assert texts is not None
    site = tmp_path / "site.csv"
    pd.DataFrame({"id": [f"r{i}" for i in range(60)], "text": texts[:60]}).to_csv(site, index=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "user-cache"))  # nor in the user cache
    one = advise(f"csv:{site}", {"num-clients": 1})
    assert one.records == [60] and one.skew is None
    assert "1 site, 60 records" in one.render() and "site skew: not measured (one site)" in one.render()
    two = advise(f"csv:{site}", {"num-clients": 2})
    assert two.records == [30, 30] and two.skew is not None and len(two.skew) == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["site.csv", "work"]


def test_skew_on_unlabelled_sites_is_measured_at_the_k_a_run_would_choose(tmp_path: Path) -> None:
    """Site skew depends on k: on three alike unlabelled sites of 3 blobs, a fixed k = 10 cuts each blob
    into pieces the sites share unevenly; the advice measures at the k a k = 0 run chooses and says so."""
    from tests.test_own_data import _vector_sites

    _vector_sites(tmp_path)
    keys = {"num-clients": 3, "id-column": "id"}
    advice = advise(f"csv:{tmp_path}/site-{{partition-id}}.csv", keys)
    assert "k = 3 (chosen without labels" in advice.k_used
    fixed = advise(f"csv:{tmp_path}/site-{{partition-id}}.csv", {**keys, "k": 10})
    assert advice.skew is not None and fixed.skew is not None and fixed.k_used == "k = 10 (given)"
    assert max(advice.skew) < SITE_SKEW_WARNING and max(advice.skew) < max(fixed.skew)
