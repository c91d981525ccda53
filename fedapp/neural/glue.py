"""Torch glue shared by every torch method (CCFC, FSTC, gFedNTM): one way to do the plumbing.

- Model state <-> NumPy arrays in a fixed order (the module's `state_dict` order: parameters AND buffers,
  so BatchNorm running statistics and counters travel too), described by a `StateSchema` of
  (name, shape, dtype) whose short fingerprint a client reports so the server can check the names that
  Flower's `Parameters` do not carry. Arrays that do not match are rejected, never loaded.
- The sample-weighted average of several clients' arrays (FedAvg) with one policy for integer buffers.
- Gradients as arrays (gFedNTM clients send gradients, not weights).
- `device` = auto | cpu | cuda, seeding, and an opt-in deterministic mode.
- Client state that must survive rounds in Flower's `context.state` (the client object is rebuilt every
  round): optimizer state, random streams, and a module's own weights. The batch cursor and the training
  loop live in `fedapp.neural.training`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from flwr.common import Array, ArrayRecord, ConfigRecord, RecordDict, Scalar
from torch import nn

from fedapp.config.run import DEVICES
from fedapp.wire import ArraySpec, ReplyError, check_arrays

FINGERPRINT_KEY = "state-fingerprint"  # metrics key: the sender's StateSchema.fingerprint
StatePart = Literal["state", "trainable", "buffers"]


class StateMismatchError(ReplyError):
    """Arrays that do not match a model's state schema: never loaded, never aggregated."""


class ClientStateError(ValueError):
    """What an earlier round saved in `context.state` does not fit this round's setup."""


class DeviceError(ValueError):
    """The requested device is unknown or not available on this machine."""


# --------------------------------------------------------------------------- model state <-> arrays
@dataclass(frozen=True)
class TensorSpec:
    """One exchanged tensor: its `state_dict` name, shape and NumPy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class StateSchema:
    """The ordered tensors a model exchanges; server and clients build it from the same model class."""

    tensors: tuple[TensorSpec, ...]

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.tensors]

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over names, shapes and dtypes (Parameters carry no names)."""
        text = json.dumps([[spec.name, list(spec.shape), spec.dtype] for spec in self.tensors])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def array_specs(self) -> list[ArraySpec]:
        """The reply specs of these tensors (exact dtype), for a strategy's `reply_spec`."""
        return [
            ArraySpec(spec.name, spec.shape, np.dtype(spec.dtype).kind, spec.dtype) for spec in self.tensors
        ]

    def check(self, arrays: Sequence[np.ndarray], *, sender: str, fingerprint: str | None = None) -> None:
        """Raise StateMismatchError naming `sender` (e.g. "client 3") and the first offending tensor.

        Count, shapes, exact dtypes and finiteness are checked tensor by tensor; then, if the sender
        reported a `fingerprint`, it must equal ours (it catches renamed tensors of equal shapes).
        """
        try:
            check_arrays(arrays, self.array_specs())
        except ReplyError as exc:
            raise StateMismatchError(f"{sender}: {exc}") from None
        if fingerprint is not None and fingerprint != self.fingerprint:
            raise StateMismatchError(
                f"{sender}: state fingerprint {fingerprint!r}, expected {self.fingerprint!r} "
                "(same shapes, different tensor names: another model class or version?)"
            )

    def check_fingerprint(self, metrics: Mapping[str, Scalar], *, sender: str) -> None:
        """Raise StateMismatchError unless `metrics[FINGERPRINT_KEY]` is this schema's fingerprint."""
        reported = metrics.get(FINGERPRINT_KEY)
        if not isinstance(reported, str):
            raise StateMismatchError(f"{sender}: metrics lack a string '{FINGERPRINT_KEY}'")
        if reported != self.fingerprint:
            raise StateMismatchError(
                f"{sender}: state fingerprint {reported!r}, expected {self.fingerprint!r} "
                "(tensor names, shapes or dtypes differ: another model class or version?)"
            )


def _named_tensors(model: nn.Module, part: StatePart) -> list[tuple[str, torch.Tensor]]:
    """`state`: the whole state_dict; `trainable`: parameters that get gradients; `buffers`: the rest."""
    if part == "trainable":
        return [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    state = list(model.state_dict().items())
    if part == "state":
        return state
    if part == "buffers":
        param_names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        return [(name, tensor) for name, tensor in state if name not in param_names]
    raise ValueError(f"part must be 'state', 'trainable' or 'buffers', got {part!r}")


def _numpy_dtype(name: str, tensor: torch.Tensor) -> str:
    try:
        return torch.empty(0, dtype=tensor.dtype).numpy().dtype.name
    except TypeError:
        raise ValueError(
            f"tensor '{name}' has dtype {tensor.dtype}, which NumPy cannot hold: exchange it as float32"
        ) from None


def state_schema(model: nn.Module, part: StatePart = "state") -> StateSchema:
    """(name, shape, dtype) of `model`'s tensors in `state_dict` order (`part`: see `_named_tensors`)."""
    return StateSchema(
        tuple(
            TensorSpec(name, tuple(tensor.shape), _numpy_dtype(name, tensor))
            for name, tensor in _named_tensors(model, part)
        )
    )


def state_arrays(model: nn.Module, part: StatePart = "state") -> list[np.ndarray]:
    """Copies of `model`'s tensors as NumPy arrays, in `state_schema(model, part)` order."""
    return [tensor.detach().to("cpu", copy=True).numpy() for _, tensor in _named_tensors(model, part)]


def load_state_arrays(
    model: nn.Module,
    arrays: Sequence[np.ndarray],
    *,
    sender: str = "server",
    part: StatePart = "state",
    fingerprint: str | None = None,
) -> None:
    """Check `arrays` against `model`'s schema, then copy them into its tensors (in place).

    Copying in place keeps the parameter objects, so an optimizer built before still points at them.
    Raises StateMismatchError (naming `sender` and the first offending tensor) before touching the model.
    """
    schema = state_schema(model, part)
    schema.check(arrays, sender=sender, fingerprint=fingerprint)
    tensors = {name: torch.tensor(array) for name, array in zip(schema.names, arrays, strict=True)}
    model.load_state_dict(tensors, strict=part == "state")


def weighted_average(states: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> list[np.ndarray]:
    """Weighted mean of several clients' arrays, tensor by tensor (FedAvg: CCFC Eq. 8, gFedNTM Eq. 2).

    Float tensors: sum_i w_i x_i / sum_i w_i computed in float64, then cast back to the tensor's dtype.
    Integer tensors (BatchNorm's num_batches_tracked): the same weighted mean rounded to the nearest
    integer (half to even) and kept integer; equal counts average to themselves, so a federated step
    keeps the count a centralized run would have. Replies must be validated first: differing shapes or
    dtypes, non-finite values, or weights that are not positive raise ValueError (never averaged).
    """
    if not states or len(states) != len(weights):
        raise ValueError(
            f"need one weight per state and at least one state, got {len(states)} states "
            f"and {len(weights)} weights"
        )
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"weights must be positive and finite, got {list(weights)}")
    reference = states[0]
    for index, state in enumerate(states):
        if len(state) != len(reference):
            raise ValueError(f"state {index} has {len(state)} arrays, state 0 has {len(reference)}")
    averaged = []
    for position, first in enumerate(reference):
        column = [np.asarray(state[position]) for state in states]
        for index, array in enumerate(column):
            if array.shape != first.shape or array.dtype != first.dtype:
                raise ValueError(
                    f"array {position} of state {index} is {array.dtype}{array.shape}, "
                    f"state 0 has {first.dtype}{first.shape}"
                )
        kind = first.dtype.kind
        if kind == "f" and not all(np.all(np.isfinite(array)) for array in column):
            raise ValueError(f"array {position} holds NaN or infinite values: validate replies first")
        if kind not in "fiu":
            raise ValueError(f"array {position} has dtype {first.dtype}, which has no weighted mean")
        mean = sum(wi * array.astype(np.float64) for wi, array in zip(w, column, strict=True)) / w.sum()
        averaged.append((mean if kind == "f" else np.rint(mean)).astype(first.dtype))
    return averaged


# ------------------------------------------------------------------------------------ gradients
def gradient_arrays(model: nn.Module) -> list[np.ndarray]:
    """The trainable parameters' `.grad` as arrays, in `state_schema(model, "trainable")` order.

    A trainable parameter without a gradient is an error rather than zeros: for Adam a zero gradient
    still moves the weight, while a centralized step would skip it. Freeze such parameters instead.
    """
    missing = [name for name, param in _named_tensors(model, "trainable") if param.grad is None]
    if missing:
        raise ValueError(f"parameter '{missing[0]}' got no gradient: freeze it (requires_grad=False)")
    return [
        param.grad.detach().to("cpu", copy=True).numpy() for _, param in _named_tensors(model, "trainable")
    ]


def load_gradients(model: nn.Module, arrays: Sequence[np.ndarray], *, sender: str = "server") -> None:
    """Check `arrays` against the trainable schema and write them into `.grad` (then `optimizer.step()`)."""
    named = _named_tensors(model, "trainable")
    state_schema(model, "trainable").check(arrays, sender=sender)
    for (_, param), array in zip(named, arrays, strict=True):
        param.grad = torch.tensor(array, device=param.device)


# ------------------------------------------------------------------------------------- device
def resolve_device(name: str) -> torch.device:
    """Run-config `device`: `auto` = cuda when torch sees a GPU, else cpu; `cuda` without one is an error."""
    if name not in DEVICES:
        raise DeviceError(f"device must be one of {' | '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            f"device=cuda but torch {torch.__version__} sees no CUDA GPU "
            f"(built for CUDA {torch.version.cuda}); use device=auto or device=cpu"
        )
    return torch.device(name)


# ------------------------------------------------------------------------------------ seeding
def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed python `random`, NumPy's global RNG and torch (CPU and every CUDA device).

    Prefer the explicit generators of `Rngs` in new code; this covers libraries that use global RNGs.
    `deterministic`: see `set_deterministic`.
    """
    _seed_globals(seed)
    set_deterministic(deterministic)


def set_deterministic(enabled: bool) -> None:
    """Opt-in bitwise reproducibility on GPU: deterministic kernels only (errors where none exists).

    CUBLAS_WORKSPACE_CONFIG only takes effect if set before the first cuBLAS call: call this first.
    CPU runs are reproducible without it. Disabling restores torch's defaults.
    """
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False  # autotuning picks kernels by timing, which varies
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled


def _seed_globals(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily when CUDA is not initialised yet)


@dataclass
class Rngs:
    """Explicit generators a client passes around (data order, noise, k-means seeds)."""

    numpy: np.random.Generator
    torch: torch.Generator  # CPU; for CUDA tensors draw on CPU and move, or use the global CUDA RNG

    @classmethod
    def from_seed(cls, seed: int) -> Rngs:
        # Children of one SeedSequence: streams independent of each other and of the global RNGs
        numpy_seq, torch_seq = np.random.SeedSequence(seed).spawn(2)
        generator = torch.Generator().manual_seed(int(torch_seq.generate_state(1, np.uint64)[0]))
        return cls(np.random.default_rng(numpy_seq), generator)


# ---------------------------------------------------------------- client state that survives rounds
@contextmanager
def client_rngs(state: RecordDict, key: str, seed: int) -> Iterator[Rngs]:
    """This client's random streams for one round, continuing exactly where its previous round stopped.

    On entry the global RNGs (python `random`, NumPy's global, torch CPU and CUDA: dropout and
    augmentations draw from them) and the yielded explicit `Rngs` are restored from `state[key]`, or
    seeded from `seed` in the first round; on normal exit they are saved back (a failed round saves
    nothing). Needed because the global RNGs belong to the process, which runs other clients between
    this client's rounds (a Ray actor hosts several virtual clients). Assumes one client at a time per
    process, as Flower runs them.
    """
    saved = state.get(key)
    if saved is None:
        _seed_globals(seed)
        rngs = Rngs.from_seed(seed)
    else:
        rngs = _restore_rngs(saved, seed)
    yield rngs
    state[key] = _capture_rngs(rngs, saved)


def _capture_rngs(rngs: Rngs, saved: ConfigRecord | None) -> ConfigRecord:
    version, words, gauss = random.getstate()
    numpy_global = np.random.get_state(legacy=False)
    numpy_global["state"]["key"] = numpy_global["state"]["key"].tolist()
    record = ConfigRecord(
        {
            "python": json.dumps([version, list(words), gauss]),
            "numpy-global": json.dumps(numpy_global),
            "numpy": json.dumps(rngs.numpy.bit_generator.state),
            "torch": _tensor_bytes(rngs.torch.get_state()),
            "torch-cpu": _tensor_bytes(torch.get_rng_state()),
        }
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        record["torch-cuda"] = [_tensor_bytes(s) for s in torch.cuda.get_rng_state_all()]
    elif saved is not None and "torch-cuda" in saved:
        record["torch-cuda"] = saved["torch-cuda"]  # CUDA untouched this round: its state is unchanged
    return record


def _restore_rngs(saved: ConfigRecord, seed: int) -> Rngs:
    version, words, gauss = json.loads(saved["python"])
    random.setstate((version, tuple(words), gauss))
    numpy_global = json.loads(saved["numpy-global"])
    numpy_global["state"]["key"] = np.asarray(numpy_global["state"]["key"], dtype=np.uint32)
    np.random.set_state(numpy_global)
    torch.set_rng_state(_bytes_tensor(saved["torch-cpu"]))
    if "torch-cuda" in saved:
        torch.cuda.set_rng_state_all([_bytes_tensor(blob) for blob in saved["torch-cuda"]])
    else:
        torch.cuda.manual_seed_all(seed)  # as an uninterrupted run: CUDA still at its first-round seed
    bit_state = json.loads(saved["numpy"])
    bit_generator = getattr(np.random, bit_state["bit_generator"])()
    bit_generator.state = bit_state
    generator = torch.Generator()
    generator.set_state(_bytes_tensor(saved["torch"]))
    return Rngs(np.random.Generator(bit_generator), generator)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()


def _bytes_tensor(blob: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def save_optimizer(state: RecordDict, key: str, optimizer: torch.optim.Optimizer) -> None:
    """Keep `optimizer.state_dict()` (e.g. Adam's moments and step) in `state[key]` for the next round.

    Stored as a `torch.save` blob in a ConfigRecord: exact for any optimizer (nested per-parameter state,
    None and tuple hyper-parameters that records cannot hold), read back with `weights_only=True` (no
    code runs on load), and it never leaves the node, so no other format is needed.
    """
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    state[key] = ConfigRecord({"state-dict": buffer.getvalue()})


def restore_optimizer(state: RecordDict, key: str, optimizer: torch.optim.Optimizer) -> bool:
    """Load the state an earlier round saved into `optimizer` (built over this round's parameters).

    Returns False in the first round (nothing saved). The saved param_groups come back too (lr,
    betas, ...): set a schedule's value after restoring. Raises ClientStateError when the parameter
    groups differ from the saved ones.
    """
    if key not in state:
        return False
    saved = torch.load(io.BytesIO(state[key]["state-dict"]), map_location="cpu", weights_only=True)
    try:
        optimizer.load_state_dict(saved)  # moves each tensor to its parameter's device
    except ValueError as exc:
        raise ClientStateError(f"context.state['{key}']: {exc}") from None
    return True


def save_module(state: RecordDict, key: str, module: nn.Module) -> None:
    """Keep a module's whole state (e.g. FSTC's local model, which the server does not send back)."""
    named = zip(state_schema(module).names, state_arrays(module), strict=True)
    state[key] = ArrayRecord({name: Array(array) for name, array in named})


def restore_module(state: RecordDict, key: str, module: nn.Module) -> bool:
    """Load the state `save_module` kept into `module`; False in the first round. Checked like a reply."""
    if key not in state:
        return False
    record = state[key]
    expected = state_schema(module).names
    if list(record) != expected:
        held, wanted = next(
            (a, b) for a, b in zip([*record, None], [*expected, None], strict=False) if a != b
        )
        raise ClientStateError(
            f"context.state['{key}'] holds tensor {held!r} where the module has {wanted!r}"
        )
    arrays = [record[name].numpy() for name in expected]
    try:
        load_state_arrays(module, arrays, sender=f"context.state['{key}']")
    except StateMismatchError as exc:
        raise ClientStateError(str(exc)) from None
    return True
