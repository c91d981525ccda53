"""A run never lies beside an earlier run's outputs: a folder holding them is refused before anything
starts (exit 2, one line) unless the run resumes or `--overwrite` removes exactly fedapp's own files;
experiments keep `--resume` reusing their finished runs, and the loopback deployment refuses alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedapp.config.run import ConfigError, parse_run_config
from fedapp.launch.outputs import RUN_FILES, check_outputs, clear_outputs, earlier_outputs, node_outputs
from simulation.__main__ import main

RUN = ["--method", "kfed", "--dataset", "digits", "--engine", "inprocess"]


def _run(out: Path, clients: int, *extra: str) -> int:
    return main(["run", *RUN, "--clients", str(clients), "--out", str(out), *extra])


def _files(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def test_a_second_run_into_the_folder_is_refused_and_overwrite_removes_only_fedapps_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    assert _run(out, 4) == 0
    (out / "nodes" / "3" / "mine.txt").write_text("also the user's")
    before = {name: (out / name).read_bytes() for name in _files(out)}
    capsys.readouterr()

    assert _run(out, 2) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds an earlier run's outputs" in err and "--overwrite" in err
    assert {name: (out / name).read_bytes() for name in _files(out)} == before  # nothing touched

    assert _run(out, 2, "--overwrite") == 0
    assert (out / "notes.txt").read_text() == "the user's"
    assert (out / "nodes" / "3" / "mine.txt").read_text() == "also the user's"
    assert not (out / "nodes" / "2").exists()  # emptied by the overwrite: removed
    assert sorted(p.name for p in (out / "nodes").iterdir()) == ["0", "1", "3"]
    assert not (out / "nodes" / "3" / "assignments.csv").exists()
    assert json.loads((out / "summary.json").read_text())["config"]["num-clients"] == 2


def test_every_file_a_run_writes_is_one_the_overwrite_knows(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(out, 3, "--set", "checkpoint-every=1", "--rounds", "2") == 0
    cfg = parse_run_config(json.loads((out / "summary.json").read_text())["config"])
    assert {str(p.relative_to(out)) for p in earlier_outputs(cfg)} == _files(out)
    clear_outputs(cfg)
    assert list(out.iterdir()) == []


def test_the_list_names_the_files_other_modules_write() -> None:
    from fedapp.app.server_loop import WIRE_BYTES_FILE
    from simulation.runner import LOG_NAME
    from strategies.ccfc import MODEL_FILE

    assert {WIRE_BYTES_FILE, LOG_NAME, MODEL_FILE, "summary.json", "rounds.json", "metrics.png"} <= set(
        RUN_FILES
    )
    assert '"deploy-pids.json"' in (Path(__file__).parents[1] / "deploy" / "run_local.py").read_text()


def test_resume_is_the_same_run_and_overwrite_would_delete_its_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    fresh = parse_run_config({"out-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="holds an earlier run's outputs \\(summary.json\\)"):
        check_outputs(fresh, overwrite=False)
    check_outputs(fresh, overwrite=True)
    resumed = parse_run_config({"out-dir": str(tmp_path), "resume": True})
    check_outputs(resumed, overwrite=False)
    with pytest.raises(ConfigError, match="would delete the checkpoint"):
        check_outputs(resumed, overwrite=True)


def test_node_folders_elsewhere_are_found_by_their_partition_id(tmp_path: Path) -> None:
    pattern = str(tmp_path / "site{partition-id}" / "out")
    for name in ("site0", "site12", "siteX"):
        (tmp_path / name / "out").mkdir(parents=True)
        (tmp_path / name / "out" / "assignments.csv").write_text("id,cluster,score\n")
    found = node_outputs(pattern)
    assert [p.parent.parent.name for p in found] == ["site0", "site12"]


# ------------------------------------------------------------------------------------ experiments
def _experiment(tmp_path: Path, k: int) -> Path:
    path = tmp_path / "e.toml"
    path.write_text(
        '[experiment]\nname = "e"\nseeds = [0]\nengine = "inprocess"\n[defaults]\ndataset = "digits"\n'
        f'num-clients = 2\n[[runs]]\nlabel = "k-FED"\nmethod = "kfed"\nk = {k}\n'
        '[[runs]]\nlabel = "FFCM"\nmethod = "ffcm"\nnum-rounds = 2\n'
    )
    return path


def test_an_experiment_into_earlier_runs_is_refused_unless_resumed_or_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    argv = ["experiment", str(_experiment(tmp_path, 10)), "--out", str(root)]
    assert main(argv) == 0
    capsys.readouterr()
    for extra in ([], ["--dry-run"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "run 'k-FED' seed 0" in err and "--resume" in err
    assert main([*argv, "--dry-run", "--resume"]) == 0

    assert main([*argv, "--resume"]) == 0
    assert capsys.readouterr().out.count("(reused)") == 2
    _experiment(tmp_path, 8)  # k-FED's configuration changed: it runs again, into its cleared folder
    (root / "k-FED-s0" / "nodes" / "5").mkdir()
    (root / "k-FED-s0" / "nodes" / "5" / "assignments.csv").write_text("id,cluster,score\n")
    assert main([*argv, "--resume"]) == 0
    assert capsys.readouterr().out.count("(reused)") == 1
    assert not (root / "k-FED-s0" / "nodes" / "5").exists()
    assert json.loads((root / "k-FED-s0" / "summary.json").read_text())["config"]["k"] == 8

    assert main([*argv, "--overwrite"]) == 0
    assert "(reused)" not in capsys.readouterr().out


def test_a_deployment_into_an_earlier_run_is_refused_before_any_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nodes" / "7").mkdir(parents=True)
    (tmp_path / "nodes" / "7" / "assignments.csv").write_text("id,cluster,score\n")
    for node_data in ([], ["--node-data", f"csv:{tmp_path}/site-{{partition-id}}.csv"]):
        for dry in (["--dry-run"], []):
            assert main(["deploy", "--out", str(tmp_path), *node_data, *dry]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "nodes/7/assignments.csv" in err
    assert main(["deploy", "--out", str(tmp_path), "--dry-run", "--overwrite"]) == 0
    assert (tmp_path / "nodes" / "7" / "assignments.csv").exists()  # a dry run removes nothing
