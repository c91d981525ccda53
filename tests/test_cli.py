"""The `fedapp` command: version, subcommands, and `--dry-run` (checks everything, starts nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulation.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
FEDAPP = Path(sys.executable).parent / "fedapp"


@pytest.mark.skipif(not FEDAPP.exists(), reason="the console script is installed by scripts/setup.sh")
def test_the_console_script_prints_versions_and_runs_the_same_code() -> None:
    version = subprocess.run([str(FEDAPP), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("fedapp ") and "flwr 1." in version.stdout
    listing = subprocess.run([str(FEDAPP), "--help"], capture_output=True, text=True, timeout=60)
    for command in ("run", "experiment", "deploy", "predict", "datasets", "methods", "stop-local-superlink"):
        assert command in listing.stdout


def test_a_dry_run_checks_and_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a" / "b"
    assert (
        main(
            [
                "run",
                "--method",
                "kfed",
                "--dataset",
                "digits",
                "--clients",
                "3",
                "--out",
                str(out),
                "--dry-run",
            ]
        )
        == 0
    )
    assert "all checks passed" in capsys.readouterr().out and not (tmp_path / "a").exists()


def test_a_dry_run_fails_on_what_a_run_would_fail_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    code = main(["run", "--method", "kfed", "--dataset", missing, "--clients", "2", "--set", "k=2"]
                + ["--out", str(tmp_path / "o"), "--dry-run"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "client 0" in err and "site-0.csv" in err
    code = main(
        [
            "run",
            "--method",
            "kfed",
            "--dataset",
            "digits",
            "--set",
            "k=5000",
            "--out",
            str(tmp_path),
            "--dry-run",
        ]
    )
    assert code == 2 and "k=5000" in capsys.readouterr().err


def test_deploy_and_experiment_dry_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["deploy", "--method", "kfed", "--dataset", "digits", "--out", str(tmp_path / "d"), "--dry-run"])
        == 0
    )
    node_data = f"csv:{tmp_path}/site-{{partition-id}}.csv"  # the nodes' files are theirs to check
    assert (
        main(
            [
                "deploy",
                "--method",
                "kfed",
                "--node-data",
                node_data,
                "--set",
                "k=2",
                "--out",
                str(tmp_path),
                "--dry-run",
            ]
        )
        == 0
    )
    experiment = tmp_path / "e.toml"
    experiment.write_text(
        '[experiment]\nname = "e"\nseeds = [0, 1]\n[defaults]\ndataset = "digits"\n'
        '[[runs]]\nlabel = "k-FED"\nmethod = "kfed"\n[[runs]]\nlabel = "FFCM"\nmethod = "ffcm"\n'
    )
    assert main(["experiment", str(experiment), "--out", str(tmp_path / "x"), "--dry-run"]) == 0
    assert "4 run(s)" in capsys.readouterr().out and not (tmp_path / "x").exists()
