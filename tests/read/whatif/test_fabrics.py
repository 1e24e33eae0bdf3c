"""Fabric presets: the table's columns and sources, the flat-ring model across nodes, and one GPU
projected to many (a world-size-1 job written by hand, with known answers)."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from dpcore.cli import main
from dpcore.contract.buckets import MB
from dpcore.read.whatif.fabrics import FABRIC_COLUMNS, FABRICS_CSV, load_fabrics, parse_fabric, ring_parts

NAMES = ["nvlink-h100", "nvlink-h100-nvls", "nvlink-h200", "nvlink-h200-nvls", "nvlink-a100", "pcie-gen5",
         "pcie-gen4", "ib-ndr400", "ib-hdr200", "eth-100g"]


def _cli(*args: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_table_has_every_fabric_with_a_source() -> None:
    with open(FABRICS_CSV, newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == FABRIC_COLUMNS
        rows = list(reader)
    assert [r["name"] for r in rows] == NAMES
    for r in rows:
        assert r["scope"] in ("intra", "inter") and float(r["busbw_gbps"]) > 0 and float(r["alpha_us"]) > 0
        assert r["source"].startswith(("measured:", "derived:")), r["name"]   # says which
    assert {r["name"] for r in rows if r["scope"] == "inter"} == {"ib-ndr400", "ib-hdr200", "eth-100g"}


def test_flat_ring_across_nodes_is_bounded_by_the_slower_link() -> None:
    t = load_fabrics()
    one = parse_fabric("nvlink-h100")
    assert one.inter.name == "ib-ndr400" and one.inter_assumed
    s = 64 * MB
    lat, xfer, b, alpha = ring_parts(one, 8, s)           # one node: NVLink only
    assert lat == pytest.approx(14 * 3.4e-3) and b == 350.0 and alpha == pytest.approx(3.4)
    assert xfer == pytest.approx(2 * 7 / 8 * s / 350e9 * 1e3)
    two = parse_fabric("nvlink-h100,eth-100g")              # 16 ranks on 2 nodes over 100 GbE
    lat, xfer, b, _ = ring_parts(two, 16, s)
    assert not two.inter_assumed and b == t["eth-100g"].busbw_gbps == 11.0
    assert lat == pytest.approx((28 * 3.4 + 2 * 9.6) / 1e3)   # 2(N-nodes) steps inside, 2(nodes-1) across
    assert xfer == pytest.approx(2 * 15 / 16 * s / 11e9 * 1e3)
    lat, xfer, b, alpha = ring_parts(two, 16, s, alpha_us=1.0, bandwidth_gbps=100.0)   # overrides
    assert (lat, b, alpha) == (pytest.approx(30e-3), 100.0, 1.0)
    assert ring_parts(one, 1, s)[:2] == (0.0, 0.0)


@pytest.mark.parametrize("text, needle", [
    ("nvlink-h1OO", "unknown fabric 'nvlink-h1OO'; valid choices: nvlink-h100,"),
    ("ib-ndr400", "name one link inside a node"),
    ("nvlink-h100,nvlink-a100", "name one link inside a node"),
])
def test_bad_fabric_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, text: str, needle: str) -> None:
    code, out, err = _cli("whatif", str(_ws1_run(tmp_path)), "--job", "torch_ddp-ws1-b64", "--fabric", text,
                          capsys=capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err


def test_fabric_list(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _cli("whatif", "--fabric", "list", capsys=capsys)
    assert code == 0 and all(f"  {n} " in out for n in NAMES) and out.count("source: ") == len(NAMES)


def _ws1_run(root: Path) -> Path:
    """One rank, 3 steps: forward 10 ms, backward 40 ms producing four 8 MiB gradients at 10, 20,
    30, 40 ms (last registered first), optimizer 5 ms: step 55 ms; no collectives."""
    run = root / "ws1"
    if run.exists():
        return run
    run.mkdir()
    job = "torch_ddp-ws1-b64"
    (run / "run.json").write_text(json.dumps({
        "run_id": "ws1", "status": "complete", "config": {}, "environment": {"backend": "nccl", "device": "cuda"},
        "jobs": [{"id": job, "kind": "train", "variant": "torch_ddp", "world_size": 1, "bucket_mb": 64.0,
                  "status": "complete"}]}))
    steps, grads = [], []
    for step in range(3):
        t0 = 1_000_000_000 * (step + 1)
        steps.append({"job_id": job, "variant": "torch_ddp", "world_size": 1, "bucket_mb": 64.0, "rank": 0,
                      "step": step, "profiled": False, "t_start_ns": t0, "step_ms": 55.0, "fwd_ms": 10.0,
                      "bwd_ms": 40.0, "sync_ms": 0.0, "opt_ms": 5.0, "comm_ms": 0.0, "comm_ops": 0,
                      "comm_bytes": 0, "samples": 8})
        for p in range(4):
            grads.append({"job_id": job, "rank": 0, "step": step, "param": p, "name": f"w{p}", "bytes": 8 * MB,
                          "t_ready_ns": t0 + (10 + 10 * (4 - p)) * 1_000_000})
    for name, rows in (("steps", steps), ("grads", grads)):
        with open(run / f"{name}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (run / "collectives.csv").write_text("job_id,rank,step,seq,op,algo,bytes,t_launch_ns,t_start_ns,t_end_ns,bucket\n")
    return run


def test_one_gpu_to_many_on_a_fabric(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _ws1_run(tmp_path)
    code, out, err = _cli("whatif", str(run), "--job", "torch_ddp-ws1-b64", capsys=capsys)
    assert code == 2 and "--fabric NAME" in err                    # nothing to fit from: says how to ask
    # one 32 MiB bucket, ready when backward ends: its all-reduce is all exposed, so kappa plays no part
    bw = 2 * 7 / 8 * 32 * MB / 14e-3 / 1e9                          # 14 ms at 8 ranks
    code, out, err = _cli("whatif", str(run), "--job", "torch_ddp-ws1-b64", "--world-sizes", "8,16",
                          "--bucket-mb", "64", "--fabric", "nvlink-h100", "--bandwidth-gbps", repr(bw),
                          "--latency-us", "0", "--csv", capsys=capsys)
    assert code == 0, err
    df = pd.read_csv(io.StringIO(out)).set_index("world_size")
    assert df.loc[8, "step_ms"] == pytest.approx(10 + 40 + 14 + 5) and df.loc[8, "comm_ms"] == pytest.approx(14)
    assert df.loc[16, "comm_ms"] == pytest.approx(14 * (30 / 16) / (14 / 8))
    # the preset's own values: 2 nodes, the assumed NDR link between them, NVLink's 350 GB/s bounds
    code, out, _ = _cli("whatif", str(run), "--job", "torch_ddp-ws1-b64", "--world-sizes", "8,64", "--bucket-mb",
                        "64", "--fabric", "nvlink-h100", "--csv", capsys=capsys)
    df = pd.read_csv(io.StringIO(out)).set_index("world_size")
    comm64 = (2 * (64 - 8) * 3.4 + 2 * 7 * 9.6) / 1e3 + 2 * 63 / 64 * 32 * MB / 350e9 * 1e3
    assert df.loc[64, "comm_ms"] == pytest.approx(comm64, abs=1e-4) and df.loc[64, "bandwidth_gbps"] == 350.0
    # 8 MiB buckets overlap backward: the assumed kappa's band (0-0.3) lies inside each step's band
    code, out, _ = _cli("whatif", str(run), "--job", "torch_ddp-ws1-b64", "--world-sizes", "8", "--bucket-mb",
                        "8", "--fabric", "pcie-gen4", "--bandwidth-gbps", "1", "--csv", capsys=capsys)
    row = pd.read_csv(io.StringIO(out)).iloc[0]
    assert row["kappa"] == 0.1 and row["step_ms_lo"] <= row["step_ms"] <= row["step_ms_hi"]
    code, text, _ = _cli("whatif", str(run), "--job", "torch_ddp-ws1-b64", "--world-sizes", "8,64", "--fabric",
                         "nvlink-h100", capsys=capsys)
    assert "kappa (compute slowed by comm in flight) = 0.10 [assumed]: assumed 0.1, band 0-0.3" in text
    assert "B = 350.000 GB/s [fabric]" in text and "[measured]: the source job's own backward (grads.csv)" in text
    assert "B between nodes (ib-ndr400; the ring takes the slower link) = 384 GB/s [assumed]" in text


def test_page_offers_a_one_rank_job_every_input(tmp_path: Path) -> None:
    from streamlit.testing.v1 import AppTest

    def page(path: str) -> None:
        from dpcore.read.dashboard.pages.whatif import render
        from dpcore.read.rundir import load_run
        render(load_run(path))

    at = AppTest.from_function(page, args=(str(_ws1_run(tmp_path)),), default_timeout=90).run()
    assert not at.exception, [e.value for e in at.exception]
    labels = {w.label: w for w in at.selectbox}
    # no all-reduce to fit from: the fabric presets are the choices, the link between nodes too
    assert labels["Network inside a node"].options[0] == "nvlink-h100"
    assert "fitted from this run" not in labels["Network inside a node"].options
    assert labels["Between nodes (beyond one node)"].options == ["ib-ndr400", "ib-hdr200", "eth-100g"]
    ms = {w.label: w for w in at.multiselect}
    assert ms["World sizes to predict"].value == [1, 8]
    assert ms["Bucket sizes to predict (MiB)"].value == [1.0, 4.0, 25.0, 64.0, 100.0]
    assert len(at.get("plotly_chart")) == 3 and at.metric[0].value.endswith("ms")
    factors = at.dataframe[0].value
    assert "assumed" in set(factors["rests on"]) and "fabric" in set(factors["rests on"])
    assert at.info[0].value.startswith("recommendation\\: ") and "8 ranks" in at.info[0].value


def test_a_one_rank_source_assumes_kappa_on_any_network(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        samples: Path) -> None:
    """At one rank there is no comm to slow backward, so nothing there measures kappa: the source
    takes the assumed 0.1 and its band (0-0.3) with a given network as with a fabric. Before, the
    given-network path fitted it: the sample's bucketed-ws1-b1 printed "0.20 [fitted]: across jobs",
    its backward against the 1-rank jobs of every bucket size (their per-bucket cost, not comm)."""
    from dataclasses import replace

    from dpcore.read.rundir import load_run
    from dpcore.read.whatif.build import build_model
    from dpcore.read.whatif.predict import predict

    sample = samples / "sample-train"
    code, text, err = _cli("whatif", str(sample), "--job", "bucketed-ws1-b1", "--world-sizes", "2",
                           "--latency-us", "5", "--bandwidth-gbps", "10", capsys=capsys)
    assert code == 0, err
    assert "kappa (compute slowed by comm in flight) = 0.10 [assumed]: assumed 0.1, band 0-0.3" in text
    # the hand-written 1-rank job: 8 MiB buckets at 8 ranks over 10 GB/s take 1.5 ms each, in flight
    # while backward goes on, so kappa moves the step; the band reaches the steps at both its ends
    run = _ws1_run(tmp_path)
    code, out, err = _cli("whatif", str(run), "--job", "torch_ddp-ws1-b64", "--world-sizes", "8", "--bucket-mb",
                          "8", "--latency-us", "0", "--bandwidth-gbps", "10", "--csv", capsys=capsys)
    assert code == 0, err
    row = pd.read_csv(io.StringIO(out)).iloc[0]
    model = build_model(load_run(run), "torch_ddp-ws1-b64", latency_us=0.0, bandwidth_gbps=10.0)
    assert model.kappa == row["kappa"] == 0.1 and model.kappa_band == (0.0, 0.3)
    lo, hi = (float(predict(replace(model, kappa=k), [8.0], [8])["step_ms"].iloc[0]) for k in (0.0, 0.3))
    assert lo < row["step_ms"] < hi  # kappa moves this step: the ends are not the prediction itself
    assert row["step_ms_lo"] <= lo and row["step_ms_hi"] >= hi
