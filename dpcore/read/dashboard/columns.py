"""How the step-time numbers read in a table: label, format, and the formula as hover help.

Why shared: Overview, Timeline and Scaling show the same numbers (step time T, comm C, exposed
comm E, overlap, throughput); one column configuration keeps their labels and formulas identical
on every page. The formulas themselves are `dpcore.read.dashboard.formulas`.
"""
from __future__ import annotations

import streamlit as st

from dpcore.read.dashboard.formulas import FORMULAS

NUM = st.column_config.NumberColumn
SUMMARY_STATUS_HELP = "complete, or why the job has no numbers (skipped, failed)."
SUMMARY_CONFIG = {
    "step_ms": NUM("step T (ms)", help=FORMULAS["step_ms"], format="%.2f"),
    "compute_ms": NUM("compute (ms)", help=FORMULAS["compute_ms"], format="%.2f"),
    "comm_ms": NUM("comm C (ms)", help=FORMULAS["comm_ms"], format="%.2f"),
    "overlapped_ms": NUM("overlapped (ms)", help=FORMULAS["overlapped_ms"], format="%.2f"),
    "exposed_ms": NUM("exposed E (ms)", help=FORMULAS["exposed_ms"], format="%.2f"),
    "other_ms": NUM("other (ms)", help=FORMULAS["other_ms"], format="%.2f"),
    # percentages: one decimal everywhere (comm_fraction is shown in percent: tables.overview_rows)
    "comm_fraction": NUM("comm fraction E/T", help=FORMULAS["comm_fraction"], format="%.1f%%"),
    "overlap_pct": NUM("overlap %", help=FORMULAS["overlap_pct"], format="%.1f%%"),
    "comm_ops": NUM("comm ops", help=FORMULAS["comm_ops"], format="%d"),
    "comm_bytes": st.column_config.TextColumn("comm bytes",
                                              help=FORMULAS["comm_bytes"] + " Binary units (MiB = 2^20 B)."),
    "bucket_mb": st.column_config.TextColumn("bucket", help="Gradient bucket cap (MiB) of bucketed variants; "
                                             "blank where "
                                             "a variant does not bucket its gradients."),
    "world_size": NUM("world size", help="Ranks (processes) of the job.", format="%d"),
    "status": st.column_config.TextColumn("status", width="medium", help=SUMMARY_STATUS_HELP),
    "throughput": NUM("throughput (samples/s)", help=FORMULAS["throughput"], format="%.0f"),  # whole samples
    "step_ms_p10": NUM("T p10", help="10th percentile of step time over the timed steps and ranks", format="%.2f"),
    "step_ms_p90": NUM("T p90", help="90th percentile of step time over the timed steps and ranks", format="%.2f"),
    "noisy": st.column_config.CheckboxColumn("noisy", help="p90/p10 of step time > 1.5: the median is unreliable"),
    "comm_source": st.column_config.TextColumn("measured from", help="trace: torch.profiler spans/kernels of the "
                                               "traced steps; intervals: recorded collectives (collectives.csv)"),
    "overlap_gap": NUM("gap (pts)", help="overlap from the trace minus overlap from the intervals, same steps",
                       format="%+.1f"),
    "sources_disagree": st.column_config.CheckboxColumn("⚠", help="the two methods differ by more than 5 points"),
}
