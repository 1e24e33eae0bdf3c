"""Pure plotly figure builders for dpcore: DataFrames (shaped as docs/ANALYSIS_API.md) in, figures out.

Why pure: the same figures serve the Streamlit app, notebooks and tests, and can be checked
without a browser or a Streamlit runtime. No `st.*` calls here, no disk access.
"""
