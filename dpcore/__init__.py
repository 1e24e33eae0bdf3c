"""dpcore: run, profile and explain every data-parallel training variant.

Public API (imports are lazy so ``import dpcore`` stays cheap for the CLI and the app):

- ``dpcore.wrap(variant, module, *, bucket_mb=25.0, group=None)``: a DDP-like wrapper of a
  multi-process variant around ``module`` (process group already initialised).
  ``dpcore.wrap("fsdp", module, compute_dtype=None)``: the from-scratch FSDP wrapper (>= 2-D
  parameters sharded; ``.module`` holds the shards, ``gather_full_params()`` the full ones;
  ``compute_dtype=torch.bfloat16`` all-gathers and computes in bf16, master weights float32).
- ``dpcore.shard_optimizer(params, optimizer_cls, **kwargs)``: a ``torch.optim.Optimizer``
  whose state is sharded across the default process group (ZeRO-1): each rank keeps state for
  and steps its share of the parameters, then broadcasts them. Use it in your own loop after
  averaging gradients (DDP, ``dpcore.wrap``); it needs Adam-like state to save memory.
- ``dpcore.load_run(path)``: open a run directory (see docs/DESIGN.md).
- ``dpcore.Workload(model, make_batch, loss_fn)``: what a user's ``--model MODULE:FUNCTION``
  returns (``examples/my_model.py``).
- ``dpcore.record(out="profiles", *, name=None, model=None, ...)``: a user's own training loop
  as a run directory (``with rec.step():`` marks a step; ``examples/record_ddp.py``).
- ``dpcore.trace_handler(out="profiles", name=None)``: ``on_trace_ready`` for torch.profiler
  (plain, Accelerate, Lightning): every rank's every profiler cycle into one run.
- ``dpcore.integrations.LightningCallback``: framework callbacks (the frameworks are optional).
- ``dpcore.VARIANTS``, ``dpcore.ALGOS``: the valid names.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["wrap", "shard_optimizer", "load_run", "Workload", "record", "trace_handler", "VARIANTS", "ALGOS",
           "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("wrap", "VARIANTS"):
        from dpcore.write.dp import variants
        return getattr(variants, name)
    if name == "shard_optimizer":
        from dpcore.write.dp.zero_optimizer import shard_optimizer
        return shard_optimizer
    if name == "ALGOS":
        from dpcore.write.dp.comm import ALGOS
        return ALGOS
    if name == "Workload":
        from dpcore.write.training.workload import Workload
        return Workload
    if name == "record":
        from dpcore.write.commands.record import record
        return record
    if name == "trace_handler":
        from dpcore.integrations.trace_handler import trace_handler
        return trace_handler
    if name == "load_run":
        from dpcore.read.rundir.load import load_run
        return load_run
    raise AttributeError(f"module 'dpcore' has no attribute {name!r}")
