"""Dependencies by need: the base install runs the NumPy methods, the torch methods need `fedapp[torch]`,
and choosing one where torch is missing fails before anything starts, in one line naming the extra.

The fast tests hide torch (a finder that refuses its modules, `importlib.util.find_spec` returning None
for them); the slow one builds a real venv from `pip install .` alone and runs every NumPy method in it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fedapp.app.preflight import check_dependencies
from fedapp.config.run import ConfigError
from fedapp.launch import app_dir
from fedapp.methods import EXTRAS, METHODS, missing_modules
from simulation.__main__ import main
from tests.cli_timing import refusal_bound_s

ROOT = Path(__file__).resolve().parents[1]
NUMPY_METHODS = ("kfed", "ffcm", "cefmc", "fedcmv", "fedfcmv", "kmeans")
TORCH_MODULES = ("torch", "torchvision", "sentence_transformers")  # what the torch extra brings


@pytest.fixture
def without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a base install sees it: torch, torchvision and sentence-transformers not found."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in TORCH_MODULES:
            return None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_the_extras_match_pyproject() -> None:
    """The registry's extras are pyproject's optional dependency groups, and the base install lists none of
    their packages (nor flwr-datasets, which only a test uses)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    assert set(EXTRAS) <= set(optional)
    base = " ".join(project["dependencies"])
    for package in ("torch", "torchvision", "sentence-transformers", "safetensors", "flwr-datasets"):
        assert f'"{package}' not in base and f"{package}>" not in base, package
    assert any(item.startswith("flwr-datasets") for item in optional["dev"])
    torch_extra = " ".join(optional["torch"])
    assert all(package in torch_extra for package in ("torch", "torchvision", "sentence-transformers"))


def test_every_torch_method_declares_the_extra() -> None:
    """A method whose model is torch state needs the extra; the NumPy methods need none."""
    for spec in METHODS.values():
        if spec.torch_model:
            assert spec.extra == "torch", spec.name
    assert all(METHODS[name].extra == "" for name in (*NUMPY_METHODS, "fbow", "ftfidf", "cefmc-h"))


def test_flwr_run_gets_a_flower_app_folder_of_the_apps_packages(tmp_path: Path) -> None:
    """From a checkout or an installed wheel, `flwr run` gets a folder with the app's packages and a
    pyproject.toml that declares the same app (publisher, components, every key's default), and nothing
    else: Flower walks every file of the folder it packs, and a checkout holds the venv and run outputs."""
    folder = app_dir.flower_app_dir(tmp_path / "work")
    made = tomllib.loads((folder / "pyproject.toml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert made["tool"]["flwr"]["app"] == project["tool"]["flwr"]["app"]
    assert made["project"]["name"] == project["project"]["name"]
    assert (folder / "fedapp" / "app" / "server_app.py").is_file() and (
        folder / "clients" / "kfed.py"
    ).is_file()
    assert not list(folder.rglob("__pycache__"))
    assert sorted(path.name for path in folder.iterdir()) == [
        "clients",
        "fedapp",
        "pyproject.toml",
        "strategies",
    ]
    assert app_dir.flower_app_dir(tmp_path / "work") == folder  # made again, not added to


@pytest.mark.usefixtures("without_torch")
def test_a_torch_method_without_torch_is_refused_in_one_line() -> None:
    assert missing_modules(METHODS["ccfc"]) == list(EXTRAS["torch"]) == ["torch", "sentence_transformers"]
    with pytest.raises(
        ConfigError, match=r"method 'ccfc' needs the 'torch' extra .*pip install 'fedapp\[torch\]'"
    ):
        check_dependencies("ccfc")
    for name in NUMPY_METHODS:
        check_dependencies(name)  # nothing to refuse


@pytest.mark.usefixtures("without_torch")
@pytest.mark.parametrize("method", ["ccfc", "fsbert-kfed", "fsbert"])
def test_the_cli_refuses_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], method: str
) -> None:
    dataset = "digits" if method == "ccfc" else "texts-demo"
    code = main(
        ["run", "--method", method, "--dataset", dataset, "--clients", "2", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "fedapp[torch]" in err, err
    assert not (tmp_path / "o").exists()  # nothing was started, nothing written


@pytest.mark.usefixtures("without_torch")
def test_the_deployment_refuses_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from deploy.run_local import main as deploy_main

    code = deploy_main(
        [
            "--method",
            "ccfc",
            "--node-data",
            "csv:/nowhere/site-{partition-id}.csv",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2 and "fedapp[torch]" in capsys.readouterr().err


# A child interpreter where importing torch fails as in a base install: the NumPy methods must not need it.
_NO_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {modules!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)")
sys.meta_path.insert(0, NoTorch())
from simulation.__main__ import main
codes = [main(run.split()) for run in sys.argv[1:]]
sys.exit(max(codes))
"""


def _numpy_runs(out_root: Path, methods: tuple[str, ...], *extra: str) -> dict[str, str]:
    """One small `fedapp run` command line per method (vertical ones on digits' three views)."""
    vertical = "--dataset digits-mv --set max-samples=300"
    datasets = {"cefmc": vertical, "fedcmv": vertical, "fedfcmv": vertical}
    datasets |= {"fbow": "--dataset texts-demo --clients 3", "ftfidf": "--dataset texts-demo --clients 3"}
    horizontal = "--dataset digits --clients 3 --set max-samples=300"
    return {
        method: f"run --method {method} {datasets.get(method, horizontal)} --rounds 2"
        f" --out {out_root / method} {' '.join(extra)}"
        for method in methods
    }


def _assert_clustered(out: Path) -> None:
    """The run finished and found structure (the labels of the demo sets are there to check it)."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] in ("completed", "converged"), (out.name, summary.get("status_reason"))
    assert summary["metrics"]["nmi"] > 0.2, (out.name, summary["metrics"])


def test_numpy_methods_never_import_torch(tmp_path: Path) -> None:
    """Every NumPy method (FBOW / FTF-IDF too) runs (in-process engine) in one interpreter where torch cannot
    be imported."""
    runs = _numpy_runs(tmp_path, (*NUMPY_METHODS, "fbow", "ftfidf"), "--engine inprocess")
    command = [sys.executable, "-c", _NO_TORCH.format(modules=set(TORCH_MODULES)), *runs.values()]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for method in runs:
        _assert_clustered(tmp_path / method)


@pytest.mark.e2e
@pytest.mark.install
def test_a_base_install_runs_the_numpy_methods_and_refuses_ccfc(tmp_path: Path) -> None:
    """`pip install .` (no extra, under constraints.txt) into a fresh venv: the six NumPy methods run end to
    end (k-FED, FFCM and CeFMC through Flower's Ray simulation, the rest in-process: 40 s less each on 2
    cores); `--method ccfc` exits 2 in seconds, naming the extra. Minutes: deselected by default
    (`bash scripts/test.sh -m install tests/test_dependencies.py`; scripts/containers.sh runs it)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    install += ["-c", str(ROOT / "constraints.txt"), str(ROOT)]
    subprocess.run(install, check=True, timeout=1200, cwd=tmp_path)
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0
    fedapp = str(venv / "bin" / "fedapp")
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    for method, run in _numpy_runs(tmp_path, NUMPY_METHODS).items():
        engine = [] if method in ("kfed", "ffcm", "cefmc") else ["--engine", "inprocess"]
        result = subprocess.run(
            [fedapp, *run.split(), *engine],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env=env,
        )
        assert result.returncode == 0, f"{method}: {result.stdout[-1500:]}{result.stderr[-1500:]}"
        _assert_clustered(tmp_path / method)
    bound = refusal_bound_s()
    started = time.monotonic()
    refused = subprocess.run(
        [fedapp, "run", "--method", "ccfc", "--dataset", "digits", "--out", str(tmp_path / "ccfc")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert refused.returncode == 2 and time.monotonic() - started < bound
    assert refused.stderr.strip().count("\n") == 0 and "fedapp[torch]" in refused.stderr, refused.stderr


def test_a_clientapp_process_loads_no_optimizer_it_does_not_use() -> None:
    """A deployment starts a ClientApp process per message: loading the ClientApp and any method's client
    must not import SciPy's optimize package (0.33 s a process), which only the Hungarian matching of the
    labelled metrics needs (`fedapp.metrics.contingency`)."""
    script = (
        "import sys\n"
        "import fedapp.app.client_app\n"
        "from fedapp.methods import METHODS, load_class\n"
        "clients = [spec.client for spec in METHODS.values() if spec.client]\n"
        "for client in clients:\n"
        "    load_class(client)\n"
        "print(len(clients), 'scipy.optimize' in sys.modules)\n"
    )
    command = [sys.executable, "-c", script]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    count, loaded = out.stdout.split()
    assert int(count) >= 10 and loaded == "False", out.stdout
