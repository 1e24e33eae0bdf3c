"""One-click "Open in Perfetto": the trace handed to ui.perfetto.dev by postMessage.

Why postMessage and not a URL: Perfetto documents two ways to open a trace from another page
("Deep linking to the Perfetto UI"): ``?url=`` needs the trace served over public HTTPS with
CORS headers, which a local dashboard is not; the other is to ``window.open`` the UI, repeat
the string ``'PING'`` until it answers ``'PONG'`` (its message channel is not buffered, so
anything sent earlier is lost), then post ``{perfetto: {buffer, title, fileName}}`` with the
trace bytes as an ArrayBuffer. Perfetto opens gzip-compressed JSON directly, so the .json.gz
file goes as it is. Nothing is uploaded: the bytes go from this page to the Perfetto tab.

The bytes ride inside the component's HTML (base64, one third larger), which Streamlit re-sends
on every rerun of the page: above :data:`MAX_EMBED_BYTES` the button is replaced by a note that
says so and points to the download button. :func:`perfetto_html` is pure and tested; the browser
must let the page open a window on the click (the button is inside the component, so the
click is the user gesture popup blockers ask for).
"""
from __future__ import annotations

import base64
import html
import json

#: Largest trace file embedded for "Open in Perfetto" (compressed bytes as stored).
MAX_EMBED_BYTES = 20 * 2**20
PERFETTO_ORIGIN = "https://ui.perfetto.dev"


def too_big(nbytes: int) -> bool:
    """Whether a trace file is too large to embed in the page."""
    return nbytes > MAX_EMBED_BYTES


def perfetto_html(trace: bytes, title: str, file_name: str, label: str = "Open in Perfetto ↗") -> str:
    """A button that opens ui.perfetto.dev in a new window and posts ``trace`` to it once it
    answers PING with PONG. Title and file name are JSON-encoded into the script (never
    interpolated raw), the label HTML-escaped."""
    if too_big(len(trace)):
        raise ValueError(f"trace of {len(trace)} bytes is above the {MAX_EMBED_BYTES} byte embed limit")
    payload = json.dumps({"b64": base64.b64encode(trace).decode("ascii"), "title": title, "fileName": file_name,
                          "origin": PERFETTO_ORIGIN})
    payload = payload.replace("</", "<\\/")  # a title cannot close the <script> element
    return f"""<!doctype html>
<html><body style="margin:0;padding-top:27px;font-family:sans-serif">
<button id="open" style="padding:6px 14px;border-radius:6px;border:1px solid #ccc;background:#fff;cursor:pointer">
{html.escape(label)}</button> <span id="status" style="font-size:13px;color:#555"></span>
<script>
const P = {payload};
const status = document.getElementById("status");
function bytes() {{
  const s = atob(P.b64); const buf = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) buf[i] = s.charCodeAt(i);
  return buf.buffer;
}}
document.getElementById("open").addEventListener("click", () => {{
  const win = window.open(P.origin);
  if (!win) {{ status.textContent = "The browser blocked the new window: allow pop-ups for this page."; return; }}
  status.textContent = "Waiting for Perfetto to load…";
  let tries = 0;
  const timer = setInterval(() => {{
    if (++tries > 600) {{
      clearInterval(timer); status.textContent = "Perfetto did not answer; use the download."; return;
    }}
    win.postMessage("PING", P.origin);
  }}, 50);
  const onMessage = (evt) => {{
    if (evt.source !== win || evt.data !== "PONG") return;
    clearInterval(timer);
    window.removeEventListener("message", onMessage);
    win.postMessage({{perfetto: {{buffer: bytes(), title: P.title, fileName: P.fileName}}}}, P.origin);
    status.textContent = "Opened in the Perfetto tab.";
  }};
  window.addEventListener("message", onMessage);
}});
</script></body></html>"""
