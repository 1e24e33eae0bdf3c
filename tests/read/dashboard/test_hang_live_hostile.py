"""The Hang and Live pages on the re-probe's hostile files, in AppTest: a dump that is a pickle
bomb is refused and its rank unknown (not a hang), a symlinked stack outside the profiles folder is not
shown, and a killed run is shown ended (stale), not refreshed as running."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from dpcore.contract import runformat as rf
from tests.app_pages import open_page
from tests.fixtures_run import make_run
from tests.read.dashboard.test_app import start
from tests.read.dashboard.test_live_hang_pages import add_live_and_hang
from tests.read.rundir.test_hostile_reprobe import _bomb


def test_a_pickle_bomb_in_hang_is_refused_and_its_rank_is_unknown(tmp_path, monkeypatch):
    """A bomb as rank 1's dump: refused and named, its rank unknown in the verdict (never read as a
    rank that did not enter), and the other ranks' dumps still shown; no exception, no hang."""
    run = make_run(tmp_path, "20250101-120000-mlp")
    add_live_and_hang(run)
    (rf.hang_dir(run, "flat-ws2") / "rank1.fr.json").write_bytes(_bomb())
    at = open_page(start(tmp_path, monkeypatch), "Hang")
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == []
    skipped = [c.value for c in at.caption if "rank1.fr.json" in c.value]
    assert len(skipped) == 1 and "refused" in skipped[0] and "elements" in skipped[0]
    verdict = " ".join(i.value for i in at.info)
    assert "rank 1\\: dump unreadable, unknown" in verdict and "never entered" not in verdict


def test_a_symlinked_stack_outside_the_profiles_folder_is_not_shown(tmp_path, monkeypatch):
    root = tmp_path / "profiles"
    run = make_run(root, "20250101-120000-mlp")
    add_live_and_hang(run)
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-OUTSIDE\n")
    stack = rf.hang_dir(run, "flat-ws2") / "rank1.stack.txt"
    stack.unlink()
    stack.symlink_to(secret)
    at = open_page(start(root, monkeypatch), "Hang")
    assert not at.exception and not at.error
    shown = " ".join(c.value for c in at.code) + " ".join(e.label for e in at.expander)
    assert "SECRET-OUTSIDE" not in shown and "rank 0 stack" in shown and "rank 1 stack" not in shown


def test_a_killed_run_is_shown_ended_not_running(tmp_path, monkeypatch):
    run = make_run(tmp_path, "20250101-120000-mlp")
    add_live_and_hang(run)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    child.wait()
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta.update(status="running", owner={"pid": child.pid, "host": socket.gethostname()})
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    at = open_page(start(tmp_path, monkeypatch), "Live")
    assert not at.exception and not at.error
    text = " ".join(m.value for m in at.markdown)
    assert "ended" in text and "run stale" in text and "s ago" not in text
    assert Path(run).is_dir()
