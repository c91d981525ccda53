"""The `fedapp` command (also `python -m simulation`): run, tune, experiment, deploy, predict, report,
datasets, methods, stop-local-superlink; `fedapp COMMAND --help` for each (see simulation/runner.py,
deploy/run_local.py, fedapp/launch/)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import shutil
import sys
from pathlib import Path

from fedapp.config.run import DEVICES, PARTITIONS, ConfigError
from fedapp.datasets import DatasetError, dataset_infos
from fedapp.launch.options import (
    DEFAULT_CPUS_PER_CLIENT,
    ClientResources,
    merge_flags,
    parse_set_options,
    path_argument,
)
from fedapp.launch.presets import apply_preset
from fedapp.launch.processes import Interrupted, interruptible, local_superlinks, report_interrupt
from fedapp.launch.resolve import ENGINES, ResolvedRun, build_overrides, validate
from fedapp.methods import METHODS
from fedapp.report.pages.experiment import TABLE_PAGE
from fedapp.report.pages.run import REPORT_FILE
from fedapp.report.records import exit_code, format_metrics_table, status_line
from simulation.experiments import ExperimentError, check_experiment, load_experiment, run_experiment
from simulation.listing import dataset_markdown, describe_methods, format_dataset_table, render_config_toml
from simulation.runner import RunError, execute
from simulation.tracking import RUN_EXPERIMENT, TRACKERS, check_tracker


def _prog() -> str:
    name = Path(sys.argv[0]).name
    return "fedapp" if name == "fedapp" else "python -m simulation"


def version_text() -> str:
    from fedapp.report.model_store import package_version

    return f"fedapp {package_version('fedapp')} (flwr {package_version('flwr')})"


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What `run` and `tune` both take: the method, its data and its clients."""
    parser.add_argument("--method", help=f"one of {sorted(METHODS)} (or taken from --preset)")
    parser.add_argument(
        "--dataset", help="see `python -m simulation datasets` (default: preset's, else digits)"
    )
    parser.add_argument("--preset", help="named run-config values (see `python -m simulation methods`)")
    parser.add_argument("--clients", type=int, help="number of clients (SuperNodes)")
    parser.add_argument("--rounds", type=int, help="number of rounds")
    parser.add_argument("--seed", type=int, help="run seed")
    parser.add_argument(
        "--partition", help=f"{' | '.join(PARTITIONS)} (auto: vertical for vertical methods, else iid)"
    )
    parser.add_argument("--data-dir", help="dataset directory (default: $FEDAPP_DATA_DIR or ../shared/data)")
    parser.add_argument("--device", choices=DEVICES, help="torch device for the clients (default auto)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any run-config key, e.g. --set p=0.5 --set kfed.local-k=20 (`python -m simulation methods`)",
    )


def _add_track(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--track",
        choices=TRACKERS,
        help=f"log {what} in MLflow: MLFLOW_TRACKING_URI, else mlruns/ beside OUT (needs fedapp[track])",
    )


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedapp run`: the run keys, the engine and its resources, the output folder."""
    run = sub.add_parser("run", help="run one experiment and write DIR/summary.json")
    _add_run_arguments(run)
    run.add_argument(
        "--cpus-per-client",
        type=int,
        default=DEFAULT_CPUS_PER_CLIENT,
        help="Ray simulation: CPUs reserved per client (client-resources-num-cpus); default 1",
    )
    run.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        help="Ray simulation: GPU share per client (client-resources-num-gpus); 0.1 = 10 clients per GPU",
    )
    run.add_argument(
        "--ray-address",
        default="",
        metavar="HOST:PORT",
        help="Ray simulation on a Ray cluster you started (`ray start --head`; nodes join with "
        "`ray start --address HOST:PORT`): its clients run on every node (docs/deployment.md)",
    )
    run.add_argument(
        "--engine",
        choices=ENGINES,
        default="flwr",
        help="flwr: Flower's Ray simulation (default); inprocess: same classes without Ray",
    )
    run.add_argument("--out", required=True, type=path_argument, help="output directory")
    run.add_argument(
        "--dry-run", action="store_true", help="check the whole configuration, data included; start nothing"
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="--out holds an earlier run's outputs: remove them first (only files fedapp writes)",
    )
    _add_track(run, "the run (parameters, per-round metrics, status, artifacts)")


def _add_experiment_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedapp experiment FILE`: which runs and seeds of the file, where, and reuse of earlier runs."""
    experiment = sub.add_parser("experiment", help="run a TOML experiment file, write a markdown table")
    experiment.add_argument("file", type=path_argument)
    experiment.add_argument(
        "--out", type=path_argument, help="output root (default results/<experiment name>)"
    )
    experiment.add_argument("--engine", choices=ENGINES, help="override the file's engine")
    experiment.add_argument(
        "--resume",
        action="store_true",
        help="reuse runs whose directory holds a finished summary of the same config",
    )
    experiment.add_argument(
        "--overwrite",
        action="store_true",
        help="run again the runs whose folder holds earlier outputs (only files fedapp writes are removed)",
    )
    experiment.add_argument(
        "--only", action="append", metavar="LABEL", help="run only this label (repeatable)"
    )
    experiment.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of the file's")
    experiment.add_argument(
        "--dry-run", action="store_true", help="check every run x seed's configuration and data; run nothing"
    )
    _add_track(experiment, "every run, under one MLflow experiment named after the file's")


def _add_listing_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedapp datasets` and `fedapp methods` (with `--for DATA`: the advice for a user's data)."""
    datasets = sub.add_parser("datasets", help="list registered datasets: kind, accepting methods, files")
    datasets.add_argument("--markdown", action="store_true", help="a markdown table (as in README.md)")
    methods = sub.add_parser("methods", help="list methods with their config keys, defaults and presets")
    methods.add_argument("name", nargs="?", help="one method only")
    methods.add_argument(
        "--for",
        dest="for_data",
        metavar="DATA",
        help="which methods apply to DATA (a dataset or your files) and which the measured tables favour "
        "for its shape (site skew measured as FSTC measures it); --clients, --partition and --set as for run",
    )
    methods.add_argument("--clients", type=int, default=4, help="with --for: the number of sites")
    methods.add_argument("--partition", help="with --for: how a benchmark is split over the sites")
    methods.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="with --for: run-config keys"
    )
    methods.add_argument(
        "--toml", action="store_true", help="print the [tool.flwr.app.config] tables pyproject.toml must hold"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_prog(), description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True)

    _add_run_parser(sub)
    tune = sub.add_parser(
        "tune", help="choose k without labels (k-min..k-max): print the table, write DIR/tune.json, tune.png"
    )
    _add_run_arguments(tune)
    tune.add_argument("--out", required=True, type=path_argument, help="output directory")
    tune.add_argument("--overwrite", action="store_true", help="replace an earlier tune.json / tune.png")

    _add_experiment_parser(sub)
    sub.add_parser(
        "deploy",
        add_help=False,
        help="a real SuperLink + SuperNodes on this machine (deploy/run_local.py; `deploy --help`)",
    )

    predict = sub.add_parser("predict", help="assign the records of a file with a run's saved model (local)")
    predict.add_argument(
        "--model", required=True, type=path_argument, help="a run's output directory or its model/"
    )
    predict.add_argument(
        "--dataset", required=True, help="one file: csv:PATH, jsonl:PATH, npy:PATH, images:DIR ..."
    )
    predict.add_argument(
        "--out", required=True, type=path_argument, help="the assignments CSV to write (id,cluster,score)"
    )
    predict.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. --set text-column=body"
    )

    report = sub.add_parser(
        "report",
        help="redraw DIR/report.html and its nodes' pages (nodes/*/report.html) from the run's files",
    )
    report.add_argument("out", type=path_argument, help="a run's output folder, or one node's folder")

    _add_listing_parsers(sub)
    stop = sub.add_parser(
        "stop-local-superlink",
        help="stop the simulation SuperLink a plain `flwr run` left running (this user, this FLWR_HOME)",
    )
    stop.add_argument("--flwr-home", type=path_argument, help="default: $FLWR_HOME, else ~/.flwr")
    for command_parser in sub.choices.values():  # its own usage for its own bad flags (parse_arguments)
        command_parser.set_defaults(command_parser=command_parser)
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Like `parse_args`, but an unknown flag after a command is that command's error: its usage and the
    one flag (with the nearest valid one), not the top-level usage argparse would print."""
    args, extras = parser.parse_known_args(argv)
    if not extras:
        return args
    bad = next((extra for extra in extras if extra.startswith("-")), extras[0])
    command_parser = getattr(args, "command_parser", parser)
    if argv.index(bad) < argv.index(args.command):  # before the command: a top-level flag
        command_parser = parser
    known = [option for action in command_parser._actions for option in action.option_strings]
    nearest = difflib.get_close_matches(bad.split("=")[0], known, n=1, cutoff=0.8)
    command_parser.error(
        f"unrecognized argument: {bad}" + (f" (did you mean {nearest[0]}?)" if nearest else "")
    )


def _stop_local_superlinks(flwr_home: Path | None) -> int:
    import os
    import signal

    home = flwr_home or Path(os.environ.get("FLWR_HOME", str(Path.home() / ".flwr")))
    pids = local_superlinks(home)
    for pid in pids:
        os.killpg(os.getpgid(pid), signal.SIGTERM) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGTERM)
    print(f"stopped {len(pids)} local SuperLink(s) of {home}: {pids}" if pids else f"none running for {home}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 completed, 1 failed, 2 bad input (nothing started), 3 degraded, 128+signal stopped."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["deploy"]:  # its own parser: deploy/run_local.py
        from deploy.run_local import main as deploy_main

        return deploy_main(argv[1:], prog=f"{_prog()} deploy")
    args = parse_arguments(_parser(), argv)
    try:
        with interruptible():
            return _command(args)
    except Interrupted as exc:
        return report_interrupt(exc, args.out if args.command == "run" else None)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ConfigError, DatasetError, ExperimentError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _resolved_run(args: argparse.Namespace) -> ResolvedRun:
    """`run`'s and `tune`'s flags, --set and preset as one resolved run configuration."""
    if not args.method and not args.preset:
        raise ConfigError("give --method (or a --preset that names one)")
    optional = {
        "method": args.method,
        "dataset": args.dataset,
        "num-clients": args.clients,
        "num-rounds": args.rounds,
        "seed": args.seed,
        "partition": args.partition,
        "data-dir": args.data_dir,
        "device": args.device,
    }
    base = apply_preset(args.preset, merge_flags(optional, parse_set_options(args.set), args.out))
    return build_overrides(base, args.out)


def _track(
    tracker: str | None, experiment: str, root: Path, runs: list[tuple[Path, str, dict[str, str]]]
) -> None:
    """Log finished runs (folder, run name, tags) with `tracker` (`simulation.tracking`)."""
    runs = [run for run in runs if (run[0] / "summary.json").is_file()]
    if tracker is None or not runs:
        return
    from simulation.tracking import MlflowTracker

    mlflow = MlflowTracker(experiment, root)
    for out_dir, name, tags in runs:
        run_id = mlflow.log_run(out_dir, name, tags)
        print(f"tracked {out_dir} in MLflow ({mlflow.uri}): experiment '{experiment}', run {run_id}")


def _run_command(args: argparse.Namespace) -> int:
    """`fedapp run`: check, run, print the metrics and the status; the exit code says how it ended."""
    resources = ClientResources(args.cpus_per_client, args.gpus_per_client, args.ray_address)
    check_tracker(args.track)
    run = _resolved_run(args)  # the run's configuration, resolved once
    if args.dry_run:
        cfg = validate(run, args.engine, resources, overwrite=args.overwrite)
        print(f"dry run: {cfg.method} on {cfg.dataset}, {cfg.num_clients} clients: all checks passed")
        return 0
    try:
        summary = execute(run, args.engine, resources=resources, overwrite=args.overwrite)
    except RunError:
        _track(args.track, RUN_EXPERIMENT, args.out.parent, [(args.out, args.out.name, {})])
        raise
    print()
    print(format_metrics_table([summary]))
    print(f"\nwrote {args.out / 'summary.json'} and {args.out / REPORT_FILE}")
    _track(args.track, RUN_EXPERIMENT, args.out.parent, [(args.out, args.out.name, {})])
    print(status_line(summary), file=sys.stdout if exit_code(summary) == 0 else sys.stderr)
    return exit_code(summary)


def _experiment_command(args: argparse.Namespace) -> int:
    """`fedapp experiment FILE`: every run x seed of the file, then its table."""
    check_tracker(args.track)
    experiment = load_experiment(args.file)
    if args.seeds:
        experiment = dataclasses.replace(experiment, seeds=list(args.seeds))
    out_root = args.out or Path("results") / experiment.name
    only = set(args.only) if args.only else None
    reuse = {"resume": args.resume, "overwrite": args.overwrite}
    if args.dry_run:
        count = check_experiment(experiment, out_root, engine=args.engine, only=only, **reuse)
        print(f"dry run: {count} run(s) of '{experiment.name}': configuration and data OK")
        return 0
    tracked: list[tuple[Path, str, dict[str, str]]] = []
    try:
        run_experiment(
            experiment,
            out_root,
            engine=args.engine,
            only=only,
            on_run=lambda label, seed, out: tracked.append(
                (out, f"{label} s{seed}", {"fedapp.seed": str(seed)})
            ),
            **reuse,
        )
    finally:  # the runs that finished are tracked even when a later one failed
        _track(args.track, experiment.name, out_root.parent, tracked)
    print((out_root / "table.md").read_text())
    print(f"wrote {out_root / 'table.md'} and {out_root / TABLE_PAGE}")
    return 0


def _command(args: argparse.Namespace) -> int:
    if args.command == "stop-local-superlink":
        return _stop_local_superlinks(args.flwr_home)
    if args.command == "predict":
        from fedapp.report.model_store import ModelError
        from simulation.predict import predict

        try:
            rows = predict(args.model, args.dataset, args.out, parse_set_options(args.set))
        except ModelError as exc:
            raise ConfigError(str(exc)) from None
        print(f"wrote {args.out}: {rows} records")
        return 0
    if args.command == "report":
        from fedapp.report.pages.run import rebuild_pages

        try:
            pages = rebuild_pages(args.out)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        print("\n".join(f"wrote {path}" for path in pages))
        return 0
    if args.command == "datasets":
        infos = dataset_infos()
        columns = shutil.get_terminal_size().columns
        print(dataset_markdown(infos) if args.markdown else format_dataset_table(infos, columns))
    elif args.command == "methods" and args.for_data:
        from simulation.advice import advise

        keys = {"num-clients": args.clients, **parse_set_options(args.set)}
        if args.partition:
            keys["partition"] = args.partition
        print(advise(args.for_data, keys).render())
    elif args.command == "methods":
        print(render_config_toml() if args.toml else describe_methods(args.name))
    elif args.command == "tune":
        from simulation.tune import tune_command

        print(tune_command(_resolved_run(args), overwrite=args.overwrite))
    elif args.command == "run":
        return _run_command(args)
    else:
        return _experiment_command(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
