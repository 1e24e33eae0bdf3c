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
from dpcore.read.plots.whatif import breakdown_figure, replay_figure, sweep_figure
from dpcore.read.rundir.load import Run
from dpcore.read.whatif.advice import add_family_bands, source_spread
from dpcore.read.whatif.fabrics import load_fabrics, parse_fabric
from dpcore.read.whatif.model import ALGOS
from dpcore.read.whatif.predict import (
    LATENCY_US_RANGE,
    Model,
    banded,
    build_model,
    default_cells,
    measured_cells,
    predict,
    replay_cell,
    replay_lanes,
    scale_factors,
    whatif_jobs,
    widen_by_kappa,
    with_measured,
)

INTRO = ("A measured bucketed/DDP job replayed at other bucket sizes, world sizes and networks; a 1-rank job "
         "projected onto a fabric.")

BUCKETS_MB = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 32.0, 64.0, 128.0]
WORLD_SIZES = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]
FORMULA = ("step = forward + max(backward end, last all-reduce end) + bookkeeping + optimizer. Buckets are "
           "re-packed in reverse registration order (DDP's rule) and all-reduced in order, each as soon as its "
           "gradients are ready on every rank and a comm stream is free (NCCL: 1, gloo: 2 worker threads); "
           "ring all-reduce time = 2(N−1)·α + 2(N−1)/N · S/B. While a "
           "bucket is in flight, backward runs at (1 − kappa) of its speed: kappa is measured on the run.")


#: The network choice that keeps the run's own fit (offered for jobs of 2 or more ranks).
FITTED = "fitted from this run"


@st.cache_data(show_spinner=False, max_entries=16)
def model(_run: Run, run_key: tuple, job_id: str, algo: str, fabric: str | None = None) -> Model:
    """The replay model fitted on one job (a few numpy timelines: cheap to pickle); ``fabric``:
    messages from that preset (``whatif --fabric``); anchored on the job's step as the Summary
    page measures it."""
    return build_model(_run, job_id, algo, fabric=parse_fabric(fabric) if fabric else None,
                       summary=data.cached_summary(_run, run_key))


@st.cache_data(show_spinner=False, max_entries=16)
def measured(_run: Run, run_key: tuple, variant: str, job_id: str | None = None) -> pd.DataFrame:
    """The run's measured step times of ``variant`` with the comm hook of ``job_id`` (the source;
    `measured_cells` summarizes every job, traces included: seconds on a busy box, so cached)."""
    return measured_cells(data.cached_summary(_run, run_key), variant, _run.jobs, job_id)


@st.cache_data(show_spinner=False, max_entries=64)
def predictions(_run: Run, run_key: tuple, job_id: str, algo: str, buckets: tuple, sizes: tuple,
                bw: float | None, lat: float | None, fabric: str | None = None) -> pd.DataFrame:
    """Predicted step per (bucket size, world size) on a network of bandwidth ``bw`` and latency
    ``lat`` (None: the model's own, the fabric's per world size included)."""
    return predict(model(_run, run_key, job_id, algo, fabric), list(buckets), list(sizes), bw, lat)


def _choices(values: list, extra: list) -> list:
    return sorted(set(values) | {v for v in extra if v is not None})


def _network(run: Run, job: str, ws_src: int) -> tuple[str, str | None]:
    """The all-reduce algorithm and the fabric text (None: the run's own fit) the user picks."""
    table = load_fabrics()
    intra = [n for n, f in table.items() if f.scope == "intra"]
    inter = [n for n, f in table.items() if f.scope == "inter"]
    c1, c2, c3 = st.columns([2, 2, 1])
    # a 1-rank job has no all-reduce to fit: a fabric is the only way to ask about more ranks
    options = ([FITTED] if ws_src >= 2 else []) + intra
    pick = c1.selectbox("Network inside a node", options, key=f"wi-net-{run.path}-{job}",
                        help="a preset of dpcore/read/whatif/fabrics.csv (`whatif --fabric list` shows sources)")
    if pick == FITTED:
        algo = c3.selectbox("All-reduce algorithm", ALGOS, key=f"wi-algo-{run.path}")
        return algo, None
    between = c2.selectbox("Between nodes (beyond one node)", inter, key=f"wi-inter-{run.path}-{job}")
    c3.caption("NCCL ring, 1 stream")
    return "ring", f"{pick},{between}"


def render(run: Run) -> None:
    """Job and network pickers, the cells to sweep (world sizes, bucket sizes), sliders for one
    cell (world size, bucket size, bandwidth, latency), the factors the model applies, the
    predicted breakdown, the replayed timeline and the sweep against the run's measured jobs."""
    jobs = whatif_jobs(run)
    if not jobs:
        st.info("The what-if model starts from a completed `bucketed` or `torch_ddp` job (profile with "
                "`--variants bucketed` or `torch_ddp`; a 1-rank job is projected onto a fabric).")
        return
    key = data.key(run)
    sizes_of = dict(zip(run.jobs["job_id"], run.jobs["world_size"]))
    multi = [j for j in jobs if (sizes_of.get(j) or 0) >= 2] or jobs
    # start from the biggest buckets (DDP's usual setting): their comm is the least dominated by
    # per-message stalls that one job cannot calibrate (docs/whatif.md)
    buckets_of = dict(zip(run.jobs["job_id"], pd.to_numeric(run.jobs["bucket_mb"], errors="coerce")))
    multi = sorted(multi, key=lambda j: -(buckets_of.get(j) or 0.0))
    job = st.selectbox("Measured job to start from", jobs, index=jobs.index(multi[0]), key=f"wi-job-{run.path}")
    algo, fabric = _network(run, job, int(sizes_of.get(job) or 1))
    try:
        fitted = model(run, key, job, algo, fabric)
    except ValueError as exc:  # UsageError: the job lacks what the model needs
        st.warning(md(exc))
        return
    src = fitted.src
    b_def, n_def = default_cells(run, src)
    if fitted.fabric is not None:
        n_def = sorted(set(n_def) | {fitted.fabric.intra.devices})
    w1, w2 = st.columns(2)
    sweep_ws = w1.multiselect("World sizes to predict", _choices(WORLD_SIZES, n_def), default=n_def,
                              key=f"wi-sws-{run.path}-{job}") or n_def
    sweep_mb = w2.multiselect("Bucket sizes to predict (MiB)", _choices(BUCKETS_MB, b_def), default=b_def,
                              key=f"wi-smb-{run.path}-{job}") or b_def
    s1, s2, s3, s4 = st.columns(4)
    ws_pick = max(sweep_ws) if src.world_size == 1 else src.world_size
    ws = s1.select_slider("World size", _choices(WORLD_SIZES, [src.world_size, *sweep_ws]), value=ws_pick,
                          key=f"wi-ws-{run.path}-{job}")
    mb = s2.select_slider("Bucket size (MiB)", _choices(BUCKETS_MB, [src.bucket_mb, *sweep_mb]), value=src.bucket_mb,
                          key=f"wi-mb-{run.path}-{job}")
    fitted_bw = round(fitted.bandwidth_gbps, 3)
    bws = _choices([0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 400.0], [fitted_bw])
    bw = s3.select_slider("Bandwidth B (GB/s)", bws, value=fitted_bw, key=f"wi-bw-{run.path}-{job}-{fabric}")
    lat = s4.number_input("Latency α (µs)", min_value=LATENCY_US_RANGE[0], max_value=LATENCY_US_RANGE[1],
                          value=float(round(fitted.alpha_us, 1)), step=10.0, key=f"wi-lat-{run.path}-{job}-{fabric}")
    # untouched sliders keep the model's own network (a fabric's differs per world size)
    bw_arg = None if bw == fitted_bw else bw
    lat_arg = None if lat == float(round(fitted.alpha_us, 1)) else lat
    st.caption(f"Fitted from **{md(job)}**, {fitted.streams} collective(s) in flight at once, gradients from "
               f"{md(src.grads_source)}. Every factor the model applies, and what it rests on:")
    st.dataframe(pd.DataFrame(scale_factors(fitted), columns=["factor", "value", "rests on", "source"]),
                 hide_index=True, width="stretch")
    row, rep, buckets = replay_cell(fitted, ws, mb, bw_arg, lat_arg)
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Predicted step", f"{row['step_ms']:.1f} ms")
    m2.metric("Comm C", f"{row['comm_ms']:.1f} ms")
    m3.metric("Exposed comm E", f"{row['exposed_comm_ms']:.1f} ms")
    m4.metric("Buckets", f"{row['buckets']}")
    meas = measured(run, key, src.variant, src.job_id)
    summary = data.cached_summary(run, key)
    # the recommendation: the same cells and function as `whatif` (one value)
    rec_ws = tuple(sorted(set(sweep_ws)))
    cells = with_measured(predictions(run, key, job, algo, tuple(sorted(sweep_mb)), rec_ws, None, None, fabric), meas)
    _, advice = banded(fitted, cells, summary)
    st.info(md(advice))
    bar_mb = _choices(sweep_mb, [mb, src.bucket_mb])
    cells, _ = banded(fitted, with_measured(predictions(run, key, job, algo, tuple(bar_mb), (ws,), bw_arg, lat_arg,
                                                        fabric), meas), summary)
    if bw_arg is None and lat_arg is None:  # an assumed kappa's band (a 1-rank source on a fabric)
        cells = widen_by_kappa(fitted, cells, bar_mb, [ws])
    st.subheader("Predicted step, broken down")
    st.plotly_chart(breakdown_figure(cells, mb), key=f"wi-bd-{run.path}-{job}")
    st.subheader(f"Replayed step: {ranks_text(ws)}, {mib_size(mb)} buckets")
    st.plotly_chart(replay_figure(replay_lanes(rep, buckets, src.sizes, fitted.tail_ms)),
                    key=f"wi-tl-{run.path}-{job}")
    st.subheader("Prediction against the run's measured jobs")
    sizes = tuple(sorted(set(meas["world_size"].astype(int)) | {ws} | set(sweep_ws)))
    sweep = add_family_bands(predictions(run, key, job, algo, tuple(_choices(sweep_mb, [mb])), sizes, bw_arg, lat_arg,
                                         fabric), source_spread(summary, job), src.variant, src.bucket_mb,
                             src.world_size)
    st.plotly_chart(sweep_figure(sweep, meas), key=f"wi-sw-{run.path}-{job}")
    st.caption(FORMULA + " Measured points use the fitted network; move B or α and only the lines move. "
               "Bands: the held-out error of the cell's family below and above the prediction (variant, direction "
               "in bucket size and world size, a 1-rank source at more ranks a family of its own; "
               "dpcore/read/whatif/bands.csv) and the doubt of the source job's median step, in quadrature on each "
               "side: a family the model predicts low reaches mostly upward; a measured point outside its band is a "
               "red x. Fabrics: several nodes form one flat ring whose "
               "slower link sets its pace (dpcore/read/whatif/fabrics.py).")


def page() -> None:
    """The page as Streamlit runs it."""
    st.caption(INTRO)
    frame.each_run(render)


if __name__ == "__main__":
    page()
