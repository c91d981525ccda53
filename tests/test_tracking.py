"""--track mlflow: refused in one line before anything starts when MLflow is absent; otherwise each run's
parameters, per-round metrics, status and artifacts land in MLflow's store (read back through MLflow's
client API), an experiment's runs under one MLflow experiment, and nothing in the current directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulation.__main__ import main
from simulation.tracking import STORE_FILE, STORE_FOLDER, store


def _experiment_file(tmp_path: Path) -> Path:
    path = tmp_path / "e.toml"
    path.write_text(
        '[experiment]\nname = "tracked"\nseeds = [0, 1]\nengine = "inprocess"\nmetrics = ["nmi"]\n'
        '[defaults]\ndataset = "digits"\nnum-clients = 2\n[[runs]]\nlabel = "k-FED"\nmethod = "kfed"\n'
    )
    return path


def test_without_mlflow_the_flag_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an environment without the extra sees
    out = tmp_path / "run"
    argv = ["run", "--method", "kfed", "--dataset", "digits", "--engine", "inprocess", "--out", str(out)]
    assert main([*argv, "--track", "mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fedapp[track]" in err and "MLflow" in err, err
    assert not out.exists()  # nothing started, nothing written
    assert (
        main(
            ["experiment", str(_experiment_file(tmp_path)), "--out", str(tmp_path / "e"), "--track", "mlflow"]
        )
        == 2
    )
    assert "fedapp[track]" in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_the_store_is_mlflows_own_when_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert store(tmp_path) == ("http://127.0.0.1:5000", None)
    assert not (tmp_path / STORE_FOLDER).exists()
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    uri, artifacts = store(tmp_path / "results")
    assert uri == f"sqlite:///{(tmp_path / 'results' / STORE_FOLDER / STORE_FILE).resolve()}"
    assert artifacts == (tmp_path / "results" / STORE_FOLDER / "artifacts").resolve().as_uri()


def test_runs_and_an_experiment_are_tracked_beside_the_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = pytest.importorskip("mlflow", reason="the fedapp[track] extra is not installed")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    results = tmp_path / "results"
    run = ["run", "--method", "kfed", "--dataset", "digits", "--clients", "2", "--engine", "inprocess"]
    assert main([*run, "--out", str(results / "one"), "--track", "mlflow"]) == 0
    assert (
        main(
            ["experiment", str(_experiment_file(tmp_path)), "--out", str(results / "e"), "--track", "mlflow"]
        )
        == 0
    )
    assert list(elsewhere.iterdir()) == []  # never the current directory

    client = mlflow.MlflowClient(f"sqlite:///{results / STORE_FOLDER / STORE_FILE}")
    (single,) = client.search_runs([client.get_experiment_by_name("fedapp").experiment_id])
    assert single.info.run_name == "one" and single.info.status == "FINISHED"
    assert single.data.params["method"] == "kfed" and single.data.params["num-clients"] == "2"
    assert single.data.tags["fedapp.status"] == "converged"
    nmi = client.get_metric_history(single.info.run_id, "nmi")
    assert [(m.step, round(m.value, 12)) for m in nmi] == [
        (1, round(_summary(results / "one")["metrics"]["nmi"], 12))
    ]
    names = {a.path for a in client.list_artifacts(single.info.run_id)}
    assert {"summary.json", "rounds.json", "report.html", "metrics.png", "model"} <= names
    assert not any(name.startswith("nodes") for name in names)  # a node's folder is never logged
    assert Path(client.get_run(single.info.run_id).info.artifact_uri.removeprefix("file://")).is_relative_to(
        results / STORE_FOLDER
    )

    grouped = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    assert sorted(r.info.run_name for r in grouped) == ["k-FED s0", "k-FED s1"]
    assert {r.data.tags["fedapp.seed"] for r in grouped} == {"0", "1"}


def _summary(out: Path) -> dict:
    import json

    return json.loads((out / "summary.json").read_text())


def test_a_run_that_tracks_nothing_needs_no_mlflow() -> None:
    """The extra is optional: the CLI imports MLflow only for --track."""
    import subprocess

    code = "import simulation.__main__, sys; sys.exit('mlflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
