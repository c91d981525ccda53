"""Runner options: presets, simulation resources (CPU/GPU per client), the `methods` listing, quiet output."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from fedapp.config.run import ConfigError, parse_run_config
from fedapp.launch.options import ClientResources
from fedapp.launch.presets import apply_preset, available_presets, load_preset
from fedapp.launch.processes import run_filtered
from fedapp.methods import METHODS
from fedapp.methods.cefmc import CeFMCConfig
from fedapp.report.records import PROGRESS_MARKER
from simulation.listing import describe_methods, render_config_toml

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simulation", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


# ----------------------------------------------------------------------------------------- presets
def test_every_preset_is_a_valid_run_config() -> None:
    presets = available_presets()
    assert presets, "no preset files under simulation/presets/"
    for preset in presets.values():
        assert preset.method in METHODS and preset.description
        parse_run_config(preset.overrides, cross_checks=False)


def test_preset_values_yield_to_the_command_line() -> None:
    merged = apply_preset("cefmc-paper", {"method": "cefmc", "dataset": "digits-mv", "cefmc.mm-factor": 2.0})
    cfg = parse_run_config(merged)
    assert cfg.num_rounds == 100  # from the preset
    assert cfg.params(CeFMCConfig).mm_factor == 2.0  # the command line wins
    assert parse_run_config(apply_preset("cefmc-paper", {"dataset": "digits-mv"})).method == "cefmc"


def test_preset_errors() -> None:
    with pytest.raises(ConfigError, match="preset 'cefmc-paper' is for method 'cefmc', not 'kfed'"):
        apply_preset("cefmc-paper", {"method": "kfed"})
    with pytest.raises(ConfigError, match="unknown preset 'nope'; choose one of"):
        load_preset("nope")


def test_a_preset_extends_another_and_states_only_what_it_changes(tmp_path: Path, monkeypatch) -> None:
    import fedapp.launch.presets as presets

    (tmp_path / "base.toml").write_text(
        '[preset]\nmethod = "cefmc"\ndescription = "b"\n'
        "[config]\nnum-rounds = 7\n[config.cefmc]\nmm-factor = 2.0\n"
    )
    (tmp_path / "variant.toml").write_text(
        '[preset]\nmethod = "cefmc"\nextends = "base"\ndescription = "v"\n[config.cefmc]\nmm-factor = 3.0\n'
    )
    (tmp_path / "loop.toml").write_text('[preset]\nmethod = "cefmc"\nextends = "loop"\n')
    (tmp_path / "other.toml").write_text('[preset]\nmethod = "kfed"\nextends = "base"\n')
    (tmp_path / "dangling.toml").write_text('[preset]\nmethod = "cefmc"\nextends = "gone"\n')
    monkeypatch.setattr(presets, "PRESETS_DIR", tmp_path)
    variant = presets.load_preset("variant")
    assert variant.overrides == {"method": "cefmc", "num-rounds": 7, "cefmc.mm-factor": 3.0}
    with pytest.raises(ConfigError, match="extends itself: loop -> loop"):
        presets.load_preset("loop")
    with pytest.raises(ConfigError, match="extends 'base', a preset for 'cefmc'"):
        presets.load_preset("other")
    with pytest.raises(ConfigError, match="preset 'dangling' extends 'gone': unknown preset 'gone'"):
        presets.load_preset("dangling")


def test_ccfc_cpu_hetero_is_ccfc_cpu_with_lambda_1_and_global_centroids() -> None:
    base, hetero = load_preset("ccfc-cpu").overrides, load_preset("ccfc-cpu-hetero").overrides
    assert hetero == {**base, "ccfc.lambda": 1.0, "ccfc.centroid-model": "global"}


# -------------------------------------------------------------------------------------- resources
def test_client_resources_map_to_flowers_federation_config() -> None:
    assert ClientResources(cpus=1, gpus=0.1).federation_config(10) == (
        "num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.1"
    )
    assert ClientResources().federation_config(3).endswith("client-resources-num-gpus=0")


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (ClientResources(cpus=0), "whole number >= 1"),
        (ClientResources(cpus=3), "exceeds the 2 CPUs"),
        (ClientResources(gpus=-0.5), ">= 0"),
        (ClientResources(gpus=0.1), "no CUDA GPU is visible"),
    ],
)
def test_impossible_resources_fail_before_ray_starts(resources: ClientResources, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resources.validate(cpu_count=2, gpu_count=0)


def test_a_gpu_share_is_accepted_where_a_gpu_exists() -> None:
    ClientResources(cpus=1, gpus=0.1).validate(cpu_count=16, gpu_count=1)
    with pytest.raises(ConfigError, match="exceeds the 1 GPU"):
        ClientResources(gpus=2).validate(cpu_count=16, gpu_count=1)


# ---------------------------------------------------------------------------------------- listing
def test_methods_listing_shows_keys_defaults_docs_and_presets() -> None:
    text = describe_methods()
    assert "num-rounds" in text and "cefmc.lambda" in text and "ffcm.fuzziness" in text
    assert "preset cefmc-paper" in text
    one = describe_methods("kfed")
    assert "kfed.local-k" in one and "cefmc" not in one


def test_rendered_tables_are_what_pyproject_holds() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert render_config_toml() in text


# --------------------------------------------------------------------------------------- CLI errors
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "cefmc", "--set", "cefmc.lamda=0.5"], "did you mean 'cefmc.lambda'?"),
        (["--method", "kfed", "--set", "ffcm.fuzziness=1.2"], "belongs to method ffcm"),
        (["--method", "kfed", "--gpus-per-client", "99"], "--gpus-per-client 99"),  # any machine
        (["--preset", "cefmc-paper", "--method", "kfed"], "is for method 'cefmc'"),
    ],
)
def test_cli_config_errors_exit_2_fast(tmp_path: Path, args: list[str], message: str) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = _cli("run", *args, "--out", str(tmp_path / "out"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1  # one line naming the problem
    # refused before any work: the CLI's CPU seconds, not wall time (a loaded machine stretches that)
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 5
    assert not (tmp_path / "out" / "summary.json").exists()


# ------------------------------------------------------------------------------------------ output
def test_run_filtered_shows_progress_lines_and_logs_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = (
        f"print('\\x1b[92mINFO \\x1b[0m:      {PROGRESS_MARKER} round 1/2 | 0.1 s'); "
        "print('INFO : History (metrics, distributed, fit):'); print('WARNING : noisy warning')"
    )
    log = tmp_path / "flower.log"
    code = run_filtered([sys.executable, "-c", script], {}, log, quiet=False)
    assert code == 0
    assert capsys.readouterr().out == "round 1/2 | 0.1 s\n"
    logged = log.read_text()
    assert "History" in logged and "noisy warning" in logged and "\x1b[" not in logged


def test_an_inprocess_run_prints_one_line_per_round(tmp_path: Path) -> None:
    result = _cli(
        "run", "--method", "ffcm", "--dataset", "digits", "--clients", "3", "--rounds", "3",
        "--engine", "inprocess", "--out", str(tmp_path), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rounds = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    assert [line.split(" |")[0] for line in rounds] == ["round 1/3", "round 2/3", "round 3/3"]
    assert all("nmi" in line and "clients" in line for line in rounds)
    assert "History" not in result.stdout and "configure_fit" not in result.stdout
    logged = (tmp_path / "flower.log").read_text()
    assert "[fedapp] round 3/3" in logged and "status: completed" in logged
