"""Run data as text inside Markdown: what every st.* call that renders Markdown must wrap it in.

Why: st.markdown, st.warning, st.error, st.info, st.caption, st.success, subheaders and widget
labels render Markdown, and run ids, folder names, job ids and error texts come from files
anyone can edit. Interpolated raw, ``![x](https://host/t.png)`` in a job's error text made the
browser fetch a URL, and ``**`` or a backtick garbled the page. Escaping every character that
CommonMark or Streamlit's extensions (``:color[...]``, ``:emoji:``, ``$math$``) give a meaning
shows the text exactly as written.
"""
from __future__ import annotations

import re

# CommonMark allows a backslash before any ASCII punctuation; these are the ones that start
# markup inline ('-' and '.' only act at a line start, and md() leaves no line starts).
_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~$:&=^])")
_NEWLINES = re.compile(r"[\r\n]+")


def md(value: object) -> str:
    """``str(value)`` escaped for Markdown, newlines folded into spaces (one line of text)."""
    return _SPECIAL.sub(r"\\\1", _NEWLINES.sub(" ", str(value)))
