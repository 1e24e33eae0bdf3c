"""Error bands and the one-line recommendation of a what-if table (DataFrames in, out; no disk).

Why bands: a prediction without its doubt misleads (a 0.25 MiB cell predicted at 18 ms was
measured at 57 ms, with no sign of doubt). Two things make a predicted cell uncertain, and
the band multiplies both in:

* the **uncertainty of the source job's median step**: the replay reuses the source's steps and
  is anchored on its median, and a predicted cell is a median step too (``summarize``'s
  ``step_ms``, what the band must hold), so the source adds the doubt of its median, not the
  spread of its single steps: from its p10/p50/p90 and its number of timed steps n
  (:func:`source_spread`), about 1.6 x (p90 - p50) / sqrt(n) up and the same of p50 - p10 down;
* the **model's error where it errs**: the held-out error of cells like this one, its family
  (variant x direction of extrapolation in bucket size and in world size, :func:`family_of`; a
  1-rank source predicted at more ranks is a family of its own), from ``bands.csv`` next to this
  module (written by ``benchmarks/bench_whatif.py --held-out --bands-out``), one error below the
  prediction and one above: a family the model predicts low gets a band reaching mostly upward.
  A family without held-out cells takes its stand-in's (:data:`STAND_IN`), else the global
  :data:`MODEL_ERROR_PCT`, and its ``band_from`` says so.

The two are independent, so they add in quadrature on each side (:func:`add_bands`). The family
errors are calibrated with the band as it is drawn, on single held-out runs (each round's cells
as one run gives them, with that run's source doubt: a user's run is one run) by
:func:`dpcore.read.whatif.bandfit.fit_family`: the narrowest pair that holds 90 % of the
family's cells when each source's cells are held out of the fit.

Why the recommendation compares against the model's error only: the source median's doubt moves every
predicted cell of one source together (they replay the same steps), so it cancels in a
comparison of two cells; the model's error does not. A gain smaller than the fastest cell's
family error "does not matter"; a larger one is named, in ms and %.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.contract.units import ranks_text

#: The model's error on held-out cells (%, both ways): the mean absolute error of the held-out
#: benchmark (`python -m benchmarks.bench_whatif --held-out`, 120 cells of mlp 256/1024 and
#: transformer tiny, bucketed and torch_ddp, 0.25-64 MiB at 2 ranks) on a heavily loaded shared
#: 2-core box: 42.0 %, where two jobs with the *same* bucket plan differed by 30.6 % on average.
#: On a quiet machine the same benchmark measured 13.0 %; 98 % of its cells fall inside bands of
#: 42 %, 75 % inside bands of 13 % (docs/whatif.md). The loaded figure is kept: shared machines are where
#: people run this, and a band must hold there.
MODEL_ERROR_PCT = 42.0
#: Bands and recommendation columns ``whatif --csv`` adds (docs/DESIGN.md).
BAND_COLUMNS = ["step_ms_lo", "step_ms_hi"]
#: The held-out error per family (columns variant, buckets, ranks, cells, mae_pct, lower_pct,
#: upper_pct, half_width_pct, inside_held_out_pct, where; docs/DESIGN.md), written by
#: ``bench_whatif --held-out --bands-out``. Older tables have ``half_width_pct`` alone: read as a
#: symmetric band (lower = upper = half-width).
BANDS_CSV = Path(__file__).with_name("bands.csv")
#: The ``ranks`` family of a world-size-1 source predicted at more ranks. Kept apart from ``more``
#: (2+ ranks to more) because it errs one way: a single rank cannot see how much slower its
#: all-reduces run in training, nor its compute slow down when a second rank shares the machine,
#: so its predictions come out low (97 % of the held-out 1 -> 2 cells of 2026-11-27).
ONE_TO_MORE = "one_to_more"
#: Where a family has no row of its own, the family whose held-out cells stand in for it, said so
#: in ``band_from``: tables written before :data:`ONE_TO_MORE` existed keyed the 1 -> 2 cells as
#: ``more`` (they were its only cells), and a 2+ -> more cell has no held-out cells of its own
#: (the benchmark's machine cannot run more ranks than cores without oversubscribing them).
STAND_IN = {ONE_TO_MORE: "more", "more": ONE_TO_MORE}
_RANKS_TEXT = {ONE_TO_MORE: "more ranks from one rank"}


def family_of(src_mb: float, src_ws: int, mb: float, ws: int) -> tuple[str, str]:
    """(buckets, ranks): which way a cell extrapolates from its source job, in bucket size
    (``larger``, ``smaller``, ``same``) and in world size (``more``, ``fewer``, ``same``, or
    :data:`ONE_TO_MORE` from a 1-rank source). The model errs differently each way (re-packing into
    fewer, larger buckets loses overlap that the source had; more ranks add messages the source
    never sent; a single rank never sent any)."""
    b = "same" if np.isclose(mb, src_mb) else "larger" if mb > src_mb else "smaller"
    n = "same" if ws == src_ws else ("more" if src_ws > 1 else ONE_TO_MORE) if ws > src_ws else "fewer"
    return b, n


@lru_cache(maxsize=4)
def family_errors(path: Path = BANDS_CSV) -> pd.DataFrame:
    """``bands.csv`` indexed by (variant, buckets, ranks), with ``lower_pct``/``upper_pct`` (a
    table with ``half_width_pct`` alone gets both from it: symmetric); empty when the file is missing."""
    if not path.is_file():
        return pd.DataFrame(columns=["lower_pct", "upper_pct", "half_width_pct", "cells", "where"])
    return with_sides(pd.read_csv(path)).set_index(["variant", "buckets", "ranks"])


def with_sides(errors: pd.DataFrame) -> pd.DataFrame:
    """``errors`` (bands.csv rows) with ``lower_pct``/``upper_pct``: as written, else both the
    symmetric ``half_width_pct`` of a table written before bands had two sides."""
    out = errors.copy()
    for side in ("lower_pct", "upper_pct"):
        if side not in out:
            out[side] = out["half_width_pct"]
        else:
            out[side] = out[side].fillna(out["half_width_pct"]) if "half_width_pct" in out else out[side]
    return out


def family_row(errors: pd.DataFrame, variant: str, b: str, n: str) -> tuple[pd.Series | None, str]:
    """(the ``errors`` row of family (variant, b, n), else of its :data:`STAND_IN`, else None;
    the ranks key of the row taken)."""
    for key in (n, STAND_IN.get(n)):
        if key is not None and (variant, b, key) in errors.index:
            return errors.loc[(variant, b, key)], key
    return None, n


def _family_name(variant: str, b: str, n: str) -> str:
    return f"{variant}, {b} buckets, {_RANKS_TEXT.get(n, n + ' ranks')}"


def cell_errors(table: pd.DataFrame, variant: str, src_mb: float, src_ws: int,
                errors: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per row of ``table`` (WHATIF rows of a source job of ``variant`` at ``src_mb`` MiB and
    ``src_ws`` ranks): the model error (%) its band takes below and above the prediction, and
    where it comes from: its family's held-out ``lower_pct``/``upper_pct`` (``errors``:
    :func:`family_errors`; a table with one ``half_width_pct`` gives both), else its stand-in
    family's (:data:`STAND_IN`), else the global :data:`MODEL_ERROR_PCT` both ways, with the reason."""
    errors = family_errors() if errors is None else with_sides(errors.reset_index()).set_index(errors.index.names)
    lo, hi, where = [], [], []
    for mb, ws in zip(table["bucket_mb"], table["world_size"]):
        b, n = family_of(src_mb, src_ws, float(mb), int(ws))
        name = _family_name(variant, b, n)
        r, key = family_row(errors, variant, b, n)
        if r is not None:
            lo.append(float(r["lower_pct"]))
            hi.append(float(r["upper_pct"]))
            instead = "" if key == n else f" (no held-out cells of family {name}; its stand-in)"
            # the share is the leave-one-source-out one (cells the fit did not see); docs/whatif.md's
            # held-out section gives how these bands held on rounds measured after
            held = r.get("inside_held_out_pct", np.nan)
            held_text = f", {float(held):g} % of them inside with each source left out" if np.isfinite(held) else ""
            where.append(f"family {_family_name(variant, b, key)}{instead}: errors -{float(r['lower_pct']):g}/"
                         f"+{float(r['upper_pct']):g} % below/above the prediction, with the source's doubt added, "
                         f"from its {int(r['cells'])} held-out cells{held_text}")
        else:
            lo.append(MODEL_ERROR_PCT)
            hi.append(MODEL_ERROR_PCT)
            where.append(f"global {MODEL_ERROR_PCT:g} % (no held-out cells of family {name})")
    return np.array(lo, float), np.array(hi, float), where


#: The 90 % two-sided interval of the median of n normal samples, in units of (p90 - p50) / sqrt(n):
#: z(0.95) x the median's standard error sqrt(pi / 2) x sigma / sqrt(n), with sigma = (p90 - p50) /
#: z(0.90): 1.645 x 1.2533 / 1.2816.
MEDIAN_INTERVAL = 1.645 * 1.2533 / 1.2816


def source_spread(summary: pd.DataFrame, job_id: str) -> tuple[float, float]:
    """(down, up): the relative uncertainty of the source job's median step (``job_summary`` rows:
    ``step_ms``, ``step_ms_p10``, ``step_ms_p90``, ``n_steps``), :data:`MEDIAN_INTERVAL` x
    (p50 - p10) / p50 / sqrt(n) and the same of p90 - p50 (one timed step: the whole p10/p90
    spread); (0, 0) when the run has no spread for it."""
    row = summary[summary["job_id"] == job_id]
    if row.empty:
        return 0.0, 0.0
    p10, p50, p90 = (float(row[c].iloc[0]) for c in ("step_ms_p10", "step_ms", "step_ms_p90"))
    if not all(np.isfinite([p10, p50, p90])) or p50 <= 0:
        return 0.0, 0.0
    n = float(row["n_steps"].iloc[0]) if "n_steps" in row and np.isfinite(row["n_steps"].iloc[0]) else 1.0
    k = MEDIAN_INTERVAL / np.sqrt(n) if n > 1 else 1.0
    return k * max(p50 - p10, 0.0) / p50, k * max(p90 - p50, 0.0) / p50


def add_bands(table: pd.DataFrame, spread: tuple[float | pd.Series, float | pd.Series],
              model_error_pct: float | np.ndarray | pd.Series = MODEL_ERROR_PCT,
              model_error_hi_pct: float | np.ndarray | pd.Series | None = None) -> pd.DataFrame:
    """``table`` (WHATIF rows) with ``step_ms_lo``/``step_ms_hi``: the prediction times
    1 - sqrt(e_lo^2 + u_dn^2) and 1 + sqrt(e_hi^2 + u_up^2), e the model's error below and above
    the prediction (``model_error_pct`` and ``model_error_hi_pct``: one figure, or one per row,
    :func:`cell_errors`; ``model_error_hi_pct`` None: the same both ways) and u the source
    median's uncertainty down/up (``spread``, :func:`source_spread`; or one per row, as the
    held-out benchmark's medians over rounds have); ``model_error_lo_pct``/``model_error_hi_pct``
    and ``model_error_pct``, the larger of the two (the error a recommendation's gain must clear);
    and ``in_band`` (the measured cell inside its band; NaN where the run has no such cell).

    Why two sides: where the model errs one way (a 1-rank source predicts 2 ranks low), a
    symmetric band pays for that bias on both sides and still misses on the side it errs."""
    out = table.copy()
    lo = np.broadcast_to(np.asarray(model_error_pct, float), len(out))
    hi = lo if model_error_hi_pct is None else np.broadcast_to(np.asarray(model_error_hi_pct, float), len(out))
    out["model_error_lo_pct"], out["model_error_hi_pct"] = lo, hi
    out["model_error_pct"] = np.maximum(lo, hi)
    e_lo, e_hi = out["model_error_lo_pct"] / 100.0, out["model_error_hi_pct"] / 100.0
    out["step_ms_lo"] = out["step_ms"] * np.maximum(1.0 - np.sqrt(e_lo ** 2 + spread[0] ** 2), 0.0)
    out["step_ms_hi"] = out["step_ms"] * (1.0 + np.sqrt(e_hi ** 2 + spread[1] ** 2))
    if "measured_step_ms" in out:
        m = out["measured_step_ms"]
        inside = (m >= out["step_ms_lo"]) & (m <= out["step_ms_hi"])
        out["in_band"] = inside.astype(object).where(m.notna(), np.nan)
    return out


def add_family_bands(table: pd.DataFrame, spread: tuple[float, float], variant: str, src_mb: float, src_ws: int,
                     errors: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`add_bands` with each cell's family errors below and above (:func:`cell_errors`), and
    ``band_from`` saying where they come from: what ``whatif`` and the What-if page both draw."""
    lo, hi, where = cell_errors(table, variant, src_mb, src_ws, errors)
    return add_bands(table, spread, lo, hi).assign(band_from=where)


def error_text(lo: float, hi: float) -> str:
    """A band's model error as printed: ``20 %`` both ways, ``-5/+40 %`` when the sides differ."""
    return f"{hi:g} %" if np.isclose(lo, hi) else f"-{lo:g}/+{hi:g} %"


def knob_text(mb: float) -> str:
    """Where to set a bucket size of ``mb`` MiB in the frameworks people use (all in MiB)."""
    v = f"{mb:g}"
    return (f"DistributedDataParallel(model, bucket_cap_mb={v}); Hugging Face "
            f"TrainingArguments(ddp_bucket_cap_mb={v}); Lightning DDPStrategy(bucket_cap_mb={v})")


def recommend(table: pd.DataFrame, world_size: int, own_mb: float, own_measured_ms: float | None = None,
              model_error_pct: float = MODEL_ERROR_PCT) -> tuple[pd.DataFrame, str]:
    """(``table`` with a ``recommended`` bool column, the recommendation line).

    Among the predicted cells at ``world_size`` (the source job's), the fastest bucket size; its
    gain against the job's own setting ``own_mb`` (predicted; the measured step when the table
    lacks that cell) in ms and %, with the band of the gain. The errors are the fastest cell's
    ``model_error_lo_pct``/``model_error_hi_pct`` (its family's, :func:`add_bands`), else its
    ``model_error_pct`` both ways, else ``model_error_pct``. When the gain is within the upper one
    (the fastest cell may come out that much slower than predicted) the line says the bucket size
    does not matter and the own cell is the recommended one: the own cell replays the measured
    job, whose noise is the source's spread and cancels."""
    out = table.assign(recommended=False)
    at = out[out["world_size"] == world_size]
    if at.empty:
        return out, f"recommendation: none (no predicted cell at the job's {ranks_text(world_size)})"
    own = at[np.isclose(at["bucket_mb"], own_mb)]
    own_ms = float(own["step_ms"].iloc[0]) if not own.empty else own_measured_ms
    best = at.loc[at["step_ms"].idxmin()]
    if own_ms is None or not np.isfinite(own_ms) or own_ms <= 0:
        out.loc[best.name, "recommended"] = True
        return out, (f"recommendation: {best['bucket_mb']:g} MiB buckets at {ranks_text(world_size)} (predicted "
                     f"{best['step_ms']:.1f} ms, band {best['step_ms_lo']:.1f}-{best['step_ms_hi']:.1f}): "
                     + knob_text(best["bucket_mb"]))
    # the step may come out above its prediction by the band's upper error and below by its lower
    both = float(best["model_error_pct"]) if "model_error_pct" in best.index else model_error_pct
    e_lo, e_hi = ((float(best[c]) if c in best.index and np.isfinite(best[c]) else both) / 100.0
                  for c in ("model_error_lo_pct", "model_error_hi_pct"))
    pct = error_text(100 * e_lo, 100 * e_hi)
    e = e_hi
    gain = 100.0 * (own_ms - best["step_ms"]) / own_ms
    lo = 100.0 * (own_ms - best["step_ms"] * (1 + e_hi)) / own_ms
    hi = 100.0 * (own_ms - best["step_ms"] * (1 - e_lo)) / own_ms
    if np.isclose(best["bucket_mb"], own_mb):
        out.loc[best.name, "recommended"] = True
        return out, (f"recommendation: keep bucket_cap_mb={own_mb:g}: the job's own {own_mb:g} MiB buckets are "
                     f"predicted fastest of the {len(at)} bucket sizes at {ranks_text(world_size)} ({own_ms:.1f} ms)")
    if best["step_ms"] * (1 + e) >= own_ms:
        keep = own.index[0] if not own.empty else best.name
        out.loc[keep, "recommended"] = True
        return out, (f"recommendation: the bucket size does not matter for this job at {ranks_text(world_size)}: the "
                     f"fastest predicted, {best['bucket_mb']:g} MiB ({best['step_ms']:.1f} ms), is within the "
                     f"model's {pct} error of the job's own {own_mb:g} MiB ({own_ms:.1f} ms); "
                     f"keep bucket_cap_mb={own_mb:g}")
    out.loc[best.name, "recommended"] = True
    return out, (f"recommendation: {best['bucket_mb']:g} MiB buckets at {ranks_text(world_size)}: predicted "
                 f"{best['step_ms']:.1f} ms against {own_ms:.1f} ms at the job's {own_mb:g} MiB, "
                 f"{own_ms - best['step_ms']:.1f} ms ({gain:.0f} %) faster (band {lo:.0f} to {hi:.0f} %, the "
                 f"model's {pct} error); set " + knob_text(best["bucket_mb"]))


#: Measured variants the recommendation weighs against the replayed DDP cells: ZeRO-1 averages
#: gradients in the same buckets but then broadcasts the updated parameters, which the replay
#: does not model, so they are compared as *measured* against *predicted*, never predicted.
ZERO1_VARIANTS = ("zero1", "torch_zero1")


def zero1_rivals(summary: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """The run's completed ZeRO-1 jobs at ``world_size`` (``job_summary`` rows: job_id, variant,
    bucket_mb, step_ms, step_ms_p10, step_ms_p90), fastest first."""
    cols = ["job_id", "variant", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90"]
    if summary.empty or not set(cols) <= set(summary.columns):
        return pd.DataFrame(columns=cols)
    s = summary[summary["variant"].isin(ZERO1_VARIANTS) & (summary["status"] == "complete")
                & (summary["world_size"] == world_size) & np.isfinite(summary["step_ms"].astype(float))]
    return s[cols].sort_values("step_ms", kind="stable").reset_index(drop=True)


def zero1_knob_text(mb: float) -> str:
    """Where ZeRO-1 is set in PyTorch (the ``torch_zero1`` variant's construction)."""
    return (f"torch.distributed.optim.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=...) "
            f"over DistributedDataParallel(model, bucket_cap_mb={mb:g})")


def recommend_variant(table: pd.DataFrame, line: str, rivals: pd.DataFrame, world_size: int, variant: str,
                      own_mb: float, own_measured_ms: float | None = None) -> tuple[pd.DataFrame, str]:
    """:func:`recommend`'s (table, line) weighed against the measured ZeRO-1 jobs ``rivals``
    (:func:`zero1_rivals`) at ``world_size``.

    The DDP side is the cell the bucket line recommends, with its whole band (the source's spread
    does not cancel against another job's measurement). The fastest ZeRO-1 job wins only when
    its measured median is below that band, loses when above it; inside it the variant does not
    matter. The gain of a winning ZeRO-1 job is against the job's own setting (the predicted own
    cell and its band; the measured step when the table lacks that cell)."""
    if rivals.empty:
        return table, line
    at = table[table["world_size"] == world_size]
    pick = at[at["recommended"]]
    if pick.empty:
        return table, line
    d = pick.iloc[0]
    z = rivals.iloc[0]
    zms, zmb = float(z["step_ms"]), float(z["bucket_mb"])
    zname = f"{z['variant']} (ZeRO-1, {zmb:g} MiB buckets, job {z['job_id']})"
    ddp = (f"{variant} at {d['bucket_mb']:g} MiB predicted {d['step_ms']:.1f} ms "
           f"(band {d['step_ms_lo']:.1f}-{d['step_ms_hi']:.1f})")
    why = "measured vs predicted: the replay does not model ZeRO-1's parameter broadcast"
    if zms > d["step_ms_hi"]:
        return table, f"{line}; {variant} over ZeRO-1: {zname} measured {zms:.1f} ms is above {ddp} ({why})"
    if zms >= d["step_ms_lo"]:
        return table, (f"{line}; DDP or ZeRO-1 does not matter at {ranks_text(world_size)}: {zname} measured "
                       f"{zms:.1f} ms is inside the band of {ddp} ({why})")
    own = at[np.isclose(at["bucket_mb"], own_mb)]
    if not own.empty:
        o = own.iloc[0]
        own_ms, own_lo, own_hi, how = (float(o["step_ms"]), float(o["step_ms_lo"]), float(o["step_ms_hi"]),
                                       "predicted")
    else:
        own_ms = own_lo = own_hi = float(own_measured_ms) if own_measured_ms else float("nan")
        how = "measured"
    out = table.assign(recommended=False)  # the winner is a measured job, not a predicted cell
    gain = (f", {100 * (own_ms - zms) / own_ms:.0f} % faster than the job's own {own_mb:g} MiB "
            f"({how} {own_ms:.1f} ms; band {100 * (1 - zms / own_lo):.0f} to {100 * (1 - zms / own_hi):.0f} %)"
            if np.isfinite(own_ms) and own_ms > 0 else "")
    return out, (f"recommendation: ZeRO-1 at {ranks_text(world_size)}: {zname} measured {zms:.1f} ms "
                 f"(p10-p90 {float(z['step_ms_p10']):.1f}-{float(z['step_ms_p90']):.1f}), below the band of "
                 f"the fastest DDP cell, {ddp}{gain} ({why}); set " + zero1_knob_text(zmb))
