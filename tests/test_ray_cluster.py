"""Simulation on a Ray cluster the user started: `fedapp run --ray-address HOST:PORT`.

The fixture starts what a user starts on two machines, here on one: a head (`ray start --head`) and a
second node (`ray start --address`), two raylets with one CPU each, so the clients' Ray actors (one CPU
each) must run on both. Everything it started is stopped by its run token, never by `ray stop` (which
would stop every Ray process of the machine's user, other runs' included).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedapp.launch.processes import RUN_TOKEN_ENV, free_port
from fedapp.launch.resolve import build_overrides
from fedapp.launch.sweep import stop_run
from simulation.__main__ import main
from simulation.runner import execute

RAY = str(Path(sys.executable).parent / "ray")
START_TIMEOUT_S = 90


def _nodes_alive(address: str, env: dict[str, str]) -> int:
    """How many nodes of the cluster at `address` are alive (from its GCS, as `ray status` reads it)."""
    probe = (
        "import ray, sys\n"
        f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "print(sum(node['Alive'] for node in ray.nodes()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    return int(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else 0


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A head and a second node on 127.0.0.1, one CPU each; yields the head's address."""
    token = uuid.uuid4().hex
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths have a limit
    env = {**os.environ, RUN_TOKEN_ENV: token, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    address = f"127.0.0.1:{free_port()}"
    common = ["--num-cpus", "1", "--num-gpus", "0", "--disable-usage-stats", "--block"]
    head = [RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", address.split(":")[1]]
    head += ["--include-dashboard", "false", "--temp-dir", str(temp_dir), *common]
    started = [subprocess.Popen(head, env=env, start_new_session=True, stdout=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _nodes_alive(address, env) < 1:
            assert time.monotonic() < deadline and started[0].poll() is None, "the Ray head did not start"
            time.sleep(1)
        second = [RAY, "start", "--address", address, "--node-ip-address", "127.0.0.1", *common]
        started.append(subprocess.Popen(second, env=env, start_new_session=True, stdout=subprocess.DEVNULL))
        while _nodes_alive(address, env) < 2:
            assert time.monotonic() < deadline and started[1].poll() is None, "the second node did not join"
            time.sleep(1)
        yield address
    finally:
        report = stop_run(token, temp_dir, started)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert report.clean, report.describe()


@pytest.mark.e2e
@pytest.mark.sequential  # mostly waits on Ray's start-up: beside the workers, with the deployments
def test_clients_run_on_both_nodes_of_a_ray_cluster(ray_cluster: str, tmp_path: Path) -> None:
    """8 FFCM clients on a two-node cluster: both nodes ran clients (summary.json `ray_nodes`), and the
    metrics are those of the same run without Ray (the in-process engine, which the Ray simulation on one
    machine equals: tests/test_e2e_flower.py)."""
    keys = {"method": "ffcm", "dataset": "digits", "num-clients": 8, "num-rounds": 3, "seed": 2}
    code = main(
        ["run", "--method", "ffcm", "--dataset", "digits", "--clients", "8", "--rounds", "3", "--seed", "2"]
        + ["--ray-address", ray_cluster, "--out", str(tmp_path / "cluster")]
    )
    assert code == 0
    summary = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    placement = summary["ray_nodes"]
    assert len(placement) == 2, placement  # two raylets, one CPU each: both ran clients
    assert sorted(set().union(*placement.values())) == list(range(8))  # every client ran somewhere
    alone = execute(build_overrides(keys, tmp_path / "alone"), engine="inprocess", quiet=True)
    assert summary["metrics"] == pytest.approx(alone["metrics"], abs=1e-12)
    assert "ray_nodes" not in alone


def test_an_address_where_no_cluster_answers_is_refused_in_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code = main(
        ["run", "--method", "kfed", "--ray-address", f"127.0.0.1:{free_port()}", "--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2 and "no Ray cluster answers at 127.0.0.1:" in err and time.monotonic() - started < 10
    assert main(["run", "--method", "kfed", "--ray-address", "head-node", "--out", str(tmp_path)]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err


def test_the_ray_node_is_recorded_but_not_booked_as_traffic() -> None:
    """A fit reply's `ray-node` lands in summary.json's `ray_nodes` and not in the communication ledger
    (a deployment sends none: the ledger counts the method's messages the same in every engine)."""
    from unittest.mock import MagicMock

    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.server.client_proxy import ClientProxy

    from strategies.records import RunRecord

    def reply(metrics: dict) -> FitRes:
        return FitRes(Status(Code.OK, ""), ndarrays_to_parameters([]), 10, metrics)

    proxy = MagicMock(spec=ClientProxy)
    proxy.cid = "7"
    plain, placed = RunRecord(), RunRecord()
    plain.received(1, "fit", [(proxy, reply({"partition-id": 3}))])
    placed.received(1, "fit", [(proxy, reply({"partition-id": 3, "ray-node": "a" * 56}))])
    placed.placement([{"partition-id": 3, "ray-node": "a" * 56}, {"partition-id": 4, "ray-node": "b" * 56}])
    assert placed.ledger.summary() == plain.ledger.summary()
    assert (
        placed.summary()["ray_nodes"] == {"a" * 56: [3], "b" * 56: [4]} and "ray_nodes" not in plain.summary()
    )
