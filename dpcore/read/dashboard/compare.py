"""Compare mode: what differs between two runs (config), and by how much (B/A) on the same jobs.

Why these three pieces: a step time that doubled means nothing until you know what changed
between the runs (width? backend? threads per rank?), so the config difference comes first; the
ratio column answers "how much" without mental arithmetic; and the two runs' charts share their
y-axis so that bars of equal height mean equal time. The helpers are pure (pandas in, pandas
out) and tested; :func:`compare_overview` only places them on the page.
"""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dpcore.contract.units import EMPTY
from dpcore.read.dashboard import data
from dpcore.read.dashboard.table_cells import table_height
from dpcore.read.plots.overview import comparison_figure, label_jobs, robust_y_max

#: Environment entries that change what a number means (the rest, e.g. host or created, never do).
ENV_KEYS = ("backend", "device", "cpu_cores", "gpus", "threads_per_rank", "pinning", "torch", "oversubscribed")
JOB_KEYS = ["variant", "world_size", "bucket_mb"]


#: Spellings of one dtype (run.json keeps what the user typed: ``--dtype fp32`` and ``float32``
#: are one setting, not a difference between runs).
DTYPE_NAMES = {"fp32": "float32", "float": "float32", "f32": "float32", "fp16": "float16", "half": "float16",
               "f16": "float16", "bf16": "bfloat16", "fp64": "float64", "double": "float64"}


def dtype_name(value: object) -> object:
    """One name per dtype: ``fp32``, ``float``, ``torch.float32`` -> ``float32`` (others unchanged)."""
    if not isinstance(value, str):
        return value
    name = value.strip().lower().removeprefix("torch.")
    return DTYPE_NAMES.get(name, name)


def _text(value: object) -> str:
    """A config value as one comparable string (lists and dicts as compact JSON)."""
    if value is None:
        return EMPTY
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def config_diff(metas: dict[str, dict]) -> pd.DataFrame:
    """One row per config or environment key whose value differs between the runs
    (columns: setting, then one per run); empty when the runs were made the same way."""
    flat: dict[str, dict[str, str]] = {}
    for name, meta in metas.items():
        meta = meta if isinstance(meta, dict) else {}
        cfg = meta.get("config") if isinstance(meta.get("config"), dict) else {}
        env = meta.get("environment") if isinstance(meta.get("environment"), dict) else {}
        vals = {f"config.{k}": _text(dtype_name(v) if "dtype" in k else v) for k, v in cfg.items()}
        if cfg.get("repeats") == 0:  # the allreduce command's default: repeats chosen per size
            vals["config.repeats"] = "by size (50 up to 64 KiB, 20 up to 4 MiB, else 10)"
        vals.update({f"environment.{k}": _text(env.get(k)) for k in ENV_KEYS if k in env})
        flat[name] = vals
    keys = list(dict.fromkeys(k for v in flat.values() for k in v))
    rows = []
    for k in keys:
        vals = [flat[n].get(k, EMPTY) for n in flat]
        if len(set(vals)) > 1:
            rows.append({"setting": k, **{n: flat[n].get(k, EMPTY) for n in flat}})
    return pd.DataFrame(rows, columns=["setting", *flat])


def ratio_table(summaries: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Median step time T and exposed comm E of the jobs both runs have, with B/A ratios
    (A = the first run, B = the second; > 1 means B is slower). Jobs are paired by job id where
    both runs have ids (a comm-hook job and its plain twin share variant, world size and bucket
    size: pairing on those alone paired each with both), and labelled apart (``label_jobs``)."""
    (a, sa), (b, sb) = list(summaries.items())[:2]
    keys = JOB_KEYS + (["job_id"] if "job_id" in sa and "job_id" in sb else [])
    cols = keys + ["step_ms", "exposed_ms"]
    left = sa[[c for c in cols if c in sa]].dropna(subset=["step_ms"])
    right = sb[[c for c in cols if c in sb]].dropna(subset=["step_ms"])
    m = left.merge(right, on=keys, suffixes=("_a", "_b"))
    if m.empty:
        return pd.DataFrame(columns=["job", f"T (ms) · {a}", f"T (ms) · {b}", "T: B/A",
                                     f"E (ms) · {a}", f"E (ms) · {b}"])
    job = label_jobs(m)
    out = pd.DataFrame({"job": job, f"T (ms) · {a}": m["step_ms_a"], f"T (ms) · {b}": m["step_ms_b"],
                        "T: B/A": m["step_ms_b"] / m["step_ms_a"].where(m["step_ms_a"] > 0)})
    if "exposed_ms_a" in m:
        out[f"E (ms) · {a}"], out[f"E (ms) · {b}"] = m["exposed_ms_a"], m["exposed_ms_b"]
    return out.reset_index(drop=True)


def shared_y_max(summaries: list[pd.DataFrame]) -> float | None:
    """One y-axis top for every run's breakdown chart: the highest p90 (or median) over the
    runs, except jobs that exploded (the same outlier rule as one chart's axis)."""
    frames = [s.dropna(subset=["step_ms"]) for s in summaries if s is not None and not s.empty]
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    p90 = df["step_ms_p90"] if "step_ms_p90" in df else df["step_ms"]
    top = robust_y_max(df["step_ms"], p90)
    return top if top is not None else 1.08 * float(pd.concat([df["step_ms"], p90]).max())


def compare_overview(runs: list) -> None:
    """The config difference, step time of the same jobs side by side, and the B/A table."""
    names = [r.path.name for r in runs]
    diff = config_diff({r.path.name: r.meta for r in runs})
    st.markdown("**What differs between the runs**")
    if diff.empty:
        st.caption("Same config and environment: any difference below is measurement, not setup.")
    else:
        st.dataframe(diff, hide_index=True, width="stretch", height=table_height(len(diff)), placeholder=EMPTY)
    summaries = {r.path.name: data.cached_summary(r, data.key(r)) for r in runs}
    st.plotly_chart(comparison_figure(summaries), key="ov-compare")
    table = ratio_table(summaries)
    if table.empty:
        st.caption("The two runs have no job (variant, world size, bucket size) in common.")
        return
    num = st.column_config.NumberColumn
    st.dataframe(table, hide_index=True, width="stretch", height=table_height(len(table)), placeholder=EMPTY,
                 column_config={c: num(format="%.2f") for c in table.columns if c.startswith(("T (", "E ("))} | {
                     "T: B/A": num(f"T: {names[1]} / {names[0]}", format="%.2f×",
                                   help="Step time of the second run divided by the first's: > 1 means slower.")})
