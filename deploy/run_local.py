"""Deployment on one machine: a real SuperLink and N SuperNodes on 127.0.0.1, then `flwr run`.

    .venv/bin/python deploy/run_local.py --method kfed --dataset digits --clients 3 --rounds 2 --out DIR

Each SuperNode gets its own Runtime API port and `--node-config "partition-id=i num-partitions=N"`.
Everything this script starts is stopped by PID (process group) at the end, also on error or Ctrl-C;
the PIDs are written to DIR/deploy-pids.json so a caller can check. For real machines see README.md
(same commands with TLS and SuperNode authentication instead of --insecure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tomli_w  # noqa: E402

from fedapp.config import PROJECT_ROOT, parse_run_config  # noqa: E402
from fedapp.results import exit_code  # noqa: E402
from simulation.presets import apply_preset  # noqa: E402
from simulation.processes import (  # noqa: E402
    RUN_TOKEN_ENV,
    Interrupted,
    ProcessError,
    console_script,
    flower_env,
    free_port,
    interruptible,
    run_filtered,
    start_logged,
    stop_run,
    wait_for_health,
)
from simulation.runner import build_overrides, parse_set_options  # noqa: E402

START_TIMEOUT_S = 60


def deploy(overrides: dict, num_clients: int, work_dir: Path) -> int:
    """Start SuperLink + SuperNodes, run the app, stop everything; returns `flwr run`'s exit code."""
    flwr_home = work_dir / "flwr-home"
    flwr_home.mkdir(parents=True, exist_ok=True)
    env = flower_env(flwr_home)
    link_port = free_port()
    (flwr_home / "config.toml").write_text(
        tomli_w.dumps(
            {
                "superlink": {
                    "default": "deploy",
                    "deploy": {"address": f"127.0.0.1:{link_port}", "insecure": True},
                }
            }
        )
    )
    started: list[subprocess.Popen] = []
    pids: dict[str, int] = {}
    try:
        superlink = start_logged(
            [
                console_script("flower-superlink"),
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
            ],
            env,
            work_dir / "superlink.log",
        )
        started.append(superlink)
        pids["superlink"] = superlink.pid
        wait_for_health(
            link_port, superlink, START_TIMEOUT_S, f"flower-superlink (log {work_dir / 'superlink.log'})"
        )
        print(f"SuperLink pid {superlink.pid} on 127.0.0.1:{link_port}", flush=True)
        for partition_id in range(num_clients):
            node = start_logged(
                [
                    console_script("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"partition-id={partition_id} num-partitions={num_clients}",
                ],
                env,
                work_dir / f"supernode{partition_id}.log",
            )
            started.append(node)
            pids[f"supernode{partition_id}"] = node.pid
            print(f"SuperNode {partition_id} pid {node.pid}", flush=True)
        run_config = work_dir / "run-config.toml"
        run_config.write_text(tomli_w.dumps(overrides))
        command = [console_script("flwr"), "run", str(PROJECT_ROOT), "deploy", "--stream"]
        log_path = Path(overrides["out-dir"]) / "flower.log"
        print(f"flwr run (full log: {log_path})", flush=True)
        return run_filtered(
            [*command, "--run-config", str(run_config)], env, log_path, quiet=False, cwd=PROJECT_ROOT
        )
    finally:
        leftovers = stop_run(env[RUN_TOKEN_ENV], started)  # every process carrying this run's token
        still_running = [process for process in started if process.poll() is None]
        pids_path = Path(overrides["out-dir"]) / "deploy-pids.json"
        pids_path.parent.mkdir(parents=True, exist_ok=True)
        pids_path.write_text(json.dumps(pids, indent=2))
        print(f"stopped {len(started) - len(still_running)}/{len(started)} processes", flush=True)
        if leftovers:
            print(f"warning: processes {leftovers} of this deployment did not stop", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--method", default="kfed")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--preset", help="named run-config values (see `python -m simulation methods`)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    base = {
        "method": args.method,
        "dataset": args.dataset,
        "num-clients": args.clients,
        "num-rounds": args.rounds,
        "seed": args.seed,
        **parse_set_options(args.set),
    }
    try:  # fail before starting any process
        overrides = build_overrides(apply_preset(args.preset, base), args.out)
        parse_run_config(overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedapp-deploy-") as tmp:
        try:
            with interruptible():
                code = deploy(overrides, args.clients, Path(tmp))
        except Interrupted as exc:
            print(f"{exc}: stopped every process this deployment started", file=sys.stderr)
            return exc.exit_code
        except ProcessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    summary = args.out / "summary.json"
    if code != 0 or not summary.exists():
        print(f"error: flwr run exit code {code}; summary.json present: {summary.exists()}", file=sys.stderr)
        return 1
    result = json.loads(summary.read_text())
    status = result.get("status", "running")
    print(
        f"deployment {status} in {time.perf_counter() - started:.1f} s ({result.get('status_reason', '')}): "
        + "  ".join(f"{k}={100 * v:.2f}" for k, v in result.get("metrics", {}).items())
    )
    return exit_code(result)


if __name__ == "__main__":
    sys.exit(main())
