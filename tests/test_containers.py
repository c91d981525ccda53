"""The container deployment's files, checked without a container engine (CI): the Containerfile's layout
(Flower's image of the pinned version as the default base, a non-root user, health check, version labels,
dependencies and code in separate layers, no secret copied in), the Compose file (generated, TLS and
SuperNode authentication, read-only mounts, each SuperNode its own file and key), the dependency layer's
requirements per variant, and `fedapp deploy --containers` refusing before anything starts.

The images are built and the deployment run by `bash scripts/containers.sh` (minutes; podman)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy import run_containers
from deploy.containers.requirements import constraints, requirements
from deploy.run_containers import ContainerRun, compose_file

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "deploy" / "containers" / "Containerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def _stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions by its name (the last, unnamed one under "final")."""
    stages: dict[str, list[tuple[str, str]]] = {"global": []}
    current = "global"
    for instruction, args in _instructions():
        if instruction == "FROM":
            current = args.split(" AS ")[1].strip() if " AS " in args else "final"
            stages[current] = [(instruction, args)]
        else:
            stages[current].append((instruction, args))
    return stages


def test_the_default_base_is_flowers_image_of_the_pinned_version() -> None:
    arguments = dict(
        args.split("=", 1) for kind, args in _stages()["global"] if kind == "ARG" and "=" in args
    )
    pinned = re.search(r"^flwr==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert pinned and arguments["FLWR_VERSION"] == pinned.group(1)
    assert arguments["BASE_IMAGE"] == "flwr/${ROLE}:${FLWR_VERSION}" and arguments["ROLE"] == "supernode"
    assert _stages()["fedapp"][0] == ("FROM", "${BASE_IMAGE} AS fedapp")
    assert _stages()["final"][0] == ("FROM", "${ROLE}")  # the build argument ROLE picks the role's stage


@pytest.mark.parametrize("role", ["superlink", "supernode"])
def test_each_role_runs_as_a_non_root_user_with_a_health_check_and_labels(role: str) -> None:
    stages = _stages()
    common, own = stages["fedapp"], stages[role]
    assert own[0] == ("FROM", f"fedapp AS {role}")
    assert ("ENTRYPOINT", f'["flower-{role}"]') in own
    users = [args for kind, args in common + own if kind == "USER"]
    assert users[-1] == "app"  # the last USER wins: uid 49999, as in Flower's images
    assert any(kind == "HEALTHCHECK" and "fedapp-healthcheck.py" in args for kind, args in common)
    labels = " ".join(args for kind, args in common + own if kind == "LABEL")
    for label in (
        "org.opencontainers.image.version",
        "io.fedapp.flwr-version",
        "io.fedapp.torch",
        "io.fedapp.role",
    ):
        assert label in labels


def test_dependencies_and_code_are_separate_layers_and_no_secret_is_copied() -> None:
    steps = _stages()["fedapp"]
    copies = [(index, args) for index, (kind, args) in enumerate(steps) if kind in ("COPY", "ADD")]
    assert all(kind != "ADD" for kind, _ in steps)
    first_index, first = copies[0]
    assert first.split()[:-1] == ["pyproject.toml", "constraints.txt", "deploy/containers/requirements.py"]
    installs = [index for index, (kind, args) in enumerate(steps) if kind == "RUN" and "pip install" in args]
    code_index = next(index for index, args in copies if args.startswith("fedapp "))
    assert first_index < installs[0] < code_index < installs[-1]  # dependencies, then code
    assert "--no-deps" in steps[installs[-1]][1]
    sources = " ".join(args for _, args in copies)
    assert not re.search(r"\.key|\.pem|\.crt|node\d|certs|keys|/data", sources)
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[1] == "*" and "!.venv" not in ignored and "**/__pycache__" in ignored


def test_compose_yaml_is_the_generated_file() -> None:
    """deploy/containers/compose.yaml is `compose_file(3)`: what `fedapp deploy --containers` runs."""
    assert yaml.safe_load((ROOT / "deploy" / "containers" / "compose.yaml").read_text()) == compose_file(3)


def test_compose_secures_every_service_and_mounts_only_what_each_needs() -> None:
    services = compose_file(3, unregistered=1)["services"]
    link = services["superlink"]
    assert "--enable-supernode-auth" in link["command"] and "--ssl-keyfile" in link["command"]
    assert not any("ca.key" in volume for volume in link["volumes"])  # the CA's key stays with its owner
    for name, service in services.items():
        assert "--insecure" not in service["command"], name
        assert service["network_mode"] == "host" and service["read_only"] and service["cap_drop"] == ["ALL"]
        assert not service["user"].startswith("0") and "root" not in service["user"]
        secrets = [volume for volume in service["volumes"] if "/certs/" in volume or "/keys/" in volume]
        assert secrets and all(volume.endswith(":ro") for volume in secrets), name
    for index in range(4):
        volumes = services[f"supernode-{index}"]["volumes"]
        site = f"${{FEDAPP_SITE_{index}:-./site-{index}}}:/data/site:ro"
        assert [volume for volume in volumes if "/data" in volume] == [
            site
        ]  # its own file, read-only, only it
        assert f"${{FEDAPP_KEYS:-./keys}}/node{index}:/keys/node:ro" in volumes
        assert f"partition-id={index % 3} num-partitions=3" in services[f"supernode-{index}"]["command"][-1]
    ports = [service["command"][service["command"].index("--port") + 1] for service in services.values()]
    assert len(set(ports)) == len(ports)  # one host network: every API on its own port


def test_each_variant_installs_what_it_needs() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    none, cpu, cuda = (requirements(pyproject, torch) for torch in ("none", "cpu", "cuda"))
    assert not any(item.startswith(("torch", "sentence")) for item in none)
    assert any(item.startswith("sentence-transformers") for item in cpu)
    assert not any(re.match(r"^(torch|torchvision)\b", item) for item in cpu)  # TORCH_SPEC installs them
    assert any(item.startswith("torch>") for item in cuda) and any(
        item.startswith("torchvision") for item in cuda
    )
    assert all(not item.startswith("flwr[") for item in none + cpu + cuda)  # no Ray in a SuperLink/SuperNode
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert constraints(pins, "cuda") == pins and "torch==2.14.1" in pins
    assert not any(
        re.match(r"^(torch|torchvision|nvidia-|triton)", line) for line in constraints(pins, "cpu")
    )


def test_a_torch_method_on_an_image_without_torch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def inspect(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 0, stdout="none\n", stderr="")

    monkeypatch.setattr(run_containers.subprocess, "run", inspect)
    monkeypatch.setenv("FEDAPP_COMPOSE", "podman-compose")
    plan = ContainerRun("csv:/sites/site-{partition-id}.csv", 3)
    run_containers.check_images("kfed", plan)  # the NumPy methods run on it
    with pytest.raises(
        ValueError, match=r"method 'ccfc' needs the 'torch' extra but image fedapp-superlink:none"
    ):
        run_containers.check_images("ccfc", plan)


def test_deploy_containers_refuses_bad_input_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deploy.run_local import main

    assert main(["--containers", "--method", "kfed", "--out", str(tmp_path / "a")]) == 2
    assert "--containers needs --node-data" in capsys.readouterr().err
    missing = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    assert main(["--containers", "--node-data", missing, "--clients", "2", "--out", str(tmp_path / "b")]) == 2
    assert "site-0.csv: no such file (client 0)" in capsys.readouterr().err
