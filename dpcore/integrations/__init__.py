"""Ways into dpcore from the frameworks people train with (above both wings, like ``cli.py``).

- ``dpcore.trace_handler(out, name)`` (:mod:`.trace_handler`): ``on_trace_ready`` for
  ``torch.profiler.profile`` (and so Accelerate's ``ProfileKwargs`` and Lightning's
  ``PyTorchProfiler``): every rank's trace of every profiler cycle lands in one run.
- ``LightningCallback`` (:mod:`.lightning_callback`) for ``lightning.Trainer(callbacks=[...])``.
- ``TransformersCallback`` (:mod:`.transformers_callback`) for ``transformers.Trainer(callbacks=[...])``.

Both drive the same :func:`dpcore.record` recording (:mod:`.driver`).

The frameworks are optional: nothing here imports them until a callback is asked for, and a
missing one raises one ImportError line that says what to install.
"""
from __future__ import annotations

from typing import Any

__all__ = ["LightningCallback", "TransformersCallback", "trace_handler"]

#: public name -> (module, the framework it needs, the pip package that brings it)
_LAZY = {"LightningCallback": ("lightning_callback", "lightning", "lightning"),
         "TransformersCallback": ("transformers_callback", "transformers", "transformers")}


def missing_framework(what: str, package: str) -> ImportError:
    """The one line a user without the framework sees."""
    return ImportError(f"dpcore.integrations.{what} needs the {package!r} package, which is not "
                       f"installed: pip install {package}  (or: pip install 'dpcore[integrations]')")


def __getattr__(name: str) -> Any:
    if name == "trace_handler":
        from dpcore.integrations.trace_handler import trace_handler
        return trace_handler
    if name in _LAZY:
        module, framework, package = _LAZY[name]
        import importlib
        try:
            mod = importlib.import_module(f"dpcore.integrations.{module}")
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != framework:
                raise
            raise missing_framework(name, package) from None
        return getattr(mod, name)
    raise AttributeError(f"module 'dpcore.integrations' has no attribute {name!r}")
