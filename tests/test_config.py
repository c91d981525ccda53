"""A bad run config fails before round 1 with a message that names the problem."""

import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from flwr.common import Context, RecordDict
from flwr.common.config import flatten_dict

from fedapp.app.server_app import server_fn
from fedapp.config.run import ConfigError, RunConfig, default_run_config, parse_run_config
from fedapp.launch.options import parse_set_options
from fedapp.methods import METHODS, config_tables
from fedapp.methods.cefmc import CeFMCConfig
from fedapp.methods.ffcm import FFCMConfig
from tests.cli_timing import refusal_bound_s

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# (overrides, a fragment the error message must contain)
BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-method": ({"method": "kmeanz"}, "unknown method 'kmeanz'"),
    "unknown-dataset": ({"dataset": "no-such-data"}, "unknown dataset 'no-such-data'"),
    "empty-dataset": ({"dataset": ""}, "'dataset' is empty"),
    "unknown-key": ({"num-client": 4}, "unknown run-config key 'num-client'; did you mean 'num-clients'?"),
    "misspelt-method-key": (
        {"method": "cefmc", "cefmc.lamda": 0.5},
        "unknown run-config key 'cefmc.lamda'; did you mean 'cefmc.lambda'?",
    ),
    "bare-method-key": ({"method": "ffcm", "fuzziness": 1.2}, "did you mean 'ffcm.fuzziness'?"),
    "other-method-key": (
        {"method": "kfed", "ffcm.fuzziness": 1.2},
        "run-config 'ffcm.fuzziness' belongs to method ffcm, but the method is 'kfed'",
    ),
    "method-key-range": (
        {"method": "cefmc", "cefmc.lambda": -1.0},
        "run-config 'cefmc.lambda' must be >= 0, got -1",
    ),
    "method-key-type": (
        {"method": "cefmc", "cefmc.h-iters": "two"},
        "run-config 'cefmc.h-iters' must be a number, got 'two'",
    ),
    "device": ({"device": "tpu"}, "run-config 'device' must be one of 'auto', 'cpu', 'cuda', got 'tpu'"),
    # num-clients = 0 means "every connected SuperNode", so only negative counts are invalid
    "negative-clients": ({"num-clients": -3}, "'num-clients' must be >="),
    "zero-rounds": ({"num-rounds": 0}, "'num-rounds' must be >= 1, got 0"),
    "negative-rounds": ({"num-rounds": -1}, "'num-rounds' must be >= 1, got -1"),
    "string-for-int": ({"num-clients": "10"}, "'num-clients' must be a number, got '10'"),
    "bool-for-int": ({"num-rounds": True}, "'num-rounds' must be a number, got True"),
    "bool-for-float": ({"p": False}, "'p' must be a number, got False"),
    "fraction-for-int": ({"seed": 1.5}, "'seed' must be an integer, got 1.5"),
    "int-for-string": ({"method": 3}, "'method' must be a string, got 3"),
    "p-above-one": ({"p": 1.5, "partition": "p-hetero"}, "'p' must be in [0, 1], got 1.5"),
    "p-below-zero": ({"p": -0.1}, "'p' must be in [0, 1], got -0.1"),
    "p-nan": ({"p": float("nan")}, "'p' must be a finite number"),
    "unknown-scaling": ({"scaling": "robust"}, "'scaling' must be one of 'none', 'zscore', 'minmax', 'l2'"),
    "unknown-partition": ({"partition": "shards"}, "'partition' must be one of 'auto', 'iid'"),
    "fuzziness-one": (
        {"method": "ffcm", "ffcm.fuzziness": 1.0},
        "'ffcm.fuzziness' must be in (1, 100], got 1",
    ),
    "negative-seed": ({"seed": -1}, "'seed' must be >= 0"),
    "horizontal-method-vertical-partition": (
        {"method": "kfed", "partition": "vertical"},
        "method 'kfed' needs a horizontal partition",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_run_config_raises_config_error(case: str) -> None:
    overrides, message = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as excinfo:
        parse_run_config(overrides)
    assert message in str(excinfo.value)


@pytest.mark.parametrize(
    "value", [pytest.param(float("inf"), id="inf"), pytest.param(float("nan"), id="nan")]
)
def test_non_finite_value_for_an_integer_key_is_a_config_error(value: float) -> None:
    with pytest.raises(ConfigError, match="'num-rounds' must be an integer"):
        parse_run_config({"num-rounds": value})


def test_defaults_are_valid_and_integral_floats_are_accepted() -> None:
    cfg = parse_run_config({"num-clients": 4.0, "p": 1})
    assert (cfg.num_clients, cfg.p) == (4, 1.0)
    assert isinstance(cfg.num_clients, int) and isinstance(cfg.p, float)


def test_pyproject_declares_exactly_the_keys_and_defaults_of_the_code() -> None:
    """Flower reads pyproject's tables; the code declares the keys: they must never drift apart."""
    with (PROJECT_ROOT / "pyproject.toml").open("rb") as fh:
        table = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]
    assert flatten_dict(table) == default_run_config()


def test_a_full_flower_run_config_of_every_table_is_accepted() -> None:
    """server_fn receives the defaults of every method's table; only the selected table's may change."""
    full = {**default_run_config(), "method": "cefmc", "dataset": "hw", "cefmc.lambda": 0.5}
    cfg = parse_run_config(full)
    assert cfg.params(CeFMCConfig).lam == 0.5 and cfg.partition == "vertical"
    assert cfg.to_dict()["cefmc.lambda"] == 0.5
    assert "ffcm.fuzziness" not in cfg.to_dict()  # the summary shows the run's own keys only


def test_method_keys_are_typed_and_shared_by_variants() -> None:
    cfg = parse_run_config({"method": "cefmc-h", "dataset": "digits-mv", "cefmc.h-iters": 3.0})
    assert cfg.params(CeFMCConfig).h_iters == 3 and isinstance(cfg.params(CeFMCConfig).h_iters, int)
    assert cfg.params(CeFMCConfig).effective_beta == 1.0
    assert parse_run_config({"method": "kmeans"}).method_config is None
    with pytest.raises(ConfigError, match="has no FFCMConfig"):
        cfg.params(FFCMConfig)


def test_every_key_has_a_doc_and_a_valid_default() -> None:
    for section in [RunConfig, *config_tables().values()]:
        for spec in section.key_specs():
            assert spec.doc and spec.coerce(spec.default, spec.name) == spec.default


def test_vertical_method_with_horizontal_partition() -> None:
    vertical = sorted(name for name, spec in METHODS.items() if spec.vertical)
    if not vertical:
        pytest.skip("no vertical method is registered yet")
    with pytest.raises(ConfigError, match="needs partition='vertical'"):
        parse_run_config({"method": vertical[0], "partition": "iid"})


def _server_context(run_config: dict[str, Any]) -> Context:
    return Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_server_fn_rejects_a_bad_config_before_round_one(case: str) -> None:
    overrides, message = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as excinfo:
        server_fn(_server_context(overrides))
    assert message in str(excinfo.value)


def test_server_fn_refuses_the_centralized_method(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="method 'kmeans' is the centralized reference"):
        server_fn(_server_context({"method": "kmeans", "out-dir": str(tmp_path)}))


def test_server_fn_builds_the_strategy_for_a_good_config(tmp_path: Path) -> None:
    context = _server_context(
        {"method": "ffcm", "num-rounds": 7, "round-timeout": 60.0, "out-dir": str(tmp_path)}
    )
    components = server_fn(context)
    strategy = components.server.strategy
    assert type(strategy).__name__ == "FFCMStrategy" and type(components.server).__name__ == "FedappServer"
    assert components.config.num_rounds == 7 and components.config.round_timeout == 60.0
    assert strategy.out_dir == tmp_path


def _simulation_run(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m simulation run ARGS` in the project root, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "simulation", "run", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: how long a refusal may take is the bound the tests measure
    )


def test_cli_rejects_an_unknown_method_without_starting_flower(tmp_path: Path) -> None:
    bound = refusal_bound_s()
    started = time.monotonic()
    result = _simulation_run(
        "--method", "nope", "--dataset", "digits", "--clients", "2", "--out", str(tmp_path / "out")
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2
    assert "error: unknown method 'nope'" in result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < bound, f"took {elapsed:.1f} s (bound {bound:.1f} s): something started before validation"
    assert not (tmp_path / "out").exists()


def test_cli_rejects_a_bad_set_option(tmp_path: Path) -> None:
    result = _simulation_run(
        "--method", "kfed", "--dataset", "digits", "--set", "p=2", "--out", str(tmp_path / "out")
    )
    assert result.returncode == 2
    assert "error: run-config 'p' must be in [0, 1], got 2" in result.stderr


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("num-clients=10", 10),
        ("p=0.25", 0.25),
        ("delta=1e-3", 1e-3),
        ("cefmc.lambda=0.5", 0.5),
        ("verbose=true", True),
        ("verbose=false", False),
        ("dataset=digits", "digits"),  # bare string
        ('dataset="digits"', "digits"),  # quoted TOML string
        ("ratio=6:4", "6:4"),  # not TOML: kept as text
        ("dataset=mat:/data/x.mat", "mat:/data/x.mat"),
        (" seed = 3 ", 3),  # whitespace around key and value
        ("data-dir=", ""),
    ],
)
def test_parse_set_options_values(item: str, expected: Any) -> None:
    key = item.partition("=")[0].strip()
    parsed = parse_set_options([item])
    assert parsed == {key: expected}
    assert type(parsed[key]) is type(expected)


def test_parse_set_options_later_items_win() -> None:
    assert parse_set_options(["seed=1", "k=3", "seed=2"]) == {"seed": 2, "k": 3}
    assert parse_set_options([]) == {}


@pytest.mark.parametrize("item", ["novalue", "=5", "  =x", ""])
def test_parse_set_options_rejects_malformed_items(item: str) -> None:
    with pytest.raises(ValueError, match="--set expects key=value"):
        parse_set_options([item])


def test_secagg_only_for_methods_that_sum() -> None:
    with pytest.raises(
        ConfigError,
        match="method 'kfed' does not aggregate sums; SecAgg\\+ works with "
        "\\['ccfc', 'ffcm', 'fstc', 'gfedntm'\\]",
    ):
        parse_run_config({"method": "kfed", "secagg": True})
    assert parse_run_config({"method": "ffcm", "secagg": True}).secagg


def test_secagg_in_process_runs_flowers_secagg_stages_over_the_direct_grid(tmp_path: Path) -> None:
    """The in-process engine runs SecAgg+ with the ServerApp and ClientApp themselves: each fit round is
    the workflow's four exchanges (its equality with Ray's runtime: tests/test_e2e_flower.py)."""
    import json

    from fedapp.launch.resolve import build_overrides
    from simulation.runner import execute

    keys = {"method": "ffcm", "secagg": True, "num-clients": 3, "num-rounds": 2, "secagg-max-weight": 1000}
    summary = execute(build_overrides(keys, tmp_path), engine="inprocess", quiet=True)
    assert summary["status"] == "completed" and summary["config"]["secagg"] is True
    wire = json.loads((tmp_path / "wire_bytes.json").read_text())
    assert wire["2"]["train"]["messages"] == 4 * 3 and wire["2"]["evaluate"]["messages"] == 3


def test_the_direct_grid_answers_a_raising_client_app_with_an_error_reply() -> None:
    """As Flower's runtime does: the server sees an error reply naming the exception, the run goes on."""
    from flwr.app import Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.common import Context
    from flwr.common.constant import ErrorCode

    from fedapp.app.inprocess import DirectGrid

    def fails(message: Message, context: Context) -> Message:
        raise ValueError("no data on this node")

    def echoes(message: Message, context: Context) -> Message:
        return Message(message.content, reply_to=message)

    contexts = {1: Context(run_id=0, node_id=1, node_config={}, state=RecordDict(), run_config={})}
    for app, fine in ((ClientApp(), False), (ClientApp(), True)):
        app._call = echoes if fine else fails  # a raw message handler, as ClientApp(mods=...) wraps one
        grid = DirectGrid(app, contexts)
        (reply,) = grid.send_and_receive([grid.create_message(RecordDict(), "train", 1, "1")])
        assert reply.has_error() is not fine
        if not fine:
            assert reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            assert "no data on this node" in reply.error.reason


def test_the_direct_grid_gives_no_reply_for_a_client_app_past_the_round_timeout() -> None:
    """As a SuperLink does for a lost SuperNode: the server's wait ends, the other nodes answer."""
    import time

    from flwr.app import Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.common import Context

    from fedapp.app.inprocess import DirectGrid

    def answers(message: Message, context: Context) -> Message:
        if context.node_id == 1:
            time.sleep(5.0)
        return Message(message.content, reply_to=message)

    app = ClientApp()
    app._call = answers  # a raw message handler, as ClientApp(mods=...) wraps one
    contexts = {
        node: Context(run_id=0, node_id=node, node_config={}, state=RecordDict(), run_config={})
        for node in (1, 2)
    }
    grid = DirectGrid(app, contexts, timeout=0.5)
    started = time.monotonic()
    messages = [grid.create_message(RecordDict(), "train", node, "1") for node in (1, 2)]
    replies = list(grid.send_and_receive(messages))
    assert time.monotonic() - started < 4.0  # not the sleeping node's 5 s
    assert [reply.metadata.src_node_id for reply in replies] == [2]
