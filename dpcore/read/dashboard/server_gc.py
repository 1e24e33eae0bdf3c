"""Keep the dashboard server's garbage collections short: move what lives as long as the process
(imported modules, their tables, Plotly's validators) out of the collector's sight.

Why: Streamlit runs a full collection after
every script run (``runner.postScriptGC``), and a full collection walks every tracked object of
the process. With pandas, pyarrow, Plotly and Streamlit imported that walk took 90-165 ms per
run on the 2-core machine (measured with a ``gc.callbacks`` timer in the served app), on one of
the two cores while the browser was drawing the page the run had just sent. ``gc.freeze()``
moves every object tracked at that moment into a permanent generation that collections skip:
after it, the same collection took 3-15 ms.

When: at the start of a run, and only when the process has imported modules since the last
freeze (the first run of each kind of page, a handful of times per process): what is alive then
is what lives long (modules, caches, sessions); the previous run's garbage was collected at its
end, and a collection just before the freeze takes what is left. The cost: an object frozen while
alive and later dropped inside a reference cycle is never freed (one without a cycle still is,
by reference counting); the freezes are few, so that is bounded. Only in a served app
(:func:`served`): a test process (AppTest) keeps its collector as it is.
"""
from __future__ import annotations

import gc
import sys

import streamlit as st

#: How many modules the process had at the last freeze (0: never frozen).
_frozen_at = 0


def served() -> bool:
    """Whether this script run is a browser's (it sent HTTP headers); AppTest and bare mode send none."""
    return bool(st.context.headers)


def freeze_long_lived() -> bool:
    """Collect, then freeze every tracked object, when modules were imported since the last
    freeze; True when it froze."""
    global _frozen_at
    if len(sys.modules) == _frozen_at:
        return False
    gc.collect()
    gc.freeze()
    _frozen_at = len(sys.modules)
    return True
