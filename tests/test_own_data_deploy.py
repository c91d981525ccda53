"""Own data on a real loopback deployment: 3 SuperNodes, each reading only its own CSV (no labels), each
writing its records' clusters; the server's model reproduces a node's assignments with `predict`; a node
whose file lacks the text column is named in the run's status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedapp.datasets import load_dataset
from fedapp.report.assignments import read_assignments
from simulation.predict import predict

ROOT = Path(__file__).resolve().parents[1]
SITES = 3
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("text_embedding_cache")]


def _deploy(out: Path, method: str, node_data: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "deploy/run_local.py", "--method", method, "--node-data", node_data]
    command += ["--clients", str(SITES), "--rounds", "2", "--set", "id-column=id", *extra, "--out", str(out)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)


def _text_sites(root: Path) -> None:
    texts = load_dataset("texts-demo").texts
    assert texts is not None
    for site, rows in enumerate(np.array_split(np.arange(len(texts)), SITES)):
        pd.DataFrame({"id": [f"t{i}" for i in rows], "text": [texts[i] for i in rows]}).to_csv(
            root / f"site-{site}.csv", index=False
        )


def _vector_sites(root: Path) -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 6, (3, 5))
    for site in range(SITES):
        rows = centres[rng.integers(0, 3, 50)] + rng.normal(0, 1, (50, 5))
        frame = pd.DataFrame(rows, columns=[f"v{j}" for j in range(5)])
        frame.insert(0, "id", [f"{site}:{i}" for i in range(50)])
        frame.to_csv(root / f"site-{site}.csv", index=False)


@pytest.mark.parametrize(("method", "make_sites"), [("fsbert-kfed", _text_sites), ("kfed", _vector_sites)])
def test_each_supernode_reads_its_own_file_and_writes_its_assignments(
    tmp_path: Path, method: str, make_sites: object
) -> None:
    make_sites(tmp_path)  # type: ignore[operator]
    out = tmp_path / "run"
    result = _deploy(out, method, f"csv:{tmp_path}/site-{{partition-id}}.csv", "--set", "k=3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    every_id = {}
    for site in range(SITES):
        ids, _, _ = read_assignments(out / "nodes" / str(site) / "assignments.csv")
        assert ids == pd.read_csv(tmp_path / f"site-{site}.csv", dtype=str)["id"].tolist()
        every_id[site] = ids
    assert (out / "model" / "model.json").is_file()
    assert "On the wire, per message kind" in (out / "report.html").read_text()
    for site in range(SITES):  # each SuperNode's own page: its records, none of another's
        page = (out / "nodes" / str(site) / "report.html").read_text()
        assert any(f">{i}<" in page for i in every_id[site])
        assert not any(f">{i}<" in page for other in set(every_id) - {site} for i in every_id[other])
    free = summary["report"]["label_free"]
    assert free["calinski_harabasz"] > 0 and free["davies_bouldin"] > 0 and "acc" not in summary["metrics"]
    predicted = tmp_path / "predicted.csv"
    predict(out, f"csv:{tmp_path}/site-0.csv", predicted)
    assert predicted.read_bytes() == (out / "nodes" / "0" / "assignments.csv").read_bytes()


def test_a_node_whose_file_lacks_the_text_column_is_named_and_the_others_carry_on(tmp_path: Path) -> None:
    _text_sites(tmp_path)
    frame = pd.read_csv(tmp_path / "site-1.csv").rename(columns={"text": "body"})
    frame.to_csv(tmp_path / "site-1.csv", index=False)
    out = tmp_path / "run"
    result = _deploy(out, "fsbert-kfed", f"csv:{tmp_path}/site-{{partition-id}}.csv", "--set", "k=3")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "degraded", summary["status_reason"]
    assert result.returncode == 3
    assert any("no text column 'text'" in message for message in summary["failure_messages"])
    assert not (out / "nodes" / "1" / "assignments.csv").exists()
    assert (out / "nodes" / "0" / "assignments.csv").exists() and (
        out / "nodes" / "2" / "assignments.csv"
    ).exists()
