"""A user's own model for every variant: ``--model MODULE:FUNCTION`` -> :class:`Workload`.

Why a function and not a pickled model: every rank (and the CLI process, which validates)
imports MODULE itself and calls FUNCTION() with torch seeded from ``cfg.seed``, so all ranks
build the same initial weights without a user object ever crossing a process boundary
(the wrappers also broadcast rank 0's weights, as DDP does). Data follows the same rule:
step ``s``'s global batch is ``make_batch(global_batch, batch_generator(seed, s))``, identical
in every variant and rank, and each rank keeps its contiguous shard along dim 0.

Bad input is found in the CLI process before any rank starts or any run directory exists
(:func:`check_workload`), and reported as one :class:`UsageError` line.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from dpcore.contract.config import parse_model_spec
from dpcore.contract.errors import UsageError
from dpcore.write.training.models import batch_generator, shard

Inputs = torch.Tensor | tuple
MakeBatch = Callable[[int, torch.Generator], "tuple[Inputs, torch.Tensor]"]
LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


@dataclass
class Workload:
    """What ``--model MODULE:FUNCTION`` returns: ``dpcore.Workload(model, make_batch, loss_fn)``.

    * ``model``: an ``nn.Module``; called as ``model(*inputs)`` for a tuple, else ``model(inputs)``.
    * ``make_batch(batch_size, generator) -> (inputs, targets)``: inputs a tensor or a tuple of
      tensors, targets a tensor, batch first; draw ONLY from ``generator`` so that every rank
      sees the same global batch.
    * ``loss_fn(outputs, targets)``: a scalar, mean-reduced over the batch (the mean is what
      makes the average of N shard gradients equal the full-batch gradient).
    * ``batch_size``: optional default for ``profile --batch-size`` (32 otherwise).
    """

    model: nn.Module
    make_batch: MakeBatch
    loss_fn: LossFn
    batch_size: int | None = None


class Batch(tuple):
    """Tuple inputs that move and split like one tensor (``.to``, ``.chunk``), so the trainer
    and the one-process ``manual`` variant (which chunks its input N ways) handle a tuple of
    tensors exactly as they handle a single tensor."""

    def to(self, *args: Any, **kwargs: Any) -> Batch:
        return Batch(t.to(*args, **kwargs) for t in self)

    def chunk(self, n: int) -> list[Batch]:
        return [Batch(parts) for parts in zip(*(t.chunk(n) for t in self))]


class TupleInputs(nn.Module):
    """The user's model behind one positional input: wrappers and DDP pass ``x`` through as
    one argument, and this unpacks a tuple into ``model(*x)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Inputs) -> Any:
        return self.model(*x) if isinstance(x, tuple) else self.model(x)


def _first_line(exc: BaseException) -> str:
    """The user's error as one line; ``sys.exit(3)`` in the user's code says so (it would
    otherwise end the CLI with the user's exit status and no word)."""
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _import(spec: str, module: str) -> Any:
    """Import MODULE from the current directory or PYTHONPATH (the cwd is added if missing,
    e.g. under a console script, whose sys.path[0] is the script's folder)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise UsageError(f"--model {spec}: no module named {module!r} in the current "
                             f"directory ({cwd}) or on PYTHONPATH") from None
        raise UsageError(f"--model {spec}: importing {module!r} raised {_first_line(exc)}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: any error, one line
        raise UsageError(f"--model {spec}: importing {module!r} raised {_first_line(exc)}") from None


def load_workload(spec: str, seed: int | None = None) -> Workload:
    """Import MODULE, call FUNCTION() (torch seeded with ``seed`` when given) and check the
    result is a :class:`Workload`. Every problem is one :class:`UsageError` line."""
    module, function = parse_model_spec(spec)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        mod = _import(spec, module)
        fn = getattr(mod, function, None)
        if fn is None or not callable(fn):
            mine = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_")
                          and getattr(v, "__module__", None) == mod.__name__)
            raise UsageError(f"--model {spec}: module {module!r} has no function {function!r}"
                             + (f"; it defines: {', '.join(mine[:12])}" if mine else ""))
        try:
            wl = fn()
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise UsageError(f"--model {spec}: {function}() raised {_first_line(exc)}") from None
    if not isinstance(wl, Workload):
        raise UsageError(f"--model {spec}: {function}() must return a dpcore.Workload(model, "
                         f"make_batch, loss_fn), got {type(wl).__name__}")
    if not isinstance(wl.model, nn.Module):
        raise UsageError(f"--model {spec}: Workload.model must be a torch.nn.Module, got "
                         f"{type(wl.model).__name__}")
    for name in ("make_batch", "loss_fn"):
        if not callable(getattr(wl, name)):
            raise UsageError(f"--model {spec}: Workload.{name} must be callable")
    if wl.batch_size is not None and (not isinstance(wl.batch_size, int) or wl.batch_size < 1):
        raise UsageError(f"--model {spec}: Workload.batch_size must be a positive int, got "
                         f"{wl.batch_size!r}")
    if not any(p.requires_grad for p in wl.model.parameters()):
        raise UsageError(f"--model {spec}: the model has no trainable parameter")
    return wl


def _tensors(spec: str, inputs: Any) -> list[torch.Tensor]:
    items = list(inputs) if isinstance(inputs, tuple) else [inputs]
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise UsageError(f"--model {spec}: make_batch must return (inputs, targets) with inputs a "
                         f"tensor or a tuple of tensors, got {type(inputs).__name__}")
    return items


def workload_batch(spec: str, wl: Workload, step: int, global_batch: int, seed: int
                   ) -> tuple[Inputs, torch.Tensor]:
    """Step ``step``'s global batch, checked: every tensor has ``global_batch`` rows."""
    try:
        out = wl.make_batch(global_batch, batch_generator(seed, step))
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        raise UsageError(f"--model {spec}: make_batch({global_batch}, generator) raised "
                         f"{_first_line(exc)}") from None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise UsageError(f"--model {spec}: make_batch must return a pair (inputs, targets), got "
                         f"{type(out).__name__}")
    inputs, targets = out
    items = _tensors(spec, inputs)
    if not isinstance(targets, torch.Tensor):
        raise UsageError(f"--model {spec}: make_batch's targets must be a tensor, got "
                         f"{type(targets).__name__}")
    rows = [t.shape[0] if t.dim() else None for t in items + [targets]]
    if any(r != global_batch for r in rows):
        got = ", ".join("scalar" if r is None else str(r) for r in rows)
        raise UsageError(f"--model {spec}: make_batch({global_batch}, generator) returned tensors "
                         f"with first dimensions {got}; every input and the targets must have "
                         f"the batch ({global_batch}) first")
    return (Batch(items) if isinstance(inputs, tuple) else inputs), targets


def shard_batch(x: Inputs, rank: int, world_size: int) -> Inputs:
    """Rank ``rank``'s contiguous rows of every input tensor (``models.shard``'s rule)."""
    if isinstance(x, tuple):
        return Batch(shard(t, rank, world_size) for t in x)
    return shard(x, rank, world_size)


class _LoadTimeout(BaseException):
    """Raised into the user's code by the alarm of :func:`_deadline` (a BaseException, so a
    bare ``except Exception`` in the user's code cannot swallow it)."""


@contextlib.contextmanager
def _deadline(spec: str, seconds: float | None) -> Iterator[None]:
    """Bound the user's import, FUNCTION(), make_batch and first forward by ``seconds`` (the
    job ``--timeout``): a function that never returns is one line, exit 2, not a hung CLI.
    SIGALRM only exists in the main thread; elsewhere (a library caller's thread) no bound."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise _LoadTimeout

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _LoadTimeout:
        raise UsageError(f"--model {spec}: loading it and one forward + loss did not finish within "
                         f"--timeout ({seconds:g} s); does FUNCTION() or make_batch wait for "
                         "something?") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_workload(spec: str, seed: int, world_sizes: list[int] | tuple[int, ...],
                   timeout_s: float | None = None) -> Workload:
    """:func:`_check_workload` within ``timeout_s`` seconds (None: unbounded)."""
    with _deadline(spec, timeout_s):
        return _check_workload(spec, seed, world_sizes)


def _check_workload(spec: str, seed: int, world_sizes: list[int] | tuple[int, ...]) -> Workload:
    """Everything the ranks will do with the workload, once, in the CLI process: load it,
    draw a ``2 * max(world_sizes)`` batch, check its shape (every tensor batch-first, so it
    splits like the ranks split it) and that it is reproducible from the generator, and run
    one forward + loss. Whether each world size divides the run's global batch is
    ``TrainConfig.local_batch``'s check. Returns the loaded workload."""
    wl = load_workload(spec, seed)
    top = max(world_sizes)
    n = 2 * top
    x, y = workload_batch(spec, wl, 0, n, seed)
    x2, y2 = workload_batch(spec, wl, 0, n, seed)
    same = all(torch.equal(a, b) for a, b in zip(_tensors(spec, x) + [y], _tensors(spec, x2) + [y2]))
    if not same:
        raise UsageError(f"--model {spec}: make_batch returned different batches for equally "
                         "seeded generators; draw every random number from the generator it "
                         "is given, so all ranks see the same global batch")
    try:
        with torch.no_grad():
            loss = wl.loss_fn(TupleInputs(wl.model)(x), y)
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        raise UsageError(f"--model {spec}: the first forward + loss_fn on a batch of {n} raised "
                         f"{_first_line(exc)}") from None
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UsageError(f"--model {spec}: loss_fn must return a scalar tensor (mean over the "
                         f"batch), got {shape}")
    return wl


def param_bytes(model: nn.Module) -> int:
    """Bytes of the trainable parameters (tied ones once): what every step all-reduces."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
