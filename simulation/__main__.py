"""CLI: `python -m simulation {run,experiment,datasets,methods}` (see simulation/runner.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedapp.config import ConfigError
from fedapp.datasets import DatasetError, available_datasets
from fedapp.methods import METHODS
from fedapp.results import format_metrics_table
from simulation.experiments import ExperimentError, load_experiment, run_experiment
from simulation.runner import ENGINES, RunError, build_overrides, execute, parse_set_options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulation", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one experiment and write DIR/summary.json")
    run.add_argument("--method", required=True, help=f"one of {sorted(METHODS)}")
    run.add_argument("--dataset", required=True, help="see `python -m simulation datasets`")
    run.add_argument("--clients", type=int, help="number of clients (SuperNodes)")
    run.add_argument("--rounds", type=int, help="number of rounds")
    run.add_argument("--seed", type=int, help="run seed")
    run.add_argument("--partition", help="iid | p-hetero | size-ratio | dirichlet | vertical")
    run.add_argument("--data-dir", help="dataset directory (default: $FEDAPP_DATA_DIR or ../shared/data)")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any run-config key from pyproject.toml, e.g. --set p=0.5 --set local-k=20",
    )
    run.add_argument(
        "--engine",
        choices=ENGINES,
        default="flwr",
        help="flwr: Flower's Ray simulation (default); inprocess: same classes without Ray",
    )
    run.add_argument("--out", required=True, type=Path, help="output directory")

    experiment = sub.add_parser("experiment", help="run a TOML experiment file, write a markdown table")
    experiment.add_argument("file", type=Path)
    experiment.add_argument("--out", type=Path, help="output root (default results/<experiment name>)")
    experiment.add_argument("--engine", choices=ENGINES, help="override the file's engine")

    sub.add_parser("datasets", help="list registered datasets")
    sub.add_parser("methods", help="list methods")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "datasets":
            for name, description in available_datasets().items():
                print(f"{name:16s} {description}")
        elif args.command == "methods":
            for spec in METHODS.values():
                print(f"{spec.name:10s} {spec.description}")
        elif args.command == "run":
            base = {"method": args.method, "dataset": args.dataset}
            optional = {
                "num-clients": args.clients,
                "num-rounds": args.rounds,
                "seed": args.seed,
                "partition": args.partition,
                "data-dir": args.data_dir,
            }
            base.update({key: value for key, value in optional.items() if value is not None})
            base.update(parse_set_options(args.set))
            summary = execute(build_overrides(base, args.out), args.engine)
            print()
            print(format_metrics_table([summary]))
            print(f"\nwrote {args.out / 'summary.json'}")
        else:
            experiment = load_experiment(args.file)
            out_root = args.out or Path("results") / experiment.name
            run_experiment(experiment, out_root, engine=args.engine)
            print((out_root / "table.md").read_text())
            print(f"wrote {out_root / 'table.md'}")
    except (ConfigError, DatasetError, ExperimentError, RunError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
