"""A client's failure reaches summary.json and the console as one line: partition id, file, cause
(issue 40, item 4), whether it came wrapped by Ray (ANSI codes, a Flower node id, a traceback) or by
Flower, or was raised by a client in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.ffcm import FFCMClient
from fedapp.app.client_app import client_fn
from fedapp.app.inprocess import run_inprocess
from fedapp.app.server_app import server_fn
from fedapp.app.server_loop import readable_reason
from fedapp.launch.resolve import build_overrides
from strategies.failures import failure_cause, failure_line, partition_file

NODE = "8217348561234567"
FLOOR = "1 record, fewer than the privacy floor min-cluster-size=5"


def _ray_blob(cause: str, *, chained: str = "") -> str:
    """How Flower's simulation engine words a ClientApp exception that Ray raised (vce_api: the type, then
    str(RayTaskError) with its colour codes), as the server loop receives it."""
    before = (
        f"\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=4242, ip=10.0.0.5, actor_id=ab12)\n"
        f'  File "/site-packages/clients/base.py", line 40, in __init__\n    rows = load()\n{chained}\n\n'
        "The above exception was the direct cause of the following exception:\n\n"
        if chained
        else ""
    )
    ray = (
        f"{before}\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=4242, ip=10.0.0.5, actor_id=ab12, "
        "repr=<flwr.simulation.ray_transport.ray_actor.ClientAppActor object at 0x7f3>)\n"
        '  File "/site-packages/flwr/simulation/ray_transport/ray_actor.py", line 65, in run\n'
        "    raise ClientAppException(str(ex)) from ex\n"
        "flwr.clientapp.client_app.ClientAppException: \n"
        f"Exception ClientAppException occurred. Message: {cause}"
    )
    reason = f"<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'{ray}'>"
    return f"RuntimeError: client {NODE} error: {readable_reason(reason)}"


def test_a_ray_blob_becomes_partition_file_and_cause() -> None:
    blob = _ray_blob(FLOOR, chained=f"fedapp.privacy.floor.PrivacyFloorError: {FLOOR}")
    line = failure_line(blob, {NODE: 2}, lambda pid: f"/data/site{pid}.csv")
    assert line == f"partition-id 2, file /data/site2.csv: PrivacyFloorError: {FLOOR}"
    # without the chained traceback the cause is Flower's message; an unknown node is named as such
    assert failure_line(_ray_blob(FLOOR)) == f"node {NODE} (partition-id unknown): {FLOOR}"


def test_a_client_that_names_itself_is_believed_and_the_line_is_one_line() -> None:
    named = "ClientSiteError: partition-id 3, file /d/s3.csv: FileNotFoundError: [Errno 2] gone: '/d/s3.csv'"
    line = failure_line(_ray_blob(named.split(": ", 1)[1], chained=named), {NODE: 0})
    assert line == "partition-id 3, file /d/s3.csv: FileNotFoundError: [Errno 2] gone: '/d/s3.csv'"
    long = failure_line(_ray_blob("x" * 1000 + "\nsecond line"))
    assert "\n" not in long and "\x1b" not in long and len(long) <= 300


def test_flowers_deployment_wrapping_and_a_status_reply() -> None:
    reason = readable_reason(f"<class 'fedapp.privacy.floor.PrivacyFloorError'>:<'{FLOOR}'>")
    assert failure_line(f"RuntimeError: client {NODE} error: {reason}", {NODE: 1}) == (
        f"partition-id 1: PrivacyFloorError: {FLOOR}"
    )
    status = f"RuntimeError: client {NODE} status FIT_NOT_IMPLEMENTED: no fit here"
    assert failure_line(status, {NODE: 4}) == "partition-id 4: no fit here"
    assert failure_cause("TimeoutError: no reply within 5 s") == "TimeoutError: no reply within 5 s"


def test_partition_file_only_for_a_spec_with_one_file_per_partition() -> None:
    assert partition_file("csv:/data/site{partition-id}.csv", 2) == "/data/site2.csv"
    assert partition_file("digits", 2) is None
    assert partition_file("csv:/data/all.csv", 2) is None


def test_an_in_process_client_failure_is_one_line_in_summary_and_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1's file is gone from round 2 on (raised by the client, as reading a deleted file does)."""
    fit = FFCMClient.fit

    def failing_fit(self, parameters, config):  # type: ignore[no-untyped-def]
        if self.partition_id == 1 and int(config.get("server-round", 1)) >= 2:
            raise FileNotFoundError(2, "No such file or directory", "site1.csv")
        return fit(self, parameters, config)

    monkeypatch.setattr(FFCMClient, "fit", failing_fit)
    run = {"method": "ffcm", "dataset": "digits", "num-clients": 3, "num-rounds": 3, "ffcm.delta": 0.0}
    overrides = build_overrides(run, tmp_path)
    run_inprocess(server_fn, client_fn, overrides, 3)
    summary = json.loads((tmp_path / "summary.json").read_text())
    want = "partition-id 1: FileNotFoundError: [Errno 2] No such file or directory: 'site1.csv'"
    assert summary["failure_messages"] == [want]
    assert summary["status"] == "degraded" and f"first client error: {want}" in summary["status_reason"]
