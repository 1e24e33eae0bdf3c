"""server_gc: the dashboard server freezes what lives long, once per batch of new imports, so that
Streamlit's collection after every script run walks only what the runs made (issue 34).

Each check runs in a fresh interpreter: a freeze is for the whole process, and this test process
must keep its collector as it is.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_freezes_once_per_batch_of_imports_and_the_next_collection_skips_what_it_froze() -> None:
    out = _run("""
        import gc, sys
        from dpcore.read.dashboard import server_gc
        import pandas, plotly.graph_objects  # what the dashboard imports
        assert gc.get_freeze_count() == 0
        live = len(gc.get_objects())
        print(server_gc.freeze_long_lived(), gc.get_freeze_count() >= live // 2, len(gc.get_objects()) < 1000)
        print(server_gc.freeze_long_lived())  # nothing imported since: no collection, no freeze
        import json.tool  # a new module: frozen on the next call
        print(server_gc.freeze_long_lived())
    """)
    assert out.splitlines() == ["True True True", "False", "True"]


def test_garbage_made_after_the_freeze_is_still_collected() -> None:
    """Only what was alive at the freeze is skipped: a cycle made later is collected as before."""
    out = _run("""
        import gc, weakref
        from dpcore.read.dashboard import server_gc
        server_gc.freeze_long_lived()
        class Node: pass
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        print(gone() is None)
    """)
    assert out == "True"


def test_an_app_run_without_a_browser_freezes_nothing() -> None:
    """AppTest (no HTTP headers) runs app.py in the test process: it must not freeze that process."""
    out = _run("""
        import gc, os, tempfile
        os.environ["DPCORE_PROFILES"] = tempfile.mkdtemp()
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file("app.py", default_timeout=60)
        at.run()
        print(not at.exception, gc.get_freeze_count())
    """)
    assert out.splitlines()[-1] == "True 0"
