"""What the clients would refuse is refused before the run: the privacy floor against a site's records,
k against the local centres the floor lets the clients send, vertical parties that share too few ids —
each a small check (`fedapp.app.preflight`) fed by the per-method rule (`fedapp.app.floor_rules`), and
the dry run and the real run refuse alike, in seconds, with one line."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedapp.app.floor_rules import FloorRule, floor_rule, run_floor
from fedapp.app.preflight import Site, check_local_centres, check_shared_ids, check_sites_above_floor
from fedapp.config.run import ConfigError, parse_run_config
from fedapp.datasets import Columns, Dataset, load_dataset
from simulation.__main__ import main


def _rule(k: int = 10, **keys: object) -> FloorRule:
    return floor_rule(parse_run_config({"dataset": "digits", **keys}), k)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"method": "kfed"}, FloorRule(True, 10, capped=True, needs_k=True)),
        ({"method": "kfed", "kfed.local-k": 3}, FloorRule(True, 3, capped=True, needs_k=True)),
        ({"method": "kfed", "dp.epsilon": 2.0}, FloorRule(True, 10, capped=False, needs_k=True)),
        ({"method": "ffcm"}, FloorRule(True, 10, capped=True, needs_k=True)),
        ({"method": "ffcm", "ffcm.init": "moments"}, FloorRule(True, 0, capped=True)),
        ({"method": "ffcm", "secagg": True}, FloorRule(True, 0, capped=True)),
        ({"method": "ffcm", "dp.epsilon": 2.0}, FloorRule(True, 0, capped=True)),
        ({"method": "ccfc"}, FloorRule(True, 10)),
        ({"method": "cefmc", "dataset": "digits-mv"}, FloorRule()),
        ({"method": "gfedntm", "dataset": "texts-demo"}, FloorRule()),
    ],
)
def test_the_rule_follows_each_methods_initialisation(keys: dict[str, object], expected: FloorRule) -> None:
    assert _rule(**keys) == expected


def test_text_methods_rules() -> None:
    texts = {"dataset": "texts-demo"}
    assert _rule(4, method="fstc", **texts) == FloorRule(True, 4, capped=True)  # K, padded by the server
    weighted = {"fstc.init-merge": "weighted"}
    assert _rule(4, method="fstc", **weighted, **texts) == FloorRule(True, 8, capped=True)  # 2K
    assert _rule(4, method="fstc", **{"fstc.init": "representations"}, **texts) == FloorRule()
    assert _rule(4, method="fstc", secagg=True, **texts) == FloorRule()  # moments
    assert _rule(4, method="fsccl", **{"fsccl.init-local-k": 5}, **texts) == FloorRule(True, 5, capped=True)
    assert _rule(4, method="fbow", **{"textkfed.local-k": 2}, **texts) == FloorRule(True, 2, True, True)


def test_the_floor_is_at_least_five_and_the_run_can_raise_it() -> None:
    assert run_floor(parse_run_config({"min-cluster-size": 1})) == 5
    assert run_floor(parse_run_config({"min-cluster-size": 8})) == 8


def test_a_site_below_the_floor_is_refused_where_its_method_would_send_nothing() -> None:
    sites = [Site(0, "site-0.csv", 40), Site(1, "site-1.csv", 4)]
    with pytest.raises(
        ConfigError, match=r"client 1: site-1.csv holds 4 records, fewer than the privacy floor"
    ):
        check_sites_above_floor(sites, FloorRule(True, 3), 5, "kfed")
    check_sites_above_floor(sites, FloorRule(), 5, "gfedntm")  # runs: only its report withholds
    check_sites_above_floor(sites, FloorRule(True, 3), 4, "kfed")


def test_k_must_be_reachable_by_the_local_centres_the_floor_allows() -> None:
    sites = [Site(i, f"site-{i}.csv", 599) for i in range(3)]  # digits over 3 clients: 119 each at floor 5
    rule = FloorRule(True, 500, capped=True, needs_k=True)
    check_local_centres(sites, rule, 5, 357, "kfed")
    with pytest.raises(ConfigError, match=r"k=358 .* only 357 local centres .*119 \+ 119 \+ 119"):
        check_local_centres(sites, rule, 5, 358, "kfed")
    with pytest.raises(ConfigError, match=r"only 6 local centres \(2 per client\)"):  # DP: as many as asked
        check_local_centres(sites, FloorRule(True, 2, capped=False, needs_k=True), 5, 10, "kfed")
    check_local_centres(sites, FloorRule(True, 8, capped=True), 5, 500, "fstc")  # the server pads
    for moments in ({"ffcm.init": "moments"}, {"secagg": True}, {"dp.epsilon": 2.0}):  # sums, no centres
        check_local_centres(sites, _rule(500, method="ffcm", **moments), 5, 500, "ffcm")


def _party(tmp_path: Path, party: int, ids: list[str]) -> Dataset:
    """A party's own view file with these ids, read as a user's file is."""
    path = tmp_path / f"view-{party}.csv"
    pd.DataFrame({"a": np.arange(len(ids), dtype=float), "pid": ids}).to_csv(path, index=False)
    return load_dataset(f"csv:{path}", columns=Columns(id="pid"))


def test_vertical_parties_must_share_k_ids(tmp_path: Path) -> None:
    check_shared_ids([_party(tmp_path, 0, ["a", "b", "c"]), _party(tmp_path, 1, ["c", "b", "a"])], 3)
    parties = [_party(tmp_path, 0, ["a", "b", "c"]), _party(tmp_path, 1, ["b", "c", "d"])]
    with pytest.raises(ConfigError, match=r"share only 2 record ids \(party 0: 3 ids, party 1: 3 ids\)"):
        check_shared_ids(parties, 3)
    check_shared_ids(parties, 2)


# ------------------------------------------------------------------------------- through the CLI
def _refused_in_seconds(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> str:
    """The dry run and the real run refuse alike: exit 2, one line, nothing written."""
    lines = []
    for dry in (["--dry-run"], []):
        started = time.perf_counter()
        code = main(["run", "--engine", "inprocess", "--out", str(out), *args, *dry])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert time.perf_counter() - started < 30
        assert not out.exists()  # not even an empty folder
        lines.append(err)
    assert lines[0] == lines[1]
    return lines[0]


def test_k_beyond_the_local_centres_is_refused_before_a_one_shot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for method in ("kfed", "ffcm"):
        args = ["--method", method, "--dataset", "digits", "--clients", "3", "--set", "k=500"]
        err = _refused_in_seconds(capsys, tmp_path / method, *args)
        assert f"k=500 clusters but the 3 {method} clients can send only 357 local centres" in err


def test_a_site_below_the_floor_is_refused_naming_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    for site, n in enumerate([40, 40, 6]):
        frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["a", "b", "c"])
        frame.to_csv(tmp_path / f"site-{site}.csv", index=False)
    spec = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    args = f"--method kfed --dataset {spec} --clients 3 --set k=2 --set min-cluster-size=8".split()
    err = _refused_in_seconds(capsys, tmp_path / "out", *args)
    assert f"client 2: csv:{tmp_path}/site-2.csv holds 6 records, fewer than the privacy floor" in err
    assert "min-cluster-size=8" in err


def test_vertical_files_with_disjoint_ids_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for party in range(3):
        frame = pd.DataFrame({"f": np.arange(20.0), "pid": [f"{party}-{i}" for i in range(20)]})
        frame.to_csv(tmp_path / f"view-{party}.csv", index=False)
    spec = f"csv:{tmp_path}/view-{{partition-id}}.csv"
    args = f"--method fedcmv --dataset {spec} --clients 3 --set k=3 --set id-column=pid".split()
    err = _refused_in_seconds(capsys, tmp_path / "out", *args)
    assert "share only 0 record ids (party 0: 20 ids, party 1: 20 ids, party 2: 20 ids)" in err


def test_k_min_beyond_the_local_centres_names_k_min(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """k = 0 on unlabelled files tries k-min first: the refusal names the key to change."""
    rng = np.random.default_rng(0)
    for site in range(3):
        frame = pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "c"])
        frame.to_csv(tmp_path / f"site-{site}.csv", index=False)
    spec = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    args = f"--method kfed --dataset {spec} --clients 3 --set k-min=20 --set k-max=25".split()
    err = _refused_in_seconds(capsys, tmp_path / "out", *args)
    assert err.startswith("error: k-min=20 clusters but the 3 kfed clients can send only 18 local centres")
    assert err.endswith("lower k-min, or use fewer, larger clients")
    err = _refused_in_seconds(capsys, tmp_path / "out", *args[:-4], "--set", "k-min=31", "--set", "k-max=35")
    assert "holds 30 records, fewer than k-min=31 clusters: lower k-min" in err


def test_a_refused_run_keeps_a_folder_the_user_had_and_leaves_none_it_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--method", "kfed", "--dataset", "digits", "--clients", "3", "--set", "k=500"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for out in (mine, tmp_path / "new" / "deeper"):
        assert main(["run", "--engine", "inprocess", "--out", str(out), *args]) == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["mine", "notes.txt"]
    capsys.readouterr()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_the_dry_run_refuses_an_output_folder_the_real_run_cannot_make(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/proc is a folder root may write to by its permissions, yet nothing can be made in it."""
    err = _refused_in_seconds(capsys, Path("/proc/fedapp-out"), "--method", "kfed", "--dataset", "digits")
    assert "output directory /proc/fedapp-out is not writable" in err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_tune_checks_its_output_folder_before_the_selection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fedapp tune --out` where nothing can be written ran the whole selection, then ended in a traceback."""
    started = time.perf_counter()
    argv = ["tune", "--method", "kfed", "--dataset", "digits", "--clients", "3", "--out", "/proc/fedapp-tune"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: output directory /proc/fedapp-tune is not writable: No such file or directory"
    assert time.perf_counter() - started < 10
