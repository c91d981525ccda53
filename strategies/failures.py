"""A client's failure as one readable line: partition id, file, cause.

What reaches the server is whatever Flower and Ray made of the client's exception: in a Ray simulation a
`RayTaskError(ClientAppException)` blob with ANSI colour codes, the actor's pid and repr, a full traceback
and Flower's node id; in a deployment Flower's "<class '...'>:<'...'>" wrapping. The cause (the last
exception the client's own code raised) is buried in it, and the node id means nothing to the person who
runs the federation. `failure_line` digs the cause out and names the site by its partition id and, when
known, its data file. The full text stays in flower.log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from fedapp.datasets import DatasetError
from fedapp.datasets.sources import has_placeholder, source_path

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "ValueError: msg", "flwr.clientapp.client_app.ClientAppException: msg", "pkg.mod.Error: msg"
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)):(.*)$")
_WRAPPERS = {"ClientAppException", "RayTaskError", "RayActorError"}
_FLOWER_MESSAGE = re.compile(r"Exception \w+ occurred\. Message:(.*)")
_FLOWER_CLASS = re.compile(r"^<class '(?:[\w.]*\.)?([\w()]+)'>:<['\"]", re.DOTALL)
# the server loop's words: "RuntimeError: client 1234 error: ...", "RuntimeError: client 1234 status X: ..."
_NODE = re.compile(r"^(?:\w+: )?client (\S+?)(?: error| status \w+)?: ")
_CLIENT_NAMED = re.compile(r"partition-id (-?\d+)(?:, file ([^:]+))?: ")
MAX_CHARS = 300


def failure_cause(text: str) -> str:
    """The last exception the client's code raised, "Type: message" (first line of the message), from
    Ray's and Flower's wrappers; the last non-empty line when no exception line is found."""
    lines = [line.strip() for line in ANSI.sub("", text).splitlines() if line.strip()]
    cause = None
    for index, line in enumerate(lines):
        match = _EXCEPTION_LINE.match(line)
        if match and match.group(1) not in _WRAPPERS:
            message = match.group(2).strip() or _next_line(lines, index)
            cause = f"{match.group(1)}: {message}"
    if cause is None:
        flower = [m.group(1).strip() for line in lines if (m := _FLOWER_MESSAGE.search(line))]
        cause = flower[-1] if flower and flower[-1] else (lines[-1] if lines else "no message")
    return _unwrapped(cause)


def _next_line(lines: list[str], index: int) -> str:
    """An exception whose message starts on the next line (Flower's ClientAppException does that)."""
    following = lines[index + 1] if index + 1 < len(lines) else ""
    flower = _FLOWER_MESSAGE.search(following)
    return flower.group(1).strip() if flower else following


def _unwrapped(cause: str) -> str:
    """Without Flower's "<class '...'>:<'" prefix and its closing "'>"."""
    cause = _FLOWER_CLASS.sub(lambda m: f"{m.group(1)}: ", cause)
    return cause.removesuffix("'>").removesuffix('">').strip()


def failure_line(
    text: str,
    partition_of: Mapping[str, int] | None = None,
    file_of: Callable[[int], str | None] | None = None,
) -> str:
    """One line: "partition-id P, file F: Type: message" (the node id when the partition is unknown).

    `partition_of`: Flower node id (the proxy's cid) -> partition id, from earlier valid replies;
    `file_of`: the data file a partition reads, when the run's dataset names one per partition. A client
    that named itself in its exception (`partition-id P, file F: ...`) is believed first."""
    clean = ANSI.sub("", text).strip()
    node = _NODE.match(clean)
    cause = failure_cause(clean[node.end() :] if node else clean)
    named = _CLIENT_NAMED.search(cause)
    partition = int(named.group(1)) if named else None
    file = named.group(2) if named and named.group(2) else None
    if named:
        cause = cause[named.end() :]
    if partition is None and node and partition_of and node.group(1) in partition_of:
        partition = partition_of[node.group(1)]
    if file is None and partition is not None and file_of is not None:
        file = file_of(partition)
    return _shortened(f"{_site(partition, file, node.group(1) if node else None)}: {cause}")


def partition_file(spec: str, partition_id: int) -> str | None:
    """The file partition `partition_id` reads when `spec` names one per partition (`{partition-id}`)."""
    if not has_placeholder(spec):
        return None
    try:
        return str(source_path(spec, partition_id))
    except DatasetError:
        return None


def _site(partition: int | None, file: str | None, node: str | None) -> str:
    if partition is None:
        return f"node {node} (partition-id unknown)" if node else "a client"
    return f"partition-id {partition}" + (f", file {file}" if file else "")


def _shortened(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 1] + "…"
