"""One-click "Open in Perfetto": the trace handed to ui.perfetto.dev by postMessage.

Why postMessage and not a URL: Perfetto documents two ways to open a trace from another page
("Deep linking to the Perfetto UI"): ``?url=`` needs the trace served over public HTTPS with
CORS headers, which a local dashboard is not; the other is to ``window.open`` the UI, repeat
the string ``'PING'`` until it answers ``'PONG'`` (its message channel is not buffered, so
anything sent earlier is lost), then post ``{perfetto: {buffer, title, fileName}}`` with the
trace bytes as an ArrayBuffer. Perfetto opens gzip-compressed JSON directly, so the .json.gz
file goes as it is. Nothing is uploaded: the bytes go from this page to the Perfetto tab.

Why a Streamlit components-v2 component: the v1 ``html`` component (an iframe per call) is
deprecated and past its removal date. A v2 component is registered once with fixed HTML and
JavaScript (:data:`PERFETTO_HTML`, :data:`PERFETTO_JS`: nothing run-provided is ever interpolated
into code) and each mount passes the trace as *data* (:func:`perfetto_data`), which the script
reads. The bytes ride in that data (base64, one third larger), re-sent on every rerun of the
page: above :data:`MAX_EMBED_BYTES` the button is replaced by a note that says so and points to
the download button. The button is the component's own, so the click is the user gesture popup
blockers ask for.
"""
from __future__ import annotations

import base64
from functools import cache
from typing import Any

#: Largest trace file embedded for "Open in Perfetto" (compressed bytes as stored).
MAX_EMBED_BYTES = 20 * 2**20
PERFETTO_ORIGIN = "https://ui.perfetto.dev"
#: The component's name (unique in the app; registered once, mounted per job).
COMPONENT_NAME = "dpcore.open_in_perfetto"

#: The component's markup: a button and a status line, filled in by :data:`PERFETTO_JS`.
PERFETTO_HTML = """<div class="dpcore-perfetto">
<button type="button" class="open">Open in Perfetto ↗</button> <span class="status"></span>
</div>"""

PERFETTO_CSS = """.dpcore-perfetto { font-family: sans-serif; padding: 4px 0; }
.dpcore-perfetto .open { padding: 6px 14px; border-radius: 6px; border: 1px solid #ccc; background: #fff;
  cursor: pointer; }
.dpcore-perfetto .status { font-size: 13px; color: #555; }"""

#: Runs on every mount with the latest ``data`` (:func:`perfetto_data`); returns the cleanup that
#: stops a pending PING loop when the component goes away.
PERFETTO_JS = """export default function (component) {
  const { data, parentElement } = component;
  const button = parentElement.querySelector(".open");
  const status = parentElement.querySelector(".status");
  if (!button || !data) return;
  button.textContent = data.label;
  let timer = null;
  let onMessage = null;
  const stop = () => {
    if (timer !== null) { clearInterval(timer); timer = null; }
    if (onMessage !== null) { window.removeEventListener("message", onMessage); onMessage = null; }
  };
  const bytes = () => {
    const s = atob(data.b64); const buf = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) buf[i] = s.charCodeAt(i);
    return buf.buffer;
  };
  button.onclick = () => {
    stop();
    const win = window.open(data.origin);
    if (!win) { status.textContent = "The browser blocked the new window: allow pop-ups for this page."; return; }
    status.textContent = "Waiting for Perfetto to load…";
    let tries = 0;
    timer = setInterval(() => {
      if (++tries > 600) { stop(); status.textContent = "Perfetto did not answer; use the download."; return; }
      win.postMessage("PING", data.origin);
    }, 50);
    onMessage = (evt) => {
      if (evt.source !== win || evt.data !== "PONG") return;
      stop();
      win.postMessage({perfetto: {buffer: bytes(), title: data.title, fileName: data.fileName}}, data.origin);
      status.textContent = "Opened in the Perfetto tab.";
    };
    window.addEventListener("message", onMessage);
  };
  return stop;
}"""


def too_big(nbytes: int) -> bool:
    """Whether a trace file is too large to embed in the page."""
    return nbytes > MAX_EMBED_BYTES


def perfetto_data(trace: bytes, title: str, file_name: str, label: str = "Open in Perfetto ↗") -> dict[str, str]:
    """What one mount of the component receives: the trace (base64), the title and file name Perfetto
    shows, the button's label and Perfetto's origin. Plain data: the script sets them as text or
    passes them to postMessage, never as HTML or code."""
    if too_big(len(trace)):
        raise ValueError(f"trace of {len(trace)} bytes is above the {MAX_EMBED_BYTES} byte embed limit")
    return {"b64": base64.b64encode(trace).decode("ascii"), "title": title, "fileName": file_name,
            "label": label, "origin": PERFETTO_ORIGIN}


@cache
def _component() -> Any:
    """The component, registered once per process: a page file runs again on every rerun, an
    imported module does not (registering the name again would replace it and log a warning)."""
    import streamlit as st

    return st.components.v2.component(COMPONENT_NAME, html=PERFETTO_HTML, css=PERFETTO_CSS, js=PERFETTO_JS)


def open_in_perfetto(trace: bytes, title: str, file_name: str, key: str) -> None:
    """Mount the button for one trace file (see :func:`perfetto_data` for what it receives)."""
    _component()(data=perfetto_data(trace, title, file_name), key=key)
