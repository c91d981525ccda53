"""Where a run is (its phase), kept in a small file so that whoever ends it can say when it ended.

The entry point follows Flower's output and writes the phase on each change; an interrupt names it in
summary.json's `status_reason`, and the watchdog, which survives a SIGKILL of the entry point, reads the
file before it removes the run's FLWR_HOME and names the phase in the `killed` status.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fedapp.report.records import REPORT_PHASE

PHASE_FILE = "fedapp-phase"  # in the run's private FLWR_HOME
_PROGRESS_ROUND = re.compile(r"\[fedapp\] round (\d+)/(\d+) ")
_SERVER_STARTED = "Starting Flower ServerApp"
_METHOD_DONE = "the strategy is done after round"  # `FedappServer.fit`: the method stopped early


class RunPhase:
    """The current phase, mirrored to `path` (when given) on every change."""

    def __init__(self, path: Path | None, text: str = "validating the run") -> None:
        self.path = path
        self.text = ""
        self.set(text)

    def set(self, text: str) -> None:
        if text == self.text:
            return
        self.text = text
        if self.path is not None:
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(text)
            os.replace(temporary, self.path)  # a reader never sees half a phase

    def see(self, line: str) -> None:
        """Follow one line of Flower's output: the ServerApp starting, a round's progress line."""
        if _SERVER_STARTED in line:
            self.set("in round 1")
        elif _METHOD_DONE in line:
            self.set(REPORT_PHASE)
        elif match := _PROGRESS_ROUND.search(line):
            done, total = int(match.group(1)), int(match.group(2))
            if self.text != REPORT_PHASE:
                self.set(f"in round {done + 1}" if done < total else REPORT_PHASE)


def read_phase(path: Path) -> str | None:
    """The phase a `RunPhase` last wrote to `path`, or None when there is none."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
