"""Seconds per round, side by side: in-process engine, Ray simulation, loopback deployment, and Flower's
floor for the same payload (`bench-echo`: clients echo as many bytes, the server does no maths).

    python -m simulation.bench.rounds [--methods ffcm cefmc] [--rounds 20] [--no-deploy] [--scale]
    python -m simulation.bench.rounds --secagg [--methods ffcm fstc ccfc gfedntm] [--rounds 8]

Each cell is the median `round_s` of rounds >= 2 in the run's summary.json (round 1 pays for start-up:
Ray actors, the first ClientApp processes, data loading), measured by the strategy from the start of
`configure_fit` to the end of the round's evaluation. Every run is a separate process; the peak memory is
the largest sum of RSS over that process and every process carrying its run token, sampled every 0.5 s.
`--scale`: k-FED and FFCM on MNIST with 100 clients in one Ray simulation, and 1,000 clients in-process.
`--secagg`: each method that supports SecAgg+ on small data in Ray simulation, plain and under SecAgg+
(`secagg=true`): seconds per training round and the bytes every fit message carries on the wire
(`wire_bytes.json`: protobuf size of each message's content, SecAgg+'s key set-up and shares included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapp.config.run import PROJECT_ROOT
from fedapp.launch.processes import RUN_TOKEN_ENV

# method -> (dataset, clients, extra run-config keys); rounds come from --rounds
CASES: dict[str, tuple[str, int, dict[str, Any]]] = {
    "ffcm": ("digits", 10, {"ffcm.delta": 0.0}),
    "cefmc": ("bdgp", 3, {"cefmc.delta": 0.0}),
    "fedcmv": ("hw", 6, {"fedcmv.delta": 0.0}),
}


# SecAgg+ cost: method -> (dataset, clients, keys for both runs, extra rounds under SecAgg+); both runs
# use a sum-based initialisation where the method has one, so they take the same path
SECAGG_CASES: dict[str, tuple[str, int, dict[str, Any], int]] = {
    "ffcm": ("digits", 3, {"ffcm.delta": 0.0, "ffcm.init": "moments"}, 0),
    "fstc": (
        "texts-demo",
        3,
        {
            "fstc.init": "moments",
            "fstc.local-iters": 10,
            "fstc.batch-size": 50,
            "fstc.warmup-iters": 5,
            "secagg-clip": 2.0,
            "secagg-max-weight": 250.0,
        },
        0,
    ),
    "ccfc": (
        "digits",
        3,
        {
            "ccfc.pretrain-rounds": 2,
            "ccfc.batch-size": 32,
            "ccfc.local-steps": 2,
            "ccfc.kmeans-samples": 200,
            "secagg-clip": 64.0,
        },
        0,
    ),
    "gfedntm": (
        "synthetic-lda-tiny",
        3,
        {
            "partition": "by-group",
            "gfedntm.topics": 10,
            "gfedntm.batch-size": 30,
            "secagg-clip": 1000.0,
            "secagg-max-weight": 100.0,
        },
        1,  # the term lists take a round of their own
    ),
}


@dataclass
class Measured:
    seconds_per_round: float | None
    peak_mb: float
    wall_s: float
    summary: dict[str, Any]


def _tree_rss_mb(root: int) -> float:
    """RSS of `root`, its descendants and every process carrying a run token it started (MB)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    tokens: dict[int, bytes] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(entry.name)
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            parents[pid], rss[pid] = int(fields[1]), int(fields[21]) * 4096
            token = [
                i
                for i in (entry / "environ").read_bytes().split(b"\0")
                if i.startswith(RUN_TOKEN_ENV.encode())
            ]
            if token:
                tokens[pid] = token[0]
        except (OSError, ValueError, IndexError):
            continue
    members = {root}
    changed = True
    while changed:
        grown = {pid for pid, parent in parents.items() if parent in members} | members
        changed, members = grown != members, grown
    own_tokens = {tokens[pid] for pid in members if pid in tokens}
    members |= {pid for pid, token in tokens.items() if token in own_tokens}
    return sum(rss.get(pid, 0) for pid in members) / 1e6


def run_sampled(command: list[str], stdout: int = subprocess.DEVNULL) -> tuple[int, bytes, bytes, float]:
    """Run `command` from the project root: (exit status, stdout, stderr, peak RSS of its tree in MB,
    sampled every 0.5 s)."""
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=stdout, stderr=subprocess.PIPE)
    peak = [0.0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], _tree_rss_mb(process.pid))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, stderr = process.communicate()
    sampler.join()
    return process.returncode, out or b"", stderr, peak[0]


def _measure(command: list[str], out: Path) -> Measured:
    started = time.monotonic()
    _, _, stderr, peak = run_sampled(command)
    summary_path = out / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(f"{' '.join(command)} wrote no summary: {stderr.decode()[-2000:]}")
    summary = json.loads(summary_path.read_text())
    rounds = [t["round_s"] for r, t in summary.get("timing", {}).items() if int(r) >= 2 and "round_s" in t]
    return Measured(statistics.median(rounds) if rounds else None, peak, time.monotonic() - started, summary)


def _set_args(keys: dict[str, Any]) -> list[str]:
    args = []
    for key, value in keys.items():
        args += ["--set", f"{key}={json.dumps(value) if isinstance(value, str | bool) else value}"]
    return args


def simulate(
    method: str, dataset: str, clients: int, rounds: int, keys: dict[str, Any], out: Path, engine: str
) -> Measured:
    command = [sys.executable, "-m", "simulation", "run", "--method", method, "--dataset", dataset]
    command += ["--clients", str(clients), "--rounds", str(rounds), "--engine", engine, "--out", str(out)]
    return _measure(command + _set_args({"eval-every": 1, **keys}), out)


def deploy(method: str, dataset: str, clients: int, rounds: int, keys: dict[str, Any], out: Path) -> Measured:
    command = [sys.executable, "deploy/run_local.py", "--method", method, "--dataset", dataset]
    command += ["--clients", str(clients), "--rounds", str(rounds), "--out", str(out)]
    return _measure(command + _set_args({"eval-every": 1, **keys}), out)


def payload_floats(summary: dict[str, Any], clients: int) -> tuple[int, int]:
    """Float64 values per client per round up and down (fit traffic), as the ledger counted them."""
    rounds = max(int(summary["rounds"]), 1)
    up = summary["comm_bytes"]["up"] / (rounds * clients) / 8
    down = summary["comm_bytes"]["down"] / (rounds * clients) / 8
    return max(int(up), 1), max(int(down), 1)


def training_rounds(summary: dict[str, Any], first: int) -> list[int]:
    """Rounds `first` .. the second-to-last: steady training rounds (the last one carries the final
    evaluation and report, round 1 the start-up)."""
    return [r for r in range(first, int(summary["rounds"]))]


def secagg_row(method: str, rounds: int, root: Path) -> dict[str, Any]:
    """One method plain and under SecAgg+: seconds and wire bytes per training round, metrics of both."""
    dataset, clients, keys, extra = SECAGG_CASES[method]
    keys = {**keys, "eval-every": 1000}  # evaluate only after the last round: round_s is the fit
    runs = {}
    for secagg in (False, True):
        name = f"{method}-{'secure' if secagg else 'plain'}"
        command = [sys.executable, "-m", "simulation", "run", "--method", method, "--dataset", dataset]
        command += ["--clients", str(clients), "--rounds", str(rounds + (extra if secagg else 0))]
        command += ["--engine", "flwr", "--out", str(root / name)]
        runs[secagg] = _measure(command + _set_args({**keys, "secagg": secagg}), root / name)
    row: dict[str, Any] = {"method": f"{method} {dataset}", "clients": clients}
    for secagg, run in runs.items():
        label = "SecAgg+" if secagg else "plain"
        summary = run.summary
        wire = json.loads(
            (root / f"{method}-{'secure' if secagg else 'plain'}" / "wire_bytes.json").read_text()
        )
        chosen = training_rounds(summary, 2 + (extra if secagg else 0))
        seconds = [
            summary["timing"][str(r)]["round_s"] for r in chosen if "round_s" in summary["timing"][str(r)]
        ]
        fit = [wire[str(r)].get("train", {}) for r in chosen if str(r) in wire]
        row[f"{label} s/round"] = statistics.median(seconds) if seconds else None
        row[f"{label} up kB/round"] = statistics.median(f.get("up", 0) for f in fit) / 1e3 if fit else None
        row[f"{label} down kB/round"] = (
            statistics.median(f.get("down", 0) for f in fit) / 1e3 if fit else None
        )
        row[f"{label} messages/round"] = statistics.median(f.get("messages", 0) for f in fit) if fit else None
        row[f"{label} status"] = summary["status"]
        headline = {
            k: round(v, 4) for k, v in summary["metrics"].items() if k in ("acc", "nmi", "tss", "npmi")
        }
        row[f"{label} metrics"] = headline
    return row


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", nargs="*", default=None, help="default: every case of the mode")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-deploy", action="store_true")
    parser.add_argument("--scale", action="store_true", help="also 100 clients (Ray) and 1,000 (in-process)")
    parser.add_argument("--secagg", action="store_true", help="SecAgg+ cost: plain vs secagg=true per method")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedapp-bench-") as tmp:
        root = Path(tmp)
        cases = SECAGG_CASES if args.secagg else CASES
        methods = args.methods or list(cases)
        unknown = [method for method in methods if method not in cases]
        if unknown:
            parser.error(
                f"no {'--secagg ' if args.secagg else ''}case for {unknown}; choose from {list(cases)}"
            )
        for method in methods if args.secagg else []:
            rows.append(secagg_row(method, args.rounds, root))
            print(json.dumps(rows[-1], default=str), flush=True)
        for method in [] if args.secagg else methods:
            dataset, clients, keys = CASES[method]
            inproc = simulate(method, dataset, clients, args.rounds, keys, root / f"{method}-in", "inprocess")
            ray = simulate(method, dataset, clients, args.rounds, keys, root / f"{method}-ray", "flwr")
            same = inproc.summary["metrics"] == ray.summary["metrics"]
            up, down = payload_floats(ray.summary, clients)
            echo_keys = {"bench-echo.up-floats": up, "bench-echo.down-floats": down}
            floor = simulate(
                "bench-echo", "digits", clients, args.rounds, echo_keys, root / f"{method}-floor", "flwr"
            )
            row = {
                "method": f"{method} {dataset}",
                "clients": clients,
                "payload up/down kB": f"{8 * up / 1e3:.1f} / {8 * down / 1e3:.1f}",
                "in-process s": inproc.seconds_per_round,
                "Ray s": ray.seconds_per_round,
                "Ray floor s": floor.seconds_per_round,
                "same metrics": same,
            }
            inside = (inproc.seconds_per_round or 0) + (floor.seconds_per_round or 0)
            row["Ray / (in-process + floor)"] = (ray.seconds_per_round or 0) / inside if inside else None
            if not args.no_deploy:
                dep = deploy(method, dataset, clients, min(args.rounds, 6), keys, root / f"{method}-dep")
                dep_floor = deploy("bench-echo", "digits", clients, 6, echo_keys, root / f"{method}-depfloor")
                row["deployment s"] = dep.seconds_per_round
                row["deployment floor s"] = dep_floor.seconds_per_round
            row["peak MB (Ray)"] = round(ray.peak_mb)
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
        if args.scale:
            for method, keys in (("kfed", {}), ("ffcm", {"ffcm.delta": 0.0})):
                for clients, engine in ((100, "flwr"), (1000, "inprocess")):
                    run = simulate(
                        method, "mnist", clients, 5, keys, root / f"scale-{method}-{clients}", engine
                    )
                    timing = run.summary["timing"]
                    per_round = run.seconds_per_round
                    if per_round is None:  # one-shot: its round 1 (`round_s` never holds the wait for nodes)
                        per_round = timing["1"]["round_s"]
                    row = {
                        "method": f"{method} mnist (scale)",
                        "clients": clients,
                        "engine": engine,
                        "s per round": round(per_round, 3),
                        "peak MB": round(run.peak_mb),
                        "wall s": round(run.wall_s, 1),
                        "status": run.summary["status"],
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        cells = [_fmt(row.get(k)) if isinstance(row.get(k), float) else str(row.get(k, "")) for k in keys]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
