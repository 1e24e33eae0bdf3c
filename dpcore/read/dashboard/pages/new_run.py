"""New run page: the form that starts `python -m dpcore profile` from the app.

Why a page of its own: choosing a model, variants and world sizes is a decision made before there
is anything to look at (it is offered while the profiles folder is still empty, too); once the
profile runs, its progress follows on every page (`dpcore.read.dashboard.launcher`) and the run
opens on the Overview when it finishes.
"""
from __future__ import annotations

import streamlit as st

from dpcore.read.dashboard import data, frame, launcher


def page() -> None:
    """The page as Streamlit runs it."""
    ctx = frame.context()
    st.caption(f"Starts `python -m dpcore profile … --progress json` in the background; the run is written to "
               f"`{ctx.root}`.")
    launcher.new_run_form(ctx.root, data.APP_DIR)


if __name__ == "__main__":
    page()
