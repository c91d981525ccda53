"""A deployment from containers on this machine: `fedapp deploy --containers`.

    fedapp deploy --containers --method kfed --node-data 'csv:/sites/site-{partition-id}.csv' \\
        --clients 3 --set k=0 --out results/kfed-containers

The SuperLink and N SuperNodes run from the images of deploy/containers/Containerfile under Compose
(podman-compose or docker compose), on the host network and 127.0.0.1, TLS and SuperNode authentication
on: a fresh CA, server certificate and node keys (deploy/secure.py) are mounted read-only, each into the
container that needs it, never into an image. Each SuperNode sees one file, its site's, mounted read-only
at /data/site, and writes its assignments to OUT/nodes/<partition-id>/; the run's outputs (summary.json,
the model) land in OUT through the SuperLink's mount. `flwr run` runs here, prints one line per round, and
every container is removed at the end: after success, an error or Ctrl-C.

The Compose file is `compose_file(nodes)`; deploy/containers/compose.yaml is that file for 3 SuperNodes
(`tests/test_containers.py` keeps them equal), with the variables this module fills in (`environment`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import yaml

from deploy.secure import make_certificates, make_node_keys
from fedapp.config.run import ConfigError
from fedapp.datasets import PARTITION_PLACEHOLDER
from fedapp.launch.app_dir import flower_app_dir
from fedapp.launch.processes import (
    Interrupted,
    ProcessError,
    console_script,
    flower_env,
    free_port,
    run_filtered,
    wait_for_health,
)
from fedapp.methods import method_spec

COMPOSE_FILE = Path(__file__).resolve().parent / "containers" / "compose.yaml"
CONTAINER_UID = 49999  # the images' user `app` (Flower's images use the same)
FIRST_NODE_PORT = 9094  # SuperNode i's Runtime API: FIRST_NODE_PORT + i (one host network)
START_TIMEOUT_S = 90
DEFAULT_IMAGES = {"superlink": "fedapp-superlink:none", "supernode": "fedapp-supernode:none"}


def _superlink() -> dict[str, Any]:
    tls = ["--ssl-ca-certfile", "/certs/ca.crt", "--ssl-certfile", "/certs/server.pem"]
    tls += ["--ssl-keyfile", "/certs/server.key"]
    return {
        "image": "${FEDAPP_SUPERLINK_IMAGE:-" + DEFAULT_IMAGES["superlink"] + "}",
        "container_name": "${FEDAPP_PROJECT:-fedapp}-superlink",
        **_hardening(),
        "environment": {**_environment(), "FEDAPP_HEALTH_PORT": "${FEDAPP_PORT:-9092}"},
        "command": [
            *tls,
            "--enable-supernode-auth",
            "--disable-runtime-dependency-installation",
            "--host",
            "${FEDAPP_HOST:-127.0.0.1}",
            "--port",
            "${FEDAPP_PORT:-9092}",
        ],
        "volumes": [
            "${FEDAPP_CERTS:?}/ca.crt:/certs/ca.crt:ro",
            "${FEDAPP_CERTS:?}/server.pem:/certs/server.pem:ro",
            "${FEDAPP_CERTS:?}/server.key:/certs/server.key:ro",
            "${FEDAPP_OUT:?}:/out",
        ],
    }


def _supernode(index: int, nodes: int) -> dict[str, Any]:
    partition = index % nodes  # an extra (unregistered) node claims an existing partition
    port = f"${{FEDAPP_NODE_PORT_{index}:-{FIRST_NODE_PORT + index}}}"
    node_config = (
        f"partition-id={partition} num-partitions={nodes} dataset='${{FEDAPP_FORMAT:-csv}}:/data/site' "
        "node-out-dir='/out'"
    )
    return {
        "image": "${FEDAPP_SUPERNODE_IMAGE:-" + DEFAULT_IMAGES["supernode"] + "}",
        "container_name": f"${{FEDAPP_PROJECT:-fedapp}}-supernode-{index}",
        **_hardening(),
        "environment": {**_environment(), "FEDAPP_HEALTH_PORT": port},
        "command": [
            "--root-certificates",
            "/certs/ca.crt",
            "--auth-supernode-private-key",
            "/keys/node",
            "--superlink",
            "${FEDAPP_SUPERLINK:-127.0.0.1:9092}",
            "--port",
            port,
            "--node-config",
            node_config,
        ],
        "volumes": [
            "${FEDAPP_CERTS:?}/ca.crt:/certs/ca.crt:ro",
            f"${{FEDAPP_KEYS:-./keys}}/node{index}:/keys/node:ro",
            f"${{FEDAPP_SITE_{index}:-./site-{index}}}:/data/site:ro",
            f"${{FEDAPP_OUT:?}}/nodes/{partition}:/out",
        ],
        "depends_on": ["superlink"],
    }


def _hardening() -> dict[str, Any]:
    """What every service shares: host network, non-root, a read-only root file system (Flower's state
    and the app bundle in a tmpfs), no capabilities."""
    return {
        "network_mode": "host",
        "user": "${FEDAPP_UID:-49999}:${FEDAPP_GID:-49999}",
        "read_only": True,
        "tmpfs": ["/tmp"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "restart": "no",
    }


def _environment() -> dict[str, str]:
    return {"FLWR_HOME": "/tmp/flwr", "HOME": "/tmp", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def compose_file(nodes: int, unregistered: int = 0) -> dict[str, Any]:
    """The Compose file of a SuperLink and `nodes` SuperNodes (+ `unregistered` SuperNodes whose keys the
    SuperLink never sees, which it must refuse)."""
    services = {"superlink": _superlink()}
    for index in range(nodes + unregistered):
        services[f"supernode-{index}"] = _supernode(index, nodes)
    return {"services": services}


@dataclass(frozen=True)
class ContainerRun:
    """What one containerised deployment needs besides its run config."""

    node_data: str  # the sites' files, e.g. csv:/sites/site-{partition-id}.csv (host paths)
    nodes: int
    unregistered: int = 0
    superlink_image: str = DEFAULT_IMAGES["superlink"]
    supernode_image: str = DEFAULT_IMAGES["supernode"]


def compose_command() -> list[str]:
    """podman-compose when present (this project's machines), else docker compose; FEDAPP_COMPOSE wins."""
    if os.environ.get("FEDAPP_COMPOSE"):
        return os.environ["FEDAPP_COMPOSE"].split()
    podman_compose = console_script("podman-compose")
    if shutil.which(podman_compose) or Path(podman_compose).exists():
        return [podman_compose]
    return ["docker", "compose"]


def engine_of(compose: list[str]) -> str:
    return "podman" if "podman" in Path(compose[0]).name else "docker"


def site_files(node_data: str, nodes: int) -> tuple[str, list[Path]]:
    """The format prefix and each site's file; a missing one is a ConfigError naming it."""
    prefix, sep, pattern = node_data.partition(":")
    if not sep or PARTITION_PLACEHOLDER not in pattern:
        raise ConfigError(f"--node-data needs FORMAT:PATH with {PARTITION_PLACEHOLDER}: {node_data}")
    files = [
        Path(pattern.replace(PARTITION_PLACEHOLDER, str(i))).expanduser().resolve() for i in range(nodes)
    ]
    missing = next((path for path in files if not path.exists()), None)
    if missing is not None:
        raise ConfigError(f"--node-data: {missing}: no such file (client {files.index(missing)})")
    return prefix, files


def check_images(method: str, run: ContainerRun) -> None:
    """Both images exist, and a torch method's were built with torch (their io.fedapp.torch label): a
    ConfigError before anything starts otherwise."""
    engine = engine_of(compose_command())
    for image in (run.superlink_image, run.supernode_image):
        _check_image(method, image, engine)


def _check_image(method: str, image: str, engine: str) -> None:
    spec = method_spec(method)
    inspect = [engine, "image", "inspect", "--format", '{{index .Config.Labels "io.fedapp.torch"}}', image]
    result = subprocess.run(inspect, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise ConfigError(f"image {image} not found ({engine}): build it (docs/deployment.md)")
    if spec.extra and result.stdout.strip() == "none":
        raise ConfigError(
            f"method '{method}' needs the '{spec.extra}' extra but image {image} was built with TORCH=none: "
            "use an image built with TORCH=cpu or TORCH=cuda (--supernode-image / --superlink-image)"
        )


def environment(
    run: ContainerRun, project: str, work_dir: Path, out_dir: Path, files: list[Path], fmt: str, port: int
) -> dict[str, str]:
    """The Compose variables of this deployment (compose.yaml documents each)."""
    uid = CONTAINER_UID if os.geteuid() == 0 else os.getuid()  # root chowns to the images' user
    values = {
        "FEDAPP_PROJECT": project,
        "FEDAPP_SUPERLINK_IMAGE": run.superlink_image,
        "FEDAPP_SUPERNODE_IMAGE": run.supernode_image,
        "FEDAPP_UID": str(uid),
        "FEDAPP_GID": str(uid if os.geteuid() == 0 else os.getgid()),
        "FEDAPP_HOST": "127.0.0.1",
        "FEDAPP_PORT": str(port),
        "FEDAPP_SUPERLINK": f"127.0.0.1:{port}",
        "FEDAPP_CERTS": str(work_dir / "certs"),
        "FEDAPP_KEYS": str(work_dir / "keys"),
        "FEDAPP_OUT": str(out_dir),
        "FEDAPP_FORMAT": fmt,
    }
    for index in range(run.nodes + run.unregistered):
        values[f"FEDAPP_SITE_{index}"] = str(files[index % run.nodes])
        values[f"FEDAPP_NODE_PORT_{index}"] = str(free_port())  # a shared machine: ports that are free now
    return values


def _hand_over(paths: list[Path]) -> None:
    """The containers' user must read the mounted certificates and keys and write the output folders: as
    root, the files become theirs (secrets stay 0600); otherwise they already belong to the caller."""
    if os.geteuid() != 0:
        return
    for path in paths:
        for item in [path, *path.rglob("*")]:
            os.chown(item, CONTAINER_UID, CONTAINER_UID)


def deploy_containers(overrides: Mapping[str, Any], run: ContainerRun, work_dir: Path) -> int:
    """Bring the deployment up, run the app with `flwr run`, take everything down; returns flwr's exit code
    (1 when an unregistered node got in)."""
    fmt, files = site_files(run.node_data, run.nodes)
    out_dir = Path(overrides["out-dir"])
    compose = compose_command()
    engine = engine_of(compose)
    project = f"fedapp-{os.getpid()}"
    certs = make_certificates(work_dir / "certs")
    names = [f"node{i}" for i in range(run.nodes + run.unregistered)]
    keys = make_node_keys(work_dir / "keys", names)
    for index in range(run.nodes):
        (out_dir / "nodes" / str(index)).mkdir(parents=True, exist_ok=True)
    _hand_over([work_dir / "certs", work_dir / "keys", out_dir])
    compose_path = work_dir / "compose.yaml"
    compose_path.write_text(yaml.safe_dump(compose_file(run.nodes, run.unregistered), sort_keys=False))
    port = free_port()
    variables = environment(run, project, work_dir, out_dir, files, fmt, port)
    env = {**flower_env(work_dir / "flwr-home"), **variables}
    up = [*compose, "-p", project, "-f", str(compose_path)]
    services = [f"supernode-{i}" for i in range(len(names))]
    interrupted: Interrupted | None = None
    try:
        _compose(up + ["up", "-d", "superlink"], env)
        link = Container(engine, f"{project}-superlink")
        what = "the SuperLink container"
        wait_for_health(port, link, START_TIMEOUT_S, what, ca_file=certs["ca"])  # type: ignore[arg-type]
        print(f"SuperLink container on 127.0.0.1:{port} (TLS, SuperNode auth)", flush=True)
        flwr_home = work_dir / "flwr-home"
        connection = {"address": f"127.0.0.1:{port}", "root-certificates": str(certs["ca"])}
        (flwr_home / "config.toml").write_text(
            tomli_w.dumps({"superlink": {"default": "deploy", "deploy": connection}})
        )
        for name in names[: run.nodes]:  # only these keys are registered
            register = [console_script("flwr"), "supernode", "register", str(keys[name][1]), "deploy"]
            subprocess.run(register, env=env, check=True, capture_output=True, timeout=60)
        _compose(up + ["up", "-d", *services], env)
        for index in range(len(names)):
            extra = " (unregistered key)" if index >= run.nodes else ""
            print(f"SuperNode container {index}: {files[index % run.nodes].name}{extra}", flush=True)
        run_config = work_dir / "run-config.toml"
        container_paths = {"out-dir": "/out", "node-out-dir": "/out", "dataset": f"{fmt}:/data/site"}
        run_config.write_text(tomli_w.dumps({**dict(overrides), **container_paths}))
        app_dir = flower_app_dir(work_dir)
        command = [console_script("flwr"), "run", str(app_dir), "deploy", "--stream", "--run-config"]
        log_path = out_dir / "flower.log"
        print(f"flwr run (full log: {log_path})", flush=True)
        code = run_filtered([*command, str(run_config)], env, log_path, quiet=False, cwd=app_dir)
        for index in range(run.nodes, len(names)):
            state = _container_state(engine, f"{project}-supernode-{index}")
            refused = state is not None and not state[0] and state[1] != 0
            verdict = f"refused, exit code {state[1]}" if refused and state else f"ACCEPTED ({state})"
            print(f"unregistered SuperNode {index}: {verdict}", flush=True)
            code = code if refused else code or 1
        return code
    except Interrupted as exc:
        interrupted = exc  # told below what the take-down verified
        raise
    finally:
        containers = [f"{project}-superlink", *(f"{project}-{service}" for service in services)]
        removed = _take_down(up, env, engine, containers, out_dir / "container-logs")
        if interrupted is not None:
            interrupted.stopped = removed


def _compose(command: list[str], env: dict[str, str]) -> None:
    """A Compose call whose exit code is not trusted alone (podman-compose can exit 0 on failure)."""
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise ProcessError(f"{' '.join(command[-3:])} failed: {result.stderr.strip()[-500:]}")


class Container:
    """A container seen as `wait_for_health` sees a process: `poll()` is None while it runs."""

    def __init__(self, engine: str, name: str) -> None:
        self.engine, self.name, self.returncode = engine, name, 0

    def poll(self) -> int | None:
        state = _container_state(self.engine, self.name)
        if state is not None and state[0]:
            return None
        self.returncode = state[1] if state else -1
        return self.returncode


def _container_state(engine: str, name: str) -> tuple[bool, int] | None:
    """(running, exit code) of a container, None when it does not exist."""
    inspect = [engine, "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name]
    result = subprocess.run(inspect, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return None
    running, code = result.stdout.split()
    return running == "true", int(code)


def _take_down(up: list[str], env: dict[str, str], engine: str, names: list[str], logs: Path) -> str:
    """Each container's log into `logs` (a SuperNode's holds its ClientApp's lines), Compose down, then a
    check by name that none is left (removed if one is)."""
    logs.mkdir(parents=True, exist_ok=True)
    for name in names:
        service = name.split("-", 2)[-1]  # fedapp-<pid>-<service>
        with (logs / f"{service}.log").open("w") as handle:
            subprocess.run([engine, "logs", name], stdout=handle, stderr=subprocess.STDOUT, timeout=60)
    subprocess.run(up + ["down", "-t", "10"], env=env, capture_output=True, timeout=300)
    left = [name for name in names if _container_state(engine, name) is not None]
    if left:
        subprocess.run([engine, "rm", "-f", *left], capture_output=True, timeout=120)
    still = [name for name in names if _container_state(engine, name) is not None]
    removed = f"removed {len(names) - len(still)}/{len(names)} containers"
    print(removed, flush=True)
    if still:
        print(f"warning: containers left: {', '.join(still)}", file=sys.stderr)
    return removed + (f" (left: {', '.join(still)})" if still else "")


COMPOSE_HEADER = """\
# fedapp: a SuperLink and three SuperNodes from the images of deploy/containers/Containerfile, TLS and
# SuperNode authentication on, on the host network. Generated by `python deploy/run_containers.py`
# (a test keeps it equal to what `fedapp deploy --containers` runs); docs/deployment.md explains it.
#
# Variables (an .env file beside it, or the environment); FEDAPP_CERTS and FEDAPP_OUT must be set on every
# machine, the others have defaults (a machine sets those of the services it starts):
#   FEDAPP_CERTS   folder with ca.crt (+ server.pem, server.key on the SuperLink's machine): deploy/secure.py
#   FEDAPP_KEYS    folder with nodeI, SuperNode I's private key (default ./keys; python deploy/secure.py
#                  node-keys DIR --nodes 3); register nodeI.pub first: flwr supernode register nodeI.pub CONN
#   FEDAPP_SITE_I  SuperNode I's own data file (or image folder), mounted read-only at /data/site
#   FEDAPP_FORMAT  its format: csv (default), tsv, jsonl, parquet, npy, npz, images
#   FEDAPP_OUT     outputs: the run's in FEDAPP_OUT, SuperNode I's assignments in FEDAPP_OUT/nodes/I
#   FEDAPP_SUPERLINK_IMAGE, FEDAPP_SUPERNODE_IMAGE, FEDAPP_UID/GID (49999, the images' user),
#   FEDAPP_HOST/FEDAPP_PORT (where the SuperLink listens), FEDAPP_SUPERLINK (where SuperNodes find it),
#   FEDAPP_NODE_PORT_I (SuperNode I's Runtime API port), FEDAPP_PROJECT (container name prefix)
# On real machines each site runs only its own supernode-I service, with FEDAPP_SUPERLINK pointing at the
# SuperLink's host and port.
"""


def main() -> None:
    """Print deploy/containers/compose.yaml."""
    print(COMPOSE_HEADER + yaml.safe_dump(compose_file(3), sort_keys=False, width=110), end="")


if __name__ == "__main__":
    main()
