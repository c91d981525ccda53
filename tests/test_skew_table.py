"""The real-data-shapes table's rule check: per row and per variant against FSBERT k-FED."""

from pathlib import Path

import pytest

from simulation.papers.fstc.skew_table import main, render, rule_tally


def runs(*nmis: float) -> list[dict[str, float]]:
    return [{"acc": 50.0, "nmi": nmi} for nmi in nmis]


TABLE = {
    "A": {"FSBERT k-FED": runs(70.0, 72.0), "FSTC uniform": runs(70.2), "FSTC-STC": runs(69.5, 68.0)},
    "B": {"FSBERT k-FED": runs(50.0), "FSTC uniform": runs(40.0), "FSTC-STC": runs(55.0)},
    "C": {"FSBERT k-FED": [], "FSTC uniform": runs(10.0), "FSTC-STC": []},
}


def test_rule_tally_counts_rows_within_one_nmi_of_the_baseline() -> None:
    # A: baseline 71.0, uniform 70.2 (held), STC 68.75 (missed); B: uniform missed, STC held; C: no baseline
    assert rule_tally(TABLE) == {"FSTC uniform": (1, 2), "FSTC-STC": (1, 2)}


def test_render_marks_each_row_and_prints_the_tally() -> None:
    text = render(TABLE)
    assert "| A |" in text and "-0.80 ✓" in text
    assert "| B |" in text and "-10.00 ✗" in text
    assert "FSTC uniform 1/2; FSTC-STC 1/2." in text


def test_a_missing_or_empty_output_root_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for root, problem in ((tmp_path / "absent", "is not a directory"), (tmp_path, "no finished run")):
        with pytest.raises(SystemExit) as stop:
            main([str(root)])
        assert stop.value.code == 2
        assert problem in capsys.readouterr().err
