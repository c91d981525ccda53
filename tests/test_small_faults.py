"""Small faults a careful user meets: `predict` on records of another width or kind, a table's `id` column
taken for record ids without id-column, the `--partition` help, and a bad flag after a command."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedapp.datasets.sources as sources
from fedapp.datasets import Columns, load_dataset
from simulation.__main__ import main


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A k-FED model of digits: images 1x8x8 (64 pixels)."""
    out = tmp_path_factory.mktemp("digits-model")
    argv = ["run", "--method", "kfed", "--dataset", "digits", "--clients", "2", "--engine", "inprocess"]
    assert main([*argv, "--out", str(out), "--overwrite"]) == 0
    return out


def test_predict_names_both_widths_and_refuses_records_of_another_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], digits_model: Path
) -> None:
    rng = np.random.default_rng(0)
    sites = tmp_path / "sites"
    sites.mkdir()
    for site in range(2):
        pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "c"]).to_csv(
            sites / f"s{site}.csv", index=False
        )
    vectors = tmp_path / "vectors"
    argv = ["run", "--method", "kfed", "--dataset", f"csv:{sites}/s{{partition-id}}.csv", "--clients", "2"]
    assert main([*argv, "--set", "k=2", "--engine", "inprocess", "--out", str(vectors)]) == 0
    np.save(tmp_path / "wide.npy", rng.normal(size=(10, 5)))
    np.save(tmp_path / "pixels.npy", rng.random((10, 64)))  # as wide as digits' images
    predict = ["predict", "--out", str(tmp_path / "p.csv"), "--model"]

    err = _one_line_error(capsys, [*predict, str(vectors), "--dataset", f"npy:{tmp_path}/wide.npy"])
    assert "has 5 features per record, the model's centres have 3" in err
    err = _one_line_error(capsys, [*predict, str(digits_model), "--dataset", f"npy:{tmp_path}/pixels.npy"])
    assert "gives vectors, the model was trained on images (digits)" in err
    assert not (tmp_path / "p.csv").exists()
    assert main([*predict, str(vectors), "--dataset", f"csv:{sites}/s0.csv"]) == 0  # same kind, same width


def test_a_tables_id_column_gives_the_record_ids_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sources, "_DEFAULT_ID_SAID", [])
    for site in range(2):
        frame = pd.DataFrame({"id": [10 + i for i in range(4)], "x": [0.5 * i for i in range(4)]})
        frame.to_csv(tmp_path / f"site-{site}.csv", index=False)
    with caplog.at_level(logging.INFO, logger="flwr"):
        first = load_dataset(f"csv:{tmp_path}/site-0.csv")
        load_dataset(f"csv:{tmp_path}/site-1.csv")
    assert list(first.ids or []) == ["10", "11", "12", "13"]
    assert first.features is not None and first.features.shape == (4, 1)  # the id column is no feature
    said = [r.getMessage() for r in caplog.records if "record ids from its 'id' column" in r.getMessage()]
    assert said == [f"{tmp_path}/site-0.csv: record ids from its 'id' column (no id-column set)"]
    chosen = load_dataset(f"csv:{tmp_path}/site-0.csv", columns=Columns(features=("id", "x")))
    assert list(chosen.ids or []) == ["0", "1", "2", "3"] and chosen.features.shape == (
        4,
        2,
    )  # named a feature: kept


def test_the_partition_help_names_every_scheme(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside "by-group"
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    partition_help = help_text[help_text.index("  --partition PARTITION") :].split("\n  -")[0]
    for scheme in ("iid", "p-hetero", "size-ratio", "dirichlet", "by-group", "vertical"):
        assert scheme in partition_help


def test_a_bad_flag_after_a_command_prints_that_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--metod", "kfed", "--out", "x"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert " run [-h]" in err.splitlines()[0] and "--dry-run" in err  # run's usage, not the top level's
    assert err.strip().splitlines()[-1].endswith("unrecognized argument: --metod (did you mean --method?)")
    with pytest.raises(SystemExit):
        main(["predict", "--model", "m", "--dataset", "npy:x", "--out", "y", "--verbose"])
    err = capsys.readouterr().err
    assert " predict [-h]" in err and err.strip().endswith("unrecognized argument: --verbose")
    with pytest.raises(SystemExit):
        main(["--verbose", "run", "--method", "kfed", "--out", "x"])
    assert "{run,tune,experiment," in capsys.readouterr().err  # a flag before the command: the top level's
