"""`python -m dpcore hang` on dumps a plain PyTorch gloo job wrote (no dpcore involved), and on
a dump that would run code: the verdict names the rank, or one line refuses the file."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MAKER = ROOT / "tests" / "data" / "make_fr_dumps.py"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPCORE_", "TORCH_FR"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _hang(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcore", "hang", *args], capture_output=True,
                          text=True, env=_env(), cwd=ROOT, timeout=120)


@pytest.mark.parametrize("ws,mode,rank,kind", [(2, "sleep", 1, "missing"), (3, "skip", 2, "desync")])
def test_hang_explains_a_plain_pytorch_jobs_dumps(tmp_path, ws, mode, rank, kind):
    made = subprocess.run([sys.executable, str(MAKER), str(tmp_path / "nccl_trace_rank_"), str(ws),
                           mode, str(rank)], capture_output=True, text=True, env=_env(),
                          timeout=400)
    assert made.returncode == 0, made.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"nccl_trace_rank_{r}" for r in range(ws)]
    out = _hang(str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"verdict ({kind})" in out.stdout
    if kind == "missing":
        assert ("rank 1 never entered collective seq 8 (all_reduce, 3.91 KiB = 4,000 B) that rank 0 "
                "waits in") in out.stdout
    else:
        assert ("desync at collective seq 8: ranks 0, 1 entered all_reduce (3.91 KiB = 4,000 B) but rank 2 "
                "entered barrier (0 B)") in out.stdout
    csv = _hang(str(tmp_path), "--csv")
    lines = csv.stdout.splitlines()
    assert lines[0] == "job_id,rank,last_enqueued_seq,last_completed_seq,op,bytes,state,stack_top"
    assert len(lines) == 1 + ws
    assert ("never entered" if kind == "missing" else "desync at") in csv.stderr


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_dump_with_a_global_is_refused_in_one_line(tmp_path):
    (tmp_path / "trace_0").write_bytes(pickle.dumps({"entries": [], "x": _Evil()}))
    out = _hang(str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "refused" in out.stderr
    assert not (ROOT / "pwned").exists() and not (tmp_path / "pwned").exists()


def test_nothing_to_read_is_one_line(tmp_path):
    out = _hang(str(tmp_path))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "no flight-recorder dumps" in out.stderr
