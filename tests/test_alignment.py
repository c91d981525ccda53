"""Keyed-hash id alignment of vertical parties, assignments files and the saved model, on their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedapp.privacy.alignment import AlignmentError, aligned_rows, hash_ids, intersect, run_key
from fedapp.report.assignments import node_out_dir, read_assignments, run_name, write_assignments
from fedapp.report.model_store import ModelError, read_model, write_model


def test_parties_line_up_the_shared_records_in_hash_order() -> None:
    key = run_key("secret", "run")
    ids = {0: ["a", "b", "c", "d", "e"], 1: ["e", "x", "c", "a", "b"], 2: ["b", "c", "a", "e", "y", "z"]}
    hashes = {party: hash_ids(rows, key) for party, rows in ids.items()}
    common = intersect(hashes, k=2)
    assert len(common) == 4 and list(common) == sorted(common)
    lined_up = [[ids[p][i] for i in aligned_rows(hashes[p], common)] for p in ids]
    assert lined_up[0] == lined_up[1] == lined_up[2] and sorted(lined_up[0]) == ["a", "b", "c", "e"]
    assert all(len(h) == 64 and set(h) <= set("0123456789abcdef") for h in common)  # digests, not ids


def test_the_key_changes_every_hash_and_a_missing_key_is_derived_from_the_run() -> None:
    first, other = hash_ids(["id-1"], run_key("k1", "r")), hash_ids(["id-1"], run_key("k2", "r"))
    assert first[0] != other[0]
    assert run_key("", "run-a") != run_key("", "run-b") and run_key("", "run-a") == run_key("", "run-a")


def test_empty_or_tiny_intersections_and_duplicate_ids_are_refused() -> None:
    key = run_key("s", "r")
    disjoint = {
        0: hash_ids([f"a{i}" for i in range(50)], key),
        1: hash_ids([f"b{i}" for i in range(40)], key),
    }
    with pytest.raises(
        AlignmentError, match="share only 0 record ids \\(party 0: 50 ids, party 1: 40 ids\\)"
    ):
        intersect(disjoint, k=3)
    tiny = {0: hash_ids([f"a{i}" for i in range(100)], key), 1: hash_ids(["a1", "a2", "a3", "b"], key)}
    intersect(tiny, k=3)  # 3 shared of the smaller party's 4: enough
    tiny[0] = hash_ids([f"a{i}" for i in range(100)] + [f"c{i}" for i in range(100)], key)
    tiny[1] = hash_ids(["a1", "a2", "a3"] + [f"d{i}" for i in range(50)], key)
    with pytest.raises(AlignmentError, match="share only 3"):
        intersect(tiny, k=3)  # 3 of 53: below 10 %
    with pytest.raises(AlignmentError, match="duplicate"):
        hash_ids(["a", "a"], key)
    with pytest.raises(AlignmentError, match="does not have"):
        aligned_rows(hash_ids(["a"], key), hash_ids(["b"], key))


def test_assignments_round_trip_ids_unchanged_and_scores_exactly(tmp_path: Path) -> None:
    ids = ["007", "a,b", 'quote"d', "ü"]
    scores = np.array([0.1 + 0.2, np.nan, 1e-300, 3.0])
    path = write_assignments(tmp_path / "x" / "assignments.csv", ids, np.array([2, 0, 1, 2]), scores)
    read_ids, clusters, read_scores = read_assignments(path)
    assert read_ids == ids and clusters.tolist() == [2, 0, 1, 2]
    np.testing.assert_array_equal(read_scores, scores)  # bit-exact, NaN where there is no score
    assert node_out_dir("/o/n{partition-id}", 3, "r") == Path("/o/n3")
    assert node_out_dir("", 1, run_name("", "kfed", "csv:/d/s.csv", 0)) == Path(
        "fedapp-results/kfed-csv_d_s.csv-s0/1"
    )


def test_the_model_directory_round_trips_weights_and_refuses_what_is_not_a_model(tmp_path: Path) -> None:
    arrays = [np.arange(6.0).reshape(2, 3), np.array(7, np.int64), np.array(["a", "bc"])]
    write_model(tmp_path / "model", {"method": "kfed", "config": {"k": 2}}, arrays, torch_weights=True)
    saved = read_model(tmp_path)  # the run directory works too
    assert saved.info["weights"] == "model.npz"  # strings have no safetensors dtype
    assert [a.shape for a in saved.arrays or []] == [(2, 3), (), (2,)]
    write_model(tmp_path / "model", {"method": "fstc", "config": {}}, arrays[:2], torch_weights=True)
    saved = read_model(tmp_path / "model")
    assert saved.info["weights"] == "model.safetensors" and not (tmp_path / "model" / "model.npz").exists()
    np.testing.assert_array_equal(saved.arrays[0], arrays[0])  # type: ignore[index]
    with pytest.raises(ModelError, match="no model.json"):
        read_model(tmp_path / "nowhere")
    (tmp_path / "model" / "model.json").write_text("{not json")
    with pytest.raises(ModelError, match="not a readable model"):
        read_model(tmp_path)
