"""The local training loop every torch method reuses, the batch cursor it walks, and its progress display.

The pieces compose rather than dictate a method's round:
- `BatchCursor` says which samples come next; its few integers are its whole state, kept in
  `context.state` so a client continues its epoch across rounds (FSTC's tau iterations cross epoch
  boundaries; gFedNTM takes exactly one batch per round).
- `train_steps` runs zero_grad / backward / (clip) / step over any iterable of batches. Per-batch work
  (two augmented views, pseudo-labels, a model-contrastive term) lives in the method's `loss_fn`;
  schedule work (FSTC recomputing its pseudo-labels before given iterations) lives in the generator
  that yields the batches.
- `batch_gradients` is the no-step variant: the gradient of one batch, as arrays (gFedNTM).
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from logging import INFO
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.common import ConfigRecord, RecordDict, log
from torch import nn
from tqdm import tqdm

from fedapp.neural.glue import ClientStateError, gradient_arrays

Batch = TypeVar("Batch")
LossOutput = torch.Tensor | Mapping[str, torch.Tensor]  # a mapping: "loss" is minimised, the rest logged


class TrainingError(RuntimeError):
    """Local training cannot go on (a non-finite loss): the round fails instead of sending garbage."""


# ------------------------------------------------------------------------------------ cursor
@dataclass
class BatchCursor:
    """Where a client is in its local data: `position` samples into epoch `epoch`'s sample order.

    Every epoch visits each sample exactly once, in a permutation seeded by (seed, epoch), so these
    integers are the cursor's whole state and restore it exactly. After the last batch of an epoch the
    cursor moves to the start of the next one. Unequal final batch: with `drop_last=False` the epoch's
    last batch holds the n mod batch_size leftovers (never padded, never topped up from the next epoch);
    with `drop_last=True` those leftovers are skipped for that epoch (other samples each epoch).
    """

    n_samples: int
    batch_size: int
    seed: int
    shuffle: bool = True
    drop_last: bool = False
    epoch: int = 0
    position: int = 0
    _order: tuple[int, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # plain ints and bools: a ConfigRecord refuses NumPy scalars
        self.n_samples, self.batch_size, self.seed = int(self.n_samples), int(self.batch_size), int(self.seed)
        self.shuffle, self.drop_last = bool(self.shuffle), bool(self.drop_last)
        self.epoch, self.position = int(self.epoch), int(self.position)
        if self.n_samples < 1 or self.batch_size < 1:
            raise ValueError(
                f"need n_samples >= 1 and batch_size >= 1, got {self.n_samples}, {self.batch_size}"
            )
        if self.drop_last and self.batch_size > self.n_samples:
            raise ValueError(
                f"drop_last with batch_size {self.batch_size} > {self.n_samples} samples gives no batch"
            )
        if self.epoch < 0 or not 0 <= self.position < self.epoch_end:
            raise ValueError(f"epoch {self.epoch}, position {self.position} outside [0, {self.epoch_end})")

    @property
    def epoch_end(self) -> int:
        """Samples used per epoch (all of them unless `drop_last` skips the leftovers)."""
        return self.n_samples - self.n_samples % self.batch_size if self.drop_last else self.n_samples

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.epoch_end / self.batch_size)

    @property
    def steps_left_in_epoch(self) -> int:
        return math.ceil((self.epoch_end - self.position) / self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of `epoch` (a permutation seeded by (seed, epoch), or 0..n-1)."""
        if self._order is None or self._order[0] != epoch:
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.n_samples)
            else:
                order = np.arange(self.n_samples)
            self._order = (epoch, order)
        return self._order[1]

    def next_batch(self) -> np.ndarray:
        """Indices of the next batch; advances the cursor (into the next epoch after the last batch)."""
        stop = min(self.position + self.batch_size, self.epoch_end)
        batch = self.order(self.epoch)[self.position : stop]
        self.position = stop
        if self.position == self.epoch_end:
            self.epoch, self.position = self.epoch + 1, 0
        return batch

    def take(self, steps: int) -> Iterator[np.ndarray]:
        """The next `steps` batches, crossing epoch boundaries (FSTC's tau iterations per round)."""
        for _ in range(steps):
            yield self.next_batch()

    def rest_of_epoch(self) -> Iterator[np.ndarray]:
        """The batches left in the current epoch (a whole epoch when the cursor is at its start)."""
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def save(self, state: RecordDict, key: str) -> None:
        state[key] = ConfigRecord({name: getattr(self, name.replace("-", "_")) for name in _CURSOR_FIELDS})

    @classmethod
    def resume(
        cls,
        state: RecordDict,
        key: str,
        *,
        n_samples: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> BatchCursor:
        """The cursor an earlier round saved in `state[key]`, or a fresh one in the first round.

        The saved setup must equal this round's (else ClientStateError): a client whose data or batch
        size changed between rounds would otherwise walk a stale order silently.
        """
        cursor = cls(n_samples, batch_size, seed, shuffle, drop_last)
        if key not in state:
            return cursor
        saved = state[key]
        for name in _CURSOR_FIELDS[:5]:
            if saved[name] != getattr(cursor, name.replace("-", "_")):
                raise ClientStateError(
                    f"context.state['{key}'] has {name}={saved[name]!r}, this round "
                    f"{getattr(cursor, name.replace('-', '_'))!r} (the local data or batch size changed)"
                )
        return cls(n_samples, batch_size, seed, shuffle, drop_last, saved["epoch"], saved["position"])


_CURSOR_FIELDS = ("n-samples", "batch-size", "seed", "shuffle", "drop-last", "epoch", "position")


# ---------------------------------------------------------------------------------- progress
class Progress:
    """A tqdm bar when stderr is a terminal; otherwise a plain log line every `log_every` steps and at
    the end (Ray actors and log files get readable lines, not carriage returns). TQDM_DISABLE=1 hides bars.
    """

    def __init__(self, desc: str, total: int | None, log_every: int | None = None) -> None:
        self.desc, self.total, self.log_every = desc, total, log_every
        self.bar = (
            tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True) if sys.stderr.isatty() else None
        )
        self.steps = 0
        self.logged_at = 0  # step of the last plain line
        self.started = time.perf_counter()
        self.sums: dict[str, float] = {}

    def update(self, terms: Mapping[str, float]) -> None:
        self.steps += 1
        for name, value in terms.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        if self.bar is not None:
            self.bar.update()
            self.bar.set_postfix_str(" ".join(f"{k} {v:.4f}" for k, v in terms.items()), refresh=False)
        elif self.log_every and self.steps % self.log_every == 0:
            self._log_line()

    def means(self) -> dict[str, float]:
        return {name: total / self.steps for name, total in self.sums.items()} if self.steps else {}

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.steps > self.logged_at:
            self._log_line()

    def _log_line(self) -> None:
        self.logged_at = self.steps
        of = f"/{self.total}" if self.total is not None else ""
        terms = "  ".join(f"{name} {value:.4f}" for name, value in self.means().items())
        log(INFO, "%s: step %d%s  %s  (%.1f s)", self.desc, self.steps, of, terms, self.seconds())


# ------------------------------------------------------------------------------ training loop
@dataclass(frozen=True)
class TrainStats:
    """What a local run did: steps taken, mean of each loss term over them, wall seconds."""

    steps: int
    means: dict[str, float]
    seconds: float

    @property
    def mean_loss(self) -> float:
        return self.means.get("loss", float("nan"))

    def metrics(self, prefix: str = "train-") -> dict[str, float | int]:
        """Flat Flower metrics, e.g. {"train-loss": 0.31, "train-steps": 100, "train-seconds": 2.5}."""
        return {
            **{f"{prefix}{name}": value for name, value in self.means.items()},
            f"{prefix}steps": self.steps,
            f"{prefix}seconds": self.seconds,
        }


def _objective(output: LossOutput, step: int, desc: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The tensor to minimise and every term as a float; a non-finite loss stops the run at its step."""
    if isinstance(output, torch.Tensor):
        loss, terms = output, {"loss": output}
    elif "loss" in output:
        loss, terms = output["loss"], dict(output)
    else:
        raise TypeError(f"loss_fn returned a mapping without 'loss' (keys {sorted(output)})")
    values = {name: float(value.detach()) for name, value in terms.items()}
    if not math.isfinite(values["loss"]):
        raise TrainingError(f"{desc}: loss is {values['loss']} at step {step} (terms {values})")
    return loss, values


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Batch], LossOutput],
    batches: Iterable[Batch],
    *,
    steps: int | None = None,
    max_grad_norm: float | None = None,
    desc: str = "train",
    log_every: int | None = None,
) -> TrainStats:
    """Minimise `loss_fn(batch)` over `batches` (at most `steps` of them): zero_grad, backward, clip, step.

    `loss_fn` returns the loss tensor, or a mapping whose "loss" is minimised and whose other terms are
    only averaged into the stats (e.g. FSTC's L_C and L_A). `max_grad_norm` clips the global gradient
    norm of `model`'s parameters. Progress: see `Progress` (`log_every` steps between plain lines).
    """
    model.train()
    if steps is not None:
        batches = itertools.islice(batches, steps)
    total = steps if steps is not None else _length(batches)
    progress = Progress(desc, total, log_every)
    try:
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            loss, terms = _objective(loss_fn(batch), progress.steps, desc)
            loss.backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            progress.update(terms)
    finally:
        progress.close()
    return TrainStats(progress.steps, progress.means(), progress.seconds())


def batch_gradients(
    model: nn.Module, loss_fn: Callable[[Batch], LossOutput], batch: Batch
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Gradient of `loss_fn(batch)` w.r.t. the trainable parameters, as arrays, and the loss terms.

    No optimizer step: a gFedNTM client sends these and the server averages them (Eq. 2) and steps. The
    forward pass runs in train mode, so BatchNorm running statistics advance as in centralized training
    (send them with `state_arrays(model, "buffers")`).
    """
    model.train()
    model.zero_grad(set_to_none=True)
    loss, terms = _objective(loss_fn(batch), 0, "gradient")
    loss.backward()
    return gradient_arrays(model), terms


def _length(batches: Iterable[Any]) -> int | None:
    try:
        return len(batches)  # type: ignore[arg-type]
    except TypeError:
        return None
