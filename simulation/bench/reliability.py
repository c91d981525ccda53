"""Reliability bars (issue 11), measured and printed:

    python -m simulation.bench.reliability [--skip-deploy] [--methods kfed ffcm cefmc ...]

1. SIGTERM to `python -m simulation run` mid-run: seconds until it exits, its exit code, and how many
   processes carrying the run's token survive (must be 0).
2. `dropout-rate 0.5` for every method (in-process engine, small runs): status, participation.
3. A SuperNode SIGKILLed after round 2 of a loopback deployment with `round-timeout` 45 s: the status,
   exit code, which round lost it, and that round's seconds against a normal round.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedapp.config.run import PROJECT_ROOT
from fedapp.launch.processes import RUN_TOKEN_ENV, child_environment, processes_with_token
from fedapp.launch.resolve import build_overrides
from simulation.runner import execute

# Small runs per method for the dropout bar (the payload audit test uses the same sizes).
DROPOUT_RUNS = {
    "kfed": {"dataset": "digits"},
    "ffcm": {"dataset": "digits", "num-rounds": 5, "ffcm.delta": 0.0},
    "cefmc": {"dataset": "digits-mv", "num-rounds": 6, "cefmc.delta": 0.0},
    "cefmc-h": {"dataset": "digits-mv", "num-rounds": 6, "cefmc.delta": 0.0},
    "fedcmv": {"dataset": "digits-mv", "num-rounds": 6, "fedcmv.delta": 0.0},
    "fedfcmv": {"dataset": "digits-mv", "num-rounds": 6, "fedfcmv.delta": 0.0},
    "ccfc": {"dataset": "digits", "num-clients": 5, "num-rounds": 7, "ccfc.pretrain-rounds": 3},
    "fstc": {"dataset": "texts-demo", "num-clients": 4, "num-rounds": 5, "fstc.local-iters": 20},
    "fsccl": {"dataset": "texts-demo", "num-clients": 4, "num-rounds": 5, "fsccl.local-iters": 20},
    "gfedntm": {"dataset": "synthetic-lda-tiny", "num-clients": 5, "partition": "by-group", "num-rounds": 13},
}


def sigterm_bar(out: Path) -> dict[str, object]:
    command = [sys.executable, "-m", "simulation", "run", "--method", "ffcm", "--dataset", "digits"]
    command += ["--clients", "3", "--rounds", "500", "--set", "ffcm.delta=0", "--out", str(out)]
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("round 2/"):
            break
    token = child_environment(process.pid, RUN_TOKEN_ENV)
    before = len(processes_with_token(token)) if token else 0
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=60)
    seconds = time.monotonic() - started
    time.sleep(1)
    survivors = processes_with_token(token) if token else []
    return {
        "processes before": before,
        "exit code": code,
        "seconds to exit": round(seconds, 1),
        "survivors": len(survivors),
    }


def dropout_bar(method: str, out: Path) -> dict[str, object]:
    summary = execute(
        build_overrides({"method": method, "seed": 0, "dropout-rate": 0.5, **DROPOUT_RUNS[method]}, out),
        engine="inprocess",
        quiet=True,
        overwrite=True,  # the bar's own folder: a rerun replaces it
    )
    records = summary["participation"].values()
    return {
        "status": summary["status"],
        "rounds": summary["rounds"],
        "client-rounds sat out": sum(len(r["dropped"]) for r in records),
        "accepted": sum(len(r["accepted"]) for r in records),
        # clustering methods report NMI; gFedNTM topic coherence (NPMI) and synthetic TSS
        **{
            key: round(float(summary["metrics"][key]), 4)
            for key in ("nmi", "npmi", "tss")
            if key in summary["metrics"]
        },
    }


def killed_node_bar(out: Path, timeout: int = 45) -> dict[str, object]:
    command = [sys.executable, "deploy/run_local.py", "--method", "ffcm", "--dataset", "digits"]
    command += ["--clients", "3", "--rounds", "6", "--set", "ffcm.delta=0"]
    command += ["--set", f"round-timeout={timeout}", "--out", str(out)]
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    victim, seconds = None, {}
    for line in process.stdout:
        if line.startswith("SuperNode 2 pid"):
            victim = int(line.split()[3])
        if line.startswith("round "):
            server_round = int(line.split()[1].split("/")[0])
            seconds[server_round] = float(line.split("|")[1].split()[0])
            if server_round == 2 and victim is not None:
                os.kill(victim, signal.SIGKILL)
    code = process.wait(timeout=120)
    summary = json.loads((out / "summary.json").read_text())
    lost = [int(r) for r, rec in summary["participation"].items() if rec["failed"]]
    normal = sorted(t for r, t in seconds.items() if r not in (1, *lost))
    return {
        "status": summary["status"],
        "exit code": code,
        "round that lost the node": lost,
        "its seconds": [seconds.get(r) for r in lost],
        "median normal round s": normal[len(normal) // 2] if normal else None,
        "round-timeout": timeout,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", nargs="*", default=list(DROPOUT_RUNS))
    parser.add_argument("--skip-deploy", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fedapp-bars-") as tmp:
        root = Path(tmp)
        print("1. SIGTERM to the runner mid-run:", sigterm_bar(root / "sigterm"), flush=True)
        print("2. dropout-rate 0.5:")
        for method in args.methods:
            print(f"   {method:8s}", dropout_bar(method, root / f"dropout-{method}"), flush=True)
        if not args.skip_deploy:
            print(
                "3. SuperNode killed after round 2 (deployment):",
                killed_node_bar(root / "killed"),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
