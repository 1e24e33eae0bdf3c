"""Tables as people read them: empty cells that say why, sizes in binary units, every row shown.

Why a module of pure helpers (pandas in, pandas out, no st.*): the same rules hold on every page
and are testable without Streamlit. A cell that has no value says "—" (the dataframe's
``placeholder``), a skipped job says why ("skipped: needs 2 or more GPUs …"), a size reads
"16 MiB" (:func:`dpcore.contract.units.binary_size`, the CLI's rule too), and the bucket size is
blank for variants whose gradients are not bucketed (``BUCKET_SENSITIVE``), where it means nothing.
"""
from __future__ import annotations

import pandas as pd

from dpcore.contract.config import BUCKET_SENSITIVE
from dpcore.contract.units import EMPTY, binary_size, mib_size

#: Streamlit's default dataframe row height and header (px); a table this tall has no inner scroll.
ROW_PX, HEADER_PX = 35, 38
#: Past this many rows a table scrolls inside itself (a page-long table is worse than a scroll).
MAX_ROWS_SHOWN = 100


def table_height(rows: int) -> int:
    """Pixel height that shows every row of a table (up to MAX_ROWS_SHOWN) without an inner scroll."""
    return HEADER_PX + ROW_PX * max(1, min(int(rows), MAX_ROWS_SHOWN))


def status_text(status: object, variant: object, reason: object, error: object = None) -> str:
    """'complete', or 'skipped: <why>' / 'failed: <first line>' so an empty row explains itself.
    The variant's own name is dropped from the front of a reason ('data_parallel needs 2 …' ->
    'needs 2 …'): the row already names it."""
    status = "" if status is None or status != status else str(status)
    why = reason if isinstance(reason, str) and reason.strip() else error if isinstance(error, str) else ""
    why = why.strip().splitlines()[0] if why and why.strip() else ""
    if why and isinstance(variant, str) and why.startswith(variant + " "):
        why = why[len(variant) + 1:]
    if status in ("skipped", "failed", "interrupted") and why:
        return f"{status}: {why}"
    return status or EMPTY


#: The most characters of a status shown in a table cell; the whole text is in the caption below
#: the table and the column's hover help (a long skip reason widened the column and pushed the
#: step's numbers off a 1,400 px screen).
STATUS_CHARS = 28


def short_status(text: object, most: int = STATUS_CHARS) -> str:
    """A status cut to ``most`` characters at a word, with "…" where it was cut."""
    text = "" if text is None else str(text)
    if len(text) <= most:
        return text
    cut = text[: most - 1].rsplit(" ", 1)[0].rstrip(" ,;:")
    return (cut or text[: most - 1]) + "…"


def bucket_text(variant: object, bucket_mb: object) -> str:
    """The bucket size in binary units for bucketed variants; blank for the others."""
    return mib_size(bucket_mb) if variant in BUCKET_SENSITIVE else ""


def overview_rows(summary: pd.DataFrame, jobs: pd.DataFrame | None = None) -> pd.DataFrame:
    """`job_summary` rows for display: status with its reason, bucket size and comm bytes as text,
    comm fraction E/T in percent (every percentage on the pages reads '%.1f%%', SUMMARY_CONFIG)."""
    df = summary.copy()
    if df.empty:
        return df
    why = {}
    if jobs is not None and not jobs.empty and "job_id" in jobs:
        for _, j in jobs.iterrows():
            why[str(j["job_id"])] = (j.get("skip_reason"), j.get("error"))
    df["status"] = [status_text(s, v, *why.get(str(j), (None, None)))
                    for j, s, v in zip(df["job_id"], df["status"], df["variant"])]
    df["bucket_mb"] = [bucket_text(v, b) for v, b in zip(df["variant"], df["bucket_mb"])]
    if "comm_bytes" in df:
        df["comm_bytes"] = [binary_size(b) for b in df["comm_bytes"]]
    if "comm_fraction" in df:
        df["comm_fraction"] = 100 * pd.to_numeric(df["comm_fraction"], errors="coerce")
    if "comm_source" in df:
        df["comm_source"] = df["comm_source"].where(df["comm_source"].notna(), None)
    return df


def bandwidth_rows(bw: pd.DataFrame) -> pd.DataFrame:
    """The bandwidth table with the message size in binary units first (bytes kept, exact)."""
    if bw is None or bw.empty:
        return bw
    out = bw.copy()
    out.insert(out.columns.get_loc("bytes"), "size", [binary_size(b) for b in out["bytes"]])
    return out


def bucket_rows(sweep: pd.DataFrame) -> pd.DataFrame:
    """The bucket sweep table with the bucket size as '256 KiB' / '25 MiB'."""
    if sweep is None or sweep.empty:
        return sweep
    out = sweep.copy()
    out["bucket_mb"] = [mib_size(b) for b in out["bucket_mb"]]
    return out


def compression_rows(df: pd.DataFrame) -> pd.DataFrame:
    """`compression` rows for display: bytes in binary units ("3.77 MiB"), the bucket size as
    text, the reason blank when there is none; the numbers keep their values (the page's column
    formats round them)."""
    out = df.copy()
    for c in ("bytes_in", "bytes_wire"):
        if c in out:
            out[c] = [binary_size(b) for b in out[c]]
    if "bucket_mb" in out:
        out["bucket_mb"] = [mib_size(b) for b in out["bucket_mb"]]
    return out
