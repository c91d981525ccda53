"""What a strategy keeps across a restart: its checkpoint (`checkpoint-every`, run-config `resume`).

A checkpoint holds `state_dict()`: the `state_parts` (each part's own `state_dict`) and every attribute
named in `state_fields` by the strategy's class or any base class; the configuration is not kept, so a
resumed run may change it. `ClusteringStrategy` mixes this in; a method names only its own fields.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.common import Parameters, log

from fedapp.app.checkpoint import checkpoint_dir, load_strategy, save_strategy
from fedapp.config.run import RunConfig
from fedapp.report.records import PROGRESS_MARKER


class Checkpointed:
    """`state_dict` / `load_state_dict`, a checkpoint every `checkpoint-every` rounds, and the restore."""

    state_parts: tuple[str, ...] = ()
    state_fields: tuple[str, ...] = ()
    cfg: RunConfig  # the attributes below are set by `ClusteringStrategy.__init__`
    out_dir: Path
    status: str
    total_rounds: int
    resumed_from: int | None
    latest_parameters: Parameters | None

    def state_dict(self) -> dict[str, Any]:
        """The `state_parts`' states and every attribute named in `state_fields` by this class or a base."""
        state = {name: getattr(self, name) for name in _state_fields(type(self))}
        return {**state, **{part: getattr(self, part).state_dict() for part in self.state_parts}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The inverse of `state_dict`."""
        for name in _state_fields(type(self)):
            setattr(self, name, state[name])
        for part in self.state_parts:
            if part in state:  # a checkpoint from before a part existed restores without it
                getattr(self, part).load_state_dict(state[part])

    def checkpoint(self, server_round: int) -> None:
        """Save the state after `server_round` when `checkpoint-every` says so; a state that cannot be
        saved turns checkpointing off for the rest of the run (logged), it does not end the run."""
        every = self.cfg.checkpoint_every
        if not every or server_round % every:
            return
        try:
            save_strategy(checkpoint_dir(self.cfg, self.out_dir), server_round, self.state_dict())
        except (pickle.PicklingError, TypeError, AttributeError, OSError) as exc:
            log(WARNING, "round %d: checkpoint failed (%s); checkpointing is off", server_round, exc)
            self.cfg = replace(self.cfg, checkpoint_every=0)

    def restore(self) -> int:
        """Load the last checkpoint (run-config `resume`); returns the round to continue after."""
        server_round, state = load_strategy(checkpoint_dir(self.cfg, self.out_dir))
        self.load_state_dict(state)
        self.status, self.resumed_from = "running", server_round
        log(INFO, "%s resumed after round %d of %d", PROGRESS_MARKER, server_round, self.total_rounds)
        return server_round

    def resume_point(self) -> tuple[int, Parameters | None]:
        """(rounds already done, the global model to continue from): (0, None) for a fresh run."""
        return (self.resumed_from or 0), self.latest_parameters


def _state_fields(cls: type) -> list[str]:
    """`state_fields` of `cls` and of every class it derives from, base classes first."""
    return [name for klass in reversed(cls.__mro__) for name in vars(klass).get("state_fields", ())]
