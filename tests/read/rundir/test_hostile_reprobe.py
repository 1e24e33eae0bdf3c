"""The hostile re-probe's files, each made for real (a pickle bomb, absurd world sizes, a
sparse live.csv without a newline, symlinks out of the profiles folder, a stray file among
dumps), read by the loaders every command and page uses: one line or a bounded answer, never
a hang or an allocation the size of a claim."""
from __future__ import annotations

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpcore.contract import flightrec
from dpcore.contract import runformat as rf
from dpcore.contract.flightrec import DumpError, load_dump, verdict
from dpcore.read.analysis.hang import hang_verdict
from dpcore.read.plots.heat import rank_step_heat_figure
from dpcore.read.rundir import hang as hang_dir
from dpcore.read.rundir.hang import MAX_STACK_BYTES, load_hangs
from dpcore.read.rundir.live import MAX_LIVE_BYTES, read_live, run_status
from tests.contract.test_flightrec import _entry, _steps
from tests.fixtures_run import make_run

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args: str, cap_mib: int = 2000, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dpcore ARGS`` under an address-space cap of its start-up size plus
    ``cap_mib`` (an unbounded allocation fails fast instead of swapping the machine)."""
    code = ("import sys, runpy; from tests.memlimit import limit_address_space; "
            f"limit_address_space({cap_mib}); sys.argv = ['dpcore', *sys.argv[1:]]; "
            "runpy.run_module('dpcore', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPCORE_", "TORCH_FR"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def _bomb(levels: int = 60) -> bytes:
    """A pickle of a few hundred bytes whose list names the level below twice, ``levels`` deep:
    2**levels elements when walked as a tree."""
    node: list = []
    for _ in range(levels):
        node = [node, node]
    return pickle.dumps({"entries": [{"profiling_name": "gloo:all_reduce",
                                      "collective_seq_id": 1, "input_sizes": node}]})


def test_a_pickle_of_shared_references_is_refused_in_one_line(tmp_path):
    raw = _bomb()
    assert len(raw) < 1024
    f = tmp_path / "rank0.fr.json"
    f.write_bytes(raw)
    t0 = time.monotonic()
    with pytest.raises(DumpError, match="expands to more than"):
        load_dump(f)
    assert time.monotonic() - t0 < 5
    out = _cli("hang", str(tmp_path), timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "refused" in out.stderr


def test_a_list_containing_itself_and_deep_json_are_refused(tmp_path):
    loop: list = []
    loop.append(loop)
    (tmp_path / "a").write_bytes(pickle.dumps({"entries": [{"input_sizes": loop}]}))
    with pytest.raises(DumpError, match="deeper than"):
        load_dump(tmp_path / "a")
    (tmp_path / "b").write_text('{"entries": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    with pytest.raises(DumpError, match="refused"):
        load_dump(tmp_path / "b")


_LONG_OP = "gloo:" + "x" * 2**20  # one string object, so the pickle names it once


@pytest.mark.parametrize("entries,needle", [
    # one 1 MiB string named 100,000 times in one entry: 100 GiB once json.dumps-ed
    ([{"profiling_name": "gloo:all_reduce", "collective_seq_id": 1,
      "input_sizes": ["y" * 2**20] * 100_000}], "MiB of text (shared strings)"),
    # one 1 MiB op name shared by 20,000 entries: each split(':') copies it, 20 GiB
    ([{"profiling_name": _LONG_OP, "collective_seq_id": i} for i in range(20_000)],
     "MiB of text (shared strings)"),
    ([{"profiling_name": "gloo:all_reduce", "input_sizes": [b"y"]}], "holds a bytes value"),
    ([{"profiling_name": "gloo:all_reduce", "input_sizes": {1, 2}}], "holds a set value"),
    ([{"profiling_name": "gloo:all_reduce", "frames": {(1, 2): 3}}], "a dict key is not"),
], ids=["sizes", "names", "bytes", "set", "key"])
def test_shared_long_strings_and_values_json_cannot_hold_are_refused(tmp_path, entries, needle):
    """A pickle's memo shares strings as it shares lists: a 1.3 MB file that stands for GiBs of
    text ran ``hang`` out of memory; bytes, sets and tuple keys were a TypeError (exit 1)."""
    raw = pickle.dumps({"entries": entries})
    assert len(raw) < 2 * 2**20
    (tmp_path / "rank0.fr.json").write_bytes(raw)
    with pytest.raises(DumpError, match=re.escape(needle)):
        load_dump(tmp_path / "rank0.fr.json")
    out = _cli("hang", str(tmp_path), cap_mib=1500, timeout=90)
    assert out.returncode == 2 and out.stdout == "", out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr, out.stderr


def test_an_honest_dump_with_shared_strings_still_loads(tmp_path):
    entries = _steps(200)
    (tmp_path / "d").write_bytes(pickle.dumps({"entries": entries}))
    assert load_dump(tmp_path / "d")["entries"] == entries


def _two_rank_hang(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    base = _steps(3) + [_entry(7, "barrier", 0)]
    (folder / "rank0.fr.json").write_text(json.dumps({"entries": base + [_entry(8, "all_reduce", 1000, False)]}))
    (folder / "rank1.fr.json").write_text(json.dumps({"entries": base}))


def test_world_sizes_claimed_by_names_and_fields_are_bounded(tmp_path):
    run = make_run(tmp_path, "20250101-120000-mlp")
    meta = json.loads((run / rf.RUN_JSON).read_text())
    job = meta["jobs"][0]["id"]
    meta["jobs"][0]["processes"] = 10**15
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    folder = rf.hang_dir(run, job)
    _two_rank_hang(folder)
    (folder / "rank99999999999999.fr.json").write_text(json.dumps({"entries": []}))
    (folder / rf.VERDICT_FILE).write_text(json.dumps({"no_answer": [10**15]}))
    out = _cli("hang", str(run))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "verdict (missing): rank 1 never entered collective seq 8" in out.stdout
    # the job's folder alone: the verdict.json claim is dropped, the two real ranks stay
    sets = load_hangs(folder)
    assert sorted(sets[0].dumps) == [0, 1] and sets[0].world_size == 2
    # the rule itself: an absurd world size adds no absent ranks; a large real one is one line
    dumps = sets[0].dumps
    assert verdict(dumps, 10**15).lagging_ranks == [1]
    big = verdict(dumps, 4096)
    assert big.lagging_ranks == [1, *range(2, 4096)]
    assert big.message.startswith("ranks 1-4095 never entered collective seq 8")
    assert flightrec.plausible_rank("99999999999999") is None and flightrec.plausible_world(10**15) is None


def test_a_huge_run_json_is_not_read_for_the_hangs_world_sizes(tmp_path):
    """The Hang page's loader reads run.json only for its jobs' world sizes: a 3 GiB sparse
    run.json was read whole (MemoryError); now it is left out and the dumps alone give the
    verdict, on the page and in the ``hang`` command (MemoryError, exit 1, before)."""
    run = make_run(tmp_path, "20250101-120000-mlp")
    job = json.loads((run / rf.RUN_JSON).read_text())["jobs"][0]["id"]
    _two_rank_hang(rf.hang_dir(run, job))
    os.truncate(run / rf.RUN_JSON, 3 * 2**30)
    code = ("import sys; from tests.memlimit import limit_address_space; limit_address_space(1000); "
            "from dpcore.read.rundir.hang import load_hangs; "
            "print(sorted(load_hangs(sys.argv[1], root=sys.argv[2])[0].dumps))")
    out = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path)], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=90)
    assert out.returncode == 0 and out.stdout.strip() == "[0, 1]", out.stderr[-2000:]
    out = _cli("hang", str(run), cap_mib=1000, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "verdict (missing): rank 1 never entered collective seq 8" in out.stdout


def test_one_stray_file_ending_in_digits_does_not_abort_a_dump_folder(tmp_path):
    _two_rank_hang(tmp_path / "job")
    for r in (0, 1):
        (tmp_path / "job" / f"rank{r}.fr.json").rename(tmp_path / f"nccl_trace_rank_{r}")
    (tmp_path / "job").rmdir()
    (tmp_path / "backup2024").write_bytes(b"\x00\x01 not a dump")
    out = _cli("hang", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "verdict (missing): rank 1 never entered" in out.stdout
    assert "skipped: " in out.stdout and "backup2024" in out.stdout


def test_hang_page_reads_nothing_outside_the_profiles_folder(tmp_path):
    profiles, outside = tmp_path / "profiles", tmp_path / "outside"
    run = make_run(profiles, "20250101-120000-mlp")
    job = json.loads((run / rf.RUN_JSON).read_text())["jobs"][0]["id"]
    _two_rank_hang(outside / "otherjob")
    (outside / "secret.txt").write_text("SECRET STACK\n")
    folder = rf.hang_dir(run, job)
    _two_rank_hang(folder)
    (folder / "rank0.stack.txt").symlink_to(outside / "secret.txt")
    (folder.parent / "linked").symlink_to(outside / "otherjob")
    confined = load_hangs(run, root=profiles)
    assert [s.job_id for s in confined] == [job] and confined[0].stacks == {}
    free = load_hangs(run)  # the CLI on a path the user named: no link out of the run either
    assert [s.job_id for s in free] == [job] and free[0].stacks == {}


def test_a_linked_hang_folder_is_named_as_outside_not_as_no_hang(tmp_path):
    """A run whose whole hang/ is a link out of the profiles folder: nothing is read, and the
    page's one line says why (it said the run had no hang/ folder and none of its jobs hung)."""
    profiles, outside = tmp_path / "profiles", tmp_path / "outside"
    run = make_run(profiles, "20250101-120000-mlp")
    _two_rank_hang(outside / "flat-ws2")
    (outside / "flat-ws2" / "rank1.stack.txt").write_text("SECRET STACK\n")
    (run / rf.HANG_DIR).symlink_to(outside)
    with pytest.raises(ValueError, match="hang/ folders resolve outside the profiles folder"):
        load_hangs(run, root=profiles)
    with pytest.raises(ValueError, match="hang/ folders resolve outside the run"):
        load_hangs(run)  # the CLI does not follow a link out of the run either
    (run / rf.HANG_DIR).unlink()
    (run / rf.HANG_DIR).mkdir()
    with pytest.raises(ValueError, match="this run has no hang/ folder"):
        load_hangs(run, root=profiles)


def test_a_huge_stack_file_is_cut(tmp_path):
    _two_rank_hang(tmp_path)
    with open(tmp_path / "rank1.stack.txt", "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GiB of zeros, no disk used
    t0 = time.monotonic()
    hs = load_hangs(tmp_path)[0]
    assert time.monotonic() - t0 < 10
    assert len(hs.stacks[1]) < MAX_STACK_BYTES + 100 and hs.stacks[1].endswith("(cut at 1 MiB)")
    assert hang_verdict(hs.dumps, hs.world_size)["lagging_ranks"] == [1]
    assert hang_dir.read_stack(tmp_path / "missing") == ""


def test_live_csv_is_read_with_a_bound_and_only_as_a_regular_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / rf.LIVE_FILE, "wb") as f:  # 3 GiB, no newline anywhere
        f.truncate(3 * 2**30)
    code = ("import sys; from tests.memlimit import limit_address_space; "
            "limit_address_space(1000); from dpcore.read.rundir.live import read_live; "
            f"print(len(read_live({str(run)!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr[-1500:]
    (run / rf.LIVE_FILE).unlink()
    (run / rf.LIVE_FILE).symlink_to("/proc/self/pagemap")
    assert read_live(run).empty
    (run / rf.LIVE_FILE).unlink()
    os.mkfifo(run / rf.LIVE_FILE)
    assert read_live(run).empty
    assert MAX_LIVE_BYTES <= 64 * 2**20


def test_a_killed_run_reads_stale_not_running(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    run = tmp_path / "run"
    run.mkdir()
    meta = {"status": "running", "owner": {"pid": child.pid, "host": socket.gethostname()}}
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    assert run_status(run) == "running"
    child.kill()
    child.wait()
    assert run_status(run) == "stale"


def test_html_in_a_job_id_is_shown_literally_in_the_heat_strip_title():
    import pandas as pd
    m = pd.DataFrame([[1.0, 2.0]], index=pd.Index([0], name="rank"), columns=[0, 1])
    fig = rank_step_heat_figure(m, '<a href="http://x">j</a><b>: step time of every rank')
    assert fig.layout.title.text.startswith("&lt;a href=\"http://x\"&gt;j&lt;/a&gt;&lt;b&gt;")
    assert "<" not in fig.layout.title.text


def test_a_run_whose_tables_hold_only_headers_says_so(tmp_path):
    from dpcore.read.rundir.load import load_run
    run = make_run(tmp_path, "20250101-120000-mlp")
    for f in run.glob("*.csv"):
        f.write_text(f.read_text().splitlines()[0] + "\n")
    loaded = load_run(run)
    lines = [w for w in loaded.warnings if "complete training job(s) have no rows" in w]
    n = int(((loaded.jobs["status"] == "complete") & (loaded.jobs["kind"] == "train")).sum())
    assert n > 0 and lines == [f"{run / 'steps.csv'}: {n} complete training job(s) have no rows "
                               f"(single-ws1, naive-ws1, naive-ws2 ...); their step numbers are "
                               "unknown (the table holds no data for them)"]
    whole = load_run(make_run(tmp_path / "other", "20250101-120000-mlp"))
    assert not [w for w in whole.warnings if "have no rows" in w]
