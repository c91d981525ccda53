"""Deployment on one machine: a real SuperLink and N SuperNodes on 127.0.0.1, then `flwr run`.

    .venv/bin/python deploy/run_local.py --method kfed --dataset digits --clients 3 --rounds 2 --out DIR

Each SuperNode gets its own Runtime API port and `--node-config "partition-id=i num-partitions=N
node-out-dir='DIR/nodes/i'"` (where it writes its records' assignments.csv); with `--node-data SPEC` also
`dataset='SPEC'` with `{partition-id}` replaced by i: that file is the only data the node reads, as on a
real machine (no `--dataset` needed; the run config then says only what kind of data is expected).
Everything this script starts is stopped by PID (process group) at the end, also on error or Ctrl-C;
the PIDs are written to DIR/deploy-pids.json so a caller can check. With `--containers` the SuperLink and
SuperNodes run from the images of deploy/containers instead (deploy/run_containers.py). For real machines
see docs/deployment.md (the same with TLS and SuperNode authentication instead of --insecure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tomli_w  # noqa: E402

from deploy.run_containers import (  # noqa: E402
    DEFAULT_IMAGES,
    ContainerRun,
    check_images,
    deploy_containers,
    site_files,
)
from deploy.secure import make_certificates, make_node_keys  # noqa: E402
from fedapp.app.preflight import check_dependencies, check_out_dir  # noqa: E402
from fedapp.datasets import PARTITION_PLACEHOLDER, has_placeholder  # noqa: E402
from fedapp.launch.app_dir import flower_app_dir  # noqa: E402
from fedapp.launch.options import ClientResources, merge_flags, parse_set_options, path_argument  # noqa: E402
from fedapp.launch.outputs import check_outputs, clear_outputs  # noqa: E402
from fedapp.launch.presets import apply_preset  # noqa: E402
from fedapp.launch.processes import (  # noqa: E402
    REPORT_GRACE_S,
    RUN_TOKEN_ENV,
    Interrupted,
    ProcessError,
    console_script,
    flower_env,
    free_port,
    interruptible,
    report_interrupt,
    run_filtered,
    start_logged,
    wait_for_health,
)
from fedapp.launch.resolve import ResolvedRun, absolute_spec, build_overrides, validate  # noqa: E402
from fedapp.launch.sweep import stop_run  # noqa: E402
from fedapp.launch.watchdog import start_watchdog, stop_watchdog  # noqa: E402
from fedapp.report.records import await_report, exit_code, mark_summary, status_line  # noqa: E402

START_TIMEOUT_S = 60
DEFAULTS = {"method": "kfed", "dataset": "digits", "num-clients": 3, "num-rounds": 2, "seed": 0}


@dataclass(frozen=True)
class Security:
    """How the loopback deployment is secured (see deploy/secure.py for what the files are)."""

    tls: bool = False
    auth: bool = False
    unregistered_nodes: int = 0  # extra SuperNodes with keys the SuperLink never saw: they must be refused


def node_config(index: int, num_clients: int, out_dir: Path, node_data: str | None) -> str:
    """A SuperNode's --node-config: its partition, where it writes, and (own data) its file."""
    items = [
        f"partition-id={index % num_clients}",
        f"num-partitions={num_clients}",
        f"node-out-dir={_toml_string(str(out_dir / 'nodes' / str(index % num_clients)))}",
    ]
    if node_data:
        items.append(
            f"dataset={_toml_string(node_data.replace(PARTITION_PLACEHOLDER, str(index % num_clients)))}"
        )
    return " ".join(items)


def _toml_string(value: str) -> str:
    if "'" in value:
        raise ValueError(f"a node-config path may not contain a single quote: {value!r}")
    return f"'{value}'"


@dataclass
class _Started:
    """Every process the deployment started, in `processes` (stopped whatever happens; `flwr run` joins it
    there), and the SuperLink's and each SuperNode's by name in `named` (deploy-pids.json, the verdicts)."""

    processes: list[subprocess.Popen] = field(default_factory=list)
    named: dict[str, subprocess.Popen] = field(default_factory=dict)

    def add(self, name: str, process: subprocess.Popen) -> None:
        self.processes.append(process)
        self.named[name] = process


def _security_flags(certs: Mapping[str, Path]) -> tuple[list[str], list[str]]:
    """(the SuperLink's, a SuperNode's) TLS flags: the certificates of deploy/secure.py, or --insecure."""
    if not certs:
        return ["--insecure"], ["--insecure"]
    link = ["--ssl-ca-certfile", str(certs["ca"]), "--ssl-certfile", str(certs["cert"])]
    return [*link, "--ssl-keyfile", str(certs["key"])], ["--root-certificates", str(certs["ca"])]


def _start_superlink(
    env: dict[str, str],
    work_dir: Path,
    port: int,
    certs: Mapping[str, Path],
    security: Security,
    started: _Started,
) -> subprocess.Popen:
    """flower-superlink on 127.0.0.1:`port` (its log in work_dir), added to `started` as it starts (the
    caller stops it whatever happens), returned once its health check answers."""
    command = [
        console_script("flower-superlink"),
        *_security_flags(certs)[0],
        *(["--enable-supernode-auth"] if security.auth else []),
        "--disable-runtime-dependency-installation",
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    superlink = start_logged(command, env, work_dir / "superlink.log")
    started.add("superlink", superlink)
    what = f"flower-superlink (log {work_dir / 'superlink.log'})"
    wait_for_health(port, superlink, START_TIMEOUT_S, what, ca_file=certs.get("ca"))
    mode = ", ".join(m for m, on in (("TLS", security.tls), ("SuperNode auth", security.auth)) if on)
    print(f"SuperLink pid {superlink.pid} on 127.0.0.1:{port} ({mode or 'insecure'})", flush=True)
    return superlink


def _start_supernodes(
    env: dict[str, str],
    work_dir: Path,
    port: int,
    certs: Mapping[str, Path],
    keys: Mapping[str, tuple[Path, Path]],
    names: list[str],
    num_clients: int,
    out_dir: Path,
    node_data: str | None,
    started: _Started,
) -> None:
    """Register the first `num_clients` nodes' keys (with auth), then start a flower-supernode per name,
    each added to `started` as `supernode<i>` as it starts (the caller stops them whatever happens)."""
    for name in names[:num_clients]:  # only these keys are registered
        if keys:
            register = [console_script("flwr"), "supernode", "register", str(keys[name][1]), "deploy"]
            subprocess.run(register, env=env, check=True, capture_output=True, timeout=60)
    for index, name in enumerate(names):
        auth = ["--auth-supernode-private-key", str(keys[name][0])] if keys else []
        command = [
            console_script("flower-supernode"),
            *_security_flags(certs)[1],
            *auth,
            *("--superlink", f"127.0.0.1:{port}", "--port", str(free_port())),
            *("--node-config", node_config(index, num_clients, out_dir, node_data)),
        ]
        node = start_logged(command, env, work_dir / f"supernode{index}.log")
        started.add(f"supernode{index}", node)
        extra = " (unregistered key)" if index >= num_clients else ""
        print(f"SuperNode {index} pid {node.pid}{extra}", flush=True)


def _unregistered_admitted(nodes: list[subprocess.Popen], first_index: int) -> bool:
    """Print each unregistered SuperNode's fate; True when one got in (the deployment is not secure)."""
    admitted = False
    for index, node in enumerate(nodes, start=first_index):
        refused = node.poll()
        print(f"unregistered SuperNode {index}: {f'refused, exit code {refused}' if refused else 'ACCEPTED'}")
        admitted = admitted or not refused
    sys.stdout.flush()
    return admitted


def deploy(
    overrides: Mapping[str, Any],
    num_clients: int,
    work_dir: Path,
    security: Security = Security(),
    node_data: str | None = None,
) -> int:
    """Start SuperLink + SuperNodes, run the app, stop everything; returns `flwr run`'s exit code."""
    flwr_home = work_dir / "flwr-home"
    flwr_home.mkdir(parents=True, exist_ok=True)
    env = flower_env(flwr_home)
    out_dir = Path(overrides["out-dir"])
    guard = start_watchdog(env[RUN_TOKEN_ENV], [work_dir], home=flwr_home, out_dir=out_dir)  # on SIGKILL
    link_port = free_port()
    certs = make_certificates(work_dir / "certs") if security.tls else {}
    connection: dict[str, object] = {"address": f"127.0.0.1:{link_port}"}
    connection.update({"root-certificates": str(certs["ca"])} if certs else {"insecure": True})
    (flwr_home / "config.toml").write_text(
        tomli_w.dumps({"superlink": {"default": "deploy", "deploy": connection}})
    )
    names = [f"node{i}" for i in range(num_clients + security.unregistered_nodes)]
    keys = make_node_keys(work_dir / "keys", names) if security.auth else {}
    started = _Started()
    lost = ""  # the SuperLink died on its own: said once every process has stopped
    interrupted: Interrupted | None = None
    try:
        superlink = _start_superlink(env, work_dir, link_port, certs, security, started)
        _start_supernodes(
            env, work_dir, link_port, certs, keys, names, num_clients, out_dir, node_data, started
        )
        run_config = work_dir / "run-config.toml"
        run_config.write_text(tomli_w.dumps(dict(overrides)))
        app_dir = flower_app_dir(work_dir)  # the app's packages, copied
        command = [console_script("flwr"), "run", str(app_dir), "deploy", "--stream"]
        command += ["--run-config", str(run_config)]
        log_path = out_dir / "flower.log"
        print(f"flwr run (full log: {log_path})", flush=True)
        try:
            code = run_filtered(command, env, log_path, quiet=False, cwd=app_dir, started=started.processes)
        except Interrupted:  # in the final report, the run has run through: let it keep its outputs
            await_report(out_dir, REPORT_GRACE_S)
            raise
        if code != 0 and superlink.poll() is not None:  # it died on its own, mid-run
            lost = f"SuperLink connection lost (flower-superlink exit code {superlink.returncode})"
        strangers = [started.named[f"supernode{index}"] for index in range(num_clients, len(names))]
        if _unregistered_admitted(strangers, num_clients):
            code = code or 1  # a node with an unknown key got in: the deployment is not secure
        return code
    except Interrupted as exc:
        interrupted = exc  # told below what the sweep verified
        raise
    finally:
        stopped = stop_run(env[RUN_TOKEN_ENV], flwr_home, started.processes)  # token, private home, descent
        if interrupted is not None:
            interrupted.stopped = stopped.describe()
        still_running = [process for process in started.processes if process.poll() is None]
        pids = {name: process.pid for name, process in started.named.items()}
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "deploy-pids.json").write_text(json.dumps(pids, indent=2))
        total = len(started.processes)
        print(f"stopped {total - len(still_running)}/{total} processes", flush=True)
        if not stopped.clean:
            print(f"warning: {stopped.describe()}", file=sys.stderr)
        stop_watchdog(guard)
        if lost:  # the ServerApp is gone now: nothing overwrites the cause any more
            mark_summary(out_dir, "failed", lost)
            print(f"error: {lost}", file=sys.stderr, flush=True)


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--method", help="default kfed")
    parser.add_argument("--dataset", help="a registered dataset or a source spec (default digits)")
    parser.add_argument(
        "--node-data",
        metavar="SPEC",
        help="each SuperNode reads only its own file, e.g. 'csv:/data/site-{partition-id}.csv'",
    )
    parser.add_argument("--clients", type=int, help="SuperNodes (default 3)")
    parser.add_argument("--rounds", type=int, help="default 2")
    parser.add_argument("--seed", type=int, help="default 0")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--preset", help="named run-config values (see `python -m simulation methods`)")
    parser.add_argument(
        "--tls", action="store_true", help="TLS with a freshly made CA and server certificate"
    )
    parser.add_argument("--auth", action="store_true", help="SuperNode authentication with registered keys")
    parser.add_argument(
        "--unregistered-nodes",
        type=int,
        default=0,
        help="with --auth: this many extra SuperNodes whose keys are not registered (they must be refused)",
    )
    parser.add_argument(
        "--containers",
        action="store_true",
        help="run the SuperLink and SuperNodes from the images of deploy/containers (Compose, TLS and "
        "SuperNode authentication on; needs --node-data): docs/deployment.md",
    )
    parser.add_argument("--superlink-image", default=DEFAULT_IMAGES["superlink"], help="with --containers")
    parser.add_argument("--supernode-image", default=DEFAULT_IMAGES["supernode"], help="with --containers")
    parser.add_argument("--out", type=path_argument, required=True)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the configuration (and, without --node-data, the data); start nothing",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="--out holds an earlier run's outputs: remove them first (only files fedapp writes)",
    )
    return parser


def _checked(args: argparse.Namespace) -> tuple[ResolvedRun, str | None, ContainerRun | None]:
    """The resolved run, each node's absolute data spec and the container plan, checked before any
    process starts; ValueError names the first problem."""
    if args.containers and not args.node_data:
        raise ValueError("--containers needs --node-data: each SuperNode container mounts its own file")
    if args.node_data and not has_placeholder(args.node_data):
        raise ValueError(f"--node-data needs {PARTITION_PLACEHOLDER} in its path: {args.node_data}")
    flags = {
        "method": args.method,
        "dataset": args.dataset or args.node_data,
        "num-clients": args.clients,
        "num-rounds": args.rounds,
        "seed": args.seed,
    }
    base = {**DEFAULTS, **merge_flags(flags, parse_set_options(args.set), args.out)}
    run = build_overrides(apply_preset(args.preset, base), args.out)  # resolved once
    node_data = absolute_spec(args.node_data) if args.node_data else None
    container_run = None
    if node_data is None:  # a shared dataset is checked here, as by `fedapp run`
        validate(run, "flwr", ClientResources(), overwrite=args.overwrite)
        return run, node_data, container_run
    if args.containers:  # the images, not this machine, must hold the method's extra
        images = (args.superlink_image, args.supernode_image)
        container_run = ContainerRun(node_data, run.config.num_clients, args.unregistered_nodes, *images)
        site_files(node_data, run.config.num_clients)
        check_images(run.config.method, container_run)
    else:  # the nodes' own files are theirs to check (as on real machines); the output folder is ours
        check_dependencies(run.config.method)
    check_outputs(run.config, overwrite=args.overwrite)
    check_out_dir(Path(run.config.out_dir))
    return run, node_data, container_run


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    try:  # fail before starting any process
        run, node_data, container_run = _checked(args)
        if args.dry_run:
            print(f"dry run: {run.config.method} on {run.config.num_clients} SuperNodes: configuration OK")
            return 0
        if args.overwrite:
            clear_outputs(run.config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedapp-deploy-") as tmp:
        try:
            with interruptible():
                security = Security(tls=args.tls, auth=args.auth, unregistered_nodes=args.unregistered_nodes)
                if container_run is not None:
                    code = deploy_containers(run, container_run, Path(tmp))
                else:
                    code = deploy(run, run.config.num_clients, Path(tmp), security, node_data)
        except Interrupted as exc:
            exc.stopped = exc.stopped or "no process of the deployment had started"
            return report_interrupt(exc, args.out)
        except ProcessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    summary = args.out / "summary.json"
    if code != 0 or not summary.exists():
        ended = json.loads(summary.read_text()) if summary.exists() else {"status": "failed"}
        if not summary.exists():
            ended["status_reason"] = f"flwr run exit code {code}; the run wrote no summary.json"
        print(status_line(ended), file=sys.stderr)
        return 1
    result = json.loads(summary.read_text())
    status = result.get("status", "running")
    print(
        f"deployment {status} in {time.perf_counter() - started:.1f} s ({result.get('status_reason', '')}): "
        + "  ".join(
            f"{k}={v:.4g}" for k, v in result.get("metrics", {}).items() if isinstance(v, int | float)
        )
    )
    return exit_code(result)


if __name__ == "__main__":
    sys.exit(main())
