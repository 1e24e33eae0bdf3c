"""The hostile re-probe's "accepted and then useless" inputs (item 14) and the leftovers of
item 15: each is one line naming the problem and the valid values, exit 2, before anything
runs or is written; a read command's unexpected error does not speak of kept jobs."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import dpcore
from dpcore.cli import main
from dpcore.contract import runformat as rf
from tests.fixtures_run import make_run

CASES = [
    (["profile", "--steps", str(10**20)], "--steps must be at most 1,000,000"),
    (["profile", "--warmup", str(10**20)], "--warmup must be at most 1,000,000"),
    (["verify", "--steps", str(10**20)], "--steps must be at most 1,000,000"),
    (["allreduce", "--repeats", str(10**12)], "--repeats must be at most 1,000,000"),
    (["profile", "--variants", "torch_ddp", "--comm-hook", "fp16", "--world-sizes", "1"],
     "--comm-hook adds torch_ddp jobs at world sizes of 2 or more"),
    (["profile", "--warmup", "0", "--inject-hang", "1:0:sleep"],
     "--inject-hang step 0 with --warmup 0 hangs before any step has finished"),
    (["import", "TRACES", "--scheduler", "ucx://10.0.0.1:13337"],
     "--scheduler must be a Dask scheduler address tcp://HOST:PORT or tls://HOST:PORT"),
    (["stragglers", "RUN", "--scheduler", "bogus"], "--scheduler must be a Dask scheduler address"),
    (["analyze", ""], "the path is empty; give a run directory, a folder of traces or one trace file"),
    (["stragglers", ""], "the path is empty"),
    (["summarize", ""], "the path is empty; give a run directory"),
    (["hang", ""], "the path is empty; give a run, a job's hang/ folder"),
]


@pytest.mark.parametrize("argv,needle", CASES)
def test_useless_input_is_refused_in_one_line(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty PATH must not read (or cache into) this folder
    run = make_run(tmp_path / "profiles")
    argv = [str(run) if a == "RUN" else str(tmp_path / "profiles") if a == "TRACES" else a for a in argv]
    out = tmp_path / "out"
    rc = main([*argv, *(["--out", str(out)] if argv[0] in ("profile", "allreduce", "import") else [])])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["profiles"]
    assert not (run / "cache").exists()


def test_record_refuses_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="out is empty"):
        dpcore.record("")
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_cpu_count_names_the_file_and_the_field(capsys, tmp_path):
    run = make_run(tmp_path / "profiles")
    meta = json.loads((run / rf.RUN_JSON).read_text())
    meta.setdefault("environment", {})["cpu_cores"] = "two"
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    rc = main(["summarize", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"malformed {run / rf.RUN_JSON}: environment.cpu_cores must be a whole number >= 0, " \
           "got 'two'" in err


def test_a_read_commands_unexpected_error_speaks_of_no_kept_jobs(capsys, tmp_path, monkeypatch):
    import dpcore.read.report.analyze as analyze_mod

    def broken(*a, **k):
        raise RuntimeError("something unforeseen")
    monkeypatch.setattr(analyze_mod, "analyze", broken)
    monkeypatch.delenv("DPCORE_DEBUG", raising=False)
    rc = main(["analyze", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and err.strip() == ("error: RuntimeError: something unforeseen (set "
                                       "DPCORE_DEBUG=1 for the traceback)")
    assert os.environ.get("DPCORE_DEBUG") is None and Path(tmp_path).is_dir()
