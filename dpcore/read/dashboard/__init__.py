"""The dpcore dashboard (Streamlit): one file per page, and the modules the pages share.

Why separate from `dpcore.read.plots`: plots are pure figure builders (testable without
Streamlit); these modules place them on the page, with captions and formulas, and call `st.*`.

- ``pages/``: one file per page (Runs, Overview, Timeline, ...), listed with its title and URL
  path in ``pages.PAGES``; app.py builds the navigation from that list. Each page defines the
  cached functions it needs.
- ``frame.py``: what every page shares: the runs app.py picked (handed over per run), the
  per-run loop, the ``safely`` error wrapper, the landing of an empty profiles folder.
- ``data.py``: run listing, cached loading, path checks, the caching pattern, and the results
  several pages draw (per-step trace overlap, the per-job summary).
- ``picker.py``: the sidebar's run picker and the "this run has no data here" offer.
- ``launcher.py``: the profile started from the app, and its progress.
- Pure helpers (no ``st.*`` calls, tested without Streamlit): ``table_cells.py`` (cells as people read
  them), ``text.py`` (run data escaped for Markdown), ``formulas.py`` (metric wording),
  ``perfetto.py`` (the "Open in Perfetto" button), ``chunks.py`` (ring chunk heatmap cells),
  and the pure half of ``compare.py``; ``columns.py`` holds the shared table column labels.
"""
