"""`fedapp methods --for DATA`: the data's kind decides which methods apply, the measured site skew (FSTC's
own measure) which one the tables favour; label-skewed sites read as skewed, IID sites do not."""

from __future__ import annotations

import pytest

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
