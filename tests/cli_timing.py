"""How fast a CLI call that fails validation must be: measured against the CLI's own start on this machine
at this moment, so a loaded CI machine does not fail a check that only means "nothing was started"."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDLE_BOUND_S = 10.0  # what a refused run may take on an idle machine (5 s measured)
LOAD_FACTOR = 3.0  # or this many times the CLI's bare start (`--help`) just measured, on a loaded one


def refusal_bound_s() -> float:
    """Seconds a refused `fedapp run` may take now: its interpreter, imports and checks, but no SuperLink,
    Ray or client (starting those takes far longer than three bare CLI starts)."""
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "simulation", "--help"], cwd=ROOT, capture_output=True, check=True, timeout=120
    )
    return max(IDLE_BOUND_S, LOAD_FACTOR * (time.monotonic() - started))
