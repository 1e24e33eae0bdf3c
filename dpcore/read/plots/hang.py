"""The Hang page's figure: every rank's last collectives on one axis of sequence numbers, the
divergence marked (the verdict's seq)."""
from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dpcore.contract.units import exact_size


def hang_figure(colls: pd.DataFrame, verdict: dict[str, Any]) -> go.Figure:
    """One marker per (rank, collective): filled when it completed, open while waiting; colour
    by op; a dashed line at the verdict's sequence number, the lagging ranks' row labels in red."""
    fig = go.Figure()
    lag = set(verdict.get("lagging_ranks") or [])
    for op, g in colls.groupby("op", sort=True):
        fig.add_trace(go.Scatter(
            x=g["seq"], y=[f"rank {r}" for r in g["rank"]], mode="markers", name=str(op),
            marker={"size": 14, "symbol": ["circle" if c else "circle-open" for c in g["completed"]],
                    "line": {"width": 2}},
            customdata=list(zip([exact_size(b) for b in g["bytes"]], g["completed"])),
            hovertemplate=f"{op} seq %{{x}} on %{{y}}: %{{customdata[0]}}, "
                          "completed %{customdata[1]}<extra></extra>"))
    if verdict.get("kind") in ("missing", "desync") and verdict.get("seq", -1) >= 0:
        fig.add_vline(x=verdict["seq"], line_dash="dash", line_color="red",
                      annotation_text=f"{verdict['kind']} at seq {verdict['seq']}")
    ranks = sorted(colls["rank"].unique()) if not colls.empty else []
    fig.update_layout(
        height=160 + 40 * max(1, len(ranks)), margin={"l": 70, "r": 20, "t": 40, "b": 40},
        xaxis_title="collective sequence number (flight recorder)",
        yaxis={"categoryorder": "array", "autorange": "reversed",
               "categoryarray": [f"rank {r}" for r in ranks],
               "tickvals": [f"rank {r}" for r in ranks],
               "ticktext": [f"<b style='color:red'>rank {r}</b>" if r in lag else f"rank {r}"
                            for r in ranks]},
        title="last collectives of every rank (open marker: not completed)")
    return fig
