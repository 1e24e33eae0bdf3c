"""dpcore: run, profile and explain every data-parallel training variant.

Public API (imports are lazy so ``import dpcore`` stays cheap for the CLI and the app):

- ``dpcore.wrap(variant, module, *, bucket_mb=25.0, group=None)``: a DDP-like wrapper of a
  multi-process variant around ``module`` (process group already initialised).
- ``dpcore.load_run(path)``: open a run directory (see docs / DESIGN.md).
- ``dpcore.Workload(model, make_batch, loss_fn)``: what a user's ``--model MODULE:FUNCTION``
  returns (``examples/my_model.py``).
- ``dpcore.record(out="profiles", *, name=None, model=None, ...)``: a user's own training loop
  as a run directory (``with rec.step():`` marks a step; ``examples/record_ddp.py``).
- ``dpcore.VARIANTS``, ``dpcore.ALGOS``: the valid names.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["wrap", "load_run", "Workload", "record", "VARIANTS", "ALGOS", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("wrap", "VARIANTS"):
        from dpcore.write import variants
        return getattr(variants, name)
    if name == "ALGOS":
        from dpcore.write.comm import ALGOS
        return ALGOS
    if name == "Workload":
        from dpcore.write.workload import Workload
        return Workload
    if name == "record":
        from dpcore.write.record import record
        return record
    if name == "load_run":
        from dpcore.read.analysis import load_run
        return load_run
    raise AttributeError(f"module 'dpcore' has no attribute {name!r}")
