"""The Table 3 analysis script: kNN votes as scikit-learn's, every run scored on the full dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.neighbors import KNeighborsClassifier

from fedapp.launch.resolve import build_overrides
from simulation.papers.ccfc.representations import KNN_KS, knn_accuracy, load_run, main
from simulation.runner import execute


def test_knn_accuracy_matches_scikit_learn_for_every_k_tied_votes_included() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(600, 4))
    labels = rng.integers(0, 4, size=600)  # mostly noise, so even k often ties the vote
    labels[:300] = (features[:300, 0] > 0).astype(int) + 2 * (features[:300, 1] > 0)  # and a signal
    train, test = np.arange(450), np.arange(450, 600)
    ours = knn_accuracy(features, labels, train, test)
    for k in KNN_KS:
        reference = KNeighborsClassifier(n_neighbors=k, algorithm="brute").fit(features[train], labels[train])
        assert ours[k] == 100.0 * float((reference.predict(features[test]) == labels[test]).mean())


def test_runs_on_a_subsample_are_scored_on_the_whole_dataset(tmp_path: Path) -> None:
    overrides = {
        "method": "ccfc",
        "dataset": "digits",
        "num-clients": 3,
        "num-rounds": 3,
        "max-samples": 600,
        "ccfc.pretrain-rounds": 1,
        "ccfc.batch-size": 64,
        "ccfc.kmeans-samples": 200,
    }
    for seed in (0, 1):
        execute(
            build_overrides({**overrides, "seed": seed}, tmp_path / f"s{seed}"),
            engine="inprocess",
            quiet=True,
        )
    _, dataset = load_run(tmp_path / "s0")
    assert dataset.n_samples == 1797  # not the 600 it trained on
    out = tmp_path / "knn.json"
    assert main(["--run", f"A={tmp_path / 's0'}", "--run", f"B={tmp_path / 's1'}", "--out", str(out)]) == 0
    scores = json.loads(out.read_text())
    assert set(scores) == {"Raw pixels", "A", "B"}
    assert scores["Raw pixels"]["3"] > 90  # digits' pixels are easy; a mismatched split scores ~10
    assert all(10 < scores[run]["3"] <= 100 for run in ("A", "B"))


def test_sweep_figure_merges_earlier_points_without_counting_a_run_twice(tmp_path: Path) -> None:
    from simulation.papers.ccfc.figures import load_points, main, merge_points, sweep_series

    run = {"config": {"p": 0.5, "ccfc.lambda": 1.0, "seed": 0}, "seed": 0}
    results = {"p=0.5 l=1": [{**run, "metrics": {"nmi": 0.80, "kappa": 0.70, "acc": 0.75}}]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    csv_path = tmp_path / "points.csv"
    csv_path.write_text(
        "# measured earlier\np,ccfc.lambda,seed,nmi,kappa,acc\n"
        "0.5,1,0,10,10,10\n"  # the same run as results.json: the folder wins
        "0.5,1,1,70,60,65\n"  # another seed of it: averaged in
        "1,0.001,0,13,13.02,21.55\n"
    )
    merged = merge_points(results, load_points(csv_path, "ccfc.lambda"), "ccfc.lambda")
    nmi = sweep_series(merged, "ccfc.lambda", "nmi")
    assert nmi[0.5] == [(1.0, pytest.approx(75.0), pytest.approx(np.std([80, 70], ddof=1)))]
    assert nmi[1.0] == [(0.001, pytest.approx(13.0), 0.0)]
    out = tmp_path / "fig.png"
    assert (
        main(["sweep", str(tmp_path), "--points", str(csv_path), "--key", "ccfc.lambda", "--out", str(out)])
        == 0
    )
    assert out.stat().st_size > 0
    csv_path.write_text("p,ccfc.lambda,seed,nmi,kappa,acc\n0.5,one,0,1,1,1\n")
    with pytest.raises(ValueError, match="points.csv"):
        load_points(csv_path, "ccfc.lambda")
    missing = ["sweep", str(tmp_path), "--points", str(tmp_path / "gone.csv"), "--key", "ccfc.lambda"]
    with pytest.raises(SystemExit) as stopped:  # argparse's one-line error, exit code 2
        main([*missing, "--out", str(out)])
    assert stopped.value.code == 2
