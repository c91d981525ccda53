"""The small input faults: empty paths, two values for one key, a checkpoint folder that is a file, a
fuzzifier that would make FCM's weights vanish, .mat files that are not, private keys and their folders."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from deploy.secure import _write, make_certificates, make_node_keys
from fedapp.datasets import DatasetError, load_dataset
from simulation.__main__ import main

SHARED_MAT = Path(__file__).resolve().parents[2] / "shared" / "data" / "hw" / "Handwritten.mat"


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:  # argparse's own errors
        main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_an_empty_path_is_an_error_not_the_current_directory(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["run", "--method", "kfed", "--out", ""],
        ["run", "--method", "kfed", "--out", "  "],
        ["experiment", "", "--dry-run"],
        ["predict", "--model", "", "--dataset", "csv:x.csv", "--out", "y.csv"],
        ["predict", "--model", "m", "--dataset", "csv:x.csv", "--out", ""],
        ["deploy", "--out", ""],
    ):
        assert "an empty path" in _refused(capsys, *argv), argv


def test_two_values_for_one_key_are_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "o")
    cases = {
        (
            "run",
            "--method",
            "kfed",
            "--clients",
            "3",
            "--set",
            "num-clients=5",
            "--out",
            out,
        ): "--clients 3 and",
        ("run", "--method", "kfed", "--out", out, "--set", f"out-dir={tmp_path}/other"): "--out",
        (
            "deploy",
            "--rounds",
            "3",
            "--set",
            "num-rounds=4",
            "--out",
            out,
        ): "--rounds 3 and --set num-rounds=4",
    }
    for argv, words in cases.items():
        assert main([*argv, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert words in err and "disagree" in err and len(err.strip().splitlines()) == 1, err
    same = ["run", "--method", "kfed", "--clients", "3", "--set", "num-clients=3", "--out", out, "--dry-run"]
    assert main(same) == 0  # the same value twice is fine


def test_a_checkpoint_dir_that_is_a_file_and_an_overflowing_fuzzifier_fail_before_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    argv = [
        "run",
        "--method",
        "kfed",
        "--set",
        "checkpoint-every=2",
        "--set",
        f"checkpoint-dir={tmp_path}/file",
    ]
    assert main([*argv, "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    argv = [
        "run",
        "--method",
        "ffcm",
        "--set",
        "ffcm.fuzziness=1e308",
        "--out",
        str(tmp_path / "o"),
        "--dry-run",
    ]
    assert main(argv) == 2 and "'ffcm.fuzziness' must be in (1, 100]" in capsys.readouterr().err


def test_mat_files_that_are_not_say_which_problem_it_is(tmp_path: Path) -> None:
    (tmp_path / "plain.mat").write_text("hello, this is text\n")
    with pytest.raises(DatasetError, match=r"plain\.mat: not a MATLAB \.mat file \(no 'MATLAB"):
        load_dataset("mat:plain.mat", tmp_path)
    (tmp_path / "views.mat").mkdir()
    with pytest.raises(DatasetError, match=r"views\.mat: is a directory, not a MATLAB \.mat file"):
        load_dataset("mat:views.mat", tmp_path)
    header = b"MATLAB 5.0 MAT-file, Platform: GLNXA64".ljust(116) + bytes(8) + b"\x00\x01IM"
    (tmp_path / "cut.mat").write_bytes(header + b"\x0e\x00\x00\x00\xff\xff\x00\x00")  # a matrix cut short
    with pytest.raises(DatasetError, match=r"cut\.mat: a MATLAB file, but truncated or corrupt"):
        load_dataset("mat:cut.mat", tmp_path)


@pytest.mark.skipif(not SHARED_MAT.is_file(), reason="needs ../shared/data")
def test_a_real_mat_file_cut_short_is_called_truncated(tmp_path: Path) -> None:
    (tmp_path / "hw.mat").write_bytes(SHARED_MAT.read_bytes()[:300])
    with pytest.raises(DatasetError, match="truncated or corrupt"):
        load_dataset("mat:hw.mat", tmp_path)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_keys_are_0600_from_the_start_and_their_folders_0700(tmp_path: Path) -> None:
    keys = make_node_keys(tmp_path / "keys", ["node0"])
    private, public = keys["node0"]
    assert _mode(tmp_path / "keys") == 0o700 and _mode(private) == 0o600 and _mode(public) & 0o044
    certs = make_certificates(tmp_path / "certs")
    assert _mode(tmp_path / "certs") == 0o700 and _mode(certs["key"]) == 0o600
    existing = tmp_path / "old-key"
    existing.write_bytes(b"public")
    existing.chmod(0o644)
    _write(existing, b"secret", secret=True)  # an existing file is tightened before the secret is written
    assert _mode(existing) == 0o600 and existing.read_bytes() == b"secret"
