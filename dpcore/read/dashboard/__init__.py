"""Streamlit render helpers of the dpcore dashboard (one module per group of views).

Why separate from `dpcore.read.plots`: plots are pure figure builders (testable without Streamlit);
these modules place them on the page, with captions and formulas, and may call `st.*`.
"""
