"""Run files read through links that leave the run, and hang dumps whose structure multiplies.

No run file is read through a link out of its run (live.csv on the Live page, run.json's
status, the run loader's tables, hang dumps and stacks): one opener,
:func:`dpcore.contract.files.open_inside`. A hang read's work is bounded by the bytes read:
a shape whose product has millions of digits, a flat list of millions, the same file linked
as every rank, dumps beyond the budget; and a rank whose dump cannot be read is unknown, not
the rank behind. Every test here failed before (rows shown, minutes of multiplication, a
MemoryError, every link parsed again, the wrong rank named)."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from dpcore.contract import flightrec
from dpcore.contract import runformat as rf
from dpcore.contract.files import OutsideFolderError, open_inside
from dpcore.read.analysis.hang import hang_verdict, rank_table
from dpcore.read.rundir import hang as hang_dir
from dpcore.read.rundir.hang import load_hangs
from dpcore.read.rundir.live import read_live, run_status
from tests.contract.test_flightrec import _entry, _steps
from tests.fixtures_run import make_run
from tests.read.rundir.test_hostile_reprobe import _cli

LIVE_ROWS = ("job_id,rank,step,profiled,t_end_ns,wall_time,step_ms,comm_ms,exposed_comm_ms\n"
             "flat-ws2,0,1,False,1000,1.0,12.5,1.0,0.5\n")


def test_live_csv_linked_out_of_the_run_is_not_shown(tmp_path: Path) -> None:
    run = make_run(tmp_path / "profiles")
    outside = tmp_path / "elsewhere.csv"
    outside.write_text(LIVE_ROWS)
    (run / rf.LIVE_FILE).symlink_to(outside)
    assert read_live(run).empty
    (run / rf.LIVE_FILE).unlink()
    (run / rf.LIVE_FILE).write_text(LIVE_ROWS)  # the same rows as the run's own file are shown
    assert read_live(run)["step_ms"].tolist() == [12.5]
    inside = run / "kept.csv"
    inside.write_text(LIVE_ROWS)
    (run / rf.LIVE_FILE).unlink()
    (run / rf.LIVE_FILE).symlink_to(inside)  # a link that stays in the run is the run's file
    assert read_live(run)["step_ms"].tolist() == [12.5]


def test_run_json_linked_out_of_the_run_gives_no_status(tmp_path: Path) -> None:
    run = make_run(tmp_path / "profiles")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads((run / rf.RUN_JSON).read_text()), "status": "failed"}))
    (run / rf.RUN_JSON).unlink()
    (run / rf.RUN_JSON).symlink_to(other)
    assert run_status(run, "?") == "?"


def test_the_opener_names_a_link_out_and_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "x").write_text("x")
    (tmp_path / "run" / "a").symlink_to(tmp_path / "x")
    with pytest.raises(OutsideFolderError, match="a link that leads outside"):
        open_inside(tmp_path / "run" / "a", tmp_path / "run", 100)
    with pytest.raises(FileNotFoundError):
        open_inside(tmp_path / "run" / "b", tmp_path / "run", 100)
    (tmp_path / "run" / "c").symlink_to(tmp_path / "nowhere")  # a dangling link out
    with pytest.raises(OutsideFolderError):
        open_inside(tmp_path / "run" / "c", tmp_path / "run", 100)


def _shape_bomb(kind: str, dims: int) -> bytes:
    """One entry whose shape has ``dims`` dimensions of a huge number (shared in the pickle:
    a few bytes per dimension)."""
    big = 10**18 if kind == "json" else 10**300
    entry = {**_entry(1, "all_reduce", 1, False), "input_sizes": [[big] * dims]}
    dump = {"entries": [*_steps(2)[:0], entry]}
    return json.dumps(dump).encode() if kind == "json" else pickle.dumps(dump)


@pytest.mark.slow
@pytest.mark.parametrize("kind, dims", [("json", 300_000), ("pickle", 30_000)])
def test_a_shape_whose_product_has_millions_of_digits_is_bounded(tmp_path: Path, kind: str, dims: int) -> None:
    """The old verdict multiplied the dimensions out: minutes for either file (a 300 000-dim
    JSON shape, 6 MB; a 30 000-dim pickle shape of one shared 300-digit number, 60 KB)."""
    for r in (0, 1):
        (tmp_path / f"rank{r}.fr.json").write_bytes(_shape_bomb(kind, dims))
    out = _cli("hang", str(tmp_path), cap_mib=1500, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "verdict (unknown): every rank entered collective seq 1" in out.stdout
    dump = flightrec.load_dump(tmp_path / "rank0.fr.json")
    assert flightrec.collectives(dump)[0].bytes == flightrec.MAX_TENSOR_BYTES


def test_a_tensors_bytes_are_still_exact_below_the_bound() -> None:
    assert flightrec._bytes({"input_sizes": [[1024, 1024], [3]], "input_dtypes": ["Float", "Half"]}) \
        == 1024 * 1024 * 4 + 3 * 2
    assert flightrec._bytes({"input_sizes": [[-5, 4]], "input_dtypes": ["Float"]}) == 0


@pytest.mark.slow
def test_a_dump_of_millions_of_elements_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """40 MB of ``{},`` (13 million empty dicts: about 1 GB once parsed, and the old walk kept
    a pair per element) is refused in one line, under a 1 GiB address-space cap."""
    with open(tmp_path / "rank0.fr.json", "wb") as f:
        f.write(b'{"entries": [], "x": [')
        f.write(b"{}," * 13_000_000)
        f.write(b"{}]}")
    out = _cli("hang", str(tmp_path), cap_mib=1024, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'rank0.fr.json'}: refused: holds more than "
        f"{flightrec.MAX_DUMP_NODES} elements; not a flight-recorder dump"]


@pytest.mark.slow
def test_a_dump_file_above_the_cap_is_refused_in_one_line(tmp_path: Path) -> None:
    """A flat list of 70 MB (the old cap was 256 MiB: 5.7 GB for a 190 MB list)."""
    with open(tmp_path / "rank0.fr.json", "wb") as f:
        f.write(b'{"entries": [], "x": [')
        f.write(b"0," * 35_000_000)
        f.write(b"0]}")
    out = _cli("hang", str(tmp_path), cap_mib=1024, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and "larger than 64 MiB" in out.stderr


def _hang_of(folder: Path, world: int, behind: int) -> None:
    """``world`` ranks: all but ``behind`` wait in all_reduce seq 8; ``behind`` stopped at 7."""
    folder.mkdir(parents=True, exist_ok=True)
    base = _steps(3) + [_entry(7, "barrier", 0)]
    for r in range(world):
        entries = base if r == behind else base + [_entry(8, "all_reduce", 1000, False)]
        (folder / f"rank{r}.fr.json").write_text(json.dumps({"entries": entries}))


def test_the_same_file_linked_as_every_rank_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "job"
    _hang_of(folder, 2, behind=1)
    for r in range(2, 50):
        os.link(folder / "rank0.fr.json", folder / f"rank{r}.fr.json")
    reads: list[str] = []
    real = flightrec.load_dump
    monkeypatch.setattr(flightrec, "load_dump", lambda p, *a: reads.append(Path(p).name) or real(p, *a))
    [hs] = load_hangs(folder)
    assert sorted(reads) == ["rank0.fr.json", "rank1.fr.json"]
    assert hs.skipped == ["48 dump(s) set aside (rank10.fr.json, rank11.fr.json, rank12.fr.json ...): "
                          "links to a dump file already read (hard links), read once; their ranks are unknown"]
    v = hang_verdict(hs.dumps, hs.world_size)
    assert v["kind"] == "missing" and v["lagging_ranks"] == [1]
    assert v["message"].endswith("; ranks 2-49: dump unreadable, unknown")
    assert rank_table(hs.dumps, hs.stacks).set_index("rank").loc[7, "state"] == "unreadable"


def test_dumps_beyond_the_budget_are_set_aside_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "job"
    _hang_of(folder, 4, behind=3)
    size = (folder / "rank0.fr.json").stat().st_size
    monkeypatch.setattr(hang_dir, "MAX_HANG_BYTES", 2 * size + size // 2)
    [hs] = load_hangs(folder)
    assert [r for r, d in hs.dumps.items() if not flightrec.is_unreadable(d)] == [0, 1]
    assert hs.skipped == [f"2 dump(s) set aside (rank2.fr.json, rank3.fr.json): beyond the "
                          f"{hang_dir.MAX_HANG_BYTES >> 20} MiB of dumps read at once; their ranks are unknown"]
    v = hang_verdict(hs.dumps, hs.world_size)
    assert v["kind"] == "unknown" and v["lagging_ranks"] == []
    assert v["message"].endswith("ranks 2, 3: dump unreadable, unknown (it may be the rank behind)")


def test_an_unreadable_dump_is_unknown_not_the_rank_behind(tmp_path: Path) -> None:
    """Three ranks (run.json says so), rank 2 behind; rank 1's dump is a FIFO. It used to be
    left out silently and counted as a rank without a dump: "ranks 1, 2 never entered"."""
    run = make_run(tmp_path / "profiles")
    meta = json.loads((run / rf.RUN_JSON).read_text())
    job = meta["jobs"][0]["id"]
    meta["jobs"][0]["processes"] = 3
    (run / rf.RUN_JSON).write_text(json.dumps(meta))
    folder = rf.hang_dir(run, job)
    _hang_of(folder, 3, behind=2)
    (folder / "rank1.fr.json").unlink()
    os.mkfifo(folder / "rank1.fr.json")
    [hs] = load_hangs(run)
    v = hang_verdict(hs.dumps, hs.world_size)
    assert hs.world_size == 3
    assert (v["kind"], v["lagging_ranks"], v["seq"]) == ("missing", [2], 8)
    assert v["message"].endswith("; rank 1: dump unreadable, unknown")
    assert len(hs.skipped) == 1 and "rank1.fr.json" in hs.skipped[0]


def test_a_pickle_above_its_cap_is_refused_unread(tmp_path: Path) -> None:
    """A byte of pickle can build a 64-byte dict: above 16 MiB a pickle is not unpickled."""
    f = tmp_path / "rank0.fr.json"
    f.write_bytes(b"\x80\x04}\x8c\x07entries](" + b"}" * (flightrec.MAX_PICKLE_BYTES + 1) + b"es.")
    with pytest.raises(flightrec.DumpError, match="a pickle larger than 16 MiB; not read"):
        flightrec.load_dump(f)

