"""Logging the collectives of a DDP comm hook dpcore did not write (fp16/bf16, PowerSGD, a user's).

Why a tap and not a wrapping hook: DDP hands a registered hook to its C++ reducer and refuses a
second registration, so once a user registered PowerSGD or fp16 compression, nothing can sit
between DDP and that hook; and DDP's own hooks launch their collectives from inside (PowerSGD
its second all-reduce from a future's callback). The hooks call the ``torch.distributed``
functions by module attribute (``dist.all_reduce(...)``), so while a tap is installed those
few functions are replaced by ones that log the call (bytes on the wire: the tensor actually
sent, half-size for fp16, P and Q for PowerSGD) and then call the original with the same
arguments: the hook computes exactly what it computes without the tap. Only calls on the
tapped process group are logged, and only while ``active()`` says so (``dpcore.record``: inside
a step); a call from another thread (PowerSGD's callback on the backend's thread) is logged
without a "communication call" of the training thread. ``remove()`` puts the originals back.
Used by ``dpcore.record`` (a user's hook kept) and ``torch_ddp`` (``profile --comm-hook``).
"""
from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dpcore.write.capture.comm_log import Recorder

#: The collectives DDP's comm hooks launch (torch.distributed.algorithms.ddp_comm_hooks: the
#: default, fp16/bf16 compression, PowerSGD), and what dpcore calls each op.
TAPPED_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather",
              "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
              "broadcast": "broadcast"}


class CollectiveTap:
    """See the module docstring. ``recorder()`` is read at each call (it may be swapped)."""

    def __init__(self, group: Any, recorder: Callable[[], Recorder], active: Callable[[], bool]) -> None:
        self.group, self.recorder, self.active = group, recorder, active
        self._saved: dict[str, Any] = {}

    def _ours(self, group: Any) -> bool:
        if group is None or group is self.group:
            return True
        return group is dist.group.WORLD and self.group in (None, dist.group.WORLD)

    def install(self) -> CollectiveTap:
        main = threading.get_ident()
        for fn_name, op in TAPPED_OPS.items():
            orig = getattr(dist, fn_name, None)
            if orig is not None:
                self._saved[fn_name] = orig
                setattr(dist, fn_name, self._tapped(orig, op, main))
        return self

    def remove(self) -> None:
        for fn_name, orig in self._saved.items():
            setattr(dist, fn_name, orig)
        self._saved.clear()

    def _tapped(self, orig: Any, op: str, main_thread: int) -> Any:
        sig = inspect.signature(orig)

        def tapped(*args: Any, **kwargs: Any) -> Any:
            if not self.active():
                return orig(*args, **kwargs)
            bound = sig.bind_partial(*args, **kwargs).arguments
            if not self._ours(bound.get("group")):
                return orig(*args, **kwargs)
            tensor = next(iter(bound.values()))  # the first argument: the tensor sent
            if isinstance(tensor, list):  # all_gather(tensor_list, tensor)
                tensor = bound.get("tensor")
            nbytes = tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0
            rec = self.recorder()
            idx = rec.launch(op, "native", nbytes)
            work = orig(*args, **kwargs)
            if not bound.get("async_op", False):
                rec.done(idx)
                return work
            if threading.get_ident() == main_thread:
                rec.returned(idx)
            else:
                rec._close(idx)
            work.get_future().add_done_callback(lambda _f: rec.finished(idx))
            return work

        tapped.__wrapped__ = orig  # type: ignore[attr-defined]
        return tapped
