"""A screenshot of one element of a live page in headless Chromium, driven over the DevTools protocol: the page is
loaded, a script is polled until it finds the element drawn, and only that element is captured. (``chromium
--screenshot`` shoots at the load event, before a page's own fetches draw; with ``--virtual-time-budget`` it never
returns on a page that polls its server, as openwandb's run page does.)"""

import base64
import itertools
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect


class Page:
    """One DevTools session on the first page of a headless Chromium."""

    def __init__(self, websocket: Any) -> None:
        self.ws, self.ids = websocket, itertools.count(1)

    def call(self, method: str, **params: Any) -> dict:
        """The result of DevTools ``method`` (events that arrive meanwhile are dropped)."""
        sent = next(self.ids)
        self.ws.send(json.dumps({"id": sent, "method": method, "params": params}))
        while "id" not in (answer := json.loads(self.ws.recv(timeout=60))) or answer["id"] != sent:
            pass
        assert "error" not in answer, answer["error"]
        return answer["result"]

    def evaluate(self, script: str) -> Any:
        """The JSON value of the JavaScript expression ``script``."""
        return self.call("Runtime.evaluate", expression=script, returnByValue=True)["result"].get("value")


def shoot_element(binary: str, url: str, find: str, png: Path, profile: Path, wait_s: float = 60.0) -> None:
    """Load ``url`` and write to ``png`` the screenshot of the element that the JavaScript expression ``find``
    returns (scrolled into view) once it returns one; fails after ``wait_s`` seconds without it."""
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
           "--remote-debugging-port=0", "--window-size=1400,1000", "about:blank"]  # fmt: skip
    browser = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + wait_s
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline and browser.poll() is None, "Chromium did not open its DevTools port"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=30) as answer:
            (target,) = [t for t in json.loads(answer.read()) if t["type"] == "page"]
        with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
            page = Page(ws)
            page.call("Page.navigate", url=url)
            # Its box in page coordinates, as Page.captureScreenshot's clip takes them; centred, clear of sticky headers.
            rect = f"(() => {{ const e = {find}; if (!e) return null; e.scrollIntoView({{block: 'center'}});"
            rect += " const r = e.getBoundingClientRect(); return {x: r.x + scrollX, y: r.y + scrollY, width: r.width,"
            rect += " height: r.height}; })()"
            while (box := page.evaluate(rect)) is None:
                assert time.monotonic() < deadline, f"{url}: nothing matched {find} within {wait_s:.0f} s"
                time.sleep(0.5)
            time.sleep(2.0)  # the chart's own drawing animation
            box = page.evaluate(rect)
            shot = page.call("Page.captureScreenshot", format="png", clip={**box, "scale": 1})
        png.write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.terminate()
        browser.wait(timeout=30)
