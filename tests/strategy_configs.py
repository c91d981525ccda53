"""Small run configs for strategy tests driven with hand-built replies (no data is read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedapp.config.run import RunConfig, parse_run_config

FSTC_K = 3  # clusters of `fstc_config`


def fstc_config(out_dir: Path, **overrides: Any) -> RunConfig:
    """FSTC on `texts-demo`: three clients, three rounds, K = 3, a 4-unit adapter; `overrides` win."""
    run_config = {
        "method": "fstc",
        "dataset": "texts-demo",
        "out-dir": str(out_dir),
        "num-clients": 3,
        "num-rounds": 3,
        "k": FSTC_K,
        "fstc.adapter-hidden": 4,
    }
    return parse_run_config({**run_config, **overrides})
