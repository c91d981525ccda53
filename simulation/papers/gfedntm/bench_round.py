"""Seconds per gFedNTM round (one synchronised step) and the effect of `local-steps` on TSS.

    python -m simulation.papers.gfedntm.bench_round cost --steps 40 --out results/gfedntm-bench
    python -m simulation.papers.gfedntm.bench_round local-steps --out results/gfedntm-local-steps

`cost`: the CPU preset (V = 5,000, K = 50, 5 clients, batch 64) for `--steps` steps on three engines:
in-process (no Ray, no network), Flower's Ray simulation (`flwr run`), and a real SuperLink with 5
SuperNodes on loopback (deploy/run_local.py). The figure is the median over rounds of the strategy's
fit -> aggregate seconds (start-up excluded); the machine's load average is printed beside it.
`local-steps`: the CPU preset with `exchange = parameters` and tau local steps per round, for the same
total number of steps (epochs), in-process: TSS / DSS and rounds, tau = 1 (exact) vs larger tau.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from fedapp.launch.presets import load_preset
from fedapp.launch.resolve import build_overrides
from simulation.runner import execute

PRESET = "gfedntm-cpu"


def cost_overrides(steps: int) -> dict:
    return {
        **load_preset(PRESET).overrides,
        "num-rounds": steps + 1,
        "eval-every": 100_000,
        "gfedntm.max-steps": steps,
    }


def deployed(overrides: dict, out: Path) -> dict:
    from deploy.run_local import deploy

    final = build_overrides(overrides, out)
    code = deploy(final, int(final["num-clients"]), out)
    if code != 0:
        raise RuntimeError(f"deployment exited with {code}; see {out}")
    return json.loads((out / "summary.json").read_text())


def measure_cost(steps: int, out: Path) -> list[dict]:
    rows = []
    for engine in ("inprocess", "flwr", "deployment"):
        run_out = out / engine
        started = time.perf_counter()
        if engine == "deployment":
            summary = deployed(cost_overrides(steps), run_out)
        else:
            summary = execute(
                build_overrides(cost_overrides(steps), run_out), engine, quiet=True, overwrite=True
            )
        rows.append(
            {
                "engine": engine,
                "steps": summary["steps"],
                "seconds_per_round_median": summary["seconds_per_step_round"],
                "wall_s": time.perf_counter() - started,
                "up_bytes_per_round": summary["comm_bytes"]["up"] / max(summary["rounds"], 1),
                "load_average": os.getloadavg(),
            }
        )
        print(json.dumps(rows[-1]))
    return rows


def measure_local_steps(taus: list[int], out: Path) -> list[dict]:
    preset = load_preset(PRESET).overrides
    total_steps = 640  # 20 epochs x 32 steps of the preset
    rows = []
    for tau in taus:
        overrides = {
            **preset,
            "num-rounds": 1 + -(-total_steps // tau),
            "eval-every": 100_000,
            "gfedntm.exchange": "parameters",
            "gfedntm.local-steps": tau,
        }
        started = time.perf_counter()
        summary = execute(
            build_overrides(overrides, out / f"tau{tau}"), "inprocess", quiet=True, overwrite=True
        )
        rows.append(
            {
                "local_steps": tau,
                "rounds": summary["rounds"],
                "steps": summary["steps"],
                "tss": summary["metrics"]["tss"],
                "dss": summary["metrics"]["dss"],
                "wall_s": time.perf_counter() - started,
                "load_average": os.getloadavg(),
            }
        )
        print(json.dumps(rows[-1]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulation.papers.gfedntm.bench_round", description=__doc__
    )
    parser.add_argument("command", choices=("cost", "local-steps"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--taus", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "cost":
        rows = measure_cost(args.steps, args.out)
    else:
        rows = measure_local_steps(args.taus, args.out)
    (args.out / f"{args.command}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
