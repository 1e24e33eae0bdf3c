"""What-if page: a measured bucketed/torch_ddp job, replayed at other buckets, ranks and networks.

Renders only: the model and every number come from `dpcore.read.whatif.predict` (the same
functions as `python -m dpcore whatif`), the figures from `dpcore.read.plots.whatif`.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from dpcore.contract.units import mib_size, ranks_text
from dpcore.read.dashboard import data, frame
from dpcore.read.dashboard.text import md
from dpcore.read.plots.whatif import breakdown_figure, sweep_figure, timeline_figure
from dpcore.read.rundir.load import Run
from dpcore.read.whatif.advice import add_bands, source_spread
from dpcore.read.whatif.model import ALGOS
from dpcore.read.whatif.predict import (
    Model,
    banded,
    build_model,
    default_cells,
    measured_cells,
    predict,
    replay_cell,
    replay_lanes,
    whatif_jobs,
    with_measured,
)

INTRO = "A measured bucketed/DDP job replayed at other bucket sizes, world sizes and networks."

BUCKETS_MB = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 32.0, 64.0, 128.0]
WORLD_SIZES = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]
FORMULA = ("step = forward + max(backward end, last all-reduce end) + bookkeeping + optimizer. Buckets are "
           "re-packed in reverse registration order (DDP's rule) and all-reduced in order, each as soon as its "
           "gradients are ready on every rank and a comm stream is free (NCCL: 1, gloo: 2 worker threads); "
           "ring all-reduce time = 2(N−1)·α + 2(N−1)/N · S/B. While a "
           "bucket is in flight, backward runs at (1 − kappa) of its speed: kappa is measured on the run.")


@st.cache_data(show_spinner=False, max_entries=16)
def model(_run: Run, run_key: tuple, job_id: str, algo: str) -> Model:
    """The replay model fitted on one job (a few numpy timelines: cheap to pickle)."""
    return build_model(_run, job_id, algo)


@st.cache_data(show_spinner=False, max_entries=16)
def measured(_run: Run, run_key: tuple, variant: str) -> pd.DataFrame:
    """The run's measured step times of ``variant`` (`measured_cells` summarizes every job, traces
    included: seconds on a busy box, so cached)."""
    return measured_cells(data.job_summary(_run, run_key), variant)


@st.cache_data(show_spinner=False, max_entries=64)
def predictions(_run: Run, run_key: tuple, job_id: str, algo: str, buckets: tuple, sizes: tuple, bw: float,
                lat: float) -> pd.DataFrame:
    """Predicted step per (bucket size, world size) on a network of bandwidth ``bw`` and latency ``lat``."""
    return predict(model(_run, run_key, job_id, algo), list(buckets), list(sizes), bw, lat)


def _choices(values: list, extra: list) -> list:
    return sorted(set(values) | {v for v in extra if v is not None})


def render(run: Run) -> None:
    """Job picker, sliders (world size, bucket size, bandwidth, latency), the predicted breakdown,
    the replayed timeline and the sweep against the run's measured jobs."""
    jobs = whatif_jobs(run)
    if not jobs:
        st.info("The what-if model starts from a completed `bucketed` or `torch_ddp` job (profile with "
                "`--variants bucketed` or `torch_ddp`, 2 or more ranks).")
        return
    key = data.key(run)
    sizes_of = dict(zip(run.jobs["job_id"], run.jobs["world_size"]))
    multi = [j for j in jobs if (sizes_of.get(j) or 0) >= 2] or jobs
    # start from the biggest buckets (DDP's usual setting): their comm is the least dominated by
    # per-message stalls that one job cannot calibrate (README, "How well it predicts")
    buckets_of = dict(zip(run.jobs["job_id"], pd.to_numeric(run.jobs["bucket_mb"], errors="coerce")))
    multi = sorted(multi, key=lambda j: -(buckets_of.get(j) or 0.0))
    c1, c2 = st.columns([2, 1])
    job = c1.selectbox("Measured job to start from", jobs, index=jobs.index(multi[0]), key=f"wi-job-{run.path}")
    algo = c2.selectbox("All-reduce algorithm", ALGOS, key=f"wi-algo-{run.path}")
    try:
        fitted = model(run, key, job, algo)
    except ValueError as exc:  # UsageError: the job lacks what the model needs
        st.warning(md(exc))
        return
    src = fitted.src
    s1, s2, s3, s4 = st.columns(4)
    ws = s1.select_slider("World size", _choices(WORLD_SIZES, [src.world_size]), value=src.world_size,
                          key=f"wi-ws-{run.path}-{job}")
    mb = s2.select_slider("Bucket size (MiB)", _choices(BUCKETS_MB, [src.bucket_mb]), value=src.bucket_mb,
                          key=f"wi-mb-{run.path}-{job}")
    fitted_bw = round(fitted.bandwidth_gbps, 3)
    bws = _choices([0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 400.0], [fitted_bw])
    bw = s3.select_slider("Bandwidth B (GB/s)", bws, value=fitted_bw, key=f"wi-bw-{run.path}-{job}")
    lat = s4.number_input("Latency α (µs)", min_value=0.0, value=float(round(fitted.alpha_us, 1)), step=10.0,
                          key=f"wi-lat-{run.path}-{job}")
    st.caption(f"Fitted from **{md(job)}**, {fitted.streams} collective(s) in flight at once, gradients from "
               f"{md(src.grads_source)}:\n"
               f"- kappa = {fitted.kappa:.2f}: {md(fitted.kappa_source)}\n"
               f"- α = {fitted.alpha_us:.1f} µs: {md(fitted.alpha_source)}\n"
               f"- B = {fitted.bandwidth_gbps:.3f} GB/s: {md(fitted.bandwidth_source)}")
    row, rep, buckets = replay_cell(fitted, ws, mb, bw, lat)
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Predicted step", f"{row['step_ms']:.1f} ms")
    m2.metric("Comm C", f"{row['comm_ms']:.1f} ms")
    m3.metric("Exposed comm E", f"{row['exposed_comm_ms']:.1f} ms")
    m4.metric("Buckets", f"{row['buckets']}")
    meas = measured(run, key, src.variant)
    summary = data.job_summary(run, key)
    # the recommendation: the same cells and function as `whatif` without flags (one value)
    b_def, _ = default_cells(run, src)
    _, advice = banded(fitted, with_measured(predictions(run, key, job, algo, tuple(b_def), (src.world_size,),
                                                         fitted.bandwidth_gbps, fitted.alpha_us), meas), summary)
    st.info(md(advice))
    cells, _ = banded(fitted, with_measured(predictions(run, key, job, algo,
                                                        tuple(_choices(BUCKETS_MB, [mb, src.bucket_mb])),
                                                        (ws,), bw, lat), meas), summary)
    st.subheader("Predicted step, broken down")
    st.plotly_chart(breakdown_figure(cells, mb), key=f"wi-bd-{run.path}-{job}")
    st.subheader(f"Replayed step: {ranks_text(ws)}, {mib_size(mb)} buckets")
    st.plotly_chart(timeline_figure(replay_lanes(rep, buckets, src.sizes, fitted.tail_ms)),
                    key=f"wi-tl-{run.path}-{job}")
    st.subheader("Prediction against the run's measured jobs")
    sizes = tuple(sorted(set(meas["world_size"].astype(int)) | {ws}))
    sweep = add_bands(predictions(run, key, job, algo, tuple(_choices(BUCKETS_MB, [])), sizes, bw, lat),
                      source_spread(summary, job))
    st.plotly_chart(sweep_figure(sweep, meas), key=f"wi-sw-{run.path}-{job}")
    st.caption(FORMULA + " Measured points use the fitted network; move B or α and only the lines move. "
               "Bands: the source job's p10-p90 step spread times the model's held-out error both ways; a "
               "measured point outside its band is a red x.")


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
