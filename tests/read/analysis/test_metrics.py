"""Metrics on hand-made steps/collectives/messages with exactly known answers."""
import numpy as np
import pandas as pd
import pytest

from dpcore.read.analysis import (
    allreduce_bandwidth,
    bucket_sweep,
    chunk_matrix,
    message_counts,
    ring_step_times,
    scaling,
    step_breakdown,
)

MS = 1_000_000


def _step(rank=0, step=0, t0=0, fwd=10.0, bwd=20.0, sync=5.0, opt=5.0, profiled=False):
    return dict(job_id="j", variant="overlap", world_size=2, bucket_mb=25.0, rank=rank, step=step,
                profiled=profiled, t_start_ns=t0, step_ms=fwd + bwd + sync + opt, fwd_ms=fwd, bwd_ms=bwd,
                sync_ms=sync, opt_ms=opt, comm_ms=0.0, comm_ops=1, comm_bytes=100, samples=8)


def _coll(start_ms, end_ms, rank=0, step=0, seq=0, launch_ms=None, nbytes=1000):
    return dict(job_id="j", rank=rank, step=step, seq=seq, op="all_reduce", algo="native", bytes=nbytes,
                t_launch_ns=(launch_ms if launch_ms is not None else start_ms) * MS,
                t_start_ns=start_ms * MS if launch_ms is None or start_ms is not None else np.nan,
                t_end_ns=end_ms * MS, bucket=-1)


def test_step_breakdown_exact():
    # compute: [0,10] fwd, [10,30] bwd, sync [30,35], opt [35,40]
    steps = pd.DataFrame([_step(), _step(step=1, profiled=True)])
    coll = pd.DataFrame([_coll(20, 34), _coll(25, 28, seq=1), _coll(38, 45, seq=2)])  # last one clipped at 40
    bd = step_breakdown(steps, coll)
    assert len(bd) == 1  # profiled steps are excluded
    r = bd.iloc[0]
    assert r.comm_ms == pytest.approx(14 + 2)          # [20,34] ∪ [38,40]
    assert r.overlapped_ms == pytest.approx(10 + 2)    # [20,30] ∩ bwd, [38,40] ∩ opt
    assert r.exposed_ms == pytest.approx(4)
    assert r.compute_ms == pytest.approx(35) and r.step_ms == pytest.approx(40)
    assert r.other_ms == pytest.approx(1)               # 40 - 35 - 4
    assert r.overlap_pct == pytest.approx(75.0)
    assert r.comm_fraction == pytest.approx(0.1)


def test_step_breakdown_launch_when_no_start_and_no_comm():
    steps = pd.DataFrame([_step(sync=0.0)])
    coll = pd.DataFrame([_coll(None, 40, launch_ms=25)])  # t_start unknown: launch -> [25,40], clipped at 35
    r = step_breakdown(steps, coll).iloc[0]
    assert r.comm_ms == pytest.approx(10) and r.overlapped_ms == pytest.approx(10)
    r0 = step_breakdown(steps, coll.iloc[:0]).iloc[0]
    assert r0.comm_ms == 0 and np.isnan(r0.overlap_pct) and r0.other_ms == pytest.approx(0)


def _summary(rows):
    return pd.DataFrame([dict(variant=v, world_size=n, bucket_mb=b, step_ms=t, throughput=1.0, exposed_ms=0.0,
                              overlap_pct=0.0, comm_ops=1, oversubscribed=n > 2) for v, n, b, t in rows])


def test_scaling_weak_and_strong():
    s = _summary([("single", 1, 0.0, 100.0), ("flat", 2, 25.0, 125.0), ("flat", 4, 25.0, 200.0),
                  ("ring", 1, 25.0, 80.0), ("ring", 2, 25.0, 100.0)])
    w = scaling(s, "weak").set_index(["variant", "world_size"])
    assert w.loc[("flat", 2), "speedup"] == pytest.approx(2 * 100 / 125)   # N·T1/TN with T1 from `single`
    assert w.loc[("flat", 2), "efficiency"] == pytest.approx(0.8)
    assert w.loc[("ring", 2), "efficiency"] == pytest.approx(0.8)          # own 1-rank job: 80/100
    assert bool(w.loc[("flat", 4), "oversubscribed"]) and w.loc[("flat", 4), "ideal_speedup"] == 4
    st = scaling(s, "strong").set_index(["variant", "world_size"])
    assert st.loc[("flat", 4), "speedup"] == pytest.approx(0.5)
    assert st.loc[("flat", 4), "efficiency"] == pytest.approx(0.125)
    with pytest.raises(ValueError):
        scaling(s, "sideways")


def test_bucket_sweep_rows():
    s = _summary([("bucketed", 2, 1.0, 10.0), ("bucketed", 2, 25.0, 9.0), ("flat", 2, 25.0, 8.0)])
    b = bucket_sweep(s)
    assert b["bucket_mb"].tolist() == [1.0, 25.0] and set(b["variant"]) == {"bucketed"}


def test_bandwidth_nccl_tests_convention():
    ar = pd.DataFrame([dict(job_id="a", algo="ring", world_size=4, bytes=1_000_000_000, repeats=5, time_ms=500.0,
                            algbw_gbps=2.0, busbw_gbps=3.0)])
    r = allreduce_bandwidth(ar).iloc[0]
    assert r.algbw_gbps == pytest.approx(2.0) and r.busbw_gbps == pytest.approx(3.0) and r.consistent


def test_ring_step_times_transfer_and_wait():
    rows = []
    # ring step 0, 2 ranks: 0->1 takes 2 ms, 1->0 posted 3 ms late (rank 0 waits 3 ms)
    for src, dst, post, done in ((0, 1, 0, 2), (1, 0, 3, 5)):
        for side, rank in (("send", src), ("recv", dst)):
            rows.append(dict(job_id="j", algo="ring", rank=rank, step=0, call=0, phase="reduce_scatter", ring_step=0,
                             src=src, dst=dst, chunk=src, bytes=10, t_post_ns=post * MS if side == "send" else 0,
                             t_done_ns=done * MS, side=side))
    t = ring_step_times(pd.DataFrame(rows)).set_index("rank")
    assert t.loc[0, "transfer_ms"] == pytest.approx(2.0)
    assert t.loc[0, "duration_ms"] == pytest.approx(5.0) and t.loc[0, "wait_ms"] == pytest.approx(3.0)
    mc = message_counts(pd.DataFrame(rows)).iloc[0]
    assert mc.messages == 2 and mc.bytes == 20 and mc.messages_per_call == 2
    # the same chunks sent as 4 pipelined sub-messages each: still 2 messages per call (the
    # formula's count), 8 sub-messages, the same bytes
    piped = pd.DataFrame([dict(r, bytes=r["bytes"] / 4) for r in rows for _ in range(4)])
    mc = message_counts(piped).iloc[0]
    assert (mc.messages, mc.sub_messages, mc.messages_per_call, mc.bytes) == (2, 8, 2, 20)


def test_sample_ring_sends_2n_n_minus_1_messages_per_call(samples):
    """Issue 24: the all-reduce sample's ring showed 6 messages per call (its 16 MiB call pipelines
    4 pieces per chunk) where the text says 2N(N−1) = 4 at N = 2."""
    from dpcore.read.rundir.load import load_run

    sample = samples / "sample-allreduce"
    if not sample.is_dir():
        pytest.skip("sample runs not present")
    mc = message_counts(load_run(sample).messages).set_index("job_id")
    assert mc.at["ring-ws2", "messages_per_call"] == 2 * 2 * (2 - 1)
    assert mc.at["ring-ws2", "sub_messages"] > mc.at["ring-ws2", "messages"]
    assert mc.at["naive-ws2", "messages_per_call"] == 2 * (2 - 1)


def test_chunk_matrix_ring_invariants():
    for n in (1, 2, 3, 5):
        m = chunk_matrix(n)
        assert len(m) == 2 * (n - 1) * n
        if n == 1:
            continue
        rs_end = m[(m.phase == "reduce_scatter") & (m.ring_step == n - 2)]
        for r, comp in zip(rs_end["rank"], rs_end["complete"]):
            assert comp == str((r + 1) % n)              # rank r owns reduced chunk r+1
        last = m[(m.phase == "all_gather") & (m.ring_step == n - 2)]
        assert all(h == [n] * n for h in last["held"])   # everyone holds every complete chunk


def test_pipelined_sub_messages_pair_nth_send_with_nth_recv():
    """Two sub-messages of one chunk share a key; the n-th send must meet the n-th receive,
    and the step's transfer is the union of their in-flight intervals (known answer)."""
    from dpcore.read.analysis import message_pairs, ring_step_times
    base = dict(job_id="j", algo="ring", step=0, call=0, phase="reduce_scatter", ring_step=0,
                chunk=0, bytes=8)
    ms = 1_000_000
    rows = [
        # 0 -> 1, two pieces: in flight [0, 3] ms and [2, 5] ms -> union 5 ms
        {**base, "rank": 0, "src": 0, "dst": 1, "side": "send", "t_post_ns": 0, "t_done_ns": 1 * ms},
        {**base, "rank": 0, "src": 0, "dst": 1, "side": "send", "t_post_ns": 2 * ms, "t_done_ns": 3 * ms},
        {**base, "rank": 1, "src": 0, "dst": 1, "side": "recv", "t_post_ns": 0, "t_done_ns": 3 * ms},
        {**base, "rank": 1, "src": 0, "dst": 1, "side": "recv", "t_post_ns": 1 * ms, "t_done_ns": 5 * ms},
        # 1 -> 0, one slow piece: [0, 8] ms
        {**base, "chunk": 1, "rank": 1, "src": 1, "dst": 0, "side": "send", "t_post_ns": 0, "t_done_ns": 8 * ms},
        {**base, "chunk": 1, "rank": 0, "src": 1, "dst": 0, "side": "recv", "t_post_ns": 0, "t_done_ns": 8 * ms},
    ]
    pairs = message_pairs(pd.DataFrame(rows))
    assert len(pairs) == 3  # not 2x2 + 1
    a = pairs[pairs["src"] == 0].sort_values("piece")
    assert list(a["t_post_ns_send"]) == [0, 2 * ms] and list(a["t_done_ns_recv"]) == [3 * ms, 5 * ms]
    t = ring_step_times(pd.DataFrame(rows)).set_index("rank")
    assert t.loc[0, "transfer_ms"] == pytest.approx(5.0)  # fastest link: 0 -> 1
    assert t.loc[0, "duration_ms"] == pytest.approx(8.0) and t.loc[0, "wait_ms"] == pytest.approx(3.0)
    assert t.loc[1, "duration_ms"] == pytest.approx(8.0) and t.loc[1, "wait_ms"] == pytest.approx(3.0)


def test_scaling_flags_noisy_and_superlinear_cells():
    """A disturbed T(1) (p90 = 10x p10) makes every point of that variant's curve suspect, and
    efficiency > 100% on one host is flagged; a clean variant is not. `noisy` stays the cell's
    own spread, the flag Overview shows for the same job (one value per metric)."""
    base = dict(bucket_mb=25.0, status="complete", oversubscribed=False, throughput=1.0)
    summary = pd.DataFrame([
        {**base, "job_id": "a1", "variant": "flat", "world_size": 1, "step_ms": 50.0,
         "step_ms_p10": 10.0, "step_ms_p90": 100.0},
        {**base, "job_id": "a2", "variant": "flat", "world_size": 2, "step_ms": 12.0,
         "step_ms_p10": 11.0, "step_ms_p90": 13.0},
        {**base, "job_id": "b1", "variant": "ring", "world_size": 1, "step_ms": 10.0,
         "step_ms_p10": 9.0, "step_ms_p90": 11.0},
        {**base, "job_id": "b2", "variant": "ring", "world_size": 2, "step_ms": 20.0,
         "step_ms_p10": 19.0, "step_ms_p90": 22.0},
    ])
    s = scaling(summary, "weak").set_index(["variant", "world_size"])
    assert s.loc[("flat", 2), "efficiency"] == pytest.approx(50 / 12)
    assert bool(s.loc[("flat", 1), "noisy"]) and not bool(s.loc[("flat", 2), "noisy"])
    assert s.loc[("flat", 2), "suspect"] == "T(1) noisy, above 100%" and s.loc[("flat", 1), "suspect"] == ""
    assert s.loc[("ring", 2), "suspect"] == ""
    assert not s.loc[("ring", 2), "noisy"] and s.loc[("ring", 2), "efficiency"] == pytest.approx(0.5)


def test_trace_is_source_is_the_trace_unless_it_misses_comm():
    from dpcore.read.analysis.metrics import trace_is_source
    trace = pd.Series([2.0, 0.0, 0.0, 0.0, 3.0])
    ivals = pd.Series([1.0, 4.0, 0.0, np.nan, 0.0])
    # misses what the intervals saw (row 1) -> intervals; neither saw comm (world size 1) -> trace
    assert trace_is_source(trace, ivals).tolist() == [True, False, True, True, True]
    assert bool(trace_is_source(0.0, 0.0)) and not bool(trace_is_source(0.0, 1.5))


def test_step_rows_and_job_row_name_the_same_source_on_the_sample(samples):
    """The Timeline's rank rows (step_ranks) and its job row (job_metrics' comm_source) say where
    the numbers came from by one rule: at world size 1 neither method sees comm, and both say trace."""
    from dpcore.read.analysis import job_metrics, step_metrics, step_ranks
    from dpcore.read.rundir import load_run
    from tests.events_path import trace_step_metrics, traced_job_events
    sample = samples / "sample-train"
    if not (sample / "run.json").exists():
        pytest.skip("sample runs not present (bash scripts/make_sample.sh)")
    run = load_run(sample)
    rows = step_metrics(run.steps, run.collectives, trace_step_metrics(traced_job_events(run)), run.comm_calls)
    jobs = job_metrics(rows).set_index("job_id")
    seen = set()
    for job in (j for j in jobs.index if run.traced_steps(j)):
        want = jobs.loc[job, "comm_source"]
        step = run.traced_steps(job)[0]
        assert set(step_ranks(rows, job, step)["source"]) == {want}, job
        assert set(step_ranks(rows, job, step, want)["source"]) == {want}, job
        seen.add((int(run.jobs.set_index("job_id").loc[job, "world_size"]), want))
    assert {(1, "trace"), (2, "trace"), (2, "intervals")} <= seen  # ring-ws2: its p2p is off the trace
