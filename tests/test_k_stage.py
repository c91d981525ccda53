"""Choosing k as two Flower messages before round 1 (`strategies.k_choice`, `clients/select_k.py`): the wire
forms, the in-process run, labelled sites, a client with a bad reply, and SecAgg+ on Flower's runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedapp.app.k_selection import (
    candidates_from_arrays,
    candidates_to_arrays,
    statistics_from_arrays,
    statistics_to_arrays,
)
from fedapp.app.server_loop import WIRE_BYTES_FILE
from fedapp.launch.resolve import build_overrides
from fedapp.maths.selection import candidate_criteria, candidate_statistics
from fedapp.report.assignments import read_assignments
from fedapp.report.keep import KEEP_MARGIN
from fedapp.wire import ReplyError
from simulation.__main__ import main
from simulation.runner import execute
from tests.own_files import write_text_sites
from tests.test_own_data import _run, _vector_sites

KEYS = {"id-column": "id", "k-max": 8}


def _spec(root: Path) -> str:
    return f"csv:{root}/site-{{partition-id}}.csv"


def test_candidates_and_statistics_survive_their_wire_forms() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(60, 3))
    candidates = {2: rows[:2], 3: rows[2:5], 5: rows[5:10]}
    pairs = {
        k: [(rows[10 : 10 + k], rows[20 : 20 + k]), (rows[30 : 30 + k], rows[40 : 40 + k])]
        for k in candidates
    }
    arrays, ks, splits = candidates_to_arrays(candidates, pairs)
    back, back_pairs = candidates_from_arrays(arrays, ks, splits)
    assert sorted(back) == [2, 3, 5] and all(np.array_equal(back[k], candidates[k]) for k in candidates)
    assert splits == 2 and arrays[1].dtype == np.float32  # the pairs only assign rows
    for k in candidates:
        for (a, b), (a_back, b_back) in zip(pairs[k], back_pairs[k], strict=True):
            np.testing.assert_allclose(a_back, a, rtol=1e-6)
            np.testing.assert_allclose(b_back, b, rtol=1e-6)
    stats = candidate_statistics(rows, candidates, floor=1, pairs=back_pairs)
    decoded = statistics_from_arrays(statistics_to_arrays(stats, 0.25), [2, 3, 5], 3, 2, 0.25)
    for k in candidates:
        np.testing.assert_array_equal(decoded[k].sums.counts, stats[k].sums.counts)
        np.testing.assert_allclose(decoded[k].sums.sums, stats[k].sums.sums, rtol=1e-12)
        np.testing.assert_allclose(decoded[k].distances.squared_sums, stats[k].distances.squared_sums)
        np.testing.assert_array_equal(decoded[k].agreement, stats[k].agreement)
        assert decoded[k].distances.n == 60 and decoded[k].agreement.sum() == 2 * 60
    with pytest.raises(ValueError, match="do not hold"):
        candidates_from_arrays(arrays, "2,3,4", splits)
    broken = statistics_to_arrays(stats)
    broken[0] = broken[0] + 0.5  # a fractional count
    with pytest.raises(ReplyError, match="fractional"):
        statistics_from_arrays(broken, [2, 3, 5], 3, 2)


def test_secure_totals_take_each_candidates_rows_from_its_rounded_counts() -> None:
    """SecAgg+'s totals round every count on its own: a candidate's rows are the sum of its rounded
    counts, not a separately rounded total (one row apart made the run fail: "pass 2 covered 899 rows,
    pass 1 counted 900")."""
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(900, 2))
    candidates = {3: rows[:3]}
    stats = candidate_statistics(rows, candidates, floor=1)
    totals = statistics_to_arrays(stats)
    totals[0] = totals[0] + np.array([0.4, 0.4, -0.45])  # quantisation: each count off by under a half
    totals[4] = totals[4] + np.array([[0.0, -0.6]])  # and the row total rounds to 899
    merged = statistics_from_arrays(totals, [3], 2, 0, rounded=True)[3]
    assert merged.distances.n == int(merged.sums.counts.sum()) == 900
    criteria = candidate_criteria(merged, candidates[3])  # no "pass 2 covered ... rows" refusal
    assert criteria["inertia"] > 0


def test_an_inprocess_run_chooses_k_in_two_messages_and_its_clients_use_it(tmp_path: Path) -> None:
    _vector_sites(tmp_path)
    out = tmp_path / "run"
    summary = _run(out, method="ffcm", dataset=_spec(tmp_path), k=0, **KEYS)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    selection = summary["k_selection"]
    assert summary["k"] == selection["chosen_k"] == 3
    assert [row["k"] for row in selection["candidates"]] == list(range(2, 9))
    assert selection["cost"]["extra_rounds"] == 2 and selection["cost"]["bytes_up"] > 0
    assert json.loads((out / "tune.json").read_text())["chosen_k"] == 3
    assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG"
    for site in range(3):  # every client clustered with the chosen k
        labels = read_assignments(out / "nodes" / str(site) / "assignments.csv")[1]
        assert set(np.unique(labels)) <= {0, 1, 2}


def test_labelled_sites_with_k_0_keep_the_classes(tmp_path: Path) -> None:
    frames = _vector_sites(tmp_path)
    for site, frame in enumerate(frames):  # labels from the rows' nearest blob: 3 classes
        frame["label"] = pd.cut(frame["x0"], 3, labels=False)
        frame.to_csv(tmp_path / f"site-{site}.csv", index=False)
    summary = _run(tmp_path / "run", method="kfed", dataset=_spec(tmp_path), k=0, **KEYS)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    assert summary["k_selection"] == {"skipped": "every client has labels: k is the number of classes"}
    assert summary["k"] == 3 and not (tmp_path / "run" / "tune.json").exists()
    log = (tmp_path / "run" / "flower.log").read_text()
    assert "every client has labels" in log and "scoring k" not in log  # nothing said of choosing k


def test_a_run_under_secagg_chooses_the_same_k_and_model_from_secure_totals(tmp_path: Path) -> None:
    """Round A plain, round B masked by SecAgg+ (Flower's message layer, in process): the same choice of
    k, and `select = best`'s candidate sums masked too."""
    _vector_sites(tmp_path)
    keys = {"num-clients": 3, "seed": 0, "method": "ffcm", "dataset": _spec(tmp_path), "k": 0, **KEYS}
    plain = _run(tmp_path / "plain", **{key: v for key, v in keys.items() if key != "num-clients"})
    overrides = build_overrides({**keys, "secagg": True, "secagg-max-weight": 1000}, tmp_path / "secure")
    secure = execute(overrides, engine="inprocess", quiet=True)
    assert secure["status"] in ("completed", "converged"), secure["status_reason"]
    assert secure["k_selection"]["chosen_k"] == plain["k_selection"]["chosen_k"] == secure["k"] == 3
    assert "secagg" in secure["k_selection"] and "secagg" not in plain["k_selection"]
    for plain_row, secure_row in zip(
        plain["k_selection"]["candidates"], secure["k_selection"]["candidates"], strict=True
    ):
        assert secure_row["inertia"] == pytest.approx(plain_row["inertia"], rel=1e-3)
    select = secure["report"]["select"]  # `select = best` from SecAgg+'s totals (FFCM's secure init differs)
    assert "secagg" in select and set(select["scores"]) == {"start", "final"}
    degraded = select["scores"]["final"] < (1 - KEEP_MARGIN) * select["scores"]["start"]
    assert select["kept"] == ("start" if degraded else "final")
    wire = json.loads((tmp_path / "secure" / WIRE_BYTES_FILE).read_text())
    assert "-1" in wire  # the selection's messages, group -1


def test_vertical_parties_each_choose_on_their_view_and_the_run_takes_the_rounded_mean(
    tmp_path: Path,
) -> None:
    from fedapp.datasets import load_dataset

    digits = load_dataset("digits-mv", max_samples=300)
    assert digits.views is not None
    for party, view in enumerate(digits.views[:3]):
        frame = pd.DataFrame(view, columns=[f"f{j}" for j in range(view.shape[1])])
        frame.insert(0, "pid", [f"r{i:04d}" for i in range(len(view))])
        frame.to_csv(tmp_path / f"view-{party}.csv", index=False)
    overrides = {"id-column": "pid", "id-key": "secret", "num-rounds": 4, "k-max": 12}
    spec = f"csv:{tmp_path}/view-{{partition-id}}.csv"
    summary = _run(tmp_path / "cefmc", method="cefmc", dataset=spec, k=0, **overrides)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    selection = summary["k_selection"]
    choices = sorted(table["chosen_k"] for table in selection["views"].values())
    assert sorted(selection["views"]) == ["0", "1", "2"] and len(choices) == 3
    assert summary["k"] == selection["chosen_k"] == int(np.ceil(np.mean(choices) - 0.5))
    assert selection["cost"]["extra_rounds"] == 1
    assert selection["confidence"]["choices"] == {
        pid: table["chosen_k"] for pid, table in selection["views"].items()
    }
    labels = read_assignments(tmp_path / "cefmc" / "nodes" / "0" / "assignments.csv")[1]
    assert labels.max() < summary["k"]
    # the run leaves tune.json / tune.png as a horizontal one, and `fedapp tune` chooses what it chose
    assert json.loads((tmp_path / "cefmc" / "tune.json").read_text())["chosen_k"] == summary["k"]
    assert (tmp_path / "cefmc" / "tune.png").read_bytes()[:4] == b"\x89PNG"
    tune_args = [
        "tune",
        "--method",
        "cefmc",
        "--dataset",
        spec,
        "--clients",
        "3",
        "--out",
        str(tmp_path / "tune"),
    ]
    for key, value in overrides.items():
        tune_args += ["--set", f"{key}={value}"]
    assert main(tune_args) == 0
    assert json.loads((tmp_path / "tune" / "tune.json").read_text())["chosen_k"] == summary["k"]


def test_text_sites_choose_k_on_their_embeddings_cached_in_each_node(tmp_path: Path) -> None:
    write_text_sites(tmp_path, 3)  # texts-demo: 4 topics, no labels in the files
    out = tmp_path / "run"
    summary = _run(out, method="fsbert-kfed", dataset=_spec(tmp_path), k=0, **KEYS)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    assert summary["k"] == summary["k_selection"]["chosen_k"] == 4
    for site in range(3):  # own records' embeddings stay in the node's own directory
        assert any((out / "nodes" / str(site)).rglob("*.npy")), f"site {site} cached no embeddings"
